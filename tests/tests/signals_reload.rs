//! Signals: SIGHUP reloads pool sizes and auth-file passwords live (and a
//! broken file leaves the running config alone); SIGTERM waits for clients
//! to leave, SIGINT for servers to be released, SIGQUIT exits at once.

use std::time::Duration;

use sluice_tests::*;
use tokio_postgres::Client;

/// Opens a client and starts a transaction on it (so it holds a server in
/// transaction mode), within `timeout`; `None` if it had to wait longer.
async fn try_hold(port: u16, timeout: Duration) -> Option<Client> {
    let client = connect_as(port, APP_USER, "postgres").await;
    match tokio::time::timeout(timeout, client.batch_execute("begin; select 1")).await {
        Ok(result) => {
            result.expect("begin");
            Some(client)
        }
        Err(_) => None,
    }
}

/// One query through sluice: the pool has had a server, and greets new
/// clients without one even while paused.
async fn warm_up(port: u16) {
    let client = connect_as(port, APP_USER, "postgres").await;
    client
        .simple_query("select 1")
        .await
        .expect("warm-up query");
}

/// Transaction mode, one server.
fn pool_of_one(cluster: &sluice_testkit::Cluster) -> ConfigBuilder {
    ConfigBuilder::for_cluster(cluster)
        .set("pool_mode", "transaction")
        .set("default_pool_size", "1")
}

#[tokio::test]
async fn sighup_applies_a_new_pool_size() {
    let cluster = app_cluster(ServerAuth::Trust);
    let config = pool_of_one(&cluster);
    let sluice = config.start();
    let port = sluice.port();

    let first = try_hold(port, Duration::from_secs(5))
        .await
        .expect("first server");
    assert!(
        try_hold(port, Duration::from_secs(1)).await.is_none(),
        "a second server with default_pool_size=1"
    );
    first.batch_execute("commit").await.unwrap();
    drop(first);

    sluice.rewrite_config(&config.clone().set("default_pool_size", "3").render());
    sluice.reload();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut holders = Vec::new();
    for n in 0..3 {
        let holder = try_hold(port, Duration::from_secs(5))
            .await
            .unwrap_or_else(|| panic!("transaction {} waited: pool size still small", n + 1));
        holders.push(holder);
    }
    assert_eq!(count_backends(&cluster, "postgres").await, 3);
}

#[tokio::test]
async fn sighup_gives_a_larger_pool_to_clients_already_waiting() {
    // (review 40: a line that never emptied never got the new servers)
    let cluster = app_cluster(ServerAuth::Trust);
    let config = pool_of_one(&cluster);
    let sluice = config.start();
    let port = sluice.port();
    let holder = try_hold(port, Duration::from_secs(5))
        .await
        .expect("first server");
    let waiters: Vec<_> = (0..2)
        .map(|_| tokio::spawn(try_hold(port, Duration::from_secs(20))))
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(waiters.iter().all(|w| !w.is_finished()), "they wait");
    sluice.rewrite_config(&config.clone().set("default_pool_size", "3").render());
    sluice.reload();
    for waiter in waiters {
        let served = tokio::time::timeout(Duration::from_secs(3), waiter)
            .await
            .expect("served once the pool grew, not when the holder ends")
            .expect("task");
        served
            .expect("a server")
            .batch_execute("commit")
            .await
            .expect("commit");
    }
    holder.batch_execute("commit").await.expect("commit");
}

#[tokio::test]
async fn reloads_that_change_how_statements_are_kept_do_not_lose_a_clients_statements() {
    // (review 40: after a RELOAD to session mode, or to
    // max_prepared_statements = 0, a client's Bind reached the server
    // under its own name, which the server never got)
    let cluster = app_cluster(ServerAuth::Trust);
    let config = ConfigBuilder::for_cluster(&cluster)
        .set("pool_mode", "transaction")
        .set("default_pool_size", "2")
        .set("max_prepared_statements", "10");
    let sluice = config.start();
    let client = connect_as(sluice.port(), APP_USER, "postgres").await;
    let statement = client.prepare("select $1::int + 1").await.expect("prepare");
    let run = |n: i32| {
        let (client, statement) = (&client, &statement);
        async move {
            let row = client.query_one(statement, &[&n]).await.expect("execute");
            assert_eq!(row.get::<_, i32>(0), n + 1);
        }
    };
    run(1).await;
    for (key, value) in [
        ("pool_mode", "session"),
        ("pool_mode", "transaction"),
        ("max_prepared_statements", "0"),
    ] {
        sluice.rewrite_config(&config.clone().set(key, value).render());
        sluice.reload();
        tokio::time::sleep(Duration::from_millis(300)).await;
        for n in 0..5 {
            run(n).await;
        }
        // A new client prepares as the new settings say; in session mode
        // it finds none of the shared statements on its server (review
        // 43 ran them by name).
        let other = connect_as(sluice.port(), APP_USER, "postgres").await;
        if value == "session" {
            let shared = other
                .query_one(
                    "select count(*) from pg_prepared_statements where name like 'sluice%'",
                    &[],
                )
                .await
                .expect("count");
            assert_eq!(shared.get::<_, i64>(0), 0, "shared statements in a session");
        }
        let mine = other.prepare("select $1::int * 2").await.expect("prepare");
        let row = other.query_one(&mine, &[&21]).await.expect("execute");
        assert_eq!(row.get::<_, i32>(0), 42, "{key} = {value}");
    }
}

#[tokio::test]
async fn sigusr1_pauses_and_closes_idle_servers_as_pause_does() {
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = ConfigBuilder::for_cluster(&cluster)
        .set("pool_mode", "transaction")
        .set("admin_users", APP_USER)
        .start();
    let port = sluice.port();
    let client = connect_as(port, APP_USER, "postgres").await;
    client.batch_execute("select 1").await.expect("query");
    assert_eq!(count_backends(&cluster, "postgres").await, 1);
    sluice.signal("USR1");
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while count_backends(&cluster, "postgres").await > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "SIGUSR1 left the idle server open"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let state = console_rows(port, APP_USER, "SHOW STATE").await;
    assert!(
        state
            .iter()
            .any(|r| row_field(r, "key") == "paused" && row_field(r, "value") == "yes")
    );
    sluice.signal("USR2");
    client
        .batch_execute("select 1")
        .await
        .expect("after SIGUSR2");
}

#[tokio::test]
async fn sighup_applies_a_new_auth_file_password() {
    let cluster = app_cluster(ServerAuth::ScramSha256);
    let sluice = ConfigBuilder::new()
        .database_on(
            &cluster,
            "postgres",
            &format!("user={APP_USER} password={APP_PASSWORD}"),
        )
        .set("auth_type", "md5")
        .userlist(&[(APP_USER, "old-password")])
        .start();
    let port = sluice.port();
    connect(port, APP_USER, "old-password", "postgres")
        .await
        .expect("old password before the reload");

    sluice.rewrite_auth_file(&format!("\"{APP_USER}\" \"new-password\"\n"));
    sluice.reload();
    let accepted = eventually(Duration::from_secs(5), || async {
        connect(port, APP_USER, "new-password", "postgres")
            .await
            .ok()
    })
    .await;
    let client = accepted.expect("the new password works after SIGHUP");
    assert_eq!(scalar_text(&client, "select current_user").await, APP_USER);
    expect_sqlstate(
        connect(port, APP_USER, "old-password", "postgres").await,
        "28P01",
    );
}

#[tokio::test]
async fn sighup_with_a_broken_config_keeps_the_old_one() {
    let cluster = app_cluster(ServerAuth::Trust);
    let mut sluice = ConfigBuilder::for_cluster(&cluster).start();
    sluice.rewrite_config("[pgbouncer]\npool_mode = sideways\n[databases\n");
    sluice.reload();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        sluice.is_running(),
        "a bad config on reload must not kill sluice"
    );
    let client = connect_as(sluice.port(), APP_USER, "postgres").await;
    assert_eq!(scalar_text(&client, "select 1").await, "1");
}

/// The console's RELOAD of a broken file: PgBouncer's ERROR F0000, with
/// sluice's reason in the DETAIL; the old configuration keeps serving.
#[tokio::test]
async fn console_reload_of_a_broken_config_is_an_error_f0000() {
    let cluster = app_cluster(ServerAuth::Trust);
    let config = ConfigBuilder::for_cluster(&cluster).set("admin_users", "admin");
    let sluice = config.start();
    sluice.rewrite_config(&config.clone().set("pool_mode", "sideways").render());
    let admin = connect_as(sluice.port(), "admin", "pgbouncer").await;
    let e = expect_sqlstate(admin.simple_query("RELOAD").await, "F0000");
    let db = e.as_db_error().expect("a server error");
    assert_eq!(
        db.message(),
        "RELOAD failed, see logs for additional details"
    );
    let detail = db.detail().unwrap_or_default();
    assert!(
        detail.contains("keeping the old configuration") && detail.contains("pool_mode"),
        "{detail}"
    );
    let client = connect_as(sluice.port(), APP_USER, "postgres").await;
    assert_eq!(scalar_text(&client, "select 1").await, "1");
    // Fixed, the same RELOAD succeeds.
    sluice.rewrite_config(&config.render());
    admin
        .simple_query("RELOAD")
        .await
        .expect("RELOAD of a good file");
}

#[tokio::test]
async fn sigterm_waits_for_connected_clients_then_exits_zero() {
    let cluster = app_cluster(ServerAuth::Trust);
    let mut sluice = ConfigBuilder::for_cluster(&cluster)
        .set("pool_mode", "transaction")
        .start();
    let client = connect_as(sluice.port(), APP_USER, "postgres").await;
    scalar_text(&client, "select 1").await;
    sluice.signal("TERM");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(sluice.is_running(), "exited with a client still connected");
    assert_eq!(
        scalar_text(&client, "select 'still served'").await,
        "still served"
    );
    drop(client);
    let status = sluice
        .wait_exit_async(Duration::from_secs(5))
        .await
        .expect("exits once the last client left");
    assert!(status.success(), "exit status {status}");
}

#[tokio::test]
async fn sigint_waits_until_no_server_is_in_use() {
    let cluster = app_cluster(ServerAuth::Trust);
    let mut sluice = ConfigBuilder::for_cluster(&cluster)
        .set("pool_mode", "transaction")
        .start();
    let busy = connect_as(sluice.port(), APP_USER, "postgres").await;
    let _idle = connect_as(sluice.port(), APP_USER, "postgres").await;
    busy.batch_execute("begin; select 1").await.unwrap();
    sluice.signal("INT");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        sluice.is_running(),
        "exited while a transaction held a server"
    );
    busy.batch_execute("commit")
        .await
        .expect("the open transaction may finish");
    let status = sluice
        .wait_exit_async(Duration::from_secs(5))
        .await
        .expect("exits once no server is in use, idle clients notwithstanding");
    assert!(status.success(), "exit status {status}");
}

/// A second SIGTERM (or SIGINT) while a shutdown waits is PgBouncer's
/// "fast exit": the process leaves at once, clients or not.
#[tokio::test]
async fn a_second_sigterm_or_sigint_while_shutting_down_exits_at_once() {
    let cluster = app_cluster(ServerAuth::Trust);
    for (first, second) in [("TERM", "TERM"), ("INT", "INT"), ("TERM", "INT")] {
        let mut sluice = ConfigBuilder::for_cluster(&cluster)
            .set("pool_mode", "transaction")
            .start();
        let client = connect_as(sluice.port(), APP_USER, "postgres").await;
        client.batch_execute("begin; select 1").await.unwrap();
        sluice.signal(first);
        tokio::time::sleep(Duration::from_millis(700)).await;
        assert!(
            sluice.is_running(),
            "SIG{first} alone must wait for the open transaction"
        );
        sluice.signal(second);
        let status = sluice
            .wait_exit_async(Duration::from_secs(5))
            .await
            .unwrap_or_else(|| panic!("SIG{first} then SIG{second} must exit at once"));
        assert!(status.success(), "exit status {status}");
        assert!(
            sluice
                .log()
                .contains(&format!("got SIG{second} while shutting down, fast exit")),
            "{}",
            sluice.log()
        );
        drop(client);
    }
}

/// A pause (here KILL's) holds through SIGTERM's wait for clients, as on
/// PgBouncer: a rolling restart must not let clients onto a database
/// being dropped or restored.
#[tokio::test]
async fn a_pause_holds_through_sigterm() {
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = ConfigBuilder::for_cluster(&cluster)
        .set("pool_mode", "transaction")
        .set("admin_users", "admin")
        .start();
    // (a pool that has had a server greets a client while paused; one
    // that has not waits for the RESUME to log it in: see admin.rs)
    warm_up(sluice.port()).await;
    let admin = connect_as(sluice.port(), "admin", "pgbouncer").await;
    admin.simple_query("KILL postgres").await.expect("KILL");
    let client = connect_as(sluice.port(), APP_USER, "postgres").await;
    let query = tokio::spawn(async move { client.simple_query("select 1").await.is_ok() });
    sluice.signal("TERM");
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(!query.is_finished(), "SIGTERM let a paused query run");
    // A new pause could not be ended while shutting down: refused.
    let e = expect_sqlstate(admin.simple_query("PAUSE").await, "08P01");
    assert_eq!(
        e.as_db_error().map(|d| d.message()),
        Some("pooler is shutting down")
    );
    admin
        .simple_query("RESUME postgres")
        .await
        .expect("RESUME of a database during shutdown");
    let ran = tokio::time::timeout(Duration::from_secs(5), query)
        .await
        .expect("the query runs after RESUME");
    assert!(ran.unwrap(), "the query failed");
}

/// Paused clients wait at most query_wait_timeout (PgBouncer's janitor
/// treats them as waiting clients), and SIGINT tells the ones still
/// waiting "server shutting down" instead of cutting them without a word.
#[tokio::test]
async fn paused_clients_time_out_and_sigint_tells_them_why() {
    let cluster = app_cluster(ServerAuth::Trust);
    let config = ConfigBuilder::for_cluster(&cluster)
        .set("pool_mode", "transaction")
        .set("admin_users", "admin");
    let sluice = config.clone().set("query_wait_timeout", "1").start();
    warm_up(sluice.port()).await;
    let admin = connect_as(sluice.port(), "admin", "pgbouncer").await;
    admin.simple_query("PAUSE").await.expect("PAUSE");
    let client = connect_as(sluice.port(), APP_USER, "postgres").await;
    let started = std::time::Instant::now();
    let e = expect_sqlstate(client.simple_query("select 1").await, "08P01");
    assert_eq!(
        e.as_db_error().map(|d| d.message()),
        Some("query_wait_timeout"),
        "{e:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));

    let mut sluice = config.start();
    warm_up(sluice.port()).await;
    let admin = connect_as(sluice.port(), "admin", "pgbouncer").await;
    admin.simple_query("PAUSE").await.expect("PAUSE");
    let mut waiting = Vec::new();
    for _ in 0..3 {
        let client = connect_as(sluice.port(), APP_USER, "postgres").await;
        waiting.push(tokio::spawn(async move {
            client.simple_query("select 1").await.map(|_| ())
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    sluice.signal("INT");
    for w in waiting {
        let got = tokio::time::timeout(Duration::from_secs(5), w)
            .await
            .expect("answered")
            .expect("task");
        expect_sqlstate(got, "57P01");
    }
    let status = sluice
        .wait_exit_async(Duration::from_secs(5))
        .await
        .expect("exits");
    assert!(status.success(), "exit status {status}");
}

/// query_wait_timeout counts from the query's start, as PgBouncer counts
/// it, not once for the pause and again in the pool's line: a query that
/// waited out 2 s of a PAUSE has 1 s of its 3 left for a server.
#[tokio::test]
async fn a_query_that_waited_out_a_pause_has_the_rest_of_its_query_wait_timeout() {
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = ConfigBuilder::for_cluster(&cluster)
        .database_on(&cluster, "other", "dbname=postgres")
        .set("pool_mode", "transaction")
        .set("admin_users", "admin")
        .set("max_user_connections", "1")
        .set("query_wait_timeout", "3")
        .start();
    let p = sluice.port();
    let client = connect_as(p, APP_USER, "postgres").await;
    client.simple_query("select 1").await.unwrap();
    // The user's one server (its idle one evicted for it), held in a
    // transaction on the other database.
    let holder = connect_as(p, APP_USER, "other").await;
    holder.batch_execute("begin; select 1").await.unwrap();
    let admin = connect_as(p, "admin", "pgbouncer").await;
    admin.simple_query("PAUSE postgres").await.expect("PAUSE");
    let started = std::time::Instant::now();
    let query = tokio::spawn(async move { client.simple_query("select 1").await.map(|_| ()) });
    tokio::time::sleep(Duration::from_secs(2)).await;
    // Waiting out the pause counts as waiting in SHOW POOLS, as on
    // PgBouncer.
    let pools = admin.simple_query("SHOW POOLS").await.expect("SHOW POOLS");
    let row = pools
        .iter()
        .find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) if r.get("database") == Some("postgres") => {
                Some((
                    r.get("cl_waiting").map(str::to_owned),
                    r.get("maxwait").map(str::to_owned),
                ))
            }
            _ => None,
        })
        .expect("the pool's row");
    assert_eq!(row.0.as_deref(), Some("1"), "{row:?}");
    assert!(row.1.as_deref().is_some_and(|w| w != "0"), "{row:?}");
    admin.simple_query("RESUME postgres").await.expect("RESUME");
    let got = tokio::time::timeout(Duration::from_secs(10), query)
        .await
        .expect("answered")
        .expect("task");
    let e = expect_sqlstate(got, "08P01");
    assert_eq!(
        e.as_db_error().map(|d| d.message()),
        Some("query_wait_timeout")
    );
    let waited = started.elapsed();
    assert!(
        waited < Duration::from_millis(4500),
        "waited {waited:?}: 3 s counted again after the pause"
    );
    holder.batch_execute("commit").await.unwrap();
}

#[tokio::test]
async fn sigquit_exits_at_once() {
    let cluster = app_cluster(ServerAuth::Trust);
    let mut sluice = ConfigBuilder::for_cluster(&cluster).start();
    let client = connect_as(sluice.port(), APP_USER, "postgres").await;
    client.batch_execute("begin; select 1").await.unwrap();
    sluice.signal("QUIT");
    assert!(
        sluice
            .wait_exit_async(Duration::from_secs(2))
            .await
            .is_some(),
        "SIGQUIT must exit promptly even with a transaction open"
    );
}

/// Sends `sql` to the console over a raw connection; returns the notices'
/// messages and the command tag.
async fn console_with_notices(port: u16, sql: &str) -> (Vec<String>, String) {
    let t = Duration::from_secs(10);
    let mut raw = RawClient::connect(port).await;
    raw.startup("admin", "pgbouncer").await;
    raw.read_until_ready(t).await;
    raw.send(&msg::query(sql)).await.expect("send");
    let (mut notices, mut tag) = (Vec::new(), String::new());
    loop {
        match raw.read_message(t).await {
            RawReply::Message(b'N', body) => {
                let fields = error_fields(&body);
                notices.push(error_field(&fields, b'M').unwrap_or_default().to_owned());
            }
            RawReply::Message(b'C', body) => {
                tag = String::from_utf8_lossy(body.strip_suffix(b"\0").unwrap_or(&body)).into()
            }
            RawReply::Message(b'Z', _) => return (notices, tag),
            RawReply::Message(b'E', body) => panic!("{sql}: {:?}", error_fields(&body)),
            RawReply::Message(..) => continue,
            other => panic!("{sql}: {other:?}"),
        }
    }
}

/// The next datagram on systemd's notify socket.
fn next_notification(socket: &std::os::unix::net::UnixDatagram) -> String {
    let mut buf = [0u8; 4096];
    let n = socket
        .recv(&mut buf)
        .expect("a notification within 10 s on NOTIFY_SOCKET");
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[tokio::test]
async fn reload_names_keys_that_wait_for_a_restart_and_systemd_is_notified() {
    let cluster = app_cluster(ServerAuth::Trust);
    let dir = ScratchDir::create();
    let path = dir.path().join("notify.sock");
    let socket = std::os::unix::net::UnixDatagram::bind(&path).expect("bind notify socket");
    socket
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let config = ConfigBuilder::for_cluster(&cluster)
        .set("admin_users", "admin")
        .set("pool_mode", "transaction");
    let mut sluice = SluiceProcess::start_with_env(
        &config.render(),
        &[("NOTIFY_SOCKET", path.to_str().expect("utf-8 path"))],
    );
    let ready = next_notification(&socket);
    assert!(ready.contains("READY=1"), "{ready}");
    assert!(
        ready.contains(&format!("MAINPID={}", sluice.pid())),
        "{ready}"
    );

    // One key that needs a restart (not changeable in the settings
    // table), one that does not.
    sluice.rewrite_config(
        &config
            .clone()
            .set("listen_backlog", "77")
            .set("default_pool_size", "7")
            .render(),
    );
    let (notices, tag) = console_with_notices(sluice.port(), "RELOAD").await;
    assert_eq!(tag, "RELOAD");
    assert!(
        notices
            .iter()
            .any(|n| n.starts_with("listen_backlog changed") && n.contains("after a restart")),
        "{notices:?}"
    );
    assert!(
        !notices.iter().any(|n| n.contains("default_pool_size")),
        "{notices:?}"
    );
    assert!(
        sluice.log().contains(
            "listen_backlog changed from 128 to 77; it takes effect only after a restart"
        ),
        "{}",
        sluice.log()
    );
    let (_, shown) = console_with_notices(sluice.port(), "SHOW CONFIG").await;
    assert_eq!(shown, "SHOW");
    let reloading = next_notification(&socket);
    assert!(reloading.contains("RELOADING=1"), "{reloading}");
    assert!(reloading.contains("MONOTONIC_USEC="), "{reloading}");
    let ready = next_notification(&socket);
    assert!(ready.contains("READY=1"), "{ready}");

    // A reload by signal is announced too; nothing changed, nothing said.
    sluice.reload();
    assert!(next_notification(&socket).contains("RELOADING=1"));
    assert!(next_notification(&socket).contains("READY=1"));

    sluice.signal("TERM");
    let stopping = next_notification(&socket);
    assert!(stopping.contains("STOPPING=1"), "{stopping}");
    assert!(sluice.wait_exit(Duration::from_secs(10)).is_some());
}
