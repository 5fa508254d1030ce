//! Rolling restart: with `so_reuseport = 1` a second sluice binds the same
//! port and takes new connections while the first, sent SIGTERM, stops
//! accepting, serves its clients to the end and exits. pgbench opening a new
//! connection per transaction (`-C`) runs through it without a failure.

use std::time::Duration;

use sluice_tests::*;

#[test]
fn pgbench_runs_through_a_rolling_restart_without_a_failed_transaction() {
    let _migrate = MigrateQueuedConnections::enable();
    let cluster = app_cluster(ServerAuth::Trust);
    cluster.pgbench_init("postgres", 1).expect("pgbench -i");
    let config = ConfigBuilder::for_cluster(&cluster)
        .set("pool_mode", "transaction")
        .set("default_pool_size", "5")
        .set("so_reuseport", "1")
        .set("admin_users", "admin");
    let mut old = config.start();
    let port = old.port();
    let bench = std::thread::spawn(move || {
        pgbench(
            port,
            "postgres",
            "",
            "postgres",
            &["-C", "-S", "-n", "-c", "4", "-j", "2", "-T", "8"],
            Duration::from_secs(60),
        )
    });
    std::thread::sleep(Duration::from_secs(2));
    let text = config.render().replace("@PORT@", &port.to_string());
    let mut new = SluiceProcess::start_sharing_port(&text, port);
    std::thread::sleep(Duration::from_millis(500));
    old.signal("TERM");
    let status = old
        .wait_exit(Duration::from_secs(20))
        .expect("the old sluice exits once its clients are gone");
    assert!(status.success(), "old sluice: {status:?}\n{}", old.log());
    let out = bench.join().expect("pgbench thread");
    assert!(
        out.success(),
        "pgbench failed through the restart:\n{}\n{}",
        out.stdout,
        out.stderr
    );
    assert!(
        out.stdout.contains("number of failed transactions: 0"),
        "{}",
        out.stdout
    );
    assert!(
        !out.stderr.contains("failed"),
        "pgbench reported failures: {}",
        out.stderr
    );
    // The new process served the connections opened after the handover.
    assert!(new.is_running(), "the new sluice must keep running");
    let logins = new.log().matches("login").count();
    assert!(logins > 10, "the new sluice served only {logins} logins");
}

#[test]
fn reload_under_pgbench_load_applies_pool_size_and_drops_no_one() {
    let cluster = app_cluster(ServerAuth::Trust);
    cluster.pgbench_init("postgres", 1).expect("pgbench -i");
    let config = |pool_size: u32| {
        ConfigBuilder::for_cluster(&cluster)
            .set("pool_mode", "transaction")
            .set("default_pool_size", &pool_size.to_string())
            .set("admin_users", "admin")
    };
    let sluice = config(12).start();
    let port = sluice.port();
    let bench = std::thread::spawn(move || {
        pgbench(
            port,
            "postgres",
            "",
            "postgres",
            &["-S", "-n", "-c", "30", "-j", "2", "-T", "7"],
            Duration::from_secs(60),
        )
    });
    std::thread::sleep(Duration::from_secs(2));
    sluice.rewrite_config(&config(4).render());
    sluice.reload();
    std::thread::sleep(Duration::from_secs(2));
    sluice.rewrite_config(&config(6).set("query_wait_timeout", "30").render());
    sluice.reload();
    let out = bench.join().expect("pgbench thread");
    assert!(
        out.success(),
        "pgbench failed across reloads:\n{}",
        out.stderr
    );
    assert!(out.stdout.contains("number of failed transactions: 0"));
    assert_eq!(
        out.stdout.matches("number of clients: 30").count(),
        1,
        "{}",
        out.stdout
    );
    // The pool shrank to the new size: no more than 6 servers remain.
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let admin = connect_as(port, "admin", "pgbouncer").await;
        let rows = admin.simple_query("SHOW POOLS").await.unwrap();
        let row = rows
            .iter()
            .find_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r)
                    if r.get("database") == Some("postgres") =>
                {
                    Some(r)
                }
                _ => None,
            })
            .expect("pool row");
        let servers: i64 = ["sv_active", "sv_idle", "sv_login"]
            .iter()
            .map(|c| row.get(*c).unwrap().parse::<i64>().unwrap())
            .sum();
        assert!(
            servers <= 6,
            "pool still has {servers} servers after shrinking to 6"
        );
    });
    assert!(sluice.log().contains("configuration reloaded"));
}

/// A rolling restart with one unix_socket_dir, one pidfile and one
/// metrics_addr for both processes: the metrics port is shared as the
/// PostgreSQL port is (so_reuseport); the old process closes its Unix
/// socket at SIGTERM, the new one binds it and rewrites the pidfile, and
/// the old one, when it exits, leaves the new one's files alone.
#[test]
fn the_old_process_leaves_the_new_ones_socket_and_pidfile_alone() {
    let cluster = app_cluster(ServerAuth::Trust);
    let shared = ScratchDir::create();
    let pidfile = shared.path().join("sluice.pid");
    let config = ConfigBuilder::for_cluster(&cluster)
        .set("pool_mode", "transaction")
        .set("so_reuseport", "1")
        .set("unix_socket_dir", &shared.path().display().to_string())
        .set("pidfile", &pidfile.display().to_string())
        .sluice(
            "metrics_addr",
            &format!(
                "127.0.0.1:{}",
                sluice_testkit::free_port().expect("free port")
            ),
        );
    let mut old = config.start();
    let port = old.port();
    let socket = shared.path().join(format!(".s.PGSQL.{port}"));
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    // A client keeps the old process draining after its SIGTERM.
    let client = rt.block_on(connect_as(port, APP_USER, "postgres"));
    old.signal("TERM");
    std::thread::sleep(Duration::from_millis(300));
    let text = config.render().replace("@PORT@", &port.to_string());
    let new = SluiceProcess::start_sharing_port(&text, port);
    let read_pid = || std::fs::read_to_string(&pidfile).unwrap_or_default();
    assert_eq!(read_pid().trim(), new.pid().to_string());
    assert!(
        rt.block_on(client.simple_query("select 1")).is_ok(),
        "the old process serves its client to the end"
    );
    drop(client);
    let status = old
        .wait_exit(Duration::from_secs(20))
        .expect("the old sluice exits once its client is gone");
    assert!(status.success(), "old sluice: {status:?}\n{}", old.log());
    assert_eq!(
        read_pid().trim(),
        new.pid().to_string(),
        "the old process removed or changed the new one's pidfile"
    );
    assert!(
        std::os::unix::net::UnixStream::connect(&socket).is_ok(),
        "the new process's socket {} is gone",
        socket.display()
    );
}
