//! Full, realistic configuration files parse without errors or warnings.

mod common;

use std::path::Path;
use std::time::Duration;

use common::fixture;
use sluice_config::{AuthType, LoadBalanceHosts, PoolMode, RuntimeKind, load};

#[test]
fn full_production_style_file() {
    let path = fixture("pgbouncer_full.ini");
    let config = load(&path).unwrap();
    assert!(config.warnings.is_empty(), "{:?}", config.warnings);

    let names: Vec<&str> = config.databases.iter().map(|db| db.name.as_str()).collect();
    assert_eq!(
        names,
        ["appdb", "reports", "billing", "analytics", "legacy-db"]
    );
    let reports = config.database("reports").unwrap();
    assert_eq!(reports.host.as_deref(), Some("10.0.0.11,10.0.0.12"));
    assert_eq!(reports.load_balance_hosts, Some(LoadBalanceHosts::Disable));
    let billing = config.database("billing").unwrap();
    assert_eq!(billing.password.as_deref(), Some("s3cr'et pa\\ss"));
    assert_eq!(
        billing.connect_query.as_deref(),
        Some("SET search_path TO billing, public")
    );
    let analytics = config.database("analytics").unwrap();
    assert_eq!(analytics.reserve_pool_size, Some(10));
    assert_eq!(analytics.pool_mode, Some(PoolMode::Transaction));
    assert_eq!(analytics.server_lifetime, Some(Duration::from_secs(1800)));
    assert_eq!(
        config.database("legacy-db").unwrap().query_wait_timeout,
        None
    );
    assert_eq!(
        config
            .fallback_database
            .as_ref()
            .and_then(|db| db.host.as_deref()),
        Some("pg-main.internal")
    );
    assert_eq!(config.users.len(), 2);
    assert_eq!(
        config.user("web").unwrap().idle_transaction_timeout,
        Some(Duration::from_secs(60))
    );

    let settings = &config.settings;
    assert_eq!(settings.listen_addr, "127.0.0.1, ::1");
    assert_eq!(settings.unix_socket_mode, 0o770);
    assert_eq!(settings.auth_type, AuthType::ScramSha256);
    assert_eq!(settings.auth_file, Some(fixture("userlist.txt")));
    assert_eq!(settings.admin_users, ["postgres", "ops"]);
    assert_eq!(
        settings.ignore_startup_parameters,
        ["extra_float_digits", "options"]
    );
    assert_eq!(settings.pool_mode, PoolMode::Transaction);
    assert_eq!(settings.max_client_conn, 2000);
    assert_eq!(settings.reserve_pool_timeout, Duration::from_millis(2500));
    assert!(settings.server_round_robin);
    assert!(!settings.syslog);
    assert_eq!(settings.tcp_keepidle, 60);
    assert_eq!(settings.workers, 4);
    assert_eq!(settings.runtime, RuntimeKind::Shared);
    assert_eq!(settings.metrics_addr.as_deref(), Some("127.0.0.1:9127"));
    assert_eq!(settings.conffile, path.display().to_string());
}

/// Debian's packaged sample, when installed on this machine.
#[test]
fn debian_packaged_pgbouncer_ini() {
    let path = Path::new("/etc/pgbouncer/pgbouncer.ini");
    if !path.exists() {
        eprintln!("skipped: {} is not installed", path.display());
        return;
    }
    let config = load(path).unwrap();
    assert!(config.warnings.is_empty(), "{:?}", config.warnings);
    assert_eq!(config.settings.listen_port, 6432);
}
