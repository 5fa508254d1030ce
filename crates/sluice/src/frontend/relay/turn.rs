//! One turn of the relay's loop (`relay::run`), in the order it runs:
//! 1. scan what was read (`read_requests`, `read_replies`: whole client
//!    messages are rewritten in transaction and statement mode, server
//!    replies are counted and filtered);
//! 2. decide whether the period is over (`decide`: a pure look at the
//!    cycle; a clean end may first run sluice's own queries on the
//!    server, `after_transaction`, `reset_idle_timeout`);
//! 3. see where the period stands for its clocks (`standing`, and
//!    `clocks.rs`) and which sides to read (`read_server`);
//! 4. after the poll of both sockets (`relay_io::Sides`), act on what came
//!    (`on_event`).
//!
//! Each is plain code on the period's state, so that the loop stays one
//! future: an async helper awaited on every turn would copy its whole
//! state in each time (measured: about 900 instructions a transaction
//! when the loop and the period's end were futures of their own). What
//! awaits here is rare and boxed by the caller.

use bytes::BytesMut;
use sluice_wire::{TransactionStatus, WireError};

use super::clocks::{Clocks, IdleKind, MESSAGE_MIN_RATE, MESSAGE_STALL_TIMEOUT, Standing};
use super::unlink::own_queries_uncancelled;
use super::{CLIENT_HELD_LIMIT, End, Outcome, held_too_large, pqexec_disallowed};
use crate::backend::pool::Lease;
use crate::backend::server::ServerConn;
use crate::frontend::client::Client;
use crate::frontend::cycle::{
    Cycle, CycleView, Retry, SERVER_MESSAGE_LIMIT, ServerSeen, cycle_view, on_server_message,
    server_needs_body,
};
use crate::frontend::error::ClientError;
use crate::frontend::relay_io::{BUFFER_LIMIT, IoEvent};
use crate::frontend::requests::Counted;
use crate::frontend::tracked::{self, AfterTx, Tracking};
use crate::prepared::registry::Registry;
use crate::scan::Visit;

/// Largest server message held whole (ErrorResponse, ParameterStatus,
/// ReadyForQuery and, in transaction mode, a few small replies). An error
/// message repeats its input, so it may be large; past this the server is
/// closed and the client told why.
const SERVER_HELD_LIMIT: usize = 16 << 20;

/// Scans the client's bytes: what may go to the server (rewritten, in
/// transaction and statement mode, with what each message owes).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) fn read_requests(
    client: &mut Client,
    registry: &Registry,
    cycle: &mut Cycle,
    cbuf: &mut BytesMut,
    tracking: Option<&mut Tracking>,
    server: &mut ServerConn,
    limit: usize,
    capacity: usize,
) -> Result<(), End> {
    let scanned = match tracking {
        None => scan_client(cycle, cbuf, limit),
        Some(t) => {
            let params = &*client.params;
            let carried = client.carried.get_or_insert_with(Box::default);
            tracked::rewrite_client(
                cycle,
                cbuf,
                t,
                &mut tracked::Statements {
                    names: &mut carried.statements,
                    session: carried.session.as_deref(),
                    params,
                    server: &mut server.statements,
                    registry,
                    capacity,
                },
                limit,
            )
        }
    };
    if let Err(e) = scanned {
        return Err(End::Client(ClientError::protocol(e.to_string())));
    }
    if cycle.pqexec_seen {
        return Err(End::Client(pqexec_disallowed()));
    }
    if let Some(why) = cycle.bad_message.take() {
        return Err(End::Client(ClientError::protocol(why)));
    }
    let held = cycle.client_scan.wanted();
    if held > CLIENT_HELD_LIMIT {
        return Err(End::Client(held_too_large(held)));
    }
    if held <= BUFFER_LIMIT {
        crate::held_memory::shrink(cbuf, &mut client.held);
    }
    crate::held_memory::hold(&mut client.held, held, cbuf.len()).map_err(End::Client)
}

/// Scans the server's bytes: what may go to the client, the transaction
/// status, the parameters it reports (both views follow), and what of
/// the replies is owed to sluice rather than to the client.
#[inline(always)]
pub(super) fn read_replies(
    client: &mut Client,
    cycle: &mut Cycle,
    tracking: Option<&mut Tracking>,
    server: &mut ServerConn,
    refuse: bool,
) -> Result<(), End> {
    let scanned = match tracking {
        None => scan_server(cycle, &server.buf, &mut client.params, refuse),
        Some(t) => loop {
            match tracked::scan_server(
                cycle,
                &server.buf,
                t,
                &mut server.statements,
                &mut client.params,
                refuse,
            ) {
                Ok((changed, Some(held))) => {
                    if changed {
                        server.params = client.params.clone();
                    }
                    if !tracked::release_held(
                        cycle,
                        held,
                        &mut server.buf,
                        t,
                        &mut server.statements,
                        &mut client.params,
                        refuse,
                    ) {
                        break Ok(false);
                    }
                }
                Ok((changed, None)) => {
                    tracked::forget_failed_parses(t, client.statements_if_any());
                    tracked::settle(cycle, t, &mut server.statements);
                    break Ok(changed);
                }
                Err(e) => break Err(e),
            }
        },
    };
    let held = cycle.server_scan.wanted().saturating_sub(cycle.to_client);
    if held > SERVER_HELD_LIMIT {
        return Err(End::server_broken(format!(
            "server message of {held} bytes is larger than the {} MiB sluice holds whole",
            SERVER_HELD_LIMIT >> 20
        )));
    }
    match scanned {
        Ok(false) => {}
        // The server reported a tracked parameter: both views follow.
        Ok(true) => server.params = client.params.clone(),
        Err(e) => {
            return Err(End::server_broken(format!(
                "server sent a bad message: {e}"
            )));
        }
    }
    if cycle.after_farewell && !server.buf.is_empty() {
        return Err(End::server_broken(
            "server sent more after its FATAL error".into(),
        ));
    }
    if cycle.refused_transaction {
        return Err(End::Client(ClientError::new(
            "25000",
            "transaction blocks not allowed in statement pooling mode",
        )));
    }
    Ok(())
}

/// What a turn's look at the period decided.
pub(super) enum Decision {
    /// Go on relaying; `at_end`: the server is clean and could go back
    /// (a pinned client keeps it).
    Go { at_end: bool },
    /// The period is over.
    End(Result<Outcome, End>),
    /// The transaction ended clean, but sluice has queries of its own to
    /// run first (cleanup, settings read-back): `after_transaction`.
    AfterTransaction,
    /// The transaction ended clean with the client's idle_session_timeout
    /// on the server: reset before it goes back.
    ResetIdleTimeout,
}

/// Whether the period ends now, and how (no I/O).
#[inline(always)]
pub(super) fn decide(
    cycle: &mut Cycle,
    tracking: Option<&Tracking>,
    server: &ServerConn,
    pooled: bool,
) -> Decision {
    if cycle.client_terminated && cycle.to_server == 0 {
        return Decision::End(Ok(Outcome::ClientGone));
    }
    if cycle.capped() && cycle.req.outstanding == 0 && cycle.status != TransactionStatus::Idle {
        // The routed request opened a READ ONLY transaction: the rest
        // of it follows on this server, one request at a time, so that
        // nothing sent after its end comes here.
        cycle.cap = Some(cycle.req.sent() + 1);
    }
    // A part of the client's next message may be in `cbuf`: the
    // session reads the rest before it asks for a server again.
    let at_end = pooled
        && cycle.clean()
        && cycle.flushed(&server.buf)
        && tracking.is_none_or(Tracking::settled);
    if at_end && cycle.retry == Retry::Done {
        return Decision::End(Ok(Outcome::Retry));
    }
    if at_end && cycle.after_farewell && tracking.is_some_and(Tracking::plain) {
        // Its FATAL error came after the last reply (kept from the
        // client, who lost nothing): the server closes, the client goes
        // on with another.
        return Decision::End(Ok(Outcome::Close));
    }
    if cycle.retry == Retry::Done
        && cycle.req.outstanding == 0
        && cycle.status != TransactionStatus::Idle
    {
        // Cannot happen for the queries armed (they open no
        // transaction); never leave the client waiting for the reply
        // that was kept from it.
        return Decision::End(Err(End::Client(ClientError::new(
            "25006",
            "a read routed to a replica was refused there inside a transaction",
        ))));
    }
    if at_end && cycle.req.unsure() {
        let keeps_state = |t: &Tracking| {
            let e = t.effects;
            t.pinned.is_some() || e.locks || e.listen || e.temp || e.cursors || e.statements
        };
        if tracking.is_some_and(keeps_state) {
            // Session objects the client owns on that server (known, or
            // named in what it sent since the last look) cannot be kept:
            // the server cannot stay (sluice's own queries would take
            // replies still coming for the client). The client is told,
            // not left to find its locks or LISTENs gone (a review). Code
            // sluice cannot read (a COPY's column list reads as a call) and
            // settings go on as before: a failed COPY's transaction rolls
            // them back (tokio-postgres' COPY in a transaction ends so).
            return Decision::End(Err(End::Client(ClientError::new(
                "08006",
                "the server's replies could not be counted after a COPY the client sent \
                 Syncs into, and the session holds objects there (locks, LISTEN, temporary \
                 tables, cursors, prepared statements) that cannot be carried to another \
                 server: the connection ends",
            ))));
        }
        // The reply count cannot be trusted: the client goes on, the
        // server is not shared.
        return Decision::End(Ok(Outcome::Close));
    }
    if !at_end {
        return Decision::Go { at_end };
    }
    match tracking {
        Some(t) if t.needs_after() => Decision::AfterTransaction,
        Some(t) if t.pinned.is_some() => Decision::Go { at_end },
        _ if tracked::holds_idle_timeout(server) => Decision::ResetIdleTimeout,
        _ => Decision::End(Ok(Outcome::Release)),
    }
}

/// sluice's own queries after a clean transaction end (cleanup, settings
/// read-back): `None` when the client stays linked, pinned to the server
/// by its session objects.
pub(super) async fn after_transaction(
    client: &mut Client,
    lease: &mut Lease,
    cycle: &Cycle,
    tracking: Option<&mut Tracking>,
) -> Option<Result<Outcome, End>> {
    let t = tracking?;
    // sluice's own queries follow: the client's cancel requests no longer
    // reach the server (a late one cancelled the settings read-back;
    // found by a review).
    if !own_queries_uncancelled(client).await {
        return Some(Ok(Outcome::Close));
    }
    match tracked::after_transaction(lease, client, t).await {
        AfterTx::Release => Some(Ok(Outcome::Release)),
        AfterTx::Close => Some(Ok(Outcome::Close)),
        AfterTx::Refused(e) => Some(Err(End::Client(e))),
        // On a replica the client may not stay: its session objects are
        // dropped with the server, and the client is told, and
        // disconnected.
        AfterTx::Pinned if cycle.cap.is_some() => {
            let why = t.pinned.map(|r| r.describe()).unwrap_or_default();
            Some(Err(End::Client(ClientError::new(
                "0A000",
                format!(
                    "session objects ({why}) cannot stay on a replica and were \
                     dropped; take them on the primary (/* sluice: primary */)"
                ),
            ))))
        }
        // Pinned: stay linked, wait for the client.
        AfterTx::Pinned => {
            let key = lease.server().key;
            client.app.cancels.relink(client.cancel, key);
            None
        }
    }
}

/// The client's LISTENs and UNLISTENs read this turn: the hub follows
/// before anything of the server's reply to them reaches the client.
pub(super) async fn follow_listens(client: &mut Client, t: &mut Tracking) {
    let listens = std::mem::take(&mut t.listens);
    for statement in &listens {
        client.follow_listen(statement).await;
    }
}

/// The client's idle_session_timeout is taken off the server before it
/// goes back (its next transaction sets it again).
pub(super) async fn reset_idle_timeout(
    client: &mut Client,
    lease: &mut Lease,
) -> Result<Outcome, End> {
    if !own_queries_uncancelled(client).await {
        return Ok(Outcome::Close);
    }
    match tracked::idle_timeout_reset(lease).await {
        true => Ok(Outcome::Release),
        false => Ok(Outcome::Close),
    }
}

/// Whether the server is read this turn. Not when it has answered
/// everything and only the flush of its last replies to the client
/// remains before it goes back: a read now would only register a wake-up
/// that no reply can answer (tokio's readiness check, a few hundred
/// instructions a transaction). Whatever it sends after its
/// ReadyForQuery (a FATAL of a terminated backend) is found by its next
/// user, as when it comes just after the release.
#[inline(always)]
pub(super) fn read_server(
    cycle: &Cycle,
    tracking: Option<&Tracking>,
    server: &ServerConn,
    pooled: bool,
) -> bool {
    !(pooled
        && cycle.clean()
        && cycle.to_server == 0
        && server.buf.len() == cycle.to_client
        && tracking.is_none_or(|t| t.pinned.is_none() && t.expected.is_empty() && t.out.is_empty()))
}

/// Whether a write ends the poll. While replies are owed and both sides
/// are read as usual, a write changes nothing `decide` or the clocks look
/// at (the end needs no reply owed; the clocks follow the replies, the
/// scan, or buffers under the limit that a write only shortens): the poll
/// may go on waiting after one.
#[inline(always)]
pub(super) fn writes_wake(
    cycle: &Cycle,
    tracking: Option<&Tracking>,
    read_client: bool,
    read_server: bool,
) -> bool {
    !(cycle.req.outstanding > 0
        && read_client
        && read_server
        && tracking.is_none_or(|t| t.pinned.is_none() && !full(t)))
}

/// What the server or the client has not taken yet stops the client's
/// reading.
fn full(t: &Tracking) -> bool {
    t.out.len() >= BUFFER_LIMIT || t.extra.len() >= BUFFER_LIMIT
}

/// Where the period stands, for its clocks.
#[inline(always)]
pub(super) fn standing(
    cycle: &Cycle,
    tracking: Option<&Tracking>,
    cbuf: &BytesMut,
    at_end: bool,
    pooled: bool,
) -> Standing {
    // (an Execute with no Sync yet is owed too, until the expected replies
    // say it is answered; session mode keeps none: until the Sync's
    // ReadyForQuery, as PgBouncer times a request)
    let owed = cycle.req.outstanding > 0
        || (cycle.req.executed() && tracking.is_none_or(|t| t.expected.awaits_execute()));
    // (`client_taken` is where `cbuf` starts in the client's stream)
    let (pending, wanted) = (cycle.client_scan.pending(), cycle.client_scan.wanted());
    let (message_end, message_left) = match (pending, wanted) {
        (0, 0) => (0, 0),
        (0, wanted) => (wanted, wanted.saturating_sub(cbuf.len())),
        (pending, _) => (pending, pending),
    };
    Standing {
        owed,
        replica_owes: owed && cycle.on_replica,
        unread_client: owed && (cbuf.len() >= BUFFER_LIMIT || tracking.is_some_and(full)),
        mid_message: tracking.is_some_and(|t| !full(t)) && (wanted > 0 || pending > 0),
        message_end: cycle.client_taken + message_end as u64,
        message_left: message_left as u64,
        pinned_idle: at_end && tracking.is_some_and(|t| t.pinned.is_some()),
        session_at_rest: !pooled && cycle.req.at_rest() && cycle.status == TransactionStatus::Idle,
        in_transaction: cycle.status != TransactionStatus::Idle || cycle.req.unsynced,
    }
}

/// What a poll that made no plain progress means: the end of the period,
/// or (a clock that only looks) nothing.
pub(super) fn on_event(
    event: IoEvent,
    client: &mut Client,
    lease: &mut Lease,
    clocks: &mut Clocks,
    cycle: &Cycle,
    tracked: bool,
) -> Option<Result<Outcome, End>> {
    let end = match event {
        IoEvent::Progress { .. } => return None,
        IoEvent::ServerClosed => Err(End::Server {
            why: "server closed the connection unexpectedly".into(),
            lost: true,
        }),
        IoEvent::ServerFailed(e) => Err(End::Server {
            why: e.to_string(),
            lost: true,
        }),
        IoEvent::ClientGone => Ok(Outcome::ClientGone),
        IoEvent::TransactionTimeout => Err(End::Client(ClientError::new(
            "08P01",
            "transaction timeout",
        ))),
        IoEvent::IdleTimeout => match clocks.idle_kind() {
            Some(IdleKind::Unread) => {
                if client.stream.peer_hung_up() {
                    return Some(Ok(Outcome::ClientGone));
                }
                clocks.idle_done();
                return None;
            }
            Some(IdleKind::Replica) => {
                // (it stands in for the look `Unread` takes at a client
                // that is not read)
                if client.stream.peer_hung_up() {
                    return Some(Ok(Outcome::ClientGone));
                }
                if clocks.query_expired() {
                    return Some(Err(End::Client(ClientError::new("08P01", "query timeout"))));
                }
                // (a host pool's number is its topology index + 1)
                let index = (lease.host() as usize).checked_sub(1);
                let out = client
                    .route_cache
                    .as_ref()
                    .and_then(|c| c.topology.as_ref())
                    .zip(index)
                    .is_some_and(|(t, i)| t.out_of_rotation(i));
                if !out {
                    clocks.idle_done();
                    return None;
                }
                if super::unlink::may_run_again(client, cycle, tracked) {
                    // Nothing of the read reached the client: it runs on
                    // the primary (`unlink::server_lost`), and the
                    // replica's connection, which may never answer, closes
                    // (its query cancelled when the replica comes back, not
                    // left to run there too).
                    lease.cancel_detached();
                    return Some(Err(End::Server {
                        why: "the replica was taken out of rotation (its checks fail) \
                              before it answered"
                            .into(),
                        lost: true,
                    }));
                }
                // One that cannot run again (a named statement parsed in
                // its batch, rows already sent) waits, as for a replica
                // that answers late: its backend may be well while only
                // the checks fail (a review saw a healthy read killed).
                // But a cancel the client sent would wait for the thaw in
                // the frozen replica's queue: once the replica has said
                // nothing for a whole look, the client is told it ended.
                let answered = cycle.written.1 + cycle.to_client as u64;
                let silent = clocks.replica_silent(answered);
                if silent && client.app.cancels.cancel_asked(client.cancel) {
                    lease.cancel_detached();
                    return Some(Err(End::Server {
                        why: "cancelled while its replica was out of rotation (its checks \
                              fail) and answered nothing: the cancel could not reach it"
                            .into(),
                        lost: true,
                    }));
                }
                clocks.idle_done();
                return None;
            }
            Some(IdleKind::FastClose) => {
                if lease.stale() {
                    tracing::info!(user = %client.user(), db = %client.database(), "closing because: database configuration changed (server_fast_close)");
                    return Some(Err(End::Client(ClientError::new(
                        "08006",
                        "database configuration changed",
                    ))));
                }
                clocks.idle_done();
                return None;
            }
            Some(IdleKind::Client) => Err(End::Client(ClientError::new(
                "08P01",
                "client_idle_timeout",
            ))),
            Some(IdleKind::Query) => Err(End::Client(ClientError::new("08P01", "query timeout"))),
            Some(IdleKind::Message) => Err(End::Client(ClientError::new(
                "08P01",
                format!(
                    "incomplete message: no data for {} s, or not whole within {} s and 1 s \
                     for each {} KiB, while holding a server",
                    MESSAGE_STALL_TIMEOUT.as_secs(),
                    MESSAGE_STALL_TIMEOUT.as_secs(),
                    MESSAGE_MIN_RATE >> 10
                ),
            ))),
            Some(IdleKind::Transaction) | None => Err(End::Client(ClientError::new(
                "25P03",
                "idle transaction timeout",
            ))),
        },
    };
    Some(end)
}

/// One poll of both sides, or, first, notifications for a pinned client
/// between transactions (`Err`: those of its channels, to be written).
pub(super) async fn poll_or_notified(
    sides: &mut crate::frontend::relay_io::Sides<'_>,
    listening: &mut crate::frontend::client::Listening,
) -> Result<IoEvent, BytesMut> {
    tokio::select! {
        event = std::future::poll_fn(|cx| sides.poll(cx)) => Ok(event),
        Some(note) = listening.rx.recv() => {
            let mut notes = BytesMut::new();
            listening.pass(&mut notes, &note);
            while let Ok(more) = listening.rx.try_recv() {
                listening.pass(&mut notes, &more);
            }
            Err(notes)
        }
    }
}

/// Session mode's scan of the client's bytes: forwarded as they are.
fn scan_client(cycle: &mut Cycle, cbuf: &BytesMut, limit: usize) -> Result<(), WireError> {
    let mut terminated = false;
    let end = cycle.client_scan.scan(
        cbuf,
        cycle.to_server,
        limit,
        |_| false,
        |tag, _| {
            if tag == sluice_wire::tags::frontend::QUERY && cycle.no_pqexec {
                cycle.pqexec_seen = true;
                return Visit::StopBefore;
            }
            if cycle.req.client(tag) == Counted::Terminate {
                terminated = true;
                return Visit::StopBefore;
            }
            Visit::Forward
        },
    )?;
    cycle.to_server = end.forward_to;
    if terminated {
        cycle.client_terminated = true;
    }
    Ok(())
}

/// Session mode's scan of the server's bytes: forwarded as they are.
fn scan_server(
    cycle: &mut Cycle,
    sbuf: &BytesMut,
    client_params: &mut std::sync::Arc<crate::params::ParamSet>,
    refuse_transactions: bool,
) -> Result<bool, WireError> {
    let mut seen = ServerSeen::default();
    let commits = cycle.watch_commits;
    let end = cycle.server_scan.scan(
        sbuf,
        cycle.to_client,
        SERVER_MESSAGE_LIMIT,
        |tag| {
            server_needs_body(tag)
                || (commits && tag == sluice_wire::tags::backend::COMMAND_COMPLETE)
        },
        |tag, body| {
            on_server_message(
                &mut seen,
                cycle_view!(cycle),
                tag,
                body,
                client_params,
                refuse_transactions,
            );
            Visit::Forward
        },
    )?;
    if let Some(e) = seen.bad {
        return Err(e);
    }
    cycle.to_client = end.forward_to;
    Ok(seen.params_changed)
}
