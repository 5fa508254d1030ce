//! Scenario 7: cancelling `select pg_sleep(30)`: it ends within a few
//! seconds with 57014 and the same connection works afterwards.

use std::time::{Duration, Instant};

use sqlx::Connection;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, NoTls};

use crate::common::*;
use crate::{ensure, ensure_eq};

async fn works(client: &mut Client) -> R {
    for i in 0..5i32 {
        let tx = client.transaction().await?;
        let v: i32 = tx
            .query_typed_one("select $1::int * 2", &[(&i, Type::INT4)])
            .await?
            .get(0);
        ensure_eq!(v, i * 2, "query after the cancel");
        tx.commit().await?;
    }
    Ok(())
}

/// Waits until PostgreSQL itself shows `sql` running (pg_stat_activity
/// through `COMPAT_DIRECT_PORT`), so that the cancel cannot arrive while the
/// query is still queued in the pooler.
async fn wait_running(direct: &Client, sql: &str) -> R {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let n: i64 = direct
            .query_typed_one(
                "select count(*) from pg_stat_activity where state = 'active' and query = $1",
                &[(&sql, Type::TEXT)],
            )
            .await?
            .get(0);
        if n > 0 {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "{sql} did not start running within 5 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `client.cancel_token().cancel_query(NoTls)` (a CancelRequest with the
/// backend key data) while six other clients keep the server pool busy: the
/// sleep is cancelled, none of the others' queries is.
pub async fn tokio_postgres() -> R {
    let churn = Churn::start(6).await?;
    let result = async {
        let mut client = tp_connect().await?;
        let direct = tp_connect_direct().await?;
        for in_transaction in [false, true] {
            let sql = format!("select pg_sleep(30) /* {PREFIX} cancel {in_transaction} */");
            let token = client.cancel_token();
            let cancel = async {
                wait_running(&direct, &sql).await?;
                R::Ok(token.cancel_query(NoTls).await?)
            };
            let t0 = Instant::now();
            let (slept, cancelled) = if in_transaction {
                let tx = client.transaction().await?;
                let r = tokio::join!(
                    within(
                        Duration::from_secs(10),
                        "pg_sleep(30) in a transaction",
                        tx.batch_execute(&sql)
                    ),
                    cancel
                );
                tx.rollback().await?;
                r
            } else {
                tokio::join!(
                    within(
                        Duration::from_secs(10),
                        "pg_sleep(30)",
                        client.batch_execute(&sql)
                    ),
                    cancel
                )
            };
            let elapsed = t0.elapsed();
            cancelled?;
            match slept? {
                Ok(()) => {
                    return Err(Error::msg(format!(
                        "pg_sleep(30) was not cancelled ({elapsed:?})"
                    )));
                }
                Err(e) => ensure_eq!(
                    sqlstate(&e).as_deref(),
                    Some("57014"),
                    "pg_sleep(30) cancelled ({})",
                    describe(&e)
                ),
            }
            ensure!(
                elapsed < Duration::from_secs(5),
                "cancelled only after {elapsed:?}"
            );
            works(&mut client).await?;
        }
        R::Ok(())
    }
    .await;
    let stopped = churn.stop().await;
    result?;
    stopped.map_err(|e| e.context("a bystander client"))
}

/// sqlx has no cancel API: `SET LOCAL statement_timeout` in a transaction.
pub async fn sqlx_statement_timeout() -> R {
    let mut conn = within(
        CONNECT_TIMEOUT,
        "sqlx connect",
        sqlx::PgConnection::connect(&dsn()),
    )
    .await??;
    let show = "show statement_timeout";
    let before: String = sqlx::Row::try_get(&sqlx::raw_sql(show).fetch_one(&mut conn).await?, 0)?;
    let mut tx = conn.begin().await?;
    sqlx::raw_sql("set local statement_timeout = '500ms'")
        .execute(&mut *tx)
        .await?;
    let t0 = Instant::now();
    expect_code(
        "57014",
        "pg_sleep(30) with statement_timeout 500ms",
        sqlx::raw_sql("select pg_sleep(30)").execute(&mut *tx),
    )
    .await?;
    let elapsed = t0.elapsed();
    ensure!(
        elapsed < Duration::from_secs(5),
        "cancelled only after {elapsed:?}"
    );
    tx.rollback().await?;
    for _ in 0..5 {
        let mut tx = conn.begin().await?;
        sqlx::raw_sql("select 1").execute(&mut *tx).await?;
        tx.commit().await?;
    }
    let after: String = sqlx::Row::try_get(&sqlx::raw_sql(show).fetch_one(&mut conn).await?, 0)?;
    ensure_eq!(
        after,
        before,
        "statement_timeout after the transaction with SET LOCAL"
    );
    conn.close().await?;
    Ok(())
}
