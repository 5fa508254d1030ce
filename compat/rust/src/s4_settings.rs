//! Scenario 4: session settings made with SET outside a transaction follow
//! the client through all its later transactions while concurrent clients
//! see their own; SET LOCAL ends with its transaction; a SET in a
//! rolled-back transaction is undone.
//!
//! SHOW and SET go through the simple query protocol, the unqualified
//! selects through tokio-postgres' unnamed statements (`query_typed`) or
//! sqlx's `raw_sql`, so that these checks do not depend on named prepared
//! statements (scenario 2).

use sqlx::{Connection, Executor, Row};
use tokio_postgres::Client;
use tokio_postgres::types::Type;

use crate::common::*;
use crate::ensure_eq;

const WORKERS: usize = 8;
const ITERATIONS: usize = 40;

fn schema_of(driver: &str, w: usize) -> String {
    format!("{PREFIX}_sp_{driver}_{w}")
}

async fn show(client: &Client, name: &str) -> R<String> {
    Ok(simple_value(client, &format!("show {name}"))
        .await?
        .unwrap_or_default())
}

async fn create_schemas(driver: &str, n: usize) -> R {
    let schemas: Vec<String> = (0..n).map(|w| schema_of(driver, w)).collect();
    reset_schemas(&schemas).await?;
    let sql: String = (0..n)
        .map(|w| {
            let s = schema_of(driver, w);
            format!(
                "create table {s}.t (v int not null); insert into {s}.t values ({w});
                 create table {s}.hits (i int not null);"
            )
        })
        .collect();
    exec(&sql).await
}

pub async fn tokio_postgres() -> R {
    create_schemas("tp", WORKERS).await?;
    run_workers(WORKERS, |w| async move {
        let mut client = tp_connect().await?;
        let mut expected = vec![
            ("search_path", schema_of("tp", w)),
            ("application_name", format!("compat_rust_w{w}")),
            ("statement_timeout", format!("{}s", w + 10)),
        ];
        for (name, value) in &expected {
            client
                .batch_execute(&format!("set {name} to '{value}'"))
                .await?;
        }
        for i in 0..ITERATIONS {
            async {
                if i % 2 == 1 {
                    let tx = client.transaction().await?;
                    round(tx.client(), w, i, &expected, "in a transaction").await?;
                    tx.commit().await?;
                } else {
                    round(&client, w, i, &expected, "autocommit").await?;
                }

                if i % 5 == 0 {
                    let tx = client.transaction().await?;
                    tx.batch_execute("set local search_path to public; set local statement_timeout to '1234ms'")
                        .await?;
                    ensure_eq!(show(tx.client(), "search_path").await?, "public", "SET LOCAL search_path");
                    ensure_eq!(show(tx.client(), "statement_timeout").await?, "1234ms", "SET LOCAL statement_timeout");
                    tx.commit().await?;
                    check(&client, w, &expected, "after a transaction with SET LOCAL").await?;
                }
                if i % 7 == 0 {
                    let tx = client.transaction().await?;
                    tx.batch_execute("set application_name to 'compat_rust_rolled_back'; set search_path to public")
                        .await?;
                    ensure_eq!(
                        show(tx.client(), "application_name").await?,
                        "compat_rust_rolled_back",
                        "SET inside the transaction"
                    );
                    tx.rollback().await?;
                    check(&client, w, &expected, "after a rolled-back SET").await?;
                }
                if i % 11 == 10 {
                    expected[1].1 = format!("compat_rust_w{w}_i{i}");
                    client
                        .batch_execute(&format!("set application_name to '{}'", expected[1].1))
                        .await?;
                    check(&client, w, &expected, "after a second SET").await?;
                }
                if i % 13 == 12 {
                    expected[2].1 = format!("{}s", w + 20);
                    let tx = client.transaction().await?;
                    tx.batch_execute(&format!("set statement_timeout to '{}'", expected[2].1))
                        .await?;
                    tx.commit().await?;
                    check(&client, w, &expected, "after a SET in a committed transaction").await?;
                }
                R::Ok(())
            }
            .await
            .map_err(at(i))?;
        }
        let n = simple_value(&client, "select count(*) from hits").await?;
        ensure_eq!(n.as_deref(), Some(ITERATIONS.to_string().as_str()), "rows in the worker's own hits table");
        Ok(())
    })
    .await?;
    for w in 0..WORKERS {
        let n = count(&format!("select count(*) from {}.hits", schema_of("tp", w))).await?;
        ensure_eq!(n, ITERATIONS as i64, "rows in {}.hits", schema_of("tp", w));
    }
    Ok(())
}

/// The checks, then a row into the worker's own (unqualified) hits table.
async fn round(c: &Client, w: usize, i: usize, expected: &[(&str, String)], label: &str) -> R {
    check(c, w, expected, label).await?;
    let i = i as i32;
    c.query_typed("insert into hits (i) values ($1)", &[(&i, Type::INT4)])
        .await?;
    Ok(())
}

async fn check(c: &Client, w: usize, expected: &[(&str, String)], label: &str) -> R {
    for (name, value) in expected {
        ensure_eq!(show(c, name).await?, *value, "{label}: SHOW {name}");
    }
    let w32 = w as i32;
    let rows = c
        .query_typed("select v, $1::int from t", &[(&w32, Type::INT4)])
        .await?;
    let got: Vec<(i32, i32)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    ensure_eq!(
        got,
        vec![(w32, w32)],
        "{label}: select from the unqualified table t"
    );
    Ok(())
}

/// sqlx: one `PgConnection` per worker; `SET search_path` with
/// `Executor::execute` (simple protocol), checked with `raw_sql`.
pub async fn sqlx() -> R {
    const N: usize = 4;
    create_schemas("sqlx", N).await?;
    run_workers(N, |w| async move {
        let mut conn = within(
            CONNECT_TIMEOUT,
            "sqlx connect",
            sqlx::PgConnection::connect(&dsn()),
        )
        .await??;
        let schema = schema_of("sqlx", w);
        conn.execute(sqlx::AssertSqlSafe(format!("set search_path to {schema}")))
            .await?;
        for i in 0..30 {
            async {
                let mut tx = conn.begin().await?;
                let path: String = sqlx::raw_sql("show search_path")
                    .fetch_one(&mut *tx)
                    .await?
                    .try_get(0)?;
                ensure_eq!(path, schema, "SHOW search_path in a transaction");
                let v: i32 = sqlx::raw_sql("select v from t")
                    .fetch_one(&mut *tx)
                    .await?
                    .try_get(0)?;
                ensure_eq!(v, w as i32, "select from the unqualified table t");
                sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                    "insert into hits (i) values ({i})"
                )))
                .execute(&mut *tx)
                .await?;
                if i % 3 == 0 {
                    tx.rollback().await?;
                } else {
                    tx.commit().await?;
                }
                let path: String = sqlx::raw_sql("show search_path")
                    .fetch_one(&mut conn)
                    .await?
                    .try_get(0)?;
                ensure_eq!(path, schema, "SHOW search_path in autocommit");
                R::Ok(())
            }
            .await
            .map_err(at(i))?;
        }
        conn.close().await?;
        Ok(())
    })
    .await?;
    for w in 0..N {
        let n = count(&format!(
            "select count(*) from {}.hits",
            schema_of("sqlx", w)
        ))
        .await?;
        ensure_eq!(n, 20, "committed rows in {}.hits", schema_of("sqlx", w));
    }
    Ok(())
}

/// Clients change their settings and go away; new clients see the defaults.
pub async fn no_leak() -> R {
    let first = tp_connect().await?;
    let mut defaults = Vec::new();
    for name in ["search_path", "application_name", "statement_timeout"] {
        defaults.push((name, show(&first, name).await?));
    }
    drop(first);
    run_workers(8, |w| async move {
        let client = tp_connect().await?;
        client
            .batch_execute(&format!(
                "set search_path to {}; set application_name to 'compat_rust_leak_{w}'; set statement_timeout to '77s'",
                schema_of("tp", w)
            ))
            .await?;
        client.batch_execute("select 1").await?;
        Ok(())
    })
    .await?;
    let defaults = std::sync::Arc::new(defaults);
    run_workers(8, |_| {
        let defaults = defaults.clone();
        async move {
            let client = tp_connect().await?;
            for _ in 0..10 {
                for (name, value) in defaults.iter() {
                    ensure_eq!(
                        show(&client, name).await?,
                        *value,
                        "new connection: SHOW {name}"
                    );
                }
            }
            Ok(())
        }
    })
    .await?;
    Ok(())
}
