//! Robustness: a client that dies mid-transaction leaves nothing behind for
//! the next client of its server; garbage, oversized, old-protocol and
//! truncated startup packets are refused without hurting anyone else;
//! SSLRequest is declined; PostgreSQL restarts and outages are survived.

use std::io::{BufRead, BufReader, Write};
use std::sync::mpsc;
use std::time::Duration;

use sluice_tests::*;
use tokio_postgres::Client;

/// What the next client of a server must see after a previous client died
/// inside a transaction that created `leftover` and changed work_mem.
async fn assert_clean_server(client: &Client, default_work_mem: &str, old_now: &str) {
    assert_eq!(
        scalar(client, "select txid_current_if_assigned()::text").await,
        None,
        "no transaction may be left open"
    );
    assert_eq!(
        scalar(client, "select to_regclass('leftover')::text").await,
        None
    );
    assert_eq!(scalar_text(client, "show work_mem").await, default_work_mem);
    assert_eq!(scalar_text(client, "show application_name").await, "");
    assert_ne!(scalar_text(client, "select now()::text").await, old_now);
}

#[tokio::test]
async fn client_killed_mid_transaction_leaves_no_trace_transaction_mode() {
    let cluster = app_cluster(ServerAuth::Trust);
    let default_work_mem = cluster.psql("postgres", "show work_mem").unwrap();
    let sluice = ConfigBuilder::for_cluster(&cluster)
        .set("pool_mode", "transaction")
        .set("default_pool_size", "1")
        .set("query_wait_timeout", "5")
        .start();
    let victim = connect_tracked(sluice.port(), APP_USER, "", "postgres")
        .await
        .unwrap();
    victim
        .client
        .batch_execute(
            "begin; set work_mem = '7MB'; set application_name = 'victim'; \
             create temp table leftover(x int); insert into leftover values (1)",
        )
        .await
        .unwrap();
    let old_now = scalar_text(&victim.client, "select now()::text").await;
    // Kill: the socket goes away without a Terminate message.
    victim.connection.abort();
    drop(victim.client);

    let next = connect_as(sluice.port(), APP_USER, "postgres").await;
    tokio::time::timeout(
        Duration::from_secs(10),
        assert_clean_server(&next, &default_work_mem, &old_now),
    )
    .await
    .expect("the next client gets a clean server in time");
}

/// An interactive psql that ran `sql` and then printed `ready`; also
/// returns the lines it printed before that.
fn psql_inside_transaction(port: u16, sql: &str) -> (std::process::Child, Vec<String>) {
    let mut child = psql_interactive(port, APP_USER, "", "postgres");
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "{sql}\nselect 'ready';").unwrap();
    stdin.flush().unwrap();
    // Keep stdin open (psql waits for more input) by leaking it into a thread.
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(120));
        drop(stdin);
    });
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let mut printed = Vec::new();
    loop {
        match rx.recv_timeout(Duration::from_secs(15)) {
            Ok(line) if line.trim() == "ready" => return (child, printed),
            Ok(line) => printed.push(line.trim().to_owned()),
            Err(_) => {
                let _ = child.kill();
                let output = child.wait_with_output().unwrap();
                panic!(
                    "psql never got ready: {}",
                    String::from_utf8_lossy(&output.stderr)
                );
            }
        }
    }
}

#[tokio::test]
async fn psql_killed_mid_transaction_leaves_no_trace_session_mode() {
    let cluster = app_cluster(ServerAuth::Trust);
    let default_work_mem = cluster.psql("postgres", "show work_mem").unwrap();
    let sluice = ConfigBuilder::for_cluster(&cluster)
        .set("pool_mode", "session")
        .set("default_pool_size", "1")
        .set("query_wait_timeout", "5")
        .start();
    let port = sluice.port();
    let (mut psql_child, printed) = tokio::task::spawn_blocking(move || {
        psql_inside_transaction(
            port,
            "begin; set work_mem = '7MB'; set application_name = 'victim'; \
             create temp table leftover(x int); select now()::text;",
        )
    })
    .await
    .unwrap();
    let old_now = printed.last().cloned().expect("psql printed now()");
    assert_eq!(count_backends(&cluster, "postgres").await, 1);
    psql_child.kill().expect("kill psql");
    psql_child.wait().unwrap();

    let next = connect_as(port, APP_USER, "postgres").await;
    tokio::time::timeout(
        Duration::from_secs(10),
        assert_clean_server(&next, &default_work_mem, &old_now),
    )
    .await
    .expect("the next client gets a clean server in time");
}

/// Sends `packet` as a new connection's first bytes (then half-closes when
/// `then_eof`), and expects an 08P01 ErrorResponse or a close, promptly.
async fn assert_refused(port: u16, what: &str, packet: &[u8], then_eof: bool, codes: &[&str]) {
    let mut raw = RawClient::connect(port).await;
    let _ = raw.send(packet).await;
    if then_eof {
        raw.shutdown_write().await;
    }
    match raw.expect_error_or_close(Duration::from_secs(3)).await {
        None => {}
        Some(fields) => {
            let code = error_field(&fields, b'C').unwrap_or("");
            assert!(codes.contains(&code), "{what}: unexpected error {fields:?}");
            // After the error, the connection is closed.
            assert_eq!(
                raw.read_message(Duration::from_secs(3)).await,
                RawReply::Closed,
                "{what}: connection left open after the error"
            );
        }
    }
}

#[tokio::test]
async fn startup_garbage_is_refused_and_others_keep_working() {
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = ConfigBuilder::for_cluster(&cluster).start();
    let port = sluice.port();
    let survivor = connect_as(port, APP_USER, "postgres").await;

    let mut noise = vec![0xde, 0xad, 0xbe, 0xef];
    let mut state: u32 = 12345;
    for _ in 0..200 {
        state = state.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        noise.push(state.to_be_bytes()[0]);
    }
    assert_refused(port, "random bytes", &noise, false, &["08P01"]).await;

    let mut huge = 0x7fff_fff0_i32.to_be_bytes().to_vec();
    huge.extend_from_slice(&196_608_i32.to_be_bytes());
    huge.extend_from_slice(b"user\0app\0");
    assert_refused(port, "huge length", &huge, false, &["08P01"]).await;

    let mut tiny = 4_i32.to_be_bytes().to_vec();
    tiny.extend_from_slice(&[0; 4]);
    assert_refused(port, "length below minimum", &tiny, false, &["08P01"]).await;

    let mut v2 = 0x0002_0000_i32.to_be_bytes().to_vec();
    v2.extend_from_slice(&[0u8; 288]); // database, user, options, unused, tty
    v2[4..7].copy_from_slice(b"app");
    assert_refused(
        port,
        "protocol 2.0",
        &length_prefixed(&v2),
        false,
        &["08P01", "0A000"],
    )
    .await;

    let full = startup_packet(&[("user", APP_USER), ("database", "postgres")]);
    assert_refused(
        port,
        "truncated packet",
        &full[..full.len() - 6],
        true,
        &["08P01"],
    )
    .await;

    let mut unknown_version = 0x0009_0009_i32.to_be_bytes().to_vec();
    unknown_version.extend_from_slice(b"user\0app\0\0");
    assert_refused(
        port,
        "unknown protocol version",
        &length_prefixed(&unknown_version),
        false,
        &["08P01", "0A000"],
    )
    .await;

    assert_eq!(scalar_text(&survivor, "select 'alive'").await, "alive");
    let fresh = connect_as(port, APP_USER, "postgres").await;
    assert_eq!(scalar_text(&fresh, "select 1").await, "1");
}

#[tokio::test]
async fn ssl_request_is_declined_then_plain_startup_works() {
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = ConfigBuilder::for_cluster(&cluster).start();
    let mut raw = RawClient::connect(sluice.port()).await;
    raw.send(&ssl_request()).await.unwrap();
    assert_eq!(
        raw.read_byte(Duration::from_secs(5)).await,
        RawReply::Message(b'N', Vec::new())
    );
    raw.startup(APP_USER, "postgres").await;
    raw.read_until_ready(Duration::from_secs(10)).await;
    let rows = raw
        .simple_query("select 40 + 2", Duration::from_secs(10))
        .await;
    assert_eq!(rows, [Some("42".to_owned())]);
}

async fn query_succeeds(client: &Client) -> bool {
    client.simple_query("select 1").await.is_ok()
}

fn restartable(cluster: &Cluster) -> SluiceProcess {
    ConfigBuilder::for_cluster(cluster)
        .set("pool_mode", "transaction")
        .set("default_pool_size", "2")
        .set("server_login_retry", "0.5")
        .set("query_wait_timeout", "5")
        .start()
}

#[tokio::test]
async fn new_clients_work_again_after_a_postgres_restart() {
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = restartable(&cluster);
    let port = sluice.port();
    let client = connect_as(port, APP_USER, "postgres").await;
    let before = scalar_text(&client, "select pg_backend_pid()").await;
    cluster.restart().expect("restart PostgreSQL");

    let pid = eventually(Duration::from_secs(15), || async {
        let client = connect(port, APP_USER, "", "postgres").await.ok()?;
        let messages = client.simple_query("select pg_backend_pid()").await.ok()?;
        messages.iter().find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
            _ => None,
        })
    })
    .await
    .expect("no new client could run a query within 15 s of the restart");
    assert_ne!(
        pid, before,
        "a server from before the restart cannot be alive"
    );
    let fresh = connect_as(port, APP_USER, "postgres").await;
    let mut tx_client = fresh;
    let tx = tx_client.transaction().await.expect("begin after restart");
    tx.batch_execute("select 1").await.unwrap();
    tx.commit().await.expect("commit after restart");
}

/// PgBouncer notices idle servers that PostgreSQL closed (it watches their
/// sockets), so a transaction-mode client idle between transactions does
/// not notice the restart.
#[tokio::test]
async fn idle_transaction_mode_client_survives_a_postgres_restart() {
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = restartable(&cluster);
    let client = connect_as(sluice.port(), APP_USER, "postgres").await;
    let before = scalar_text(&client, "select pg_backend_pid()").await;
    cluster.restart().expect("restart PostgreSQL");
    tokio::time::sleep(Duration::from_millis(300)).await;

    let recovered = eventually(Duration::from_secs(10), || async {
        match client.simple_query("select pg_backend_pid()").await {
            Ok(messages) => messages.iter().find_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
                _ => None,
            }),
            Err(e) if e.is_closed() => panic!("sluice closed the idle client: {e:?}"),
            Err(_) => None,
        }
    })
    .await;
    let pid = recovered.expect("the client never got a working server again");
    assert_ne!(pid, before);
}

#[tokio::test]
async fn postgres_outage_gives_errors_not_hangs() {
    let cluster = app_cluster(ServerAuth::Trust);
    let mut sluice = ConfigBuilder::for_cluster(&cluster)
        .set("pool_mode", "transaction")
        .set("server_login_retry", "0.5")
        .set("server_connect_timeout", "2")
        .set("query_wait_timeout", "5")
        .start();
    let port = sluice.port();
    cluster.stop().expect("stop PostgreSQL");

    for attempt in 0..3 {
        let outcome = tokio::time::timeout(Duration::from_secs(10), async {
            let client = connect(port, APP_USER, "", "postgres").await?;
            client.simple_query("select 1").await.map(drop)
        })
        .await
        .unwrap_or_else(|_| panic!("attempt {attempt}: the client hangs while PostgreSQL is down"));
        assert!(
            outcome.is_err(),
            "attempt {attempt}: a query succeeded with PostgreSQL down"
        );
    }
    assert!(sluice.is_running(), "sluice died while PostgreSQL was down");

    cluster.start_again().expect("start PostgreSQL again");
    let back = eventually(Duration::from_secs(15), || async {
        let client = connect(port, APP_USER, "", "postgres").await.ok()?;
        query_succeeds(&client).await.then_some(())
    })
    .await;
    assert!(
        back.is_some(),
        "sluice never served queries again after PostgreSQL came back"
    );
}

/// A server that dies after the pool handed it out and before it answers
/// (a backend terminated while a request is on its way: a restart or a
/// switchover under load). Made deterministic with SIGSTOP: the backend
/// gets its SIGTERM while stopped, the request is sent, then SIGCONT lets
/// it die with FATAL 57P01 before reading it. A lone BEGIN (or a read)
/// runs again on another server and the client never knows; anything
/// else may have committed and gets the error.
#[tokio::test]
async fn a_request_whose_server_dies_before_answering_runs_again_only_if_safe() {
    let cluster = cluster_with_marks();
    let sluice = ConfigBuilder::for_cluster(&cluster)
        .set("pool_mode", "transaction")
        .set("default_pool_size", "1")
        .start();
    let admin = superuser_connect(&cluster, "postgres").await;
    let client = connect_as(sluice.port(), APP_USER, "postgres").await;

    // The server the next request will get, stopped with a SIGTERM pending.
    let doomed = || doom_backend_of(&client, &admin);
    let wake = wake_later;

    let pid = doomed().await;
    let woken = wake(pid);
    client
        .simple_query("begin")
        .await
        .expect("BEGIN, run again");
    commit_elsewhere(&client, pid).await;
    woken.await.expect("SIGCONT");
    assert!(
        sluice.log().contains("the request runs on another server"),
        "{}",
        sluice.log_tail(20)
    );

    // Pipelined behind the BEGIN: nothing after it is sent before the
    // server's first answer, so the retry loses nothing and runs nothing
    // twice.
    let pid = doomed().await;
    let woken = wake(pid);
    let (begun, inside) = tokio::join!(
        client.simple_query("begin"),
        client.simple_query("select pg_backend_pid()")
    );
    begun.expect("BEGIN, run again");
    let inside = inside
        .expect("the pipelined query")
        .iter()
        .find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_owned),
            _ => None,
        });
    assert!(inside.is_some(), "no row");
    assert_ne!(inside, Some(pid.to_string()), "ran on the dead server");
    client.simple_query("commit").await.expect("COMMIT");
    woken.await.expect("SIGCONT");

    // A write is not run again: its client gets the server's error, and
    // the row is not written twice (here: not at all).
    let pid = doomed().await;
    let woken = wake(pid);
    let err = client
        .simple_query("insert into marks values (1)")
        .await
        .expect_err("the server died under the insert");
    woken.await.expect("SIGCONT");
    assert_eq!(sqlstate(&err), Some("57P01"), "{err:?}");
    let rows = scalar_text(&admin, "select count(*) from marks").await;
    assert_eq!(rows, "0");
}

/// A backend crash restarts PostgreSQL: every other backend gets a WARNING
/// ("terminating connection because of crash of another server process")
/// and exits. A lone BEGIN whose server goes that way before answering
/// runs again once the server is back, and its client sees nothing.
#[tokio::test]
async fn a_lone_begin_outlives_a_crash_restart_of_its_server() {
    let (cluster, sluice) = one_server_pool();
    let client = connect_as(sluice.port(), APP_USER, "postgres").await;
    let pid = stop_backend_of(&client).await;
    let victim = superuser_connect(&cluster, "postgres").await;
    // (the testkit's synchronous_commit = off: what recovery must keep,
    // the app's role among it, is written out first)
    victim.simple_query("checkpoint").await.expect("checkpoint");
    let victim_pid: i32 = scalar_text(&victim, "select pg_backend_pid()")
        .await
        .parse()
        .expect("pid");
    // SAFETY: as above; the postmaster answers with a crash restart.
    assert_eq!(
        unsafe { libc::kill(victim_pid, libc::SIGKILL) },
        0,
        "SIGKILL"
    );
    let woken = wake_later(pid);
    let begun = tokio::time::timeout(Duration::from_secs(30), client.simple_query("begin"))
        .await
        .expect("BEGIN answered");
    woken.await.expect("SIGCONT");
    begun.expect("BEGIN, run again after the restart");
    commit_elsewhere(&client, pid).await;
    assert!(
        sluice.log().contains("the request runs on another server"),
        "{}",
        sluice.log_tail(20)
    );
}

/// The server a lone BEGIN gets may be dead before sluice sends the
/// request: sluice first brings the server's settings in line with the
/// client's (here its application_name), and that fails. The BEGIN runs on
/// another server all the same, once.
#[tokio::test]
async fn a_lone_begin_whose_server_dies_before_it_is_sent_runs_elsewhere() {
    let (cluster, sluice) = one_server_pool();
    let admin = superuser_connect(&cluster, "postgres").await;
    let named = |name: &str| {
        let mut config = tokio_postgres::Config::new();
        config
            .host("127.0.0.1")
            .port(sluice.port())
            .user(APP_USER)
            .dbname("postgres")
            .application_name(name);
        config
    };
    let first = connect_config(&named("first")).await.expect("first");
    let second = connect_config(&named("second")).await.expect("second");
    // The pool's one server, last used by `first`, is killed while idle.
    let woken = wake_later(doom_backend_of(&first, &admin).await);
    second
        .simple_query("begin")
        .await
        .expect("BEGIN, run elsewhere");
    woken.await.expect("SIGCONT");
    let app = scalar_text(&second, "select current_setting('application_name')").await;
    assert_eq!(app, "second");
    let open = scalar_text(
        &admin,
        &format!(
            "select count(*) from pg_stat_activity where usename = '{APP_USER}' \
             and state = 'idle in transaction'"
        ),
    )
    .await;
    assert_eq!(open, "1", "the BEGIN ran once, on the new server");
    second.simple_query("commit").await.expect("COMMIT");
}

/// On a database that routes reads, a read the router sends to the primary
/// (no replica in rotation: here its port is closed) whose server dies
/// before answering runs again on another server over the extended
/// protocol too: a prepared statement's Bind/Execute/Sync, and a driver's
/// one-off Parse/Bind/Describe/Execute/Sync. A write does not.
#[tokio::test]
async fn an_extended_read_on_the_primary_whose_server_dies_runs_again() {
    let cluster = cluster_with_marks();
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let entry = format!(
        "host={h},{h} port={p},{closed} dbname=postgres route_reads=1",
        h = cluster.host(),
        p = cluster.port()
    );
    let sluice = ConfigBuilder::new()
        .database("postgres", &entry)
        .set("pool_mode", "transaction")
        .set("default_pool_size", "1")
        .start();
    let admin = superuser_connect(&cluster, "postgres").await;
    let client = connect_as(sluice.port(), APP_USER, "postgres").await;
    let read = client
        .prepare("select pg_backend_pid()")
        .await
        .expect("prepare the read");
    let write = client
        .prepare("insert into marks values (1)")
        .await
        .expect("prepare the write");

    let pid = doom_backend_of(&client, &admin).await;
    let woken = wake_later(pid);
    let ran = client.query_one(&read, &[]).await;
    woken.await.expect("SIGCONT");
    let now: i32 = ran.expect("the prepared read, run again").get(0);
    assert_ne!(now, pid, "answered by the dead server");

    let pid = doom_backend_of(&client, &admin).await;
    let woken = wake_later(pid);
    let ran = client.query_typed("select pg_backend_pid()", &[]).await;
    woken.await.expect("SIGCONT");
    let rows = ran.expect("the one-off read, run again");
    assert_ne!(rows.first().map(|r| r.get::<_, i32>(0)), Some(pid));

    let pid = doom_backend_of(&client, &admin).await;
    let woken = wake_later(pid);
    let err = client
        .execute(&write, &[])
        .await
        .expect_err("the server died under the insert");
    woken.await.expect("SIGCONT");
    assert!(matches!(sqlstate(&err), Some("57P01" | "08006")), "{err:?}");
    let rows = scalar_text(&admin, "select count(*) from marks").await;
    assert_eq!(rows, "0", "the write ran again");
    assert!(
        sluice.log().contains("the request runs on another server"),
        "{}",
        sluice.log_tail(20)
    );
}

/// A cluster with a table `marks` the application may write.
fn cluster_with_marks() -> Cluster {
    let cluster = app_cluster(ServerAuth::Trust);
    cluster
        .psql(
            "postgres",
            &format!("create table marks (n int); grant all on marks to {APP_USER}"),
        )
        .expect("schema");
    cluster
}

/// Stops (SIGSTOP) the backend `client`'s pooled server runs on (a pool of
/// one server: the one its next request gets); returns its pid.
async fn stop_backend_of(client: &Client) -> i32 {
    let pid: i32 = scalar_text(client, "select pg_backend_pid()")
        .await
        .parse()
        .expect("pid");
    // SAFETY: kill(2) on a PostgreSQL backend of this test's cluster.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0, "SIGSTOP");
    pid
}

/// [`stop_backend_of`], with a SIGTERM pending (pg_terminate_backend): it
/// says goodbye and dies as soon as it runs again.
async fn doom_backend_of(client: &Client, admin: &Client) -> i32 {
    let pid = stop_backend_of(client).await;
    admin
        .simple_query(&format!("select pg_terminate_backend({pid})"))
        .await
        .expect("terminate");
    pid
}

/// Lets a stopped backend run again in 300 ms.
fn wake_later(pid: i32) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        // SAFETY: kill(2) on a PostgreSQL backend of this test's cluster.
        unsafe { libc::kill(pid, libc::SIGCONT) };
    })
}

/// A cluster, and sluice in transaction mode with a pool of one server.
fn one_server_pool() -> (Cluster, SluiceProcess) {
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = ConfigBuilder::for_cluster(&cluster)
        .set("pool_mode", "transaction")
        .set("default_pool_size", "1")
        .start();
    (cluster, sluice)
}

/// The open transaction runs on another server than `pid`; commits it.
async fn commit_elsewhere(client: &tokio_postgres::Client, pid: i32) {
    let now: i32 = scalar_text(client, "select pg_backend_pid()")
        .await
        .parse()
        .expect("pid");
    assert_ne!(now, pid, "the transaction runs on another server");
    client.simple_query("commit").await.expect("COMMIT");
}

/// A server terminated just after its last reply: its FATAL error comes in
/// the same read as the ReadyForQuery (made so here by stopping sluice
/// while the reply and the error arrive). It answers nothing the client
/// asked: the client does not see it and goes on, and the dead server is
/// closed instead of going back to the pool.
#[tokio::test]
async fn a_fatal_error_right_after_the_last_reply_is_not_the_clients() {
    let cluster = app_cluster(ServerAuth::Trust);
    let admin = superuser_connect(&cluster, "postgres").await;
    for backend in ["io_uring", "epoll"] {
        let sluice = ConfigBuilder::for_cluster(&cluster)
            .set("pool_mode", "transaction")
            .set("default_pool_size", "1")
            .sluice("io_backend", backend)
            .start();
        fatal_after_the_last_reply(&sluice, &admin, false).await;
        // A client pinned to its server (a temp table) loses something
        // with it: it is told, not silently moved.
        fatal_after_the_last_reply(&sluice, &admin, true).await;
    }
}

async fn fatal_after_the_last_reply(sluice: &SluiceProcess, admin: &Client, pinned: bool) {
    let mut raw = RawClient::logged_in(sluice.port(), APP_USER, "postgres").await;
    if pinned {
        raw.simple_query(
            "create temp table pinned_here(x int)",
            Duration::from_secs(5),
        )
        .await;
    }
    let pid = raw_backend_pid(&mut raw).await;

    raw.send(&msg::query("select pg_sleep(0.5)"))
        .await
        .expect("send");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let sluice_pid = i32::try_from(sluice.pid()).expect("pid");
    // SAFETY: kill(2) on the sluice this test started.
    assert_eq!(unsafe { libc::kill(sluice_pid, libc::SIGSTOP) }, 0);
    // The reply comes while sluice is stopped, then the FATAL error.
    tokio::time::sleep(Duration::from_millis(600)).await;
    admin
        .simple_query(&format!("select pg_terminate_backend({pid})"))
        .await
        .expect("terminate");
    let gone = eventually(Duration::from_secs(10), || async {
        let n = scalar_text(
            admin,
            &format!("select count(*) from pg_stat_activity where pid = {pid}"),
        )
        .await;
        (n == "0").then_some(())
    })
    .await;
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(sluice_pid, libc::SIGCONT) }, 0);
    assert!(gone.is_some(), "the backend did not end");

    let mut tags = Vec::new();
    loop {
        match raw.read_message(Duration::from_secs(5)).await {
            RawReply::Message(tag, body) => {
                assert_ne!(tag, b'E', "{:?}", error_fields(&body));
                if pinned && tag == b'Z' {
                    // Its session objects died with the server: the
                    // server's FATAL (or sluice's word for it) comes.
                    let told = raw.expect_error_or_close(Duration::from_secs(5)).await;
                    assert!(told.is_some(), "a pinned client was not told");
                    return;
                }
                tags.push(tag);
                if tag == b'Z' {
                    break;
                }
            }
            other => panic!("no reply to the query: {other:?} after {tags:?}"),
        }
    }
    match raw.read_message(Duration::from_millis(500)).await {
        RawReply::TimedOut => {}
        RawReply::Message(b'E', body) => {
            panic!(
                "the server's FATAL reached the client: {:?}",
                error_fields(&body)
            )
        }
        other => panic!("after the reply: {other:?}"),
    }
    // The client goes on, on another server.
    let again = raw_backend_pid(&mut raw).await;
    assert_ne!(again, pid, "the dead server was given out again");
}

/// The pid of the backend a raw client's next simple query runs on.
async fn raw_backend_pid(raw: &mut RawClient) -> String {
    raw.simple_query("select pg_backend_pid()", Duration::from_secs(5))
        .await
        .pop()
        .flatten()
        .expect("pid")
}

/// How many clients of database "postgres" SHOW CLIENTS lists.
async fn clients_listed(port: u16) -> usize {
    let admin = connect_as(port, "admin", "pgbouncer").await;
    let rows = admin
        .simple_query("SHOW CLIENTS")
        .await
        .expect("SHOW CLIENTS");
    rows.iter()
        .filter(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get("database") == Some("postgres"),
            _ => false,
        })
        .count()
}

/// Logs in raw, sends `sql` and closes at once, without waiting; with
/// `terminate`, says Terminate first, as libpq's PQfinish does.
async fn send_and_close(port: u16, sql: &str, terminate: bool) {
    let mut raw = RawClient::logged_in(port, APP_USER, "postgres").await;
    raw.send(&sluice_tests::msg::query(sql))
        .await
        .expect("sent");
    if terminate {
        raw.send(b"X\0\0\0\x04").await.expect("sent");
    }
}

/// A client that closes while its query waits, for a server or out of a
/// PAUSE, leaves at once, as on PgBouncer: its query never runs (a client
/// gone on its own timeout under overload costs the server nothing), and
/// no server is closed for it.
#[tokio::test]
async fn a_client_that_closes_while_queued_never_has_its_query_run() {
    let cluster = app_cluster(ServerAuth::Trust);
    app_table(&cluster, "queued", "n int");
    let sluice = ConfigBuilder::for_cluster(&cluster)
        .set("pool_mode", "transaction")
        .set("default_pool_size", "1")
        .set("query_wait_timeout", "60")
        .set("admin_users", "admin")
        .start();
    let p = sluice.port();
    let holder = connect_as(p, APP_USER, "postgres").await;
    let pid = scalar_text(&holder, "select pg_backend_pid()::text").await;
    holder.batch_execute("begin; select 1").await.unwrap();
    for n in 0..20 {
        send_and_close(p, &format!("insert into queued values ({n})"), n % 2 == 1).await;
    }
    // A client that pipelines a second query while it waits stays, and
    // gets both answers.
    let mut stays = RawClient::logged_in(p, APP_USER, "postgres").await;
    stays
        .send(&sluice_tests::msg::query("select 1"))
        .await
        .expect("sent");
    tokio::time::sleep(Duration::from_millis(100)).await;
    stays
        .send(&sluice_tests::msg::query("insert into queued values (50)"))
        .await
        .expect("sent");
    let left = eventually(Duration::from_secs(10), || async {
        (clients_listed(p).await == 2).then_some(())
    })
    .await;
    assert!(left.is_some(), "the closed clients are still listed");
    holder.batch_execute("commit").await.unwrap();
    for _ in 0..2 {
        stays.read_until_ready(Duration::from_secs(10)).await;
    }
    assert_eq!(
        scalar_text(&holder, "select pg_backend_pid()::text").await,
        pid,
        "the server was kept"
    );

    // (PAUSE closes idle servers.)
    let admin = connect_as(p, "admin", "pgbouncer").await;
    admin.simple_query("PAUSE postgres").await.expect("PAUSE");
    send_and_close(p, "insert into queued values (100)", true).await;
    let left = eventually(Duration::from_secs(10), || async {
        (clients_listed(p).await == 2).then_some(())
    })
    .await;
    assert!(
        left.is_some(),
        "the paused client that closed is still listed"
    );
    admin.simple_query("RESUME postgres").await.expect("RESUME");

    assert_eq!(
        scalar_text(&holder, "select string_agg(n::text, ',') from queued").await,
        "50",
        "only the client that stayed had its query run"
    );
}

/// A client killed while sluice no longer reads it (its pipeline filled
/// the buffers behind a long query) is gone within about a second, not
/// when the query ends: its server is given up, and the queries behind
/// are never sent. (A client that closes there is not seen: its FIN waits
/// behind the data it still has to send, as TCP has it.)
#[tokio::test]
async fn a_client_killed_behind_full_buffers_is_gone() {
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = ConfigBuilder::for_cluster(&cluster)
        .set("pool_mode", "transaction")
        .set("default_pool_size", "1")
        .set("admin_users", "admin")
        .start();
    let p = sluice.port();
    let mut raw = RawClient::logged_in(p, APP_USER, "postgres").await;
    let mut pipeline = sluice_tests::msg::query("select pg_sleep(20)");
    // About 16 MB of queries behind it: more than the server's socket
    // and sluice's buffers take while the server sleeps.
    for _ in 0..400_000 {
        pipeline.extend(sluice_tests::msg::query("select 1 /* behind the sleep */"));
    }
    let writer = tokio::spawn(async move {
        let _ = tokio::time::timeout(Duration::from_secs(30), raw.send(&pipeline)).await;
        raw
    });
    tokio::time::sleep(Duration::from_secs(2)).await;
    let admin = connect_as(p, "admin", "pgbouncer").await;
    let rows = admin
        .simple_query("SHOW CLIENTS")
        .await
        .expect("SHOW CLIENTS");
    let id = rows
        .iter()
        .find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) if r.get("database") == Some("postgres") => {
                r.get("id").map(str::to_owned)
            }
            _ => None,
        })
        .expect("the client is listed");
    admin
        .simple_query(&format!("KILL_CLIENT {id}"))
        .await
        .expect("KILL_CLIENT");
    let started = std::time::Instant::now();
    let gone = eventually(Duration::from_secs(15), || async {
        (clients_listed(p).await == 0).then_some(())
    })
    .await;
    assert!(gone.is_some(), "the killed client is still listed");
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "gone after {:?}: only when the query ended",
        started.elapsed()
    );
    // The pool serves the next client.
    let next = connect_as(p, APP_USER, "postgres").await;
    assert_eq!(scalar_text(&next, "select 3").await, "3");
    drop(writer);
}

/// Messages that need no server, or that PostgreSQL would refuse in a way
/// that leaves its server out of step, cost the pool nothing (found by a
/// hostile review: a lone Flush closed a server each time, as "released
/// with a send in flight", and an unknown message type made PostgreSQL
/// end the server).
#[tokio::test]
async fn odd_messages_between_transactions_cost_no_server() {
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = ConfigBuilder::for_cluster(&cluster)
        .set("pool_mode", "transaction")
        .set("default_pool_size", "1")
        .set("query_wait_timeout", "5")
        .start();
    let watcher = connect_as(sluice.port(), APP_USER, "postgres").await;
    let pid = scalar_text(&watcher, "select pg_backend_pid()::text").await;
    let mut odd = RawClient::logged_in(sluice.port(), APP_USER, "postgres").await;
    for round in 0..100 {
        let message = match round % 3 {
            0 => msg::flush(),
            1 => msg::copy_data(b"stray"),
            _ => msg::copy_done(),
        };
        odd.send(&message).await.expect("send");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert_eq!(
        odd.simple_query("select 'still here'", Duration::from_secs(10))
            .await,
        vec![Some("still here".to_owned())]
    );
    for (what, message, text) in [
        (
            "an unknown message type",
            msg::message(b'A', b"junk"),
            "invalid frontend message type 65",
        ),
        (
            "a Flush with a body",
            msg::message(b'H', b"x"),
            "invalid message format",
        ),
        (
            "a Sync with a body",
            msg::message(b'S', b"x"),
            "invalid message format",
        ),
    ] {
        let mut client = RawClient::logged_in(sluice.port(), APP_USER, "postgres").await;
        client.send(&message).await.expect("send");
        let fields = client
            .expect_error_or_close(Duration::from_secs(10))
            .await
            .unwrap_or_else(|| panic!("{what}: an error, not a bare close"));
        assert_eq!(error_field(&fields, b'C'), Some("08P01"), "{what}");
        assert_eq!(error_field(&fields, b'M'), Some(text), "{what}");
    }
    assert_eq!(
        scalar_text(&watcher, "select pg_backend_pid()::text").await,
        pid,
        "the pool's one server is the same: none was closed"
    );
}

/// A request written with the login packet, before ReadyForQuery, is
/// answered after the login, as PostgreSQL does (found by a review: it
/// was dropped, and the client waited for ever).
#[tokio::test]
async fn a_query_sent_with_the_login_packet_is_answered() {
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = ConfigBuilder::for_cluster(&cluster)
        .set("pool_mode", "transaction")
        .start();
    let mut client = RawClient::connect(sluice.port()).await;
    let startup = startup_packet(&[("user", APP_USER), ("database", "postgres")]);
    client
        .send(&[startup, msg::query("select 'early'")].concat())
        .await
        .expect("send");
    client.read_until_ready(Duration::from_secs(10)).await;
    let mut rows = Vec::new();
    loop {
        match client.read_message(Duration::from_secs(10)).await {
            RawReply::Message(b'D', body) => rows.push(body),
            RawReply::Message(b'Z', _) => break,
            RawReply::Message(..) => {}
            other => panic!("the early query's reply, not {other:?}"),
        }
    }
    assert_eq!(rows.len(), 1);
    assert!(rows[0].ends_with(b"early"), "{:?}", rows[0]);
}

/// Startup oddities answered as PostgreSQL answers them (found by a
/// review): SSLRequest asked again after 'N' ends the connection (it used
/// to be answered 'N' for ever), a user named twice is the last one, and
/// an old protocol is 0A000.
#[tokio::test]
async fn startup_oddities_are_answered_as_postgresql_answers_them() {
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = ConfigBuilder::for_cluster(&cluster)
        .set("pool_mode", "transaction")
        .start();
    let wait = Duration::from_secs(10);
    let mut twice = RawClient::connect(sluice.port()).await;
    twice.send(&ssl_request()).await.expect("send");
    assert!(matches!(
        twice.read_byte(wait).await,
        RawReply::Message(b'N', _)
    ));
    twice.send(&ssl_request()).await.expect("send");
    let fields = twice
        .expect_error_or_close(wait)
        .await
        .expect("an error, not a bare close");
    assert_eq!(error_field(&fields, b'C'), Some("08P01"));

    let mut named_twice = RawClient::connect(sluice.port()).await;
    let startup = startup_packet(&[
        ("user", "nobody_at_all"),
        ("user", APP_USER),
        ("database", "postgres"),
    ]);
    named_twice.send(&startup).await.expect("send");
    named_twice.read_until_ready(wait).await;
    assert_eq!(
        named_twice
            .simple_query("select current_user::text", wait)
            .await,
        vec![Some(APP_USER.to_owned())]
    );

    let mut old = RawClient::connect(sluice.port()).await;
    let mut packet = 8u32.to_be_bytes().to_vec();
    packet.extend_from_slice(&0x0002_0000u32.to_be_bytes());
    old.send(&packet).await.expect("send");
    let fields = old.expect_error_or_close(wait).await.expect("an error");
    assert_eq!(error_field(&fields, b'C'), Some("0A000"));
}

/// A user name with a line break in it cannot forge a log line: each log
/// event stays one line (found by a review: an unauthenticated client
/// wrote "pooler error: password authentication failed…" lines).
#[tokio::test]
async fn a_user_name_cannot_forge_a_log_line() {
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = ConfigBuilder::for_cluster(&cluster)
        .set("log_connections", "1")
        .start();
    let mut raw = RawClient::connect(sluice.port()).await;
    raw.send(&startup_packet(&[
        ("user", "evil\nFORGED pooler error"),
        ("database", "postgres"),
    ]))
    .await
    .expect("send");
    let _ = raw.expect_error_or_close(Duration::from_secs(10)).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !sluice.log().contains("evil\\nFORGED") {
        assert!(
            std::time::Instant::now() < deadline,
            "the login was not logged with its line break escaped\n{}",
            sluice.log_tail(10)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        !sluice.log().lines().any(|l| l.starts_with("FORGED")),
        "{}",
        sluice.log_tail(10)
    );
}
