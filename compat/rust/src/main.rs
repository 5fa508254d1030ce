//! tokio-postgres and sqlx compatibility suite for sluice (transaction
//! pooling). Runs every check in order, prints `ok` or `FAIL` for each and
//! exits non-zero if any failed. `COMPAT_RUST_ONLY=<text>` runs only the
//! checks whose name contains `<text>`.

mod common;
mod s1_workers;
mod s2_prepared;
mod s3_rollback;
mod s4_settings;
mod s5_notify;
mod s6_copy;
mod s7_cancel;
mod s8_restart;

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use common::R;

type Check = fn() -> Pin<Box<dyn Future<Output = R> + Send>>;

macro_rules! checks {
    ($($name:literal => $f:path),* $(,)?) => {
        vec![$(($name, (|| Box::pin($f())) as Check)),*]
    };
}

/// Deadline for one check (each wait inside has its own, shorter one).
const CHECK_TIMEOUT: Duration = Duration::from_secs(100);

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() {
    let checks: Vec<(&str, Check)> = checks![
        "1 tokio-postgres: 24 clients x 200 parameterized queries (unnamed) and transactions" => s1_workers::tokio_postgres,
        "1 sqlx: 24 workers x 200 queries and transactions on a PgPool (cached statements)" => s1_workers::sqlx,
        "2 tokio-postgres: statements prepared once, executed in many transactions by 16 clients" => s2_prepared::tokio_postgres_prepared,
        "2 tokio-postgres: client.query(&str) outside transactions (implicit statement sN: prepare, execute, close)" => s2_prepared::tokio_postgres_implicit,
        "2 tokio-postgres: a statement prepared in a rolled-back transaction, and after errors" => s2_prepared::tokio_postgres_errors,
        "2 sqlx: the statement cache reused across transactions by 16 workers on a PgPool" => s2_prepared::sqlx_cache,
        "3 tokio-postgres: failed transactions rolled back and retried; rolled-back writes absent" => s3_rollback::tokio_postgres,
        "3 sqlx: workers racing for the same keys retry on unique violations" => s3_rollback::sqlx_race,
        "4 tokio-postgres: session SETs follow 8 concurrent clients; SET LOCAL and rolled-back SET" => s4_settings::tokio_postgres,
        "4 sqlx: SET search_path on a PgConnection follows it across transactions" => s4_settings::sqlx,
        "4 tokio-postgres: new connections do not inherit other clients' settings" => s4_settings::no_leak,
        "5 tokio-postgres: LISTEN (poll_message) gets committed notifications once, none rolled back, none after UNLISTEN" => s5_notify::tokio_postgres,
        "5 sqlx: PgListener gets committed notifications once while running transactions; none after UNLISTEN" => s5_notify::sqlx,
        "6 tokio-postgres: copy_in of 5000 rows and copy_out, in a transaction" => s6_copy::tokio_postgres_in_transaction,
        "6 tokio-postgres: copy_in / copy_out outside a transaction" => s6_copy::tokio_postgres_autocommit,
        "6 sqlx: copy_in_raw / copy_out_raw, a failing COPY, concurrent COPYs" => s6_copy::sqlx,
        "7 tokio-postgres: cancel_token().cancel_query(NoTls) cancels pg_sleep(30), and only it" => s7_cancel::tokio_postgres,
        "7 sqlx: SET LOCAL statement_timeout cancels pg_sleep(30)" => s7_cancel::sqlx_statement_timeout,
        "8 restart under load, unnamed statements (tokio-postgres): every client recovers within 20 s" => s8_restart::unnamed,
        "8 restart under load, statements prepared before it (tokio-postgres prepare, sqlx cache): every worker recovers within 20 s" => s8_restart::prepared,
    ];

    let only = std::env::var("COMPAT_RUST_ONLY").unwrap_or_default();
    let started = Instant::now();
    let mut failed = Vec::new();
    let mut ran = 0;
    for (name, check) in checks {
        if !name.contains(only.as_str()) {
            continue;
        }
        ran += 1;
        let t0 = Instant::now();
        let result = match tokio::time::timeout(CHECK_TIMEOUT, check()).await {
            Ok(r) => r,
            Err(_) => Err(common::Error::msg(format!(
                "timed out after {CHECK_TIMEOUT:?}"
            ))),
        };
        let ms = t0.elapsed().as_millis();
        match &result {
            Ok(()) => println!("ok   {name} ({ms} ms)"),
            Err(_) => println!("FAIL {name} ({ms} ms)"),
        }
        if let Err(e) = &result {
            for line in e.message.lines() {
                println!("     {line}");
            }
            failed.push(name);
        }
        for note in common::take_notes() {
            for line in note.lines() {
                println!("     | {line}");
            }
        }
    }
    println!(
        "\n{} of {ran} checks passed in {:.1} s",
        ran - failed.len(),
        started.elapsed().as_secs_f64()
    );
    if ran == 0 {
        println!("no check matches COMPAT_RUST_ONLY={only:?}");
        std::process::exit(2);
    }
    if !failed.is_empty() {
        println!("failed:");
        for name in &failed {
            println!("  {name}");
        }
        std::process::exit(1);
    }
}
