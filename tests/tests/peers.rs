//! Several sluices, one service: two processes share a port with
//! `so_reuseport`, peered through `[peers]` and `peer_id`. A cancel request
//! opens a new connection, which the kernel may give to either process:
//! every cancel must still reach the query it names (without peering about
//! half are lost). SHOW PEERS / PEER_POOLS list the group, and stopping one
//! process under pgbench `-C` fails no transaction.

use std::time::Duration;

use sluice_tests::*;

/// The two processes' configuration: shared port, own Unix socket
/// directory, `peer_id` 1 or 2, the same `[peers]` section.
fn member(cluster: &Cluster, dirs: &[&ScratchDir; 2], id: usize, peering: bool) -> String {
    let mut text = ConfigBuilder::for_cluster(cluster)
        .set("pool_mode", "transaction")
        .set("default_pool_size", "30")
        .set("max_client_conn", "200")
        .set("so_reuseport", "1")
        .set("admin_users", "admin")
        .set(
            "unix_socket_dir",
            &dirs[id - 1].path().display().to_string(),
        )
        .set("peer_id", if peering { ["1", "2"][id - 1] } else { "0" })
        .render();
    if peering {
        text.push_str(&format!(
            "\n[peers]\n1 = host={} port=@PORT@\n2 = host={} port=@PORT@ pool_size=4\n",
            dirs[0].path().display(),
            dirs[1].path().display()
        ));
    }
    text
}

/// Starts both members on one port.
fn start_pair(cluster: &Cluster, dirs: &[&ScratchDir; 2], peering: bool) -> [SluiceProcess; 2] {
    for _ in 0..5 {
        let port = sluice_testkit::free_port().expect("port");
        let first = SluiceProcess::start_sharing_port(&member(cluster, dirs, 1, peering), port);
        if first.log().contains("in use") {
            continue;
        }
        let second = SluiceProcess::start_sharing_port(&member(cluster, dirs, 2, peering), port);
        return [first, second];
    }
    panic!("no free port for the pair");
}

/// Runs `sleepers` clients in `select pg_sleep(30)`, cancels each through
/// a new connection to the shared port, and returns how many were cancelled
/// (57014) within 10 s.
async fn cancelled(port: u16, sleepers: usize) -> usize {
    let mut clients = Vec::new();
    for _ in 0..sleepers {
        clients.push(connect_as(port, APP_USER, "postgres").await);
    }
    let mut tasks = Vec::new();
    for client in &clients {
        let token = client.cancel_token();
        let query = client.simple_query("select pg_sleep(30)");
        tasks.push(async move {
            let cancel = async {
                tokio::time::sleep(Duration::from_millis(700)).await;
                token
                    .cancel_query(tokio_postgres::NoTls)
                    .await
                    .expect("the cancel request is sent");
                std::future::pending::<()>().await
            };
            tokio::select! {
                result = tokio::time::timeout(Duration::from_secs(10), query) => {
                    matches!(result, Ok(Err(e)) if sqlstate(&e) == Some("57014"))
                }
                () = cancel => false,
            }
        });
    }
    let done = futures_util::future::join_all(tasks).await;
    done.into_iter().filter(|ok| *ok).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancels_reach_their_query_whichever_member_they_land_on() {
    let cluster = app_cluster(ServerAuth::Trust);
    let dirs = [&ScratchDir::create(), &ScratchDir::create()];
    const SLEEPERS: usize = 24;

    let pair = start_pair(&cluster, &dirs, true);
    let port = pair[0].port();
    let hit = cancelled(port, SLEEPERS).await;
    assert_eq!(hit, SLEEPERS, "cancels lost between peered members");
    // Both members served clients (the kernel spread the logins).
    for member in &pair {
        assert!(
            member.log().contains("login attempt"),
            "a member served no client:\n{}",
            member.log()
        );
    }

    // The console of whichever member answers lists the other one.
    let admin = connect_as(port, "admin", "pgbouncer").await;
    let peers = admin.simple_query("SHOW PEERS").await.expect("SHOW PEERS");
    let rows: Vec<(String, String)> = peers
        .iter()
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => Some((
                r.get("peer_id").unwrap_or_default().to_owned(),
                r.get("pool_size").unwrap_or_default().to_owned(),
            )),
            _ => None,
        })
        .collect();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert!(
        rows[0] == ("1".into(), "30".into()) || rows[0] == ("2".into(), "4".into()),
        "{rows:?}"
    );
    let pools = admin
        .simple_query("SHOW PEER_POOLS")
        .await
        .expect("SHOW PEER_POOLS");
    let columns: Vec<String> = pools
        .iter()
        .find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => {
                Some(r.columns().iter().map(|c| c.name().to_owned()).collect())
            }
            _ => None,
        })
        .expect("a row");
    assert_eq!(
        columns,
        [
            "peer_id",
            "cl_active_cancel_req",
            "cl_waiting_cancel_req",
            "sv_active_cancel",
            "sv_login"
        ]
    );
    drop(pair);

    // Without peering the same cancels land on the wrong member about half
    // the time and are lost (the chance that none is: 2^-24).
    let unpeered = start_pair(&cluster, &dirs, false);
    let hit = cancelled(unpeered[0].port(), SLEEPERS).await;
    assert!(
        hit < SLEEPERS,
        "every cancel arrived without peering: {hit}"
    );
}

#[test]
fn one_member_stopped_under_pgbench_leaves_the_other_serving() {
    let cluster = app_cluster(ServerAuth::Trust);
    cluster.pgbench_init("postgres", 1).expect("pgbench -i");
    let dirs = [&ScratchDir::create(), &ScratchDir::create()];
    let [mut first, second] = start_pair(&cluster, &dirs, true);
    let port = first.port();
    let _migrate = MigrateQueuedConnections::enable();
    let bench = std::thread::spawn(move || {
        pgbench(
            port,
            "postgres",
            "",
            "postgres",
            &["-C", "-S", "-n", "-c", "8", "-j", "2", "-T", "6"],
            Duration::from_secs(60),
        )
    });
    std::thread::sleep(Duration::from_secs(2));
    first.signal("TERM");
    let status = first.wait_exit(Duration::from_secs(20));
    let out = bench.join().expect("pgbench thread");
    assert!(status.is_some_and(|s| s.success()), "{}", first.log());
    assert!(out.success(), "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stdout.contains("number of failed transactions: 0"),
        "{}",
        out.stdout
    );
    assert!(!out.stderr.contains("aborted"), "{}", out.stderr);
    let mut second = second;
    assert!(second.is_running());
}
