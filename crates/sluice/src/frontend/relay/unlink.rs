//! The end of a linked period: a cancel on its way settled first
//! (`settle_cancels`), the period's statistics (`account`), and the
//! server released, checked in with queries of sluice's (`check_in`:
//! read-your-writes' WAL position, `server_reset_query`), closed, made
//! clean after a client that left (`abandon`), or given up with the
//! request sent round again (`server_lost`). Every path ends the lease: a
//! server goes back only clean. Plain code where no query is due, so the
//! common end is no future of its own (see `turn.rs`).

use sluice_config::PoolMode;
use sluice_wire::{ErrorFields, TransactionStatus};

use super::{End, Outcome, RelayEnd};
use crate::backend::login::run_query_rows;
use crate::backend::pool::{Lease, PoolSettings};
use crate::clock::Mono;
use crate::frontend::client::{CLEANUP_TIMEOUT, Client};
use crate::frontend::cycle::{Cycle, Retry};
use crate::frontend::error::ClientError;
use crate::frontend::tracked::{self, Tracking, reset};

/// How long a client's reads stay on the primary after a replica refused
/// one for its isolation level (a default the client cannot be seen to
/// set: its role's or database's).
const ISOLATION_REFUSED_FOR: std::time::Duration = std::time::Duration::from_secs(30);

/// What a client whose transaction lost the primary's connection is told.
const FAILOVER_NOTE: &str = "the primary's connection ended during this transaction \
     (a failover or restart may be under way); new transactions wait for the \
     primary up to failover_hold";

/// The period's statistics, and the server's last use (one clock read
/// for both).
#[inline(always)]
pub(super) fn account(cycle: &mut Cycle, lease: &mut Lease, linked_at: Mono) {
    cycle.fill_stats(&mut lease.stats);
    let done_at = Mono::now();
    lease.stats.linked = done_at.saturating_duration_since(linked_at);
    lease.server().last_used = done_at;
}

/// Ends the lease of a period that ended with `end`, where that needs no
/// query of sluice's (`check_in` and `abandon` are those that do).
#[inline(always)]
pub(super) fn unlink(
    client: &mut Client,
    lease: Lease,
    cycle: &Cycle,
    tracking: Option<&mut Tracking>,
    pooled: bool,
    end: Result<Outcome, End>,
    cancel_unsettled: bool,
) -> RelayEnd {
    match end {
        Ok(Outcome::Release) => {
            lease.release();
            RelayEnd::Released
        }
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
            if let Some(t) = tracking
                && t.pinned.take().is_some()
            {
                // Its session objects went with the server.
                client.set_pinned(None);
            }
            RelayEnd::Released
        }
        // (`run` sends these to `abandon`, which may keep the server;
        // closing it is the end that needs no query)
        Ok(Outcome::ClientGone) => {
            lease.close();
            RelayEnd::ClientLeft
        }
        Err(End::Client(e)) => {
            lease.close();
            RelayEnd::Error(e)
        }
        Err(End::Server { why, lost }) => {
            server_lost(client, lease, cycle, tracking.as_deref(), pooled, why, lost)
        }
    }
}

/// The client left, or is being thrown out (`killed`: it left or was
/// killed, and is told why only if what it was sent ends on a message
/// boundary): the server is made clean or closed (`finish_abandoned`).
pub(super) async fn abandon(
    client: &Client,
    mut lease: Lease,
    cycle: &Cycle,
    tracking: Option<&Tracking>,
    settings: &PoolSettings,
    left: bool,
) {
    // A client killed by an operator is told why (`say_goodbye`) only if
    // what it was sent ends on a message boundary.
    if left && (cycle.to_client != 0 || !cycle.server_scan.at_boundary()) {
        client.app.cancels.forget_kill(client.cancel);
    }
    let cleanup = tracking.and_then(Tracking::abandon_sql);
    let owed = tracking.is_some_and(|t| !t.expected.is_empty());
    // (ROLLBACK leaves a setseed: a review predicted the next client's
    // random() after one that left mid-transaction)
    let reseed = tracking.is_some_and(|t| t.effects.opaque);
    // (its private copies serve nobody now: closed before the server's
    // next Parse, as at a transaction's end)
    for copy in tracking.iter().flat_map(|t| t.one_off.values()) {
        lease.server().statements.retire(copy.id);
    }
    finish_abandoned(lease, cycle, settings, cleanup, owed, reseed).await;
}

/// Whether a clean period's server runs queries of sluice's before it goes
/// back (`check_in`).
pub(super) fn check_in_queries(client: &Client, settings: &PoolSettings, xacts: u64) -> bool {
    (client.want_commit_lsn && xacts > 0)
        || (settings.server_reset_query_always && !settings.server_reset_query.is_empty())
}

/// The server of a clean period goes back: after the WAL position that
/// read-your-writes needs and the reset query `server_reset_query_always`
/// asks for, if either is due; closed if one of them fails.
pub(super) async fn check_in(
    client: &mut Client,
    mut lease: Lease,
    settings: &PoolSettings,
    xacts: u64,
) {
    let mut kept = true;
    if client.want_commit_lsn && xacts > 0 {
        // Read-your-writes: the primary's position now covers what this
        // transaction committed.
        const SQL: &str = "select pg_catalog.pg_current_wal_insert_lsn()";
        let sent = std::time::Instant::now();
        let read = tokio::time::timeout(CLEANUP_TIMEOUT, run_query_rows(lease.server(), SQL))
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
                if let (Some(topology), Some(lsn)) = (&client.write_ends, client.commit_lsn) {
                    // (it covers every write that ended before it was sent)
                    topology.note_measured(sent, lsn);
                }
            }
            Err(_) => kept = false,
        }
    }
    let reset_query = (settings.server_reset_query_always
        && !settings.server_reset_query.is_empty())
    .then_some(settings.server_reset_query.as_str());
    let clean = kept
        && match reset_query {
            Some(sql) => reset(&mut lease, sql).await,
            None => true,
        };
    if !clean {
        lease.close();
        return;
    }
    if reset_query.is_some() {
        forget_session(lease.server());
    }
    lease.release();
}

/// The request may run again elsewhere (`Client::retry_query`): it may,
/// nothing of its replies reached the client, and nothing after it went
/// to the server.
pub(super) fn may_run_again(client: &Client, cycle: &Cycle, tracked: bool) -> bool {
    let sent = if tracked {
        cycle.client_taken
    } else {
        cycle.written.0
    };
    cycle.retry != Retry::Off
        && cycle.written.1 == 0
        && !cycle.client_terminated
        && client
            .retry_query
            .as_ref()
            .is_some_and(|q| sent <= q.len() as u64)
}

/// The server's connection failed (`lost`: it ended) or it broke the
/// protocol. A request that may run again and of which nothing reached
/// the client goes round again; a server that went between transactions
/// costs the client nothing; otherwise the client gets the server's
/// farewell, or 08006.
fn server_lost(
    client: &mut Client,
    mut lease: Lease,
    cycle: &Cycle,
    tracking: Option<&Tracking>,
    pooled: bool,
    why: String,
    lost: bool,
) -> RelayEnd {
    let retry = lost && may_run_again(client, cycle, tracking.is_some());
    if retry {
        if lease.host() == 0 {
            tracing::warn!(user = %client.user(), db = %client.database(), "server connection failed before any reply ({why}): the request runs on another server");
        } else {
            tracing::warn!(user = %client.user(), db = %client.database(), "replica connection failed before any reply ({why}): the read runs on the primary");
        }
        lease.close();
        return RelayEnd::Retry;
    }
    // (a FATAL error held back between transactions counts as drained: it
    // answers nothing the client asked; see `tracked::scan_server`)
    let drained = {
        let buf = &lease.server().buf;
        buf.is_empty() || tracked::is_lone_fatal(buf)
    };
    let between = lost
        && pooled
        && cycle.clean()
        && cycle.to_server == 0
        && cycle.to_client == 0
        && drained
        && !cycle.req.unsure()
        && !cycle.client_terminated
        && tracking.is_some_and(|t| t.settled() && t.pinned.is_none() && !t.needs_after());
    if between {
        // Nothing was in flight: its transaction was over (the server
        // said so, the client has every reply, nothing is owed or left to
        // undo) before the server went (a shutdown right after the last
        // reply, or before the client's next message was whole): the
        // client lost nothing and goes on with another server.
        tracing::info!(user = %client.user(), db = %client.database(), "server connection ended between transactions ({why}): closed, the client goes on");
        lease.close();
        return RelayEnd::Released;
    }
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

/// Before sluice runs queries of its own on the client's server: the
/// client's cancel requests stop reaching it, and one already on its way
/// is waited for. False when that cannot be known (close the server).
pub(super) async fn own_queries_uncancelled(client: &Client) -> bool {
    !client.app.cancels.unlink(client.cancel) || settle_cancels(client).await
}

/// Waits (briefly: the server reads) for what was written to the server
/// to leave the worker's ring; false if it did not.
#[inline(never)]
pub(super) async fn settle_send(lease: &mut Lease) -> bool {
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
pub(super) async fn settle_cancels(client: &Client) -> bool {
    // (as long as the forwarding itself may take)
    let limit = match client.pool.settings().cancel_wait_timeout {
        d if d.is_zero() => client.pool.settings_and_target().1.connect_timeout,
        d => d,
    };
    client.app.cancels.cancels_done(client.cancel, limit).await
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
    settings: &PoolSettings,
    cleanup: Option<&'static str>,
    owed: bool,
    reseed: bool,
) {
    let at_rest = cycle.req.at_rest()
        && !cycle.req.unsure()
        && !owed
        && cycle.client_scan.at_boundary()
        && cycle.server_scan.at_boundary()
        && cycle.to_server == 0;
    if !at_rest {
        // (a query running for a client that is gone, answered up to a
        // ReadyForQuery or executed with no Sync yet, is cancelled, not
        // left to run outside the pool's count)
        if !cycle.req.status_current() {
            lease.cancel_then_close();
        } else {
            lease.close();
        }
        return;
    }
    // Whole messages meant for a client that is gone.
    lease.server().buf.clear();
    if cycle.status != TransactionStatus::Idle && !reset(&mut lease, "ROLLBACK").await {
        lease.close();
        return;
    }
    if let Some(sql) = cleanup {
        // (not under the client's statement_timeout, which DISCARD ALL
        // resets midway: a timeout that fires then stays pending, and the
        // next client's first query got it, 57014; review 36)
        if !reset(&mut lease, "SET statement_timeout = 0").await
            || !reset(&mut lease, sql).await
            || (reseed && !reset(&mut lease, &tracked::reseed_sql()).await)
        {
            lease.close();
            return;
        }
        forget_session(lease.server());
    }
    let reset_query = &settings.server_reset_query;
    if settings.mode == PoolMode::Session && !reset_query.is_empty() {
        // (and random() reseeded: see `tracked::reseed_sql`)
        if !reset(&mut lease, reset_query).await || !reset(&mut lease, &tracked::reseed_sql()).await
        {
            lease.close();
            return;
        }
        forget_session(lease.server());
    }
    lease.release();
}
