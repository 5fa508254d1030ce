//! The HTTP endpoint: Prometheus `/metrics` with true counters and
//! histograms, `/health` answering 503 while paused or with no reachable
//! server.

use sluice_tests::http::{get, parked_until, sample};
use sluice_tests::*;

fn with_metrics(builder: ConfigBuilder) -> (SluiceProcess, u16) {
    let port = sluice_testkit::free_port().expect("free port");
    let sluice = builder
        .set("pool_mode", "transaction")
        .set("admin_users", "admin")
        .sluice("metrics_addr", &format!("127.0.0.1:{port}"))
        .start();
    (sluice, port)
}

#[tokio::test]
async fn metrics_count_transactions_errors_and_latency() {
    let cluster = app_cluster(ServerAuth::Trust);
    let (sluice, mport) = with_metrics(ConfigBuilder::for_cluster(&cluster));
    let c = connect(sluice.port(), APP_USER, APP_PASSWORD, "postgres")
        .await
        .unwrap();
    for _ in 0..25 {
        c.simple_query("select 1").await.unwrap();
    }
    assert!(c.simple_query("select 1/0").await.is_err());
    expect_sqlstate(
        connect(sluice.port(), APP_USER, APP_PASSWORD, "nosuchdb").await,
        "3D000",
    );
    // Load balancers' TCP health checks: connect, close (or reset) before
    // a byte. Not failed logins, and nothing worth a warning.
    for reset in [false, true, false] {
        let probe = std::net::TcpStream::connect(("127.0.0.1", sluice.port())).expect("connect");
        if reset {
            let linger = libc::linger {
                l_onoff: 1,
                l_linger: 0,
            };
            // SAFETY: a valid socket and a `linger` of the size given.
            let rc = unsafe {
                libc::setsockopt(
                    std::os::fd::AsRawFd::as_raw_fd(&probe),
                    libc::SOL_SOCKET,
                    libc::SO_LINGER,
                    std::ptr::from_ref(&linger).cast(),
                    std::mem::size_of::<libc::linger>() as libc::socklen_t,
                )
            };
            assert_eq!(rc, 0, "SO_LINGER 0: close sends a reset");
        }
        drop(probe);
    }
    let labels = "{database=\"postgres\",user=\"app\"}";
    // A transaction is counted when its relay cycle ends, which may be just
    // after the client read its ReadyForQuery.
    let counted = eventually(std::time::Duration::from_secs(10), || async {
        let (status, body) = get(mport, "/metrics").await;
        (status == 200 && sample(&body, &format!("sluice_transactions_total{labels}")) >= 26.0)
            .then_some(body)
    })
    .await;
    let body = counted.expect("26 transactions counted in /metrics");
    assert!(sample(&body, &format!("sluice_received_bytes_total{labels}")) > 0.0);
    let count = sample(
        &body,
        &format!("sluice_transaction_duration_seconds_count{labels}"),
    );
    let inf = sample(
        &body,
        "sluice_transaction_duration_seconds_bucket{le=\"+Inf\",database=\"postgres\",user=\"app\"}",
    );
    assert_eq!(count, inf, "+Inf bucket equals the count");
    assert!(count >= 26.0);
    let fast = sample(
        &body,
        "sluice_transaction_duration_seconds_bucket{le=\"0.00005\",database=\"postgres\",user=\"app\"}",
    );
    assert!(
        fast <= count,
        "buckets are cumulative and bounded by the count"
    );
    assert_eq!(
        sample(
            &body,
            "sluice_server_errors_total{database=\"postgres\",user=\"app\",class=\"22\"}"
        ),
        1.0
    );
    assert_eq!(
        sample(
            &body,
            "sluice_client_login_failures_total{sqlstate=\"3D000\"}"
        ),
        1.0
    );
    assert!(
        !body.contains("sluice_client_login_failures_total{sqlstate=\"08P01\"}"),
        "a health check counted as a failed login:\n{body}"
    );
    assert!(
        !sluice.log().contains("pooler error: connection"),
        "{}",
        sluice.log_tail(20)
    );
    assert!(sample(&body, "process_resident_memory_bytes") > 0.0);
    assert_eq!(get(mport, "/nope").await.0, 404);
}

#[tokio::test]
async fn health_is_503_while_paused_and_200_after_resume() {
    let cluster = app_cluster(ServerAuth::Trust);
    let (sluice, mport) = with_metrics(ConfigBuilder::for_cluster(&cluster));
    assert_eq!(get(mport, "/health").await.0, 200);
    let admin = connect_as(sluice.port(), "admin", "pgbouncer").await;
    admin.simple_query("PAUSE").await.unwrap();
    let (status, body) = get(mport, "/health").await;
    assert_eq!((status, body.trim()), (503, "paused"));
    admin.simple_query("RESUME").await.unwrap();
    assert_eq!(get(mport, "/health").await.0, 200);
}

/// Connections held open from one address take at most a few of the
/// endpoint's places: `/health` still answers others (40 idle sockets
/// once kept it down, and an orchestrator would restart sluice).
#[tokio::test]
async fn idle_connections_from_one_address_leave_health_answering() {
    let cluster = app_cluster(ServerAuth::Trust);
    let (_sluice, mport) = with_metrics(ConfigBuilder::for_cluster(&cluster));
    let mut held = Vec::new();
    for _ in 0..40 {
        held.push(idle_http_connection(mport, 2).await);
    }
    for _ in 0..3 {
        assert_eq!(get(mport, "/health").await.0, 200);
    }
    // From the prober's own address: its newcomer takes the place of the
    // oldest that sent nothing (review 50: 8 of them failed every probe).
    for _ in 0..8 {
        held.push(idle_http_connection(mport, 1).await);
    }
    for _ in 0..3 {
        assert_eq!(get(mport, "/health").await.0, 200);
    }
    // From 17 addresses, 8 each: more than all the places there are (the
    // oldest connection that sent nothing makes way for a newcomer).
    for from in 3..20 {
        for _ in 0..8 {
            held.push(idle_http_connection(mport, from).await);
        }
    }
    for _ in 0..3 {
        assert_eq!(get(mport, "/health").await.0, 200);
    }
    drop(held);
}

/// A connection to the HTTP endpoint from 127.0.0.`from` that sends
/// nothing.
async fn idle_http_connection(mport: u16, from: u8) -> tokio::net::TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind(std::net::SocketAddr::from(([127, 0, 0, from], 0)))
        .expect("bind 127.0.0.x");
    socket
        .connect(format!("127.0.0.1:{mport}").parse().expect("address"))
        .await
        .expect("connect")
}

#[tokio::test]
async fn health_is_503_when_no_server_can_be_reached() {
    let dead_port = sluice_testkit::free_port().expect("free port");
    let builder = ConfigBuilder::new()
        .database(
            "down",
            &format!("host=127.0.0.1 port={dead_port} dbname=postgres"),
        )
        .set("server_login_retry", "30");
    let (sluice, mport) = with_metrics(builder);
    assert!(
        connect(sluice.port(), APP_USER, APP_PASSWORD, "down")
            .await
            .is_err()
    );
    let (status, body) = get(mport, "/health").await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("no reachable server"), "{body}");
}

/// Idle clients give their tasks up after a second or two (issue 13:
/// memory per idle client) and come back on their next query with what
/// they carry (a prepared statement); SHOW CLIENTS still lists them and
/// KILL still reaches them.
#[tokio::test]
async fn idle_clients_park_and_come_back() {
    let cluster = app_cluster(ServerAuth::Trust);
    let (sluice, mport) = with_metrics(
        ConfigBuilder::for_cluster(&cluster)
            .set("max_prepared_statements", "10")
            .set("default_pool_size", "4")
            .set("unix_socket_dir", "@DIR@"),
    );
    let mut clients = Vec::new();
    for _ in 0..19 {
        let c = connect(sluice.port(), APP_USER, APP_PASSWORD, "postgres")
            .await
            .unwrap();
        c.simple_query("select 1").await.unwrap();
        clients.push(c);
    }
    // One over the Unix socket: it parks and comes back the same way.
    let mut unix = tokio_postgres::Config::new();
    unix.host_path(sluice.dir())
        .port(sluice.port())
        .user(APP_USER)
        .password(APP_PASSWORD)
        .dbname("postgres");
    let unix = connect_config(&unix).await.unwrap();
    unix.simple_query("select 1").await.unwrap();
    clients.push(unix);
    let statement = clients[0].prepare("select $1::int + 1").await.unwrap();
    parked_until(mport, |n| n >= 20.0).await;
    let admin = connect_as(sluice.port(), "admin", "pgbouncer").await;
    let listed = admin.simple_query("SHOW CLIENTS").await.unwrap();
    let rows = listed
        .iter()
        .filter(|m| matches!(m, tokio_postgres::SimpleQueryMessage::Row(_)))
        .count();
    assert!(
        rows >= 20,
        "SHOW CLIENTS lists the parked clients: {rows} rows"
    );

    // Each comes back on its next query, the statement with it.
    for c in &clients {
        assert_eq!(scalar(c, "select 41 + 1").await.as_deref(), Some("42"));
    }
    let row = clients[0].query_one(&statement, &[&1i32]).await.unwrap();
    assert_eq!(row.get::<_, i32>(0), 2);
    let parked_now = parked_until(mport, |_| true).await;
    assert!(
        parked_now < 20.0,
        "clients that ran a query are not parked: {parked_now}"
    );

    // Parked again, KILL ends them: each finds its connection closed.
    parked_until(mport, |n| n >= 20.0).await;
    admin.simple_query("KILL postgres").await.unwrap();
    for c in &clients[1..] {
        assert!(
            c.simple_query("select 1").await.is_err(),
            "a killed parked client is disconnected"
        );
    }
    parked_until(mport, |n| n == 0.0).await;
    // And the pooler goes on serving once the killed database is resumed.
    admin.simple_query("RESUME postgres").await.unwrap();
    let fresh = connect(sluice.port(), APP_USER, APP_PASSWORD, "postgres")
        .await
        .unwrap();
    assert_eq!(scalar(&fresh, "select 7").await.as_deref(), Some("7"));
}
