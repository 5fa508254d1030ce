//! `Settings::default()` matches PgBouncer's documented defaults, and the
//! reference table agrees with the struct.

use std::time::Duration;

use sluice_config::{AuthType, DEFAULT_AUTH_QUERY, PoolMode, RuntimeKind, Settings, known_keys};

#[test]
fn sample_of_pgbouncer_defaults() {
    let settings = Settings::default();
    assert_eq!(settings.listen_addr, "");
    assert_eq!(settings.listen_port, 6432);
    assert_eq!(settings.unix_socket_dir, "/tmp");
    assert_eq!(settings.unix_socket_mode, 0o777);
    assert_eq!(settings.auth_type, AuthType::Md5);
    assert_eq!(settings.auth_file, None);
    assert_eq!(settings.auth_query, DEFAULT_AUTH_QUERY);
    assert_eq!(settings.pool_mode, PoolMode::Session);
    assert_eq!(settings.max_client_conn, 100);
    assert_eq!(settings.default_pool_size, 20);
    assert_eq!(settings.min_pool_size, 0);
    assert_eq!(settings.reserve_pool_size, 0);
    assert_eq!(settings.reserve_pool_timeout, Duration::from_secs(5));
    assert_eq!(settings.max_db_connections, 0);
    assert_eq!(settings.max_user_connections, 0);
    assert_eq!(settings.max_prepared_statements, 200);
    assert_eq!(settings.server_reset_query, "DISCARD ALL");
    assert!(!settings.server_reset_query_always);
    assert_eq!(settings.server_check_delay, Duration::from_secs(30));
    assert_eq!(settings.server_check_query, "<empty>");
    assert_eq!(settings.server_lifetime, Duration::from_secs(3600));
    assert_eq!(settings.server_idle_timeout, Duration::from_secs(600));
    assert_eq!(settings.server_connect_timeout, Duration::from_secs(15));
    assert_eq!(settings.server_login_retry, Duration::from_secs(15));
    assert_eq!(settings.client_login_timeout, Duration::from_secs(60));
    assert_eq!(settings.autodb_idle_timeout, Duration::from_secs(3600));
    assert_eq!(settings.query_timeout, Duration::ZERO);
    assert_eq!(settings.query_wait_timeout, Duration::from_secs(120));
    assert_eq!(settings.cancel_wait_timeout, Duration::from_secs(10));
    assert_eq!(settings.client_idle_timeout, Duration::ZERO);
    assert_eq!(settings.idle_transaction_timeout, Duration::ZERO);
    assert_eq!(settings.transaction_timeout, Duration::ZERO);
    assert_eq!(settings.suspend_timeout, Duration::from_secs(10));
    assert_eq!(settings.dns_max_ttl, Duration::from_secs(15));
    assert_eq!(settings.dns_nxdomain_ttl, Duration::from_secs(15));
    assert_eq!(settings.max_packet_size, 2_147_483_647);
    assert_eq!(settings.pkt_buf, 4096);
    assert_eq!(settings.listen_backlog, 128);
    assert_eq!(settings.sbuf_loopcnt, 5);
    assert!(!settings.so_reuseport);
    assert!(settings.tcp_keepalive);
    assert_eq!(settings.tcp_keepidle, 0);
    assert!(settings.log_connections && settings.log_disconnections);
    assert!(settings.log_pooler_errors && settings.log_stats);
    assert_eq!(settings.stats_period, Duration::from_secs(60));
    assert_eq!(settings.verbose, 0);
    assert_eq!(settings.syslog_ident, "pgbouncer");
    assert_eq!(settings.syslog_facility, "daemon");
    assert_eq!(settings.client_tls_sslmode, "disable");
    assert_eq!(settings.server_tls_sslmode, "prefer");
    assert_eq!(settings.track_extra_parameters, ["IntervalStyle"]);
    assert!(settings.admin_users.is_empty());
    assert_eq!(settings.peer_id, 0);
    assert_eq!(settings.scram_iterations, 4096);
    assert_eq!(settings.workers, 0);
    assert_eq!(settings.runtime, RuntimeKind::PerCore);
    assert_eq!(settings.metrics_addr, None);
}

#[test]
fn reference_defaults_are_what_value_of_shows() {
    let settings = Settings::default();
    for info in known_keys() {
        assert_eq!(
            settings.value_of(info.key).as_deref(),
            Some(info.default),
            "default of {}",
            info.key
        );
    }
}

#[test]
fn every_key_pgbouncer_documents_is_known() {
    // PgBouncer 1.25's config.md, [pgbouncer] section, plus newer keys.
    let documented = [
        "logfile",
        "pidfile",
        "listen_addr",
        "listen_port",
        "unix_socket_dir",
        "unix_socket_mode",
        "unix_socket_group",
        "user",
        "pool_mode",
        "max_client_conn",
        "default_pool_size",
        "min_pool_size",
        "reserve_pool_size",
        "reserve_pool_timeout",
        "max_db_connections",
        "max_db_client_connections",
        "max_user_connections",
        "max_user_client_connections",
        "server_round_robin",
        "track_extra_parameters",
        "ignore_startup_parameters",
        "peer_id",
        "disable_pqexec",
        "application_name_add_host",
        "conffile",
        "service_name",
        "job_name",
        "stats_period",
        "max_prepared_statements",
        "scram_iterations",
        "auth_type",
        "auth_hba_file",
        "auth_ident_file",
        "auth_file",
        "auth_user",
        "auth_query",
        "auth_dbname",
        "auth_ldap_options",
        "syslog",
        "syslog_ident",
        "syslog_facility",
        "log_connections",
        "log_disconnections",
        "log_pooler_errors",
        "log_stats",
        "verbose",
        "admin_users",
        "stats_users",
        "server_reset_query",
        "server_reset_query_always",
        "server_check_delay",
        "server_check_query",
        "server_fast_close",
        "server_lifetime",
        "server_idle_timeout",
        "server_connect_timeout",
        "server_login_retry",
        "client_login_timeout",
        "autodb_idle_timeout",
        "pool_idle_timeout",
        "dns_max_ttl",
        "dns_nxdomain_ttl",
        "dns_zone_check_period",
        "resolv_conf",
        "query_wait_notify",
        "login_notify_message",
        "client_tls_sslmode",
        "client_tls_key_file",
        "client_tls_cert_file",
        "client_tls_ca_file",
        "client_tls_protocols",
        "client_tls_ciphers",
        "client_tls13_ciphers",
        "client_tls_ecdhcurve",
        "client_tls_dheparams",
        "server_tls_sslmode",
        "server_tls_ca_file",
        "server_tls_key_file",
        "server_tls_cert_file",
        "server_tls_protocols",
        "server_tls_ciphers",
        "server_tls13_ciphers",
        "query_timeout",
        "query_wait_timeout",
        "cancel_wait_timeout",
        "client_idle_timeout",
        "idle_transaction_timeout",
        "transaction_timeout",
        "pkt_buf",
        "max_packet_size",
        "listen_backlog",
        "sbuf_loopcnt",
        "so_reuseport",
        "tcp_defer_accept",
        "tcp_socket_buffer",
        "tcp_keepalive",
        "tcp_keepcnt",
        "tcp_keepidle",
        "tcp_keepintvl",
        "tcp_user_timeout",
        "suspend_timeout",
    ];
    for key in documented {
        let info = sluice_config::key_info(key);
        assert!(info.is_some(), "{key} is not known");
        assert_eq!(info.map(|info| info.section), Some("pgbouncer"), "{key}");
    }
}

#[test]
fn changeable_follows_pgbouncer() {
    let fixed = [
        "listen_addr",
        "listen_port",
        "unix_socket_dir",
        "unix_socket_mode",
        "unix_socket_group",
        "user",
        "pidfile",
        "so_reuseport",
        "peer_id",
        "pkt_buf",
        "listen_backlog",
        "workers",
        "runtime",
        "io_backend",
        "metrics_addr",
    ];
    let changeable = [
        "default_pool_size",
        "max_client_conn",
        "server_idle_timeout",
        "query_timeout",
        "auth_type",
        "auth_file",
        "admin_users",
        "log_connections",
        "pool_mode",
        "logfile",
    ];
    for key in fixed {
        assert!(!sluice_config::key_info(key).unwrap().changeable, "{key}");
    }
    for key in changeable {
        assert!(sluice_config::key_info(key).unwrap().changeable, "{key}");
    }
}

#[test]
fn sluice_section_keys() {
    let sluice: Vec<&str> = known_keys()
        .iter()
        .filter(|info| info.section == "sluice")
        .map(|info| info.key)
        .collect();
    assert_eq!(
        sluice,
        [
            "failover_hold",
            "health_check_period",
            "health_check_threshold",
            "health_check_timeout",
            "io_backend",
            "max_held_memory_mb",
            "metrics_addr",
            "read_your_writes",
            "replica_max_lag",
            "replica_max_lag_bytes",
            "route_reads",
            "runtime",
            "track_session_objects",
            "web_console",
            "web_console_file",
            "worker_busy_percent",
            "workers"
        ]
    );
}
