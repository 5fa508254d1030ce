//! A `[databases]` entry with a host list and no read routing (PgBouncer
//! 1.25's `host=a,b port=x,y`): `load_balance_hosts = round-robin` (the
//! default) spreads new server connections over every host,
//! `disable` uses the first that answers; a host that is down is skipped;
//! a cancel reaches the host its query runs on.

use std::time::Duration;

use sluice_tests::*;

fn entry(a: &Cluster, b: &Cluster, balance: &str) -> ConfigBuilder {
    ConfigBuilder::new()
        .database(
            "postgres",
            &format!(
                "host=127.0.0.1,127.0.0.1 port={},{} dbname=postgres load_balance_hosts={balance}",
                a.port(),
                b.port()
            ),
        )
        .set("pool_mode", "transaction")
        .set("default_pool_size", "6")
        .set("server_connect_timeout", "4")
}

/// Opens `n` servers at once (as many transactions in flight).
async fn open_servers(port: u16, n: usize) -> Vec<tokio_postgres::Client> {
    let mut clients = Vec::new();
    for _ in 0..n {
        let c = connect_as(port, APP_USER, "postgres").await;
        c.batch_execute("begin; select 1").await.expect("begin");
        clients.push(c);
    }
    clients
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_robin_spreads_servers_and_disable_keeps_to_the_first_host() {
    let a = app_cluster(ServerAuth::Trust);
    let b = app_cluster(ServerAuth::Trust);

    let sluice = entry(&a, &b, "round-robin").start();
    let held = open_servers(sluice.port(), 6).await;
    let (on_a, on_b) = (
        count_backends(&a, "postgres").await,
        count_backends(&b, "postgres").await,
    );
    assert_eq!((on_a, on_b), (3, 3), "round-robin over two hosts");

    // A cancel for a query on either host reaches it.
    for c in &held {
        let token = c.cancel_token();
        let sleeping = c.simple_query("select pg_sleep(20)");
        let cancel = async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            token
                .cancel_query(tokio_postgres::NoTls)
                .await
                .expect("cancel");
            std::future::pending::<()>().await
        };
        let result = tokio::select! {
            r = tokio::time::timeout(Duration::from_secs(10), sleeping) => r,
            () = cancel => unreachable!(),
        };
        let error = result
            .expect("cancelled within 10 s")
            .expect_err("cancelled");
        assert_eq!(sqlstate(&error), Some("57014"), "{error:?}");
    }
    drop(held);
    drop(sluice);

    let sluice = entry(&a, &b, "disable").start();
    let held = open_servers(sluice.port(), 4).await;
    let on_b_before = count_backends(&b, "postgres").await;
    assert_eq!(on_b_before, 0, "disable: every server on the first host");
    assert_eq!(count_backends(&a, "postgres").await, 4);
    drop(held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_that_is_down_is_skipped() {
    let a = app_cluster(ServerAuth::Trust);
    let b = app_cluster(ServerAuth::Trust);
    a.stop().expect("stop the first host");
    for balance in ["disable", "round-robin"] {
        let sluice = entry(&a, &b, balance).start();
        let client = connect_as(sluice.port(), APP_USER, "postgres").await;
        for _ in 0..4 {
            assert_eq!(
                scalar_text(&client, "select 'served'").await,
                "served",
                "{balance}"
            );
        }
        assert!(
            sluice.log().contains("trying the next host"),
            "{}",
            sluice.log()
        );
    }
    a.start_again().expect("start the first host again");
}
