//! Connection limits: pool sizes under concurrency, max_client_conn,
//! max_db_connections across users' pools, max_user_connections across
//! databases, min_pool_size pre-opening servers, and the reserve pool
//! kicking in after reserve_pool_timeout.

use std::time::{Duration, Instant};

use futures_util::future::join_all;
use sluice_tests::*;
use tokio_postgres::Client;

const OTHER_USER: &str = "app2";

/// Opens a client and makes it hold a server: in session mode any query
/// does, in transaction mode an open transaction does.
async fn holding_client(port: u16, user: &str, db: &str) -> Client {
    let client = connect_as(port, user, db).await;
    tokio::time::timeout(
        Duration::from_secs(10),
        client.batch_execute("begin; select 1"),
    )
    .await
    .unwrap_or_else(|_| panic!("{user}@{db} got no server within 10 s"))
    .unwrap_or_else(|e| panic!("{user}@{db} failed to start a transaction: {e:?}"));
    client
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_pool_size_caps_servers_under_concurrency() {
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = ConfigBuilder::for_cluster(&cluster)
        .set("pool_mode", "transaction")
        .set("default_pool_size", "3")
        .start();
    let port = sluice.port();
    let workers = (0..20).map(|_| {
        tokio::spawn(async move {
            let mut client = connect_as(port, APP_USER, "postgres").await;
            for _ in 0..3 {
                let tx = client.transaction().await?;
                tx.batch_execute("select pg_sleep(0.05)").await?;
                tx.commit().await?;
            }
            Ok::<(), tokio_postgres::Error>(())
        })
    });
    let workers = tokio::spawn(join_all(workers));
    let mut most = 0;
    while !workers.is_finished() {
        most = most.max(count_backends(&cluster, "postgres").await);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for result in workers.await.unwrap() {
        result
            .expect("worker panicked")
            .expect("every client succeeds");
    }
    assert!(most <= 3, "{most} server backends with default_pool_size=3");
    assert!(most >= 1, "the sampler never saw a server");
}

#[tokio::test]
async fn max_client_conn_refuses_the_extra_client() {
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = ConfigBuilder::for_cluster(&cluster)
        .set("max_client_conn", "2")
        .set("admin_users", "admin")
        .start();
    let first = connect_as(sluice.port(), APP_USER, "postgres").await;
    let _second = connect_as(sluice.port(), APP_USER, "postgres").await;
    let error = expect_sqlstate(
        connect(sluice.port(), APP_USER, "", "postgres").await,
        "53300",
    );
    assert_eq!(
        error.as_db_error().unwrap().message(),
        "no more connections allowed (max_client_conn)"
    );
    // The console is exempt, as PgBouncer's: an operator gets in to look.
    let admin = connect_as(sluice.port(), "admin", "pgbouncer").await;
    assert!(
        admin.simple_query("SHOW POOLS").await.is_ok(),
        "the console answers while the pooler is full"
    );
    drop(admin);
    drop(first);
    let port = sluice.port();
    let readmitted = eventually(Duration::from_secs(5), || async move {
        connect(port, APP_USER, "", "postgres").await.ok()
    })
    .await;
    assert!(
        readmitted.is_some(),
        "a slot must free up when a client leaves"
    );
}

/// Past max_client_conn the console still lets operators in, but only a
/// few logins at a time: connections that never answer the password
/// request took descriptors without bound (a review held 150).
#[tokio::test]
async fn console_logins_past_max_client_conn_are_bounded() {
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = ConfigBuilder::for_cluster(&cluster)
        .set("max_client_conn", "1")
        .set("auth_type", "md5")
        .set("admin_users", "admin")
        .userlist(&[(APP_USER, APP_PASSWORD), ("admin", "admin-pw")])
        .start();
    let _full = connect(sluice.port(), APP_USER, APP_PASSWORD, "postgres")
        .await
        .expect("the one client");
    let mut held = Vec::new();
    for _ in 0..16 {
        let mut raw = RawClient::connect(sluice.port()).await;
        raw.startup("admin", "pgbouncer").await;
        match raw.read_message(Duration::from_secs(10)).await {
            RawReply::Message(b'R', _) => held.push(raw),
            other => panic!("no password request: {other:?}"),
        }
    }
    let mut extra = RawClient::connect(sluice.port()).await;
    extra.startup("admin", "pgbouncer").await;
    match extra.read_message(Duration::from_secs(10)).await {
        RawReply::Message(b'E', body) => {
            let fields = error_fields(&body);
            assert_eq!(error_field(&fields, b'C'), Some("53300"), "{fields:?}");
        }
        other => panic!("a 17th console login in progress was let in: {other:?}"),
    }
    drop(held);
    let port = sluice.port();
    let admin = eventually(Duration::from_secs(5), || async move {
        connect(port, "admin", "admin-pw", "pgbouncer").await.ok()
    })
    .await
    .expect("an operator gets in once the logins in progress are gone");
    assert!(admin.simple_query("SHOW POOLS").await.is_ok());
}

#[tokio::test]
async fn max_db_connections_spans_the_pools_of_all_users() {
    let cluster = app_cluster_with(ServerAuth::Trust, |b| b.user(OTHER_USER, "x"));
    let sluice = ConfigBuilder::for_cluster(&cluster)
        .set("pool_mode", "session")
        .set("default_pool_size", "5")
        .set("max_db_connections", "2")
        .start();
    let port = sluice.port();
    let first = holding_client(port, APP_USER, "postgres").await;
    let _other = holding_client(port, OTHER_USER, "postgres").await;

    let waiting = connect_as(port, OTHER_USER, "postgres").await;
    let waiting = spawn_query(waiting, "select current_user");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        !waiting.is_finished(),
        "a third server was handed out beyond max_db_connections=2"
    );
    assert!(count_backends(&cluster, "postgres").await <= 2);

    drop(first);
    let (_client, result) = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the waiting client gets a server once another user's client leaves")
        .unwrap();
    result.expect("query after waiting");
    assert!(count_backends(&cluster, "postgres").await <= 2);
}

#[tokio::test]
async fn max_user_connections_spans_databases() {
    let cluster = app_cluster_with(ServerAuth::Trust, |b| b.user(OTHER_USER, "x"));
    let target = format!("host=127.0.0.1 port={} dbname=postgres", cluster.port());
    let sluice = ConfigBuilder::new()
        .database("one", &target)
        .database("two", &target)
        .set("pool_mode", "session")
        .set("default_pool_size", "5")
        .set("max_user_connections", "2")
        .start();
    let port = sluice.port();
    let first = holding_client(port, APP_USER, "one").await;
    let _second = holding_client(port, APP_USER, "two").await;

    // Waits on the other database's pool: only closing the idle server left
    // in pool "one" can make room.
    let waiting = spawn_query(connect_as(port, APP_USER, "two").await, "select 1");
    // Another user is not limited by app's count.
    let _unaffected = holding_client(port, OTHER_USER, "one").await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        !waiting.is_finished(),
        "a third server was opened for {APP_USER} beyond max_user_connections=2"
    );

    drop(first);
    let (_client, result) = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the waiting client gets a server once the user's other client leaves")
        .unwrap();
    result.expect("query after waiting");
}

/// PgBouncer >= 1.21 keeps min_pool_size servers for forced-user databases
/// even before any client connects.
#[tokio::test]
async fn min_pool_size_opens_servers_without_clients() {
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = ConfigBuilder::new()
        .database_on(
            &cluster,
            "postgres",
            &format!("user={APP_USER} min_pool_size=3"),
        )
        .set("default_pool_size", "5")
        .start();
    let seen = wait_for_backends(&cluster, "postgres", Duration::from_secs(8), |n| n == 3).await;
    assert_eq!(seen, Ok(3), "min_pool_size=3 with no client connected");
    // And the pool uses them.
    let client = connect_as(sluice.port(), "anyone", "postgres").await;
    assert_eq!(scalar_text(&client, "select current_user").await, APP_USER);
    assert_eq!(count_backends(&cluster, "postgres").await, 3);
}

#[tokio::test]
async fn min_pool_size_fills_a_pool_that_has_a_client() {
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = ConfigBuilder::for_cluster(&cluster)
        .set("pool_mode", "transaction")
        .set("default_pool_size", "5")
        .set("min_pool_size", "3")
        .start();
    let client = connect_as(sluice.port(), APP_USER, "postgres").await;
    scalar_text(&client, "select 1").await;
    let seen = wait_for_backends(&cluster, "postgres", Duration::from_secs(8), |n| n == 3).await;
    assert_eq!(seen, Ok(3), "min_pool_size=3 with one idle client");
}

#[tokio::test]
async fn reserve_pool_serves_a_client_after_reserve_pool_timeout() {
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = ConfigBuilder::for_cluster(&cluster)
        .set("pool_mode", "transaction")
        .set("default_pool_size", "1")
        .set("reserve_pool_size", "1")
        .set("reserve_pool_timeout", "0.5")
        .start();
    let port = sluice.port();
    let _first = holding_client(port, APP_USER, "postgres").await;

    let started = Instant::now();
    let _second = holding_client(port, APP_USER, "postgres").await;
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(400),
        "the reserve was used after {waited:?}, before reserve_pool_timeout=0.5"
    );
    assert_eq!(count_backends(&cluster, "postgres").await, 2);

    // Pool and reserve are both busy now: a third transaction waits.
    let third = spawn_query(connect_as(port, APP_USER, "postgres").await, "select 1");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!third.is_finished(), "a third server beyond pool + reserve");
    assert_eq!(count_backends(&cluster, "postgres").await, 2);
}

#[tokio::test]
async fn client_budgets_per_database_and_per_user_are_enforced() {
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = ConfigBuilder::for_cluster(&cluster)
        .set("pool_mode", "transaction")
        .set("max_db_client_connections", "2")
        .start();
    let p = sluice.port();
    let a = connect(p, APP_USER, APP_PASSWORD, "postgres")
        .await
        .unwrap();
    let b = connect(p, APP_USER, APP_PASSWORD, "postgres")
        .await
        .unwrap();
    let refused = expect_sqlstate(
        connect(p, APP_USER, APP_PASSWORD, "postgres").await,
        "53300",
    );
    let message = refused
        .as_db_error()
        .map(|e| e.message().to_owned())
        .unwrap_or_default();
    assert!(message.contains("max_db_client_connections"), "{message}");
    drop(a);
    // The budget comes back when a client leaves.
    let mut again = None;
    for _ in 0..50 {
        if let Ok(c) = connect(p, APP_USER, APP_PASSWORD, "postgres").await {
            again = Some(c);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(again.is_some(), "the freed slot was not given back");
    drop(b);

    let per_user = ConfigBuilder::for_cluster(&cluster)
        .set("pool_mode", "transaction")
        .set("max_user_client_connections", "1")
        .start();
    let _one = connect(per_user.port(), APP_USER, APP_PASSWORD, "postgres")
        .await
        .unwrap();
    let refused = expect_sqlstate(
        connect(per_user.port(), APP_USER, APP_PASSWORD, "postgres").await,
        "53300",
    );
    let message = refused
        .as_db_error()
        .map(|e| e.message().to_owned())
        .unwrap_or_default();
    assert!(message.contains("max_user_client_connections"), "{message}");
    // Another user is not counted against this one.
    connect(per_user.port(), "postgres", "postgres", "postgres")
        .await
        .expect("another user gets in");
}

#[tokio::test]
async fn tcp_keepalive_is_set_on_server_connections() {
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = ConfigBuilder::for_cluster(&cluster)
        .set("pool_mode", "transaction")
        .set("tcp_keepalive", "1")
        .set("tcp_keepidle", "77")
        .start();
    let c = connect(sluice.port(), APP_USER, APP_PASSWORD, "postgres")
        .await
        .unwrap();
    c.simple_query("select 1").await.unwrap();
    let out = std::process::Command::new("ss")
        .args([
            "-tnoH",
            "state",
            "established",
            "dport",
            "=",
            &format!(":{}", cluster.port()),
        ])
        .output()
        .expect("ss (iproute2) runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("timer:(keepalive"),
        "sluice's server sockets have no keepalive timer:\n{text}"
    );
}

/// Out of file descriptors: the client past the process's limit is told
/// so at once (53300, not a hang in the accept backlog), the others are
/// served on, and logins work again once descriptors are free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_past_the_descriptor_limit_gets_an_error_not_a_hang() {
    let cluster = app_cluster(ServerAuth::Trust);
    let scratch = ScratchDir::create();
    let port = sluice_testkit::free_port().expect("port");
    let ini = scratch.path().join("fds.ini");
    let text = ConfigBuilder::for_cluster(&cluster)
        .set("pool_mode", "transaction")
        .set("default_pool_size", "10")
        .set("max_client_conn", "1000")
        .render()
        .replace("@PORT@", &port.to_string());
    std::fs::write(&ini, text).expect("write ini");
    let log = std::fs::File::create(scratch.path().join("sluice.log")).expect("log");
    let child = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!(
            "ulimit -n 64 && exec {} {}",
            sluice_binary().display(),
            ini.display()
        ))
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .expect("start sluice under ulimit -n 64");
    // Killed however the test ends (a failed assertion included).
    let mut child = KillOnDrop(child);
    let logs = || std::fs::read_to_string(scratch.path().join("sluice.log")).unwrap_or_default();
    eventually(Duration::from_secs(10), || async {
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()
    })
    .await
    .unwrap_or_else(|| panic!("sluice did not listen:\n{}", logs()));

    let first = connect_as(port, APP_USER, "postgres").await;
    first
        .batch_execute("select 1")
        .await
        .expect("a first client");
    let mut held = Vec::new();
    let mut refused = None;
    for _ in 0..80 {
        let attempt = tokio::time::timeout(
            Duration::from_secs(5),
            connect(port, APP_USER, "", "postgres"),
        )
        .await
        .unwrap_or_else(|_| {
            panic!(
                "a login past the limit must end within 5 s, not hang:\n{}",
                logs().lines().rev().take(12).collect::<Vec<_>>().join("\n")
            )
        });
        match attempt {
            Ok(c) => held.push(c),
            Err(e) => {
                refused = Some(e);
                break;
            }
        }
    }
    let error = refused.unwrap_or_else(|| panic!("80 clients under ulimit -n 64:\n{}", logs()));
    assert_eq!(sqlstate(&error), Some("53300"), "{error:?}");
    assert!(
        error
            .as_db_error()
            .is_some_and(|d| d.message().contains("out of file descriptors")),
        "{error:?}"
    );
    // Still serving the clients it has, even those whose transaction
    // would need a new server: they wait for one in use instead of failing.
    first
        .batch_execute("select 2")
        .await
        .expect("served on past the limit");
    let busy = held
        .iter()
        .take(8)
        .map(|c| c.simple_query("select pg_sleep(0.2)"));
    for (i, r) in join_all(busy).await.into_iter().enumerate() {
        r.unwrap_or_else(|e| panic!("held client {i} failed at the limit: {e:?}\n{}", logs()));
    }
    drop(held);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let again = eventually(Duration::from_secs(5), || async {
        connect(port, APP_USER, "", "postgres").await.ok()
    })
    .await
    .expect("logins work again once descriptors are free");
    again.batch_execute("select 3").await.expect("query");
    assert!(child.0.try_wait().expect("wait").is_none(), "sluice exited");
    assert!(logs().contains("refusing new clients until descriptors free up"));
}

/// A child process killed when dropped.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Backends running `pg_sleep(30)` on `cluster`.
async fn sleepers(cluster: &Cluster) -> i64 {
    let admin = superuser_connect(cluster, "postgres").await;
    admin
        .query_one(
            "select count(*) from pg_stat_activity \
             where query = 'select pg_sleep(30)' and pid <> pg_backend_pid()",
            &[],
        )
        .await
        .expect("pg_stat_activity")
        .get(0)
}

/// A client that leaves (or is killed, or times out) in the middle of a
/// query takes its query with it: the server is closed after a cancel.
/// Closed alone, it ran the query to its end outside the pool's count, so
/// a client that starts long queries and leaves, again and again, took
/// PostgreSQL's connections past pool_size (and max_connections: every
/// other client refused).
#[tokio::test]
async fn a_client_that_leaves_mid_query_takes_its_query_with_it() {
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = ConfigBuilder::for_cluster(&cluster)
        .set("pool_mode", "transaction")
        .set("default_pool_size", "2")
        .start();
    // Simple Query, and an Execute with a Flush and no Sync (nothing owed
    // up to a ReadyForQuery yet: a review found it left uncancelled).
    let extended = execute_message("select pg_sleep(30)", b'H');
    let simple = query_message("select pg_sleep(30)");
    for request in [&simple, &extended, &simple, &extended] {
        let mut raw = RawClient::logged_in(sluice.port(), APP_USER, "postgres").await;
        raw.send(request).await.expect("send");
        let deadline = Instant::now() + Duration::from_secs(10);
        while sleepers(&cluster).await == 0 {
            assert!(Instant::now() < deadline, "the query never ran");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        drop(raw);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = sleepers(&cluster).await;
        if left == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{left} queries of clients that left still run on the server"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The pool serves the next client.
    let next = connect_as(sluice.port(), APP_USER, "postgres").await;
    assert_eq!(scalar_text(&next, "select 'next'").await, "next");
}
