//! What an operator's RELOAD, SET and PAUSE change, and when: at once, as
//! PgBouncer does (found by a review that ran both side by side). A
//! database taken out of the file disconnects its clients and lets go of
//! its servers; a smaller pool
//! closes its idle servers; a pause holds clients already queued for a
//! server; SET reads its value as SQL does; a restart-only key shows
//! what is in force; a rotated log file is reopened.

use std::time::Duration;

use sluice_tests::*;

const T: Duration = Duration::from_secs(10);

async fn show(port: u16, command: &str) -> Vec<ConsoleRow> {
    console_rows(port, "admin", command).await
}

fn field<'a>(row: &'a [(String, Option<String>)], name: &str) -> &'a str {
    row_field(row, name)
}

/// SHOW CONFIG's value of `key`.
async fn config_value(port: u16, key: &str) -> String {
    field(row(&show(port, "SHOW CONFIG").await, "key", key), "value").to_owned()
}

/// The row of `rows` whose `column` is `value`.
fn row<'a>(rows: &'a [ConsoleRow], column: &str, value: &str) -> &'a ConsoleRow {
    rows.iter()
        .find(|r| field(r, column) == value)
        .unwrap_or_else(|| panic!("no row with {column} = {value} in {rows:?}"))
}

/// SHOW STATE's `paused`: yes or no.
async fn paused_state(port: u16) -> String {
    field(
        row(&show(port, "SHOW STATE").await, "key", "paused"),
        "value",
    )
    .to_owned()
}

/// A client inside a transaction: it holds a server in transaction mode.
async fn holding(port: u16) -> tokio_postgres::Client {
    let client = connect_as(port, APP_USER, "postgres").await;
    client
        .batch_execute("begin; select 1")
        .await
        .expect("begin");
    client
}

/// A global PAUSE on a console session of its own, answered with that
/// session (it waits for the servers in use).
fn spawn_pause(
    port: u16,
) -> tokio::task::JoinHandle<Result<tokio_postgres::Client, tokio_postgres::Error>> {
    tokio::spawn(async move {
        let admin = connect_as(port, "admin", "pgbouncer").await;
        admin.simple_query("PAUSE").await.map(|_| admin)
    })
}

fn base(cluster: &sluice_testkit::Cluster) -> ConfigBuilder {
    ConfigBuilder::for_cluster(cluster)
        .set("pool_mode", "transaction")
        .set("admin_users", "admin")
}

#[tokio::test]
async fn a_removed_database_disconnects_its_clients_and_lets_go_of_its_servers() {
    let cluster = app_cluster_with(ServerAuth::Trust, |b| b.database("dropme"));
    // `paused`: another name for the postgres database.
    let paused = format!(
        "host={} port={} dbname=postgres",
        cluster.host(),
        cluster.port()
    );
    let with = base(&cluster)
        .database_on(&cluster, "dropme", "")
        .database("paused", &paused);
    let sluice = with.start();
    let p = sluice.port();
    let admin = connect_as(p, "admin", "pgbouncer").await;
    let idle = connect_as(p, APP_USER, "dropme").await;
    scalar_text(&idle, "select 1").await;
    let busy = connect_as(p, APP_USER, "dropme").await;
    busy.batch_execute("begin; select 1").await.expect("begin");
    let other = connect_as(p, APP_USER, "postgres").await;
    admin
        .simple_query("PAUSE paused")
        .await
        .expect("PAUSE paused");
    admin
        .simple_query("DISABLE dropme")
        .await
        .expect("DISABLE dropme");

    // Out of the file: its clients are disconnected, idle or inside a
    // transaction, as PgBouncer disconnects them; new logins are refused;
    // another database's client goes on.
    sluice.rewrite_config(&base(&cluster).render());
    admin.simple_query("RELOAD").await.expect("RELOAD");
    for (name, client) in [("idle", &idle), ("busy", &busy)] {
        let answered = tokio::time::timeout(T, client.simple_query("select 1"))
            .await
            .unwrap_or_else(|_| panic!("the {name} client of a removed database hung"));
        assert!(
            answered.is_err(),
            "the {name} client of a removed database went on"
        );
    }
    match connect(p, APP_USER, APP_PASSWORD, "dropme").await {
        Ok(_) => panic!("a login to a removed database was taken"),
        Err(e) => assert_eq!(e.code().map(|c| c.code()), Some("3D000"), "{e}"),
    }
    assert_eq!(scalar_text(&other, "select 'on'").await, "on");
    drop((idle, busy));

    // Its clients gone, SHOW POOLS forgets it and its servers close (the
    // database can be dropped); a pause ended with its database.
    let deadline = std::time::Instant::now() + T;
    loop {
        let pools = show(p, "SHOW POOLS").await;
        if pools.iter().all(|r| field(r, "database") != "dropme") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the pool stayed after its last client: {pools:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let left = wait_for_backends(&cluster, "dropme", T, |n| n == 0).await;
    assert_eq!(left, Ok(0), "the removed database's server stayed open");
    cluster
        .psql("postgres", "drop database dropme")
        .expect("drop database once its clients are gone");

    // Back under the same names: neither paused nor disabled.
    sluice.rewrite_config(
        &base(&cluster)
            .database("paused", &paused)
            .database("dropme", &paused)
            .render(),
    );
    admin.simple_query("RELOAD").await.expect("RELOAD");
    let back = connect_as(p, APP_USER, "paused").await;
    let answered = tokio::time::timeout(T, back.simple_query("select 1")).await;
    assert!(
        matches!(answered, Ok(Ok(_))),
        "a database added back under a paused name was still paused"
    );
    let again = connect(p, APP_USER, APP_PASSWORD, "dropme")
        .await
        .expect("a database added back under a disabled name was still disabled");
    scalar_text(&again, "select 1").await;
}

#[tokio::test]
async fn a_pause_holds_a_client_already_queued_for_a_server() {
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = base(&cluster).set("default_pool_size", "1").start();
    let p = sluice.port();
    let holder = holding(p).await;
    let queued = connect_as(p, APP_USER, "postgres").await;
    let query = tokio::spawn(async move { queued.simple_query("select 1").await.is_ok() });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !query.is_finished(),
        "the second client had no server to run on"
    );
    // PAUSE waits for the holder's server.
    let pause = spawn_pause(p);
    tokio::time::sleep(Duration::from_millis(300)).await;
    holder.batch_execute("commit").await.expect("commit");
    let admin = tokio::time::timeout(T, pause)
        .await
        .expect("PAUSE returns once the server is back")
        .unwrap()
        .expect("PAUSE");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !query.is_finished(),
        "the queued client ran its query while paused"
    );
    admin.simple_query("RESUME").await.expect("RESUME");
    let ran = tokio::time::timeout(T, query)
        .await
        .expect("query after RESUME");
    assert!(ran.unwrap(), "the queued query after RESUME");
}

#[tokio::test]
async fn a_smaller_pool_closes_its_idle_servers_at_once() {
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = base(&cluster).set("default_pool_size", "4").start();
    let p = sluice.port();
    let mut clients = Vec::new();
    for _ in 0..4 {
        let c = connect_as(p, APP_USER, "postgres").await;
        c.batch_execute("begin; select 1").await.expect("begin");
        clients.push(c);
    }
    for c in &clients {
        c.batch_execute("commit").await.expect("commit");
    }
    assert_eq!(count_backends(&cluster, "postgres").await, 4);
    let admin = connect_as(p, "admin", "pgbouncer").await;
    admin
        .simple_query("SET default_pool_size = 1")
        .await
        .expect("SET");
    // (server_idle_timeout is 600 s: only the new size closes them)
    let left = wait_for_backends(&cluster, "postgres", T, |n| n <= 1).await;
    assert!(
        left.is_ok(),
        "idle servers above the new size stayed: {left:?}"
    );
    assert_eq!(
        scalar_text(&clients[0], "select 1").await,
        "1",
        "the pool still serves"
    );
}

#[tokio::test]
async fn set_reads_its_value_as_sql_does() {
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = base(&cluster).start();
    let p = sluice.port();
    let admin = connect_as(p, "admin", "pgbouncer").await;
    admin
        .simple_query("SET server_reset_query = 'select ''a=b'''")
        .await
        .expect("a quote doubled in a string");
    assert_eq!(config_value(p, "server_reset_query").await, "select 'a=b'");
    admin
        .simple_query("SET server_reset_query TO 'select 1 = 1'")
        .await
        .expect("TO with an = in the value");
    assert_eq!(config_value(p, "server_reset_query").await, "select 1 = 1");
    admin
        .simple_query("SET \"default_pool_size\" = 9")
        .await
        .expect("a quoted key");
    assert_eq!(config_value(p, "default_pool_size").await, "9");
    for line in [
        "SET server_reset_query = 'unclosed",
        // SQL with spaces must be quoted (PgBouncer: a bare value is a word)
        "SET server_reset_query = DISCARD ALL",
    ] {
        let refused = admin.simple_query(line).await.expect_err(line);
        assert_eq!(sqlstate(&refused), Some("42601"), "{line}: {refused:?}");
    }
    // The session parameters drivers set or ask for on connecting, which
    // PgBouncer's console pretends to have.
    admin
        .simple_query("SET client_encoding = 'UTF8'")
        .await
        .expect("SET client_encoding is ignored");
    let shown = show(p, "SHOW client_encoding").await;
    assert_eq!(field(&shown[0], "client_encoding"), "UTF-8");
}

#[tokio::test]
async fn a_restart_only_key_shows_the_value_in_force_after_a_reload() {
    let cluster = app_cluster(ServerAuth::Trust);
    let config = base(&cluster);
    let sluice = config.start();
    let p = sluice.port();
    let before = config_value(p, "listen_backlog").await;
    sluice.rewrite_config(&config.clone().set("listen_backlog", "77").render());
    let admin = connect_as(p, "admin", "pgbouncer").await;
    admin.simple_query("RELOAD").await.expect("RELOAD");
    assert_eq!(
        config_value(p, "listen_backlog").await,
        before,
        "SHOW CONFIG showed a value that waits for a restart"
    );
    // A key that may change does.
    sluice.rewrite_config(&config.clone().set("default_pool_size", "3").render());
    admin.simple_query("RELOAD").await.expect("RELOAD");
    assert_eq!(config_value(p, "default_pool_size").await, "3");
}

#[tokio::test]
async fn a_rotated_log_file_is_opened_again_by_sighup() {
    let cluster = app_cluster(ServerAuth::Trust);
    let config = base(&cluster).set("logfile", "@DIR@/rotated.log");
    let sluice = config.start();
    let p = sluice.port();
    let log = sluice.dir().join("rotated.log");
    let rotated = sluice.dir().join("rotated.log.1");
    connect_as(p, APP_USER, "postgres").await;
    std::fs::rename(&log, &rotated).expect("rotate the log");
    sluice.reload();
    // The reload's own line lands in the new file.
    let deadline = std::time::Instant::now() + T;
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("configuration reloaded") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no new log file after SIGHUP; the rotated one has: {}",
            std::fs::read_to_string(&rotated).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    connect_as(p, APP_USER, "postgres").await;
    let rotated_text = std::fs::read_to_string(&rotated).expect("rotated log");
    assert!(
        !rotated_text.contains("configuration reloaded"),
        "the reload was logged to the rotated file: {rotated_text}"
    );
}

#[tokio::test]
async fn totals_and_paused_read_as_pgbouncer_1_25_shows_them() {
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = base(&cluster).start();
    let p = sluice.port();
    let names: Vec<String> = show(p, "SHOW TOTALS")
        .await
        .iter()
        .map(|r| field(r, "name").to_owned())
        .collect();
    for name in [
        "total_client_bytes",
        "total_server_bytes",
        "total_ps_client_parse_count",
        "total_ps_server_parse_count",
        "total_ps_bind_count",
        "avg_client_bytes",
        "avg_ps_bind_count",
    ] {
        assert!(names.iter().any(|n| n == name), "{name} not in {names:?}");
    }
    // A global PAUSE pauses no database by name: SHOW DATABASES' column
    // (pgbouncer_exporter's databases_paused) says so.
    let admin = connect_as(p, "admin", "pgbouncer").await;
    admin.simple_query("PAUSE").await.expect("PAUSE");
    let dbs = show(p, "SHOW DATABASES").await;
    assert_eq!(field(row(&dbs, "name", "postgres"), "paused"), "0");
    admin.simple_query("RESUME").await.expect("RESUME");
    admin
        .simple_query("PAUSE postgres")
        .await
        .expect("PAUSE postgres");
    let dbs = show(p, "SHOW DATABASES").await;
    assert_eq!(field(row(&dbs, "name", "postgres"), "paused"), "1");
}

#[tokio::test]
async fn a_cancel_from_the_console_ends_a_pause_that_waits() {
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = base(&cluster).set("stats_users", "watcher").start();
    let p = sluice.port();
    let holder = holding(p).await;
    let admin = connect_as(p, "admin", "pgbouncer").await;
    let token = admin.cancel_token();
    // PAUSE waits for the holder's server; Ctrl-C (a cancel request with
    // the console session's key) gives up and ends the pause.
    let pause = tokio::spawn(async move { admin.simple_query("PAUSE").await.map(drop) });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!pause.is_finished(), "PAUSE waits for the server in use");
    token
        .cancel_query(tokio_postgres::NoTls)
        .await
        .expect("send the cancel");
    let answered = tokio::time::timeout(Duration::from_secs(5), pause)
        .await
        .expect("PAUSE answered after the cancel")
        .unwrap();
    let error = answered.expect_err("a cancelled PAUSE is an error");
    assert_eq!(sqlstate(&error), Some("57014"), "{error:?}");
    assert_eq!(paused_state(p).await, "no");
    let other = connect_as(p, APP_USER, "postgres").await;
    let ran = tokio::time::timeout(T, other.simple_query("select 1")).await;
    assert!(matches!(ran, Ok(Ok(_))), "a query after the cancel");
    holder.batch_execute("commit").await.expect("commit");
    // A stats user's session has no key to end a pause with.
    let watcher = connect_as(p, "watcher", "pgbouncer").await;
    let admin = connect_as(p, "admin", "pgbouncer").await;
    admin.simple_query("PAUSE").await.expect("PAUSE");
    watcher
        .cancel_token()
        .cancel_query(tokio_postgres::NoTls)
        .await
        .expect("send the cancel");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(paused_state(p).await, "yes", "a stats user ended the pause");
}

#[tokio::test]
async fn a_pause_keeps_the_query_wait_timeout_of_a_client_sent_back_from_the_line() {
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = base(&cluster)
        .set("default_pool_size", "1")
        .set("query_wait_timeout", "4")
        .start();
    let p = sluice.port();
    let holder = holding(p).await;
    let queued = connect_as(p, APP_USER, "postgres").await;
    let arrived = std::time::Instant::now();
    let query = tokio::spawn(async move { queued.simple_query("select 1").await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let pause = spawn_pause(p);
    tokio::time::sleep(Duration::from_millis(2000)).await;
    holder.batch_execute("commit").await.expect("commit");
    // The queued client is sent back to wait out the pause; its 4 s run
    // from its arrival, not from then (which would end at about 6.5 s).
    let refused = tokio::time::timeout(T, query)
        .await
        .expect("the queued client is answered")
        .unwrap();
    let waited = arrived.elapsed();
    let error = refused.expect_err("query_wait_timeout");
    assert!(
        error.to_string().contains("query_wait_timeout")
            || error
                .as_db_error()
                .is_some_and(|e| e.message().contains("query_wait_timeout")),
        "{error:?}"
    );
    assert!(
        waited < Duration::from_millis(5500),
        "query_wait_timeout started over: answered after {waited:?}"
    );
    let admin = tokio::time::timeout(T, pause)
        .await
        .unwrap()
        .unwrap()
        .expect("PAUSE");
    admin.simple_query("RESUME").await.expect("RESUME");
}
