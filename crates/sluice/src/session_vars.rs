//! Session settings beyond the reported six (`params`): `SET search_path`,
//! `SET ROLE`, `set_config(…, false)`, custom `myapp.tenant` variables, and
//! startup parameters and `options=-c …` that PostgreSQL does not report.
//!
//! In transaction mode they are the client's, not the server's: after a
//! transaction that may have changed them, sluice reads the server's
//! session-level settings back (`CAPTURE_SQL`), and whenever the client is
//! given a server whose settings differ, the difference is applied first.
//! `SET LOCAL` and rolled-back changes never show up in the read-back, so
//! they never follow the client, exactly as on one PostgreSQL session.

use std::sync::Arc;

use crate::params::TRACKED;

/// Session-level settings, sorted by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionVars {
    vars: Vec<(Box<str>, Box<str>)>,
}

/// Reads back the settings a session changed: pg_settings with source
/// 'session' (minus the tracked six, kept by `params`), plus the role,
/// which pg_settings does not list.
pub fn capture_sql(custom: &[String]) -> String {
    let tracked = TRACKED
        .iter()
        .map(|n| format!("'{n}'"))
        .collect::<Vec<_>>()
        .join(",");
    let mut sql = format!(
        "SELECT name, setting FROM pg_catalog.pg_settings \
         WHERE source = 'session' AND name NOT IN ({tracked}) \
         UNION ALL SELECT 'role', pg_catalog.current_setting('role') \
         WHERE pg_catalog.current_setting('role') <> 'none' \
         UNION ALL SELECT 'session_authorization', session_user::text \
         WHERE session_user <> (SELECT usename FROM pg_catalog.pg_stat_activity \
         WHERE pid = pg_catalog.pg_backend_pid())"
    );
    if !custom.is_empty() {
        let names = custom
            .iter()
            .map(|n| quote_literal(n))
            .collect::<Vec<_>>()
            .join(",");
        sql.push_str(&format!(
            " UNION ALL SELECT n, pg_catalog.current_setting(n, true) \
             FROM pg_catalog.unnest(ARRAY[{names}]::text[]) AS n \
             WHERE coalesce(pg_catalog.current_setting(n, true), '') <> ''"
        ));
    }
    sql
}

impl SessionVars {
    /// Builds from (name, value) pairs; later pairs win.
    pub fn from_pairs<I, K, V>(pairs: I) -> Self
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<Box<str>>,
        V: Into<Box<str>>,
    {
        let mut vars: Vec<(Box<str>, Box<str>)> = Vec::new();
        for (k, v) in pairs {
            let k = k.into();
            match vars
                .iter_mut()
                .find(|(name, _)| name.eq_ignore_ascii_case(&k))
            {
                Some(slot) => slot.1 = v.into(),
                None => vars.push((k, v.into())),
            }
        }
        vars.sort();
        Self { vars }
    }

    pub fn is_empty(&self) -> bool {
        self.vars.is_empty()
    }

    /// The same settings without `name` (None when nothing is left).
    pub fn without(&self, name: &str) -> Option<Arc<SessionVars>> {
        let vars: Vec<_> = self
            .vars
            .iter()
            .filter(|(n, _)| !n.eq_ignore_ascii_case(name))
            .cloned()
            .collect();
        (!vars.is_empty()).then(|| Arc::new(SessionVars { vars }))
    }

    /// Names of custom (dotted) settings, which pg_settings does not list.
    pub fn custom_names(&self) -> impl Iterator<Item = &str> {
        self.vars
            .iter()
            .map(|(name, _)| &**name)
            .filter(|name| name.contains('.'))
    }

    /// Reads may not go to a replica for this session: it asked for the
    /// primary (`SET sluice.route = 'primary'`), or its transactions would be
    /// refused by a standby (serializable by default).
    pub fn keeps_reads_on_primary(&self) -> bool {
        self.get("sluice.route")
            .is_some_and(|v| v.eq_ignore_ascii_case("primary"))
            || self
                .get("default_transaction_isolation")
                .is_some_and(|v| v.eq_ignore_ascii_case("serializable"))
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.vars
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| &**v)
    }
}

/// Shared sets compare by pointer first; `None` is "nothing set".
pub fn same(a: &Option<Arc<SessionVars>>, b: &Option<Arc<SessionVars>>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => Arc::ptr_eq(a, b) || a == b,
        (Some(x), None) | (None, Some(x)) => x.is_empty(),
    }
}

/// SQL turning a server whose session settings are `server` into one with
/// `client`'s; one simple query, so it applies whole or not at all.
pub fn apply_sql(server: Option<&SessionVars>, client: Option<&SessionVars>) -> Option<String> {
    let empty = SessionVars::default();
    let server = server.unwrap_or(&empty);
    let client = client.unwrap_or(&empty);
    let mut sql = String::new();
    // A new session authorization resets the role: it goes first, and the
    // role is then applied as if the server had none.
    const AUTH: &str = "session_authorization";
    let auth_changed = server.get(AUTH) != client.get(AUTH);
    let server = if auth_changed {
        match client.get(AUTH) {
            Some(user) => sql.push_str(&format!(
                "SELECT pg_catalog.set_config('{AUTH}', {}, false);",
                quote_literal(user)
            )),
            None => sql.push_str("RESET SESSION AUTHORIZATION;"),
        }
        &SessionVars {
            vars: server
                .vars
                .iter()
                .filter(|(n, _)| !n.eq_ignore_ascii_case(AUTH) && !n.eq_ignore_ascii_case("role"))
                .cloned()
                .collect(),
        }
    } else {
        server
    };
    let client_rest = SessionVars {
        vars: client
            .vars
            .iter()
            .filter(|(n, _)| !n.eq_ignore_ascii_case(AUTH))
            .cloned()
            .collect(),
    };
    let client = &client_rest;
    // Other settings are made as the session's own user, the role last: a
    // setting only the session user may make (a superuser's
    // session_replication_role) fails under the client's role (a review
    // saw the next client of that server ended with 42501).
    let is_role = |n: &str| n.eq_ignore_ascii_case("role");
    let others_change = server
        .vars
        .iter()
        .any(|(n, _)| !is_role(n) && !n.eq_ignore_ascii_case(AUTH) && client.get(n).is_none())
        || client
            .vars
            .iter()
            .any(|(n, v)| !is_role(n) && server.get(n) != Some(&**v));
    let without_role;
    let server = if others_change && server.get("role").is_some() {
        sql.push_str("RESET ROLE;");
        without_role = SessionVars {
            vars: server
                .vars
                .iter()
                .filter(|(n, _)| !is_role(n))
                .cloned()
                .collect(),
        };
        &without_role
    } else {
        server
    };
    for (name, _) in &server.vars {
        if name.eq_ignore_ascii_case(AUTH) {
            continue;
        }
        if client.get(name).is_none() {
            sql.push_str(&format!("RESET {};", quote_ident(name)));
        }
    }
    let (role, others): (Vec<_>, Vec<_>) = client
        .vars
        .iter()
        .filter(|(name, value)| server.get(name) != Some(&**value))
        .partition(|(name, _)| is_role(name));
    let sets: Vec<String> = others
        .into_iter()
        .chain(role)
        .map(|(name, value)| {
            format!(
                "pg_catalog.set_config({}, {}, false)",
                quote_literal(name),
                quote_literal(value)
            )
        })
        .collect();
    if !sets.is_empty() {
        sql.push_str("SELECT ");
        sql.push_str(&sets.join(", "));
    }
    (!sql.is_empty()).then_some(sql)
}

fn quote_literal(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 3);
    crate::params::push_literal(&mut out, s);
    out
}

fn quote_ident(s: &str) -> String {
    // A dotted custom variable is a list of identifiers to RESET.
    s.split('.')
        .map(|part| format!("\"{}\"", part.replace('"', "\"\"")))
        .collect::<Vec<_>>()
        .join(".")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_role_is_set_after_the_other_settings() {
        let client =
            SessionVars::from_pairs([("role", "bob"), ("session_replication_role", "replica")]);
        let sql = apply_sql(None, Some(&client)).expect("something to set");
        let (srr, role) = (
            sql.find("session_replication_role").expect("srr"),
            sql.find("'role'").expect("role"),
        );
        assert!(srr < role, "{sql}");
        // A server already under the role drops it first.
        let server = SessionVars::from_pairs([("role", "bob")]);
        let sql = apply_sql(Some(&server), Some(&client)).expect("something to set");
        assert!(sql.starts_with("RESET ROLE;"), "{sql}");
        assert!(
            sql.find("session_replication_role") < sql.find("'role'"),
            "{sql}"
        );
        // Nothing else to change: the role stays as it is.
        assert_eq!(apply_sql(Some(&client), Some(&client)), None);
    }

    #[test]
    fn sessions_that_keep_reads_on_the_primary() {
        let v = SessionVars::from_pairs([("sluice.route", "primary")]);
        assert!(v.keeps_reads_on_primary());
        let v = SessionVars::from_pairs([("default_transaction_isolation", "serializable")]);
        assert!(v.keeps_reads_on_primary());
        let v = SessionVars::from_pairs([("default_transaction_isolation", "read committed")]);
        assert!(!v.keeps_reads_on_primary());
    }

    #[test]
    fn applies_the_difference() {
        let server = SessionVars::from_pairs([("search_path", "a"), ("work_mem", "64")]);
        let client = SessionVars::from_pairs([("search_path", "b, c"), ("myapp.tenant", "it's")]);
        assert_eq!(
            apply_sql(Some(&server), Some(&client)).unwrap(),
            "RESET \"work_mem\";SELECT pg_catalog.set_config('myapp.tenant', 'it''s', false), \
             pg_catalog.set_config('search_path', 'b, c', false)"
        );
        assert_eq!(apply_sql(Some(&client), Some(&client)), None);
        assert_eq!(
            apply_sql(Some(&server), None).unwrap(),
            "RESET \"search_path\";RESET \"work_mem\";"
        );
        assert!(same(&None, &Some(Arc::new(SessionVars::default()))));
    }

    #[test]
    fn session_authorization_goes_first_and_the_role_follows() {
        let server = SessionVars::from_pairs([("role", "r")]);
        let client = SessionVars::from_pairs([("role", "r"), ("session_authorization", "bob")]);
        assert_eq!(
            apply_sql(Some(&server), Some(&client)).unwrap(),
            "SELECT pg_catalog.set_config('session_authorization', 'bob', false);\
             SELECT pg_catalog.set_config('role', 'r', false)"
        );
        // Back to the login user: RESET SESSION AUTHORIZATION (resets the
        // role too), then nothing else to undo.
        assert_eq!(
            apply_sql(Some(&client), None).unwrap(),
            "RESET SESSION AUTHORIZATION;"
        );
    }
}
