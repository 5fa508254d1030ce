//! Users missing from auth_file, looked up in PostgreSQL: `auth_query` run
//! as `auth_user` in `auth_dbname` (PgBouncer's keys, global or per
//! database), on that user's own pool. As in PgBouncer the query runs at
//! every login, so a password changed or a role dropped in PostgreSQL takes
//! effect at the next login; the pool makes it one round trip. The secret
//! (an md5 hash or a SCRAM secret, as pg_authid holds it) stays in sluice:
//! the client proves itself against it, and sluice logs in to the server
//! with what the proof yields, so no plaintext is needed anywhere.

use crate::app::{App, AuthLookup};
use crate::auth::Secret;
use crate::backend::login::run_query_params;

use super::error::ClientError;

/// The secret `lookup.user` has in PostgreSQL; `None` when the query finds
/// no row or a NULL password (an expired or password-less role), which
/// fails the login as an unknown user does. An error when the query cannot
/// be run (the client gets it; the log gets the details).
pub async fn lookup(app: &App, lookup: &AuthLookup) -> Result<Option<Secret>, ClientError> {
    let failed = |reason: String| {
        tracing::warn!(
            user = %lookup.user, auth_user = %lookup.auth_user, db = %lookup.database,
            "auth_query failed: {reason}"
        );
        ClientError::new(
            "08006",
            format!(
                "could not look up user \"{}\" with auth_query: {reason}",
                lookup.user
            ),
        )
    };
    let pool = app
        .auth_pool(&lookup.database, &lookup.auth_user)
        .map_err(|e| failed(format!("auth_dbname: {e}")))?;
    let run = async {
        let mut lease = pool.acquire().await.map_err(|e| e.to_string())?;
        match run_query_params(lease.server(), &lookup.query, &[&lookup.user]).await {
            Ok(rows) => {
                lease.release();
                Ok(rows)
            }
            // A query error leaves the server clean (ReadyForQuery 'I');
            // anything else (I/O, a transaction left open) does not.
            Err(e @ crate::backend::login::LoginError::Rejected { .. }) => {
                lease.release();
                Err(e.to_string())
            }
            Err(e) => {
                lease.close();
                Err(e.to_string())
            }
        }
    };
    let rows = tokio::time::timeout(lookup.timeout, run)
        .await
        .map_err(|_| failed(format!("no answer within {:?}", lookup.timeout)))?
        .map_err(failed)?;
    Ok(secret_of(rows))
}

/// The password column (the second, as PgBouncer reads it) of the first row.
fn secret_of(rows: Vec<crate::backend::login::TextRow>) -> Option<Secret> {
    let row = rows.into_iter().next()?;
    let password = row.into_iter().nth(1).flatten()?;
    (!password.is_empty()).then(|| Secret::classify(password))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(cells: &[Option<&str>]) -> crate::backend::login::TextRow {
        cells.iter().map(|c| c.map(str::to_owned)).collect()
    }

    #[test]
    fn the_second_column_of_the_first_row_is_the_secret() {
        let md5 = "md5aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
        assert!(matches!(
            secret_of(vec![row(&[Some("u"), Some(md5)]), row(&[Some("v"), None])]),
            Some(Secret::Md5(_))
        ));
        assert_eq!(secret_of(vec![]), None);
        assert_eq!(secret_of(vec![row(&[Some("u"), None])]), None);
        assert_eq!(secret_of(vec![row(&[Some("u"), Some("")])]), None);
        assert_eq!(secret_of(vec![row(&[Some("u")])]), None);
        assert_eq!(
            secret_of(vec![row(&[Some("u"), Some("pw")])]),
            Some(Secret::Plain("pw".into()))
        );
    }
}
