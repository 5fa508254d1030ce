//! `Settings::set` and `Settings::value_of`, as the admin console uses them.

use std::time::Duration;

use sluice_config::{ConfigError, PoolMode, Settings, known_keys};

#[test]
fn every_key_round_trips_through_its_shown_value() {
    let mut settings = Settings::default();
    for info in known_keys().iter().filter(|info| info.changeable) {
        let shown = settings.value_of(info.key).unwrap();
        // Empty text is a valid "unset" for every changeable key.
        settings.set(info.key, &shown).unwrap_or_else(|err| {
            panic!("set({}, {shown:?}) failed: {err}", info.key);
        });
        assert_eq!(settings.value_of(info.key).as_deref(), Some(shown.as_str()));
    }
    assert_eq!(settings, Settings::default());
}

#[test]
fn set_then_show() {
    let mut settings = Settings::default();
    let cases = [
        ("default_pool_size", "55", "55"),
        ("server_idle_timeout", "2.5", "2.5"),
        ("query_timeout", "1500ms", "1.5"),
        ("client_idle_timeout", "2min", "120"),
        ("log_connections", "off", "0"),
        ("server_round_robin", "yes", "1"),
        ("pool_mode", "Transaction", "transaction"),
        ("auth_type", "scram-sha-256", "scram-sha-256"),
        ("admin_users", "a, b", "a,b"),
        ("auth_user", "", ""),
        ("server_check_query", "", ""),
        ("SERVER_RESET_QUERY", "DEALLOCATE ALL", "DEALLOCATE ALL"),
    ];
    for (key, value, shown) in cases {
        settings.set(key, value).unwrap();
        assert_eq!(settings.value_of(key).as_deref(), Some(shown), "{key}");
    }
    assert_eq!(settings.default_pool_size, 55);
    assert_eq!(settings.query_timeout, Duration::from_millis(1500));
    assert_eq!(settings.pool_mode, PoolMode::Transaction);
    assert_eq!(settings.admin_users, ["a", "b"]);
}

#[test]
fn set_refuses_bad_values() {
    let mut settings = Settings::default();
    let err = settings.set("default_pool_size", "abc").unwrap_err();
    assert!(matches!(err, ConfigError::InvalidSetting { .. }));
    assert_eq!(
        err.to_string(),
        "invalid value \"abc\" for default_pool_size: expected a non-negative integer"
    );
    assert!(settings.set("max_client_conn", "0").is_err());
    assert!(settings.set("pool_mode", "bogus").is_err());
    assert_eq!(settings, Settings::default());
}

#[test]
fn set_refuses_unknown_and_startup_only_keys() {
    let mut settings = Settings::default();
    assert!(matches!(
        settings.set("no_such_key", "1"),
        Err(ConfigError::UnknownKey { .. })
    ));
    let err = settings.set("listen_port", "7000").unwrap_err();
    assert!(matches!(err, ConfigError::NotChangeable { .. }));
    assert_eq!(
        err.to_string(),
        "listen_port cannot be changed while running; restart to change it"
    );
    assert_eq!(settings.listen_port, 6432);
}

#[test]
fn value_of_formats_like_show_config() {
    let settings = Settings::default();
    assert_eq!(
        settings.value_of("reserve_pool_timeout").as_deref(),
        Some("5")
    );
    assert_eq!(settings.value_of("tcp_keepalive").as_deref(), Some("1"));
    assert_eq!(
        settings.value_of("unix_socket_mode").as_deref(),
        Some("0777")
    );
    assert_eq!(settings.value_of("auth_file").as_deref(), Some(""));
    assert_eq!(
        settings.value_of("Service_Name").as_deref(),
        Some("pgbouncer")
    );
    assert_eq!(settings.value_of("runtime").as_deref(), Some("per_core"));
    assert_eq!(settings.value_of("nope"), None);
}
