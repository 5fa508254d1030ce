//! `read_your_writes = database` inside a block on a replica. Routing
//! checks the replica's replay when a period's first request goes there;
//! a READ COMMITTED block left open on it then takes a new snapshot at
//! each statement, and each must see every write that ended on the
//! primary before it was sent, as it would on the primary (review 46).
//! So a later request of the block, held before any of it is sent, waits
//! until the replica has replayed the database's newest write position,
//! for at most `replica_max_lag`: the lag past which the router stops
//! sending the replica reads at all. A replica slower than that serves
//! the request as it stands, and the log says so; the block cannot move
//! to another server.
//!
//! Nothing runs on the block's own server meanwhile: a query there would
//! drop the client's unnamed statement and portal, and take the block's
//! snapshot before its first query does (review 48). The replica's
//! position comes from its checks (`monitor.rs`), which run back to back
//! while a read waits (`Topology::replay_waiter`). A REPEATABLE READ
//! block waits as well: sluice does not know whether its snapshot was
//! taken (a SHOW takes none).

use std::time::Duration;

use bytes::BytesMut;
use sluice_wire::TransactionStatus;

use crate::frontend::client::{Client, ReplicaWatch};
use crate::frontend::cycle::Cycle;
use crate::frontend::tracked::Tracking;

/// How often a held request looks at the replica's checks again.
const POLL: Duration = Duration::from_millis(1);

/// A request of a block open on a replica has arrived and nothing of it
/// has been sent: the moment to wait (cheap; the caller first checks that
/// the client has a watch at all). The first request's position was
/// checked by routing. Whatever the server is doing (answering an earlier
/// request, or at a Flush: review 49 read stale after Parse/Bind/Execute/
/// Flush), nothing is sent to it meanwhile.
pub(super) fn request_waiting(cycle: &Cycle, cbuf: &BytesMut, tracking: Option<&Tracking>) -> bool {
    cycle.status == TransactionStatus::InTransaction
        && cycle.cycles_done >= 1
        && !cbuf.is_empty()
        && cycle.to_server == 0
        && cycle.client_scan.at_boundary()
        && !cycle.client_terminated
        && tracking.is_none_or(|t| t.out.is_empty())
}

/// Waits until the replica's checks show it has replayed every write
/// that ended before now, or `replica_max_lag` has passed.
pub(super) async fn wait_in_block(client: &mut Client) {
    let current = client.app.topology(&client.pool.database);
    let Some(watch) = client.replica_watch.as_deref_mut() else {
        return;
    };
    if let Some(current) = current
        && !std::sync::Arc::ptr_eq(&current, &watch.topology)
    {
        // A RELOAD replaced the topology while the block was open: writes
        // are counted in the new one (review 49), where the replica has
        // another place, or none.
        let place = (watch.topology.addr_of(watch.host)).and_then(|a| current.index_of(&a));
        match place {
            Some(i) => {
                watch.topology = current;
                watch.host = i;
            }
            None => {
                tracing::warn!(
                    db = %client.pool.database, user = %client.pool.user,
                    "read_your_writes: a RELOAD took out the replica a block is open on; \
                     its statements no longer wait for writes"
                );
                client.replica_watch = None;
                return;
            }
        }
    }
    if !wait(watch).await {
        tracing::warn!(
            db = %client.pool.database, user = %client.pool.user,
            "read_your_writes: a replica did not replay within replica_max_lag a write that \
             ended before a statement of a block open on it; the statement runs without it"
        );
    }
}

/// `wait_in_block`'s loop: false when the replica missed.
async fn wait(watch: &mut ReplicaWatch) -> bool {
    let deadline = tokio::time::Instant::now() + watch.wait;
    let topology = watch.topology.clone();
    let mut waiter = None;
    loop {
        // (`None`: a write ended whose position is not known yet; the
        // writer's own read of it is a round trip away)
        let need = match topology.database_position() {
            Some(None) => return true,
            Some(Some(lsn)) if lsn <= watch.seen => return true,
            Some(Some(lsn)) if topology.replayed_past(watch.host, lsn) => {
                watch.seen = lsn;
                return true;
            }
            Some(Some(lsn)) => Some(lsn),
            None => None,
        };
        if tokio::time::Instant::now() >= deadline {
            topology.note_replay_missed();
            if let Some(lsn) = need {
                // (the block's next request waits only for newer writes)
                watch.seen = lsn;
            }
            return false;
        }
        waiter.get_or_insert_with(|| topology.replay_waiter());
        tokio::time::sleep(POLL).await;
    }
}
