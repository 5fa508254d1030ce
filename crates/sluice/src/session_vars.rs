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

use crate::params::{TRACKED, TextMode};

/// Session-level settings, sorted by name.
#[derive(Debug, Clone, Default)]
pub struct SessionVars {
    vars: Vec<(Box<str>, Box<str>)>,
    /// `digest`'s, made once: the set never changes once built.
    digest: std::sync::OnceLock<[u8; 32]>,
}

impl PartialEq for SessionVars {
    fn eq(&self, other: &Self) -> bool {
        self.vars == other.vars
    }
}

impl Eq for SessionVars {}

/// Reads back the settings a session changed: pg_settings with source
/// 'session' (minus the tracked six, kept by `params`), plus the role,
/// which pg_settings does not list. Values come as they are on a UTF-8
/// session; otherwise as the hex of their UTF-8 bytes (another
/// client_encoding: a LATIN1 `é` read as it comes would be no UTF-8) or of
/// their own bytes (a SQL_ASCII database, which converts nothing), read by
/// `decode_value`.
pub fn capture_sql(custom: &[String], mode: TextMode) -> String {
    let value = |expr: &str| match mode {
        TextMode::Raw => expr.to_owned(),
        TextMode::Unicode => {
            format!("pg_catalog.encode(pg_catalog.convert_to({expr}, 'UTF8'), 'hex')")
        }
        TextMode::Bytes => {
            format!("pg_catalog.encode(pg_catalog.convert_to({expr}, 'SQL_ASCII'), 'hex')")
        }
    };
    // (and the transaction's own modes: pg_settings says "session" for
    // them after a SET TRANSACTION, but they end with their transaction;
    // given back as session settings, a standby refused
    // `transaction_read_only = off` and the client was ended)
    let tracked = TRACKED
        .iter()
        .chain(&TRANSACTION_MODES)
        .map(|n| format!("'{n}'"))
        .collect::<Vec<_>>()
        .join(",");
    // (every function, operator and type with its schema: the session's
    // search_path may name the client's own before pg_catalog's)
    let mut sql = format!(
        "SELECT name, {} FROM pg_catalog.pg_settings \
         WHERE source OPERATOR(pg_catalog.=) 'session' \
         AND name OPERATOR(pg_catalog.<>) ALL (ARRAY[{tracked}]::pg_catalog.text[]) \
         UNION ALL SELECT 'role', {} \
         WHERE pg_catalog.current_setting('role') OPERATOR(pg_catalog.<>) 'none' \
         UNION ALL SELECT 'session_authorization', {} \
         WHERE session_user OPERATOR(pg_catalog.<>) \
         (SELECT usename FROM pg_catalog.pg_stat_activity \
         WHERE pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid())",
        value("setting"),
        value("pg_catalog.current_setting('role')"),
        value("session_user::pg_catalog.text"),
    );
    if !custom.is_empty() {
        let names = custom
            .iter()
            .map(|n| quote_literal(n))
            .collect::<Vec<_>>()
            .join(",");
        sql.push_str(&format!(
            " UNION ALL SELECT n, {} \
             FROM pg_catalog.unnest(ARRAY[{names}]::pg_catalog.text[]) AS n \
             WHERE coalesce(pg_catalog.current_setting(n, true), '') \
             OPERATOR(pg_catalog.<>) ''",
            value("pg_catalog.current_setting(n, true)")
        ));
    }
    // Each row is measured before it is sent: a value too large to carry
    // comes as NULL with the reason in the third column, so the read-back
    // never holds more than the limits and the server stays in step
    // (before, a row past the read's 1 MiB message limit closed the
    // server, and the client's setting was lost without a word).
    // (as sent: a session in UTF-8 gets the database's text converted,
    // which may make it three times longer; review 36, a WIN1252 `€`)
    let length = |expr: &str| match mode {
        TextMode::Raw => format!(
            "pg_catalog.octet_length(pg_catalog.convert_to({expr}, 'UTF8'))::pg_catalog.int8"
        ),
        _ => format!("pg_catalog.octet_length({expr})::pg_catalog.int8"),
    };
    let size = format!(
        "{} OPERATOR(pg_catalog.+) {}",
        length("u.name"),
        length("u.v")
    );
    format!(
        "SELECT CASE WHEN s.why IS NULL THEN s.name ELSE pg_catalog.left(s.name, 200) END, \
         CASE WHEN s.why IS NULL THEN s.v END, s.why FROM (SELECT u.name, u.v, \
         CASE WHEN {size} OPERATOR(pg_catalog.>) {CARRIED_VALUE_LIMIT} THEN 'value' \
         WHEN pg_catalog.sum({size}) OVER () OPERATOR(pg_catalog.>) {CARRIED_TOTAL_LIMIT} \
         THEN 'total' END AS why FROM ({sql}) AS u(name, v)) AS s"
    )
}

/// The largest setting `capture_sql` reads back (its name and value as
/// read, hex where the encoding asks for it: a UTF-8 session's value of
/// up to 512 KiB, another's of up to 256 KiB), and all of a session's
/// together. Past either, the client cannot be given its settings again
/// on another server: it is told (54000) and let go.
pub const CARRIED_VALUE_LIMIT: usize = 512 * 1024;
pub const CARRIED_TOTAL_LIMIT: usize = 16 * 1024 * 1024;

/// Why a row of `capture_sql` came without its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TooLarge {
    /// This setting's name and value pass `CARRIED_VALUE_LIMIT`.
    Value(String),
    /// All of them pass `CARRIED_TOTAL_LIMIT`.
    Total,
    /// One transaction named more custom settings than are read back.
    Names(usize),
}

impl TooLarge {
    /// The reason of a row's third column, if it has one.
    pub fn of_row(name: &str, why: Option<&str>) -> Option<Self> {
        match why? {
            "value" => Some(Self::Value(name.to_owned())),
            _ => Some(Self::Total),
        }
    }

    /// What the client is told.
    pub fn message(&self) -> String {
        match self {
            Self::Value(name) => format!(
                "the value of setting \"{name}\" is too large to follow this connection \
                 from one transaction to the next: a pooled connection carries a value \
                 of up to {} KiB as read back (transaction mode)",
                CARRIED_VALUE_LIMIT / 1024
            ),
            Self::Total => format!(
                "this connection's session settings are too large to follow it from one \
                 transaction to the next: a pooled connection carries up to {} MiB of them \
                 (transaction mode)",
                CARRIED_TOTAL_LIMIT / (1024 * 1024)
            ),
            Self::Names(most) => format!(
                "this transaction set more than {most} custom settings (SET or set_config): \
                 a pooled connection reads back at most {most} a transaction, so they \
                 cannot follow it to the next one (transaction mode)"
            ),
        }
    }
}

/// Settings of the transaction, not of the session.
const TRANSACTION_MODES: [&str; 3] = [
    "transaction_isolation",
    "transaction_read_only",
    "transaction_deferrable",
];

/// A value `capture_sql` read in `mode`: as it came, or from its hex (the
/// bytes of UTF-8, or a SQL_ASCII database's own bytes kept one char per
/// byte, which `push_literal_bytes` writes back as they were).
pub fn decode_value(value: String, mode: TextMode) -> String {
    if mode == TextMode::Raw {
        return value;
    }
    let hex = value.as_bytes();
    let bytes: Vec<u8> = hex
        .chunks(2)
        .filter_map(|pair| {
            let digit = |b: u8| (b as char).to_digit(16);
            match pair {
                [h, l] => Some((digit(*h)? * 16 + digit(*l)?) as u8),
                _ => None,
            }
        })
        .collect();
    match mode {
        TextMode::Bytes => bytes.iter().map(|&b| char::from(b)).collect(),
        _ => String::from_utf8_lossy(&bytes).into_owned(),
    }
}

impl SessionVars {
    /// What the set costs in `max_held_memory_mb`: its names and values,
    /// and each entry's two allocations and slot.
    pub fn cost(&self) -> usize {
        self.vars
            .iter()
            .map(|(name, value)| name.len() + value.len() + 64)
            .sum()
    }

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
        Self {
            vars,
            digest: Default::default(),
        }
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
        (!vars.is_empty()).then(|| {
            Arc::new(SessionVars {
                vars,
                digest: Default::default(),
            })
        })
    }

    /// SHA-256 of every name and value: what a statement's sharing key
    /// keeps of them (`ParseContext::key`). The values themselves may be
    /// large (a client's `SET app.x` of 200 KB), and a key is kept with
    /// each statement and made at each named Parse (a review: 200 KB of
    /// memory a statement, and the whole set copied at each Parse).
    pub fn digest(&self) -> &[u8; 32] {
        use sha2::{Digest, Sha256};
        self.digest.get_or_init(|| {
            let mut hash = Sha256::new();
            for (name, value) in &self.vars {
                // (names hold no `=`, neither holds a NUL: unambiguous)
                hash.update(name.as_bytes());
                hash.update(b"=");
                hash.update(value.as_bytes());
                hash.update(b"\0");
            }
            hash.finalize().into()
        })
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

/// `current` with the settings of `startup` it lacks put back: a setting
/// the client logged in with that is no longer the session's was reset
/// (RESET, RESET ALL, DISCARD ALL, SET … TO DEFAULT), and PostgreSQL
/// resets it to the value of the login, not the server's default (sluice
/// gives the login's values with SET, which a reset undoes; a review
/// found a client's `options=-c search_path=…` gone after a DISCARD ALL).
/// `None`: nothing to put back. The role is put back even after a `SET
/// ROLE NONE` (the read-back leaves out a role of `none`, so it looks
/// reset): a client that logged in with a role then runs with that
/// role's rights, never with more (the pool's login user's). Not the
/// session authorization, nor custom (dotted) settings: the read-back
/// leaves out an empty custom value, so a `SET app.x = ''` would look
/// reset (a review); those go back to the server's values, as before.
pub fn restored(
    current: &Option<Arc<SessionVars>>,
    startup: &SessionVars,
) -> Option<Option<Arc<SessionVars>>> {
    let lacks = |name: &str| current.as_deref().is_none_or(|c| c.get(name).is_none());
    let kept_apart =
        |name: &str| name.contains('.') || name.eq_ignore_ascii_case("session_authorization");
    let missing: Vec<_> = startup
        .vars
        .iter()
        .filter(|(n, _)| !kept_apart(n) && lacks(n))
        .collect();
    if missing.is_empty() {
        return None;
    }
    let kept = current.iter().flat_map(|c| c.vars.iter());
    let vars = SessionVars::from_pairs(kept.chain(missing).cloned());
    Some(Some(Arc::new(vars)))
}

/// Shared sets compare by pointer first; `None` is "nothing set".
pub fn same(a: &Option<Arc<SessionVars>>, b: &Option<Arc<SessionVars>>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => Arc::ptr_eq(a, b) || a == b,
        (Some(x), None) | (None, Some(x)) => x.is_empty(),
    }
}

/// Targets in one SELECT of `apply_sql` (PostgreSQL allows 1,664).
const SETS_PER_SELECT: usize = 1000;

/// SQL turning a server whose session settings are `server` into one with
/// `client`'s; one simple query, so it applies whole or not at all.
/// Settings are made as the session's own user, the session authorization
/// and the role last: a setting only the session user may make (a
/// superuser's session_replication_role) fails under the client's
/// identity (a review saw clients ended with 42501). So the server's
/// identity is dropped first when anything else changes (RESET SESSION
/// AUTHORIZATION resets the role too), and setting the session
/// authorization, which resets the role, comes before the role.
/// `mode`: how values are written for the session (`params::TextMode`).
pub fn apply_sql(
    server: Option<&SessionVars>,
    client: Option<&SessionVars>,
    mode: TextMode,
) -> Option<String> {
    const AUTH: &str = "session_authorization";
    const ROLE: &str = "role";
    let empty = SessionVars::default();
    let server = server.unwrap_or(&empty);
    let client = client.unwrap_or(&empty);
    let identity = |n: &str| n.eq_ignore_ascii_case(AUTH) || n.eq_ignore_ascii_case(ROLE);
    let others_change = server
        .vars
        .iter()
        .any(|(n, _)| !identity(n) && client.get(n).is_none())
        || client
            .vars
            .iter()
            .any(|(n, v)| !identity(n) && server.get(n) != Some(&**v));
    let (server_auth, server_role) = (server.get(AUTH), server.get(ROLE));
    let reset_auth = server_auth.is_some() && (others_change || server_auth != client.get(AUTH));
    let reset_role =
        !reset_auth && server_role.is_some() && (others_change || server_role != client.get(ROLE));
    let mut sql = String::new();
    if reset_auth {
        sql.push_str("RESET SESSION AUTHORIZATION;");
    } else if reset_role {
        sql.push_str("RESET ROLE;");
    }
    let now_auth = if reset_auth { None } else { server_auth };
    let mut now_role = if reset_auth || reset_role {
        None
    } else {
        server_role
    };
    for (name, _) in &server.vars {
        if !identity(name) && client.get(name).is_none() {
            sql.push_str(&format!("RESET {};", quote_ident(name)));
        }
    }
    let set = |name: &str, value: &str| {
        let mut value_sql = String::with_capacity(value.len() + 3);
        crate::params::push_literal_in(&mut value_sql, value, mode);
        // (`IS NULL`: the row answered is a boolean a setting, not the
        // value again, which a reply's 1 MiB limit refused for settings
        // the carried limits allow: review 47)
        format!(
            "pg_catalog.set_config({}, {value_sql}, false) IS NULL",
            quote_literal(name),
        )
    };
    let sets: Vec<String> = client
        .vars
        .iter()
        .filter(|(name, value)| !identity(name) && server.get(name) != Some(&**value))
        .map(|(name, value)| set(name, value))
        .collect();
    // (each identity change a statement of its own, in this order)
    // (a SELECT takes at most 1,664 targets: a client with more settings
    // than that lost its connection at its next server, review 35)
    let mut statements: Vec<String> = sets
        .chunks(SETS_PER_SELECT)
        .map(|sets| format!("SELECT {}", sets.join(", ")))
        .collect();
    if let Some(auth) = client.get(AUTH)
        && now_auth != Some(auth)
    {
        statements.push(format!("SELECT {}", set(AUTH, auth)));
        now_role = None;
    }
    if let Some(role) = client.get(ROLE)
        && now_role != Some(role)
    {
        statements.push(format!("SELECT {}", set(ROLE, role)));
    }
    sql.push_str(&statements.join(";"));
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
    fn a_reset_gives_back_the_settings_of_the_login() {
        let startup = SessionVars::from_pairs([("search_path", "a"), ("work_mem", "8MB")]);
        // Nothing was reset: nothing to put back.
        let same = Some(Arc::new(SessionVars::from_pairs([
            ("search_path", "b"),
            ("work_mem", "8MB"),
        ])));
        assert_eq!(restored(&same, &startup), None);
        // RESET search_path: the login's value, the rest as it is.
        let reset = Some(Arc::new(SessionVars::from_pairs([
            ("work_mem", "1MB"),
            ("app.x", "1"),
        ])));
        let back = restored(&reset, &startup)
            .expect("put back")
            .expect("settings");
        assert_eq!(back.get("search_path"), Some("a"));
        assert_eq!(back.get("work_mem"), Some("1MB"));
        assert_eq!(back.get("app.x"), Some("1"));
        // RESET ALL: all of the login's.
        let all = restored(&None, &startup).expect("put back");
        assert_eq!(all.as_deref(), Some(&startup));
        // Not a custom setting (`SET app.x = ''` reads back as absent, as
        // a reset does); the role, though, fails closed.
        let apart = SessionVars::from_pairs([("app.x", "1")]);
        assert_eq!(restored(&None, &apart), None);
        let role = SessionVars::from_pairs([("role", "bob")]);
        assert!(restored(&None, &role).is_some());
    }

    #[test]
    fn many_settings_are_given_back_in_selects_postgresql_takes() {
        let client = SessionVars::from_pairs((0..2500).map(|i| (format!("app.s{i}"), "1")));
        let sql = apply_sql(None, Some(&client), TextMode::Raw).expect("something to set");
        let selects: Vec<&str> = sql.split(';').filter(|s| s.starts_with("SELECT")).collect();
        assert_eq!(selects.len(), 3, "{sql:.200}");
        assert!(
            selects
                .iter()
                .all(|s| s.matches("set_config").count() <= 1000)
        );
        assert_eq!(sql.matches("set_config").count(), 2500);
    }

    #[test]
    fn a_row_without_its_value_says_why() {
        assert_eq!(TooLarge::of_row("app.x", None), None);
        let value = TooLarge::of_row("app.x", Some("value")).expect("too large");
        assert!(value.message().contains("\"app.x\""), "{}", value.message());
        let total = TooLarge::of_row("app.x", Some("total")).expect("too large");
        assert_eq!(total, TooLarge::Total);
        assert!(total.message().contains("16 MiB"), "{}", total.message());
    }

    #[test]
    fn values_of_another_encoding_travel_as_utf8_hex_and_escapes() {
        assert_eq!(
            decode_value("636166c3a9".into(), TextMode::Unicode),
            "caf\u{e9}"
        );
        assert_eq!(decode_value("caf\u{e9}".into(), TextMode::Raw), "caf\u{e9}");
        assert!(capture_sql(&["app.x".into()], TextMode::Unicode).contains("convert_to"));
        assert!(!capture_sql(&["app.x".into()], TextMode::Raw).contains("encode("));
        assert!(capture_sql(&[], TextMode::Raw).contains(&CARRIED_VALUE_LIMIT.to_string()));
        let client = SessionVars::from_pairs([("app.x", "caf\u{e9}")]);
        let sql = apply_sql(None, Some(&client), TextMode::Unicode).expect("something to set");
        assert!(sql.contains("E'caf\\u00e9'"), "{sql}");
        // (a SQL_ASCII database: the bytes, one char each, back as bytes)
        let bytes = decode_value("636166e9".into(), TextMode::Bytes);
        assert_eq!(bytes, "caf\u{e9}");
        let ascii = SessionVars::from_pairs([("app.x", bytes.as_str())]);
        let sql = apply_sql(None, Some(&ascii), TextMode::Bytes).expect("something to set");
        assert!(sql.contains("E'caf\\xe9'"), "{sql}");
        let raw = apply_sql(None, Some(&client), TextMode::Raw).expect("something to set");
        assert!(raw.contains("'caf\u{e9}'"), "{raw}");
    }

    #[test]
    fn the_role_is_set_after_the_other_settings() {
        let client =
            SessionVars::from_pairs([("role", "bob"), ("session_replication_role", "replica")]);
        let sql = apply_sql(None, Some(&client), TextMode::Raw).expect("something to set");
        let (srr, role) = (
            sql.find("session_replication_role").expect("srr"),
            sql.find("'role'").expect("role"),
        );
        assert!(srr < role, "{sql}");
        // A server already under the role drops it first.
        let server = SessionVars::from_pairs([("role", "bob")]);
        let sql = apply_sql(Some(&server), Some(&client), TextMode::Raw).expect("something to set");
        assert!(sql.starts_with("RESET ROLE;"), "{sql}");
        assert!(
            sql.find("session_replication_role") < sql.find("'role'"),
            "{sql}"
        );
        // Nothing else to change: the role stays as it is.
        assert_eq!(apply_sql(Some(&client), Some(&client), TextMode::Raw), None);
        // The same with a session authorization (a review's variant).
        let client = SessionVars::from_pairs([
            ("session_authorization", "alice"),
            ("session_replication_role", "replica"),
        ]);
        let server = SessionVars::from_pairs([
            ("session_authorization", "alice"),
            ("session_replication_role", "origin"),
        ]);
        let sql = apply_sql(Some(&server), Some(&client), TextMode::Raw).expect("something to set");
        assert!(sql.starts_with("RESET SESSION AUTHORIZATION;"), "{sql}");
        assert!(
            sql.find("session_replication_role") < sql.rfind("'session_authorization'"),
            "{sql}"
        );
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
            apply_sql(Some(&server), Some(&client), TextMode::Raw).unwrap(),
            "RESET \"work_mem\";SELECT pg_catalog.set_config('myapp.tenant', 'it''s', false) IS NULL, \
             pg_catalog.set_config('search_path', 'b, c', false) IS NULL"
        );
        assert_eq!(apply_sql(Some(&client), Some(&client), TextMode::Raw), None);
        assert_eq!(
            apply_sql(Some(&server), None, TextMode::Raw).unwrap(),
            "RESET \"search_path\";RESET \"work_mem\";"
        );
        assert!(same(&None, &Some(Arc::new(SessionVars::default()))));
    }

    #[test]
    fn session_authorization_goes_first_and_the_role_follows() {
        let server = SessionVars::from_pairs([("role", "r")]);
        let client = SessionVars::from_pairs([("role", "r"), ("session_authorization", "bob")]);
        assert_eq!(
            apply_sql(Some(&server), Some(&client), TextMode::Raw).unwrap(),
            "SELECT pg_catalog.set_config('session_authorization', 'bob', false) IS NULL;\
             SELECT pg_catalog.set_config('role', 'r', false) IS NULL"
        );
        // Back to the login user: RESET SESSION AUTHORIZATION (resets the
        // role too), then nothing else to undo.
        assert_eq!(
            apply_sql(Some(&client), None, TextMode::Raw).unwrap(),
            "RESET SESSION AUTHORIZATION;"
        );
    }
}
