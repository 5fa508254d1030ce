//! Users missing from auth_file, looked up in PostgreSQL: `auth_query` run
//! as `auth_user` in `auth_dbname` (PgBouncer's keys, global or per
//! database), on that user's own pool. As in PgBouncer the query runs at
//! every login, so a password changed or a role dropped in PostgreSQL takes
//! effect at the next login; the pool makes it one round trip. The secret
//! (an md5 hash or a SCRAM secret, as pg_authid holds it) stays in sluice:
//! the client proves itself against it, and sluice logs in to the server
//! with what the proof yields, so no plaintext is needed anywhere.

use std::sync::Arc;

use crate::app::{App, AuthLookup};
use crate::auth::Secret;
use crate::backend::login::{LoginError, TextRow, run_query_params};
use crate::backend::pool::Pool;

use super::error::ClientError;

/// What a lookup found.
pub struct Found {
    /// The query found the role (possibly without a password).
    pub exists: bool,
    /// `None` when the query finds no row or a NULL password (an expired or
    /// password-less role): a password login then fails as an unknown
    /// user's does.
    pub secret: Option<Secret>,
    /// The auth pool, when this lookup made it for a database only `*`
    /// stands for: forgotten unless the login succeeds.
    pub disposable: Option<Arc<Pool>>,
}

/// Looks `lookup.user` up. An error when the query cannot be run or
/// answers in a shape other than one row of (name, password): the client
/// gets a short message, the log the details (a client that has not
/// proven anything yet learns nothing about the servers).
pub async fn lookup(app: &App, lookup: &AuthLookup) -> Result<Found, ClientError> {
    let failed = |reason: String| {
        tracing::error!(
            user = %lookup.user, auth_user = %lookup.auth_user, db = %lookup.database,
            "auth_query failed: {reason}"
        );
        ClientError::new(
            "08006",
            format!(
                "could not look up user \"{}\" with auth_query (see the pooler's log)",
                lookup.user
            ),
        )
    };
    let key = (lookup.database.clone(), lookup.auth_user.clone());
    let retry = app.config().settings.server_login_retry;
    // (not where a pool of it lives: its own memory of failures decides)
    let unlisted = app.config().database(&lookup.database).is_none()
        && !app.has_pool(&lookup.database, &lookup.auth_user);
    if unlisted && let Some(reason) = LOGINS_FAILING.recent(&key, retry) {
        return Err(failed(format!(
            "server login has been failing, cached error: {reason}"
        )));
    }
    let (pool, disposable) = app
        .auth_pool(&lookup.database, &lookup.auth_user)
        .map_err(|e| failed(format!("auth_dbname: {e}")))?;
    let run = async {
        let mut lease = match pool.acquire().await {
            Ok(lease) => lease,
            Err(e) => {
                let reason = e.to_string();
                if disposable {
                    LOGINS_FAILING.remember(key, &reason);
                }
                return Err(reason);
            }
        };
        // Two rows are enough to tell "one" from "several".
        match run_query_params(lease.server(), &lookup.query, &[&lookup.user], 2).await {
            Ok(rows) => {
                lease.release();
                Ok(rows)
            }
            // A query error leaves the server clean (ReadyForQuery 'I');
            // anything else (I/O, a transaction left open) does not.
            Err(e @ LoginError::Rejected { .. }) => {
                lease.release();
                Err(e.to_string())
            }
            Err(e) => {
                lease.close();
                Err(e.to_string())
            }
        }
    };
    let outcome = match tokio::time::timeout(lookup.timeout, run).await {
        Ok(Ok((rows, count))) => secret_of(rows, count)
            .map(|secret| (count == 1, secret))
            .map_err(failed),
        Ok(Err(e)) => Err(failed(e)),
        Err(_) => Err(failed(format!("no answer within {:?}", lookup.timeout))),
    };
    match outcome {
        Ok((exists, secret)) => Ok(Found {
            exists,
            secret,
            disposable: disposable.then_some(pool),
        }),
        Err(e) => {
            if disposable {
                app.forget_disposable(&pool);
            }
            Err(e)
        }
    }
}

/// Logins to a database only `*` stands for whose auth pool could not
/// log in: its pool is forgotten at once (an attacker may name any number
/// of databases), so its own `server_login_retry` memory goes with it.
/// This keeps the failure for `server_login_retry` instead, as PgBouncer
/// answers "server login has been failing, cached error": a flood of
/// logins to one database that does not exist costs PostgreSQL one failed
/// login, not one each.
static LOGINS_FAILING: LoginsFailing = LoginsFailing(std::sync::Mutex::new(None));

/// Failures kept; past it, expired ones are dropped, then new ones are not
/// kept (the logins then fail one by one, as before).
const FAILURES_KEPT: usize = 1024;

type FailureKey = (String, String);

struct LoginsFailing(
    std::sync::Mutex<Option<std::collections::HashMap<FailureKey, (std::time::Instant, String)>>>,
);

impl LoginsFailing {
    fn recent(&self, key: &FailureKey, retry: std::time::Duration) -> Option<String> {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let failures = map.as_mut()?;
        match failures.get(key) {
            Some((at, reason)) if at.elapsed() < retry => Some(reason.clone()),
            Some(_) => {
                failures.remove(key);
                None
            }
            None => None,
        }
    }

    fn forget_all(&self) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    fn remember(&self, key: FailureKey, reason: &str) {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let failures = map.get_or_insert_with(Default::default);
        if failures.len() >= FAILURES_KEPT {
            // (anything older than the longest sensible retry is over)
            failures.retain(|_, (at, _)| at.elapsed() < std::time::Duration::from_secs(300));
        }
        if failures.len() < FAILURES_KEPT {
            failures.insert(key, (std::time::Instant::now(), reason.to_owned()));
        }
    }
}

/// A RELOAD (the operator may have fixed what failed) lets the next login
/// try again.
pub fn forget_failures() {
    LOGINS_FAILING.forget_all();
}

/// The password column (the second, as PgBouncer reads it) of the only
/// row; no row is no user. Several rows would hand one role's secret to
/// another (a query with LIKE or lower()), so they are an error, as are
/// fewer than two columns.
fn secret_of(rows: Vec<TextRow>, count: usize) -> Result<Option<Secret>, String> {
    if count > 1 {
        return Err(format!(
            "the query returned {count} rows, expected at most 1"
        ));
    }
    let Some(row) = rows.into_iter().next() else {
        return Ok(None);
    };
    if row.len() < 2 {
        return Err(format!(
            "the query returned {} column(s), expected 2 (name, password)",
            row.len()
        ));
    }
    let password = row.into_iter().nth(1).flatten();
    Ok(password
        .filter(|p| !p.is_empty())
        .and_then(Secret::from_catalog))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(cells: &[Option<&str>]) -> crate::backend::login::TextRow {
        cells.iter().map(|c| c.map(str::to_owned)).collect()
    }

    #[test]
    fn one_row_of_two_columns_is_the_answer() {
        let md5 = "md5aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
        assert!(matches!(
            secret_of(vec![row(&[Some("u"), Some(md5)])], 1),
            Ok(Some(Secret::Md5(_)))
        ));
        assert_eq!(secret_of(vec![], 0), Ok(None));
        assert_eq!(secret_of(vec![row(&[Some("u"), None])], 1), Ok(None));
        assert_eq!(secret_of(vec![row(&[Some("u"), Some("")])], 1), Ok(None));
        assert_eq!(
            secret_of(vec![row(&[Some("u"), Some("md5zz")])], 1),
            Ok(None)
        );
        assert!(secret_of(vec![row(&[Some("u")])], 1).is_err());
        assert!(secret_of(vec![row(&[Some("u"), Some(md5)])], 2).is_err());
        assert_eq!(
            secret_of(vec![row(&[Some("u"), Some("pw")])], 1),
            Ok(Some(Secret::Plain("pw".into())))
        );
    }
}
