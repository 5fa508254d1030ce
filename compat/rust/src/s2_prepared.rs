//! Scenario 2: named prepared statements reused across transactions.
//!
//! tokio-postgres: `client.prepare()` parses a named statement (`s0`, `s1`…,
//! numbered process-wide) once; every later `query(&statement, …)` sends only
//! Bind/Execute. A plain `client.query(&str, …)` also prepares a named
//! statement, in its own round trip, then executes it and closes it.
//!
//! sqlx: every `sqlx::query(…)` is prepared as a named statement on first use
//! per connection and kept in the connection's statement cache (100 by
//! default); `Executor::prepare` does the same explicitly.

use sqlx::{Connection, Executor, SqlSafeStr, Statement};

use crate::common::*;
use crate::ensure_eq;

const WORKERS: usize = 16;
const ITERATIONS: i32 = 100;

pub async fn tokio_postgres_prepared() -> R {
    let schema = format!("{PREFIX}_s2_tp");
    reset_schemas(std::slice::from_ref(&schema)).await?;
    exec(&format!(
        "create table {schema}.log (worker int, i int, s text, primary key (worker, i))"
    ))
    .await?;

    run_workers(WORKERS, |w| {
        let schema = schema.clone();
        async move {
            let mut client = tp_connect().await?;
            let w = w as i32;
            // Prepared once, outside any transaction. The same texts on every
            // connection; two of them prepared twice on this one.
            let add_one = client.prepare("select $1::int + 1").await?;
            let add_one_again = client.prepare("select $1::int + 1").await?;
            let concat = client.prepare("select $1::text || $2::text").await?;
            let insert = client
                .prepare(&format!(
                    "insert into {schema}.log (worker, i, s) values ($1, $2, $3)"
                ))
                .await?;
            for i in 0..ITERATIONS {
                async {
                    let s = format!("w{w}-{i}");
                    let tx = client.transaction().await?;
                    let v: i32 = tx.query_one(&add_one, &[&i]).await?.get(0);
                    ensure_eq!(v, i + 1, "prepared select $1::int + 1");
                    let v: i32 = tx.query_one(&add_one_again, &[&(i + 1)]).await?.get(0);
                    ensure_eq!(v, i + 2, "the same text prepared again");
                    let got: String = tx
                        .query_one(&concat, &[&format!("w{w}-"), &i.to_string()])
                        .await?
                        .get(0);
                    ensure_eq!(got, s, "prepared select $1::text || $2::text");
                    ensure_eq!(tx.execute(&insert, &[&w, &i, &s]).await?, 1, "insert");
                    tx.commit().await?;

                    if i % 10 == 3 {
                        // Outside a transaction.
                        let v: i32 = client.query_one(&add_one, &[&-i]).await?.get(0);
                        ensure_eq!(v, 1 - i, "prepared select $1::int + 1 in autocommit");
                    }
                    if i % 7 == 5 {
                        // In a transaction that is rolled back.
                        let tx = client.transaction().await?;
                        let v: i32 = tx.query_one(&add_one, &[&i]).await?.get(0);
                        ensure_eq!(
                            v,
                            i + 1,
                            "prepared select $1::int + 1 in a rolled-back transaction"
                        );
                        tx.rollback().await?;
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
    check_log(&format!("{schema}.log")).await
}

/// `client.query(&str, params)` / `execute(&str, params)` outside
/// transactions: each call is Parse+Describe+Sync, then Bind+Execute+Sync,
/// then Close+Sync — three round trips, on whatever server the pooler picks.
pub async fn tokio_postgres_implicit() -> R {
    let schema = format!("{PREFIX}_s2_tp_implicit");
    reset_schemas(std::slice::from_ref(&schema)).await?;
    exec(&format!("create table {schema}.log (worker int, i int)")).await?;
    run_workers(8, |w| {
        let schema = schema.clone();
        async move {
            let client = tp_connect().await?;
            let w = w as i32;
            let insert = format!("insert into {schema}.log (worker, i) values ($1, $2)");
            for i in 0..50 {
                async {
                    let v: i32 = client.query_one("select $1::int * 2", &[&i]).await?.get(0);
                    ensure_eq!(v, i * 2, "select $1::int * 2");
                    ensure_eq!(client.execute(&insert, &[&w, &i]).await?, 1, "insert");
                    R::Ok(())
                }
                .await
                .map_err(at(i as usize))?;
            }
            Ok(())
        }
    })
    .await?;
    let n = count(&format!("select count(*) from {schema}.log")).await?;
    ensure_eq!(n, 8 * 50, "rows in {schema}.log");
    Ok(())
}

/// One client, with six others keeping the server pool busy: a statement
/// prepared inside a rolled-back transaction stays usable (statements are
/// not transactional), and statements survive errors around them.
pub async fn tokio_postgres_errors() -> R {
    let churn = Churn::start(6).await?;
    let result = async {
        let mut client = tp_connect().await?;

        let tx = client.transaction().await?;
        let times_ten = tx.prepare("select $1::int * 10").await?;
        let v: i32 = tx.query_one(&times_ten, &[&1]).await?.get(0);
        ensure_eq!(v, 10, "in the transaction that prepared it");
        tx.rollback().await?;
        for i in 0..30 {
            let v: i32 = if i % 2 == 0 {
                let tx = client.transaction().await?;
                let v = tx.query_one(&times_ten, &[&i]).await?.get(0);
                tx.commit().await?;
                v
            } else {
                client.query_one(&times_ten, &[&i]).await?.get(0)
            };
            ensure_eq!(v, i * 10, "select $1::int * 10 ({i}) after the rollback");
        }

        let div = client.prepare("select 100 / $1::int").await?;
        let v: i32 = client.query_one(&div, &[&4]).await?.get(0);
        ensure_eq!(v, 25, "100 / 4");
        expect_code("22012", "100 / 0", client.query_one(&div, &[&0])).await?;
        let v: i32 = client.query_one(&div, &[&5]).await?.get(0);
        ensure_eq!(v, 20, "100 / 5 after the error");
        {
            let tx = client.transaction().await?;
            let v: i32 = tx.query_one(&div, &[&10]).await?.get(0);
            ensure_eq!(v, 10, "100 / 10");
            expect_code(
                "22012",
                "100 / 0 in a transaction",
                tx.query_one(&div, &[&0]),
            )
            .await?;
            expect_code(
                "25P02",
                "in the failed transaction",
                tx.query_one(&div, &[&1]),
            )
            .await?;
            tx.rollback().await?;
        }
        for i in 1..=20 {
            let tx = client.transaction().await?;
            let v: i32 = tx.query_one(&div, &[&i]).await?.get(0);
            ensure_eq!(v, 100 / i, "100 / {i}");
            tx.commit().await?;
        }
        // A statement that fails to parse; the client goes on.
        expect_code(
            "42601",
            "prepare a syntax error",
            client.prepare("select from from"),
        )
        .await?;
        let again = client.prepare("select 7").await?;
        let v: i32 = client.query_one(&again, &[]).await?.get(0);
        ensure_eq!(v, 7, "a statement prepared after a failed one");
        R::Ok(())
    }
    .await;
    let stopped = churn.stop().await;
    result?;
    stopped
}

pub async fn sqlx_cache() -> R {
    let schema = format!("{PREFIX}_s2_sqlx");
    reset_schemas(std::slice::from_ref(&schema)).await?;
    exec(&format!(
        "create table {schema}.log (worker int, i int, s text, primary key (worker, i))"
    ))
    .await?;
    let pool = sqlx_pool(WORKERS as u32).await?;

    let result = run_workers(WORKERS, |w| {
        let pool = pool.clone();
        let schema = schema.clone();
        async move {
            let insert = format!("insert into {schema}.log (worker, i, s) values ($1, $2, $3)");
            // Even workers hold one pooled connection (and also prepare a
            // statement explicitly); odd ones use the pool for every query.
            let mut held = if w % 2 == 0 {
                Some(pool.acquire().await?)
            } else {
                None
            };
            let explicit = match held.as_mut() {
                Some(conn) => Some(
                    (&mut **conn)
                        .prepare("select $1::int * 5".into_sql_str())
                        .await?,
                ),
                None => None,
            };
            let w = w as i32;
            for i in 0..ITERATIONS {
                async {
                    let s = format!("w{w}-{i}");
                    let mut tx = match held.as_mut() {
                        Some(conn) => conn.begin().await?,
                        None => pool.begin().await?,
                    };
                    let v: i32 = sqlx::query_scalar("select $1::int + 1")
                        .bind(i)
                        .fetch_one(&mut *tx)
                        .await?;
                    ensure_eq!(v, i + 1, "select $1::int + 1");
                    let got: String = sqlx::query_scalar("select $1::text || $2::text")
                        .bind(format!("w{w}-"))
                        .bind(i.to_string())
                        .fetch_one(&mut *tx)
                        .await?;
                    ensure_eq!(got, s, "select $1::text || $2::text");
                    if let Some(stmt) = &explicit {
                        let v: i32 = stmt.query_scalar().bind(i).fetch_one(&mut *tx).await?;
                        ensure_eq!(v, i * 5, "explicitly prepared select $1::int * 5");
                    }
                    let done = sqlx::query(sqlx::AssertSqlSafe(insert.as_str()))
                        .bind(w)
                        .bind(i)
                        .bind(&s)
                        .execute(&mut *tx)
                        .await?;
                    ensure_eq!(done.rows_affected(), 1, "insert");
                    tx.commit().await?;

                    if i % 10 == 3 {
                        let q = sqlx::query_scalar("select $1::int + 1").bind(-i);
                        let v: i32 = match held.as_mut() {
                            Some(conn) => q.fetch_one(&mut **conn).await?,
                            None => q.fetch_one(&pool).await?,
                        };
                        ensure_eq!(v, 1 - i, "select $1::int + 1 in autocommit");
                    }
                    if i % 7 == 5 {
                        let mut tx = match held.as_mut() {
                            Some(conn) => conn.begin().await?,
                            None => pool.begin().await?,
                        };
                        let v: i32 = sqlx::query_scalar("select $1::int + 1")
                            .bind(i)
                            .fetch_one(&mut *tx)
                            .await?;
                        ensure_eq!(v, i + 1, "select $1::int + 1 in a rolled-back transaction");
                        tx.rollback().await?;
                    }
                    R::Ok(())
                }
                .await
                .map_err(at(i as usize))?;
            }
            if let Some(conn) = held.as_ref() {
                let cached = conn.cached_statements_size();
                crate::ensure!(
                    cached >= 4,
                    "sqlx cached {cached} statements on a held connection, expected at least 4"
                );
            }
            Ok(())
        }
    })
    .await;
    pool.close().await;
    result?;
    check_log(&format!("{schema}.log")).await
}

async fn check_log(table: &str) -> R {
    let n = count(&format!("select count(*) from {table}")).await?;
    ensure_eq!(n, WORKERS as i64 * i64::from(ITERATIONS), "rows in {table}");
    let good = count(&format!(
        "select count(*) from {table} where s = 'w' || worker || '-' || i"
    ))
    .await?;
    ensure_eq!(good, n, "rows with the right text in {table}");
    Ok(())
}
