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

use std::sync::Arc;

use bytes::BytesMut;
use sluice_config::PoolMode;
use sluice_wire::{ErrorFields, TransactionStatus};

use super::client::{CLEANUP_TIMEOUT, Client};
use super::cycle::{
    Cycle, CycleView, Retry, SERVER_MESSAGE_LIMIT, ServerSeen, cycle_view, on_server_message,
    server_needs_body,
};
use super::error::ClientError;
use super::relay_io::{Blocked, IoEvent, Sides};
use super::requests::Counted;
use super::tracked::{self, AfterTx, Tracking, reset};
use crate::backend::login::{run_query, run_query_rows};
use crate::backend::pool::Lease;
use crate::scan::Visit;

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
    let settings = lease.settings.clone();
    let limit = settings.max_packet_size;
    {
        let host = lease.host();
        let waited = lease.stats.waited;
        let server = lease.server();
        // A server on another host of a list without routing: its cancel
        // goes there.
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
    if needs_sync(client, lease.server()) {
        match Box::pin(sync_session(client, cbuf, lease)).await {
            Ok(l) => lease = l,
            Err(end) => return end,
        }
    }
    let mut cycle = Cycle::new(
        settings.disable_pqexec,
        lease.host(),
        settings.mode == PoolMode::Session,
        client.retry_query.is_some(),
        client.on_routed_primary,
        client.primary_read,
    );
    // Lent when the acquire read the clock: no read of its own here.
    let linked_at = lease.server().lent_at;
    let release_each = match settings.mode {
        PoolMode::Session => None,
        PoolMode::Transaction => Some(false),
        PoolMode::Statement => Some(true),
    };
    let idle_tx_timeout = settings.idle_transaction_timeout;
    let mut idle_timer: Option<(IdleKind, std::pin::Pin<Box<tokio::time::Sleep>>)> = None;
    // Request cycles ended when the query_timeout clock was last armed.
    let mut query_cycle = 0u64;
    // transaction_timeout: runs from the first message of a transaction to
    // the ReadyForQuery that ends it (the lease begins with one).
    let xact_timeout = settings.transaction_timeout;
    let mut xact_timer =
        (!xact_timeout.is_zero()).then(|| Box::pin(tokio::time::sleep(xact_timeout)));
    let mut xact_mark = 0u64;
    // Transaction and statement mode: statements, session state and
    // LISTEN follow the client, so its messages are rewritten.
    let mut tracking = release_each.map(|_| Tracking::take());
    let app = client.app.clone();
    let mut blocked = Blocked::default();
    // The last poll only flushed the last replies, whole, and nothing is
    // left in either buffer: the scans below would find nothing new (about
    // 250 instructions a transaction, this turn being its last).
    let mut quiet = false;

    let end = loop {
        let server = lease.server();
        let skip_scans = std::mem::take(&mut quiet);
        let scanned = match tracking.as_deref_mut() {
            _ if skip_scans => Ok(()),
            None => scan_client(&mut cycle, cbuf, limit),
            Some(t) => {
                let carried = client.carried();
                tracked::rewrite_client(
                    &mut cycle,
                    cbuf,
                    t,
                    &mut tracked::Statements {
                        names: &mut carried.statements,
                        search_path: carried.session.as_deref(),
                        server: &mut server.statements,
                        registry: &app.statements,
                        capacity: settings.max_prepared_statements,
                    },
                    limit,
                )
            }
        };
        if let Err(e) = scanned {
            break Err(End::Client(ClientError::protocol(e.to_string())));
        }
        if cycle.pqexec_seen {
            break Err(End::Client(pqexec_disallowed()));
        }
        if let Some(why) = cycle.bad_message.take() {
            break Err(End::Client(ClientError::protocol(why)));
        }
        let held = cycle.client_scan.wanted();
        if held > CLIENT_HELD_LIMIT {
            break Err(End::Client(held_too_large(held)));
        }
        if let Some(t) = tracking.as_deref_mut()
            && !t.listens.is_empty()
        {
            let listens = std::mem::take(&mut t.listens);
            for statement in &listens {
                // Boxed: rare, and its state would otherwise sit in every
                // relay's future.
                Box::pin(client.follow_listen(statement)).await;
            }
            blocked.clear();
        }
        let server = lease.server();
        let refuse = release_each == Some(true);
        let scanned = match tracking.as_deref_mut() {
            _ if skip_scans => Ok(false),
            None => scan_server(&mut cycle, &server.buf, &mut client.params, refuse),
            Some(t) => loop {
                match tracked::scan_server(
                    &mut cycle,
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
                            &mut cycle,
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
                        tracked::settle(&mut cycle, t, &mut server.statements);
                        break Ok(changed);
                    }
                    Err(e) => break Err(e),
                }
            },
        };
        let held = cycle.server_scan.wanted().saturating_sub(cycle.to_client);
        if held > SERVER_HELD_LIMIT {
            break Err(End::server_broken(format!(
                "server message of {held} bytes is larger than the {} MiB sluice holds whole",
                SERVER_HELD_LIMIT >> 20
            )));
        }
        match scanned {
            Ok(false) => {}
            // The server reported a tracked parameter: both views follow.
            Ok(true) => server.params = client.params.clone(),
            Err(e) => {
                break Err(End::server_broken(format!(
                    "server sent a bad message: {e}"
                )));
            }
        }
        if cycle.after_farewell && !server.buf.is_empty() {
            break Err(End::server_broken(
                "server sent more after its FATAL error".into(),
            ));
        }
        if cycle.refused_transaction {
            break Err(End::Client(ClientError::new(
                "25000",
                "transaction blocks not allowed in statement pooling mode",
            )));
        }
        if cycle.client_terminated && cycle.to_server == 0 {
            break Ok(Outcome::ClientGone);
        }
        if cycle.capped() && cycle.req.outstanding == 0 && cycle.status != TransactionStatus::Idle {
            // The routed request opened a READ ONLY transaction: the rest
            // of it follows on this server, one request at a time, so that
            // nothing sent after its end comes here.
            cycle.cap = Some(cycle.req.sent() + 1);
        }
        // A part of the client's next message may be in `cbuf`: the
        // session reads the rest before it asks for a server again.
        let at_end = release_each.is_some()
            && cycle.clean()
            && cycle.flushed(&server.buf)
            && tracking.as_deref().is_none_or(Tracking::settled);
        if at_end && cycle.retry == Retry::Done {
            break Ok(Outcome::Retry);
        }
        if at_end && cycle.after_farewell && tracking.as_deref().is_some_and(Tracking::plain) {
            // Its FATAL error came after the last reply (kept from the
            // client, who lost nothing): the server closes, the client goes
            // on with another.
            break Ok(Outcome::Close);
        }
        if cycle.retry == Retry::Done
            && cycle.req.outstanding == 0
            && cycle.status != TransactionStatus::Idle
        {
            // Cannot happen for the queries armed (they open no
            // transaction); never leave the client waiting for the reply
            // that was kept from it.
            break Err(End::Client(ClientError::new(
                "25006",
                "a read routed to a replica was refused there inside a transaction",
            )));
        }
        if at_end && cycle.req.unsure() {
            // The reply count cannot be trusted: the client goes on, the
            // server is not shared.
            break Ok(Outcome::Close);
        }
        if at_end {
            match tracking.as_deref_mut() {
                Some(t) if t.needs_after() => {
                    // It waits, and uses the server's socket itself.
                    blocked.clear();
                    // sluice's own queries follow: the client's cancel
                    // requests no longer reach the server (a late one
                    // cancelled the settings read-back; found by a review).
                    if !own_queries_uncancelled(client).await {
                        break Ok(Outcome::Close);
                    }
                    match Box::pin(tracked::after_transaction(&mut lease, client, t)).await {
                        AfterTx::Release => break Ok(Outcome::Release),
                        AfterTx::Close => break Ok(Outcome::Close),
                        // On a replica the client may not stay: its
                        // session objects are dropped with the server, and
                        // the client is told, and disconnected.
                        AfterTx::Pinned if cycle.cap.is_some() => {
                            let why = t.pinned.map(|r| r.describe()).unwrap_or_default();
                            break Err(End::Client(ClientError::new(
                                "0A000",
                                format!(
                                    "session objects ({why}) cannot stay on a replica and were \
                                     dropped; take them on the primary (/* sluice: primary */)"
                                ),
                            )));
                        }
                        // Pinned: stay linked, wait for the client.
                        AfterTx::Pinned => {
                            let key = lease.server().key;
                            client.app.cancels.relink(client.cancel, key);
                        }
                    }
                }
                Some(t) if t.pinned.is_some() => {}
                _ if tracked::holds_idle_timeout(lease.server()) => {
                    blocked.clear();
                    if !own_queries_uncancelled(client).await {
                        break Ok(Outcome::Close);
                    }
                    match Box::pin(tracked::idle_timeout_reset(&mut lease)).await {
                        true => break Ok(Outcome::Release),
                        false => break Ok(Outcome::Close),
                    }
                }
                _ => break Ok(Outcome::Release),
            }
        }
        let pinned_idle = at_end && tracking.as_deref().is_some_and(|t| t.pinned.is_some());
        // What the server or the client has not taken yet stops the
        // client's reading.
        let full = |t: &Tracking| {
            t.out.len() >= super::relay_io::BUFFER_LIMIT
                || t.extra.len() >= super::relay_io::BUFFER_LIMIT
        };
        // A client halfway through a message that sluice is ready to read.
        let mid_message = tracking.as_deref().is_some_and(|t| !full(t))
            && (cycle.client_scan.wanted() > 0 || !cycle.client_scan.at_boundary());
        // Replies owed while the client is not read (buffers full): its
        // close, or KILL's, would go unseen until the server answers.
        let unread_client = cycle.req.outstanding > 0
            && (cbuf.len() >= super::relay_io::BUFFER_LIMIT
                || tracking.as_deref().is_some_and(full));
        let wanted = if cycle.req.outstanding > 0 && !settings.query_timeout.is_zero() {
            // query_timeout: the server still owes replies (timed per
            // request: re-armed at each ReadyForQuery, below).
            Some((IdleKind::Query, settings.query_timeout))
        } else if unread_client {
            Some((IdleKind::Unread, UNREAD_LOOK))
        } else if mid_message {
            Some((IdleKind::Message, MESSAGE_STALL_TIMEOUT))
        } else if pinned_idle {
            (!settings.client_idle_timeout.is_zero())
                .then_some((IdleKind::Client, settings.client_idle_timeout))
        } else if release_each.is_none()
            && settings.server_fast_close
            && cycle.req.at_rest()
            && cycle.status == TransactionStatus::Idle
        {
            // server_fast_close: a session between transactions gives up a
            // server a RECONNECT or RELOAD marked (looked at each second).
            Some((IdleKind::FastClose, FAST_CLOSE_POLL))
        } else {
            // Idle in a transaction, or in the implicit one of an
            // extended-protocol batch with no Sync yet.
            (!idle_tx_timeout.is_zero()
                && cycle.req.outstanding == 0
                && (cycle.status != TransactionStatus::Idle || cycle.req.unsynced))
                .then_some((IdleKind::Transaction, idle_tx_timeout))
        };
        match wanted {
            None => idle_timer = None,
            Some((kind, after)) => {
                let next_request = kind == IdleKind::Query && query_cycle != cycle.cycles_done;
                if next_request || idle_timer.as_ref().is_none_or(|(k, _)| *k != kind) {
                    idle_timer = Some((kind, Box::pin(tokio::time::sleep(after))));
                    query_cycle = cycle.cycles_done;
                }
            }
        }
        if !xact_timeout.is_zero() {
            let between = cycle.status == TransactionStatus::Idle
                && cycle.req.outstanding == 0
                && !cycle.req.unsynced;
            // A transaction ended (ReadyForQuery 'I'), even if the client
            // has pipelined the next one already: its clock starts again.
            let ended = xact_mark != cycle.xacts_done;
            xact_mark = cycle.xacts_done;
            if between || ended {
                xact_timer = None;
            }
            if !between && xact_timer.is_none() {
                xact_timer = Some(Box::pin(tokio::time::sleep(xact_timeout)));
            }
        }
        // The server has answered everything and only the flush of its
        // last replies to the client remains before it goes back: a read
        // now would only register a wake-up that no reply can answer
        // (tokio's readiness check, a few hundred instructions a
        // transaction). Whatever it sends after its ReadyForQuery (a FATAL
        // of a terminated backend) is found by its next user, as when it
        // comes just after the release.
        let read_server = !(release_each.is_some()
            && cycle.clean()
            && cycle.to_server == 0
            && lease.server().buf.len() == cycle.to_client
            && tracking
                .as_deref()
                .is_none_or(|t| t.pinned.is_none() && t.expected.is_empty() && t.out.is_empty()));
        let read_client = !cycle.client_terminated && !cycle.capped();
        // While replies are owed and both sides are read as usual, a write
        // changes nothing decided above (the end needs no reply owed; the
        // timers follow the replies, the scan, or buffers under the limit
        // that a write only shortens): the poll may go on waiting after
        // one.
        let writes_wake = !(cycle.req.outstanding > 0
            && read_client
            && read_server
            && tracking.as_deref().is_none_or(|t| {
                t.pinned.is_none()
                    && t.out.len() < super::relay_io::BUFFER_LIMIT
                    && t.extra.len() < super::relay_io::BUFFER_LIMIT
            }));
        let server = lease.server();
        let (server_out, client_extra) = match tracking.as_deref_mut() {
            Some(t) => (Some(&mut t.out), Some(&mut t.extra)),
            None => (None, None),
        };
        let mut sides = Sides {
            client: &mut client.stream,
            server: &mut server.stream,
            cbuf,
            to_server: &mut cycle.to_server,
            sbuf: &mut server.buf,
            to_client: &mut cycle.to_client,
            read_client,
            read_server,
            writes_wake,
            idle_timer: idle_timer.as_mut().map(|(_, t)| t.as_mut()),
            xact_timer: xact_timer.as_mut().map(|t| t.as_mut()),
            written: &mut cycle.written,
            server_out,
            client_extra,
            sbuf_wanted: cycle.server_scan.wanted(),
            cbuf_wanted: cycle.client_scan.wanted(),
            blocked: &mut blocked,
        };
        match std::future::poll_fn(|cx| sides.poll(cx)).await {
            IoEvent::Progress { client_read } => {
                quiet = !read_server
                    && !client_read
                    && cycle.to_client == 0
                    && cbuf.is_empty()
                    && lease.server().buf.is_empty()
                    && tracking
                        .as_deref()
                        .is_some_and(|t| t.out.is_empty() && t.extra.is_empty());
                if client_read
                    && idle_timer
                        .as_ref()
                        .is_some_and(|(k, _)| *k != IdleKind::Query)
                {
                    // Activity restarts the idle clocks (not query_timeout's).
                    idle_timer = None;
                }
            }
            IoEvent::ServerClosed => {
                break Err(End::Server {
                    why: "server closed the connection unexpectedly".into(),
                    lost: true,
                });
            }
            IoEvent::ServerFailed(e) => {
                break Err(End::Server {
                    why: e.to_string(),
                    lost: true,
                });
            }
            IoEvent::ClientGone => break Ok(Outcome::ClientGone),
            IoEvent::TransactionTimeout => {
                break Err(End::Client(ClientError::new(
                    "08P01",
                    "transaction timeout",
                )));
            }
            IoEvent::IdleTimeout
                if idle_timer
                    .as_ref()
                    .is_some_and(|(k, _)| *k == IdleKind::Unread) =>
            {
                if client.stream.peer_hung_up() {
                    break Ok(Outcome::ClientGone);
                }
                idle_timer = None;
            }
            IoEvent::IdleTimeout
                if idle_timer
                    .as_ref()
                    .is_some_and(|(k, _)| *k == IdleKind::FastClose) =>
            {
                if lease.stale() {
                    tracing::info!(user = %client.user(), db = %client.database(), "closing because: database configuration changed (server_fast_close)");
                    break Err(End::Client(ClientError::new(
                        "08006",
                        "database configuration changed",
                    )));
                }
                idle_timer = None;
            }
            IoEvent::IdleTimeout => {
                break Err(End::Client(match idle_timer.as_ref().map(|(k, _)| *k) {
                    Some(IdleKind::Client) => ClientError::new("08P01", "client_idle_timeout"),
                    Some(IdleKind::Query) => ClientError::new("08P01", "query timeout"),
                    Some(IdleKind::Message) => ClientError::new(
                        "08P01",
                        format!(
                            "incomplete message: no data for {} s while holding a server",
                            MESSAGE_STALL_TIMEOUT.as_secs()
                        ),
                    ),
                    _ => ClientError::new("25P03", "idle transaction timeout"),
                }));
            }
        }
    };
    let cancel_unsettled =
        client.app.cancels.unlink(client.cancel) && !settle_cancels(client).await;
    let end = match end {
        Ok(Outcome::Release) if cancel_unsettled => Ok(Outcome::Close),
        // A request with no reply (a lone Flush, CopyData outside a COPY)
        // ends as soon as it is written: its send may still be in the
        // worker's ring, which a server going back must not have.
        Ok(Outcome::Release) if !lease.server().stream.settled() => {
            match settle_send(&mut lease).await {
                true => Ok(Outcome::Release),
                false => Ok(Outcome::Close),
            }
        }
        end => end,
    };
    cycle.fill_stats(&mut lease.stats);
    let done_at = crate::clock::Mono::now();
    lease.stats.linked = done_at.saturating_duration_since(linked_at);
    // Its last use, for the release (one clock read for both).
    lease.server().last_used = done_at;
    // (a FATAL error held back between transactions counts as drained: it
    // answers nothing the client asked; see `tracked::scan_server`)
    let server_drained = {
        let buf = &lease.server().buf;
        buf.is_empty() || tracked::is_lone_fatal(buf)
    };
    let ended = match end {
        Ok(Outcome::Retry) => {
            if cycle.isolation_refused {
                client.replicas_after = Some(std::time::Instant::now() + ISOLATION_REFUSED_FOR);
            }
            if cancel_unsettled {
                lease.close();
            } else {
                lease.release();
            }
            RelayEnd::Retry
        }
        Ok(Outcome::Close) => {
            lease.close();
            if let Some(t) = tracking.as_deref_mut()
                && t.pinned.take().is_some()
            {
                // Its session objects went with the server.
                client.set_pinned(None);
            }
            RelayEnd::Released
        }
        Ok(Outcome::Release) => {
            let mut kept = true;
            if client.want_commit_lsn && cycle.xacts_done > 0 {
                // Read-your-writes: the primary's position now covers what
                // this transaction committed.
                const SQL: &str = "select pg_catalog.pg_current_wal_insert_lsn()";
                let read = tokio::time::timeout(
                    CLEANUP_TIMEOUT,
                    Box::pin(run_query_rows(lease.server(), SQL)),
                )
                .await
                .unwrap_or_else(|_| {
                    Err(crate::backend::login::LoginError::Unsupported(
                        "the WAL position query timed out".into(),
                    ))
                });
                match read {
                    Ok(rows) => {
                        client.commit_lsn = rows
                            .first()
                            .and_then(|r| r.first())
                            .and_then(|v| v.as_deref())
                            .and_then(crate::backend::topology::parse_lsn);
                    }
                    Err(_) => kept = false,
                }
            }
            let reset_query = (settings.server_reset_query_always
                && !settings.server_reset_query.is_empty())
            .then_some(settings.server_reset_query.as_str());
            let clean = kept
                && match reset_query {
                    Some(sql) => Box::pin(reset(&mut lease, sql)).await,
                    None => true,
                };
            if !clean {
                lease.close();
            } else {
                if reset_query.is_some() {
                    forget_session(lease.server());
                }
                lease.release();
            }
            RelayEnd::Released
        }
        Ok(Outcome::ClientGone) => {
            // A client killed by an operator is told why (`say_goodbye`)
            // only if what it was sent ends on a message boundary.
            if cycle.to_client != 0 || !cycle.server_scan.at_boundary() {
                client.app.cancels.forget_kill(client.cancel);
            }
            let cleanup = tracking.as_deref().and_then(Tracking::abandon_sql);
            let owed = tracking.as_deref().is_some_and(|t| !t.expected.is_empty());
            Box::pin(finish_abandoned(lease, &cycle, &settings, cleanup, owed)).await;
            RelayEnd::ClientLeft
        }
        Err(End::Client(e)) => {
            let cleanup = tracking.as_deref().and_then(Tracking::abandon_sql);
            let owed = tracking.as_deref().is_some_and(|t| !t.expected.is_empty());
            Box::pin(finish_abandoned(lease, &cycle, &settings, cleanup, owed)).await;
            RelayEnd::Error(e)
        }
        Err(End::Server { why, lost: true })
            if cycle.retry != Retry::Off
                && cycle.written.1 == 0
                && !cycle.client_terminated
                && client
                    .retry_query
                    .as_ref()
                    .is_some_and(|q| cycle.written.0 <= q.len() as u64) =>
        {
            if lease.host() == 0 {
                tracing::warn!(user = %client.user(), db = %client.database(), "server connection failed before any reply ({why}): the request runs on another server");
            } else {
                tracing::warn!(user = %client.user(), db = %client.database(), "replica connection failed before any reply ({why}): the read runs on the primary");
            }
            lease.close();
            RelayEnd::Retry
        }
        Err(End::Server { why, lost: true })
            if release_each.is_some()
                && cycle.clean()
                && cycle.to_server == 0
                && cycle.to_client == 0
                && server_drained
                && !cycle.req.unsure()
                && !cycle.client_terminated
                && tracking
                    .as_deref()
                    .is_some_and(|t| t.settled() && t.pinned.is_none() && !t.needs_after()) =>
        {
            // Nothing was in flight: its transaction was over (the server
            // said so, the client has every reply, nothing is owed or
            // left to undo) before the server went (a shutdown right after
            // the last reply, or before the client's next message was
            // whole): the client lost nothing and goes on with another
            // server.
            tracing::info!(user = %client.user(), db = %client.database(), "server connection ended between transactions ({why}): closed, the client goes on");
            lease.close();
            RelayEnd::Released
        }
        Err(End::Server { why, .. }) => {
            tracing::warn!(user = %client.user(), db = %client.database(), "server connection failed: {why}");
            lease.close();
            let farewell = cycle.farewell.as_deref();
            RelayEnd::Error(match farewell.and_then(|b| ErrorFields::decode(b).ok()) {
                Some(f) => ClientError::new(f.code, format!("{}: {FAILOVER_NOTE}", f.message)),
                None if cycle.keep_farewell => ClientError::new(
                    "08006",
                    format!("server connection failed: {why}: {FAILOVER_NOTE}"),
                ),
                None => ClientError::new("08006", format!("server connection failed: {why}")),
            })
        }
    };
    if let Some(mut t) = tracking {
        tracked::forget_failed_parses(&mut t, client.statements_if_any());
        t.give_back();
    }
    ended
}

/// Before sluice runs queries of its own on the client's server: the
/// client's cancel requests stop reaching it, and one already on its way
/// is waited for. False when that cannot be known (close the server).
async fn own_queries_uncancelled(client: &Client) -> bool {
    !client.app.cancels.unlink(client.cancel) || settle_cancels(client).await
}

/// Waits (briefly: the server reads) for what was written to the server
/// to leave the worker's ring; false if it did not.
#[inline(never)]
async fn settle_send(lease: &mut Lease) -> bool {
    use tokio::io::AsyncWriteExt;
    let flushed = tokio::time::timeout(
        std::time::Duration::from_secs(1),
        lease.server().stream.flush(),
    )
    .await;
    matches!(flushed, Ok(Ok(()))) && lease.server().stream.settled()
}

/// A cancel request of the client's is on its way to the server the relay
/// ends with: the server goes to no other client before PostgreSQL has
/// signalled it (it would cancel that client's query). False when that
/// cannot be known: the server is closed. Rare: only a cancel sent as the
/// transaction ends waits here.
#[inline(never)]
async fn settle_cancels(client: &Client) -> bool {
    // (as long as the forwarding itself may take)
    let limit = match client.pool.settings().cancel_wait_timeout {
        d if d.is_zero() => client.pool.settings_and_target().1.connect_timeout,
        d => d,
    };
    client.app.cancels.cancels_done(client.cancel, limit).await
}

/// The server made to match the client's parameters and session settings
/// (`needs_sync`): SQL run only for what differs. `Err` ends the relay
/// before anything of the client's is sent. Boxed by its caller: rare, and
/// its state would otherwise sit in every relay's future.
async fn sync_session(
    client: &mut Client,
    cbuf: &mut BytesMut,
    mut lease: Lease,
) -> Result<Lease, RelayEnd> {
    let server = lease.server();
    if !Arc::ptr_eq(&server.params, &client.params) {
        if let Some(sql) = client.params.diff_sql(&server.params)
            && let Err(e) = Box::pin(run_query(server, &sql)).await
        {
            client.app.cancels.unlink(client.cancel);
            lease.close();
            if server_gone(&e)
                && let Some(n) = unsent_retry(client, cbuf)
            {
                // Nothing of the request was sent: it may go elsewhere.
                bytes::Buf::advance(cbuf, n);
                return Err(RelayEnd::Retry);
            }
            return Err(RelayEnd::Error(ClientError::new(
                e.sqlstate(),
                e.to_string(),
            )));
        }
        server.params = client.params.clone();
    }
    if !crate::session_vars::same(&server.session, client.session()) {
        if let Some(sql) = crate::session_vars::apply_sql(
            server.session.as_deref(),
            client.session().as_deref(),
            crate::params::text_mode(&client.params, server.sql_ascii),
        ) && let Err(e) = Box::pin(run_query(server, &sql)).await
        {
            let canceling = client.app.cancels.unlink(client.cancel);
            if server_gone(&e)
                && let Some(n) = unsent_retry(client, cbuf)
            {
                lease.close();
                bytes::Buf::advance(cbuf, n);
                return Err(RelayEnd::Retry);
            }
            let error = ClientError::new(e.sqlstate(), e.to_string());
            // A rejected SET rolls back whole: the server is as it was
            // (unless a cancel of the client's may still reach it).
            if !canceling && matches!(e, crate::backend::login::LoginError::Rejected { .. }) {
                // The client's settings were taken by a server before: this
                // one refuses them for what another client did there (a
                // temp table fixes temp_buffers for the session). It can
                // never hold them: closed, and the request, untouched, goes
                // to another, a few times in a row at most (a setting no
                // server takes any more, a dropped role, must not close
                // every server). Settings no server ever took (a bad
                // startup option) close none.
                if client.settings_proven && client.sync_refusals + 1 < SYNC_TRIES {
                    client.sync_refusals += 1;
                    lease.close();
                    return Err(RelayEnd::Again);
                }
                lease.release();
            } else {
                lease.close();
            }
            client.sync_refusals = 0;
            return Err(RelayEnd::Error(error));
        }
        server.session = client.session().clone();
        client.settings_proven = true;
    }
    client.sync_refusals = 0;
    Ok(lease)
}

/// How long a client's reads stay on the primary after a replica refused
/// one for its isolation level (a default the client cannot be seen to
/// set: its role's or database's).
const ISOLATION_REFUSED_FOR: std::time::Duration = std::time::Duration::from_secs(30);

/// Servers a request may try when each refuses the client's settings.
const SYNC_TRIES: u8 = 3;

/// Whether the server's parameters or session settings differ from the
/// client's (a pointer compare when they are the same).
fn needs_sync(client: &Client, server: &crate::backend::server::ServerConn) -> bool {
    !Arc::ptr_eq(&server.params, &client.params)
        || !crate::session_vars::same(&server.session, client.session())
}

/// Whether a query sluice ran itself on a leased server failed because the
/// server went away (its connection ended, or it said it is shutting down)
/// rather than because it refused the query.
fn server_gone(e: &crate::backend::login::LoginError) -> bool {
    use crate::backend::login::LoginError;
    match e {
        LoginError::Read(_) => true,
        LoginError::Rejected { code, .. } => {
            matches!(code.as_str(), "57P01" | "57P02" | "57P03" | "57P05")
        }
        _ => false,
    }
}

/// The length of the request that may run again elsewhere, if `cbuf` still
/// starts with it (nothing of it sent yet): the session puts the request
/// back in front of the client's bytes for the retry, so it is taken out
/// here first.
fn unsent_retry(client: &Client, cbuf: &BytesMut) -> Option<usize> {
    let query = client.retry_query.as_ref()?;
    cbuf.starts_with(query).then_some(query.len())
}

/// What a client whose transaction lost the primary's connection is told.
const FAILOVER_NOTE: &str = "the primary's connection ended during this transaction \
     (a failover or restart may be under way); new transactions wait for the \
     primary up to failover_hold";

enum Outcome {
    Release,
    /// See `Retry`.
    Retry,
    /// The transaction ended but the server cannot be trusted.
    Close,
    ClientGone,
}

/// Which idle clock runs while linked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum IdleKind {
    /// idle_transaction_timeout: idle inside a transaction.
    Transaction,
    /// client_idle_timeout: a pinned client idle between transactions.
    Client,
    /// A client stalled halfway through a message while holding a server.
    Message,
    /// query_timeout: the server has not finished answering.
    Query,
    /// server_fast_close: a session-mode client between transactions.
    FastClose,
    /// Replies owed while the client is not read: a look at its end now
    /// and then.
    Unread,
}

/// How often a client that is not read (buffers full) is looked at for
/// its close (`IdleKind::Unread`).
const UNREAD_LOOK: std::time::Duration = std::time::Duration::from_secs(1);

/// How often a session between transactions looks whether its server was
/// marked to close (`server_fast_close`).
const FAST_CLOSE_POLL: std::time::Duration = std::time::Duration::from_secs(1);

/// How long a transaction-mode client may stall halfway through a message
/// while it holds a server (other clients may be waiting for it).
const MESSAGE_STALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

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
             connection holds whole (Parse, Bind, Describe, Close, Query)",
            CLIENT_HELD_LIMIT >> 20
        ),
    )
}

/// Largest server message held whole (ErrorResponse, ParameterStatus,
/// ReadyForQuery and, in transaction mode, a few small replies). An error
/// message repeats its input, so it may be large; past this the server is
/// closed and the client told why.
const SERVER_HELD_LIMIT: usize = 16 << 20;

/// What a client using the simple query protocol gets under
/// `disable_pqexec` (PgBouncer's text).
pub(super) fn pqexec_disallowed() -> ClientError {
    ClientError::new("08P01", "PQexec disallowed")
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

fn scan_client(
    cycle: &mut Cycle,
    cbuf: &BytesMut,
    limit: usize,
) -> Result<(), sluice_wire::WireError> {
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

fn scan_server(
    cycle: &mut Cycle,
    sbuf: &BytesMut,
    client_params: &mut Arc<crate::params::ParamSet>,
    refuse_transactions: bool,
) -> Result<bool, sluice_wire::WireError> {
    let mut seen = ServerSeen::default();
    let end = cycle.server_scan.scan(
        sbuf,
        cycle.to_client,
        SERVER_MESSAGE_LIMIT,
        server_needs_body,
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

/// After a reset query (DISCARD ALL or the like) the server holds no
/// client's settings or statements.
fn forget_session(server: &mut crate::backend::server::ServerConn) {
    server.session = None;
    server.statements.clear();
}

/// The client is gone (or being thrown out): make the server clean, or
/// close it. A server with unread results, a half-sent message or requests
/// in flight is closed; one idle in a transaction is rolled back.
async fn finish_abandoned(
    mut lease: Lease,
    cycle: &Cycle,
    settings: &crate::backend::pool::PoolSettings,
    cleanup: Option<&'static str>,
    owed: bool,
) {
    let at_rest = cycle.req.at_rest()
        && !cycle.req.unsure()
        && !owed
        && cycle.client_scan.at_boundary()
        && cycle.server_scan.at_boundary()
        && cycle.to_server == 0;
    if !at_rest {
        lease.close();
        return;
    }
    // Whole messages meant for a client that is gone.
    lease.server().buf.clear();
    if cycle.status != TransactionStatus::Idle && !reset(&mut lease, "ROLLBACK").await {
        lease.close();
        return;
    }
    if let Some(sql) = cleanup {
        if !reset(&mut lease, sql).await {
            lease.close();
            return;
        }
        forget_session(lease.server());
    }
    let reset_query = &settings.server_reset_query;
    if settings.mode == PoolMode::Session && !reset_query.is_empty() {
        if !reset(&mut lease, reset_query).await {
            lease.close();
            return;
        }
        forget_session(lease.server());
    }
    lease.release();
}
