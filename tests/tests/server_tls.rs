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
        .userlist(&[(APP_USER, APP_PASSWORD)])
        .start()
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

    let plain = app_cluster(ServerAuth::ScramSha256);
    let sluice = sluice_to(&plain, "127.0.0.1", "prefer", &certs, "ca.crt");
    assert_eq!(ssl_in_use(sluice.port()).await.expect("login"), "false");

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
