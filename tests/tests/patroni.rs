//! Routing behind Patroni (issue 10): a two-node Patroni + etcd cluster
//! from Debian's packages, sluice in front of it with `route_reads` and
//! `patroni=`, and a `switchover` under pgbench writers (`-N`) and readers
//! (`-S`). Writers pause for the switch and go on on the new primary: the
//! only clients that fail are those whose transaction was in flight on the
//! old primary, and they are told a failover is under way. Readers never
//! pause and never fail.

use std::time::{Duration, Instant};

use sluice_testkit::PatroniCluster;
use sluice_tests::*;

/// What sluice tells a client whose transaction was on the old primary.
const IN_FLIGHT: &str = "the primary's connection ended during this transaction";

/// The tps of each `-P 1` progress line of a pgbench run.
fn progress(stderr: &str) -> Vec<f64> {
    stderr
        .lines()
        .filter_map(|l| l.strip_prefix("progress: "))
        .filter_map(|l| l.split(", ").nth(1))
        .filter_map(|t| t.strip_suffix(" tps"))
        .filter_map(|t| t.parse().ok())
        .collect()
}

/// The longest run of progress seconds without a transaction.
fn longest_stall(tps: &[f64]) -> usize {
    let mut longest = 0;
    let mut run = 0;
    for &t in tps {
        run = if t == 0.0 { run + 1 } else { 0 };
        longest = longest.max(run);
    }
    longest
}

async fn hosts(sluice: &SluiceProcess) -> Vec<Vec<Option<String>>> {
    let console = connect(sluice.port(), "postgres", "postgres", "pgbouncer")
        .await
        .expect("console");
    let rows = console
        .simple_query("SHOW HOSTS")
        .await
        .expect("SHOW HOSTS");
    rows.into_iter()
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => {
                Some((0..r.len()).map(|i| r.get(i).map(str::to_owned)).collect())
            }
            _ => None,
        })
        .collect()
}

/// Waits until SHOW HOSTS says host `port` is the primary and Patroni's
/// leader, and every other host a replica with no lag.
async fn wait_for_primary(sluice: &SluiceProcess, port: u16, within: Duration) {
    let deadline = Instant::now() + within;
    // (the database's first login makes its topology)
    let _login = connect(sluice.port(), "postgres", "postgres", "postgres")
        .await
        .expect("a login");
    loop {
        let rows = hosts(sluice).await;
        let listed = rows
            .iter()
            .any(|r| r.get(2).cloned().flatten() == Some(port.to_string()));
        let settled = listed
            && rows.iter().all(|r| {
                let col = |i: usize| r.get(i).cloned().flatten().unwrap_or_default();
                if col(2) == port.to_string() {
                    col(3) == "primary" && col(4) == "up" && col(11) == "leader"
                } else {
                    col(3) == "replica" && col(4) == "up" && col(5) == "0"
                }
            });
        if settled {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "host {port} not settled as primary within {within:?}: {rows:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A two-node Patroni + etcd cluster: it, its leader's index, the nodes'
/// PostgreSQL ports and REST URLs.
async fn two_nodes() -> (PatroniCluster, usize, Vec<u16>, Vec<String>) {
    let ha = tokio::task::spawn_blocking(|| PatroniCluster::start(2))
        .await
        .expect("start thread")
        .expect("a Patroni + etcd cluster (Debian's patroni and etcd-server)");
    let leader = ha.leader().expect("ask Patroni").expect("a leader");
    let pg_ports = ha.nodes().iter().map(|n| n.pg_port()).collect();
    let rest = ha.nodes().iter().map(|n| n.rest_url()).collect();
    (ha, leader, pg_ports, rest)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_patroni_switchover_pauses_writes_briefly_and_never_reads() {
    let (ha, leader, pg_ports, rest) = two_nodes().await;
    let candidate = 1 - leader;
    let entry = format!(
        "host=127.0.0.1,127.0.0.1 port={},{} dbname=postgres route_reads=1 patroni={},{}",
        pg_ports[0], pg_ports[1], rest[0], rest[1],
    );
    let sluice = ConfigBuilder::new()
        .database("postgres", &entry)
        .set("pool_mode", "transaction")
        .set("default_pool_size", "20")
        .set("max_client_conn", "200")
        .set("admin_users", "postgres")
        .userlist(&[("postgres", "postgres")])
        .sluice("failover_hold", "15")
        .start();
    wait_for_primary(&sluice, pg_ports[leader], Duration::from_secs(20)).await;
    let port = sluice.port();
    let init = pgbench(
        port,
        "postgres",
        "postgres",
        "postgres",
        &["-i", "-q", "-s", "2"],
        Duration::from_secs(120),
    );
    assert!(init.success(), "pgbench -i through sluice: {}", init.stderr);
    wait_for_primary(&sluice, pg_ports[leader], Duration::from_secs(20)).await;

    // Writers at a modest rate (most of them between transactions at
    // any moment, as an application's are), readers flat out.
    let run = |args: &'static [&'static str]| {
        std::thread::spawn(move || {
            pgbench(
                port,
                "postgres",
                "postgres",
                "postgres",
                args,
                Duration::from_secs(120),
            )
        })
    };
    let writers = run(&[
        "-n", "-N", "-c", "16", "-j", "2", "-R", "200", "-T", "20", "-P", "1",
    ]);
    let readers = run(&[
        "-n", "-S", "-c", "4", "-j", "1", "-R", "1500", "-T", "20", "-P", "1",
    ]);
    tokio::time::sleep(Duration::from_secs(7)).await;
    let switched = tokio::task::spawn_blocking(move || {
        let at = Instant::now();
        ha.switchover(candidate).map(|()| (ha, at.elapsed()))
    })
    .await
    .expect("switchover thread");
    let (ha, took) = switched.expect("patroni switchover");
    let writers = writers.join().expect("writers");
    let readers = readers.join().expect("readers");

    // Writers: every client that failed had its transaction on the old
    // primary and was told so; the rest went on after a short pause.
    let aborted: Vec<&str> = writers
        .stderr
        .lines()
        .filter(|l| l.contains(" aborted in command"))
        .collect();
    // pgbench prints the FATAL on the abort line when it arrives as the
    // answer to a command, and on a line of its own (libpq's notice) when it
    // arrives while the client sits between two commands of its
    // transaction; the abort then only says the backend died. Each such
    // abort must be matched by one of those FATAL lines.
    let told_apart = writers
        .stderr
        .lines()
        .filter(|l| l.contains(IN_FLIGHT) && !l.contains(" aborted in command"))
        .count();
    let bare: Vec<&&str> = aborted.iter().filter(|l| !l.contains(IN_FLIGHT)).collect();
    assert!(
        bare.iter()
            .all(|l| l.contains("perhaps the backend died while processing"))
            && bare.len() <= told_apart,
        "a writer failed outside a transaction in flight:\n{}",
        writers.stderr
    );
    assert!(
        aborted.len() <= 8,
        "{} of 16 writers failed (switchover took {took:?}):\n{}",
        aborted.len(),
        writers.stderr
    );
    let tps = progress(&writers.stderr);
    let read_tps = progress(&readers.stderr);
    eprintln!(
        "switchover took {took:?}: {} of 16 writers aborted (in flight), writes paused at most \
         {} s, reads at most {} s\nwriter tps: {tps:?}\nreader tps: {read_tps:?}",
        aborted.len(),
        longest_stall(&tps),
        longest_stall(&read_tps),
    );
    assert!(
        tps.len() >= 18,
        "writers stopped early:\n{}",
        writers.stderr
    );
    assert!(
        longest_stall(&tps) < 5,
        "writes paused 5 s or more: {tps:?}\n{}",
        writers.stderr
    );
    assert!(
        tps[tps.len() - 3..].iter().all(|&t| t > 0.0),
        "writes did not resume on the new primary: {tps:?}"
    );
    // Readers: never a failure, never a second without reads.
    assert!(
        readers.success() && !readers.stderr.contains("aborted"),
        "a reader failed:\n{}\n{}",
        readers.stdout,
        readers.stderr
    );
    let tps = progress(&readers.stderr);
    assert!(
        tps.len() >= 18,
        "readers stopped early:\n{}",
        readers.stderr
    );
    assert_eq!(longest_stall(&tps), 0, "reads paused: {tps:?}");

    // sluice follows Patroni's new leader, and the old one is a replica.
    ha.wait_replicas_running(Duration::from_secs(60))
        .expect("the old leader rejoins as a replica");
    wait_for_primary(&sluice, pg_ports[candidate], Duration::from_secs(20)).await;
    let client = connect(port, "postgres", "postgres", "postgres")
        .await
        .expect("connect after the switchover");
    let port_of_primary = scalar_text(
        &client,
        "/* sluice: primary */ select current_setting('port')",
    )
    .await;
    assert_eq!(port_of_primary, pg_ports[candidate].to_string());
    drop(sluice);
}

/// An entry that names only its Patroni (no `host=`): the hosts are
/// Patroni's members, found without being listed; a client that logs in
/// before Patroni has answered waits for the leader instead of going
/// anywhere else; reads go to the replica it learnt, writes to the
/// leader, and after a switchover to the new one. With `route_reads=0`
/// the same entry still follows the leader, and reads stay on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_that_names_only_patroni_learns_its_hosts() {
    let (ha, leader, pg_ports, rest) = two_nodes().await;
    let candidate = 1 - leader;
    let start = |route_reads: &str| {
        ConfigBuilder::new()
            .database(
                "postgres",
                &format!(
                    "dbname=postgres route_reads={route_reads} patroni={},{}",
                    rest[0], rest[1]
                ),
            )
            .set("pool_mode", "transaction")
            .set("admin_users", "postgres")
            .userlist(&[("postgres", "postgres")])
            .sluice("failover_hold", "15")
            .start()
    };
    let routed = start("1");
    let unrouted = start("0");
    // At once: the login waits for Patroni's members and their checks.
    let client = connect(routed.port(), "postgres", "postgres", "postgres")
        .await
        .expect("a login while the hosts are still unknown");
    let on_primary = scalar_text(
        &client,
        "/* sluice: primary */ select current_setting('port')",
    )
    .await;
    assert_eq!(on_primary, pg_ports[leader].to_string());
    wait_for_primary(&routed, pg_ports[leader], Duration::from_secs(20)).await;
    // An entry that names its hosts otherwise than Patroni does
    // (`localhost` for Patroni's 127.0.0.1) is matched by address: SHOW
    // HOSTS shows Patroni's leader (before, neither role nor leadership
    // was matched, and Patroni's fencing was off).
    let by_name = ConfigBuilder::new()
        .database(
            "postgres",
            &format!(
                "host=localhost,localhost port={},{} dbname=postgres route_reads=1 patroni={},{}",
                pg_ports[0], pg_ports[1], rest[0], rest[1]
            ),
        )
        .set("pool_mode", "transaction")
        .set("admin_users", "postgres")
        .userlist(&[("postgres", "postgres")])
        .start();
    let by_name_client = connect(by_name.port(), "postgres", "postgres", "postgres")
        .await
        .expect("a login");
    let on_primary = scalar_text(
        &by_name_client,
        "/* sluice: primary */ select current_setting('port')",
    )
    .await;
    assert_eq!(on_primary, pg_ports[leader].to_string());
    wait_for_primary(&by_name, pg_ports[leader], Duration::from_secs(20)).await;
    drop(by_name_client);
    drop(by_name);
    let rows = hosts(&routed).await;
    let mut listed: Vec<String> = rows.iter().filter_map(|r| r[2].clone()).collect();
    listed.sort();
    let mut expected: Vec<String> = pg_ports.iter().map(u16::to_string).collect();
    expected.sort();
    assert_eq!(listed, expected, "SHOW HOSTS: {rows:?}");
    // Reads reach the replica Patroni named.
    let mut on_replica = 0;
    for _ in 0..40 {
        if scalar_text(&client, "select current_setting('port')").await
            == pg_ports[candidate].to_string()
        {
            on_replica += 1;
        }
    }
    assert!(on_replica > 0, "no read went to the learnt replica");
    // A RELOAD keeps every pool on its learnt host (the entry names none
    // to fall back on).
    let console = connect(routed.port(), "postgres", "postgres", "pgbouncer")
        .await
        .expect("console");
    console.simple_query("RELOAD").await.expect("RELOAD");
    let mut on_replica = 0;
    for _ in 0..40 {
        let port = scalar_text(&client, "select current_setting('port')").await;
        assert!(
            pg_ports.iter().any(|p| p.to_string() == port),
            "a read after RELOAD ran on port {port}"
        );
        if port == pg_ports[candidate].to_string() {
            on_replica += 1;
        }
    }
    assert!(on_replica > 0, "no read on the learnt replica after RELOAD");

    // Without route_reads: everything on the leader.
    let plain = connect(unrouted.port(), "postgres", "postgres", "postgres")
        .await
        .expect("a login to the entry without route_reads");
    for _ in 0..10 {
        assert_eq!(
            scalar_text(&plain, "select current_setting('port')").await,
            pg_ports[leader].to_string()
        );
    }

    // A switchover: both follow the new leader.
    let ha = tokio::task::spawn_blocking(move || ha.switchover(candidate).map(|()| ha))
        .await
        .expect("switchover thread")
        .expect("patroni switchover");
    ha.wait_replicas_running(Duration::from_secs(60))
        .expect("the old leader rejoins as a replica");
    wait_for_primary(&routed, pg_ports[candidate], Duration::from_secs(20)).await;
    for (sluice, what) in [(&routed, "route_reads=1"), (&unrouted, "route_reads=0")] {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let c = connect(sluice.port(), "postgres", "postgres", "postgres")
                .await
                .expect("connect after the switchover");
            let port =
                scalar_text(&c, "/* sluice: primary */ select current_setting('port')").await;
            if port == pg_ports[candidate].to_string() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: writes still on {port} after the switchover"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    drop((routed, unrouted, ha));
}
