//! Timeouts: waiting for a server (query_wait_timeout), idle clients and
//! idle transactions, idle and old servers, unanswered server connects,
//! failed server logins (server_login_retry), clients that never finish
//! logging in, and connect_query running on every new server.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use sluice_tests::*;
use tokio::net::TcpListener;

fn transaction_pool(cluster: &Cluster, pool_size: &str) -> ConfigBuilder {
    ConfigBuilder::for_cluster(cluster)
        .set("pool_mode", "transaction")
        .set("default_pool_size", pool_size)
}

/// The SQLSTATE and message a connection ended with.
fn ending(result: Option<Result<(), tokio_postgres::Error>>) -> (String, String) {
    match result {
        None => panic!("the connection is still open"),
        Some(Ok(())) => panic!("the connection ended without an error message"),
        Some(Err(error)) => match error.as_db_error() {
            Some(db) => (db.code().code().to_owned(), db.message().to_owned()),
            None => panic!("the connection ended without an ErrorResponse: {error:?}"),
        },
    }
}

#[tokio::test]
async fn query_wait_timeout_fails_a_client_waiting_for_a_server() {
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = transaction_pool(&cluster, "1")
        .set("query_wait_timeout", "1")
        .start();
    let holder = connect_as(sluice.port(), APP_USER, "postgres").await;
    holder.batch_execute("begin; select 1").await.unwrap();

    let waiter = connect_as(sluice.port(), APP_USER, "postgres").await;
    let started = Instant::now();
    let result = tokio::time::timeout(Duration::from_secs(10), waiter.simple_query("select 1"))
        .await
        .expect("the waiting query must end by query_wait_timeout");
    let waited = started.elapsed();
    let error = expect_sqlstate(result, "08P01");
    assert_eq!(error.as_db_error().unwrap().message(), "query_wait_timeout");
    assert!(
        waited >= Duration::from_millis(800) && waited < Duration::from_secs(4),
        "failed after {waited:?} with query_wait_timeout=1"
    );
    // The holder is unaffected.
    holder.batch_execute("commit").await.unwrap();
}

#[tokio::test]
async fn client_idle_timeout_disconnects_idle_clients_only() {
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = ConfigBuilder::for_cluster(&cluster)
        .set("client_idle_timeout", "1")
        .start();
    let mut idle = connect_tracked(sluice.port(), APP_USER, "", "postgres")
        .await
        .unwrap();
    let busy = connect_as(sluice.port(), APP_USER, "postgres").await;
    for _ in 0..8 {
        scalar_text(&busy, "select 1").await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let (code, message) = ending(idle.ended(Duration::from_secs(5)).await);
    assert_eq!(
        (code.as_str(), message.as_str()),
        ("08P01", "client_idle_timeout")
    );
    assert_eq!(
        scalar_text(&busy, "select 2").await,
        "2",
        "active client kept"
    );
}

#[tokio::test]
async fn idle_transaction_timeout_ends_the_client_and_frees_the_server() {
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = transaction_pool(&cluster, "1")
        .set("idle_transaction_timeout", "1")
        .start();
    let mut idle = connect_tracked(sluice.port(), APP_USER, "", "postgres")
        .await
        .unwrap();
    idle.client
        .batch_execute("begin; create temp table in_tx(x int)")
        .await
        .unwrap();
    let (code, message) = ending(idle.ended(Duration::from_secs(5)).await);
    assert_eq!(
        (code.as_str(), message.as_str()),
        ("25P03", "idle transaction timeout")
    );

    let next = connect_as(sluice.port(), APP_USER, "postgres").await;
    let result = tokio::time::timeout(
        Duration::from_secs(5),
        scalar(&next, "select txid_current_if_assigned()::text"),
    )
    .await
    .expect("the pool's only server must be free again");
    assert_eq!(
        result, None,
        "the next client must not inherit the open transaction"
    );
}

#[tokio::test]
async fn server_idle_timeout_closes_idle_servers() {
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = ConfigBuilder::for_cluster(&cluster)
        .set("server_idle_timeout", "1")
        .start();
    let client = connect_as(sluice.port(), APP_USER, "postgres").await;
    scalar_text(&client, "select 1").await;
    drop(client);
    assert_eq!(
        wait_for_backends(&cluster, "postgres", Duration::from_secs(2), |n| n == 1).await,
        Ok(1),
        "the server stays pooled after the client left"
    );
    assert_eq!(
        wait_for_backends(&cluster, "postgres", Duration::from_secs(6), |n| n == 0).await,
        Ok(0),
        "server_idle_timeout=1 must close the idle server"
    );
    // Logged as PgBouncer logs it (log_disconnections, on by default).
    assert!(
        sluice
            .log()
            .contains("closing because: server idle timeout (age="),
        "{}",
        sluice.log_tail(10)
    );
}

#[tokio::test]
async fn server_lifetime_replaces_old_servers() {
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = transaction_pool(&cluster, "1")
        .set("server_lifetime", "1")
        .start();
    let client = connect_as(sluice.port(), APP_USER, "postgres").await;
    let first = scalar_text(&client, "select pg_backend_pid()").await;
    assert_eq!(scalar_text(&client, "select pg_backend_pid()").await, first);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let later = scalar_text(&client, "select pg_backend_pid()").await;
    assert_ne!(
        later, first,
        "a server older than server_lifetime=1 was reused"
    );
    assert!(count_backends(&cluster, "postgres").await <= 1);
    assert!(
        sluice
            .log()
            .contains("closing because: server lifetime over"),
        "{}",
        sluice.log_tail(10)
    );
}

/// A TCP server that accepts connections and never says anything; counts
/// the connections it got.
async fn silent_server() -> (u16, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = accepted.clone();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            counter.fetch_add(1, Ordering::SeqCst);
            held.push(socket);
        }
    });
    (port, accepted)
}

/// Logs in and runs a query; returns the first error and how long it took.
async fn login_and_query(port: u16) -> (Result<(), tokio_postgres::Error>, Duration) {
    let started = Instant::now();
    let outcome = tokio::time::timeout(Duration::from_secs(20), async {
        let client = connect(port, APP_USER, "", "silent").await?;
        client.simple_query("select 1").await.map(drop)
    })
    .await
    .expect("the client must get an answer, not hang");
    (outcome, started.elapsed())
}

#[tokio::test]
async fn server_connect_timeout_fails_clients_of_an_unresponsive_server() {
    let (server_port, accepted) = silent_server().await;
    let sluice = ConfigBuilder::new()
        .database(
            "silent",
            &format!("host=127.0.0.1 port={server_port} dbname=x"),
        )
        .set("server_connect_timeout", "1")
        .set("server_login_retry", "0.2")
        .set("query_wait_timeout", "10")
        .start();
    let (outcome, took) = login_and_query(sluice.port()).await;
    assert!(outcome.is_err(), "a silent server cannot serve queries");
    assert!(
        accepted.load(Ordering::SeqCst) >= 1,
        "sluice never connected"
    );
    assert!(
        took < Duration::from_secs(5),
        "the client waited {took:?} with server_connect_timeout=1"
    );
}

#[tokio::test]
async fn server_login_retry_fails_the_next_client_fast() {
    let (server_port, accepted) = silent_server().await;
    let sluice = ConfigBuilder::new()
        .database(
            "silent",
            &format!("host=127.0.0.1 port={server_port} dbname=x"),
        )
        .set("server_connect_timeout", "1")
        .set("server_login_retry", "3")
        .set("query_wait_timeout", "10")
        .start();
    let (first, _) = login_and_query(sluice.port()).await;
    assert!(first.is_err());
    let attempts = accepted.load(Ordering::SeqCst);

    let (second, took) = login_and_query(sluice.port()).await;
    assert!(second.is_err());
    assert!(
        took < Duration::from_millis(700),
        "within server_login_retry the next client must fail at once, took {took:?}"
    );
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        attempts,
        "no new server connection within server_login_retry"
    );

    tokio::time::sleep(Duration::from_secs(3)).await;
    let (third, _) = login_and_query(sluice.port()).await;
    assert!(third.is_err());
    assert!(
        accepted.load(Ordering::SeqCst) > attempts,
        "after server_login_retry sluice must try the server again"
    );
}

/// A RELOAD that fixes what made server logins fail lets the next client
/// try at once: the cached error was served for the rest of
/// server_login_retry (a review).
#[tokio::test]
async fn a_reload_forgets_a_cached_login_failure() {
    let cluster = app_cluster(ServerAuth::Trust);
    let dead_port = sluice_testkit::free_port().expect("free port");
    let config = |port: u16| {
        ConfigBuilder::new()
            .database(
                "fixme",
                &format!("host={} port={port} dbname=postgres", cluster.host()),
            )
            .set("server_login_retry", "60")
    };
    let sluice = config(dead_port).start();
    let failed = connect(sluice.port(), APP_USER, APP_PASSWORD, "fixme").await;
    assert!(failed.is_err());
    sluice.rewrite_config(&config(cluster.port()).render());
    sluice.reload();
    let fixed = eventually(Duration::from_secs(10), || async {
        connect(sluice.port(), APP_USER, APP_PASSWORD, "fixme")
            .await
            .ok()
    })
    .await
    .unwrap_or_else(|| panic!("still refused after the RELOAD\n{}", sluice.log_tail(10)));
    assert_eq!(scalar_text(&fixed, "select 'fixed'").await, "fixed");
}

#[tokio::test]
async fn client_login_timeout_drops_silent_clients() {
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = ConfigBuilder::for_cluster(&cluster)
        .set("client_login_timeout", "1")
        .start();
    let started = Instant::now();
    let mut silent = RawClient::connect(sluice.port()).await;
    let fields = silent
        .expect_error_or_close(Duration::from_secs(6))
        .await
        .expect("an ErrorResponse saying why, as PgBouncer sends");
    assert_eq!(error_field(&fields, b'C'), Some("08P01"));
    assert_eq!(error_field(&fields, b'M'), Some("client_login_timeout"));
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(800),
        "dropped after {took:?}, before client_login_timeout=1"
    );
    // Others still log in.
    let client = connect_as(sluice.port(), APP_USER, "postgres").await;
    assert_eq!(scalar_text(&client, "select 1").await, "1");
}

#[tokio::test]
async fn client_login_timeout_drops_a_client_stuck_in_authentication() {
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = ConfigBuilder::for_cluster(&cluster)
        .set("client_login_timeout", "1")
        .set("auth_type", "md5")
        .userlist(&[(APP_USER, APP_PASSWORD)])
        .start();
    let mut stuck = RawClient::connect(sluice.port()).await;
    stuck.startup(APP_USER, "postgres").await;
    match stuck.read_message(Duration::from_secs(5)).await {
        RawReply::Message(b'R', _) => {}
        other => panic!("expected a password request, got {other:?}"),
    }
    // Never answer it.
    let started = Instant::now();
    let fields = stuck
        .expect_error_or_close(Duration::from_secs(6))
        .await
        .expect("an ErrorResponse");
    assert_eq!(error_field(&fields, b'M'), Some("client_login_timeout"));
    assert!(started.elapsed() < Duration::from_secs(3));
}

#[tokio::test]
async fn connect_query_runs_once_on_each_new_server() {
    let cluster = app_cluster(ServerAuth::Trust);
    cluster
        .psql(
            "postgres",
            "create table connect_log(pid int); grant insert, select on connect_log to public",
        )
        .unwrap();
    let sluice = ConfigBuilder::new()
        .database_on(
            &cluster,
            "postgres",
            "connect_query='insert into connect_log select pg_backend_pid()'",
        )
        .set("pool_mode", "transaction")
        .set("default_pool_size", "2")
        .start();
    let first = connect_as(sluice.port(), APP_USER, "postgres").await;
    let second = connect_as(sluice.port(), APP_USER, "postgres").await;
    first.batch_execute("begin").await.unwrap();
    second.batch_execute("begin").await.unwrap();
    let mut pids = [
        scalar_text(&first, "select pg_backend_pid()").await,
        scalar_text(&second, "select pg_backend_pid()").await,
    ];
    first.batch_execute("commit").await.unwrap();
    second.batch_execute("commit").await.unwrap();
    for _ in 0..5 {
        scalar_text(&first, "select 1").await;
    }
    pids.sort();
    let logged = cluster
        .psql(
            "postgres",
            "select string_agg(pid::text, ',' order by pid::text) from connect_log",
        )
        .unwrap();
    assert_eq!(logged, pids.join(","), "one connect_query per server");
}

#[tokio::test]
async fn client_idle_timeout_also_ends_a_listening_client() {
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = transaction_pool(&cluster, "1")
        .set("client_idle_timeout", "1")
        .start();
    let mut listening = connect_tracked(sluice.port(), APP_USER, "", "postgres")
        .await
        .unwrap();
    listening
        .client
        .batch_execute("LISTEN quiet")
        .await
        .unwrap();
    let (code, message) = ending(listening.ended(Duration::from_secs(5)).await);
    assert_eq!(
        (code.as_str(), message.as_str()),
        ("08P01", "client_idle_timeout")
    );
}

/// autodb_idle_timeout: a pool made from the `*` entry is freed once unused
/// that long (its servers close); one in use stays, and a listed database's
/// pool is never freed.
#[tokio::test]
async fn autodb_idle_timeout_frees_unused_pools_of_the_star_entry() {
    let cluster = app_cluster(ServerAuth::Trust);
    cluster
        .psql("postgres", "create database other")
        .expect("create database");
    let sluice = ConfigBuilder::new()
        .database(
            "*",
            &format!("host={} port={}", cluster.host(), cluster.port()),
        )
        .database_on(&cluster, "listed", "dbname=postgres")
        .set("autodb_idle_timeout", "1")
        .set("admin_users", "admin")
        .start();
    let port = sluice.port();
    let pools = || async move {
        let console = connect_as(port, "admin", "pgbouncer").await;
        column(&console, "SHOW POOLS", "database").await
    };
    let held = connect_as(port, APP_USER, "postgres").await;
    assert_eq!(scalar_text(&held, "select 1").await, "1");
    for db in ["other", "listed"] {
        let c = connect_as(port, APP_USER, db).await;
        assert_eq!(scalar_text(&c, "select 1").await, "1");
    }
    let freed = eventually(Duration::from_secs(10), || async {
        let now = pools().await;
        (!now.iter().any(|d| d == "other")).then_some(now)
    })
    .await
    .expect("the unused pool of `other` is freed");
    assert!(freed.iter().any(|d| d == "postgres"), "in use: {freed:?}");
    assert!(freed.iter().any(|d| d == "listed"), "listed: {freed:?}");
    assert_eq!(scalar_text(&held, "select 2").await, "2");
    assert!(
        sluice.log().contains("autodb_idle_timeout"),
        "{}",
        sluice.log()
    );
}

/// application_name_add_host: the client's address and port follow its
/// application_name on the server, as PgBouncer writes them.
#[tokio::test]
async fn application_name_add_host_appends_the_client_address() {
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = ConfigBuilder::for_cluster(&cluster)
        .set("application_name_add_host", "1")
        .start();
    let mut config = tokio_postgres::Config::new();
    config
        .host("127.0.0.1")
        .port(sluice.port())
        .user(APP_USER)
        .dbname("postgres")
        .application_name("myapp");
    let client = connect_config(&config).await.expect("login");
    let name = scalar_text(&client, "select current_setting('application_name')").await;
    assert!(
        name.starts_with("myapp - 127.0.0.1:")
            && name["myapp - 127.0.0.1:".len()..].parse::<u16>().is_ok(),
        "{name}"
    );
}

/// log_stats: the periodic stats line, every stats_period.
#[tokio::test]
async fn log_stats_writes_the_periodic_line() {
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = ConfigBuilder::for_cluster(&cluster)
        .set("stats_period", "1")
        .start();
    let client = connect_as(sluice.port(), APP_USER, "postgres").await;
    assert_eq!(scalar_text(&client, "select 1").await, "1");
    let line = eventually(Duration::from_secs(10), || async {
        sluice
            .log()
            .lines()
            .find(|l| l.contains("stats: ") && l.contains(" xacts/s, ") && l.contains(" wait "))
            .map(str::to_owned)
    })
    .await;
    assert!(line.is_some(), "{}", sluice.log());
    let quiet = ConfigBuilder::for_cluster(&cluster)
        .set("stats_period", "1")
        .set("log_stats", "0")
        .start();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(!quiet.log().contains("xacts/s"), "{}", quiet.log());
}

/// query_timeout: a request the server has not answered within it ends the
/// client with PgBouncer's error (and its server, mid-query, is closed);
/// shorter queries and other clients are untouched.
#[tokio::test]
async fn query_timeout_ends_a_client_whose_query_runs_too_long() {
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = ConfigBuilder::for_cluster(&cluster)
        .set("pool_mode", "transaction")
        .set("query_timeout", "1")
        .start();
    let other = connect_as(sluice.port(), APP_USER, "postgres").await;
    let slow = connect_as(sluice.port(), APP_USER, "postgres").await;
    assert_eq!(
        scalar_text(&slow, "select pg_sleep(0.3)::text").await,
        "",
        "a query shorter than query_timeout"
    );
    let started = Instant::now();
    let error = slow
        .simple_query("select pg_sleep(5)")
        .await
        .expect_err("query_timeout ends it");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    let db = error.as_db_error().expect("an ErrorResponse");
    assert_eq!(db.code().code(), "08P01");
    assert_eq!(db.message(), "query timeout");
    assert_eq!(scalar_text(&other, "select 7").await, "7");
}

/// query_timeout also times an Execute sent with no Sync, flushed or not:
/// it runs with no ReadyForQuery owed (the clock never ran: the query ran
/// on for as long as it liked). Each Execute is timed on its own (five
/// short ones flushed at once were once timed as one), and an answered
/// one is not timed while the client takes its time to send the Sync.
#[tokio::test]
async fn query_timeout_times_an_execute_flushed_without_a_sync() {
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = ConfigBuilder::for_cluster(&cluster)
        .set("pool_mode", "transaction")
        .set("query_timeout", "1")
        .start();
    let mut quick = RawClient::logged_in(sluice.port(), APP_USER, "postgres").await;
    quick
        .send(&execute_message("select 1", b'H'))
        .await
        .expect("send");
    for tag in [b'1', b'2', b'D', b'C'] {
        match quick.read_message(Duration::from_secs(5)).await {
            RawReply::Message(t, _) => assert_eq!(t, tag),
            other => panic!("the quick Execute's answer: {other:?}"),
        }
    }
    tokio::time::sleep(Duration::from_millis(2500)).await;
    quick.send(&[b'S', 0, 0, 0, 4]).await.expect("Sync");
    match quick.read_message(Duration::from_secs(5)).await {
        RawReply::Message(b'Z', _) => {}
        other => panic!("an answered Execute was timed after all: {other:?}"),
    }
    let mut pipelined = Vec::new();
    for _ in 0..5 {
        pipelined.extend(execute_message("select pg_sleep(0.4)", b'H'));
    }
    quick.send(&pipelined).await.expect("send");
    let mut done = 0;
    while done < 5 {
        match quick.read_message(Duration::from_secs(5)).await {
            RawReply::Message(b'C', _) => done += 1,
            RawReply::Message(b'1' | b'2' | b'D' | b'N', _) => {}
            other => panic!("five short Executes flushed at once, {done} answered: {other:?}"),
        }
    }
    quick.send(&[b'S', 0, 0, 0, 4]).await.expect("Sync");
    match quick.read_message(Duration::from_secs(5)).await {
        RawReply::Message(b'Z', _) => {}
        other => panic!("{other:?}"),
    }
    // An Execute neither flushed nor synced is timed too (PgBouncer times
    // a request from its first message).
    let mut unflushed = RawClient::logged_in(sluice.port(), APP_USER, "postgres").await;
    let mut execute_only = execute_message("select pg_sleep(8)", b'H');
    execute_only.truncate(execute_only.len() - 5);
    unflushed.send(&execute_only).await.expect("send");
    let fields = unflushed
        .expect_error_or_close(Duration::from_secs(5))
        .await
        .expect("an ErrorResponse before the close");
    assert_eq!(error_field(&fields, b'M'), Some("query timeout"));
    let mut slow = RawClient::logged_in(sluice.port(), APP_USER, "postgres").await;
    let started = Instant::now();
    slow.send(&execute_message("select pg_sleep(8)", b'H'))
        .await
        .expect("send");
    let fields = loop {
        match slow.read_message(Duration::from_secs(6)).await {
            RawReply::Message(b'E', body) => break error_fields(&body),
            RawReply::Message(b'1' | b'2' | b'N', _) => {}
            other => panic!("query_timeout never ended the flushed Execute: {other:?}"),
        }
    };
    assert_eq!(error_field(&fields, b'M'), Some("query timeout"));
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    let admin = superuser_connect(&cluster, "postgres").await;
    let deadline = Instant::now() + Duration::from_secs(5);
    while scalar_text(
        &admin,
        "select count(*)::text from pg_stat_activity where query = 'select pg_sleep(8)' \
         and state = 'active'",
    )
    .await
        != "0"
    {
        assert!(Instant::now() < deadline, "the timed-out query still runs");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// query_timeout times each request, not a busy stretch: queries pipelined
/// back to back, each shorter than it, all succeed although together they
/// take longer; and it applies in session mode too, as in PgBouncer.
#[tokio::test]
async fn query_timeout_times_each_request_in_every_mode() {
    let cluster = app_cluster(ServerAuth::Trust);
    for mode in ["transaction", "session"] {
        let sluice = ConfigBuilder::for_cluster(&cluster)
            .set("pool_mode", mode)
            .set("query_timeout", "1")
            .start();
        let client = connect_as(sluice.port(), APP_USER, "postgres").await;
        let pipelined = (0..5).map(|_| client.query_one("select pg_sleep(0.4)::text", &[]));
        for result in futures_util::future::join_all(pipelined).await {
            result.unwrap_or_else(|e| panic!("{mode}: a 0.4 s query in a 2 s pipeline: {e}"));
        }
        let error = client
            .simple_query("select pg_sleep(5)")
            .await
            .expect_err("query_timeout ends it");
        let db = error.as_db_error().expect("an ErrorResponse");
        assert_eq!(db.message(), "query timeout", "{mode}");
    }
}
