//! Every kind of bad value is an error naming file, line, key, value and
//! reason.

mod common;

use common::{parse_err, parse_error};
use sluice_config::ConfigError;

#[test]
fn the_documented_example_message() {
    let text = format!("{}[pgbouncer]\ndefault_pool_size = abc\n", "\n".repeat(10));
    assert_eq!(
        parse_err(&text),
        "pgbouncer.ini:12: invalid value \"abc\" for default_pool_size: \
         expected a non-negative integer"
    );
}

#[test]
fn error_fields_are_structured() {
    match parse_error("[pgbouncer]\nmax_client_conn = -5\n") {
        ConfigError::InvalidValue {
            file,
            line,
            key,
            value,
            reason,
        } => {
            assert_eq!(file, std::path::Path::new("pgbouncer.ini"));
            assert_eq!(line, 2);
            assert_eq!(key, "max_client_conn");
            assert_eq!(value, "-5");
            assert!(reason.contains("negative"), "{reason}");
        }
        other => panic!("unexpected error {other:?}"),
    }
}

/// `(ini text, expected start of the message, expected reason fragment)`.
fn check(text: &str, prefix: &str, reason: &str) {
    let message = parse_err(text);
    assert!(
        message.starts_with(prefix),
        "{message:?} should start with {prefix:?}"
    );
    assert!(
        message.contains(reason),
        "{message:?} should contain {reason:?}"
    );
}

#[test]
fn bad_setting_values() {
    let cases = [
        (
            "[pgbouncer]\nmin_pool_size = many\n",
            "pgbouncer.ini:2: invalid value \"many\" for min_pool_size",
            "non-negative integer",
        ),
        (
            "[pgbouncer]\n\nreserve_pool_size = -1\n",
            "pgbouncer.ini:3: invalid value \"-1\" for reserve_pool_size",
            "negative",
        ),
        (
            "[pgbouncer]\nlisten_port = 70000\n",
            "pgbouncer.ini:2: invalid value \"70000\" for listen_port",
            "between 1 and 65535",
        ),
        (
            "[pgbouncer]\nlisten_port = 0\n",
            "pgbouncer.ini:2: invalid value \"0\" for listen_port",
            "between 1 and 65535",
        ),
        (
            "[pgbouncer]\nmax_client_conn = 0\n",
            "pgbouncer.ini:2: invalid value \"0\" for max_client_conn",
            "at least 1",
        ),
        (
            "[pgbouncer]\npool_mode = sessions\n",
            "pgbouncer.ini:2: invalid value \"sessions\" for pool_mode",
            "expected one of session, transaction, statement",
        ),
        (
            "[pgbouncer]\nauth_type = crypt\n",
            "pgbouncer.ini:2: invalid value \"crypt\" for auth_type",
            "scram-sha-256",
        ),
        (
            "[pgbouncer]\nlog_stats = maybe\n",
            "pgbouncer.ini:2: invalid value \"maybe\" for log_stats",
            "boolean",
        ),
        (
            "[pgbouncer]\nquery_timeout = soon\n",
            "pgbouncer.ini:2: invalid value \"soon\" for query_timeout",
            "time in seconds",
        ),
        (
            "[pgbouncer]\nserver_lifetime = -3\n",
            "pgbouncer.ini:2: invalid value \"-3\" for server_lifetime",
            "non-negative time",
        ),
        (
            "[pgbouncer]\nunix_socket_mode = 0999\n",
            "pgbouncer.ini:2: invalid value \"0999\" for unix_socket_mode",
            "octal",
        ),
        (
            "[pgbouncer]\nclient_tls_sslmode = always\n",
            "pgbouncer.ini:2: invalid value \"always\" for client_tls_sslmode",
            "verify-full",
        ),
        (
            "[pgbouncer]\npeer_id = 20000\n",
            "pgbouncer.ini:2: invalid value \"20000\" for peer_id",
            "16383",
        ),
        (
            "[pgbouncer]\npkt_buf = 99999999999\n",
            "pgbouncer.ini:2: invalid value \"99999999999\" for pkt_buf",
            "no larger than",
        ),
        (
            "[sluice]\nruntime = threads\n",
            "pgbouncer.ini:2: invalid value \"threads\" for runtime",
            "shared, per_core",
        ),
        (
            "[sluice]\nworkers = -2\n",
            "pgbouncer.ini:2: invalid value \"-2\" for workers",
            "negative",
        ),
    ];
    for (text, prefix, reason) in cases {
        check(text, prefix, reason);
    }
}

#[test]
fn bad_database_values() {
    let cases = [
        (
            "[databases]\napp = pool_size=big\n",
            "pgbouncer.ini:2: invalid value \"big\" for pool_size of database \"app\"",
            "non-negative integer",
        ),
        (
            "[databases]\napp = port=0\n",
            "pgbouncer.ini:2: invalid value \"0\" for port of database \"app\"",
            "between 1 and 65535",
        ),
        (
            "[databases]\napp = port=65536\n",
            "pgbouncer.ini:2: invalid value \"65536\" for port",
            "between 1 and 65535",
        ),
        (
            "[databases]\napp = pool_mode=batch\n",
            "pgbouncer.ini:2: invalid value \"batch\" for pool_mode of database \"app\"",
            "expected one of",
        ),
        (
            "[databases]\napp = server_lifetime=-1\n",
            "pgbouncer.ini:2: invalid value \"-1\" for server_lifetime",
            "time",
        ),
        (
            "[databases]\napp = load_balance_hosts=random\n",
            "pgbouncer.ini:2: invalid value \"random\" for load_balance_hosts",
            "round-robin, disable",
        ),
        (
            "[users]\nbob = max_user_connections=-1\n",
            "pgbouncer.ini:2: invalid value \"-1\" for max_user_connections of user \"bob\"",
            "negative",
        ),
        (
            "[users]\nbob = pool_mode=none\n",
            "pgbouncer.ini:2: invalid value \"none\" for pool_mode of user \"bob\"",
            "expected one of",
        ),
    ];
    for (text, prefix, reason) in cases {
        check(text, prefix, reason);
    }
}

#[test]
fn unknown_connection_parameter_is_an_error() {
    assert_eq!(
        parse_err("[databases]\n\napp = host=x sslmode=require\n"),
        "pgbouncer.ini:3: unknown parameter \"sslmode\" for database \"app\""
    );
    assert_eq!(
        parse_err("[users]\nbob = dbname=x\n"),
        "pgbouncer.ini:2: unknown parameter \"dbname\" for user \"bob\""
    );
}

#[test]
fn fallback_entry_is_checked_too() {
    check(
        "[databases]\n* = port=abc\n",
        "pgbouncer.ini:2: invalid value \"abc\" for port of database \"*\"",
        "port",
    );
}

#[test]
fn reserved_admin_database_name() {
    assert_eq!(
        parse_err("[databases]\npgbouncer = host=x\n"),
        "pgbouncer.ini:2: database name \"pgbouncer\" is reserved for the admin console"
    );
}

#[test]
fn syntax_errors_name_the_line() {
    check(
        "[pgbouncer]\nlisten_port\n",
        "pgbouncer.ini:2: syntax error",
        "key = value",
    );
    check("[pgbouncer\n", "pgbouncer.ini:1: syntax error", "]");
    check(
        "[databases]\napp = host\n",
        "pgbouncer.ini:2: syntax error",
        "database \"app\"",
    );
    check(
        "%exclude x\n",
        "pgbouncer.ini:1: syntax error",
        "unknown directive",
    );
}
