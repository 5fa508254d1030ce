//! The pool's accounting, on servers made for the test: a socket pair each,
//! lent as a login would lend it, with no PostgreSQL behind (no login, no
//! query). Who waits, who is served and in what order, what is counted,
//! what comes back to the idle list and what is closed.

use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::UnixStream;

use super::*;
use crate::backend::target::ServerAddr;
use crate::net::Stream;
use crate::test_support::runtime;

fn addr() -> ServerAddr {
    ServerAddr::Tcp {
        host: "127.0.0.1".into(),
        port: 1,
    }
}

fn pool(pool_size: u32, query_wait_timeout: Duration) -> Arc<Pool> {
    Arc::new(test_pool(addr(), pool_size, query_wait_timeout))
}

/// A pool of database "db", user "u", at `addr`, in transaction mode,
/// with no shared limit; it opens a server only when asked for one with
/// no idle server and a free slot (these tests lend their own instead).
pub(crate) fn test_pool(addr: ServerAddr, pool_size: u32, query_wait_timeout: Duration) -> Pool {
    pool_with(
        addr,
        settings(pool_size, query_wait_timeout),
        Arc::new(ConnLimit::new(0)),
    )
}

/// A pool of "db" and "u" at `addr` with `settings`, counted against the
/// database budget `db_limit`.
fn pool_with(addr: ServerAddr, settings: PoolSettings, db_limit: Arc<ConnLimit>) -> Pool {
    Pool::new(
        "db".into(),
        "u".into(),
        target(addr),
        ServerCredential::default(),
        settings,
        db_limit,
        Arc::new(ConnLimit::new(0)),
    )
}

fn target(addr: ServerAddr) -> ServerTarget {
    ServerTarget {
        addr,
        dbname: "db".into(),
        user: "u".into(),
        startup_params: Vec::new(),
        connect_query: None,
        connect_timeout: Duration::from_secs(1),
        keepalive: Default::default(),
        dns: Default::default(),
        tls: Default::default(),
        alternates: Default::default(),
    }
}

fn settings(pool_size: u32, query_wait_timeout: Duration) -> PoolSettings {
    let secs = Duration::from_secs;
    PoolSettings {
        mode: PoolMode::Transaction,
        pool_size,
        min_pool_size: 0,
        reserve_pool_size: 0,
        reserve_pool_timeout: secs(1),
        query_wait_timeout,
        server_idle_timeout: secs(600),
        server_lifetime: secs(3600),
        server_login_retry: secs(1),
        server_reset_query: String::new(),
        server_reset_query_always: false,
        server_check_delay: secs(30),
        server_check_query: String::new(),
        idle_transaction_timeout: secs(1),
        transaction_timeout: Duration::ZERO,
        client_idle_timeout: secs(1),
        query_timeout: Duration::ZERO,
        max_packet_size: 1 << 20,
        max_prepared_statements: 0,
        session_objects: sluice_config::SessionObjects::Pin,
        standby: Standby::default(),
        disable_pqexec: false,
        log_connections: false,
        log_disconnections: false,
        server_round_robin: false,
        cancel_wait_timeout: Duration::ZERO,
        query_wait_notify: Duration::ZERO,
        server_fast_close: false,
    }
}

/// A server for the test, lent at once on a slot of the pool's; its peer
/// (the "PostgreSQL" end) is kept in `peers`, so the server stays open.
fn open(pool: &Arc<Pool>, peers: &mut Vec<UnixStream>) -> Lease {
    open_with(pool, peers, false)
}

/// [`open`] on a slot of the reserve (`use_reserve`) or of the pool.
fn open_with(pool: &Arc<Pool>, peers: &mut Vec<UnixStream>, use_reserve: bool) -> Lease {
    let (ours, theirs) = UnixStream::pair().expect("socket pair");
    peers.push(theirs);
    let server = Box::new(ServerConn::new(
        Stream::plain_unix(ours),
        sluice_wire::BackendKeyData {
            process_id: 1,
            secret_key: 2,
        },
        ParamSet::default(),
    ));
    assert!(pool.take_slot(&mut pool.lock(), use_reserve), "a free slot");
    pool.opened(server, Reported::new(), &addr()).expect("lent")
}

/// `f`'s output, or a failed test after 5 s (never a hung one).
async fn within<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(5), f)
        .await
        .expect("in time")
}

/// An acquire in a task of its own (a client that waits), with the id of
/// the server it got and the lease.
fn acquire_in_task(
    pool: &Arc<Pool>,
) -> tokio::task::JoinHandle<Result<(u64, Lease), AcquireError>> {
    let pool = pool.clone();
    tokio::spawn(async move { pool.acquire().await.map(|l| (l.server_id(), l)) })
}

async fn let_run() {
    for _ in 0..5 {
        tokio::task::yield_now().await;
    }
}

fn counts(pool: &Pool) -> (u32, u32, u32, u32) {
    let c = pool.counts();
    (c.waiting, c.active, c.idle, c.total)
}

/// Clients that find no server wait in line and are served first in,
/// first out, each with the server the one before gave back; the counts
/// follow (waiting, active, idle, total).
#[test]
fn waiters_are_served_in_order() {
    runtime().block_on(async {
        let pool = pool(1, Duration::from_secs(60));
        let mut peers = Vec::new();
        let first = open(&pool, &mut peers);
        let id = first.server_id();
        let a = acquire_in_task(&pool);
        let_run().await;
        let b = acquire_in_task(&pool);
        let_run().await;
        assert_eq!(counts(&pool), (2, 1, 0, 1), "two in line, one lent");
        first.release();
        let (got, lease) = within(a).await.expect("task").expect("a is served first");
        assert_eq!(got, id, "the same server, handed over");
        let_run().await;
        assert!(!b.is_finished(), "b waits while a holds the only server");
        assert_eq!(counts(&pool), (1, 1, 0, 1));
        lease.release();
        let (got, lease) = within(b).await.expect("task").expect("b is served next");
        assert_eq!(got, id);
        lease.release();
        assert_eq!(counts(&pool), (0, 0, 1, 1), "back idle");
    });
}

/// A client that gives up after a server was handed to it (its future is
/// dropped before it looked) does not take the server with it: it goes
/// back idle, and the line is empty.
#[test]
fn a_waiter_that_gives_up_gives_its_server_back() {
    runtime().block_on(async {
        let pool = pool(1, Duration::from_secs(60));
        let mut peers = Vec::new();
        let first = open(&pool, &mut peers);
        let a = acquire_in_task(&pool);
        let_run().await;
        assert_eq!(counts(&pool), (1, 1, 0, 1));
        // Handed over, then the waiter is cancelled before it runs.
        first.release();
        a.abort();
        assert!(within(a).await.is_err(), "cancelled");
        assert_eq!(counts(&pool), (0, 0, 1, 1), "the server is idle again");
        // And it serves the next client.
        let next = within(pool.acquire()).await.expect("the idle server");
        assert_eq!(counts(&pool), (0, 1, 0, 1));
        next.release();
    });
}

/// Idle servers are reused last in, first out (the warmest first).
#[test]
fn idle_servers_go_out_last_in_first_out() {
    runtime().block_on(async {
        let pool = pool(2, Duration::from_secs(60));
        let mut peers = Vec::new();
        let one = open(&pool, &mut peers);
        let two = open(&pool, &mut peers);
        let (id_one, id_two) = (one.server_id(), two.server_id());
        one.release();
        two.release();
        assert_eq!(counts(&pool), (0, 0, 2, 2));
        let next = within(pool.acquire()).await.expect("idle");
        assert_eq!(next.server_id(), id_two, "the last one back");
        let after = within(pool.acquire()).await.expect("idle");
        assert_eq!(after.server_id(), id_one);
        next.release();
        after.release();
    });
}

/// After a RECONNECT, a server lent before it closes when it comes back
/// instead of going idle; a lease dropped without release closes its
/// server too. Either way the server is told (Terminate) and its
/// connection ends, and the slot is freed.
#[test]
fn servers_that_cannot_be_trusted_close_and_free_their_slot() {
    runtime().block_on(async {
        let pool = pool(2, Duration::from_secs(60));
        let mut peers = Vec::new();
        let old = open(&pool, &mut peers);
        pool.reconnect();
        old.release();
        assert_eq!(counts(&pool), (0, 0, 0, 0), "closed, not idle");
        let dropped = open(&pool, &mut peers);
        drop(dropped);
        assert_eq!(counts(&pool), (0, 0, 0, 0), "closed, slot freed");
        for peer in &mut peers {
            let mut got = Vec::new();
            within(peer.read_to_end(&mut got)).await.expect("read");
            assert_eq!(got, [b'X', 0, 0, 0, 4], "a Terminate, then the end");
        }
    });
}

/// A client in line past `query_wait_timeout` is told so by the janitor's
/// look (`expire_waiters`), and leaves the line.
#[test]
fn a_waiter_past_query_wait_timeout_is_told_and_leaves_the_line() {
    runtime().block_on(async {
        let pool = pool(1, Duration::from_millis(50));
        let mut peers = Vec::new();
        let held = open(&pool, &mut peers);
        let a = acquire_in_task(&pool);
        let_run().await;
        assert_eq!(counts(&pool), (1, 1, 0, 1));
        tokio::time::sleep(Duration::from_millis(80)).await;
        pool.expire_waiters();
        let got = within(a).await.expect("task");
        assert!(matches!(got, Err(AcquireError::WaitTimeout)), "timed out");
        assert_eq!(counts(&pool), (0, 1, 0, 1), "out of the line");
        held.release();
        assert_eq!(counts(&pool), (0, 0, 1, 1));
    });
}

/// Two clients in line for the one server a test holds: one that queues
/// now, and one whose query began to wait `paused_for` earlier (it waited
/// out a PAUSE), which queues after it.
async fn queued_after_a_pause(
    pool: &Arc<Pool>,
    paused_for: Duration,
) -> (
    tokio::task::JoinHandle<Result<(u64, Lease), AcquireError>>,
    tokio::task::JoinHandle<Result<Lease, AcquireError>>,
) {
    let paused_at = Mono::now();
    tokio::time::sleep(paused_for).await;
    let now = acquire_in_task(pool);
    let_run().await;
    let back = {
        let pool = pool.clone();
        tokio::spawn(async move { pool.acquire_noticing(Some(paused_at), |_| {}).await })
    };
    let_run().await;
    assert_eq!(counts(pool), (2, 1, 0, 1), "both in line");
    (now, back)
}

/// A query that waited out a PAUSE before it queued counts its
/// `query_wait_timeout` from the pause (PgBouncer counts from the query's
/// start): it expires even behind a waiter in front that has time left,
/// which stays in line and gets the next server.
#[test]
fn query_wait_timeout_counts_from_before_a_pause() {
    runtime().block_on(async {
        let pool = pool(1, Duration::from_millis(300));
        let mut peers = Vec::new();
        let held = open(&pool, &mut peers);
        let (front, behind) = queued_after_a_pause(&pool, Duration::from_millis(250)).await;
        tokio::time::sleep(Duration::from_millis(80)).await;
        pool.expire_waiters();
        let got = within(behind).await.expect("task");
        assert!(matches!(got, Err(AcquireError::WaitTimeout)), "timed out");
        assert_eq!(counts(&pool), (1, 1, 0, 1), "the front one still waits");
        held.release();
        let (_, lease) = within(front).await.expect("task").expect("served");
        lease.release();
    });
}

/// The line is in the order the queries began to wait: one that waited
/// out a PAUSE first goes ahead of a later one already in line, and gets
/// the next server.
#[test]
fn a_query_back_from_a_pause_keeps_its_place_in_line() {
    runtime().block_on(async {
        let pool = pool(1, Duration::from_secs(60));
        let mut peers = Vec::new();
        let held = open(&pool, &mut peers);
        let (later, earlier) = queued_after_a_pause(&pool, Duration::from_millis(5)).await;
        let id = held.server_id();
        held.release();
        let first = within(earlier).await.expect("task").expect("served first");
        assert_eq!(first.server_id(), id);
        assert!(!later.is_finished(), "the later one still waits");
        first.release();
        let (_, second) = within(later).await.expect("task").expect("served next");
        second.release();
    });
}

/// A RELOAD that shrinks the pool closes servers as they come back, down
/// to the new size, even with a client in line: the client gets the
/// server that remains.
#[test]
fn a_reload_that_shrinks_the_pool_closes_servers_as_they_come_back() {
    runtime().block_on(async {
        let pool = pool(2, Duration::from_secs(60));
        let mut peers = Vec::new();
        let one = open(&pool, &mut peers);
        let two = open(&pool, &mut peers);
        let kept = two.server_id();
        let a = acquire_in_task(&pool);
        let_run().await;
        assert_eq!(counts(&pool), (1, 2, 0, 2));
        pool.reconfigure(
            settings(1, Duration::from_secs(60)),
            target(addr()),
            ServerCredential::default(),
            false,
        );
        one.release();
        let_run().await;
        assert_eq!(counts(&pool), (1, 1, 0, 1), "closed, not handed over");
        assert!(!a.is_finished(), "the waiter still waits");
        let mut got = Vec::new();
        within(peers[0].read_to_end(&mut got)).await.expect("read");
        assert_eq!(got, [b'X', 0, 0, 0, 4], "the closed server was told");
        two.release();
        let (id, lease) = within(a).await.expect("task").expect("served");
        assert_eq!(id, kept, "the server that remains");
        lease.release();
        assert_eq!(
            counts(&pool),
            (0, 0, 1, 1),
            "one server, as the new size says"
        );
    });
}

/// A RELOAD that grows the pool gives clients already in line the new
/// slots at once (each opens a server: here its connect fails, port 1),
/// where they waited for a release that never came.
#[test]
fn a_reload_that_grows_the_pool_serves_the_clients_in_line() {
    runtime().block_on(async {
        let pool = pool(1, Duration::from_secs(60));
        let mut peers = Vec::new();
        let held = open(&pool, &mut peers);
        let a = acquire_in_task(&pool);
        let b = acquire_in_task(&pool);
        let_run().await;
        assert_eq!(counts(&pool), (2, 1, 0, 1));
        pool.reconfigure(
            settings(3, Duration::from_secs(60)),
            target(addr()),
            ServerCredential::default(),
            false,
        );
        for waiter in [a, b] {
            let got = within(waiter).await.expect("task");
            assert!(matches!(got, Err(AcquireError::Login(_))), "tried to open");
        }
        assert_eq!(counts(&pool), (0, 1, 0, 1), "the failed slots went back");
        held.release();
    });
}

/// The reserve: past `pool_size` a slot is only taken for the reserve,
/// up to `reserve_pool_size` more; a server of the reserve goes back idle
/// like any other while the total is within size and reserve.
#[test]
fn the_reserve_adds_slots_only_when_asked_for() {
    runtime().block_on(async {
        let pool = Arc::new(pool_with(
            addr(),
            PoolSettings {
                reserve_pool_size: 1,
                ..settings(1, Duration::from_secs(60))
            },
            Arc::new(ConnLimit::new(0)),
        ));
        let mut peers = Vec::new();
        let one = open(&pool, &mut peers);
        {
            let mut st = pool.lock();
            assert!(!pool.take_slot(&mut st, false), "pool_size reached");
            assert!(pool.take_slot(&mut st, true), "a reserve slot");
            assert!(!pool.take_slot(&mut st, true), "the reserve is used up");
            pool.free_slot(&mut st, false);
        }
        let reserve = open_with(&pool, &mut peers, true);
        assert_eq!(counts(&pool), (0, 2, 0, 2));
        reserve.release();
        one.release();
        assert_eq!(
            counts(&pool),
            (0, 0, 2, 2),
            "both idle: within size and reserve"
        );
    });
}

/// Two pools share a `max_db_connections` budget of one. The first holds
/// the unit with an idle server; a client of the second, in line for want
/// of a unit, has that idle server closed for it and takes the unit (its
/// own open then fails here: nothing listens at the address).
#[test]
fn a_full_shared_budget_closes_another_pools_idle_server_for_a_waiter() {
    runtime().block_on(async {
        let budget = Arc::new(ConnLimit::new(1));
        let make = || {
            let pool = Arc::new(pool_with(
                addr(),
                settings(1, Duration::from_secs(60)),
                budget.clone(),
            ));
            pool.join_limits(&pool);
            pool
        };
        let (first, second) = (make(), make());
        let mut peers = Vec::new();
        open(&first, &mut peers).release();
        assert_eq!(counts(&first), (0, 0, 1, 1));
        assert!(budget.is_full());
        assert!(!second.take_slot(&mut second.lock(), false), "no unit left");
        let got = within(second.acquire()).await;
        assert!(
            !matches!(got, Err(AcquireError::WaitTimeout) | Ok(_)),
            "the second pool took the unit and tried to open"
        );
        assert_eq!(counts(&first), (0, 0, 0, 0), "the idle server was closed");
        let mut bytes = Vec::new();
        within(peers[0].read_to_end(&mut bytes))
            .await
            .expect("read");
        assert_eq!(bytes, [b'X', 0, 0, 0, 4]);
        assert!(!budget.is_full(), "the failed open gave the unit back");
    });
}
