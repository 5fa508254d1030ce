//! More keys PgBouncer documents that sluice used to accept and ignore
//! (issue 12): socket options (`tcp_user_timeout`, `tcp_socket_buffer`,
//! `tcp_defer_accept`, read back from sluice's own sockets),
//! `server_round_robin`, `scram_iterations`, `login_notify_message`,
//! `query_wait_notify`, `pool_idle_timeout`, `server_fast_close`, and the
//! event-loop knobs that
//! have nothing to turn in sluice (warned about).

use std::time::Duration;

use sluice_tests::sockets::{int_option, socket_of, socket_to};
use sluice_tests::*;

const T: Duration = Duration::from_secs(10);

fn transaction_pool(cluster: &Cluster) -> ConfigBuilder {
    ConfigBuilder::for_cluster(cluster)
        .set("pool_mode", "transaction")
        .set("default_pool_size", "2")
}

/// Logs in over a raw connection; returns it and every message before the
/// first ReadyForQuery.
async fn raw_login(port: u16) -> (RawClient, Vec<(u8, Vec<u8>)>) {
    let mut raw = RawClient::connect(port).await;
    raw.startup(APP_USER, "postgres").await;
    let mut seen = Vec::new();
    loop {
        match raw.read_message(T).await {
            RawReply::Message(b'Z', _) => return (raw, seen),
            RawReply::Message(tag, body) => seen.push((tag, body)),
            other => panic!("login: {other:?}"),
        }
    }
}

#[tokio::test]
async fn socket_options_are_set_on_client_server_and_listening_sockets() {
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = transaction_pool(&cluster)
        .set("tcp_user_timeout", "7000")
        .set("tcp_socket_buffer", "262144")
        .set("tcp_defer_accept", "3")
        .set("pool_mode", "session")
        .start();
    let (raw, _) = raw_login(sluice.port()).await;
    let client_side = socket_of(sluice.pid(), sluice.port(), raw.local_port())
        .expect("sluice's socket of this client");
    assert_eq!(
        int_option(&client_side, libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT),
        Some(7000)
    );
    // The kernel doubles what it is asked for (socket(7)).
    assert_eq!(
        int_option(&client_side, libc::SOL_SOCKET, libc::SO_RCVBUF),
        Some(2 * 262_144)
    );
    assert_eq!(
        int_option(&client_side, libc::SOL_SOCKET, libc::SO_SNDBUF),
        Some(2 * 262_144)
    );
    // Session mode: the client's server is open; its socket too.
    let mut raw = raw;
    raw.simple_query("select 1", T).await;
    let server_side = socket_to(sluice.pid(), cluster.port()).expect("sluice's server socket");
    assert_eq!(
        int_option(&server_side, libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT),
        Some(7000)
    );
    assert_eq!(
        int_option(&server_side, libc::SOL_SOCKET, libc::SO_RCVBUF),
        Some(2 * 262_144)
    );
    let listening = socket_of(sluice.pid(), sluice.port(), 0).expect("the listening socket");
    // TCP_DEFER_ACCEPT is kept in retransmission rounds: at least 3 s.
    assert!(
        int_option(&listening, libc::IPPROTO_TCP, libc::TCP_DEFER_ACCEPT).is_some_and(|v| v >= 3),
        "{:?}",
        int_option(&listening, libc::IPPROTO_TCP, libc::TCP_DEFER_ACCEPT)
    );
}

#[tokio::test]
async fn server_round_robin_lends_the_longest_idle_server() {
    let cluster = app_cluster(ServerAuth::Trust);
    for (round_robin, expect_alternating) in [("1", true), ("0", false)] {
        let sluice = transaction_pool(&cluster)
            .set("server_round_robin", round_robin)
            .start();
        // Two servers open: two transactions at once.
        let a = connect_as(sluice.port(), APP_USER, "postgres").await;
        let b = connect_as(sluice.port(), APP_USER, "postgres").await;
        a.batch_execute("begin").await.unwrap();
        b.batch_execute("begin").await.unwrap();
        a.batch_execute("commit").await.unwrap();
        b.batch_execute("commit").await.unwrap();
        let mut pids = Vec::new();
        for _ in 0..4 {
            pids.push(scalar_text(&a, "select pg_backend_pid()").await);
        }
        let alternating = pids.windows(2).all(|w| w[0] != w[1]);
        let same = pids.windows(2).all(|w| w[0] == w[1]);
        if expect_alternating {
            assert!(alternating, "server_round_robin=1: {pids:?}");
        } else {
            assert!(same, "server_round_robin=0 (LIFO): {pids:?}");
        }
    }
}

#[tokio::test]
async fn scram_iterations_set_the_rounds_of_secrets_from_plain_passwords() {
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = transaction_pool(&cluster)
        .set("auth_type", "scram-sha-256")
        .set("auth_file", "@DIR@/userlist.txt")
        .set("scram_iterations", "8192")
        .auth_file(&format!("\"{APP_USER}\" \"plain-secret\"\n"))
        .start();
    let mut raw = RawClient::connect(sluice.port()).await;
    raw.startup(APP_USER, "postgres").await;
    match raw.read_message(T).await {
        RawReply::Message(b'R', body) => assert_eq!(&body[..4], &10i32.to_be_bytes()),
        other => panic!("no SASL request: {other:?}"),
    }
    let first = b"n,,n=,r=abcdefghijklmnop";
    let mut body = Vec::new();
    msg::cstr(&mut body, "SCRAM-SHA-256");
    body.extend_from_slice(&(first.len() as i32).to_be_bytes());
    body.extend_from_slice(first);
    raw.send(&msg::message(b'p', &body)).await.expect("send");
    match raw.read_message(T).await {
        RawReply::Message(b'R', body) => {
            assert_eq!(&body[..4], &11i32.to_be_bytes());
            let text = String::from_utf8_lossy(&body[4..]).into_owned();
            assert!(text.ends_with(",i=8192"), "{text}");
        }
        other => panic!("no SASL continue: {other:?}"),
    }
    // And the password works (tokio-postgres speaks SCRAM).
    let client = connect(sluice.port(), APP_USER, "plain-secret", "postgres")
        .await
        .expect("SCRAM login");
    assert_eq!(scalar_text(&client, "select 'in'").await, "in");
}

#[tokio::test]
async fn login_notify_message_and_query_wait_notify_are_sent() {
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = transaction_pool(&cluster)
        .set("default_pool_size", "1")
        .set("login_notify_message", "Welcome to the pool")
        .set("query_wait_notify", "1")
        .start();
    let (mut waiter, seen) = raw_login(sluice.port()).await;
    let notice = seen
        .iter()
        .find(|(tag, _)| *tag == b'N')
        .map(|(_, body)| error_fields(body))
        .expect("a notice at login");
    assert_eq!(error_field(&notice, b'M'), Some("Welcome to the pool"));

    let holder = connect_as(sluice.port(), APP_USER, "postgres").await;
    holder.batch_execute("begin").await.unwrap();
    waiter.send(&msg::query("select 7")).await.expect("send");
    let started = std::time::Instant::now();
    let notice = match waiter.read_message(Duration::from_secs(5)).await {
        RawReply::Message(b'N', body) => error_fields(&body),
        other => panic!("no queue notice: {other:?}"),
    };
    assert_eq!(
        error_field(&notice, b'M'),
        Some("No server connection available in postgres backend, client being queued")
    );
    assert!(started.elapsed() >= Duration::from_millis(800));
    holder.batch_execute("commit").await.unwrap();
    let mut rows = Vec::new();
    loop {
        match waiter.read_message(T).await {
            RawReply::Message(b'D', body) => rows.push(body),
            RawReply::Message(b'Z', _) => break,
            RawReply::Message(b'E', body) => panic!("{:?}", error_fields(&body)),
            RawReply::Message(..) => {}
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(rows.len(), 1);
}

async fn pools(console: &tokio_postgres::Client) -> usize {
    console
        .simple_query("SHOW POOLS")
        .await
        .expect("SHOW POOLS")
        .iter()
        .filter(|m| {
            matches!(m, tokio_postgres::SimpleQueryMessage::Row(r)
                if r.get(1) == Some(APP_USER))
        })
        .count()
}

#[tokio::test]
async fn pool_idle_timeout_frees_a_pool_with_no_client_and_no_server() {
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = transaction_pool(&cluster)
        .set("admin_users", "admin")
        .set("pool_idle_timeout", "1")
        .set("server_idle_timeout", "1")
        .start();
    let console = connect_as(sluice.port(), "admin", "pgbouncer").await;
    {
        let client = connect_as(sluice.port(), APP_USER, "postgres").await;
        client.batch_execute("select 1").await.unwrap();
        assert_eq!(pools(&console).await, 1);
    }
    eventually(Duration::from_secs(10), || async {
        (pools(&console).await == 0).then_some(())
    })
    .await
    .expect("the pool freed after its servers closed and pool_idle_timeout passed");
    assert!(sluice.log().contains("pool unused for pool_idle_timeout"));
    // Made again at the next login.
    let client = connect_as(sluice.port(), APP_USER, "postgres").await;
    assert_eq!(scalar_text(&client, "select 'again'").await, "again");
}

#[test]
fn knobs_without_effect_are_warned_about() {
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = transaction_pool(&cluster)
        .set("pkt_buf", "8192")
        .set("sbuf_loopcnt", "20")
        .start();
    let log = sluice.log();
    assert!(log.contains("pkt_buf is set but has no effect"), "{log}");
    assert!(
        log.contains("sbuf_loopcnt is set but has no effect"),
        "{log}"
    );
}

#[tokio::test]
async fn server_fast_close_ends_sessions_on_marked_servers_between_transactions() {
    let cluster = app_cluster(ServerAuth::Trust);
    for fast in ["1", "0"] {
        let sluice = ConfigBuilder::for_cluster(&cluster)
            .set("pool_mode", "session")
            .set("admin_users", "admin")
            .set("server_fast_close", fast)
            .start();
        let console = connect_as(sluice.port(), "admin", "pgbouncer").await;
        let mut idle = connect_tracked(sluice.port(), APP_USER, "", "postgres")
            .await
            .expect("login");
        idle.client.batch_execute("select 1").await.unwrap();
        let in_tx = connect_as(sluice.port(), APP_USER, "postgres").await;
        in_tx.batch_execute("begin; select 1").await.unwrap();
        console.simple_query("RECONNECT").await.expect("RECONNECT");
        tokio::time::sleep(Duration::from_millis(2500)).await;
        // A transaction under way is never cut.
        in_tx
            .batch_execute("select 2; commit")
            .await
            .expect("the open transaction finishes");
        if fast == "1" {
            match idle.ended(Duration::from_secs(3)).await {
                Some(Err(e)) => assert_eq!(
                    e.as_db_error().map(|d| d.message()),
                    Some("database configuration changed")
                ),
                other => panic!("the idle session was not ended: {other:?}"),
            }
            tokio::time::sleep(Duration::from_millis(2000)).await;
            assert!(
                in_tx.batch_execute("select 3").await.is_err(),
                "the session ended after its transaction"
            );
        } else {
            idle.client
                .batch_execute("select 1")
                .await
                .expect("without server_fast_close the session goes on");
            in_tx.batch_execute("select 3").await.expect("goes on");
        }
    }
}

#[tokio::test]
async fn console_set_goes_through_the_startup_checks_and_the_database_wait_timeout_applies() {
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = ConfigBuilder::new()
        .database_on(&cluster, "postgres", "query_wait_timeout=1")
        .set("pool_mode", "transaction")
        .set("default_pool_size", "1")
        .set("query_wait_timeout", "60")
        .set("admin_users", "admin")
        .start();
    let console = connect_as(sluice.port(), "admin", "pgbouncer").await;
    let refused = console
        .simple_query("SET dns_zone_check_period = 60")
        .await
        .expect_err("a value refused at startup is refused by SET");
    assert!(
        refused
            .as_db_error()
            .is_some_and(|d| d.message().contains("dns_zone_check_period")),
        "{refused:?}"
    );
    console
        .simple_query("SET default_pool_size = 1")
        .await
        .expect("a changeable key");
    // [databases] query_wait_timeout (1 s) wins over the global 60 s.
    let holder = connect_as(sluice.port(), APP_USER, "postgres").await;
    holder.batch_execute("begin").await.unwrap();
    let waiter = connect_as(sluice.port(), APP_USER, "postgres").await;
    let started = std::time::Instant::now();
    let result = tokio::time::timeout(Duration::from_secs(10), waiter.simple_query("select 1"))
        .await
        .expect("ends within 10 s");
    let error = expect_sqlstate(result, "08P01");
    assert_eq!(
        error.as_db_error().map(|d| d.message()),
        Some("query_wait_timeout")
    );
    assert!(started.elapsed() < Duration::from_secs(5));
}

/// `io_backend` (issue 13): chosen once at startup, logged, and shown by
/// SHOW CONFIG as the backend in use (auto's choice, not the word);
/// pgbench runs through each without a failed transaction, prepared
/// statements and pipelined extended protocol included.
#[tokio::test]
async fn io_backend_is_chosen_at_startup_and_shown() {
    let cluster = app_cluster(ServerAuth::Trust);
    // A kernel (or a container's seccomp profile) that refuses io_uring
    // makes auto choose epoll: asked the same way, a small ring.
    let allowed = {
        let mut params = [0u8; 120];
        // SAFETY: io_uring_setup(entries, params) with a zeroed
        // io_uring_params of its size (120 bytes); the descriptor it may
        // return is closed at once.
        let fd = unsafe { libc::syscall(libc::SYS_io_uring_setup, 4, params.as_mut_ptr()) };
        if fd >= 0 {
            // SAFETY: our own descriptor, just opened.
            unsafe { libc::close(fd as i32) };
        }
        fd >= 0
    };
    let auto = if allowed { "io_uring" } else { "epoll" };
    for (wanted, in_use) in [("epoll", "epoll"), ("auto", auto), ("io_uring", auto)] {
        if wanted == "io_uring" && !allowed {
            continue;
        }
        let sluice = transaction_pool(&cluster)
            .set("admin_users", "admin")
            .sluice("io_backend", wanted)
            .start();
        let admin = connect_as(sluice.port(), "admin", "pgbouncer").await;
        let keys = column(&admin, "SHOW CONFIG", "key").await;
        let values = column(&admin, "SHOW CONFIG", "value").await;
        let shown = keys
            .iter()
            .zip(&values)
            .find(|(k, _)| k.as_str() == "io_backend")
            .map(|(_, v)| v.clone());
        assert_eq!(shown.as_deref(), Some(in_use), "io_backend = {wanted}");
        assert!(
            sluice.log().contains(&format!("sends: {in_use}")),
            "the startup line names the backend: {}",
            sluice.log_tail(5)
        );
        for mode in ["simple", "prepared"] {
            pgbench_select_one_ok(
                sluice.dir(),
                sluice.port(),
                &["-c", "8", "-j", "2", "-T", "2", "-M", mode],
                &[],
            )
            .await;
        }
    }
}

/// `runtime = shared` (one multi-threaded runtime): it listens, serves
/// concurrent clients, and stops on SIGTERM once they are gone. (It once
/// dropped its runtime right after starting: nothing listened.)
#[tokio::test]
async fn the_shared_runtime_serves_clients() {
    let cluster = app_cluster(ServerAuth::Trust);
    let mut sluice = transaction_pool(&cluster)
        .sluice("runtime", "shared")
        .start();
    let port = sluice.port();
    let mut tasks = Vec::new();
    for i in 0..8 {
        tasks.push(tokio::spawn(async move {
            let client = connect_as(port, APP_USER, "postgres").await;
            for j in 0..20 {
                let got = scalar_text(&client, &format!("select {i} * 100 + {j}")).await;
                assert_eq!(got, (i * 100 + j).to_string());
            }
        }));
    }
    for t in tasks {
        tokio::time::timeout(T, t)
            .await
            .expect("in time")
            .expect("every query answered");
    }
    assert!(
        sluice.log().contains("Shared runtime"),
        "{}",
        sluice.log_tail(5)
    );
    sluice.signal("TERM");
    let status = sluice
        .wait_exit_async(Duration::from_secs(5))
        .await
        .expect("exits on SIGTERM with no client left");
    assert!(status.success(), "exit status {status}");
}
