//! The hot path: while a client holds a server, its task moves bytes both
//! ways itself (one poll of both sockets per step, see `relay_io`). It
//! parses five header bytes per message and the bodies of ReadyForQuery and
//! ParameterStatus only; it writes as soon as bytes are scanned, and stops
//! reading a side whose bytes cannot be written (backpressure, bounded
//! memory).
//! When the pool mode allows and the server is provably clean — ReadyForQuery
//! 'I', nothing unsynced or in flight, no half-sent message — the server goes
//! back to the pool. A client that leaves mid-transaction gets its server
//! rolled back, or closed when that cannot be done safely.
//!
//! `run` reads as the period goes: the link (the cancel key; the server
//! brought in line with the client's session, `sync.rs`), the loop (each
//! turn: scan, decide, arm the clocks, poll both sockets; its steps in
//! `turn.rs`, its clocks in `clocks.rs`) and the end (statistics, and the
//! server released, cleaned, closed or the request sent round again:
//! `unlink.rs`).

mod clocks;
mod replay;
mod sync;
mod turn;
mod unlink;

use bytes::BytesMut;
use sluice_config::PoolMode;

use super::client::Client;
use super::cycle::Cycle;
use super::error::ClientError;
use super::relay_io::{Blocked, IoEvent, Sides};
use super::tracked::{self, Tracking};
use crate::backend::pool::Lease;
use clocks::Clocks;
use turn::Decision;

/// How a linked period ended.
pub enum RelayEnd {
    /// The server went back to the pool; the client continues.
    Released,
    /// A read routed to a replica was refused there (25006) or lost with
    /// the replica before anything reached the client: run it again on
    /// the primary.
    Retry,
    /// The server refused the client's session settings for something of
    /// its own history (another client's temp table fixed its
    /// `temp_buffers`) and was closed; nothing of the request was sent:
    /// it takes another server.
    Again,
    ClientLeft,
    Error(ClientError),
}

/// Relays between `client` and the leased server until the server can go
/// back (transaction, statement mode) or the client leaves.
pub async fn run(client: &mut Client, cbuf: &mut BytesMut, mut lease: Lease) -> RelayEnd {
    link(client, &mut lease);
    if sync::needs_sync(client, lease.server()) {
        match Box::pin(sync::sync_session(client, cbuf, lease)).await {
            Ok(l) => lease = l,
            Err(end) => return end,
        }
    }
    let deferred = client
        .carried
        .as_ref()
        .and_then(|c| c.deferred_begin.as_ref());
    let in_block = match deferred.map(|d| d.message.clone()) {
        Some(begin) => match Box::pin(sync::open_block(client, lease, &begin)).await {
            Ok(l) => {
                lease = l;
                true
            }
            Err(end) => return end,
        },
        None => false,
    };
    let settings = lease.settings.clone();
    // The server goes back between transactions (transaction mode) or
    // statements (statement mode, which also refuses transaction blocks).
    let pooled = settings.mode != PoolMode::Session;
    let refuse_blocks = settings.mode == PoolMode::Statement;
    client.served_pooled |= pooled;
    let mut cycle = Cycle::new(
        settings.disable_pqexec,
        lease.host(),
        !pooled,
        client.retry_query.is_some(),
        client.on_routed_primary,
        client.primary_read,
    );
    cycle.watch_commits = client.write_ends.is_some();
    if in_block {
        // (what sluice answers itself says so from the first request on)
        cycle.status = sluice_wire::TransactionStatus::InTransaction;
        cycle.outside_block = false;
    }
    // Lent when the acquire read the clock: no read of its own here.
    let linked_at = lease.server().lent_at;
    // Transaction and statement mode: statements, session state and
    // LISTEN follow the client, so its messages are rewritten.
    let mut tracking = pooled.then(Tracking::take);
    if !pooled {
        match Box::pin(unnamed_for_session(client, lease)).await {
            Ok(l) => lease = l,
            Err(end) => return end,
        }
    }
    let mut clocks = Clocks::new(&settings);
    let app = client.app.clone();
    let mut blocked = Blocked::default();
    // The last poll only flushed the last replies, whole, and nothing is
    // left in either buffer: the scans would find nothing new (about 250
    // instructions a transaction, this turn being its last).
    let mut quiet = false;
    // Requests this period had seen that may have committed when the
    // topology was last told of a write's end (`read_your_writes =
    // database`).
    let mut ends_told = 0;

    // The loop: one future (see `turn.rs`), each step delegated.
    let end = loop {
        let skip_scans = std::mem::take(&mut quiet);
        if client.replica_watch.is_some()
            && replay::request_waiting(&cycle, cbuf, tracking.as_deref())
        {
            // A later request of a block on a replica, nothing of it sent
            // (`read_your_writes = database`; rare: boxed).
            if let replay::Held::ClientLeft = Box::pin(replay::wait_in_block(client)).await {
                break Ok(Outcome::ClientGone);
            }
        }
        if !skip_scans
            && let Err(end) = turn::read_requests(
                client,
                &app.statements,
                &mut cycle,
                cbuf,
                tracking.as_deref_mut(),
                lease.server(),
                settings.max_packet_size,
                settings.max_prepared_statements,
            )
        {
            break Err(end);
        }
        if let Some(t) = tracking.as_deref_mut()
            && !t.listens.is_empty()
        {
            // Boxed: rare, and its state would otherwise sit in every
            // relay's future.
            Box::pin(turn::follow_listens(client, t)).await;
            blocked.clear();
        }
        if !skip_scans
            && let Err(end) = turn::read_replies(
                client,
                &mut cycle,
                tracking.as_deref_mut(),
                lease.server(),
                refuse_blocks,
            )
        {
            break Err(end);
        }
        if cycle.commits != ends_told && client.primary_read && cycle.cycles_done <= 1 {
            // (a read the router sent to the primary: its own end is no
            // write's; what its client sends after it in the same period,
            // a READ ONLY block's `commit; insert …`, is unclassified and
            // counts, review 44)
            ends_told = cycle.commits;
        }
        if cycle.commits != ends_told
            && let Some(topology) = &client.write_ends
        {
            // (before the ReadyForQuery that ends it is passed on: a read
            // its client's application makes elsewhere once it has it
            // finds the write counted. Each request that may have
            // committed (`cycle::on_server_message`), whatever its
            // ReadyForQuery says: `COMMIT AND CHAIN`, or `commit; begin`,
            // answers 'T', reviews 41 and 43; not every ReadyForQuery:
            // a 'T' within a block that has not committed made nothing
            // visible, and would send reads to the primary for nothing)
            ends_told = cycle.commits;
            topology.note_write_end();
        }
        if let Some(t) = tracking.as_deref_mut()
            && !t.listen_txn.settled.is_empty()
        {
            client.settle_listens(&mut t.listen_txn);
        }
        let at_end = match turn::decide(&mut cycle, tracking.as_deref(), lease.server(), pooled) {
            Decision::Go { at_end } => at_end,
            Decision::End(end) => break end,
            Decision::AfterTransaction => {
                // It waits, and uses the server's socket itself.
                blocked.clear();
                let t = tracking.as_deref_mut();
                match Box::pin(turn::after_transaction(client, &mut lease, &cycle, t)).await {
                    Some(end) => break end,
                    None => true,
                }
            }
            Decision::ResetIdleTimeout => {
                blocked.clear();
                break Box::pin(turn::reset_idle_timeout(client, &mut lease)).await;
            }
        };
        let standing = turn::standing(&cycle, tracking.as_deref(), cbuf, at_end, pooled);
        // (each answered Execute starts query_timeout's clock again, as
        // each ReadyForQuery does)
        let answered = cycle.cycles_done
            + tracking
                .as_deref()
                .map_or(0, |t| t.expected.executes_done());
        clocks.arm(&standing, answered, cycle.xacts_done);
        let read_server = turn::read_server(&cycle, tracking.as_deref(), lease.server(), pooled);
        let read_client = !cycle.client_terminated && !cycle.capped();
        let writes_wake = turn::writes_wake(&cycle, tracking.as_deref(), read_client, read_server);
        // (notifications are taken only once those taken before are
        // written: a pinned client that does not read leaves them in its
        // bounded queue, review 47)
        let notes_room = tracking.as_deref().is_none_or(|t| t.extra.is_empty());
        let server = lease.server();
        let (server_out, client_extra) = match tracking.as_deref_mut() {
            Some(t) => (Some(&mut t.out), Some(&mut t.extra)),
            None => (None, None),
        };
        let (idle_timer, xact_timer) = clocks.timers();
        let mut sides = Sides {
            client: &mut client.stream,
            server: &mut server.stream,
            cbuf,
            to_server: &mut cycle.to_server,
            sbuf: &mut server.buf,
            to_client: &mut cycle.to_client,
            read_client,
            read_server,
            // (a pinned listener whose notifications are being written
            // takes more once they are)
            writes_wake: writes_wake || (standing.pinned_idle && !notes_room),
            idle_timer,
            xact_timer,
            written: &mut cycle.written,
            server_out,
            client_extra,
            sbuf_wanted: cycle.server_scan.wanted(),
            cbuf_wanted: cycle.client_scan.wanted(),
            blocked: &mut blocked,
        };
        // A pinned client between transactions stays here: it is given
        // its notifications as an idle one is in `session.rs` (rare:
        // boxed, out of every relay's future).
        let listening = match standing.pinned_idle && notes_room {
            true => client.carried.as_mut().and_then(|c| c.listen.as_mut()),
            false => None,
        };
        let event = match listening {
            None => std::future::poll_fn(|cx| sides.poll(cx)).await,
            Some(listening) => {
                match Box::pin(turn::poll_or_notified(&mut sides, listening)).await {
                    Ok(event) => event,
                    Err(notes) => {
                        if let Some(t) = tracking.as_deref_mut() {
                            t.extra.extend_from_slice(&notes);
                        }
                        IoEvent::Progress { client_read: false }
                    }
                }
            }
        };
        match event {
            IoEvent::Progress { client_read } => {
                quiet = !read_server
                    && !client_read
                    && cycle.to_client == 0
                    && cbuf.is_empty()
                    && lease.server().buf.is_empty()
                    && tracking
                        .as_deref()
                        .is_some_and(|t| t.out.is_empty() && t.extra.is_empty());
                if client_read {
                    clocks.client_active();
                }
            }
            event => {
                let tracked = tracking.is_some();
                if let Some(end) =
                    turn::on_event(event, client, &mut lease, &mut clocks, &cycle, tracked)
                {
                    break end;
                }
            }
        }
    };

    // The end: the cancel link undone, the statistics, the server checked
    // in, closed or cleaned (see `unlink.rs`).
    // (a server that failed is closed, whatever the end: a cancel on its
    // way to it, to a frozen replica say, is not waited for)
    if let Some(topology) = &client.write_ends
        && !cycle.req.at_rest()
    {
        // A request still unanswered as a write period ends (its client
        // left after sending COMMIT, its server was lost or is to be
        // closed): the server may commit it after this, and no reply will
        // say when (review 42).
        topology.note_write_end_in_doubt();
    }
    let server_gone = matches!(end, Err(End::Server { .. }));
    let cancel_unsettled = client.app.cancels.unlink(client.cancel)
        && !server_gone
        && !unlink::settle_cancels(client).await;
    let end = match end {
        Ok(Outcome::Release) if cancel_unsettled => Ok(Outcome::Close),
        // A request with no reply (a lone Flush, CopyData outside a COPY)
        // ends as soon as it is written: its send may still be in the
        // worker's ring, which a server going back must not have.
        Ok(Outcome::Release) if !lease.server().stream.settled() => {
            match unlink::settle_send(&mut lease).await {
                true => Ok(Outcome::Release),
                false => Ok(Outcome::Close),
            }
        }
        end => end,
    };
    unlink::account(&mut cycle, &mut lease, linked_at);
    let ended = match end {
        Ok(Outcome::Release) if unlink::check_in_queries(client, &settings, cycle.xacts_done) => {
            // Boxed: not every transaction's, and its state would
            // otherwise sit in every relay's future.
            Box::pin(unlink::check_in(client, lease, &settings, cycle.xacts_done)).await;
            RelayEnd::Released
        }
        Ok(Outcome::ClientGone) => {
            let t = tracking.as_deref();
            Box::pin(unlink::abandon(client, lease, &cycle, t, &settings, true)).await;
            RelayEnd::ClientLeft
        }
        Err(End::Client(e)) => {
            let t = tracking.as_deref();
            Box::pin(unlink::abandon(client, lease, &cycle, t, &settings, false)).await;
            RelayEnd::Error(e)
        }
        end => unlink::unlink(
            client,
            lease,
            &cycle,
            tracking.as_deref_mut(),
            pooled,
            end,
            cancel_unsettled,
        ),
    };
    if let Some(mut t) = tracking {
        // (LISTENs whose transaction did not end here did not commit)
        if t.listen_txn.is_pending() {
            t.listen_txn.abandon();
        }
        if !t.listen_txn.settled.is_empty() {
            client.settle_listens(&mut t.listen_txn);
        }
        tracked::forget_failed_parses(&mut t, client.statements_if_any());
        t.give_back();
    }
    ended
}

/// The client's cancel requests reach the leased server from now on.
fn link(client: &mut Client, lease: &mut Lease) {
    let host = lease.host();
    let waited = lease.stats.waited;
    let server = lease.server();
    // A server on another host of a list without routing: its cancel goes
    // there.
    let host = match server.alternate {
        0 => host,
        alt => crate::backend::target::ALTERNATE | u32::from(alt),
    };
    // The request arrived when the wait for this server began.
    let arrived = server.lent_at - waited;
    client
        .app
        .cancels
        .link(client.cancel, server.key, host, arrived);
    server.statements.scope = client.pool.scope;
}

enum Outcome {
    Release,
    /// See `Retry`.
    Retry,
    /// The transaction ended but the server cannot be trusted.
    Close,
    ClientGone,
}

enum End {
    /// The client broke a rule; it gets this error.
    Client(ClientError),
    /// The server failed; the client gets 08006. `lost`: the connection
    /// ended (an I/O ending), as opposed to a server that broke the
    /// protocol; only a lost server's request may run again elsewhere.
    Server { why: String, lost: bool },
}

impl End {
    fn server_broken(why: String) -> Self {
        End::Server { why, lost: false }
    }
}

/// Session mode does not follow the unnamed statement: what a session
/// leaves is recorded as no transaction-mode client's (review 31 bound it
/// from one after a RELOAD, with no reset query), and one a
/// transaction-mode client left is dropped first, with an empty simple
/// query (review 32 bound it from a session client after a RELOAD the
/// other way). Shared statements go too (`DEALLOCATE ALL`: review 43 ran
/// them by name from a session client after a RELOAD). A session after
/// another session, with no reset query,
/// shares its session state as on PgBouncer: that is the operator's
/// choice.
async fn unnamed_for_session(client: &Client, mut lease: Lease) -> Result<Lease, RelayEnd> {
    use crate::prepared::client_names::Owner;
    let server = lease.server();
    // Shared statements under sluice's names (a pool RELOADed from
    // transaction to session mode, or a client kept in transaction mode
    // after it): a session-mode client would run them by name (review 43).
    // Any simple Query drops the unnamed statement as well.
    let shared = server.statements.len() + server.statements.to_close.len() > 0;
    let sql = match shared {
        true => Some("DEALLOCATE ALL"),
        false => server
            .statements
            .unnamed
            .is_some_and(|o| o != Owner::SESSION)
            .then_some(""),
    };
    if let Some(sql) = sql
        && let Err(e) = crate::backend::login::run_query(server, sql).await
    {
        client.app.cancels.unlink(client.cancel);
        lease.close();
        return Err(RelayEnd::Error(ClientError::new(
            e.sqlstate(),
            e.to_string(),
        )));
    }
    if shared {
        lease.server().statements.clear();
    }
    lease.server().statements.unnamed = Some(Owner::SESSION);
    Ok(lease)
}

/// Largest client message held whole in transaction and statement mode
/// (Parse, Bind, Describe, Close, Query are rewritten, so they are read
/// whole before anything of them is sent). PostgreSQL's own limit is
/// 1 GB; 64 MiB is far above any statement text or Bind an application
/// sends through a pooler and bounds what one client can make sluice hold.
/// Session mode streams every message and is not limited by this.
pub(super) const CLIENT_HELD_LIMIT: usize = 64 << 20;

/// The error for a client message larger than `CLIENT_HELD_LIMIT`.
pub(super) fn held_too_large(size: usize) -> ClientError {
    ClientError::new(
        "54000",
        format!(
            "message of {size} bytes is larger than the {} MiB a transaction-pooling \
             connection holds whole (Parse, Bind, Describe, Close, Query, FunctionCall)",
            CLIENT_HELD_LIMIT >> 20
        ),
    )
}

/// What a client using the simple query protocol gets under
/// `disable_pqexec` (PgBouncer's text).
pub(super) fn pqexec_disallowed() -> ClientError {
    ClientError::new("08P01", "PQexec disallowed")
}
