//! Scenario 8: PostgreSQL restarted (`COMPAT_RESTART_CMD`, pg_ctl restart -m
//! fast) while workers run transactions. Errors in the restart window are
//! allowed (the workers retry with backoff); within 20 s after the restart
//! every worker must complete transactions again.
//!
//! tokio-postgres workers hold one client each and replace it only when the
//! connection itself is gone: after a server error on a live connection
//! (such as "prepared statement does not exist") they keep the client and
//! its prepared statement. sqlx workers use a PgPool, which replaces broken
//! connections by itself and keeps a statement cache per connection.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::postgres::PgPool;
use tokio_postgres::Client;
use tokio_postgres::types::Type;

use crate::common::*;
use crate::{ensure, ensure_eq};

const RECOVERY: Duration = Duration::from_secs(20);
const AFTER_RESTART: u64 = 5;
const SQL: &str = "select $1::int + 1";

#[derive(Default)]
struct WorkerState {
    kind: &'static str,
    ok: u64,
    ok_after: u64,
    errors: Vec<String>,
    last_error: Option<String>,
    /// Transactions after the restart on a client that prepared its
    /// statement before it.
    survivor_ok: u64,
}

struct Shared {
    workers: Vec<Mutex<WorkerState>>,
    restart_started: AtomicBool,
    restarted: AtomicBool,
    stop: AtomicBool,
}

impl Shared {
    fn report(&self) -> String {
        self.workers
            .iter()
            .enumerate()
            .map(|(w, s)| {
                let s = s.lock().unwrap();
                format!(
                    "  worker {w} ({}): {} ok ({} after the restart), last error: {}",
                    s.kind,
                    s.ok,
                    s.ok_after,
                    s.last_error.as_deref().unwrap_or("none")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

fn connection_lost(e: &Error, client: Option<&Client>) -> bool {
    client.is_none_or(Client::is_closed)
        || match e.code.as_deref() {
            None => true,
            Some(code) => code.starts_with("08") || code.starts_with("57P0"),
        }
}

async fn restart_postgres() -> R {
    let cmd = std::env::var("COMPAT_RESTART_CMD")
        .map_err(|_| Error::msg("COMPAT_RESTART_CMD is not set"))?;
    let out = within(
        Duration::from_secs(90),
        "COMPAT_RESTART_CMD",
        tokio::process::Command::new("sh")
            .arg("-c")
            .arg(&cmd)
            .kill_on_drop(true)
            .output(),
    )
    .await??;
    ensure!(
        out.status.success(),
        "restart failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

fn record(shared: &Shared, w: usize, result: &R, started_after: bool, survivor: bool) {
    let mut s = shared.workers[w].lock().unwrap();
    match result {
        Ok(()) => {
            s.ok += 1;
            if started_after {
                s.ok_after += 1;
                if survivor {
                    s.survivor_ok += 1;
                }
            }
        }
        Err(e) => {
            s.errors.push(e.message.clone());
            s.last_error = Some(e.message.clone());
        }
    }
}

async fn tp_worker(shared: Arc<Shared>, w: usize, table: String, named: bool) {
    let mut client: Option<Client> = None;
    let mut stmt = None;
    let mut prepared_before = false;
    let mut backoff = Duration::from_millis(50);
    let mut n = 0i32;
    while !shared.stop.load(Ordering::Relaxed) {
        let started_before = !shared.restart_started.load(Ordering::Relaxed);
        let started_after = shared.restarted.load(Ordering::Relaxed);
        let result = within(Duration::from_secs(5), "transaction", async {
            if client.is_none() {
                let c = tp_connect().await?;
                stmt = if named {
                    Some(c.prepare(SQL).await?)
                } else {
                    None
                };
                client = Some(c);
                prepared_before = false;
            }
            let c = client.as_mut().expect("connected");
            let tx = c.transaction().await?;
            let v: i32 = match &stmt {
                Some(stmt) => tx.query_one(stmt, &[&n]).await?.get(0),
                None => tx.query_typed_one(SQL, &[(&n, Type::INT4)]).await?.get(0),
            };
            ensure_eq!(v, n + 1, "{SQL} with {n}");
            let w32 = w as i32;
            tx.query_typed(
                &format!("insert into {table} (worker, n) values ($1, $2)"),
                &[(&w32, Type::INT4), (&n, Type::INT4)],
            )
            .await?;
            tx.commit().await?;
            R::Ok(())
        })
        .await
        .and_then(|r| r);
        n += 1;
        let survivor = named && prepared_before;
        record(&shared, w, &result, started_after, survivor);
        match &result {
            Ok(()) => {
                if named && started_before {
                    prepared_before = true;
                }
                backoff = Duration::from_millis(50);
            }
            Err(e) => {
                if connection_lost(e, client.as_ref()) {
                    client = None;
                    stmt = None;
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn sqlx_worker(shared: Arc<Shared>, w: usize, table: String, pool: PgPool) {
    let insert = format!("insert into {table} (worker, n) values ($1, $2)");
    let mut backoff = Duration::from_millis(50);
    let mut n = 0i32;
    while !shared.stop.load(Ordering::Relaxed) {
        let started_after = shared.restarted.load(Ordering::Relaxed);
        let result = within(Duration::from_secs(5), "transaction", async {
            let mut tx = pool.begin().await?;
            let v: i32 = sqlx::query_scalar(SQL).bind(n).fetch_one(&mut *tx).await?;
            ensure_eq!(v, n + 1, "{SQL} with {n}");
            sqlx::query(sqlx::AssertSqlSafe(insert.as_str()))
                .bind(w as i32)
                .bind(n)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            R::Ok(())
        })
        .await
        .and_then(|r| r);
        n += 1;
        record(&shared, w, &result, started_after, false);
        if result.is_ok() {
            backoff = Duration::from_millis(50);
        } else {
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(1));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn restart_under_load(
    table_name: &str,
    tp_workers: usize,
    sqlx_workers: usize,
    named: bool,
) -> R {
    let schema = format!("{PREFIX}_s8");
    let table = format!("{schema}.{table_name}");
    exec(&format!(
        "create schema if not exists {schema}; drop table if exists {table};
         create table {table} (worker int not null, n int not null);"
    ))
    .await?;
    let pool = if sqlx_workers > 0 {
        Some(sqlx_pool(sqlx_workers as u32).await?)
    } else {
        None
    };

    let shared = Arc::new(Shared {
        workers: (0..tp_workers + sqlx_workers)
            .map(|w| {
                Mutex::new(WorkerState {
                    kind: if w < tp_workers {
                        "tokio-postgres client"
                    } else {
                        "sqlx PgPool"
                    },
                    ..Default::default()
                })
            })
            .collect(),
        restart_started: AtomicBool::new(false),
        restarted: AtomicBool::new(false),
        stop: AtomicBool::new(false),
    });
    let mut tasks = Vec::new();
    for w in 0..tp_workers + sqlx_workers {
        let shared = shared.clone();
        let table = table.clone();
        tasks.push(if w < tp_workers {
            tokio::spawn(tp_worker(shared, w, table, named))
        } else {
            tokio::spawn(sqlx_worker(shared, w, table, pool.clone().expect("pool")))
        });
    }

    let outcome = async {
        let all = |min: u64, after: bool| {
            shared.workers.iter().all(|s| {
                let s = s.lock().unwrap();
                (if after { s.ok_after } else { s.ok }) >= min
            })
        };
        if wait_for(Duration::from_secs(10), "warm-up", || all(10, false)).await.is_err() {
            return Err(Error::msg(format!(
                "not every worker completed 10 transactions before the restart:\n{}",
                shared.report()
            )));
        }
        let errors_before: Vec<String> = shared
            .workers
            .iter()
            .flat_map(|s| s.lock().unwrap().errors.clone())
            .collect();
        ensure!(
            errors_before.is_empty(),
            "errors before the restart:\n{}",
            summarize(&errors_before)
        );

        let t0 = Instant::now();
        shared.restart_started.store(true, Ordering::Relaxed);
        restart_postgres().await?;
        shared.restarted.store(true, Ordering::Relaxed);
        let restart_took = t0.elapsed();
        let t1 = Instant::now();
        if wait_for(RECOVERY, "recovery", || all(AFTER_RESTART, true)).await.is_err() {
            return Err(Error::msg(format!(
                "not every worker completed {AFTER_RESTART} transactions within {RECOVERY:?} after the restart:\n{}",
                shared.report()
            )));
        }
        R::Ok((restart_took, t1.elapsed()))
    }
    .await;
    shared.stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = within(Duration::from_secs(15), "worker to stop", t).await;
    }
    if let Some(pool) = pool {
        let _ = within(Duration::from_secs(10), "pool close", pool.close()).await;
    }
    let (restart_took, recovered) = outcome?;

    let (mut total, mut errors, mut survivors) = (0u64, Vec::new(), 0u64);
    for s in &shared.workers {
        let s = s.lock().unwrap();
        total += s.ok;
        errors.extend(s.errors.iter().cloned());
        survivors += s.survivor_ok;
    }
    note(format!(
        "pg_ctl restart took {restart_took:?}; every worker recovered {recovered:?} after it; {total} transactions, {} errors",
        errors.len()
    ));
    if named {
        note(format!(
            "transactions after the restart on tokio-postgres clients that prepared their statement before it: {survivors}"
        ));
    }
    if !errors.is_empty() {
        note(format!(
            "errors during the restart:\n{}",
            summarize(&errors)
        ));
    }
    // Every transaction seen committed is there; a COMMIT whose reply was
    // lost in the restart may have committed too.
    let n = count(&format!("select count(*) from {table}")).await?;
    ensure!(
        n as u64 >= total,
        "{n} rows for {total} committed transactions"
    );
    ensure!(
        n as u64 <= total + errors.len() as u64,
        "{n} rows, at most {} expected",
        total + errors.len() as u64
    );
    Ok(())
}

/// Unnamed statements only (`query_typed`).
pub async fn unnamed() -> R {
    restart_under_load("ticks_unnamed", 6, 0, false).await
}

/// tokio-postgres statements prepared before the restart, and sqlx's cache.
pub async fn prepared() -> R {
    restart_under_load("ticks_prepared", 4, 4, true).await
}
