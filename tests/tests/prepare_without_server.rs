//! A client between transactions that only prepares statements (Parse then
//! Sync, as libpq's PQprepare sends) is answered by sluice without a
//! server, once a server accepted the same text: pgbench's TPC-B in
//! `-M prepared` with more clients than servers otherwise deadlocks (its
//! blocking prepare waits for a server its own other clients hold), which
//! every pooler measured in issue 13 did. Errors that PostgreSQL gives at
//! Parse still come from PostgreSQL.

use std::time::Duration;

use sluice_tests::*;

const T: Duration = Duration::from_secs(10);

#[test]
fn pgbench_tpcb_prepared_with_150_and_1000_clients_on_a_pool_of_10() {
    raise_fd_limit(20_000);
    let cluster = app_cluster_with(ServerAuth::Trust, |b| b.max_connections(60));
    cluster.pgbench_init("postgres", 2).expect("pgbench -i");
    let sluice = ConfigBuilder::for_cluster(&cluster)
        .set("pool_mode", "transaction")
        .set("default_pool_size", "10")
        .set("max_client_conn", "1200")
        .set("listen_backlog", "2048")
        // Without the fix the first blocked prepare ends the run here.
        .set("query_wait_timeout", "15")
        .start();
    let superuser = cluster.superuser();
    for clients in ["150", "1000"] {
        let output = pgbench(
            sluice.port(),
            superuser,
            "",
            "postgres",
            &["-M", "prepared", "-c", clients, "-j", "2", "-T", "4", "-n"],
            Duration::from_secs(120),
        );
        assert!(
            output.success(),
            "pgbench -M prepared -c {clients} failed ({}):\n{}\n{}",
            output.status,
            output.stdout,
            output.stderr
        );
        assert_eq!(
            pgbench_failed(&output.stdout),
            Some(0),
            "pgbench report:\n{}",
            output.stdout
        );
        let processed = pgbench_processed(&output.stdout);
        assert!(
            processed.is_some_and(|n| n >= 100),
            "{clients} clients: {processed:?} transactions\n{}",
            output.stdout
        );
        eprintln!(
            "TPC-B -M prepared, {clients} clients, pool 10: {processed:?} transactions, 0 failed"
        );
    }
    assert!(count_backends_psql(&cluster, "postgres") <= 10);
}

/// Reads until ReadyForQuery; returns the tags read and the status byte.
async fn until_ready(raw: &mut RawClient) -> (Vec<u8>, Vec<(u8, String)>, u8) {
    let mut tags = Vec::new();
    let mut error = Vec::new();
    loop {
        match raw.read_message(T).await {
            RawReply::Message(b'Z', body) => return (tags, error, body[0]),
            RawReply::Message(b'E', body) => {
                error = error_fields(&body);
                tags.push(b'E');
            }
            RawReply::Message(tag, _) => tags.push(tag),
            other => panic!("no ReadyForQuery: {other:?}"),
        }
    }
}

async fn raw_client(port: u16) -> RawClient {
    let mut raw = RawClient::connect(port).await;
    raw.startup(APP_USER, "postgres").await;
    raw.read_until_ready(T).await;
    raw
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_known_statement_is_prepared_while_every_server_is_busy() {
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = ConfigBuilder::for_cluster(&cluster)
        .set("pool_mode", "transaction")
        .set("default_pool_size", "1")
        .set("query_wait_timeout", "30")
        .start();
    let port = sluice.port();
    let text = "select 41 + 1";

    // A first client prepares the text on the server, then uses it.
    let mut first = raw_client(port).await;
    let mut batch = msg::parse("s1", text);
    batch.extend(msg::sync());
    first.send(&batch).await.expect("send");
    let (tags, error, status) = until_ready(&mut first).await;
    assert_eq!((tags, status), (vec![b'1'], b'I'), "{error:?}");

    // Another client holds the only server in a transaction.
    let mut holder = raw_client(port).await;
    holder.simple_query("begin", T).await;

    // A third prepares the same text under its own name: answered at once,
    // without the server (before, it waited for the holder).
    let mut third = raw_client(port).await;
    let mut batch = msg::parse("mine", text);
    batch.extend(msg::sync());
    third.send(&batch).await.expect("send");
    let (tags, error, status) = until_ready(&mut third).await;
    assert_eq!((tags, status), (vec![b'1'], b'I'), "{error:?}");
    // Its name already stands for the statement: a Parse of it again is
    // PostgreSQL's 42P05, which needs the server (asked after the holder
    // commits).
    // A Bind of it waits for the server, then runs.
    let mut run = msg::bind("mine");
    run.extend(msg::execute());
    run.extend(msg::sync());
    third.send(&run).await.expect("send");
    assert_eq!(
        third.read_message(Duration::from_millis(500)).await,
        RawReply::TimedOut
    );
    holder.simple_query("commit", T).await;
    let (tags, error, status) = until_ready(&mut third).await;
    assert_eq!((tags, status), (vec![b'2', b'D', b'C'], b'I'), "{error:?}");

    let mut again = msg::parse("mine", text);
    again.extend(msg::sync());
    third.send(&again).await.expect("send");
    let (tags, error, _) = until_ready(&mut third).await;
    assert_eq!(tags, vec![b'E']);
    assert_eq!(error_field(&error, b'C'), Some("42P05"), "{error:?}");

    // Close then Parse of another proven text, answered here too.
    let mut batch = msg::close_statement("mine");
    batch.extend(msg::sync());
    batch.extend(msg::parse("mine", text));
    batch.extend(msg::sync());
    holder.simple_query("begin", T).await;
    third.send(&batch).await.expect("send");
    let (tags, _, _) = until_ready(&mut third).await;
    assert_eq!(tags, vec![b'3']);
    let (tags, _, _) = until_ready(&mut third).await;
    assert_eq!(tags, vec![b'1']);

    // A text no server has accepted goes to one, so a syntax error comes
    // at Parse, from PostgreSQL (after the holder lets the server go).
    let mut bad = msg::parse("bad", "selec 1");
    bad.extend(msg::sync());
    third.send(&bad).await.expect("send");
    assert_eq!(
        third.read_message(Duration::from_millis(500)).await,
        RawReply::TimedOut
    );
    holder.simple_query("commit", T).await;
    let (tags, error, status) = until_ready(&mut third).await;
    assert_eq!((tags, status), (vec![b'E'], b'I'));
    assert_eq!(error_field(&error, b'C'), Some("42601"), "{error:?}");
    // And the failed name does not exist.
    let mut run = msg::bind("bad");
    run.extend(msg::execute());
    run.extend(msg::sync());
    third.send(&run).await.expect("send");
    let (_, error, _) = until_ready(&mut third).await;
    assert_eq!(error_field(&error, b'C'), Some("26000"), "{error:?}");

    // A batch that arrives in two writes is still answered without the
    // server (the Sync is waited for, not a server).
    holder.simple_query("begin", T).await;
    let mut fourth = raw_client(port).await;
    fourth.send(&msg::parse("split", text)).await.expect("send");
    tokio::time::sleep(Duration::from_millis(200)).await;
    fourth.send(&msg::sync()).await.expect("send");
    let (tags, error, _) = until_ready(&mut fourth).await;
    assert_eq!(tags, vec![b'1'], "{error:?}");
    holder.simple_query("commit", T).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_text_whose_table_was_dropped_is_no_longer_trusted() {
    let cluster = app_cluster(ServerAuth::Trust);
    grant_create(&cluster);
    let sluice = ConfigBuilder::for_cluster(&cluster)
        .set("pool_mode", "transaction")
        .set("default_pool_size", "2")
        .start();
    let port = sluice.port();
    let text = "select count(*) from doomed";
    let mut owner = raw_client(port).await;
    owner.simple_query("create table doomed (x int)", T).await;
    let mut batch = msg::parse("d", text);
    batch.extend(msg::sync());
    owner.send(&batch).await.expect("send");
    let (tags, error, _) = until_ready(&mut owner).await;
    assert_eq!(tags, vec![b'1'], "{error:?}");
    owner.simple_query("drop table doomed", T).await;

    // Proven before the DROP: accepted here, refused at its Bind by a
    // server that must parse it again (PostgreSQL would refuse the Parse).
    let mut late = raw_client(port).await;
    let mut batch = msg::parse("d", text);
    batch.extend(msg::sync());
    late.send(&batch).await.expect("send");
    let (tags, _, _) = until_ready(&mut late).await;
    assert_eq!(tags, vec![b'1']);
    let mut run = msg::bind("d");
    run.extend(msg::execute());
    run.extend(msg::sync());
    late.send(&run).await.expect("send");
    let (_, error, _) = until_ready(&mut late).await;
    assert_eq!(error_field(&error, b'C'), Some("42P01"), "{error:?}");

    // That refusal withdrew the proof: the next Parse goes to a server and
    // fails at Parse, as on PostgreSQL.
    let mut next = raw_client(port).await;
    let mut batch = msg::parse("d", text);
    batch.extend(msg::sync());
    next.send(&batch).await.expect("send");
    let (tags, error, _) = until_ready(&mut next).await;
    assert_eq!(tags, vec![b'E']);
    assert_eq!(error_field(&error, b'C'), Some("42P01"), "{error:?}");
}
