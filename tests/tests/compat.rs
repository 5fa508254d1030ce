//! The driver suites under `compat/`, each in its own language, run against
//! sluice in transaction mode with the driver's default settings.
//!
//! Each test starts its own PostgreSQL (SCRAM, a database `compat` owned by
//! [`APP_USER`]) and its own sluice (transaction pooling, a pool of 4 so
//! that clients keep changing servers), then runs `compat/<suite>/run.sh
//! test` with the connection in the environment:
//!
//! | variable | value |
//! |---|---|
//! | `PGHOST`, `PGPORT`, `PGUSER`, `PGPASSWORD`, `PGDATABASE` | sluice |
//! | `COMPAT_DSN` | `postgres://app:…@127.0.0.1:<sluice>/compat` |
//! | `COMPAT_DIRECT_PORT` | PostgreSQL itself, same user and database |
//! | `COMPAT_RESTART_CMD` | a `sh -c` line restarting PostgreSQL (`pg_ctl restart -m fast`) |
//! | `COMPAT_POOL_SIZE` | sluice's `default_pool_size` |
//!
//! The go suite also runs over TLS (`compat_go_pgx_over_tls_verify_full`):
//! clients must use TLS and verify sluice's certificate (`sslmode=
//! verify-full`, `sslrootcert=` in the DSN and `PGSSLMODE`/`PGSSLROOTCERT`),
//! and sluice verifies PostgreSQL's (`server_tls_sslmode = verify-full`),
//! PostgreSQL serving TLS with a certificate from the same test CA.
//!
//! With `SLUICE_COMPAT_TARGET=direct` the suite is pointed at PostgreSQL
//! itself instead (same variables), to check that what a suite expects is
//! what PostgreSQL does.
//!
//! `make test` runs `compat/build.sh` first, so dependencies are fetched and
//! compiled before the suites run in parallel with the other tests.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use sluice_tests::*;

/// Pool size behind the suites: smaller than their worker counts.
const POOL_SIZE: u32 = 4;
/// Deadline for one suite (dependencies are already built).
const SUITE_DEADLINE: Duration = Duration::from_secs(15 * 60);

fn compat_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent directory")
        .join("compat")
}

fn run_suite(suite: &str) {
    run_suite_with(suite, None);
}

fn run_suite_with(suite: &str, certs: Option<&Certs>) {
    let cluster = match certs {
        None => app_cluster(ServerAuth::ScramSha256),
        Some(c) => app_cluster_with(ServerAuth::ScramSha256, |b| {
            b.tls(&c.text("server.crt"), &c.text("server.key"))
        }),
    };
    cluster
        .psql(
            "postgres",
            &format!("create database compat owner {APP_USER}"),
        )
        .expect("create database compat");
    let mut builder = ConfigBuilder::new()
        .database_on(&cluster, "compat", "")
        .set("pool_mode", "transaction")
        .set("auth_type", "scram-sha-256")
        .set("auth_file", "@DIR@/userlist.txt")
        .set("default_pool_size", &POOL_SIZE.to_string())
        .set("max_client_conn", "2000")
        .set("query_wait_timeout", "60")
        .userlist(&[(APP_USER, APP_PASSWORD)]);
    if let Some(c) = certs {
        builder = builder
            .set("client_tls_sslmode", "require")
            .set("client_tls_cert_file", &c.path("server.crt"))
            .set("client_tls_key_file", &c.path("server.key"))
            .set("server_tls_sslmode", "verify-full")
            .set("server_tls_ca_file", &c.path("ca.crt"));
    }
    let sluice = builder.start();
    let restart = cluster
        .restart_command_line()
        .expect("pg_ctl for the restart command");

    let port = match std::env::var("SLUICE_COMPAT_TARGET").as_deref() {
        Ok("direct") => cluster.port(),
        _ => sluice.port(),
    };
    let tls_query = certs.map_or(String::new(), |c| {
        format!("?sslmode=verify-full&sslrootcert={}", c.path("ca.crt"))
    });
    let script = compat_dir().join(suite).join("run.sh");
    let mut cmd = Command::new("bash");
    cmd.arg(&script)
        .arg("test")
        .current_dir(compat_dir().join(suite));
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("PG") {
            cmd.env_remove(&key);
        }
    }
    cmd.env("PGHOST", "127.0.0.1")
        .env("PGPORT", port.to_string())
        .env("PGUSER", APP_USER)
        .env("PGPASSWORD", APP_PASSWORD)
        .env("PGDATABASE", "compat")
        .env(
            "COMPAT_DSN",
            format!("postgres://{APP_USER}:{APP_PASSWORD}@127.0.0.1:{port}/compat{tls_query}"),
        )
        .env("COMPAT_DIRECT_PORT", cluster.port().to_string())
        .env("COMPAT_RESTART_CMD", restart)
        .env("COMPAT_POOL_SIZE", POOL_SIZE.to_string());
    if let Some(c) = certs {
        cmd.env("PGSSLMODE", "verify-full")
            .env("PGSSLROOTCERT", c.path("ca.crt"));
    }
    let output = run_tool(cmd, SUITE_DEADLINE);
    assert!(
        output.success(),
        "compat/{suite} failed ({}):\n--- stdout ---\n{}\n--- stderr ---\n{}\n--- sluice log ---\n{}",
        output.status,
        output.stdout,
        output.stderr,
        sluice.log_tail(80)
    );
    println!("{}", output.stdout);
}

#[test]
fn compat_python_psycopg_and_asyncpg() {
    run_suite("python");
}

#[test]
fn compat_go_pgx() {
    run_suite("go");
}

#[test]
fn compat_go_pgx_over_tls_verify_full() {
    let certs = Certs::make(APP_USER);
    run_suite_with("go", Some(&certs));
}

#[test]
fn compat_java_pgjdbc_hikaricp() {
    run_suite("java");
}

#[test]
fn compat_node_postgres() {
    run_suite("node");
}

#[test]
fn compat_rust_tokio_postgres_and_sqlx() {
    run_suite("rust");
}
