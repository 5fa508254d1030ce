//! Cancel requests (BackendKeyData is sluice's own; the cancel must reach
//! the right server and only that one) and COPY in both directions with
//! enough data to cross many reads, in transaction pooling.

use std::pin::pin;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use sluice_tests::*;
use tokio_postgres::{Client, NoTls};

/// Rows for the COPY tests: ~10 MB in total.
const COPY_ROWS: u32 = 100_000;

fn transaction_pool(cluster: &Cluster, pool_size: &str) -> SluiceProcess {
    ConfigBuilder::for_cluster(cluster)
        .set("pool_mode", "transaction")
        .set("default_pool_size", pool_size)
        .set("query_wait_timeout", "5")
        .start()
}

/// With a pool of one, another client must get the server within a few
/// seconds, outside any transaction: the previous client released it.
async fn assert_server_released(port: u16) {
    let other = connect_as(port, APP_USER, "postgres").await;
    let result = tokio::time::timeout(
        Duration::from_secs(8),
        other.simple_query("select txid_current_if_assigned()::text"),
    )
    .await
    .expect("another client gets the server");
    let messages = result.expect("the pool's server must be released after the COPY");
    let value = messages.iter().find_map(|m| match m {
        tokio_postgres::SimpleQueryMessage::Row(row) => Some(row.get(0).map(str::to_owned)),
        _ => None,
    });
    assert_eq!(value, Some(None), "no transaction left open");
}

/// The text COPY line for row `i`, as both Rust and SQL below produce it.
fn copy_line(i: u32) -> String {
    let letter = char::from(b'a' + u8::try_from(i % 26).unwrap());
    format!("{i}\t{i:0>8}{}\n", letter.to_string().repeat(90))
}

const COPY_LINE_SQL: &str = "lpad(i::text, 8, '0') || repeat(chr(97 + i % 26), 90)";

#[tokio::test]
async fn cancel_reaches_the_right_server() {
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = transaction_pool(&cluster, "2");
    let sleeper = connect_as(sluice.port(), APP_USER, "postgres").await;
    let bystander = connect_as(sluice.port(), APP_USER, "postgres").await;
    let token = sleeper.cancel_token();

    let started = Instant::now();
    let long = tokio::spawn(async move { sleeper.simple_query("select pg_sleep(30)").await });
    let short = tokio::spawn(async move { bystander.simple_query("select pg_sleep(1.5)").await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    token
        .cancel_query(NoTls)
        .await
        .expect("send the cancel request");

    let result = tokio::time::timeout(Duration::from_secs(10), long)
        .await
        .expect("the cancelled query must end quickly")
        .unwrap();
    let error = expect_sqlstate(result, "57014");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "cancel took {:?}",
        started.elapsed()
    );
    assert!(error.as_db_error().unwrap().message().contains("cancel"));
    let other = tokio::time::timeout(Duration::from_secs(10), short)
        .await
        .expect("the other query finishes")
        .unwrap();
    other.expect("the cancel must not hit the other client's server");
}

/// A cancel request that arrives as its client's query ends must not
/// cancel what the next client runs on that server: the server waits for
/// PostgreSQL to have taken the request before it is lent again (on the
/// binary before this, about one round in four cancelled the bystander).
#[tokio::test]
async fn a_cancel_sent_as_the_query_ends_never_reaches_the_next_client() {
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = transaction_pool(&cluster, "1");
    let canceller = connect_as(sluice.port(), APP_USER, "postgres").await;
    let bystander = connect_as(sluice.port(), APP_USER, "postgres").await;
    let token = canceller.cancel_token();
    let (mut own, mut theirs) = (0, 0);
    for round in 0..120u64 {
        // The cancel lands from before to after the 5 ms query's end.
        let delay = Duration::from_micros(2_000 + (round % 24) * 400);
        let first = canceller.simple_query("select pg_sleep(0.005)");
        let queued = async {
            tokio::time::sleep(Duration::from_millis(1)).await;
            bystander.simple_query("select pg_sleep(0.03)").await
        };
        let cancel = async {
            tokio::time::sleep(delay).await;
            token.cancel_query(NoTls).await
        };
        let (first, queued, cancel) = tokio::join!(first, queued, cancel);
        cancel.expect("the cancel request is taken");
        let cancelled =
            |e: &tokio_postgres::Error| e.as_db_error().is_some_and(|d| d.code().code() == "57014");
        if first.as_ref().is_err_and(cancelled) {
            own += 1;
        }
        match queued {
            Ok(_) => {}
            Err(e) if cancelled(&e) => theirs += 1,
            Err(e) => panic!("the bystander's query failed: {e}"),
        }
    }
    assert_eq!(theirs, 0, "the bystander's query was cancelled ({own} own)");
    assert!(own > 0, "some cancels must land while the query runs");
}

#[tokio::test]
async fn cancelled_client_keeps_working() {
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = transaction_pool(&cluster, "1");
    let client = std::sync::Arc::new(connect_as(sluice.port(), APP_USER, "postgres").await);
    let token = client.cancel_token();
    let sleeping = {
        let client = client.clone();
        tokio::spawn(async move { client.simple_query("select pg_sleep(30)").await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    token.cancel_query(NoTls).await.unwrap();
    let result = tokio::time::timeout(Duration::from_secs(10), sleeping)
        .await
        .expect("cancelled")
        .unwrap();
    expect_sqlstate(result, "57014");
    assert_eq!(scalar_text(&client, "select 41 + 1").await, "42");
    // A cancel with nothing running is harmless.
    token.cancel_query(NoTls).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        scalar_text(&client, "select 'still here'").await,
        "still here"
    );
}

async fn create_copy_table(client: &Client) {
    client
        .batch_execute("create table copied(id int, payload text)")
        .await
        .unwrap();
}

#[tokio::test]
async fn copy_from_stdin_of_ten_megabytes() {
    let cluster = app_cluster(ServerAuth::Trust);
    grant_create(&cluster);
    let sluice = transaction_pool(&cluster, "1");
    let client = connect_as(sluice.port(), APP_USER, "postgres").await;
    create_copy_table(&client).await;

    let data: String = (1..=COPY_ROWS).map(copy_line).collect();
    assert!(data.len() > 10_000_000);
    let sink = client.copy_in("copy copied from stdin").await.unwrap();
    let mut sink = pin!(sink);
    for chunk in data.as_bytes().chunks(64 * 1024) {
        sink.send(std::io::Cursor::new(chunk.to_vec()))
            .await
            .unwrap();
    }
    let rows = sink
        .as_mut()
        .finish()
        .await
        .expect("COPY FROM STDIN completes");
    assert_eq!(rows, u64::from(COPY_ROWS));

    let check = format!(
        "select count(*) = {COPY_ROWS} and sum(id) = {} and \
         bool_and(payload = {}) from copied, lateral (select id as i) s",
        u64::from(COPY_ROWS) * u64::from(COPY_ROWS + 1) / 2,
        COPY_LINE_SQL
    );
    assert_eq!(scalar_text(&client, &check).await, "t");
    assert_server_released(sluice.port()).await;
}

#[tokio::test]
async fn copy_to_stdout_of_ten_megabytes() {
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = transaction_pool(&cluster, "1");
    let client = connect_as(sluice.port(), APP_USER, "postgres").await;
    let sql = format!(
        "copy (select i, {COPY_LINE_SQL} from generate_series(1, {COPY_ROWS}) i) to stdout"
    );
    let stream = client.copy_out(sql.as_str()).await.unwrap();
    let mut stream = pin!(stream);
    let mut received = Vec::new();
    while let Some(chunk) = stream.next().await {
        received.extend_from_slice(&chunk.expect("COPY TO STDOUT chunk"));
    }
    let expected: String = (1..=COPY_ROWS).map(copy_line).collect();
    assert_eq!(received.len(), expected.len());
    assert!(received == expected.as_bytes(), "COPY data differs");
    // The server is back to normal for the next statement.
    assert_eq!(scalar_text(&client, "select 1").await, "1");
    assert_server_released(sluice.port()).await;
}

#[tokio::test]
async fn failed_copy_leaves_the_connection_usable() {
    let cluster = app_cluster(ServerAuth::Trust);
    grant_create(&cluster);
    let sluice = transaction_pool(&cluster, "1");
    let client = connect_as(sluice.port(), APP_USER, "postgres").await;
    create_copy_table(&client).await;
    let sink = client.copy_in("copy copied from stdin").await.unwrap();
    let mut sink = pin!(sink);
    let bad = b"1\tok\nnot-a-number\tboom\n".to_vec();
    let _ = sink.send(std::io::Cursor::new(bad)).await;
    expect_sqlstate(sink.as_mut().finish().await, "22P02");
    assert_eq!(
        scalar_text(&client, "select count(*) from copied").await,
        "0"
    );
    assert_server_released(sluice.port()).await;
}

/// A cancel request sent just after a transaction that changed settings
/// ended (a driver's timeout firing late) reaches nothing: not the
/// settings read-back sluice runs on the server then, which lost the
/// client's committed SET and the server (found by a review: 42 of 60).
#[tokio::test]
async fn a_late_cancel_loses_no_committed_setting() {
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = transaction_pool(&cluster, "1");
    let client = connect_as(sluice.port(), APP_USER, "postgres").await;
    let token = client.cancel_token();
    for round in 0..40 {
        let path = format!("s{round}, public");
        client
            .batch_execute(&format!("SET search_path = s{round}, public"))
            .await
            .expect("SET");
        token.cancel_query(NoTls).await.expect("cancel sent");
        // tokio-postgres does not wait for the cancel to be taken: it may
        // reach sluice while the next query waits for the server (busy
        // with the SET's read-back), and cancel that one, as a late cancel
        // cancels whatever runs on PostgreSQL when it lands. The SET must
        // survive either way.
        let shown = match client.simple_query("show search_path").await {
            Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::QUERY_CANCELED) => client
                .simple_query("show search_path")
                .await
                .expect("the client goes on"),
            other => other.expect("the client goes on"),
        };
        let value = shown.iter().find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
            _ => None,
        });
        assert_eq!(value.as_deref(), Some(path.as_str()), "round {round}");
    }
}

/// One server in transaction mode (others wait long), and a table
/// `waited` with `columns` the application user may write.
fn one_server_and_table(columns: &str) -> (Cluster, SluiceProcess) {
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = ConfigBuilder::for_cluster(&cluster)
        .set("pool_mode", "transaction")
        .set("default_pool_size", "1")
        .set("query_wait_timeout", "60")
        .start();
    app_table(&cluster, "waited", columns);
    (cluster, sluice)
}

/// Ctrl-C on a query still waiting for a server (the pool's only one is
/// held by another client's open transaction) is answered at once with
/// 57014, and the query never runs, not even once a server is free
/// (PgBouncer drops such a cancel and runs the query later, unasked).
/// Both shapes: a simple Query, and an extended-protocol batch.
#[tokio::test]
async fn a_query_cancelled_while_it_waits_for_a_server_never_runs() {
    let (_cluster, sluice) = one_server_and_table("v int");
    let holder = connect_as(sluice.port(), APP_USER, "postgres").await;
    let waiter = std::sync::Arc::new(connect_as(sluice.port(), APP_USER, "postgres").await);
    let token = waiter.cancel_token();
    for (round, extended) in [(1, false), (2, true)] {
        holder.batch_execute("begin").await.expect("begin");
        holder
            .batch_execute("select 1")
            .await
            .expect("in the transaction");
        let started = Instant::now();
        let insert = {
            let waiter = waiter.clone();
            tokio::spawn(async move {
                if extended {
                    waiter
                        .execute("insert into waited values ($1)", &[&round])
                        .await
                        .map(|_| ())
                } else {
                    waiter
                        .simple_query(&format!("insert into waited values ({round})"))
                        .await
                        .map(|_| ())
                }
            })
        };
        tokio::time::sleep(Duration::from_millis(1000)).await;
        assert!(
            !insert.is_finished(),
            "round {round}: the insert waits for the server"
        );
        token.cancel_query(NoTls).await.expect("cancel sent");
        let result = tokio::time::timeout(Duration::from_secs(5), insert)
            .await
            .unwrap_or_else(|_| {
                panic!("round {round}: the cancel must answer while the server is still held")
            })
            .expect("task");
        let error = expect_sqlstate(result, "57014");
        assert!(
            error
                .as_db_error()
                .is_some_and(|e| e.message().contains("cancel")),
            "{error:?}"
        );
        assert!(started.elapsed() < Duration::from_secs(5));
        holder.batch_execute("commit").await.expect("commit");
        // The server is free now: the cancelled insert must not run late.
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(
            scalar_text(&holder, "select count(*)::text from waited").await,
            "0",
            "round {round}: the cancelled insert ran"
        );
        // The waiter goes on as usual.
        assert_eq!(scalar_text(&waiter, "select 41 + 1").await, "42");
    }
}

/// The same out a PAUSE: the request waiting for RESUME is answered 57014
/// at once and never runs.
#[tokio::test]
async fn a_query_cancelled_while_paused_never_runs() {
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = ConfigBuilder::for_cluster(&cluster)
        .set("pool_mode", "transaction")
        .set("admin_users", "admin")
        .set("query_wait_timeout", "60")
        .start();
    app_table(&cluster, "waited", "v int");
    let admin = connect_as(sluice.port(), "admin", "pgbouncer").await;
    let waiter = std::sync::Arc::new(connect_as(sluice.port(), APP_USER, "postgres").await);
    assert_eq!(scalar_text(&waiter, "select 1").await, "1");
    let token = waiter.cancel_token();
    admin.simple_query("PAUSE postgres").await.expect("PAUSE");
    let insert = {
        let waiter = waiter.clone();
        tokio::spawn(async move { waiter.simple_query("insert into waited values (1)").await })
    };
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(!insert.is_finished(), "the insert waits out the pause");
    token.cancel_query(NoTls).await.expect("cancel sent");
    let result = tokio::time::timeout(Duration::from_secs(5), insert)
        .await
        .expect("the cancel must answer while the pause holds")
        .expect("task");
    expect_sqlstate(result, "57014");
    admin.simple_query("RESUME postgres").await.expect("RESUME");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        scalar_text(&waiter, "select count(*)::text from waited").await,
        "0"
    );
}

/// A raw client logged in (trust), with the cancel key sluice gave it.
async fn raw_with_key(port: u16) -> (RawClient, [u8; 8]) {
    let mut client = RawClient::connect(port).await;
    client.startup(APP_USER, "postgres").await;
    let mut key = None;
    loop {
        match client.read_message(Duration::from_secs(10)).await {
            RawReply::Message(b'K', body) => key = body.get(..8).map(|k| k.try_into().expect("8")),
            RawReply::Message(b'Z', _) => break,
            RawReply::Message(b'E', body) => panic!("login failed: {:?}", error_fields(&body)),
            RawReply::Message(..) => {}
            other => panic!("login did not complete: {other:?}"),
        }
    }
    (client, key.expect("BackendKeyData"))
}

async fn send_cancel(port: u16, key: [u8; 8]) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("cancel connection");
    let mut packet = 16i32.to_be_bytes().to_vec();
    packet.extend_from_slice(&80_877_102i32.to_be_bytes());
    packet.extend_from_slice(&key);
    stream.write_all(&packet).await.expect("send the cancel");
    let mut end = [0u8; 1];
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut end)).await;
}

/// A Bind with one text parameter of `value`, to the unnamed statement.
fn bind_text(value: &[u8]) -> Vec<u8> {
    let mut body = vec![0u8, 0u8];
    body.extend_from_slice(&0i16.to_be_bytes());
    body.extend_from_slice(&1i16.to_be_bytes());
    body.extend_from_slice(&i32::try_from(value.len()).expect("len").to_be_bytes());
    body.extend_from_slice(value);
    body.extend_from_slice(&0i16.to_be_bytes());
    sluice_tests::msg::message(b'B', &body)
}

/// A cancelled batch need not be whole when the cancel comes: one larger
/// than a read (a 20 KB parameter), of more than 64 messages, whose Sync
/// comes a second after the cancel, is answered 57014 at once and
/// ReadyForQuery at its Sync, and none of it runs. A lone Sync or Flush
/// waiting for a server runs nothing, so a cancel then leaves it (and the
/// next request) alone.
#[tokio::test]
async fn a_cancelled_batch_never_runs_however_it_arrives() {
    use sluice_tests::msg::{execute, flush, parse, sync};
    let (_cluster, sluice) = one_server_and_table("v text");
    let holder = connect_as(sluice.port(), APP_USER, "postgres").await;
    let (mut waiter, key) = raw_with_key(sluice.port()).await;

    holder.batch_execute("begin").await.expect("begin");
    holder.batch_execute("select 1").await.expect("in it");
    let mut batch = parse("", "insert into waited values ($1)");
    let big = vec![b'x'; 20_000];
    for _ in 0..40 {
        batch.extend(bind_text(&big));
        batch.extend(execute());
    }
    waiter.send(&batch).await.expect("send the batch");
    tokio::time::sleep(Duration::from_millis(1000)).await;
    send_cancel(sluice.port(), key).await;
    match waiter.read_message(Duration::from_secs(5)).await {
        RawReply::Message(b'E', body) => assert_eq!(
            error_field(&error_fields(&body), b'C'),
            Some("57014"),
            "{:?}",
            error_fields(&body)
        ),
        other => panic!("the cancel must answer at once, got {other:?}"),
    }
    // The rest of the batch, then its Sync, a second later.
    let mut rest = Vec::new();
    for _ in 0..40 {
        rest.extend(bind_text(b"late"));
        rest.extend(execute());
    }
    waiter.send(&rest).await.expect("send more");
    tokio::time::sleep(Duration::from_millis(1000)).await;
    waiter.send(&sync()).await.expect("send the Sync");
    assert_eq!(waiter.kinds_until_ready(Duration::from_secs(5)).await, "Z");
    holder.batch_execute("commit").await.expect("commit");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        scalar_text(&holder, "select count(*)::text from waited").await,
        "0",
        "nothing of the cancelled batch runs"
    );

    // A lone Sync: the cancel does nothing, the next request runs.
    holder.batch_execute("begin").await.expect("begin");
    holder.batch_execute("select 1").await.expect("in it");
    waiter.send(&sync()).await.expect("a lone Sync");
    tokio::time::sleep(Duration::from_millis(500)).await;
    send_cancel(sluice.port(), key).await;
    holder.batch_execute("commit").await.expect("commit");
    assert_eq!(waiter.kinds_until_ready(Duration::from_secs(5)).await, "Z");
    let mut next = parse("", "insert into waited values ($1)");
    next.extend(bind_text(b"next"));
    next.extend(execute());
    next.extend(sync());
    waiter.send(&next).await.expect("the next request");
    assert_eq!(
        waiter.kinds_until_ready(Duration::from_secs(5)).await,
        "12CZ"
    );
    assert_eq!(
        scalar_text(&holder, "select string_agg(v, ',') from waited").await,
        "next"
    );

    // A lone Flush runs nothing either: the cancel leaves it, and the
    // queries after it run (review 31: they were dropped until a Sync).
    holder.batch_execute("begin").await.expect("begin");
    holder.batch_execute("select 1").await.expect("in it");
    waiter.send(&flush()).await.expect("a lone Flush");
    tokio::time::sleep(Duration::from_millis(500)).await;
    send_cancel(sluice.port(), key).await;
    waiter
        .send(&query_message("insert into waited values ('after flush')"))
        .await
        .expect("a query after it");
    holder.batch_execute("commit").await.expect("commit");
    assert_eq!(waiter.kinds_until_ready(Duration::from_secs(5)).await, "CZ");
    assert_eq!(
        scalar_text(&holder, "select string_agg(v, ',' order by v) from waited").await,
        "after flush,next"
    );

    // A batch behind Flushes or Syncs is cancelled all the same; each
    // Sync is answered first (review 32: the batch ran after its cancel;
    // review 33: Syncs were miscounted).
    let leads = [
        (flush(), "E57014Z"),
        (sync(), "ZE57014Z"),
        ([sync(), sync(), sync()].concat(), "ZZZE57014Z"),
        ([flush(), sync()].concat(), "ZE57014Z"),
    ];
    for (lead, kinds) in leads {
        holder.batch_execute("begin").await.expect("begin");
        holder.batch_execute("select 1").await.expect("in it");
        let mut batch = lead;
        batch.extend(parse("", "insert into waited values ($1)"));
        batch.extend(bind_text(b"behind"));
        batch.extend(execute());
        batch.extend(sync());
        waiter.send(&batch).await.expect("send");
        tokio::time::sleep(Duration::from_millis(500)).await;
        send_cancel(sluice.port(), key).await;
        let mut got = String::new();
        while got.matches('Z').count() < kinds.matches('Z').count() {
            got += &waiter.kinds_until_ready(Duration::from_secs(5)).await;
        }
        assert_eq!(got, kinds);
        holder.batch_execute("commit").await.expect("commit");
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        scalar_text(
            &holder,
            "select count(*)::text from waited where v = 'behind'"
        )
        .await,
        "0",
        "a cancelled batch behind a Flush or a Sync never runs"
    );
}
