//! Scenario 5: LISTEN/NOTIFY. A listening client receives every notification
//! committed by other clients exactly once (also while it runs transactions
//! itself), never one from a rolled-back transaction, and nothing after
//! UNLISTEN.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sqlx::postgres::PgListener;
use sqlx::{AssertSqlSafe, Executor, Row};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio_postgres::Notification;
use tokio_postgres::types::Type;

use crate::common::*;
use crate::{ensure, ensure_eq};

const NOTIFIERS: usize = 4;
const PER_NOTIFIER: usize = 30;

/// Checks that `got` holds each of `expected` exactly once and nothing else.
fn exactly_once(got: &[String], expected: &[String], label: &str) -> R {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for p in got {
        *counts.entry(p).or_default() += 1;
    }
    let missing: Vec<&String> = expected
        .iter()
        .filter(|p| !counts.contains_key(p.as_str()))
        .collect();
    let duplicated: Vec<String> = counts
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(p, n)| format!("{p} x{n}"))
        .collect();
    let unexpected: Vec<&&str> = counts
        .keys()
        .filter(|p| !expected.iter().any(|e| e == **p))
        .collect();
    ensure!(
        missing.is_empty() && duplicated.is_empty() && unexpected.is_empty(),
        "{label}: {} received, {} expected; missing {} {:?}, duplicated {:?}, unexpected {:?}",
        got.len(),
        expected.len(),
        missing.len(),
        missing.iter().take(5).collect::<Vec<_>>(),
        duplicated.iter().take(5).collect::<Vec<_>>(),
        unexpected.iter().take(5).collect::<Vec<_>>()
    );
    Ok(())
}

/// Receives from `rx` until `want` notifications arrived (or `limit`
/// passed), then for `linger` more to catch duplicates and late ones.
async fn drain(
    rx: &mut UnboundedReceiver<Notification>,
    got: &mut Vec<Notification>,
    want: usize,
    limit: Duration,
    linger: Duration,
) {
    let deadline = tokio::time::Instant::now() + limit;
    while got.len() < want {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(n)) => got.push(n),
            _ => break,
        }
    }
    let deadline = tokio::time::Instant::now() + linger;
    while let Ok(Some(n)) = tokio::time::timeout_at(deadline, rx.recv()).await {
        got.push(n);
    }
}

fn payloads(got: &[Notification]) -> Vec<String> {
    got.iter().map(|n| n.payload().to_owned()).collect()
}

pub async fn tokio_postgres() -> R {
    let chan = format!("{PREFIX}_chan");
    let other = format!("{PREFIX}_other");
    let (listener, mut rx) = tp_connect_listening().await?;
    let (other_listener, mut other_rx) = tp_connect_listening().await?;
    listener.batch_execute(&format!("listen {chan}")).await?;
    other_listener
        .batch_execute(&format!("listen {other}"))
        .await?;

    // The listener keeps running transactions of its own meanwhile, then
    // notifies itself.
    let notifying = Arc::new(AtomicBool::new(true));
    let busy = {
        let notifying = notifying.clone();
        let chan = chan.clone();
        let mut listener = listener;
        tokio::spawn(async move {
            let mut i = 0i32;
            while notifying.load(Ordering::Relaxed) {
                let tx = listener.transaction().await?;
                let v: i32 = tx
                    .query_typed_one("select $1::int + 1", &[(&i, Type::INT4)])
                    .await?
                    .get(0);
                ensure_eq!(v, i + 1, "listener's own transaction");
                tx.commit().await?;
                listener.batch_execute("select 1").await?;
                i += 1;
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            let tx = listener.transaction().await?;
            tx.batch_execute(&format!("notify {chan}, 'self-1'"))
                .await?;
            tx.commit().await?;
            R::Ok((listener, i))
        })
    };

    let sent = run_workers(NOTIFIERS, |w| {
        let (chan, other) = (chan.clone(), other.clone());
        async move {
            let mut client = tp_connect().await?;
            let mut sent = Vec::new();
            let mut sent_other = Vec::new();
            for i in 0..PER_NOTIFIER {
                async {
                    let payload = format!("w{w}-{i}");
                    match i % 3 {
                        0 => {
                            let tx = client.transaction().await?;
                            tx.batch_execute(&format!("notify {chan}, '{payload}'"))
                                .await?;
                            tx.commit().await?;
                        }
                        1 => {
                            client
                                .query_typed(
                                    "select pg_notify($1, $2)",
                                    &[(&chan, Type::TEXT), (&payload, Type::TEXT)],
                                )
                                .await?;
                        }
                        _ => {
                            let tx = client.transaction().await?;
                            tx.execute("select pg_notify($1, $2)", &[&chan, &payload])
                                .await?;
                            tx.execute("select pg_notify($1, $2)", &[&other, &payload])
                                .await?;
                            tx.commit().await?;
                            sent_other.push(payload.clone());
                        }
                    }
                    sent.push(payload.clone());
                    if i % 5 == 0 {
                        let tx = client.transaction().await?;
                        tx.batch_execute(&format!(
                            "notify {chan}, 'rolled-back-{payload}'; notify {other}, 'rolled-back-{payload}'"
                        ))
                        .await?;
                        tx.rollback().await?;
                    }
                    R::Ok(())
                }
                .await
                .map_err(at(i))?;
            }
            Ok((sent, sent_other))
        }
    })
    .await;
    notifying.store(false, Ordering::Relaxed);
    let busy = within(Duration::from_secs(20), "the listener's transactions", busy).await?;
    let sent = sent?;
    let (listener, transactions) =
        busy.map_err(|e| Error::msg(format!("listener task: {e}")))??;
    ensure!(transactions > 0, "the listener ran no transaction");

    let mut expected: Vec<String> = vec!["self-1".into()];
    let mut expected_other = Vec::new();
    for (s, o) in sent {
        expected.extend(s);
        expected_other.extend(o);
    }
    let mut got = Vec::new();
    let mut got_other = Vec::new();
    drain(
        &mut rx,
        &mut got,
        expected.len(),
        Duration::from_secs(10),
        Duration::from_millis(500),
    )
    .await;
    drain(
        &mut other_rx,
        &mut got_other,
        expected_other.len(),
        Duration::from_secs(2),
        Duration::from_millis(100),
    )
    .await;
    ensure!(
        got.iter().all(|n| n.channel() == chan),
        "the listener got notifications for other channels"
    );
    exactly_once(
        &payloads(&got),
        &expected,
        &format!("notifications on {chan}"),
    )?;
    ensure!(
        got_other.iter().all(|n| n.channel() == other),
        "other channel"
    );
    exactly_once(
        &payloads(&got_other),
        &expected_other,
        &format!("notifications on {other}"),
    )?;

    // After UNLISTEN nothing more arrives; the other listener's marker
    // tells when the notifications sent before it have been delivered.
    listener.batch_execute(&format!("unlisten {chan}")).await?;
    let notifier = tp_connect().await?;
    for i in 0..10 {
        notifier
            .batch_execute(&format!("notify {chan}, 'after-unlisten-{i}'"))
            .await?;
    }
    notifier
        .batch_execute(&format!("notify {other}, 'marker'"))
        .await?;
    let mut marker = Vec::new();
    drain(
        &mut other_rx,
        &mut marker,
        1,
        Duration::from_secs(10),
        Duration::ZERO,
    )
    .await;
    ensure_eq!(
        payloads(&marker),
        vec!["marker".to_string()],
        "marker on {other}"
    );
    listener.batch_execute("select 1").await?;
    let mut late = Vec::new();
    drain(
        &mut rx,
        &mut late,
        0,
        Duration::ZERO,
        Duration::from_millis(500),
    )
    .await;
    ensure!(
        late.is_empty(),
        "notifications after UNLISTEN: {:?}",
        payloads(&late)
    );
    Ok(())
}

pub async fn sqlx() -> R {
    let chan = format!("{PREFIX}_sqlx_chan");
    let marker_chan = format!("{PREFIX}_sqlx_marker");
    let mut listener = within(
        CONNECT_TIMEOUT,
        "PgListener::connect",
        PgListener::connect(&dsn()),
    )
    .await??;
    listener.listen(&chan).await?;
    listener.listen(&marker_chan).await?;
    let pool = sqlx_pool(NOTIFIERS as u32).await?;

    let notifiers = {
        let pool = pool.clone();
        let chan = chan.clone();
        tokio::spawn(run_workers(NOTIFIERS, move |w| {
            let pool = pool.clone();
            let chan = chan.clone();
            async move {
                let mut sent = Vec::new();
                for i in 0..PER_NOTIFIER {
                    async {
                        let payload = format!("s{w}-{i}");
                        let notify = format!("notify {chan}, '{payload}'");
                        if i % 2 == 0 {
                            let mut tx = pool.begin().await?;
                            tx.execute(AssertSqlSafe(notify)).await?;
                            tx.commit().await?;
                        } else {
                            pool.execute(AssertSqlSafe(notify)).await?;
                        }
                        sent.push(payload.clone());
                        if i % 5 == 0 {
                            let mut tx = pool.begin().await?;
                            tx.execute(AssertSqlSafe(format!(
                                "notify {chan}, 'rolled-back-{payload}'"
                            )))
                            .await?;
                            tx.rollback().await?;
                        }
                        R::Ok(())
                    }
                    .await
                    .map_err(at(i))?;
                    tokio::time::sleep(Duration::from_millis(3)).await;
                }
                Ok(sent)
            }
        }))
    };

    // Meanwhile the listener runs transactions on its own connection; the
    // notifications arriving meanwhile are buffered by sqlx.
    let mut got: Vec<String> = Vec::new();
    let mut transactions = 0;
    while !notifiers.is_finished() {
        within(Duration::from_secs(20), "listener transaction", async {
            sqlx::raw_sql("begin").execute(&mut listener).await?;
            let v: i32 = sqlx::raw_sql("select 41 + 1")
                .fetch_one(&mut listener)
                .await?
                .try_get(0)?;
            ensure_eq!(v, 42, "listener's own transaction");
            sqlx::raw_sql("commit").execute(&mut listener).await?;
            R::Ok(())
        })
        .await??;
        transactions += 1;
        while let Some(n) = listener.next_buffered() {
            got.push(n.payload().to_owned());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let sent = within(Duration::from_secs(20), "notifiers", notifiers).await?;
    let expected: Vec<String> = sent
        .map_err(|e| Error::msg(format!("notifier task: {e}")))??
        .into_iter()
        .flatten()
        .collect();
    ensure!(transactions > 0, "the listener ran no transaction");

    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while got.len() < expected.len() {
        match tokio::time::timeout_at(deadline, listener.try_recv()).await {
            Ok(Ok(Some(n))) => got.push(n.payload().to_owned()),
            Ok(Ok(None)) => return Err(Error::msg("PgListener lost its connection")),
            Ok(Err(e)) => return Err(e.into()),
            Err(_) => break,
        }
    }
    if let Ok(Ok(Some(n))) =
        tokio::time::timeout(Duration::from_millis(500), listener.try_recv()).await
    {
        got.push(n.payload().to_owned());
    }
    exactly_once(&got, &expected, &format!("notifications on {chan}"))?;

    // UNLISTEN one channel; notifications on it stop, the marker channel
    // still works.
    listener.unlisten(&chan).await?;
    for i in 0..10 {
        pool.execute(AssertSqlSafe(format!(
            "notify {chan}, 'after-unlisten-{i}'"
        )))
        .await?;
    }
    pool.execute(AssertSqlSafe(format!("notify {marker_chan}, 'marker'")))
        .await?;
    let mut after = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match tokio::time::timeout_at(deadline, listener.try_recv()).await {
            Ok(Ok(Some(n))) => {
                after.push(format!("{}: {}", n.channel(), n.payload()));
                if n.channel() == marker_chan {
                    break;
                }
            }
            Ok(Ok(None)) => return Err(Error::msg("PgListener lost its connection")),
            Ok(Err(e)) => return Err(e.into()),
            Err(_) => break,
        }
    }
    ensure_eq!(
        after,
        vec![format!("{marker_chan}: marker")],
        "notifications after UNLISTEN {chan}"
    );
    pool.close().await;
    Ok(())
}
