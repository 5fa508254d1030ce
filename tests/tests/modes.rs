//! Pool modes: transaction pooling shares servers between clients while
//! each client keeps its own tracked settings; session pooling resets a
//! server (DISCARD ALL) before the next client gets it; statement pooling
//! refuses transaction blocks. Both query protocols and pipelining work.

use futures_util::future::join_all;
use sluice_tests::*;
use tokio_postgres::Client;

fn pooled(cluster: &Cluster, mode: &str, pool_size: u32) -> SluiceProcess {
    ConfigBuilder::for_cluster(cluster)
        .set("pool_mode", mode)
        .set("default_pool_size", &pool_size.to_string())
        .start()
}

async fn backend_pid(client: &Client) -> String {
    scalar_text(client, "select pg_backend_pid()").await
}

#[tokio::test]
async fn transaction_mode_shares_one_server_among_many_clients() {
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = pooled(&cluster, "transaction", 1);
    let mut clients = Vec::new();
    for _ in 0..10 {
        clients.push(connect_as(sluice.port(), APP_USER, "postgres").await);
    }
    let mut pids = Vec::new();
    for client in &mut clients {
        let tx = client.transaction().await.expect("begin");
        let pid: i32 = tx
            .query_one("select pg_backend_pid()", &[])
            .await
            .unwrap()
            .get(0);
        tx.commit().await.expect("commit");
        pids.push(pid);
    }
    assert!(pids.iter().all(|pid| *pid == pids[0]), "pids: {pids:?}");
    assert_eq!(count_backends(&cluster, "postgres").await, 1);
}

#[tokio::test]
async fn transaction_mode_settings_follow_their_client_only() {
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = pooled(&cluster, "transaction", 1);
    let alice = connect_as(sluice.port(), APP_USER, "postgres").await;
    let bob = connect_as(sluice.port(), APP_USER, "postgres").await;
    let mut carol_config = tokio_postgres::Config::new();
    carol_config
        .host("127.0.0.1")
        .port(sluice.port())
        .user(APP_USER)
        .dbname("postgres")
        .application_name("carol");
    let carol = connect_config(&carol_config).await.expect("carol logs in");

    let default_zone = scalar_text(&bob, "show TimeZone").await;
    let zone = if default_zone == "Asia/Tokyo" {
        "America/Lima"
    } else {
        "Asia/Tokyo"
    };
    alice
        .simple_query("set application_name = 'alice'")
        .await
        .unwrap();
    alice
        .simple_query(&format!("set TimeZone = '{zone}'"))
        .await
        .unwrap();

    for round in 0..3 {
        assert_eq!(
            backend_pid(&alice).await,
            backend_pid(&bob).await,
            "one server"
        );
        assert_eq!(
            scalar_text(&bob, "show application_name").await,
            "",
            "round {round}"
        );
        assert_eq!(
            scalar_text(&bob, "show TimeZone").await,
            default_zone,
            "round {round}"
        );
        assert_eq!(scalar_text(&carol, "show application_name").await, "carol");
        assert_eq!(scalar_text(&alice, "show application_name").await, "alice");
        assert_eq!(
            scalar_text(&alice, "show TimeZone").await,
            zone,
            "round {round}"
        );
    }
}

#[tokio::test]
async fn transaction_mode_set_local_does_not_persist() {
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = pooled(&cluster, "transaction", 1);
    let mut client = connect_as(sluice.port(), APP_USER, "postgres").await;
    let before = scalar_text(&client, "show TimeZone").await;
    let tx = client.transaction().await.unwrap();
    tx.batch_execute("set local TimeZone = 'Pacific/Auckland'")
        .await
        .unwrap();
    let inside: String = tx
        .query_one("select current_setting('TimeZone')", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(inside, "Pacific/Auckland");
    tx.commit().await.unwrap();
    assert_eq!(scalar_text(&client, "show TimeZone").await, before);
    let other = connect_as(sluice.port(), APP_USER, "postgres").await;
    assert_eq!(scalar_text(&other, "show TimeZone").await, before);
}

#[tokio::test]
async fn session_mode_resets_the_server_for_the_next_client() {
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = pooled(&cluster, "session", 1);
    let first = connect_as(sluice.port(), APP_USER, "postgres").await;
    let first_pid = backend_pid(&first).await;
    first
        .batch_execute(
            "create temp table leftover(x int); \
             set work_mem = '7MB'; \
             set application_name = 'first'; \
             prepare leftover_stmt as select 1; \
             select set_config('my.var', 'kept', false);",
        )
        .await
        .unwrap();
    let default_work_mem = cluster.psql("postgres", "show work_mem").unwrap();
    drop(first);

    let second = connect_as(sluice.port(), APP_USER, "postgres").await;
    assert_eq!(
        backend_pid(&second).await,
        first_pid,
        "pool of 1: same server"
    );
    assert_eq!(
        scalar(&second, "select to_regclass('leftover')::text").await,
        None
    );
    assert_eq!(
        scalar_text(&second, "show work_mem").await,
        default_work_mem
    );
    assert_eq!(scalar_text(&second, "show application_name").await, "");
    assert_eq!(
        scalar_text(&second, "select count(*) from pg_prepared_statements").await,
        "0"
    );
    assert_eq!(
        scalar(
            &second,
            "select nullif(current_setting('my.var', true), '')"
        )
        .await,
        None
    );
}

#[tokio::test]
async fn statement_mode_runs_autocommit_statements_and_refuses_begin() {
    let cluster = app_cluster(ServerAuth::Trust);
    grant_create(&cluster);
    let sluice = pooled(&cluster, "statement", 1);
    let client = connect_as(sluice.port(), APP_USER, "postgres").await;
    client
        .simple_query("create table items(x int)")
        .await
        .unwrap();
    for i in 0..5 {
        client
            .execute("insert into items values ($1)", &[&i])
            .await
            .unwrap();
    }
    assert_eq!(
        scalar_text(&client, "select count(*) from items").await,
        "5"
    );

    let blocked = connect_as(sluice.port(), APP_USER, "postgres").await;
    let error = expect_sqlstate(blocked.simple_query("begin").await, "25000");
    assert_eq!(
        error.as_db_error().unwrap().message(),
        "transaction blocks not allowed in statement pooling mode"
    );
    // Other clients are unaffected.
    assert_eq!(
        scalar_text(&client, "select count(*) from items").await,
        "5"
    );
}

#[tokio::test]
async fn extended_protocol_inside_transactions() {
    let cluster = app_cluster(ServerAuth::Trust);
    grant_create(&cluster);
    let sluice = pooled(&cluster, "transaction", 2);
    let setup = connect_as(sluice.port(), APP_USER, "postgres").await;
    setup
        .batch_execute("create table kv(k int primary key, v text)")
        .await
        .unwrap();

    let tasks = (0..6).map(|worker: i32| {
        let port = sluice.port();
        tokio::spawn(async move {
            let mut client = connect_as(port, APP_USER, "postgres").await;
            for round in 0..5 {
                let tx = client.transaction().await.unwrap();
                let insert = tx.prepare("insert into kv values ($1, $2)").await.unwrap();
                let key = worker * 100 + round;
                tx.execute(&insert, &[&key, &format!("w{worker}")])
                    .await
                    .unwrap();
                let select = tx.prepare("select v from kv where k = $1").await.unwrap();
                let value: String = tx.query_one(&select, &[&key]).await.unwrap().get(0);
                assert_eq!(value, format!("w{worker}"));
                tx.commit().await.unwrap();
            }
        })
    });
    for task in join_all(tasks).await {
        task.expect("worker succeeded");
    }
    assert_eq!(scalar_text(&setup, "select count(*) from kv").await, "30");
}

#[tokio::test]
async fn simple_protocol_batches_and_multi_statement_queries() {
    let cluster = app_cluster(ServerAuth::Trust);
    grant_create(&cluster);
    let sluice = pooled(&cluster, "transaction", 1);
    let client = connect_as(sluice.port(), APP_USER, "postgres").await;
    client
        .batch_execute(
            "begin; create table t(x int); insert into t select generate_series(1, 10); commit;",
        )
        .await
        .unwrap();
    let messages = client
        .simple_query("select count(*) from t; select sum(x) from t")
        .await
        .unwrap();
    let values: Vec<String> = messages
        .iter()
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
            _ => None,
        })
        .collect();
    assert_eq!(values, ["10", "55"]);
    // An error inside a batch leaves the client usable, outside any transaction.
    assert!(client.batch_execute("select 1/0").await.is_err());
    assert_eq!(scalar_text(&client, "select 1").await, "1");
    assert_eq!(
        scalar(&client, "select txid_current_if_assigned()::text").await,
        None
    );
}

#[tokio::test]
async fn pipelined_queries_on_one_client() {
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = pooled(&cluster, "transaction", 1);
    let client = connect_as(sluice.port(), APP_USER, "postgres").await;
    let queries = (0..20).map(|i: i32| {
        let client = &client;
        async move {
            let row = client.query_one("select $1::int * 2", &[&i]).await?;
            Ok::<i32, tokio_postgres::Error>(row.get(0))
        }
    });
    let results = join_all(queries).await;
    for (i, result) in results.into_iter().enumerate() {
        assert_eq!(
            result.expect("pipelined query"),
            i32::try_from(i).unwrap() * 2
        );
    }
}

/// max_prepared_statements (documented in docs/config.md): a statement
/// prepared by a client keeps working in later transactions even when
/// another server runs them.
#[tokio::test]
async fn prepared_statements_survive_server_switches_in_transaction_mode() {
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = pooled(&cluster, "transaction", 3);
    let tasks = (0..6).map(|worker: i32| {
        let port = sluice.port();
        tokio::spawn(async move {
            let client = connect_as(port, APP_USER, "postgres").await;
            let statement = client.prepare("select $1::int + 1").await?;
            for round in 0..20 {
                let row = client.query_one(&statement, &[&(worker + round)]).await?;
                assert_eq!(row.get::<_, i32>(0), worker + round + 1);
            }
            Ok::<(), tokio_postgres::Error>(())
        })
    });
    for task in join_all(tasks).await {
        task.expect("no panic")
            .expect("prepared statement usable across transactions");
    }
}

/// Reads messages until `n` ReadyForQuery; returns their tags (the
/// ReadyForQuery included), or fails after two seconds without one.
async fn tags_until_ready(raw: &mut RawClient, mut n: usize) -> Vec<u8> {
    let mut tags = Vec::new();
    while n > 0 {
        match raw.read_message(std::time::Duration::from_secs(2)).await {
            RawReply::Message(tag, _) => {
                tags.push(tag);
                if tag == b'Z' {
                    n -= 1;
                }
            }
            other => panic!(
                "no ReadyForQuery within 2 s after {:?}: {other:?}",
                String::from_utf8_lossy(&tags)
            ),
        }
    }
    tags
}

/// In transaction mode the relay holds back a server message until the
/// bytes before it are with the client (a reply sluice drops, or its own
/// reply due first): the ReadyForQuery after it must come at once, not
/// when the client sends its next request. (A relay that went on waiting
/// after writes while replies were owed kept it back.)
#[tokio::test]
async fn replies_held_back_until_the_client_has_the_rest_come_at_once() {
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = ConfigBuilder::for_cluster(&cluster)
        .set("pool_mode", "transaction")
        .set("default_pool_size", "2")
        .set("max_prepared_statements", "100")
        .start();
    let mut raw = RawClient::logged_in(sluice.port(), APP_USER, "postgres").await;

    // Close of a shared statement in the same batch: its CloseComplete is
    // sluice's own reply, due after the server's.
    for round in 0..3 {
        let mut batch = msg::parse("s1", "select 1");
        batch.extend(msg::bind("s1"));
        batch.extend(msg::execute());
        batch.extend(msg::close_statement("s1"));
        batch.extend(msg::sync());
        raw.send(&batch).await.expect("send");
        assert_eq!(
            tags_until_ready(&mut raw, 1).await,
            b"12DC3Z".to_vec(),
            "round {round}"
        );
    }

    // Two pipelined batches, the second's statements prepared by sluice
    // on whichever server it gets.
    let mut batch = msg::parse("a", "select 1");
    batch.extend(msg::parse("b", "select 2"));
    batch.extend(msg::sync());
    raw.send(&batch).await.expect("send");
    assert_eq!(tags_until_ready(&mut raw, 1).await, b"11Z".to_vec());
    for round in 0..3 {
        let mut batch = msg::bind("a");
        batch.extend(msg::execute());
        batch.extend(msg::sync());
        batch.extend(msg::bind("b"));
        batch.extend(msg::execute());
        batch.extend(msg::sync());
        raw.send(&batch).await.expect("send");
        let tags = tags_until_ready(&mut raw, 2).await;
        assert_eq!(
            tags.iter().filter(|t| **t == b'D').count(),
            2,
            "round {round}: {:?}",
            String::from_utf8_lossy(&tags)
        );
    }

    // A notification to the client itself, which the tracked relay drops
    // before the ReadyForQuery (LISTEN follows the client, not the server).
    raw.send(&msg::query("listen ch; notify ch, 'x'"))
        .await
        .expect("send");
    let tags = tags_until_ready(&mut raw, 1).await;
    assert_eq!(tags.last(), Some(&b'Z'), "{tags:?}");
    // (and the notification itself comes through the pool's hub)
    if !tags.contains(&b'A') {
        match raw.read_message(std::time::Duration::from_secs(2)).await {
            RawReply::Message(b'A', _) => {}
            other => panic!("no notification: {other:?}"),
        }
    }
}

/// A client that writes without reading — a COPY of 20 MB pipelined
/// behind a reply it has not read yet, as a blocking client does — is
/// read while that reply waits for it: the COPY goes to the server, the
/// client's writes finish, and both replies come. (A relay that stopped
/// reading the client while it flushed the last replies left both sides
/// waiting for the other, the server leased for good.)
#[tokio::test]
async fn a_client_writing_a_copy_behind_an_unread_reply_is_read_meanwhile() {
    let cluster = app_cluster(ServerAuth::Trust);
    grant_create(&cluster);
    let setup = superuser_connect(&cluster, "postgres").await;
    setup
        .batch_execute(&format!(
            "create table pipelined_copy(x text); grant all on pipelined_copy to {APP_USER}"
        ))
        .await
        .expect("create table");
    for (backend, reply) in [
        ("io_uring", 200_000),
        ("io_uring", 300_000),
        ("epoll", 200_000),
        ("epoll", 300_000),
    ] {
        let sluice = ConfigBuilder::for_cluster(&cluster)
            .set("pool_mode", "transaction")
            .set("default_pool_size", "2")
            .set("tcp_socket_buffer", "65536")
            .sluice("io_backend", backend)
            .start();
        let mut raw = RawClient::connect_with_recv_buffer(sluice.port(), 4096).await;
        raw.startup(APP_USER, "postgres").await;
        raw.read_until_ready(std::time::Duration::from_secs(10))
            .await;
        raw.send(&msg::query(&format!("select repeat('x', {reply})")))
            .await
            .expect("send");
        // The reply's tail is with sluice now, waiting for the client.
        tokio::time::sleep(std::time::Duration::from_millis(700)).await;
        let line = [b"y".repeat(999), b"\n".to_vec()].concat();
        let mut copy = msg::query("copy pipelined_copy from stdin");
        for _ in 0..20_000 {
            copy.extend(msg::copy_data(&line));
        }
        copy.extend(msg::copy_done());
        let sent = tokio::time::timeout(std::time::Duration::from_secs(30), raw.send(&copy)).await;
        assert!(
            matches!(sent, Ok(Ok(()))),
            "{backend}, reply of {reply} bytes: the client's 20 MB did not go in 30 s: {sent:?}"
        );
        let mut completions = Vec::new();
        let mut ready = 0;
        while ready < 2 {
            match raw.read_message(std::time::Duration::from_secs(30)).await {
                RawReply::Message(b'C', body) => {
                    completions.push(
                        String::from_utf8_lossy(&body)
                            .trim_end_matches('\0')
                            .to_owned(),
                    );
                }
                RawReply::Message(b'Z', _) => ready += 1,
                RawReply::Message(b'E', body) => panic!("error: {:?}", error_fields(&body)),
                RawReply::Message(..) => {}
                other => {
                    panic!("{backend}, reply of {reply} bytes: {other:?} after {completions:?}")
                }
            }
        }
        assert_eq!(
            completions,
            ["SELECT 1", "COPY 20000"],
            "{backend}, reply of {reply} bytes"
        );
    }
}

/// PostgreSQL ignores everything after an error in an extended-protocol
/// batch up to its Sync, a simple Query too: no ReadyForQuery comes for
/// that Query. A client sending Parse (failing), Bind, Execute, Query,
/// Sync must not keep its server as if a reply were still owed: the only
/// server goes back to the pool and the next client gets it. Without the
/// Sync, the server ignores all until one comes: it stays with the client,
/// and idle_transaction_timeout applies.
#[tokio::test]
async fn a_query_ignored_after_an_extended_error_owes_nothing() {
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = ConfigBuilder::for_cluster(&cluster)
        .set("pool_mode", "transaction")
        .set("default_pool_size", "1")
        .set("idle_transaction_timeout", "2")
        .set("query_wait_timeout", "20")
        .start();
    let mut raw = RawClient::logged_in(sluice.port(), APP_USER, "postgres").await;
    let mut batch = msg::parse("", "selec 1");
    batch.extend(msg::bind(""));
    batch.extend(msg::execute());
    batch.extend(msg::query("select 1"));
    batch.extend(msg::sync());
    raw.send(&batch).await.expect("send");
    assert_eq!(tags_until_ready(&mut raw, 1).await, b"EZ".to_vec());
    // The only server is free: another client runs at once.
    let other = connect_as(sluice.port(), APP_USER, "postgres").await;
    let answered = tokio::time::timeout(
        std::time::Duration::from_secs(1),
        scalar_text(&other, "select 'free'"),
    )
    .await;
    assert_eq!(
        answered.ok().as_deref(),
        Some("free"),
        "the server stayed leased"
    );
    // And the first client goes on normally.
    assert_eq!(
        raw.simple_query("select 2", std::time::Duration::from_secs(5))
            .await,
        vec![Some("2".to_owned())]
    );

    // No Sync yet: the server still ignores what comes; it is not shared,
    // and the idle transaction's timeout ends it.
    let mut batch = msg::parse("", "selec 1");
    batch.extend(msg::bind(""));
    batch.extend(msg::execute());
    batch.extend(msg::query("select 1"));
    raw.send(&batch).await.expect("send");
    match raw.read_message(std::time::Duration::from_secs(5)).await {
        RawReply::Message(b'E', _) => {}
        other => panic!("expected the Parse's error: {other:?}"),
    }
    let started = std::time::Instant::now();
    let waited = tokio::time::timeout(
        std::time::Duration::from_secs(15),
        scalar_text(&other, "select 'after'"),
    )
    .await;
    assert_eq!(waited.ok().as_deref(), Some("after"));
    assert!(
        started.elapsed() >= std::time::Duration::from_millis(1500),
        "the server was shared while it ignored messages ({:?})",
        started.elapsed()
    );
    let told = raw
        .expect_error_or_close(std::time::Duration::from_secs(5))
        .await
        .expect("told why before the close");
    assert_eq!(error_field(&told, b'C'), Some("25P03"), "{told:?}");
}

/// A batch that sluice mostly answers itself (Close and Parse of a
/// statement it knows) behind one request the server answers, with its
/// one Sync at the end: PostgreSQL keeps that request's replies until the
/// Sync, sluice's own must come after them, and the client writes its
/// whole batch before it reads. sluice sends the server a Flush when its
/// queue stops, so the batch goes through instead of the two waiting on
/// each other (with the server held for ever), and the pool serves others.
#[tokio::test]
async fn a_batch_mostly_answered_by_sluice_behind_an_unflushed_reply_goes_through() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = ConfigBuilder::for_cluster(&cluster)
        .set("pool_mode", "transaction")
        .set("default_pool_size", "1")
        .set("query_wait_timeout", "20")
        .start();
    let mut raw = RawClient::logged_in(sluice.port(), APP_USER, "postgres").await;
    raw.send(&[msg::parse("s1", "select 1"), msg::sync()].concat())
        .await
        .expect("send");
    raw.read_until_ready(std::time::Duration::from_secs(10))
        .await;
    let stream = raw.into_stream();
    let (mut rd, mut wr) = stream.into_split();
    const N: usize = 100_000;
    let mut batch = [msg::bind("s1"), msg::execute()].concat();
    for _ in 0..N {
        batch.extend(msg::close_statement("s1"));
        batch.extend(msg::parse("s1", "select 1"));
    }
    batch.extend(msg::sync());
    let reader = tokio::spawn(async move {
        // Every reply up to ReadyForQuery: 2 + 2N small messages.
        let mut seen = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = rd.read(&mut buf).await.expect("read");
            assert!(n > 0, "closed after {} bytes", seen.len());
            seen.extend_from_slice(&buf[..n]);
            if seen.ends_with(&[b'Z', 0, 0, 0, 5, b'I']) {
                return seen.len();
            }
        }
    });
    wr.write_all(&batch).await.expect("write the batch");
    let got = tokio::time::timeout(std::time::Duration::from_secs(30), reader)
        .await
        .expect("the whole batch is answered")
        .expect("reader");
    // BindComplete, DataRow, CommandComplete, then CloseComplete and
    // ParseComplete N times, and ReadyForQuery.
    assert!(got > 10 * N, "{got} bytes");
    // The only server is free for another client.
    let other = connect_as(sluice.port(), APP_USER, "postgres").await;
    assert_eq!(scalar_text(&other, "select 7").await, "7");
}
