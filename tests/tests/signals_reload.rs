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

#[tokio::test]
async fn sighup_applies_a_new_pool_size() {
    let cluster = app_cluster(ServerAuth::Trust);
    let config = ConfigBuilder::for_cluster(&cluster)
        .set("pool_mode", "transaction")
        .set("default_pool_size", "1");
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
