//! Read routing (issue 10, first part) against a real primary and a real
//! streaming replica: reads go to the replica, writes and anything not
//! provably a read to the primary; a replica that lags past the limits
//! gets no reads until it catches up; SHOW HOSTS tells roles, state and
//! lag; a cancel reaches the replica a query runs on; with routing off a
//! host list behaves as PgBouncer's (the first host).

use std::time::{Duration, Instant};

use sluice_testkit::Cluster;
use sluice_tests::*;
use tokio_postgres::{Client, NoTls, SimpleQueryMessage};

/// A primary with a table the app may write, and a replica of it.
fn primary_and_replica() -> (Cluster, Cluster) {
    primary_and_replica_with(&[])
}

/// [`primary_and_replica`] with extra server settings.
fn primary_and_replica_with(settings: &[(&str, &str)]) -> (Cluster, Cluster) {
    let primary = app_cluster_with(ServerAuth::Trust, |mut b| {
        for (k, v) in settings {
            b = b.setting(k, v);
        }
        b
    });
    primary
        .psql(
            "postgres",
            &format!(
                "create table items (id int primary key, note text); \
                 grant all on items to {APP_USER}; \
                 create sequence seq; grant all on seq to {APP_USER}; \
                 create function app_price(int) returns int stable language sql \
                   as 'select $1 * 2'; \
                 create function app_bump(int) returns int language sql \
                   as 'insert into items values ($1 + 1000, ''bump'') returning id'; \
                 create function app_sneaky() returns bigint stable language sql \
                   as 'select nextval(''seq'')'"
            ),
        )
        .expect("schema");
    let replica = primary.start_replica().expect("start a streaming replica");
    (primary, replica)
}

/// sluice in transaction mode with `postgres` on both hosts.
fn routed(
    primary: &Cluster,
    replica: &Cluster,
    extra: &str,
    sluice: &[(&str, &str)],
) -> SluiceProcess {
    routed_config(primary, replica, extra, sluice).start()
}

fn routed_config(
    primary: &Cluster,
    replica: &Cluster,
    extra: &str,
    sluice: &[(&str, &str)],
) -> ConfigBuilder {
    let entry = format!(
        "host={h},{h} port={p},{r} dbname=postgres {extra}",
        h = primary.host(),
        p = primary.port(),
        r = replica.port()
    );
    let mut builder = ConfigBuilder::new()
        .database("postgres", entry.trim_end())
        .set("pool_mode", "transaction")
        .set("default_pool_size", "4")
        .set("admin_users", APP_USER);
    for (k, v) in sluice {
        builder = builder.sluice(k, v);
    }
    builder
}

async fn console_rows(sluice: &SluiceProcess, command: &str) -> Vec<Vec<Option<String>>> {
    let admin = connect_as(sluice.port(), APP_USER, "pgbouncer").await;
    let messages = admin.simple_query(command).await.expect(command);
    messages
        .into_iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(r) => {
                Some((0..r.len()).map(|i| r.get(i).map(str::to_owned)).collect())
            }
            _ => None,
        })
        .collect()
}

/// SHOW HOSTS rows as (port, role, state, lag_bytes).
async fn hosts(sluice: &SluiceProcess) -> Vec<(String, String, String, Option<u64>)> {
    console_rows(sluice, "SHOW HOSTS")
        .await
        .into_iter()
        .map(|r| {
            let s = |i: usize| r.get(i).cloned().flatten().unwrap_or_default();
            (s(2), s(3), s(4), s(5).parse().ok())
        })
        .collect()
}

/// Waits until SHOW HOSTS shows the primary and the replica up, the
/// replica's lag measured (until then reads stay on the primary). The
/// checks log in as the database's first client does, so one logs in
/// first.
async fn wait_for_roles(sluice: &SluiceProcess, primary: &Cluster, replica: &Cluster) {
    let first = connect_as(sluice.port(), APP_USER, "postgres").await;
    scalar_text(&first, "select 1").await;
    let want = [
        (primary.port().to_string(), "primary"),
        (replica.port().to_string(), "replica"),
    ];
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let now = hosts(sluice).await;
        let ok = want.iter().all(|(port, role)| {
            now.iter()
                .any(|(p, r, s, lag)| p == port && r == role && s == "up" && lag.is_some())
        });
        if ok {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "hosts never showed their roles: {now:?}\n{}",
            sluice.log_tail(30)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn in_recovery(client: &Client, sql: &str) -> bool {
    scalar_text(client, sql).await == "t"
}

/// sluice routing reads over `primary` and `replica` (with `settings` in
/// its [sluice] section), its checks settled.
async fn reading_with(
    primary: &Cluster,
    replica: &Cluster,
    settings: &[(&str, &str)],
) -> SluiceProcess {
    let sluice = routed(primary, replica, "route_reads=1", settings);
    wait_for_roles(&sluice, primary, replica).await;
    sluice
}

/// sluice routing reads over `primary` and `replica` (with `settings` in
/// its [sluice] section), its checks settled, and a client whose first
/// read ran on the replica.
async fn reading_client(
    primary: &Cluster,
    replica: &Cluster,
    settings: &[(&str, &str)],
) -> (SluiceProcess, Client) {
    let sluice = reading_with(primary, replica, settings).await;
    let client = connect_as(sluice.port(), APP_USER, "postgres").await;
    assert!(in_recovery(&client, "select pg_is_in_recovery()").await);
    (sluice, client)
}

#[tokio::test]
async fn reads_go_to_the_replica_and_everything_else_to_the_primary() {
    let (primary, replica) = primary_and_replica();
    // Read-your-writes (tested below) would send reads right after this
    // test's writes to the primary.
    let sluice = reading_with(&primary, &replica, &[("read_your_writes", "off")]).await;
    let client = connect_as(sluice.port(), APP_USER, "postgres").await;

    // A simple-query read, and a read through the extended protocol
    // (tokio-postgres prepares, then binds: both on the replica).
    for _ in 0..5 {
        assert!(
            in_recovery(&client, "select pg_is_in_recovery()").await,
            "a read ran on the primary"
        );
    }
    let row = client
        .query_one("select pg_is_in_recovery(), $1::int", &[&7i32])
        .await
        .expect("extended read");
    assert!(
        row.get::<_, bool>(0),
        "an extended-protocol read ran on the primary"
    );

    // Writes, hints, transactions and unknown functions: the primary.
    client
        .execute("insert into items values (1, 'one')", &[])
        .await
        .expect("a write goes to the primary");
    // A STABLE function of the database's own (read from pg_proc) reads.
    assert!(
        in_recovery(&client, "select pg_is_in_recovery(), app_price(2)").await,
        "a stable user function sent the read to the primary"
    );
    // A first row larger than sluice holds whole streams from the replica
    // (the safety net decides on the description and the first answer's
    // type alone).
    assert!(
        in_recovery(&client, "select pg_is_in_recovery(), repeat('x', 20000000)").await,
        "a 20 MB row was not read on the replica"
    );
    // A STABLE function that writes all the same (nextval) is taken for a
    // read, refused by the replica (25006), and run again on the primary:
    // the client sees only the primary's answer.
    for _ in 0..3 {
        assert!(
            !in_recovery(&client, "select pg_is_in_recovery(), app_sneaky()").await,
            "the refused read was not run on the primary"
        );
    }
    // The same through the extended protocol: a named statement prepared
    // (on the replica), then run: Bind, Execute, Sync, refused there and
    // run again on the primary; the client sees one clean result.
    let sneaky = client
        .prepare("select pg_is_in_recovery(), app_sneaky()")
        .await
        .expect("prepare");
    for _ in 0..3 {
        let rows = client
            .query(&sneaky, &[])
            .await
            .expect("run the prepared read");
        let on_replica: bool = rows[0].get(0);
        assert!(
            !on_replica,
            "the refused prepared read was not run on the primary"
        );
    }
    // And as a one-off query (the unnamed statement: Parse, Bind,
    // Describe, Execute, Sync): the replica's ParseComplete is kept from
    // the client with the rest, which hears the primary's alone.
    for _ in 0..3 {
        let rows = client
            .query_typed("select pg_is_in_recovery(), app_sneaky()", &[])
            .await
            .expect("run the one-off read");
        let on_replica: bool = rows[0].get(0);
        assert!(
            !on_replica,
            "the refused one-off read was not run on the primary"
        );
    }
    let plain = client
        .prepare("select pg_is_in_recovery()")
        .await
        .expect("prepare");
    let rows = client.query(&plain, &[]).await.expect("a prepared read");
    assert!(
        rows[0].get::<_, bool>(0),
        "a prepared read ran on the primary"
    );
    for sql in [
        "select pg_is_in_recovery(), app_bump(1)",
        "/* sluice: primary */ select pg_is_in_recovery()",
        "select pg_is_in_recovery(), nextval('seq')",
        "select pg_is_in_recovery() from items for update",
        "with x as (insert into items values (2, 'two') returning 1) select pg_is_in_recovery() from x",
    ] {
        assert!(
            !in_recovery(&client, sql).await,
            "{sql}: ran on the replica"
        );
    }
    assert!(
        !in_recovery(&client, "begin; select pg_is_in_recovery(); commit").await,
        "BEGIN (may write later) goes to the primary"
    );
    // A READ ONLY transaction may go to the replica.
    assert!(
        in_recovery(
            &client,
            "begin read only; select pg_is_in_recovery(); commit"
        )
        .await,
        "BEGIN READ ONLY went to the primary"
    );

    // What was written (rows 1, 2 and app_bump's 1001) is read back once
    // the replica has it.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let n = scalar_text(&client, "select count(*) from items").await;
        if n == "3" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "replica never showed the writes ({n})"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // A session setting keeps reads on the primary, as does a serializable
    // default (a standby refuses serializable transactions).
    for (set, reset) in [
        ("set sluice.route = 'primary'", "reset sluice.route"),
        (
            "set default_transaction_isolation = serializable",
            "reset default_transaction_isolation",
        ),
    ] {
        client.simple_query(set).await.expect(set);
        for _ in 0..3 {
            assert!(
                !in_recovery(&client, "select pg_is_in_recovery()").await,
                "{set}: a read ran on the replica"
            );
        }
        client.simple_query(reset).await.expect(reset);
        assert!(
            in_recovery(&client, "select pg_is_in_recovery()").await,
            "{reset}: reads stayed on the primary"
        );
    }

    let rows = hosts(&sluice).await;
    assert!(
        rows.iter()
            .any(|(_, role, _, lag)| role == "replica" && lag.is_some()),
        "SHOW HOSTS has the replica's lag: {rows:?}"
    );
}

#[tokio::test]
async fn a_replica_past_the_lag_limit_gets_no_reads_until_it_catches_up() {
    let (primary, replica) = primary_and_replica();
    let sluice = routed(
        &primary,
        &replica,
        "route_reads=1",
        &[
            ("replica_max_lag_bytes", "4096"),
            ("replica_max_lag", "0.5"),
            // Only the lag keeps reads off the paused replica here.
            ("read_your_writes", "off"),
        ],
    );
    wait_for_roles(&sluice, &primary, &replica).await;
    let client = connect_as(sluice.port(), APP_USER, "postgres").await;
    assert!(in_recovery(&client, "select pg_is_in_recovery()").await);

    let on_replica = superuser_connect(&replica, "postgres").await;
    replay(&on_replica, false).await;
    client
        .execute(
            "insert into items select g, repeat('x', 200) from generate_series(1, 2000) g",
            &[],
        )
        .await
        .expect("write while replay is paused");
    // Within a few check periods the replica is out of rotation.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if !in_recovery(&client, "select pg_is_in_recovery()").await {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "a replica with paused replay kept getting reads: {:?}",
            hosts(&sluice).await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // No read sees the replica's stale state now.
    for _ in 0..20 {
        assert_eq!(
            scalar_text(&client, "select count(*) from items").await,
            "2000",
            "a stale read from the paused replica"
        );
    }
    replay(&on_replica, true).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if in_recovery(&client, "select pg_is_in_recovery()").await {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the replica never came back after catching up: {:?}",
            hosts(&sluice).await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn an_idle_replica_after_a_wal_switch_is_caught_up() {
    // After a WAL segment switch on an idle primary, its insert position
    // points past the new segment's page header: a replica that has
    // replayed everything must still show no lag, and keep its reads.
    let (primary, replica) = primary_and_replica();
    let sluice = routed(
        &primary,
        &replica,
        "route_reads=1",
        &[("replica_max_lag", "0.5"), ("read_your_writes", "off")],
    );
    wait_for_roles(&sluice, &primary, &replica).await;
    let admin = superuser_connect(&primary, "postgres").await;
    admin
        .simple_query("select pg_switch_wal()")
        .await
        .expect("switch");
    // Idle from now on: past the lag limit several times over.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let lag = hosts(&sluice)
        .await
        .into_iter()
        .find(|h| h.0 == replica.port().to_string())
        .and_then(|h| h.3);
    assert_eq!(
        lag,
        Some(0),
        "{:?}",
        console_rows(&sluice, "SHOW HOSTS").await
    );
    let client = connect_as(sluice.port(), APP_USER, "postgres").await;
    assert!(
        in_recovery(&client, "select pg_is_in_recovery()").await,
        "the idle, caught-up replica got no read"
    );
}

#[tokio::test]
async fn a_cancel_reaches_the_replica_the_query_runs_on() {
    let (primary, replica) = primary_and_replica();
    let sluice = routed(&primary, &replica, "route_reads=1", &[]);
    wait_for_roles(&sluice, &primary, &replica).await;
    let client = connect_as(sluice.port(), APP_USER, "postgres").await;
    let token = client.cancel_token();
    let started = Instant::now();
    let sleeper = tokio::spawn(async move {
        let r = client
            .simple_query("select pg_is_in_recovery(), pg_sleep(30)")
            .await;
        (r.map(|_| ()), client)
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    token.cancel_query(NoTls).await.expect("send cancel");
    let (result, _client) = tokio::time::timeout(Duration::from_secs(10), sleeper)
        .await
        .expect("the cancelled query ends")
        .expect("task");
    let err = result.expect_err("pg_sleep(30) was cancelled");
    assert_eq!(sqlstate(&err), Some("57014"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[tokio::test]
async fn without_route_reads_a_host_list_uses_the_first_host() {
    let (primary, replica) = primary_and_replica();
    let sluice = routed(&primary, &replica, "", &[]);
    let client = connect_as(sluice.port(), APP_USER, "postgres").await;
    for _ in 0..5 {
        assert!(
            !in_recovery(&client, "select pg_is_in_recovery()").await,
            "routing is off by default"
        );
    }
    assert!(
        hosts(&sluice).await.is_empty(),
        "no checks when routing is off"
    );
}

/// The primary stops; a write issued while there is none waits, and runs
/// on the replica once it is promoted. When the old primary comes back on
/// its old timeline (split brain), writes stay on the newest timeline. A
/// client that closes while its write is held never has it run.
#[tokio::test]
async fn writes_wait_for_a_promoted_replica_instead_of_failing() {
    let (primary, replica) = primary_and_replica();
    let sluice = routed(
        &primary,
        &replica,
        "route_reads=1",
        &[("failover_hold", "30")],
    );
    wait_for_roles(&sluice, &primary, &replica).await;
    let client = connect_as(sluice.port(), APP_USER, "postgres").await;
    client
        .execute("insert into items values (1, 'before')", &[])
        .await
        .expect("write before the failover");
    let mut gone = RawClient::connect(sluice.port()).await;
    gone.startup(APP_USER, "postgres").await;
    gone.read_until_ready(Duration::from_secs(10)).await;
    primary.stop().expect("stop the primary");
    gone.send(&sluice_tests::msg::query(
        "insert into items values (3, 'gone')",
    ))
    .await
    .expect("sent");
    drop(gone);
    let writer = tokio::spawn(async move {
        let started = Instant::now();
        let r = client
            .execute("insert into items values (2, 'during')", &[])
            .await;
        (r, started.elapsed(), client)
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        !writer.is_finished(),
        "the write did not wait for a primary"
    );
    replica.promote().expect("promote the replica");
    let (result, waited, client) = tokio::time::timeout(Duration::from_secs(40), writer)
        .await
        .expect("the held write ends")
        .expect("task");
    result.unwrap_or_else(|e| panic!("the held write failed: {e}\n{}", sluice.log_tail(30)));
    assert!(waited < Duration::from_secs(30), "held {waited:?}");
    let port = scalar_text(&client, "/* sluice: primary */ select inet_server_port()").await;
    assert_eq!(
        port,
        replica.port().to_string(),
        "writes follow the promoted replica"
    );
    assert_eq!(
        scalar_text(&client, "/* sluice: primary */ select count(*) from items").await,
        "2"
    );
    // The old primary comes back, still a primary, on the old timeline.
    primary.start_again().expect("restart the old primary");
    tokio::time::sleep(Duration::from_secs(2)).await;
    for _ in 0..10 {
        let port = scalar_text(&client, "/* sluice: primary */ select inet_server_port()").await;
        assert_eq!(
            port,
            replica.port().to_string(),
            "a write went to the demoted primary: {:?}",
            hosts(&sluice).await
        );
    }
}

/// Read-your-writes: a client writes a row and reads it back at once,
/// 10,000 times, while replay on the replica is paused for a stretch: it
/// never misses its own row. Reads that come once the replica has caught
/// up with the client's last write go to the replica again.
#[tokio::test]
async fn a_client_always_reads_its_own_writes() {
    // The testkit's default (synchronous_commit = off) leaves a commit
    // unflushed, and so unsent to the replica, for up to 200 ms.
    let (primary, replica) = primary_and_replica_with(&[("synchronous_commit", "on")]);
    let sluice = routed(&primary, &replica, "route_reads=1", &[]);
    wait_for_roles(&sluice, &primary, &replica).await;
    let client = connect_as(sluice.port(), APP_USER, "postgres").await;
    let on_replica = superuser_connect(&replica, "postgres").await;
    const PAIRS: u32 = 10_000;
    let (stale, on_replicas) = writes_then_reads(&client, &client, &on_replica, PAIRS).await;
    println!(
        "read-your-writes: {PAIRS} reads right after a write, {stale} stale, {on_replicas} on the replica"
    );
    assert_eq!(stale, 0, "reads missed the client's own write");
    // Replay was paused for a quarter of them; most of the others find
    // the replica caught up within REPLAY_WAIT.
    assert!(
        on_replicas > PAIRS / 2,
        "only {on_replicas} of {PAIRS} reads after a write ran on the replica"
    );
    // Once the replica has the last write, reads go there again.
    reads_back_on_the_replica(&client).await;
}

/// Replay on the replica (a superuser's connection to it) going on
/// (`true`) or paused.
async fn replay(on_replica: &Client, going: bool) {
    let sql = match going {
        true => "select pg_wal_replay_resume()",
        false => "select pg_wal_replay_pause()",
    };
    on_replica.simple_query(sql).await.expect(sql);
}

/// Waits (at most 10 s) until `client`'s reads run on the replica.
async fn reads_back_on_the_replica(client: &Client) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !in_recovery(client, "select pg_is_in_recovery()").await {
        assert!(
            Instant::now() < deadline,
            "reads never went back to the replica"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One read of row `id` through `reader`: (whether it found it, whether
/// it ran on a replica).
async fn read_row(reader: &Client, id: u32) -> (bool, bool) {
    let rows = reader
        .simple_query(&format!(
            "select count(*), pg_is_in_recovery() from items where id = {id}"
        ))
        .await
        .expect("read back");
    rows.iter()
        .find_map(|m| match m {
            SimpleQueryMessage::Row(r) => Some((r.get(0) == Some("1"), r.get(1) == Some("t"))),
            _ => None,
        })
        .expect("a row")
}

/// `pairs` times: a row written through `writer`, then read through
/// `reader` (the same client or another), replay paused on the replica
/// from a quarter to half of them. Returns (stale reads, reads on the
/// replica).
async fn writes_then_reads(
    writer: &Client,
    reader: &Client,
    on_replica: &Client,
    pairs: u32,
) -> (u32, u32) {
    let (mut stale, mut on_replicas) = (0, 0);
    for i in 0..pairs {
        if i == pairs / 4 {
            replay(on_replica, false).await;
        }
        if i == pairs / 2 {
            replay(on_replica, true).await;
        }
        writer
            .simple_query(&format!("insert into items values ({i}, 'w')"))
            .await
            .expect("write");
        let (found, replica_read) = read_row(reader, i).await;
        stale += u32::from(!found);
        on_replicas += u32::from(replica_read);
    }
    (stale, on_replicas)
}

#[tokio::test]
async fn with_read_your_writes_database_every_client_reads_every_clients_writes() {
    // An application that writes on one connection and reads on another
    // (its own pool, a job queue): each read right after another client's
    // write, by another user, replay paused on the replica for a quarter
    // of them.
    let (primary, replica) = primary_and_replica_with(&[("synchronous_commit", "on")]);
    let on_replica = superuser_connect(&replica, "postgres").await;
    let sluice = reading_with(&primary, &replica, &[("read_your_writes", "database")]).await;
    let writer = connect_as(sluice.port(), primary.superuser(), "postgres").await;
    let reader = connect_as(sluice.port(), APP_USER, "postgres").await;
    const PAIRS: u32 = 2_000;
    let (stale, on_replicas) = writes_then_reads(&writer, &reader, &on_replica, PAIRS).await;
    println!(
        "read_your_writes = database: {PAIRS} reads right after another client's write, \
         {stale} stale, {on_replicas} on the replica"
    );
    assert_eq!(stale, 0, "reads missed another client's write");
    assert!(
        on_replicas > PAIRS / 4,
        "only {on_replicas} of {PAIRS} reads after a write ran on the replica"
    );
    // Once the replica has the last write, reads go there again.
    reads_back_on_the_replica(&reader).await;

    // A commit answered 'T' (`COMMIT AND CHAIN`) counts too (review 41).
    replay(&on_replica, false).await;
    for i in PAIRS + 100..PAIRS + 110 {
        writer
            .simple_query(&format!(
                "begin; insert into items values ({i}, 'c'); commit and chain"
            ))
            .await
            .expect("write and chain");
        let (found, _) = read_row(&reader, i).await;
        assert!(found, "a read missed a write committed by COMMIT AND CHAIN");
        writer.simple_query("commit").await.expect("commit");
    }
    // A procedure that commits inside, then BEGIN in the same batch:
    // 'T' again, and no COMMIT said (review 43).
    writer
        .batch_execute(
            "create procedure app_commit(v int) language plpgsql as \
             $$ begin insert into items values (v, 'p'); commit; end $$",
        )
        .await
        .expect("create procedure");
    replay(&on_replica, true).await;
    // Requests that commit without a ReadyForQuery 'I' or a COMMIT before
    // the write (reviews 43 and 44), each with replay paused once every
    // earlier write is on the replica and known there.
    use sluice_tests::msg;
    let mut raw = RawClient::logged_in(sluice.port(), primary.superuser(), "postgres").await;
    let extended = |sql: &[&str]| {
        let mut batch: Vec<u8> = sql
            .iter()
            .flat_map(|q| [msg::parse("", q), msg::bind(""), msg::execute()].concat())
            .collect();
        batch.extend(msg::sync());
        batch
    };
    let i = PAIRS + 200;
    let limited = {
        // Execute of at most one row: the INSERT runs whole, the portal is
        // suspended, no CommandComplete, and the Sync commits (review 45).
        let mut execute = Vec::new();
        msg::cstr(&mut execute, "");
        execute.extend_from_slice(&1i32.to_be_bytes());
        [
            msg::parse(
                "",
                &format!(
                    "insert into items values ({}, 'l'), ({}, 'l') returning id",
                    i + 3,
                    i + 1003
                ),
            ),
            msg::bind(""),
            msg::message(b'E', &execute),
            msg::sync(),
        ]
        .concat()
    };
    let bump = scalar_text(&writer, "select 'app_bump'::regproc::oid::text")
        .await
        .parse::<u32>()
        .expect("an oid");
    let function_call = {
        // FunctionCall of app_bump(i + 4 - 1000): it inserts i + 4, and
        // its answer is a FunctionCallResponse, no CommandComplete.
        let arg = (i as i32 + 4 - 1000).to_string();
        let mut body = bump.to_be_bytes().to_vec();
        body.extend_from_slice(&0i16.to_be_bytes());
        body.extend_from_slice(&1i16.to_be_bytes());
        body.extend_from_slice(&(arg.len() as i32).to_be_bytes());
        body.extend_from_slice(arg.as_bytes());
        body.extend_from_slice(&0i16.to_be_bytes());
        msg::message(b'F', &body)
    };
    let cases: [(&str, Vec<Vec<u8>>, &str); 5] = [
        (
            "a procedure that commits inside, then BEGIN",
            vec![extended(&[&format!("call app_commit({i})"), "begin"])],
            "rollback",
        ),
        (
            "ROLLBACK of a block, then a write, in one query",
            vec![
                query_message("begin"),
                query_message(&format!("insert into items values ({}, 'b')", i + 100)),
                query_message(&format!(
                    "rollback; insert into items values ({}, 'r')",
                    i + 1
                )),
            ],
            "",
        ),
        (
            "ROLLBACK of a block, then a write, in one batch",
            vec![
                query_message("begin"),
                extended(&[
                    "rollback",
                    &format!("insert into items values ({}, 'r')", i + 2),
                ]),
            ],
            "",
        ),
        (
            "an INSERT … RETURNING whose Execute stops at a row limit",
            vec![limited],
            "",
        ),
        (
            "a FunctionCall of a function that writes",
            vec![function_call],
            "",
        ),
    ];
    for (n, (what, requests, cleanup)) in cases.into_iter().enumerate() {
        reads_back_on_the_replica(&reader).await;
        replay(&on_replica, false).await;
        for request in requests {
            raw.send(&request).await.expect(what);
            raw.read_until_ready(Duration::from_secs(5)).await;
        }
        let (found, _) = read_row(&reader, i + n as u32).await;
        assert!(found, "a read missed a commit: {what}");
        if !cleanup.is_empty() {
            raw.send(&query_message(cleanup)).await.expect(cleanup);
            raw.read_until_ready(Duration::from_secs(5)).await;
        }
        replay(&on_replica, true).await;
    }
    // A READ ONLY block whose first read ran on the primary (the replica
    // behind), then `commit; insert` in the same period (review 44).
    reads_back_on_the_replica(&reader).await;
    replay(&on_replica, false).await;
    writer
        .simple_query(&format!("insert into items values ({}, 'w')", i + 10))
        .await
        .expect("write");
    let blocked = connect_as(sluice.port(), APP_USER, "postgres").await;
    blocked
        .batch_execute("begin read only")
        .await
        .expect("begin");
    assert!(
        !in_recovery(&blocked, "select pg_is_in_recovery()").await,
        "the block's first read runs on the primary"
    );
    replay(&on_replica, true).await;
    reads_back_on_the_replica(&reader).await;
    replay(&on_replica, false).await;
    blocked
        .batch_execute(&format!(
            "commit; insert into items values ({}, 'ro')",
            i + 11
        ))
        .await
        .expect("commit and write");
    let (found, _) = read_row(&reader, i + 11).await;
    assert!(
        found,
        "a read missed a write after a READ ONLY block on the primary"
    );
    replay(&on_replica, true).await;

    // With `session` (the default) only the client's own writes count:
    // with replay paused, the reader reads the replica's past.
    sluice.rewrite_config(
        &routed_config(
            &primary,
            &replica,
            "route_reads=1",
            &[("read_your_writes", "session")],
        )
        .render(),
    );
    sluice.reload();
    tokio::time::sleep(Duration::from_millis(300)).await;
    replay(&on_replica, false).await;
    let mut missed = 0;
    for i in PAIRS..PAIRS + 20 {
        writer
            .simple_query(&format!("insert into items values ({i}, 'w')"))
            .await
            .expect("write");
        let (found, replica_read) = read_row(&reader, i).await;
        missed += u32::from(!found && replica_read);
    }
    replay(&on_replica, true).await;
    assert_eq!(
        missed, 20,
        "session: another client's writes are not waited for"
    );
}

#[tokio::test]
async fn with_read_your_writes_database_a_commit_whose_client_left_is_waited_for() {
    // (review 42: a writer that sends COMMIT and closes gets no answer,
    // so no ReadyForQuery says when it committed; the primary's checks
    // after its INSERT were all the reads waited for, and a read right
    // after the commit ran on a replica without it)
    let (primary, replica) = primary_and_replica_with(&[("synchronous_commit", "on")]);
    let sluice = reading_with(&primary, &replica, &[("read_your_writes", "database")]).await;
    let reader = connect_as(sluice.port(), APP_USER, "postgres").await;
    let mut writer = RawClient::logged_in(sluice.port(), APP_USER, "postgres").await;
    for sql in ["begin", "insert into items values (7001, 'left')"] {
        writer.send(&query_message(sql)).await.expect(sql);
        writer.read_until_ready(Duration::from_secs(5)).await;
    }
    // The checks cover the INSERT's end: reads go to the replica.
    reads_back_on_the_replica(&reader).await;
    // The last request, unanswered as its client leaves (sluice cannot
    // know whether, or when, it commits): reads run on the primary until
    // the primary's checks are surely past it.
    writer
        .send(&query_message("select pg_sleep(0.2); commit"))
        .await
        .expect("the last request");
    drop(writer);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (_, on_replica) = read_row(&reader, 7001).await;
    assert!(
        !on_replica,
        "a read ran on the replica with a commit in doubt"
    );
    reads_back_on_the_replica(&reader).await;
}

/// Row `id` read through the extended protocol (a driver's Parse, Bind,
/// Execute): how many rows have it, and whether it ran on a replica.
async fn extended_read(client: &impl tokio_postgres::GenericClient, id: i32) -> (i64, bool) {
    let row = client
        .query_one(
            "select count(*), pg_is_in_recovery() from items where id = $1",
            &[&id],
        )
        .await
        .expect("extended read");
    (row.get(0), row.get(1))
}

/// `raw` opens a READ ONLY block, and its first query runs on the
/// replica.
async fn raw_block_on_the_replica(raw: &mut RawClient) {
    raw.simple_query("begin read only", WAIT).await;
    let standby = raw.simple_query("select pg_is_in_recovery()", WAIT).await;
    assert_eq!(
        standby,
        [Some("t".to_owned())],
        "the block is on the primary"
    );
}

/// How long a raw client waits for its replies.
const WAIT: Duration = Duration::from_secs(10);

/// With replay paused on the replica, a row written through `writer`;
/// replay resumes 300 ms later (the returned task gives the replica's
/// connection back).
async fn write_while_replay_waits(
    writer: &Client,
    on_replica: Client,
    id: u32,
) -> tokio::task::JoinHandle<Client> {
    replay(&on_replica, false).await;
    writer
        .simple_query(&format!("insert into items values ({id}, 'block')"))
        .await
        .expect("write");
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        replay(&on_replica, true).await;
        on_replica
    })
}

#[tokio::test]
async fn with_read_your_writes_database_each_statement_of_a_block_on_a_replica_sees_earlier_writes()
{
    // (review 46: a READ ONLY block on a replica was checked at its first
    // request only; a later statement, which takes a new snapshot at
    // READ COMMITTED, missed a write that ended before it was sent)
    let (primary, replica) = primary_and_replica_with(&[("synchronous_commit", "on")]);
    let mut on_replica = superuser_connect(&replica, "postgres").await;
    let sluice = reading_with(&primary, &replica, &[("read_your_writes", "database")]).await;
    let writer = connect_as(sluice.port(), primary.superuser(), "postgres").await;
    let reader = connect_as(sluice.port(), APP_USER, "postgres").await;
    let missed_waits = |sluice: &SluiceProcess| {
        sluice
            .log()
            .matches("did not replay within replica_max_lag")
            .count()
    };
    // A block on the replica, a write by another client, then the
    // block's next statements: they wait for the replica to replay it.
    reads_back_on_the_replica(&reader).await;
    reader.simple_query("begin read only").await.expect("begin");
    let (_, on_a_replica) = read_row(&reader, 9001).await;
    assert!(on_a_replica, "the block's first read ran on the primary");
    let resume = write_while_replay_waits(&writer, on_replica, 9001).await;
    let (found, on_a_replica) = read_row(&reader, 9001).await;
    assert!(on_a_replica, "the block left its replica");
    assert!(
        found,
        "a statement of a READ COMMITTED block on a replica missed a write that ended before it"
    );
    on_replica = resume.await.expect("resume");
    // The extended protocol (tokio-postgres prepares, binds): the same.
    let resume = write_while_replay_waits(&writer, on_replica, 9002).await;
    let (count, in_recovery) = extended_read(&reader, 9002).await;
    assert_eq!(
        count, 1,
        "an extended-protocol statement of the block missed a write"
    );
    assert!(in_recovery, "the block left its replica");
    reader.simple_query("commit").await.expect("commit");
    on_replica = resume.await.expect("resume");
    assert_eq!(missed_waits(&sluice), 0, "a wait was missed");

    // Nothing runs in the client's block meanwhile (review 48): its
    // unnamed statement and portal stay, a SET TRANSACTION after a SHOW
    // still comes before the block's first query, and a REPEATABLE READ
    // block whose first query comes after the write sees it.
    use sluice_tests::msg;
    let mut raw = RawClient::logged_in(sluice.port(), APP_USER, "postgres").await;
    reads_back_on_the_replica(&reader).await;
    raw_block_on_the_replica(&mut raw).await;
    let unnamed = [
        msg::parse("", "select count(*) from items where id = 9003"),
        msg::describe(b'S', ""),
        msg::sync(),
    ]
    .concat();
    raw.send(&unnamed).await.expect("send");
    assert_eq!(errors_in_replies(&mut raw, 1).await, Vec::<String>::new());
    let resume = write_while_replay_waits(&writer, on_replica, 9003).await;
    raw.send(&[msg::bind(""), msg::execute(), msg::sync()].concat())
        .await
        .expect("send");
    assert_eq!(
        errors_in_replies(&mut raw, 1).await,
        Vec::<String>::new(),
        "the client's unnamed statement was lost"
    );
    on_replica = resume.await.expect("resume");
    let mut suspended = Vec::new();
    msg::cstr(&mut suspended, "");
    suspended.extend_from_slice(&1i32.to_be_bytes());
    let one_row = msg::message(b'E', &suspended);
    raw.send(
        &[
            msg::parse("", "select id from items order by id"),
            msg::bind(""),
            one_row.clone(),
            msg::sync(),
        ]
        .concat(),
    )
    .await
    .expect("send");
    assert_eq!(errors_in_replies(&mut raw, 1).await, Vec::<String>::new());
    let resume = write_while_replay_waits(&writer, on_replica, 9004).await;
    raw.send(&[one_row, msg::sync()].concat())
        .await
        .expect("send");
    assert_eq!(
        errors_in_replies(&mut raw, 1).await,
        Vec::<String>::new(),
        "the client's unnamed portal was lost"
    );
    raw.simple_query("commit", WAIT).await;
    on_replica = resume.await.expect("resume");
    reads_back_on_the_replica(&reader).await;
    raw.simple_query("begin read only", WAIT).await;
    // (a SHOW takes no snapshot)
    raw.simple_query("show work_mem", WAIT).await;
    let resume = write_while_replay_waits(&writer, on_replica, 9005).await;
    raw.simple_query("set transaction isolation level repeatable read", WAIT)
        .await;
    let seen = raw
        .simple_query(
            "select count(*)::text || current_setting('transaction_isolation') \
             || pg_is_in_recovery()::text from items where id = 9005",
            WAIT,
        )
        .await;
    assert_eq!(
        seen,
        [Some("1repeatable readtrue".to_owned())],
        "a REPEATABLE READ block's first query missed a write that ended before it"
    );
    raw.simple_query("commit", WAIT).await;
    on_replica = resume.await.expect("resume");
    assert_eq!(missed_waits(&sluice), 0, "a wait was missed");

    // A replica that does not replay within replica_max_lag: the
    // statement runs without the write, after that wait, and the log
    // says so.
    reads_back_on_the_replica(&reader).await;
    reader.simple_query("begin read only").await.expect("begin");
    assert!(
        read_row(&reader, 9006).await.1,
        "the block is on the primary"
    );
    replay(&on_replica, false).await;
    writer
        .simple_query("insert into items values (9006, 'block')")
        .await
        .expect("write");
    let (found, _) = read_row(&reader, 9006).await;
    assert!(!found, "replay was paused: the write cannot be there");
    assert_eq!(
        missed_waits(&sluice),
        1,
        "the missed wait is not in the log"
    );
    reader.simple_query("commit").await.expect("commit");
    replay(&on_replica, true).await;
}

/// The first value of the first DataRow before the next ReadyForQuery.
async fn first_value(raw: &mut RawClient) -> Option<String> {
    let mut value = None;
    loop {
        match raw.read_message(WAIT).await {
            RawReply::Message(b'Z', _) => return value,
            RawReply::Message(b'D', body) if value.is_none() => {
                let len = i32::from_be_bytes([body[2], body[3], body[4], body[5]]);
                let len = usize::try_from(len).expect("not NULL");
                value = Some(String::from_utf8_lossy(&body[6..6 + len]).into_owned());
            }
            RawReply::Message(b'E', body) => panic!("{:?}", error_fields(&body)),
            RawReply::Message(..) => {}
            other => panic!("{other:?}"),
        }
    }
}

#[tokio::test]
async fn with_read_your_writes_database_a_block_on_a_replica_waits_after_a_flush_and_a_reload() {
    // (review 49: a request after Parse/Bind/Execute/Flush was not held,
    // and after a RELOAD that replaced the topology mid-block the block
    // waited for the old one's writes only)
    use sluice_tests::msg;
    let (primary, replica) = primary_and_replica_with(&[("synchronous_commit", "on")]);
    let mut on_replica = superuser_connect(&replica, "postgres").await;
    let ryw = [("read_your_writes", "database")];
    let sluice = routed_config(&primary, &replica, "route_reads=1", &ryw).start();
    wait_for_roles(&sluice, &primary, &replica).await;
    let writer = connect_as(sluice.port(), primary.superuser(), "postgres").await;
    let reader = connect_as(sluice.port(), APP_USER, "postgres").await;
    let mut raw = RawClient::logged_in(sluice.port(), APP_USER, "postgres").await;
    let count = |id: u32| format!("select count(*) from items where id = {id}");
    reads_back_on_the_replica(&reader).await;
    raw_block_on_the_replica(&mut raw).await;
    let execute = |sql: &str| [msg::parse("", sql), msg::bind(""), msg::execute()].concat();
    raw.send(&[execute(&count(9201)), msg::flush()].concat())
        .await
        .expect("send");
    loop {
        match raw.read_message(WAIT).await {
            RawReply::Message(b'C', _) => break,
            RawReply::Message(b'E', body) => panic!("{:?}", error_fields(&body)),
            RawReply::Message(..) => {}
            other => panic!("{other:?}"),
        }
    }
    let resume = write_while_replay_waits(&writer, on_replica, 9201).await;
    raw.send(&[execute(&count(9201)), msg::sync()].concat())
        .await
        .expect("send");
    assert_eq!(
        first_value(&mut raw).await.as_deref(),
        Some("1"),
        "a request after a Flush missed a write that ended before it"
    );
    on_replica = resume.await.expect("resume");
    // An Execute split around another client's commit is held whole
    // (review 53: its second part went out unheld). A COPY's portal takes
    // its snapshot when it runs.
    let copy = "copy (select count(*) from items where id = 9203) to stdout";
    let bind_p = msg::message(b'B', &[b'p', 0, 0, 0, 0, 0, 0, 0, 0]);
    raw.send(&[msg::parse("", copy), bind_p, msg::sync()].concat())
        .await
        .expect("send");
    assert_eq!(errors_in_replies(&mut raw, 1).await, Vec::<String>::new());
    let mut execute_p = vec![b'p', 0];
    execute_p.extend_from_slice(&0i32.to_be_bytes());
    let request = [msg::message(b'E', &execute_p), msg::sync()].concat();
    raw.send(&request[..6]).await.expect("send");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let resume = write_while_replay_waits(&writer, on_replica, 9203).await;
    raw.send(&request[6..]).await.expect("send");
    let mut copied = None;
    loop {
        match raw.read_message(WAIT).await {
            RawReply::Message(b'Z', _) => break,
            RawReply::Message(b'd', body) => copied = Some(body),
            RawReply::Message(b'E', body) => panic!("{:?}", error_fields(&body)),
            RawReply::Message(..) => {}
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(
        copied.as_deref(),
        Some(&b"1\n"[..]),
        "an Execute split around a commit missed it"
    );
    on_replica = resume.await.expect("resume");
    // The same two servers, listed the other way round: a new topology.
    let swapped = routed_config(&replica, &primary, "route_reads=1", &ryw);
    sluice.rewrite_config(&swapped.render());
    sluice.reload();
    // (past the new topology's second in doubt)
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let resume = write_while_replay_waits(&writer, on_replica, 9202).await;
    let seen = raw
        .simple_query(
            "select count(*)::text || pg_is_in_recovery()::text from items where id = 9202",
            WAIT,
        )
        .await;
    assert_eq!(
        seen,
        [Some("1true".to_owned())],
        "after a RELOAD mid-block, a statement missed a write that ended before it"
    );
    raw.simple_query("commit", WAIT).await;
    resume.await.expect("resume");
}

#[tokio::test]
async fn with_read_your_writes_database_a_held_request_of_a_client_gone_is_not_sent() {
    // (review 51: with a long replica_max_lag, a client gone left its
    // replica server idle in transaction for the whole wait, the
    // statement then run for nobody)
    let (primary, replica) = primary_and_replica_with(&[("synchronous_commit", "on")]);
    let on_replica = superuser_connect(&replica, "postgres").await;
    let settings = [("read_your_writes", "database"), ("replica_max_lag", "30")];
    let sluice = reading_with(&primary, &replica, &settings).await;
    let writer = connect_as(sluice.port(), primary.superuser(), "postgres").await;
    let reader = connect_as(sluice.port(), APP_USER, "postgres").await;
    // A cancel does not end the wait: the statement, which PostgreSQL has
    // not seen (the cancel reaches the idle server), runs once the replica
    // has the write (review 52: ending the wait read stale, no error).
    reads_back_on_the_replica(&reader).await;
    reader.simple_query("begin read only").await.expect("begin");
    assert!(
        read_row(&reader, 9301).await.1,
        "the block is on the primary"
    );
    let resume = write_while_replay_waits(&writer, on_replica, 9301).await;
    let cancel = reader.cancel_token();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let canceller = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        cancel.cancel_query(NoTls).await
    });
    let (found, _) = read_row(&reader, 9301).await;
    assert!(found, "a cancel made a held statement read stale");
    canceller.await.expect("task").expect("cancel sent");
    reader.simple_query("commit").await.expect("commit");
    let on_replica = resume.await.expect("resume");
    // A client gone: its server goes back at once, its statement unsent.
    reads_back_on_the_replica(&reader).await;
    let mut raw = RawClient::logged_in(sluice.port(), APP_USER, "postgres").await;
    raw_block_on_the_replica(&mut raw).await;
    replay(&on_replica, false).await;
    writer
        .simple_query("insert into items values (9302, 'held')")
        .await
        .expect("write");
    raw.send(&query_message("select 'sent by a client gone'"))
        .await
        .expect("send");
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(raw);
    let in_block = "select count(*) from pg_stat_activity \
                    where state like 'idle in transaction%' and usename = 'app'";
    let deadline = Instant::now() + Duration::from_secs(5);
    while scalar_text(&on_replica, in_block).await != "0" {
        assert!(
            Instant::now() < deadline,
            "a closed client's block stayed open on the replica"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let ran = "select count(*) from pg_stat_activity where query like '%sent by a client gone%' \
               and pid <> pg_backend_pid()";
    assert_eq!(
        scalar_text(&on_replica, ran).await,
        "0",
        "its statement ran"
    );
    replay(&on_replica, true).await;
}

#[tokio::test]
async fn with_read_your_writes_database_a_reload_that_replaces_the_hosts_keeps_earlier_writes() {
    // A RELOAD that changes the entry's host list starts a new topology,
    // which had seen no write: a write just before it was read back
    // stale from the replica once the new checks found it.
    let (primary, replica) = primary_and_replica_with(&[("synchronous_commit", "on")]);
    let on_replica = superuser_connect(&replica, "postgres").await;
    let ryw = [("read_your_writes", "database")];
    let sluice = routed_config(&primary, &replica, "route_reads=1", &ryw).start();
    wait_for_roles(&sluice, &primary, &replica).await;
    let writer = connect_as(sluice.port(), primary.superuser(), "postgres").await;
    let reader = connect_as(sluice.port(), APP_USER, "postgres").await;
    reads_back_on_the_replica(&reader).await;
    replay(&on_replica, false).await;
    writer
        .simple_query("insert into items values (9101, 'reload')")
        .await
        .expect("write");
    // The same two servers, listed the other way round.
    let swapped = routed_config(&replica, &primary, "route_reads=1", &ryw);
    sluice.rewrite_config(&swapped.render());
    sluice.reload();
    let until = Instant::now() + Duration::from_millis(1_500);
    let (mut reads, mut stale) = (0, 0);
    while Instant::now() < until {
        let (found, _) = read_row(&reader, 9101).await;
        reads += 1;
        stale += u32::from(!found);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        stale, 0,
        "{stale} of {reads} reads after a RELOAD that replaced the hosts missed an earlier write"
    );
    replay(&on_replica, true).await;
    reads_back_on_the_replica(&reader).await;
}

#[tokio::test]
async fn a_client_kept_in_transaction_mode_by_a_reload_reads_its_own_writes() {
    // (review 42: after a RELOAD to session mode, a client with prepared
    // statements stays in transaction mode, but its writes were routed
    // as session mode's, not counted, and its reads after a RELOAD back
    // went to a replica without them)
    let (primary, replica) = primary_and_replica_with(&[("synchronous_commit", "on")]);
    let on_replica = superuser_connect(&replica, "postgres").await;
    let config = routed_config(&primary, &replica, "route_reads=1", &[]);
    let sluice = config.start();
    wait_for_roles(&sluice, &primary, &replica).await;
    let client = connect_as(sluice.port(), APP_USER, "postgres").await;
    let statement = client.prepare("select 1").await.expect("prepare");
    client.query(&statement, &[]).await.expect("execute");
    assert!(in_recovery(&client, "select pg_is_in_recovery()").await);
    let reload = |c: &ConfigBuilder| {
        sluice.rewrite_config(&c.render());
        sluice.reload();
    };
    replay(&on_replica, false).await;
    reload(&config.clone().set("pool_mode", "session"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    client
        .simple_query("insert into items values (8001, 'kept')")
        .await
        .expect("write");
    reload(&config);
    tokio::time::sleep(Duration::from_millis(300)).await;
    for _ in 0..4 {
        let (found, _) = read_row(&client, 8001).await;
        assert!(found, "the client's read missed its own write");
    }
    client.query(&statement, &[]).await.expect("its statement");
    replay(&on_replica, true).await;
}

/// Reads back every reply up to `n` ReadyForQuery messages: the SQLSTATE
/// of each error, in order.
async fn errors_in_replies(client: &mut RawClient, n: usize) -> Vec<String> {
    let mut errors = Vec::new();
    let mut ready = 0;
    while ready < n {
        match client.read_message(Duration::from_secs(10)).await {
            RawReply::Message(b'Z', _) => ready += 1,
            RawReply::Message(b'E', body) => errors.push(
                error_field(&error_fields(&body), b'C')
                    .unwrap_or("")
                    .to_owned(),
            ),
            RawReply::Message(..) => {}
            other => panic!("{other:?} after {ready} replies"),
        }
    }
    errors
}

/// What a client pipelines after a READ ONLY transaction routed to a
/// replica does not run there; session objects taken on a replica do not
/// keep the client on it.
#[tokio::test]
async fn nothing_after_a_read_only_transaction_runs_on_the_replica() {
    use sluice_tests::msg::query;
    let (primary, replica) = primary_and_replica();
    let sluice = reading_with(&primary, &replica, &[("read_your_writes", "off")]).await;
    let mut raw = RawClient::connect(sluice.port()).await;
    raw.startup(APP_USER, "postgres").await;
    raw.read_until_ready(Duration::from_secs(10)).await;
    let mut bytes = query("begin read only");
    bytes.extend(query("select pg_is_in_recovery()"));
    bytes.extend(query("commit"));
    bytes.extend(query(
        "insert into items values (7, 'after a read-only transaction')",
    ));
    raw.send(&bytes).await.expect("send");
    assert_eq!(
        errors_in_replies(&mut raw, 4).await,
        Vec::<String>::new(),
        "the insert pipelined after COMMIT ran on the replica"
    );
    // An advisory lock taken on the replica cannot stay there: the client
    // is told (0A000) and disconnected, not kept on the replica or left
    // believing it holds the lock.
    let mut bytes = query("/* sluice: replica */ select pg_advisory_lock(43)");
    bytes.extend(query("select 1"));
    raw.send(&bytes).await.expect("send");
    let mut codes = Vec::new();
    loop {
        match raw.read_message(Duration::from_secs(10)).await {
            RawReply::Message(b'E', body) => codes.push(
                error_field(&error_fields(&body), b'C')
                    .unwrap_or("")
                    .to_owned(),
            ),
            RawReply::Message(..) => {}
            RawReply::Closed => break,
            RawReply::TimedOut => panic!("no answer after a lock on the replica ({codes:?})"),
        }
    }
    assert_eq!(codes, ["0A000"], "the lost lock is reported");
    let client = connect_as(sluice.port(), APP_USER, "postgres").await;
    client
        .simple_query("insert into items values (8, 'after a lock on the replica')")
        .await
        .expect("a new connection writes");
}

/// A lone `BEGIN READ ONLY` opens its block where its first request goes:
/// a block made read-write or serializable before its first query, as
/// PostgreSQL allows, runs on the primary (before, it was on a replica
/// already, whose standby refused: 25006, 0A000); otherwise on the
/// replica, where PostgreSQL's own rules hold (a write is refused, a
/// read-write switch after a query is too). The client hears BEGIN or
/// START TRANSACTION, in a block, as from PostgreSQL.
#[tokio::test]
async fn a_read_only_block_goes_where_its_first_request_can_run() {
    let (primary, replica) = primary_and_replica();
    let (sluice, client) = reading_client(&primary, &replica, &[("read_your_writes", "off")]).await;
    let steps = |sql: &'static [&'static str]| sql;
    // Made read-write: the write runs (on the primary) and commits.
    let mut ports = Vec::new();
    for sql in steps(&[
        "begin read only",
        "set transaction read write",
        "insert into items values (30, 'read-write after all') returning inet_server_port()::text",
        "commit",
    ]) {
        let rows = client
            .simple_query(sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        ports.extend(rows.into_iter().filter_map(|m| match m {
            SimpleQueryMessage::Row(r) => r.get(0).map(str::to_owned),
            _ => None,
        }));
    }
    assert_eq!(ports, [primary.port().to_string()], "the write's server");
    // Serializable: on the primary too.
    client
        .batch_execute("start transaction read only")
        .await
        .expect("start");
    let seen = scalar_text(
        &client,
        "set transaction isolation level serializable; \
         select current_setting('transaction_isolation') || ',' || pg_is_in_recovery()::text",
    )
    .await;
    assert_eq!(seen, "serializable,false");
    client.batch_execute("commit").await.expect("commit");
    // A plain read-only block stays on the replica, with PostgreSQL's rules:
    // read-write after a query, and a write, are refused.
    for (first, then, code) in [
        (
            Some("select pg_is_in_recovery()"),
            "set transaction read write",
            "25001",
        ),
        (None, "insert into items values (31, 'no')", "25006"),
    ] {
        client
            .batch_execute("begin read only")
            .await
            .expect("begin");
        if let Some(first) = first {
            assert!(in_recovery(&client, first).await, "the block's read");
        }
        let refused = client.batch_execute(then).await.expect_err(then);
        assert_eq!(
            refused.code().map(|c| c.code()),
            Some(code),
            "{then}: {refused}"
        );
        client.batch_execute("rollback").await.expect("rollback");
    }
    // A driver's read-only transaction (tokio-postgres: START TRANSACTION
    // READ ONLY, then extended-protocol queries), once the replica has the
    // row.
    let deadline = Instant::now() + Duration::from_secs(10);
    while scalar_text(&client, "select count(*) from items where id = 30").await != "1" {
        assert!(Instant::now() < deadline, "the replica never had the row");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut driver = connect_as(sluice.port(), APP_USER, "postgres").await;
    let tx = driver
        .build_transaction()
        .read_only(true)
        .start()
        .await
        .expect("start a read-only transaction");
    let (count, in_recovery) = extended_read(&tx, 30).await;
    assert!(in_recovery, "the driver's block is on the replica");
    assert_eq!(count, 1, "the replica has the row written above");
    tx.commit().await.expect("commit");
    // What the client hears: the tags PostgreSQL sends, in a block.
    let mut raw = RawClient::connect(sluice.port()).await;
    raw.startup(APP_USER, "postgres").await;
    raw.read_until_ready(Duration::from_secs(10)).await;
    for (sql, tag, first, replica) in [
        (
            "start transaction read only",
            "START TRANSACTION",
            None,
            "true",
        ),
        // (sluice answers a first DEALLOCATE ALL itself: in the block too;
        // it is no read, so the block opens on the primary)
        (
            "/* hi */ BEGIN WORK READ ONLY;",
            "BEGIN",
            Some("deallocate all"),
            "false",
        ),
    ] {
        assert_eq!(
            heard(&mut raw, sql).await,
            [format!("C{tag}"), "ZT".to_owned()],
            "{sql}"
        );
        if let Some(first) = first {
            assert_eq!(
                heard(&mut raw, first).await,
                ["CDEALLOCATE ALL", "ZT"],
                "{sql}"
            );
        }
        let read = raw
            .simple_query("select pg_is_in_recovery()::text", Duration::from_secs(10))
            .await;
        assert_eq!(read, vec![Some(replica.to_owned())], "{sql}");
        raw.simple_query("commit", Duration::from_secs(10)).await;
    }
}

/// A client in a READ ONLY block that holds no server yet is in a
/// transaction: PAUSE waits for its block to end, and the block goes on
/// through the pause (review 37: PAUSE returned at once, and the block's
/// first query then waited for RESUME). A BEGIN with bytes that are no
/// text goes to the server, which refuses it as before (review 37: sluice
/// answered BEGIN, then ended the client when the server refused it).
#[tokio::test]
async fn a_read_only_block_without_a_server_yet_holds_pause() {
    let (primary, replica) = primary_and_replica();
    let (sluice, _client) =
        reading_client(&primary, &replica, &[("read_your_writes", "off")]).await;
    let mut raw = RawClient::connect(sluice.port()).await;
    raw.startup(APP_USER, "postgres").await;
    raw.read_until_ready(Duration::from_secs(10)).await;
    assert_eq!(heard(&mut raw, "begin read only").await, ["CBEGIN", "ZT"]);
    let admin = connect_as(sluice.port(), APP_USER, "pgbouncer").await;
    let pause =
        tokio::spawn(async move { admin.simple_query("PAUSE postgres").await.map(|_| admin) });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!pause.is_finished(), "PAUSE did not wait for the block");
    let read = tokio::time::timeout(
        Duration::from_secs(5),
        raw.simple_query("select pg_is_in_recovery()::text", Duration::from_secs(10)),
    )
    .await
    .expect("the block's query waited for the pause");
    assert_eq!(read, vec![Some("true".to_owned())]);
    raw.simple_query("commit", Duration::from_secs(10)).await;
    let admin = tokio::time::timeout(Duration::from_secs(10), pause)
        .await
        .expect("PAUSE ends once the block does")
        .expect("join")
        .expect("PAUSE");
    admin.simple_query("RESUME postgres").await.expect("RESUME");
    // (not text: the server's own error, and the client goes on)
    let mut bytes = b"Q\0\0\0\0BEGIN READ ONLY /* \xff\xfe */\0".to_vec();
    let len = (bytes.len() - 1) as i32;
    bytes[1..5].copy_from_slice(&len.to_be_bytes());
    raw.send(&bytes).await.expect("send");
    assert_eq!(
        raw.kinds_until_ready_or_close(Duration::from_secs(10))
            .await,
        "E22021Z"
    );
    let read = raw
        .simple_query("select 'still here'", Duration::from_secs(10))
        .await;
    assert_eq!(read, vec![Some("still here".to_owned())]);
}

/// The messages a simple Query gets, up to ReadyForQuery: each as its
/// kind and body (ReadyForQuery's status).
async fn heard(raw: &mut RawClient, sql: &str) -> Vec<String> {
    raw.send(&sluice_tests::msg::query(sql))
        .await
        .expect("send");
    let mut heard = Vec::new();
    loop {
        match raw.read_message(Duration::from_secs(10)).await {
            RawReply::Message(b'Z', body) => {
                heard.push(format!("Z{}", char::from(body[0])));
                return heard;
            }
            RawReply::Message(kind, body) => heard.push(format!(
                "{}{}",
                char::from(kind),
                String::from_utf8_lossy(&body).trim_end_matches('\0')
            )),
            other => panic!("{sql}: {other:?}"),
        }
    }
}

/// The replica listed first: before the checks have found the primary, a
/// write waits for it instead of going to the first host.
#[tokio::test]
async fn a_write_before_the_first_checks_waits_for_the_primary() {
    let (primary, replica) = primary_and_replica();
    let sluice = routed(&replica, &primary, "route_reads=1", &[]);
    let client = connect_as(sluice.port(), APP_USER, "postgres").await;
    let port = scalar_text(
        &client,
        "insert into items values (9, 'first') returning inet_server_port()",
    )
    .await;
    assert_eq!(
        port,
        primary.port().to_string(),
        "the first write went to the replica"
    );
}

/// RELOAD turning route_reads off: reads go back to the first host (with
/// `load_balance_hosts=disable`; PgBouncer's default round-robin would
/// spread them over the list) and the checks stop.
#[tokio::test]
async fn reload_turns_routing_off() {
    let (primary, replica) = primary_and_replica();
    let config = routed_config(&primary, &replica, "route_reads=1", &[]);
    let sluice = config.start();
    wait_for_roles(&sluice, &primary, &replica).await;
    let client = connect_as(sluice.port(), APP_USER, "postgres").await;
    assert!(in_recovery(&client, "select pg_is_in_recovery()").await);
    sluice.rewrite_config(
        &routed_config(&primary, &replica, "load_balance_hosts=disable", &[]).render(),
    );
    sluice.reload();
    let deadline = Instant::now() + Duration::from_secs(10);
    while in_recovery(&client, "select pg_is_in_recovery()").await {
        assert!(Instant::now() < deadline, "reads still routed after RELOAD");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        hosts(&sluice).await.is_empty(),
        "checks still listed after RELOAD"
    );
}

/// A RELOAD that moves a database to other hosts: writes go to the new
/// primary from then on, even while a client that routed a read before the
/// RELOAD (and so looked up the old hosts) sits idle: the old hosts'
/// checks stop and never move the pool back.
#[tokio::test]
async fn a_reload_to_other_hosts_is_not_undone_by_the_old_checks() {
    let (primary, replica) = primary_and_replica();
    let other = app_cluster_with(ServerAuth::Trust, |b| b);
    let sluice = routed(&primary, &replica, "route_reads=1", &[]);
    wait_for_roles(&sluice, &primary, &replica).await;
    let idle = connect_as(sluice.port(), APP_USER, "postgres").await;
    assert!(in_recovery(&idle, "select pg_is_in_recovery()").await);
    let moved = ConfigBuilder::new()
        .database(
            "postgres",
            &format!(
                "host={} port={} dbname=postgres route_reads=1",
                other.host(),
                other.port()
            ),
        )
        .set("pool_mode", "transaction")
        .set("default_pool_size", "4")
        .set("admin_users", APP_USER);
    sluice.rewrite_config(&moved.render());
    sluice.reload();
    let client = connect_as(sluice.port(), APP_USER, "postgres").await;
    let port = "/* sluice: primary */ select current_setting('port')";
    let deadline = Instant::now() + Duration::from_secs(10);
    while scalar_text(&client, port).await != other.port().to_string() {
        assert!(
            Instant::now() < deadline,
            "writes never moved to the new host"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Many check periods later, every write still lands there.
    for _ in 0..30 {
        assert_eq!(
            scalar_text(&client, port).await,
            other.port().to_string(),
            "a write went back to the old primary"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // (writes wait while the pool points elsewhere than the current
    // primary, so a flapping pool shows in the log, not in the results)
    let old = format!(":{}", primary.port());
    let flaps: Vec<String> = sluice
        .log()
        .lines()
        .filter(|l| l.contains("servers now open on the primary") && l.contains(&old))
        .map(str::to_owned)
        .collect();
    assert!(
        flaps.is_empty(),
        "the old checks moved the pool back: {flaps:?}"
    );
    drop(idle);
}

/// RELOADs that take replica pools out of use give their servers' units of
/// `max_db_connections` back (a budget of 2 would otherwise run dry).
#[tokio::test]
async fn reloads_do_not_leak_the_connection_budget() {
    let (primary, replica) = primary_and_replica();
    let config = |route: &str| {
        routed_config(&primary, &replica, route, &[("read_your_writes", "off")])
            .set("max_db_connections", "2")
            .set("default_pool_size", "2")
            .set("query_wait_timeout", "5")
    };
    let sluice = config("route_reads=1").start();
    wait_for_roles(&sluice, &primary, &replica).await;
    // Four clients read and write while routing is turned off and on.
    let port = sluice.port();
    let mut workers = Vec::new();
    for w in 0..4 {
        workers.push(tokio::spawn(async move {
            let client = connect_as(port, APP_USER, "postgres").await;
            for i in 0..150 {
                let _ = client.simple_query("select pg_is_in_recovery()").await;
                let _ = client
                    .simple_query(&format!(
                        "insert into items values ({}, 'w')",
                        1000 * (w + 1) + i
                    ))
                    .await;
            }
        }));
    }
    for round in 0..6 {
        let route = if round % 2 == 0 {
            "load_balance_hosts=disable"
        } else {
            "route_reads=1"
        };
        sluice.rewrite_config(&config(route).render());
        sluice.reload();
        tokio::time::sleep(Duration::from_millis(300)).await;
        if round % 2 == 1 {
            // Routing back on: each host's check reaches that host (a check
            // sent along the old host list found two primaries, once).
            wait_for_roles(&sluice, &primary, &replica).await;
        }
    }
    for w in workers {
        w.await.expect("worker");
    }
    let client = connect_as(sluice.port(), APP_USER, "postgres").await;
    for i in 0..6 {
        client
            .simple_query(&format!("insert into items values ({}, 'after')", 200 + i))
            .await
            .unwrap_or_else(|e| panic!("after the reloads: {e}\n{}", sluice.log_tail(20)));
        scalar_text(&client, "select count(*) from items").await;
    }
}

/// `target_session_attrs` on an entry that routes reads: `standby` sends
/// whole sessions (session mode) to a replica, `prefer-standby` every
/// transaction (transaction mode), falling back to the primary when no
/// replica qualifies, while `standby` then waits `failover_hold` and fails.
/// A write on a standby gets the replica's 25006: it is not run again on
/// the primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_that_ask_for_standbys_get_replicas() {
    let (primary, replica) = primary_and_replica();
    let hosts_entry = format!(
        "host={h},{h} port={p},{r} dbname=postgres route_reads=1",
        h = primary.host(),
        p = primary.port(),
        r = replica.port()
    );
    let sluice = routed_config(
        &primary,
        &replica,
        "route_reads=1",
        &[("failover_hold", "2")],
    )
    .database(
        "ro",
        &format!("{hosts_entry} target_session_attrs=standby pool_mode=session"),
    )
    .database(
        "maybe_ro",
        &format!("{hosts_entry} target_session_attrs=prefer-standby"),
    )
    .start();
    wait_for_roles(&sluice, &primary, &replica).await;

    let ro = connect_as(sluice.port(), APP_USER, "ro").await;
    assert!(in_recovery(&ro, "select pg_is_in_recovery()").await);
    let pid = scalar_text(&ro, "select pg_backend_pid()").await;
    let err = ro
        .simple_query("insert into items values (7, 'on a standby')")
        .await
        .expect_err("a standby refuses writes");
    assert_eq!(sqlstate(&err), Some("25006"), "{err:?}");
    assert_eq!(
        scalar_text(&ro, "select pg_backend_pid()").await,
        pid,
        "a session-mode session keeps its standby server"
    );
    let written = superuser_connect(&primary, "postgres").await;
    assert_eq!(
        scalar_text(&written, "select count(*) from items where id = 7").await,
        "0",
        "the write was not run on the primary"
    );

    let maybe = connect_as(sluice.port(), APP_USER, "maybe_ro").await;
    // Its own checks start with its first client: until they are in, the
    // primary (prefer-standby).
    let deadline = Instant::now() + Duration::from_secs(20);
    while !in_recovery(&maybe, "select pg_is_in_recovery()").await {
        assert!(Instant::now() < deadline, "never on the replica");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for _ in 0..3 {
        assert!(in_recovery(&maybe, "select pg_is_in_recovery()").await);
    }
    maybe
        .batch_execute("begin; select count(*) from items; commit")
        .await
        .expect("a transaction on a standby");

    // No replica: prefer-standby falls back to the primary; standby waits
    // failover_hold, then fails.
    replica.stop().expect("stop the replica");
    let deadline = Instant::now() + Duration::from_secs(20);
    while hosts(&sluice)
        .await
        .iter()
        .any(|(p, _, state, _)| *p == replica.port().to_string() && state != "down")
    {
        assert!(Instant::now() < deadline, "the replica never went down");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!in_recovery(&maybe, "select pg_is_in_recovery()").await);
    let started = Instant::now();
    let err = connect_as(sluice.port(), APP_USER, "ro")
        .await
        .simple_query("select 1")
        .await
        .expect_err("no standby");
    assert_eq!(sqlstate(&err), Some("08006"), "{err:?}");
    assert!(format!("{err:?}").contains("no standby"), "{err:?}");
    assert!(started.elapsed() >= Duration::from_millis(1500));
}

/// A primary that comes back as a standby before the checks see it (a
/// demotion between two checks): the server the clients' pool opens there
/// says `in_hot_standby` at login and takes no transaction; the write
/// waits for a primary instead, and as none comes within the hold it ends
/// with 08006 saying why, never with the standby's 25006.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_back_as_a_standby_before_the_checks_see_it_takes_no_write() {
    let (primary, replica) = primary_and_replica();
    let sluice = routed(
        &primary,
        &replica,
        "route_reads=1",
        &[("health_check_period", "60"), ("failover_hold", "2")],
    );
    let client = connect_as(sluice.port(), APP_USER, "postgres").await;
    client
        .execute("insert into items values (1, 'before')", &[])
        .await
        .expect("a write on the primary");
    drop(client);
    primary.stop().expect("stop the primary");
    std::fs::write(primary.data_dir().join("standby.signal"), "").expect("standby.signal");
    primary.start_again().expect("start it again, as a standby");
    let client = connect_as(sluice.port(), APP_USER, "postgres").await;
    let err = client
        .execute("insert into items values (2, 'on a standby?')", &[])
        .await
        .expect_err("no primary: the write cannot succeed");
    let db = err
        .as_db_error()
        .unwrap_or_else(|| panic!("not a server error: {err}"));
    assert_eq!(
        db.code().code(),
        "08006",
        "{}\n{}",
        db.message(),
        sluice.log_tail(20)
    );
    assert!(db.message().contains("is a standby"), "{}", db.message());
}

/// The first server to greet a new pool may be a replica (it is listed
/// first, and the checks have not run yet): clients are still told the
/// endpoint is not a standby (`in_hot_standby=off`), so libpq's
/// `target_session_attrs=read-write` connects and its writes succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_listed_first_does_not_make_the_endpoint_a_standby() {
    let (primary, replica) = primary_and_replica();
    let sluice = ConfigBuilder::new()
        .database(
            "postgres",
            &format!(
                "host={h},{h} port={r},{p} dbname=postgres route_reads=1",
                h = primary.host(),
                p = primary.port(),
                r = replica.port()
            ),
        )
        .set("pool_mode", "transaction")
        .set("admin_users", APP_USER)
        .start();
    let out = std::process::Command::new(sluice_testkit::psql_path().expect("psql"))
        .arg(format!(
            "host=127.0.0.1 port={} user={APP_USER} dbname=postgres \
             target_session_attrs=read-write connect_timeout=20",
            sluice.port()
        ))
        .args([
            "-X",
            "-A",
            "-t",
            "-c",
            "insert into items values (7, 'rw') returning id",
        ])
        .output()
        .expect("run psql");
    assert!(
        out.status.success(),
        "psql with target_session_attrs=read-write: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("7\n"));
}

/// A role whose transactions default to serializable (which a standby
/// refuses: 0A000) reads on the primary: the refused read runs again
/// there, and after a few the role's reads stay there for a while.
/// Before, every read it sent failed. And `SHOW transaction_read_only`,
/// what a driver asked for a read-write connection checks, is answered
/// by the primary, as sluice reports one writable database.
#[tokio::test]
async fn reads_a_standby_refuses_and_questions_about_the_node_go_to_the_primary() {
    let (primary, replica) = primary_and_replica();
    primary
        .psql(
            "postgres",
            "create role strict login; \
             alter role strict set default_transaction_isolation = 'serializable'; \
             grant select on items to strict",
        )
        .expect("role");
    let sluice = routed(&primary, &replica, "route_reads=1", &[]);
    wait_for_roles(&sluice, &primary, &replica).await;
    let app = connect_as(sluice.port(), APP_USER, "postgres").await;
    assert!(
        in_recovery(&app, "select pg_is_in_recovery()").await,
        "plain reads go to the replica"
    );
    for _ in 0..3 {
        assert_eq!(scalar_text(&app, "show transaction_read_only").await, "off");
    }
    let strict = connect_as(sluice.port(), "strict", "postgres").await;
    for _ in 0..6 {
        assert_eq!(
            scalar_text(&strict, "select count(*)::text from items").await,
            "0"
        );
    }
    assert!(!in_recovery(&strict, "select pg_is_in_recovery()").await);
    // Another 0A000, which the primary gives too, moves nothing.
    expect_sqlstate(
        app.simple_query("select case when true then generate_series(1, 2) end")
            .await,
        "0A000",
    );
    assert!(in_recovery(&app, "select pg_is_in_recovery()").await);
}

/// A write made while the session kept its reads on the primary (`SET
/// sluice.route = 'primary'`) counts for read-your-writes: once the
/// session lets reads go to replicas again, the next one sees it. Before,
/// it went to a replica that had not replayed the write.
#[tokio::test]
async fn a_write_while_reads_stay_on_the_primary_is_read_back() {
    let (primary, replica) = primary_and_replica_with(&[("synchronous_commit", "on")]);
    let (_sluice, client) = reading_client(&primary, &replica, &[]).await;
    let on_replica = superuser_connect(&replica, "postgres").await;
    replay(&on_replica, false).await;
    client
        .batch_execute("SET sluice.route = 'primary'")
        .await
        .unwrap();
    client
        .batch_execute("insert into items values (1, 'pinned')")
        .await
        .unwrap();
    client.batch_execute("RESET sluice.route").await.unwrap();
    assert_eq!(
        scalar_text(&client, "select count(*)::text from items").await,
        "1"
    );
    replay(&on_replica, true).await;
}

/// A replica restarting costs no read: while sluice cannot log in there
/// (refused, or its failure still remembered for server_login_retry) the
/// read runs on the primary, and once a check logs in again the replica
/// takes reads at once. Before, reads failed with 08006 for about 12 s.
#[tokio::test]
async fn reads_go_on_while_a_replica_restarts() {
    let (primary, replica) = primary_and_replica();
    let (sluice, client) =
        reading_client(&primary, &replica, &[("health_check_threshold", "100")]).await;
    replica.stop().expect("stop the replica");
    // (the checks keep it "up" for a hundred failures: the reads meet the
    // refused logins themselves)
    for _ in 0..20 {
        let fresh = connect_as(sluice.port(), APP_USER, "postgres").await;
        assert!(!in_recovery(&fresh, "select pg_is_in_recovery()").await);
        assert!(!in_recovery(&client, "select pg_is_in_recovery()").await);
    }
    replica.start_again().expect("start the replica again");
    let deadline = Instant::now() + Duration::from_secs(8);
    while !in_recovery(&client, "select pg_is_in_recovery()").await {
        assert!(
            Instant::now() < deadline,
            "reads never went back to the replica\n{}",
            sluice.log_tail(20)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every process of a cluster stopped (SIGSTOP: the kernel still takes
/// bytes and connections, nothing answers), until dropped.
struct Frozen(Vec<String>);

impl Frozen {
    fn new(cluster: &Cluster) -> Self {
        let pidfile = std::fs::read_to_string(cluster.data_dir().join("postmaster.pid"))
            .expect("postmaster.pid");
        let postmaster = pidfile.lines().next().expect("a pid").trim().to_owned();
        let mut pids = vec![postmaster.clone()];
        for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
            let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
            // pid (comm) state ppid …: the comm may hold spaces.
            let ppid = stat
                .rsplit(')')
                .next()
                .and_then(|r| r.split_whitespace().nth(1));
            if ppid == Some(postmaster.as_str()) {
                pids.push(entry.file_name().to_string_lossy().into_owned());
            }
        }
        let frozen = Frozen(pids);
        frozen.signal("-STOP");
        frozen
    }

    fn signal(&self, signal: &str) {
        let status = std::process::Command::new("kill")
            .arg(signal)
            .args(&self.0)
            .status()
            .expect("kill");
        assert!(status.success(), "kill {signal} {:?}", self.0);
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        self.signal("-CONT");
    }
}

/// Waits until `running` (a count of the read's backends) says 1.
async fn wait_until_running(on: &Client, running: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while scalar_text(on, running).await != "1" {
        assert!(Instant::now() < deadline, "the read never ran there");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A read whose replica freezes before it answers runs on the primary
/// once the checks take the replica out of rotation. Before, it waited
/// for the replica to thaw (or for query_timeout, off by default).
#[tokio::test]
async fn a_read_whose_replica_freezes_runs_on_the_primary() {
    read_through_a_freeze(&[], Sent::Simple, 12).await;
}

/// The same with query_timeout set (its clock once kept the replica's
/// from running) and a read by a prepared statement (the Parse sluice
/// sends first on a replica server that lacks it once barred the re-run:
/// the client got 08006), both found by a review.
#[tokio::test]
async fn a_prepared_read_whose_replica_freezes_runs_on_the_primary_within_query_timeout() {
    read_through_a_freeze(&[("query_timeout", "30")], Sent::Prepared, 2).await;
}

/// The same with a one-off query as most drivers send it (Parse of the
/// unnamed statement, Bind, Describe, Execute, Sync in one batch): it
/// once waited for the thaw (found by a review).
#[tokio::test]
async fn a_one_off_extended_read_whose_replica_freezes_runs_on_the_primary() {
    read_through_a_freeze(&[], Sent::OneOff, 12).await;
}

/// How the read goes.
#[derive(Clone, Copy)]
enum Sent {
    /// A simple Query.
    Simple,
    /// A named statement prepared first, then Bind, Execute, Sync.
    Prepared,
    /// The unnamed statement: Parse, Bind, Describe, Execute, Sync.
    OneOff,
}

/// A read of `sleep` seconds on the replica, which freezes while it runs.
/// A long one (past the time the checks take) is also found cancelled on
/// the replica once it thaws: it is not run to its end there too.
async fn read_through_a_freeze(settings: &[(&str, &str)], sent: Sent, sleep: u32) {
    let read_sql = format!("select pg_is_in_recovery()::text, pg_sleep({sleep})");
    let running = format!(
        "select count(*)::text from pg_stat_activity \
         where query = '{read_sql}' and state = 'active'"
    );
    let (primary, replica) = primary_and_replica();
    let mut with = vec![
        ("health_check_timeout", "1"),
        ("health_check_threshold", "2"),
    ];
    with.extend_from_slice(settings);
    let (sluice, client) = reading_client(&primary, &replica, &with).await;
    let on_replica = superuser_connect(&replica, "postgres").await;
    let read = tokio::spawn(async move {
        match sent {
            Sent::Prepared => {
                let statement = client.prepare(&read_sql).await?;
                let row = client.query_one(&statement, &[]).await?;
                return Ok::<_, tokio_postgres::Error>(Some(row.get::<_, String>(0)));
            }
            Sent::OneOff => {
                let rows = client.query_typed(&read_sql, &[]).await?;
                return Ok(rows.first().map(|r| r.get::<_, String>(0)));
            }
            Sent::Simple => {}
        }
        let rows = client.simple_query(&read_sql).await?;
        Ok(rows.into_iter().find_map(|m| match m {
            SimpleQueryMessage::Row(r) => r.get(0).map(str::to_owned),
            _ => None,
        }))
    });
    wait_until_running(&on_replica, &running).await;
    let frozen = Frozen::new(&replica);
    // Once it runs on the primary, the replica thaws, its read not done
    // (pg_sleep counts wall time: a long one has most of it left).
    let on_primary = superuser_connect(&primary, "postgres").await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while scalar_text(&on_primary, &running).await != "1" && !read.is_finished() {
        assert!(
            Instant::now() < deadline,
            "the read never ran on the primary\n{}",
            sluice.log_tail(20)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(frozen);
    if sleep >= 10 {
        // (only a cancel ends it this soon: it is not run to its end on
        // the replica too)
        let deadline = Instant::now() + Duration::from_secs(3);
        while scalar_text(&on_replica, &running).await != "0" {
            assert!(
                Instant::now() < deadline,
                "the read still runs on the replica after it thawed\n{}",
                sluice.log_tail(20)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let answer = tokio::time::timeout(Duration::from_secs(20), read)
        .await
        .unwrap_or_else(|_| panic!("the read never answered\n{}", sluice.log_tail(20)))
        .expect("task")
        .unwrap_or_else(|e| panic!("the read failed: {e}\n{}", sluice.log_tail(20)));
    assert_eq!(answer.as_deref(), Some("false"), "it ran on the primary");
    let next = connect_as(sluice.port(), APP_USER, "postgres").await;
    assert_eq!(scalar_text(&next, "select 'next'").await, "next");
}

/// query_timeout on a read whose replica is frozen, still in rotation:
/// the client is told at its time, not once the cancel sluice sends the
/// frozen host gives up (`cancel_wait_timeout`, 10 s; found by a review).
#[tokio::test]
async fn query_timeout_on_a_frozen_replica_answers_at_its_time() {
    let (primary, replica) = primary_and_replica();
    let slow_checks = [
        ("health_check_timeout", "3"),
        ("health_check_threshold", "3"),
        ("query_timeout", "1"),
    ];
    let (sluice, client) = reading_client(&primary, &replica, &slow_checks).await;
    let on_replica = superuser_connect(&replica, "postgres").await;
    let started = Instant::now();
    let read = tokio::spawn(async move {
        let answer = client
            .simple_query("select pg_is_in_recovery()::text, pg_sleep(5)")
            .await;
        (answer, started.elapsed())
    });
    while scalar_text(
        &on_replica,
        "select count(*)::text from pg_stat_activity \
         where query = 'select pg_is_in_recovery()::text, pg_sleep(5)'",
    )
    .await
        != "1"
    {
        assert!(!read.is_finished(), "the read did not wait on the replica");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let frozen = Frozen::new(&replica);
    let (answer, took) = tokio::time::timeout(Duration::from_secs(20), read)
        .await
        .expect("an answer within 20 s")
        .expect("task");
    drop(frozen);
    let error = answer.expect_err("the read cannot answer: its replica is frozen");
    assert_eq!(
        error.as_db_error().map(|e| e.message()),
        Some("query timeout"),
        "{error:?}\n{}",
        sluice.log_tail(20)
    );
    assert!(
        took < Duration::from_secs(5),
        "the query timeout came after {took:?}"
    );
}

/// A read an administrator terminates on its replica mid-run (its
/// farewell comes behind the row description; PostgreSQL reports a fast
/// shutdown alike) is not run again on the primary: a runaway query
/// killed on a replica must not move to the primary. The client gets the
/// farewell, as from PostgreSQL; sluice serves its next connection.
#[tokio::test]
async fn a_read_killed_on_its_replica_is_not_run_again_on_the_primary() {
    let (primary, replica) = primary_and_replica();
    let (sluice, client) = reading_client(&primary, &replica, &[]).await;
    let on_replica = superuser_connect(&replica, "postgres").await;
    let killer = tokio::spawn(async move {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let rows = on_replica
                .simple_query(
                    "select count(pg_terminate_backend(pid))::text from pg_stat_activity \
                     where query like '%pg_sleep(2)%' and pid <> pg_backend_pid()",
                )
                .await
                .expect("terminate");
            let done = rows.iter().any(
                |m| matches!(m, SimpleQueryMessage::Row(r) if r.get(0).is_some_and(|n| n != "0")),
            );
            if done || Instant::now() > deadline {
                return done;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    let killed = client
        .simple_query("select pg_is_in_recovery()::text, pg_sleep(2)")
        .await;
    assert!(
        killer.await.expect("killer"),
        "the replica's backend was terminated"
    );
    expect_sqlstate(killed, "57P01");
    let next = connect_as(sluice.port(), APP_USER, "postgres").await;
    assert_eq!(scalar_text(&next, "select 1::text").await, "1");
}

/// A write pipelined behind a read the router sent to the primary (the
/// replica had not replayed the client's last write) is routed as a
/// write: the client's next read does not go to a replica without it.
/// Before, it rode in the read's lease, unrecorded, and a read 1.5 s
/// later on a replica (2 s behind) missed it; the same once the
/// lost-server net (which takes its cap off when answered) covered reads
/// on the primary.
#[tokio::test]
async fn a_write_pipelined_behind_a_read_on_the_primary_is_read_back() {
    use sluice_tests::msg::{bind, execute, parse, sync};
    let (primary, replica) = primary_and_replica_with(&[("synchronous_commit", "on")]);
    replica
        .psql(
            "postgres",
            "alter system set recovery_min_apply_delay = '2s'",
        )
        .expect("delay replay");
    replica.pg_ctl_reload().expect("reload the replica");
    let sluice = routed(
        &primary,
        &replica,
        "route_reads=1",
        &[("replica_max_lag", "5")],
    );
    wait_for_roles(&sluice, &primary, &replica).await;
    let wait = Duration::from_secs(10);
    let mut raw = RawClient::logged_in(sluice.port(), APP_USER, "postgres").await;
    raw.simple_query("select 1", wait).await;
    raw.simple_query("insert into items values (1, 'first')", wait)
        .await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    // (the read goes to the primary: the replica has not replayed the
    // first write; the second write rides behind it)
    let mut batch = parse("", "select count(*) from items where id = 1");
    batch.extend(bind(""));
    batch.extend(execute());
    batch.extend(sync());
    batch.extend(parse("", "insert into items values (2, 'second')"));
    batch.extend(bind(""));
    batch.extend(execute());
    batch.extend(sync());
    raw.send(&batch).await.expect("send");
    assert_eq!(errors_in_replies(&mut raw, 2).await, Vec::<String>::new());
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let rows = raw
        .simple_query("select count(*)::text from items where id = 2", wait)
        .await;
    assert_eq!(rows, vec![Some("1".to_owned())], "the client's own write");
    // The same with simple Queries (a read the primary runs may run again
    // on another server if its server is found dead: once it is
    // answered, the write behind it is still routed as a write).
    let mut pipelined = sluice_tests::msg::query("select count(*) from items where id = 2");
    pipelined.extend(sluice_tests::msg::query(
        "insert into items values (3, 'third')",
    ));
    raw.send(&pipelined).await.expect("send");
    assert_eq!(errors_in_replies(&mut raw, 2).await, Vec::<String>::new());
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let rows = raw
        .simple_query("select count(*)::text from items where id = 3", wait)
        .await;
    assert_eq!(rows, vec![Some("1".to_owned())], "the client's own write");
}

/// A client that cancels a read waiting on a frozen replica is answered
/// as PostgreSQL answers a cancelled query once the replica is taken out
/// of rotation: the read is not run again on the primary (found by a
/// review: the cancel went to the frozen replica, and the re-run answered
/// in full).
#[tokio::test]
async fn a_read_cancelled_on_a_frozen_replica_is_not_run_again() {
    let (primary, replica) = primary_and_replica();
    let checks = [
        ("health_check_timeout", "1"),
        ("health_check_threshold", "2"),
    ];
    let (sluice, client) = reading_client(&primary, &replica, &checks).await;
    let token = client.cancel_token();
    let sql = "select pg_is_in_recovery()::text, pg_sleep(4)";
    let read = tokio::spawn(async move { client.simple_query(sql).await });
    let on_replica = superuser_connect(&replica, "postgres").await;
    let running = format!(
        "select count(*)::text from pg_stat_activity where query = '{sql}' and state = 'active'"
    );
    wait_until_running(&on_replica, &running).await;
    let frozen = Frozen::new(&replica);
    token.cancel_query(NoTls).await.expect("cancel request");
    let answer = tokio::time::timeout(Duration::from_secs(30), read)
        .await
        .unwrap_or_else(|_| panic!("the read never answered\n{}", sluice.log_tail(20)))
        .expect("task");
    drop(frozen);
    let error = match answer {
        Ok(rows) => panic!(
            "the cancelled read was run again: {} messages\n{}",
            rows.len(),
            sluice.log_tail(15)
        ),
        Err(e) => e,
    };
    let db = error.as_db_error().expect("an ErrorResponse");
    assert_eq!(db.code().code(), "57014", "{db:?}");
}

/// A read that cannot run again (a named statement parsed in its own
/// batch) on a replica that freezes: one the client cancels ends once the
/// checks take the replica out of rotation, not when it thaws (the cancel
/// waits in the frozen replica's queue). Without a cancel it waits, as for
/// a replica that answers late: its backend may be well while only the
/// checks fail (a review saw such a read killed).
#[tokio::test]
async fn a_cancelled_read_that_cannot_run_again_ends_when_its_replica_freezes() {
    let (primary, replica) = primary_and_replica();
    let sluice = routed_config(&primary, &replica, "route_reads=1", &[])
        .set("health_check_timeout", "1")
        .set("health_check_threshold", "2")
        .start();
    wait_for_roles(&sluice, &primary, &replica).await;
    let mut raw = RawClient::connect(sluice.port()).await;
    raw.startup(APP_USER, "postgres").await;
    let mut key = None;
    loop {
        match raw.read_message(Duration::from_secs(10)).await {
            RawReply::Message(b'K', body) => key = Some(body),
            RawReply::Message(b'Z', _) => break,
            RawReply::Message(..) => {}
            other => panic!("login: {other:?}"),
        }
    }
    let key = key.expect("BackendKeyData");
    let sql = "select pg_is_in_recovery()::text, pg_sleep(60)";
    let mut batch = parse_named("st9", sql);
    batch.extend(frontend(b'B', b"\0st9\0\0\0\0\0\0\0"));
    batch.extend(frontend(b'E', b"\0\0\0\0\0"));
    batch.extend(frontend(b'S', b""));
    raw.send(&batch).await.expect("send");
    let on_replica = superuser_connect(&replica, "postgres").await;
    let running = format!(
        "select count(*)::text from pg_stat_activity where query = '{sql}' and state = 'active'"
    );
    wait_until_running(&on_replica, &running).await;
    let frozen = Frozen::new(&replica);
    // Out of rotation within about three seconds: it still waits, uncancelled.
    if let RawReply::Message(tag, body) = raw.read_message(Duration::from_secs(6)).await {
        panic!(
            "an uncancelled read ended: {} {body:?}\n{}",
            char::from(tag),
            sluice.log_tail(10)
        );
    }
    let mut cancel = 16u32.to_be_bytes().to_vec();
    cancel.extend_from_slice(&80877102u32.to_be_bytes());
    cancel.extend_from_slice(&key);
    let mut canceller = RawClient::connect(sluice.port()).await;
    canceller.send(&cancel).await.expect("cancel request");
    let cancelled_at = Instant::now();
    let mut codes = Vec::new();
    loop {
        match raw.read_message(Duration::from_secs(30)).await {
            RawReply::Message(b'E', body) => {
                let fields = error_fields(&body);
                codes.push(error_field(&fields, b'C').unwrap_or("").to_owned());
            }
            RawReply::Message(..) => {}
            RawReply::Closed => break,
            RawReply::TimedOut => panic!(
                "the cancelled read still waits for its frozen replica after 30 s\n{}",
                sluice.log_tail(15)
            ),
        }
    }
    assert!(cancelled_at.elapsed() < Duration::from_secs(10));
    drop(frozen);
    assert_eq!(codes, ["08006"], "{}", sluice.log_tail(15));
    let next = connect_as(sluice.port(), APP_USER, "postgres").await;
    assert_eq!(scalar_text(&next, "select 'next'").await, "next");
}

/// Raw extended-protocol messages for the tests below.
fn frontend(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut message = vec![tag];
    message.extend_from_slice(&length_prefixed(body));
    message
}

fn parse_named(name: &str, sql: &str) -> Vec<u8> {
    frontend(b'P', format!("{name}\0{sql}\0\0\0").as_bytes())
}

/// Reads replies up to ReadyForQuery: the error codes, the notices and
/// the command tags.
async fn replies(raw: &mut RawClient) -> (Vec<String>, usize, Vec<String>) {
    let (mut errors, mut notices, mut tags) = (Vec::new(), 0, Vec::new());
    loop {
        match raw.read_message(Duration::from_secs(15)).await {
            RawReply::Message(b'Z', _) => return (errors, notices, tags),
            RawReply::Message(b'E', body) => {
                let fields = error_fields(&body);
                errors.push(error_field(&fields, b'C').unwrap_or("").to_owned());
            }
            RawReply::Message(b'N', _) => notices += 1,
            RawReply::Message(b'C', body) => {
                tags.push(
                    String::from_utf8_lossy(body.strip_suffix(b"\0").unwrap_or(&body)).into(),
                );
            }
            RawReply::Message(..) => {}
            other => panic!("{other:?}"),
        }
    }
}

/// Reads the replica refuses run again on the primary, the client hearing
/// only the primary: also when sluice evicts a statement on the replica's
/// server first (its own CloseComplete was once taken for the batch's
/// first answer: the client got 25006), and with a notice raised before
/// the refusal (once passed on, then sent again by the primary's run).
#[tokio::test]
async fn refused_reads_run_again_past_evictions_and_notices() {
    let (primary, replica) = primary_and_replica();
    let sluice = routed_config(&primary, &replica, "route_reads=1", &[])
        .set("max_prepared_statements", "2")
        .start();
    wait_for_roles(&sluice, &primary, &replica).await;
    let mut raw = RawClient::logged_in(sluice.port(), APP_USER, "postgres").await;
    let sync = frontend(b'S', b"");
    for i in 0..6 {
        let mut prepare = parse_named(&format!("n{i}"), &format!("select app_sneaky() + {i}"));
        prepare.extend_from_slice(&sync);
        raw.send(&prepare).await.expect("send");
        let (errors, _, _) = replies(&mut raw).await;
        assert!(errors.is_empty(), "{errors:?}");
    }
    for i in 0..12 {
        // (a one-off Parse and its description ahead of the Bind of a
        // named statement that 2 per server cannot all keep)
        let mut batch = parse_named("", "select 7");
        batch.extend(frontend(b'D', b"S\0"));
        batch.extend(frontend(
            b'B',
            format!("\0n{}\0\0\0\0\0\0\0", i % 6).as_bytes(),
        ));
        batch.extend(frontend(b'D', b"P\0"));
        batch.extend(frontend(b'E', b"\0\0\0\0\0"));
        batch.extend_from_slice(&sync);
        raw.send(&batch).await.expect("send");
        let (errors, _, tags) = replies(&mut raw).await;
        assert!(
            errors.is_empty(),
            "batch {i}: {errors:?}\n{}",
            sluice.log_tail(10)
        );
        assert_eq!(tags, ["SELECT 1"], "batch {i}");
    }
    let long_name = "x".repeat(70);
    let refused_with_a_notice = query_message(&format!("select app_sneaky() as {long_name}"));
    for _ in 0..3 {
        raw.send(&refused_with_a_notice).await.expect("send");
        let (errors, notices, tags) = replies(&mut raw).await;
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(tags, ["SELECT 1"]);
        assert_eq!(notices, 1, "the identifier's notice, once");
    }
}
