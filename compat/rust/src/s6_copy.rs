//! Scenario 6: COPY FROM STDIN and COPY TO STDOUT.
//!
//! tokio-postgres' `copy_in` / `copy_out` take a statement: given a `&str`
//! they first prepare it as a named statement (its own round trip), then
//! execute it. sqlx's `copy_in_raw` / `copy_out_raw` send a simple Query.

use std::pin::pin;
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, TryStreamExt};
use sqlx::Executor;
use tokio_postgres::Client;
use tokio_postgres::types::Type;

use crate::common::*;
use crate::{ensure, ensure_eq};

const ROWS: usize = 5000;

/// A text-format COPY line, with escapes: a tab, a backslash and NULLs.
fn line(i: usize) -> String {
    let name = if i.is_multiple_of(100) {
        format!("tab\\there {i}")
    } else if i.is_multiple_of(101) {
        format!("back\\\\slash {i}")
    } else {
        format!("name-{i}-é")
    };
    let note = if i.is_multiple_of(7) {
        "\\N".to_string()
    } else {
        format!("n{i}")
    };
    format!("{i}\t{name}\t{note}\n")
}

fn lines(range: std::ops::Range<usize>) -> Vec<String> {
    range.map(line).collect()
}

/// COPY FROM STDIN through tokio-postgres, in chunks of `per_chunk` lines.
async fn tp_copy_in(c: &Client, sql: &str, lines: &[String], per_chunk: usize) -> R<u64> {
    within(Duration::from_secs(30), sql, async {
        let step =
            |what: &'static str| move |e: tokio_postgres::Error| Error::from(e).context(what);
        let sink = c
            .copy_in::<_, Bytes>(sql)
            .await
            .map_err(step("copy_in (prepare, bind, execute)"))?;
        let mut sink = pin!(sink);
        for chunk in lines.chunks(per_chunk) {
            sink.send(Bytes::from(chunk.concat()))
                .await
                .map_err(step("copy_in: sending data"))?;
        }
        R::Ok(sink.finish().await.map_err(step("copy_in: finish"))?)
    })
    .await?
}

/// COPY TO STDOUT through tokio-postgres, the whole output as a string.
async fn tp_copy_out(c: &Client, sql: &str) -> R<String> {
    within(Duration::from_secs(30), sql, async {
        let step =
            |what: &'static str| move |e: tokio_postgres::Error| Error::from(e).context(what);
        let stream = c
            .copy_out(sql)
            .await
            .map_err(step("copy_out (prepare, bind, execute)"))?;
        let mut stream = pin!(stream);
        let mut out = Vec::new();
        while let Some(chunk) = stream
            .try_next()
            .await
            .map_err(step("copy_out: reading data"))?
        {
            out.extend_from_slice(&chunk);
        }
        String::from_utf8(out).map_err(|e| Error::msg(e.to_string()))
    })
    .await?
}

pub async fn tokio_postgres_in_transaction() -> R {
    let schema = format!("{PREFIX}_s6_tp");
    reset_schemas(std::slice::from_ref(&schema)).await?;
    exec(&format!(
        "create table {schema}.items (id int primary key, name text not null, note text)"
    ))
    .await?;
    let table = format!("{schema}.items");
    let mut client = tp_connect().await?;
    let data = lines(0..ROWS);

    let tx = client
        .transaction()
        .await
        .map_err(|e| Error::from(e).context("BEGIN"))?;
    let n = tp_copy_in(
        tx.client(),
        &format!("copy {table} (id, name, note) from stdin"),
        &data,
        250,
    )
    .await?;
    ensure_eq!(n, ROWS as u64, "COPY FROM STDIN row count");
    let out = tp_copy_out(
        tx.client(),
        &format!("copy (select id, name, note from {table} order by id) to stdout"),
    )
    .await?;
    ensure!(
        out == data.concat(),
        "COPY TO STDOUT differs from what was copied in ({} bytes vs {})",
        out.len(),
        data.concat().len()
    );
    tx.commit()
        .await
        .map_err(|e| Error::from(e).context("COMMIT"))?;

    let n = count(&format!("select count(*) from {table}")).await?;
    ensure_eq!(n, ROWS as i64, "rows after commit");
    let nulls = count(&format!("select count(*) from {table} where note is null")).await?;
    ensure_eq!(nulls, ROWS.div_ceil(7) as i64, "NULLs from \\N");
    let row = client
        .query_typed_one(
            &format!("select name from {table} where id = $1"),
            &[(&100i32, Type::INT4)],
        )
        .await?;
    ensure_eq!(row.get::<_, String>(0), "tab\there 100", "escaped tab");

    // 100 000 rows out (many CopyData messages).
    let tx = client
        .transaction()
        .await
        .map_err(|e| Error::from(e).context("BEGIN"))?;
    let out = tp_copy_out(
        tx.client(),
        "copy (select g, md5(g::text) from generate_series(1, 100000) g) to stdout",
    )
    .await?;
    tx.commit()
        .await
        .map_err(|e| Error::from(e).context("COMMIT"))?;
    let ids: Vec<i64> = out
        .lines()
        .map(|l| l.split('\t').next().unwrap_or("").parse().unwrap_or(-1))
        .collect();
    ensure_eq!(ids.len(), 100_000, "rows from the big COPY TO");
    ensure_eq!(
        ids.iter().sum::<i64>(),
        100_000 * 100_001 / 2,
        "sum of ids from the big COPY TO"
    );

    // In a rolled-back transaction: nothing stays.
    let tx = client
        .transaction()
        .await
        .map_err(|e| Error::from(e).context("BEGIN"))?;
    tx.batch_execute(&format!("delete from {table}")).await?;
    let n = tp_copy_in(
        tx.client(),
        &format!("copy {table} (id, name, note) from stdin"),
        &lines(0..300),
        50,
    )
    .await?;
    ensure_eq!(n, 300, "COPY in the rolled-back transaction");
    tx.rollback()
        .await
        .map_err(|e| Error::from(e).context("ROLLBACK"))?;
    let n = count(&format!("select count(*) from {table}")).await?;
    ensure_eq!(n, ROWS as i64, "rows after the rolled-back COPY");

    // Bad data: 22P02, the transaction is rolled back, the client works.
    let tx = client
        .transaction()
        .await
        .map_err(|e| Error::from(e).context("BEGIN"))?;
    let bad = vec![
        line(ROWS + 1),
        "not-a-number\tx\ty\n".to_string(),
        line(ROWS + 2),
    ];
    let r = tp_copy_in(
        tx.client(),
        &format!("copy {table} (id, name, note) from stdin"),
        &bad,
        1,
    )
    .await;
    match r {
        Ok(n) => {
            return Err(Error::msg(format!(
                "COPY with bad data succeeded ({n} rows)"
            )));
        }
        Err(e) => ensure_eq!(
            e.code.as_deref(),
            Some("22P02"),
            "COPY with bad data: {}",
            e.message
        ),
    }
    tx.rollback()
        .await
        .map_err(|e| Error::from(e).context("ROLLBACK"))?;
    let v: i32 = client
        .query_typed_one("select $1::int", &[(&7i32, Type::INT4)])
        .await?
        .get(0);
    ensure_eq!(v, 7, "the client after the failed COPY");
    let n = count(&format!("select count(*) from {table}")).await?;
    ensure_eq!(n, ROWS as i64, "rows after the failed COPY");
    Ok(())
}

pub async fn tokio_postgres_autocommit() -> R {
    let schema = format!("{PREFIX}_s6_tp_auto");
    reset_schemas(std::slice::from_ref(&schema)).await?;
    exec(&format!(
        "create table {schema}.items (id int primary key, name text not null, note text)"
    ))
    .await?;
    let table = format!("{schema}.items");
    let client = tp_connect().await?;
    let data = lines(0..ROWS);
    let n = tp_copy_in(
        &client,
        &format!("copy {table} (id, name, note) from stdin"),
        &data,
        500,
    )
    .await?;
    ensure_eq!(n, ROWS as u64, "COPY FROM STDIN row count");
    let out = tp_copy_out(
        &client,
        &format!("copy (select id, name, note from {table} order by id) to stdout"),
    )
    .await?;
    ensure!(
        out == data.concat(),
        "COPY TO STDOUT differs from what was copied in"
    );
    Ok(())
}

pub async fn sqlx() -> R {
    let schema = format!("{PREFIX}_s6_sqlx");
    reset_schemas(std::slice::from_ref(&schema)).await?;
    exec(&format!(
        "create table {schema}.items (id int primary key, name text not null, note text)"
    ))
    .await?;
    let table = format!("{schema}.items");
    let pool = sqlx_pool(6).await?;
    let result = async {
        let mut conn = pool.acquire().await?;
        let data = lines(0..ROWS);
        let n = within(Duration::from_secs(30), "copy_in_raw", async {
            let mut copy = conn
                .copy_in_raw(&format!("copy {table} (id, name, note) from stdin"))
                .await?;
            for chunk in data.chunks(250) {
                copy.send(chunk.concat().into_bytes()).await?;
            }
            R::Ok(copy.finish().await?)
        })
        .await??;
        ensure_eq!(n, ROWS as u64, "copy_in_raw row count");
        let out = sqlx_copy_out(&mut conn, &format!("copy (select id, name, note from {table} order by id) to stdout")).await?;
        ensure!(out == data.concat(), "copy_out_raw differs from what was copied in");

        // Bad data: 22P02; the connection works afterwards.
        let r = within(Duration::from_secs(30), "copy_in_raw with bad data", async {
            let mut copy = conn
                .copy_in_raw(&format!("copy {table} (id, name, note) from stdin"))
                .await?;
            copy.send(line(ROWS + 1).into_bytes()).await?;
            copy.send(b"not-a-number\tx\ty\n".as_slice()).await?;
            R::Ok(copy.finish().await?)
        })
        .await?;
        match r {
            Ok(n) => return Err(Error::msg(format!("COPY with bad data succeeded ({n} rows)"))),
            Err(e) => ensure_eq!(e.code.as_deref(), Some("22P02"), "COPY with bad data: {}", e.message),
        }
        conn.execute("select 1").await?;
        drop(conn);
        let n = count(&format!("select count(*) from {table}")).await?;
        ensure_eq!(n, ROWS as i64, "rows after the failed COPY");

        // Six connections COPY at once (more than the server pool).
        const PER: usize = 1000;
        let table2 = table.clone();
        run_workers(6, |w| {
            let pool = pool.clone();
            let table = table2.clone();
            async move {
                let mut conn = pool.acquire().await?;
                let range = ROWS + 10 + w * PER..ROWS + 10 + (w + 1) * PER;
                let data = lines(range.clone());
                let mut copy = conn
                    .copy_in_raw(&format!("copy {table} (id, name, note) from stdin"))
                    .await?;
                for chunk in data.chunks(100) {
                    copy.send(chunk.concat().into_bytes()).await?;
                }
                ensure_eq!(copy.finish().await?, PER as u64, "concurrent COPY row count");
                let out = sqlx_copy_out(
                    &mut conn,
                    &format!(
                        "copy (select id, name, note from {table} where id >= {} and id < {} order by id) to stdout",
                        range.start, range.end
                    ),
                )
                .await?;
                ensure!(out == data.concat(), "concurrent COPY TO differs");
                Ok(())
            }
        })
        .await?;
        let n = count(&format!("select count(*) from {table}")).await?;
        ensure_eq!(n, (ROWS + 6 * PER) as i64, "rows after the concurrent COPYs");
        R::Ok(())
    }
    .await;
    pool.close().await;
    result
}

async fn sqlx_copy_out(conn: &mut sqlx::PgConnection, sql: &str) -> R<String> {
    within(Duration::from_secs(30), sql, async {
        let mut stream = conn.copy_out_raw(sql).await?;
        let mut out = Vec::new();
        while let Some(chunk) = stream.try_next().await? {
            out.extend_from_slice(&chunk);
        }
        String::from_utf8(out).map_err(|e| Error::msg(e.to_string()))
    })
    .await?
}
