//! Scale: thousands of concurrent clients multiplexed over a small pool,
//! and pgbench with more clients than PostgreSQL's max_connections.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use sluice_tests::*;
use tokio::sync::Barrier;

const CLIENTS: usize = 2_000;
const POOL_SIZE: i64 = 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_clients_share_a_pool_of_twenty() {
    raise_fd_limit(20_000);
    let cluster = app_cluster_with(ServerAuth::Trust, |b| b.max_connections(100));
    let sluice = ConfigBuilder::for_cluster(&cluster)
        .set("pool_mode", "transaction")
        .set("default_pool_size", &POOL_SIZE.to_string())
        .set("max_client_conn", "3000")
        .set("listen_backlog", "4096")
        .set("query_wait_timeout", "60")
        .start();
    let port = sluice.port();
    let all_connected = Arc::new(Barrier::new(CLIENTS));
    let clients = (0..CLIENTS).map(|n| {
        let all_connected = all_connected.clone();
        tokio::spawn(async move {
            let client = connect(port, APP_USER, "", "postgres").await;
            all_connected.wait().await;
            let mut client = client.map_err(|e| format!("client {n} login: {e:?}"))?;
            // Simple protocol, then extended protocol inside a transaction
            // (prepared statements outside transactions are covered in modes.rs).
            for round in 0..2 {
                let sql = format!("select {n} + {round}");
                let messages = client
                    .simple_query(&sql)
                    .await
                    .map_err(|e| format!("client {n} query {round}: {e:?}"))?;
                let value = messages.iter().find_map(|m| match m {
                    tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
                    _ => None,
                });
                if value != Some((n + round).to_string()) {
                    return Err(format!("client {n} got {value:?} for {sql}"));
                }
            }
            let tx = client
                .transaction()
                .await
                .map_err(|e| format!("client {n} begin: {e:?}"))?;
            let row = tx
                .query_one("select $1::bigint * 2", &[&(n as i64)])
                .await
                .map_err(|e| format!("client {n} extended query: {e:?}"))?;
            if row.get::<_, i64>(0) != n as i64 * 2 {
                return Err(format!("client {n} got a wrong answer"));
            }
            tx.commit()
                .await
                .map_err(|e| format!("client {n} commit: {e:?}"))?;
            Ok::<(), String>(())
        })
    });
    let everyone = tokio::spawn(join_all(clients));
    let mut most = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
    while !everyone.is_finished() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "2,000 clients did not finish within 180 s"
        );
        most = most.max(count_backends(&cluster, "postgres").await);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let failures: Vec<String> = everyone
        .await
        .unwrap()
        .into_iter()
        .filter_map(|joined| joined.expect("client task panicked").err())
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {CLIENTS} clients failed, first: {:?}",
        failures.len(),
        failures.first()
    );
    assert!(
        most <= POOL_SIZE,
        "{most} server backends for a pool of {POOL_SIZE}"
    );
}

#[test]
fn pgbench_with_150_clients_over_max_connections_100() {
    raise_fd_limit(20_000);
    let cluster = app_cluster_with(ServerAuth::Trust, |b| b.max_connections(100));
    cluster.pgbench_init("postgres", 1).expect("pgbench -i");
    let sluice = ConfigBuilder::for_cluster(&cluster)
        .set("pool_mode", "transaction")
        .set("default_pool_size", "20")
        .set("max_client_conn", "300")
        .set("listen_backlog", "1024")
        .start();
    let superuser = cluster.superuser();

    let output = pgbench(
        sluice.port(),
        superuser,
        "",
        "postgres",
        &["-c", "150", "-j", "2", "-T", "3", "-S", "-n"],
        Duration::from_secs(120),
    );
    assert!(
        output.success(),
        "pgbench failed ({}):\n{}\n{}",
        output.status,
        output.stdout,
        output.stderr
    );
    assert_eq!(
        pgbench_failed(&output.stdout),
        Some(0),
        "pgbench report:\n{}",
        output.stdout
    );
    assert!(
        pgbench_processed(&output.stdout).is_some_and(|n| n > 0),
        "pgbench report:\n{}",
        output.stdout
    );
    assert!(
        output.stdout.contains("number of clients: 150"),
        "{}",
        output.stdout
    );
    assert!(count_backends_psql(&cluster, "postgres") <= 20);

    let listed = psql(
        sluice.port(),
        superuser,
        "",
        "postgres",
        "select count(*) from pgbench_branches",
    );
    assert!(listed.success(), "psql failed: {}", listed.stderr);
    assert_eq!(listed.stdout.trim(), "1");
}
