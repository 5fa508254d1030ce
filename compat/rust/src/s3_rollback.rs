//! Scenario 3: transactions that fail are rolled back and retried; after a
//! rollback the connection works and the rolled-back writes are absent.

use tokio_postgres::types::Type;

use crate::common::*;
use crate::ensure_eq;

const WORKERS: usize = 8;
const ITERATIONS: i32 = 40;

pub async fn tokio_postgres() -> R {
    let schema = format!("{PREFIX}_s3_tp");
    reset_schemas(std::slice::from_ref(&schema)).await?;
    exec(&format!(
        "create table {schema}.accounts (id int primary key, worker int not null);
         create table {schema}.side (worker int, i int);"
    ))
    .await?;

    run_workers(WORKERS, |w| {
        let schema = schema.clone();
        async move {
            let mut client = tp_connect().await?;
            let w = w as i32;
            let insert = format!("insert into {schema}.accounts (id, worker) values ($1, $2)");
            let side = format!("insert into {schema}.side (worker, i) values ($1, $2)");
            let exists = format!("select count(*) from {schema}.accounts where id = $1");
            for i in 0..ITERATIONS {
                async {
                    let id = w * 1000 + i;
                    // Attempt 1: the second insert collides with the worker's
                    // first row (with itself on iteration 0).
                    {
                        let tx = client.transaction().await?;
                        tx.execute(&insert, &[&id, &w]).await?;
                        tx.execute(&side, &[&w, &i]).await?;
                        expect_code(
                            "23505",
                            "duplicate key",
                            tx.execute(&insert, &[&(w * 1000), &w]),
                        )
                        .await?;
                        expect_code(
                            "25P02",
                            "in the failed transaction",
                            tx.batch_execute("select 1"),
                        )
                        .await?;
                        tx.rollback().await?;
                    }
                    let n: i64 = client
                        .query_typed_one(&exists, &[(&id, Type::INT4)])
                        .await?
                        .get(0);
                    ensure_eq!(n, 0, "the rolled-back insert is absent");

                    // Attempt 2 succeeds.
                    let tx = client.transaction().await?;
                    tx.execute(&insert, &[&id, &w]).await?;
                    tx.commit().await?;

                    match i % 4 {
                        1 => {
                            // An explicit error after a write.
                            let tx = client.transaction().await?;
                            tx.execute(&side, &[&w, &-i]).await?;
                            expect_code(
                                "22012",
                                "1 / 0",
                                tx.query_one("select 1 / $1::int", &[&0]),
                            )
                            .await?;
                            tx.rollback().await?;
                        }
                        2 => {
                            // A healthy transaction rolled back on purpose
                            // (by dropping it, which sends ROLLBACK).
                            let tx = client.transaction().await?;
                            tx.execute(&side, &[&w, &-i]).await?;
                            drop(tx);
                        }
                        3 => {
                            // A savepoint rolled back, the rest committed.
                            let mut tx = client.transaction().await?;
                            {
                                let sp = tx.savepoint("sp").await?;
                                sp.execute(&side, &[&w, &-i]).await?;
                                expect_code(
                                    "23505",
                                    "duplicate key in a savepoint",
                                    sp.execute(&insert, &[&id, &w]),
                                )
                                .await?;
                                sp.rollback().await?;
                            }
                            let v: i32 = tx.query_one("select $1::int * 2", &[&i]).await?.get(0);
                            ensure_eq!(v, i * 2, "after rollback to savepoint");
                            tx.commit().await?;
                        }
                        _ => {}
                    }
                    let v: i32 = client
                        .query_typed_one("select $1::int", &[(&i, Type::INT4)])
                        .await?
                        .get(0);
                    ensure_eq!(v, i, "the connection works after the rollback");
                    R::Ok(())
                }
                .await
                .map_err(at(i as usize))?;
            }
            Ok(())
        }
    })
    .await?;

    let n = count(&format!("select count(*) from {schema}.accounts")).await?;
    ensure_eq!(n, WORKERS as i64 * i64::from(ITERATIONS), "committed rows");
    let n = count(&format!("select count(*) from {schema}.side")).await?;
    ensure_eq!(n, 0, "rows from rolled-back transactions and savepoints");
    Ok(())
}

/// Eight sqlx workers on a PgPool race for slots 0..200: read the next free
/// slot, insert it; the loser of a race gets 23505, rolls back and retries.
pub async fn sqlx_race() -> R {
    const SLOTS: i32 = 200;
    let schema = format!("{PREFIX}_s3_sqlx");
    reset_schemas(std::slice::from_ref(&schema)).await?;
    exec(&format!(
        "create table {schema}.slots (slot int primary key, worker int not null)"
    ))
    .await?;
    let pool = sqlx_pool(WORKERS as u32).await?;
    // Everyone starts racing at once, each with a connection of its own
    // already open.
    let start = std::sync::Arc::new(tokio::sync::Barrier::new(WORKERS));
    let result = run_workers(WORKERS, |w| {
        let pool = pool.clone();
        let schema = schema.clone();
        let start = start.clone();
        async move {
            let conn = pool.acquire().await?;
            start.wait().await;
            drop(conn);
            let next_sql = format!("select coalesce(max(slot), -1) + 1 from {schema}.slots");
            let insert = format!("insert into {schema}.slots (slot, worker) values ($1, $2)");
            let (mut won, mut conflicts) = (0, 0);
            for attempt in 0..10 * SLOTS {
                let done = async {
                    let mut tx = pool.begin().await?;
                    let next: i32 = sqlx::query_scalar(sqlx::AssertSqlSafe(next_sql.as_str()))
                        .fetch_one(&mut *tx)
                        .await?;
                    if next >= SLOTS {
                        tx.rollback().await?;
                        return R::Ok(true);
                    }
                    let inserted = sqlx::query(sqlx::AssertSqlSafe(insert.as_str()))
                        .bind(next)
                        .bind(w as i32)
                        .execute(&mut *tx)
                        .await;
                    match inserted {
                        Ok(_) => {
                            tx.commit().await?;
                            won += 1;
                        }
                        Err(e) if sqlstate(&e).as_deref() == Some("23505") => {
                            conflicts += 1;
                            tx.rollback().await?;
                        }
                        Err(e) => return Err(e.into()),
                    }
                    Ok(false)
                }
                .await
                .map_err(at(attempt as usize))?;
                if done {
                    return Ok((won, conflicts));
                }
            }
            Err(Error::msg(format!(
                "not finished after {} attempts",
                10 * SLOTS
            )))
        }
    })
    .await;
    pool.close().await;
    let results = result?;
    let won: i32 = results.iter().map(|r| r.0).sum();
    let conflicts: i32 = results.iter().map(|r| r.1).sum();
    ensure_eq!(won, SLOTS, "slots won");
    let n = count(&format!(
        "select count(*) from {schema}.slots where slot between 0 and {}",
        SLOTS - 1
    ))
    .await?;
    ensure_eq!(n, i64::from(SLOTS), "distinct slots taken");
    note(format!(
        "{SLOTS} slots won, {conflicts} unique violations retried"
    ));
    Ok(())
}
