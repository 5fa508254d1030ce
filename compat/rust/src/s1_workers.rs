//! Scenario 1: many concurrent workers (more than the server pool of 4)
//! running parameterized queries and transactions; results and row counts
//! checked.

use tokio_postgres::types::Type;

use crate::common::*;
use crate::{ensure, ensure_eq};

const WORKERS: usize = 24;
const ITERATIONS: i32 = 200;

/// tokio-postgres has no pool: one client per worker. Outside transactions
/// `query_typed` (the unnamed statement, one round trip); inside them
/// `query`/`execute` with a `&str`, which tokio-postgres prepares as a named
/// statement, runs and closes — all within the transaction.
pub async fn tokio_postgres() -> R {
    let schema = format!("{PREFIX}_s1_tp");
    reset_schemas(std::slice::from_ref(&schema)).await?;
    exec(&format!(
        "create table {schema}.items (worker int, i int, v bigint, primary key (worker, i))"
    ))
    .await?;

    let table = format!("{schema}.items");
    run_workers(WORKERS, |w| {
        let table = table.clone();
        async move {
            let mut client = tp_connect().await?;
            let w = w as i32;
            for i in 0..ITERATIONS {
                async {
                    let who = format!("w{w}");
                    let row = client
                        .query_typed_one(
                            "select $1::int + 1 as v, $2::text as who",
                            &[(&i, Type::INT4), (&who, Type::TEXT)],
                        )
                        .await?;
                    ensure_eq!(row.get::<_, i32>(0), i + 1, "select $1::int + 1");
                    ensure_eq!(row.get::<_, String>(1), who, "select $2::text");
                    if i % 2 == 0 {
                        let tx = client.transaction().await?;
                        let n = tx
                            .execute(
                                &format!("insert into {table} (worker, i, v) values ($1, $2, $3)"),
                                &[&w, &i, &(i64::from(i) * i64::from(w))],
                            )
                            .await?;
                        ensure_eq!(n, 1, "inserted rows");
                        let row = tx
                            .query_one(
                                &format!("select count(*) from {table} where worker = $1"),
                                &[&w],
                            )
                            .await?;
                        ensure_eq!(
                            row.get::<_, i64>(0),
                            i64::from(i / 2 + 1),
                            "own rows visible inside the transaction"
                        );
                        tx.commit().await?;
                    }
                    R::Ok(())
                }
                .await
                .map_err(at(i as usize))?;
            }
            Ok(())
        }
    })
    .await?;
    check_items(&table).await
}

/// sqlx: a `PgPool` of 24 with its defaults; `sqlx::query(…).bind(…)` is
/// prepared once per connection and cached (named statements), in and out of
/// transactions.
pub async fn sqlx() -> R {
    let schema = format!("{PREFIX}_s1_sqlx");
    reset_schemas(std::slice::from_ref(&schema)).await?;
    exec(&format!(
        "create table {schema}.items (worker int, i int, v bigint, primary key (worker, i))"
    ))
    .await?;
    let pool = sqlx_pool(WORKERS as u32).await?;

    let result = run_workers(WORKERS, |w| {
        let pool = pool.clone();
        let schema = schema.clone();
        async move {
            let w = w as i32;
            let insert = format!("insert into {schema}.items (worker, i, v) values ($1, $2, $3)");
            let count = format!("select count(*) from {schema}.items where worker = $1");
            for i in 0..ITERATIONS {
                async {
                    let (v, who): (i32, String) =
                        sqlx::query_as("select $1::int + 1 as v, $2::text as who")
                            .bind(i)
                            .bind(format!("w{w}"))
                            .fetch_one(&pool)
                            .await?;
                    ensure_eq!(v, i + 1, "select $1::int + 1");
                    ensure_eq!(who, format!("w{w}"), "select $2::text");
                    if i % 2 == 0 {
                        let mut tx = pool.begin().await?;
                        let done = sqlx::query(sqlx::AssertSqlSafe(insert.as_str()))
                            .bind(w)
                            .bind(i)
                            .bind(i64::from(i) * i64::from(w))
                            .execute(&mut *tx)
                            .await?;
                        ensure_eq!(done.rows_affected(), 1, "inserted rows");
                        let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(count.as_str()))
                            .bind(w)
                            .fetch_one(&mut *tx)
                            .await?;
                        ensure_eq!(
                            n,
                            i64::from(i / 2 + 1),
                            "own rows visible inside the transaction"
                        );
                        tx.commit().await?;
                    }
                    R::Ok(())
                }
                .await
                .map_err(at(i as usize))?;
            }
            Ok(())
        }
    })
    .await;
    pool.close().await;
    result?;
    check_items(&format!("{schema}.items")).await
}

async fn check_items(table: &str) -> R {
    let per_worker = i64::from(ITERATIONS / 2);
    let n = count(&format!("select count(*) from {table}")).await?;
    ensure_eq!(n, WORKERS as i64 * per_worker, "rows in {table}");
    let workers = count(&format!("select count(distinct worker) from {table}")).await?;
    ensure_eq!(workers, WORKERS as i64, "workers with rows in {table}");
    let sum = count(&format!("select sum(v) from {table}")).await?;
    let mut expected = 0i64;
    for w in 0..WORKERS as i64 {
        for i in (0..i64::from(ITERATIONS)).step_by(2) {
            expected += i * w;
        }
    }
    ensure!(
        sum == expected,
        "sum(v) in {table}: {sum}, expected {expected}"
    );
    Ok(())
}
