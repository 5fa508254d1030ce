//! TLS from sluice to PostgreSQL (`server_tls_*`), against a server
//! started with `ssl = on` and a certificate made at run time: the default
//! prefer uses TLS when the server offers it (pg_stat_ssl says so) and
//! plain TCP when it does not; require refuses a server without TLS;
//! verify-ca checks the chain only, verify-full also the host name; each
//! failure reaches the client as a clear error while other pools keep
//! working.

use sluice_tests::*;

fn tls_cluster(certs: &Certs, server: &str) -> Cluster {
    app_cluster_with(ServerAuth::ScramSha256, |b| {
        b.tls(
            &certs.text(&format!("{server}.crt")),
            &certs.text(&format!("{server}.key")),
        )
        .tls_only()
    })
}

fn sluice_to(cluster: &Cluster, host: &str, mode: &str, certs: &Certs, ca: &str) -> SluiceProcess {
    ConfigBuilder::new()
        .database(
            "postgres",
            &format!("host={host} port={} dbname=postgres", cluster.port()),
        )
        .set("server_tls_sslmode", mode)
        .set("server_tls_ca_file", &certs.path(ca))
        .set("admin_users", APP_USER)
        .userlist(&[(APP_USER, APP_PASSWORD)])
        .start()
}

/// The `tls` column of SHOW SERVERS, one entry per server.
async fn show_servers_tls(port: u16) -> Vec<String> {
    let console = connect(port, APP_USER, APP_PASSWORD, "pgbouncer")
        .await
        .expect("console");
    column(&console, "SHOW SERVERS", "tls").await
}

async fn ssl_in_use(port: u16) -> Result<String, tokio_postgres::Error> {
    let client = connect(port, APP_USER, APP_PASSWORD, "postgres").await?;
    let row = client
        .query_one(
            "select ssl::text from pg_stat_ssl where pid = pg_backend_pid()",
            &[],
        )
        .await?;
    Ok(row.get(0))
}

#[tokio::test]
async fn prefer_uses_tls_where_offered_and_plain_where_not() {
    let certs = Certs::make(APP_USER);
    let with_tls = tls_cluster(&certs, "server");
    let sluice = sluice_to(&with_tls, "127.0.0.1", "prefer", &certs, "ca.crt");
    assert_eq!(ssl_in_use(sluice.port()).await.expect("login"), "true");
    let tls = show_servers_tls(sluice.port()).await;
    assert!(
        !tls.is_empty() && tls.iter().all(|t| t.starts_with("TLSv1.3/TLS_AES_")),
        "SHOW SERVERS tls: {tls:?}"
    );

    let plain = app_cluster(ServerAuth::ScramSha256);
    let sluice = sluice_to(&plain, "127.0.0.1", "prefer", &certs, "ca.crt");
    assert_eq!(ssl_in_use(sluice.port()).await.expect("login"), "false");
    let tls = show_servers_tls(sluice.port()).await;
    assert!(
        !tls.is_empty() && tls.iter().all(String::is_empty),
        "{tls:?}"
    );

    let required = sluice_to(&plain, "127.0.0.1", "require", &certs, "ca.crt");
    let error = expect_sqlstate(ssl_in_use(required.port()).await, "08006");
    let message = error.as_db_error().expect("a server error").message();
    assert!(message.contains("does not support TLS"), "{message}");
}

#[tokio::test]
async fn verify_full_checks_the_chain_and_the_name() {
    let certs = Certs::make(APP_USER);
    let cluster = tls_cluster(&certs, "server");
    for host in ["localhost", "127.0.0.1"] {
        let sluice = sluice_to(&cluster, host, "verify-full", &certs, "ca.crt");
        assert_eq!(
            ssl_in_use(sluice.port()).await.expect("verify-full login"),
            "true",
            "{host}"
        );
    }
    let stranger = sluice_to(&cluster, "localhost", "verify-full", &certs, "other-ca.crt");
    let error = expect_sqlstate(ssl_in_use(stranger.port()).await, "08006");
    let message = error.as_db_error().expect("a server error").message();
    assert!(
        message.contains("TLS handshake with server localhost failed")
            && message.contains("UnknownIssuer"),
        "{message}"
    );
}

#[tokio::test]
async fn verify_ca_ignores_the_name_verify_full_does_not() {
    let certs = Certs::make(APP_USER);
    let cluster = tls_cluster(&certs, "wrongname");
    let ca_only = sluice_to(&cluster, "localhost", "verify-ca", &certs, "ca.crt");
    assert_eq!(
        ssl_in_use(ca_only.port()).await.expect("verify-ca login"),
        "true"
    );
    let full = sluice_to(&cluster, "localhost", "verify-full", &certs, "ca.crt");
    let error = expect_sqlstate(ssl_in_use(full.port()).await, "08006");
    let message = error.as_db_error().expect("a server error").message();
    assert!(
        message.contains("not valid for name \"localhost\""),
        "{message}"
    );
}

/// prefer: a handshake that fails (the server allows only TLS 1.2, sluice
/// only 1.3) falls back to plain TCP on a new connection, as libpq does;
/// require does not.
#[tokio::test]
async fn prefer_falls_back_to_plain_when_the_handshake_fails() {
    let certs = Certs::make(APP_USER);
    let cluster = app_cluster_with(ServerAuth::ScramSha256, |b| {
        b.tls(&certs.text("server.crt"), &certs.text("server.key"))
            .setting("ssl_max_protocol_version", "TLSv1.2")
    });
    let start = |mode: &str| {
        ConfigBuilder::new()
            .database(
                "postgres",
                &format!("host=127.0.0.1 port={} dbname=postgres", cluster.port()),
            )
            .set("server_tls_sslmode", mode)
            .set("server_tls_protocols", "tlsv1.3")
            .userlist(&[(APP_USER, APP_PASSWORD)])
            .start()
    };
    let prefer = start("prefer");
    assert_eq!(
        ssl_in_use(prefer.port()).await.expect("plain fallback"),
        "false"
    );
    let require = start("require");
    let error = expect_sqlstate(ssl_in_use(require.port()).await, "08006");
    let message = error.as_db_error().expect("a server error").message();
    assert!(
        message.contains("TLS handshake with server 127.0.0.1 failed"),
        "{message}"
    );
}

/// A RELOAD that changes server_tls_* drops the servers opened under the
/// old settings: the next transaction runs on a server opened anew.
#[tokio::test]
async fn reload_of_server_tls_settings_reopens_servers() {
    let certs = Certs::make(APP_USER);
    let cluster = app_cluster_with(ServerAuth::ScramSha256, |b| {
        b.tls(&certs.text("server.crt"), &certs.text("server.key"))
    });
    let config = |mode: &str| {
        ConfigBuilder::new()
            .database(
                "postgres",
                &format!("host=127.0.0.1 port={} dbname=postgres", cluster.port()),
            )
            .set("pool_mode", "transaction")
            .set("server_tls_sslmode", mode)
            .userlist(&[(APP_USER, APP_PASSWORD)])
    };
    let sluice = config("prefer").start();
    let client = connect(sluice.port(), APP_USER, APP_PASSWORD, "postgres")
        .await
        .expect("login");
    let ssl = "select ssl::text from pg_stat_ssl where pid = pg_backend_pid()";
    assert_eq!(scalar_text(&client, ssl).await, "true");
    sluice.rewrite_config(&config("disable").render());
    sluice.reload();
    let plain = eventually(std::time::Duration::from_secs(10), || async {
        (scalar_text(&client, ssl).await == "false").then_some(())
    })
    .await;
    assert!(plain.is_some(), "servers opened with TLS kept after RELOAD");
}

/// A server over TLS that sluice closes (here by RECONNECT) gets a Terminate
/// and close_notify, so PostgreSQL logs no broken connection.
#[tokio::test]
async fn servers_over_tls_are_closed_cleanly() {
    let certs = Certs::make(APP_USER);
    let cluster = tls_cluster(&certs, "server");
    let sluice = sluice_to(&cluster, "127.0.0.1", "require", &certs, "ca.crt");
    for _ in 0..3 {
        assert_eq!(ssl_in_use(sluice.port()).await.expect("login"), "true");
    }
    assert!(!show_servers_tls(sluice.port()).await.is_empty());
    let console = connect(sluice.port(), APP_USER, APP_PASSWORD, "pgbouncer")
        .await
        .expect("console");
    console.simple_query("RECONNECT").await.expect("RECONNECT");
    let closed = eventually(std::time::Duration::from_secs(10), || async {
        show_servers_tls(sluice.port())
            .await
            .is_empty()
            .then_some(())
    })
    .await;
    assert!(closed.is_some(), "servers still open after RECONNECT");
    // Give the backends a moment to log whatever they would.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let log = cluster.log_text();
    for broken in [
        "could not receive data from client",
        "unexpected EOF",
        "SSL error",
    ] {
        assert!(
            !log.contains(broken),
            "PostgreSQL logged {broken:?}:\n{log}"
        );
    }
}
