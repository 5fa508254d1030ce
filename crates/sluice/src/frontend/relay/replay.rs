//! `read_your_writes = database` inside a block on a replica. Routing
//! checks the replica's replay when a period's first request goes there;
//! a READ COMMITTED block left open on it then takes a new snapshot at
//! each statement, and each must see every write that ended on the
//! primary before it was sent, as it would on the primary (review 46).
//! So a later request of the block, held before any of it is sent, waits
//! for the replica (on the block's own server) to replay the database's
//! newest write position, for at most `replica_max_lag`: the lag past
//! which the router stops sending the replica reads at all. A replica
//! slower than that serves the request as it stands, and says so in the
//! log; the block cannot move to another server.

use std::time::Duration;

use bytes::BytesMut;
use sluice_wire::TransactionStatus;

use super::End;
use crate::backend::pool::Lease;
use crate::backend::topology::parse_lsn;
use crate::frontend::client::{Client, ReplicaWatch};
use crate::frontend::cycle::Cycle;
use crate::frontend::tracked::Tracking;

/// The replica's replay position, and the block's isolation level (a
/// REPEATABLE READ or SERIALIZABLE block took its snapshot at its first
/// statement: nothing later can change what it sees).
const SQL: &str = "select pg_catalog.pg_last_wal_replay_lsn(), \
                   pg_catalog.current_setting('transaction_isolation')";

/// How often the replica is asked again while it has not replayed far
/// enough.
const POLL: Duration = Duration::from_millis(1);

/// A request of a block open on a replica has arrived and nothing of it
/// has been sent: the moment to check (cheap; the caller first checks
/// that the client has a watch at all). The first request's position was
/// checked by routing; a pipeline sent behind an unfinished reply is not
/// held (the server is not at rest).
pub(super) fn request_waiting(
    cycle: &Cycle,
    cbuf: &BytesMut,
    tracking: Option<&Tracking>,
    server_buf: &BytesMut,
) -> bool {
    cycle.status == TransactionStatus::InTransaction
        && cycle.cycles_done >= 1
        && !cbuf.is_empty()
        && cycle.req.at_rest()
        && cycle.to_server == 0
        && cycle.to_client == 0
        && cycle.client_scan.at_boundary()
        && !cycle.client_terminated
        && server_buf.is_empty()
        && tracking.is_none_or(|t| t.out.is_empty())
}

/// Waits until the replica has replayed every write that ended before
/// now, or `replica_max_lag` has passed. `Err` only when the server
/// failed: an error from the check itself (a cancel the client sent for
/// the request it holds) leaves the block failed on the server, which
/// answers the request so; the watch ends there.
pub(super) async fn wait_in_block(client: &mut Client, lease: &mut Lease) -> Result<(), End> {
    let Some(mut watch) = client.replica_watch.take() else {
        return Ok(());
    };
    let (end, keep) = wait(&mut watch, lease, client).await;
    if keep {
        client.replica_watch = Some(watch);
    }
    end
}

/// `wait_in_block`'s loop; `false` with the result: the watch ends.
async fn wait(
    watch: &mut ReplicaWatch,
    lease: &mut Lease,
    client: &Client,
) -> (Result<(), End>, bool) {
    let deadline = tokio::time::Instant::now() + watch.wait;
    loop {
        // (`None`: a write ended whose position is not known yet; the
        // writer's own read of it is a round trip away)
        let need = match watch.topology.database_position() {
            Some(None) => return (Ok(()), true),
            Some(Some(lsn)) if lsn <= watch.seen => return (Ok(()), true),
            Some(Some(lsn)) if watch.topology.replayed_past(watch.host, lsn) => {
                watch.seen = lsn;
                return (Ok(()), true);
            }
            Some(Some(lsn)) => Some(lsn),
            None => None,
        };
        if let Some(lsn) = need {
            let rows =
                match crate::backend::login::run_query_rows_in_block(lease.server(), SQL).await {
                    Ok(rows) => rows,
                    Err(crate::backend::login::LoginError::Rejected { code, message }) => {
                        tracing::debug!(code, "replay check in a block failed: {message}");
                        return (Ok(()), false);
                    }
                    Err(e) => {
                        let why = format!("replay check in a block on a replica failed: {e}");
                        return (Err(End::server_broken(why)), false);
                    }
                };
            let row = rows.first();
            let value = |i: usize| row.and_then(|r| r.get(i)).and_then(|v| v.as_deref());
            if value(1).is_some_and(|level| level != "read committed") {
                return (Ok(()), false);
            }
            if let Some(replayed) = value(0).and_then(parse_lsn)
                && replayed >= lsn
            {
                watch.seen = replayed;
                return (Ok(()), true);
            }
        }
        if tokio::time::Instant::now() >= deadline {
            watch.topology.note_replay_missed();
            tracing::warn!(
                db = %client.pool.database, user = %client.pool.user,
                "read_your_writes: a replica did not replay within replica_max_lag a write \
                 that ended before a statement of a READ COMMITTED block open on it; the \
                 statement runs without it"
            );
            if let Some(lsn) = need {
                // (the block's next request waits only for newer writes)
                watch.seen = lsn;
            }
            return (Ok(()), true);
        }
        tokio::time::sleep(POLL).await;
    }
}
