//! Every section of pgbouncer.ini lands in the right part of `Config`.

mod common;

use std::time::Duration;

use common::parse_ok;
use sluice_config::{PoolMode, RuntimeKind};

#[test]
fn databases_keep_file_order_and_fallback_is_separate() {
    let config = parse_ok(
        "[databases]\n\
         zeta = host=z\n\
         * = host=fallback port=5433\n\
         alpha = host=a dbname=real_alpha\n\
         foodb =\n",
    );
    let names: Vec<&str> = config.databases.iter().map(|db| db.name.as_str()).collect();
    assert_eq!(names, ["zeta", "alpha", "foodb"]);
    let fallback = config.fallback_database.as_ref().unwrap();
    assert_eq!(fallback.name, "*");
    assert_eq!(fallback.host.as_deref(), Some("fallback"));
    assert_eq!(fallback.port, Some(5433));
    assert_eq!(fallback.line, 3);
    assert!(config.database("*").is_none());
    let alpha = config.database("alpha").unwrap();
    assert_eq!(alpha.dbname.as_deref(), Some("real_alpha"));
    assert_eq!(alpha.line, 4);
    let foodb = config.database("foodb").unwrap();
    assert_eq!((foodb.host.as_ref(), foodb.dbname.as_ref()), (None, None));
    assert!(config.warnings.is_empty(), "{:?}", config.warnings);
}

#[test]
fn database_parameters_are_typed() {
    let config = parse_ok(
        "[databases]\n\
         app = host=h1,h2 port=6000 user=u password=p auth_user=au pool_size=7 \
         min_pool_size=1 reserve_pool_size=2 pool_mode=statement max_db_connections=9 \
         max_db_client_connections=90 server_lifetime=1.5 client_encoding=UTF8 \
         datestyle=ISO timezone=UTC application_name=app connect_query='select 1'\n\
         old = reserve_pool=4\n",
    );
    let app = config.database("app").unwrap();
    assert_eq!(app.host.as_deref(), Some("h1,h2"));
    assert_eq!(app.port, Some(6000));
    assert_eq!(app.user.as_deref(), Some("u"));
    assert_eq!(app.password.as_deref(), Some("p"));
    assert_eq!(app.auth_user.as_deref(), Some("au"));
    assert_eq!(app.pool_size, Some(7));
    assert_eq!(app.min_pool_size, Some(1));
    assert_eq!(app.reserve_pool_size, Some(2));
    assert_eq!(app.pool_mode, Some(PoolMode::Statement));
    assert_eq!(app.max_db_connections, Some(9));
    assert_eq!(app.max_db_client_connections, Some(90));
    assert_eq!(app.server_lifetime, Some(Duration::from_millis(1500)));
    assert_eq!(app.client_encoding.as_deref(), Some("UTF8"));
    assert_eq!(app.datestyle.as_deref(), Some("ISO"));
    assert_eq!(app.timezone.as_deref(), Some("UTC"));
    assert_eq!(app.application_name.as_deref(), Some("app"));
    assert_eq!(app.connect_query.as_deref(), Some("select 1"));
    assert_eq!(config.database("old").unwrap().reserve_pool_size, Some(4));
}

#[test]
fn users_section() {
    let config = parse_ok(
        "[users]\n\
         alice = pool_mode=transaction pool_size=3 reserve_pool_size=1 \
         max_user_connections=10 max_user_client_connections=100\n\
         bob = \n",
    );
    let alice = config.user("alice").unwrap();
    assert_eq!(alice.pool_mode, Some(PoolMode::Transaction));
    assert_eq!(alice.pool_size, Some(3));
    assert_eq!(alice.reserve_pool_size, Some(1));
    assert_eq!(alice.max_user_connections, Some(10));
    assert_eq!(alice.max_user_client_connections, Some(100));
    assert_eq!(alice.line, 2);
    assert_eq!(config.user("bob").unwrap().pool_mode, None);
    assert!(config.user("carol").is_none());
}

#[test]
fn pgbouncer_and_sluice_sections_fill_settings() {
    let config = parse_ok(
        "[pgbouncer]\n\
         LISTEN_PORT = 7000\n\
         Pool_Mode = Transaction\n\
         admin_users = a, b ,c\n\
         reserve_pool_timeout = 5.0\n\
         server_idle_timeout = 250ms\n\
         [sluice]\n\
         workers = 3\n\
         runtime = shared\n\
         metrics_addr = 0.0.0.0:9100\n",
    );
    let settings = &config.settings;
    assert_eq!(settings.listen_port, 7000);
    assert_eq!(settings.pool_mode, PoolMode::Transaction);
    assert_eq!(settings.admin_users, ["a", "b", "c"]);
    assert_eq!(settings.reserve_pool_timeout, Duration::from_secs(5));
    assert_eq!(settings.server_idle_timeout, Duration::from_millis(250));
    assert_eq!(settings.workers, 3);
    assert_eq!(settings.runtime, RuntimeKind::Shared);
    assert_eq!(settings.metrics_addr.as_deref(), Some("0.0.0.0:9100"));
    assert!(config.warnings.is_empty(), "{:?}", config.warnings);
}

#[test]
fn peers_section_is_ignored_quietly() {
    let config = parse_ok("[peers]\n1 = host=/tmp/a\n2 = host=b port=6433 pool_size=4\n");
    assert!(config.warnings.is_empty());
    assert!(config.databases.is_empty());
}

#[test]
fn later_definition_of_a_database_wins_in_place() {
    let config = parse_ok("[databases]\na = host=one\nb = host=b\na = host=two\n");
    let names: Vec<&str> = config.databases.iter().map(|db| db.name.as_str()).collect();
    assert_eq!(names, ["a", "b"]);
    assert_eq!(config.database("a").unwrap().host.as_deref(), Some("two"));
    assert_eq!(config.warnings.len(), 1);
    assert_eq!(config.warnings[0].line, 4);
}

#[test]
fn conffile_is_the_origin() {
    let config = parse_ok("");
    assert_eq!(config.settings.conffile, "pgbouncer.ini");
    assert_eq!(
        config.settings.value_of("conffile").as_deref(),
        Some("pgbouncer.ini")
    );
}

#[test]
fn relative_auth_file_is_taken_from_the_ini_directory() {
    let config = sluice_config::parse_str(
        "[pgbouncer]\nauth_file = userlist.txt\nauth_hba_file = /abs/hba.conf\n",
        std::path::Path::new("/etc/pgbouncer/pgbouncer.ini"),
    )
    .unwrap();
    assert_eq!(
        config.settings.auth_file.as_deref(),
        Some(std::path::Path::new("/etc/pgbouncer/userlist.txt"))
    );
    assert_eq!(
        config.settings.auth_hba_file.as_deref(),
        Some(std::path::Path::new("/abs/hba.conf"))
    );
}
