//! The configuration issue 11 names as the one that kept operators on
//! PgBouncer: TLS both ways (clients must use it; servers verified with
//! verify-full), passwords only in PostgreSQL (`auth_user` + PgBouncer's
//! classic `auth_query` on pg_shadow, SCRAM secrets) and an
//! `auth_hba_file`, written as PgBouncer's documentation has it. sluice
//! starts from it unchanged and serves psql and pgbench over TLS, and the
//! application user's password is nowhere in sluice's files.

use sluice_tests::*;

const AUTH_USER: &str = "pgbouncer_auth";
const AUTH_PASSWORD: &str = "auth-pw";

#[tokio::test]
async fn a_pgbouncer_ini_with_tls_both_ways_auth_query_and_hba_serves_psql_and_pgbench() {
    let certs = Certs::make(APP_USER);
    let cluster = app_cluster_with(ServerAuth::ScramSha256, |b| {
        b.tls(&certs.text("server.crt"), &certs.text("server.key"))
            .tls_only()
    });
    cluster
        .psql(
            "postgres",
            &format!("create role {AUTH_USER} login superuser password '{AUTH_PASSWORD}'"),
        )
        .expect("auth user");
    std::fs::write(
        certs.file("hba.conf"),
        "hostssl all all 127.0.0.1/32 scram-sha-256\n",
    )
    .expect("hba");
    let sluice = ConfigBuilder::new()
        .database("*", &format!("host=127.0.0.1 port={}", cluster.port()))
        .set("pool_mode", "transaction")
        .set("auth_type", "hba")
        .set("auth_hba_file", &certs.path("hba.conf"))
        .set("auth_user", AUTH_USER)
        .set(
            "auth_query",
            "SELECT usename, passwd FROM pg_shadow WHERE usename=$1",
        )
        .set("client_tls_sslmode", "require")
        .set("client_tls_key_file", &certs.path("server.key"))
        .set("client_tls_cert_file", &certs.path("server.crt"))
        .set("client_tls_ca_file", &certs.path("ca.crt"))
        .set("server_tls_sslmode", "verify-full")
        .set("server_tls_ca_file", &certs.path("ca.crt"))
        // Only the auth user's password is in sluice's files.
        .userlist(&[(AUTH_USER, AUTH_PASSWORD)])
        .start();
    let port = sluice.port();

    let conninfo = format!(
        "host=localhost port={port} user={APP_USER} dbname=postgres sslmode=verify-full \
         sslrootcert={} channel_binding=require",
        certs.path("ca.crt")
    );
    let out = tokio::task::spawn_blocking(move || {
        psql_conninfo(
            &conninfo,
            APP_PASSWORD,
            "select current_user || ' ' || ssl::text from pg_stat_ssl where pid = pg_backend_pid()",
        )
    })
    .await
    .expect("psql task");
    assert!(
        out.success(),
        "psql over TLS: {}\n{}",
        out.stderr,
        sluice.log()
    );
    assert_eq!(out.stdout.trim(), format!("{APP_USER} true"));

    pgbench_select_one_ok(
        &certs.file(""),
        port,
        &["-c", "8", "-j", "2", "-T", "3", "-M", "prepared"],
        &[("PGSSLMODE", "require")],
    )
    .await;
    // Plain TCP is refused.
    expect_sqlstate(
        connect(port, APP_USER, APP_PASSWORD, "postgres").await,
        "08P01",
    );
}
