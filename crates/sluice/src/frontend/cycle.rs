//! The bookkeeping of one linked period (a client holding a server), which
//! the relay and its tracked scans (`tracked`) both keep: the requests
//! owed, the transaction status, the scanners' positions, the safety net's
//! state, and what one server message changes in them. Apart from the
//! relay's loop, so that the scans depend on it and not on the relay.

use std::sync::Arc;

use bytes::BytesMut;
use sluice_wire::{ParameterStatus, TransactionStatus, tags};

use super::requests::Requests;
use crate::backend::stats::TxStats;
use crate::params::{tracked_name, update_shared};
use crate::scan::Scanner;

/// Request-cycle bookkeeping of one linked period.
pub(super) struct Cycle {
    /// ReadyForQuery messages owed, counted from the server's replies.
    pub(super) req: Requests,
    pub(super) status: TransactionStatus,
    pub(super) client_scan: Scanner,
    pub(super) server_scan: Scanner,
    /// Client bytes scanned and not yet written to the server.
    pub(super) to_server: usize,
    /// Server bytes scanned and not yet written to the client.
    pub(super) to_client: usize,
    pub(super) client_terminated: bool,
    /// `disable_pqexec`: a simple Query ends the client (PgBouncer's
    /// "PQexec disallowed"); set when one is seen, nothing of it sent.
    pub(super) no_pqexec: bool,
    pub(super) pqexec_seen: bool,
    /// A message PostgreSQL would refuse with a protocol error that may
    /// leave its server out of step (an unknown type, a Sync or Flush with
    /// a body): the client is ended before it reaches the server.
    pub(super) bad_message: Option<String>,
    /// Statement mode saw a transaction block open.
    pub(super) refused_transaction: bool,
    /// ReadyForQuery messages seen, and those with status 'I'.
    pub(super) cycles_done: u64,
    pub(super) xacts_done: u64,
    /// `read_your_writes = database` on a write period: CommandComplete
    /// bodies are read, and the requests that may have committed counted
    /// in `commits` (see `on_server_message`); `maybe_committed`: the
    /// request being answered may have.
    pub(super) watch_commits: bool,
    pub(super) commits: u64,
    pub(super) maybe_committed: bool,
    /// Within the request being answered, whether its statements now run
    /// outside a block: the last ReadyForQuery said 'I', or a ROLLBACK,
    /// COMMIT or PREPARE TRANSACTION ended the block since (review 44:
    /// `rollback; insert …` commits the insert).
    pub(super) outside_block: bool,
    /// Bytes written to the server and to the client.
    pub(super) written: (u64, u64),
    /// Client bytes taken for the server in transaction and statement
    /// mode, as the client sent them (sluice's own messages and renamed
    /// statements make `written.0` differ).
    pub(super) client_taken: u64,
    /// SQLSTATE classes of server errors.
    pub(super) error_classes: Vec<([u8; 2], u64)>,
    /// On a replica, only the request routed there is sent: client
    /// messages stop being taken once this many requests (Query, Sync) have
    /// been sent, and the rest waits for the next lease, routed afresh
    /// (lifted when the request leaves a READ ONLY transaction open).
    pub(super) cap: Option<u64>,
    /// The cap is routing's (a replica, a read on the primary), not only
    /// the lost-server net's: it stays once the request is answered.
    pub(super) routed_cap: bool,
    /// The server is a replica's (a host pool's).
    pub(super) on_replica: bool,
    /// The read-on-a-replica safety net (see `Retry`).
    pub(super) retry: Retry,
    /// A RowDescription kept from the client while `retry` is armed.
    pub(super) retry_kept: Vec<u8>,
    /// On the primary of a database that routes reads: a server's FATAL
    /// error is kept from the client, which gets it with what it means
    /// for the pool (a failover may be under way) when the server's
    /// connection ends right after it.
    pub(super) keep_farewell: bool,
    pub(super) farewell: Option<Vec<u8>>,
    /// The replica refused the read for its isolation level (0A000): the
    /// client's next reads stay on the primary a while.
    pub(super) isolation_refused: bool,
    /// A FATAL error was kept from the client: the server must end now;
    /// anything more it sends is a broken server.
    pub(super) after_farewell: bool,
}

/// A simple-Query read routed to a replica: if the replica's first answer
/// is a 25006 error ("cannot execute … in a read-only transaction"), the
/// reply is kept from the client and the query runs again on the primary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Retry {
    Off,
    /// Waiting for the replica's first answer.
    Armed,
    /// A request on the primary that may run again on another server if
    /// this one turns out dead before answering: its first answer is a
    /// shutdown's FATAL error (swallowed) or the end of the connection.
    /// Nothing after the request is sent until the first answer (the
    /// cycle is capped at one request), so a retry loses nothing.
    Lost,
    /// Refused: the rest of the reply is swallowed.
    Swallowing,
    /// The refused reply is over: give the server back and retry.
    Done,
}

impl Cycle {
    /// A linked period's bookkeeping at its start. `host`: the server's
    /// host (0: the primary); `retry_query`: the client's request may run
    /// again elsewhere (`Client::retry_query`); `routed_primary`: on the
    /// primary of a database that routes reads; `primary_read`: there for a
    /// read the router sent to the primary (a replica lagging or absent):
    /// one request, as on a replica, so that a write pipelined behind it
    /// is routed as a write and counts for read-your-writes.
    pub(super) fn new(
        no_pqexec: bool,
        host: u32,
        session_mode: bool,
        retry_query: bool,
        routed_primary: bool,
        primary_read: bool,
    ) -> Self {
        let routed_cap = !session_mode && (host != 0 || primary_read);
        Cycle {
            req: Requests::default(),
            status: TransactionStatus::Idle,
            client_scan: Scanner::default(),
            server_scan: Scanner::default(),
            to_server: 0,
            to_client: 0,
            client_terminated: false,
            no_pqexec,
            pqexec_seen: false,
            bad_message: None,
            refused_transaction: false,
            cycles_done: 0,
            xacts_done: 0,
            watch_commits: false,
            commits: 0,
            maybe_committed: false,
            outside_block: true,
            written: (0, 0),
            client_taken: 0,
            error_classes: Vec::new(),
            // (a session-mode session on a standby keeps it)
            cap: (routed_cap || (host == 0 && retry_query)).then_some(1),
            routed_cap,
            on_replica: host != 0,
            retry: match (host, retry_query) {
                (_, false) => Retry::Off,
                (0, true) => Retry::Lost,
                (_, true) => Retry::Armed,
            },
            retry_kept: Vec::new(),
            keep_farewell: routed_primary && host == 0,
            farewell: None,
            isolation_refused: false,
            after_farewell: false,
        }
    }

    /// What the period did, for the pool's statistics (the time linked is
    /// the relay's).
    pub(super) fn fill_stats(&mut self, stats: &mut TxStats) {
        stats.xacts = self.xacts_done;
        stats.queries = self.cycles_done;
        stats.received = self.written.0;
        stats.sent = self.written.1;
        stats.error_classes = std::mem::take(&mut self.error_classes);
    }

    /// No more client messages may be sent on this server (see `cap`).
    pub(super) fn capped(&self) -> bool {
        self.cap.is_some_and(|c| self.req.sent() >= c)
    }

    pub(super) fn clean(&self) -> bool {
        self.req.at_rest()
            && self.status == TransactionStatus::Idle
            && self.client_scan.at_boundary()
            && self.server_scan.at_boundary()
    }

    pub(super) fn flushed(&self, server_buf: &BytesMut) -> bool {
        self.to_server == 0 && self.to_client == 0 && server_buf.is_empty()
    }
}

/// The bookkeeping fields of a `Cycle` for `on_server_message`, borrowed
/// apart from its scanners (one of which is busy scanning).
macro_rules! cycle_view {
    ($cycle:expr) => {
        CycleView {
            req: &mut $cycle.req,
            status: &mut $cycle.status,
            cycles_done: &mut $cycle.cycles_done,
            xacts_done: &mut $cycle.xacts_done,
            commits: &mut $cycle.commits,
            maybe_committed: &mut $cycle.maybe_committed,
            outside_block: &mut $cycle.outside_block,
            refused_transaction: &mut $cycle.refused_transaction,
            error_classes: &mut $cycle.error_classes,
        }
    };
}
pub(super) use cycle_view;

/// Largest server message: PostgreSQL's own limit is 1 GB per field.
pub(super) const SERVER_MESSAGE_LIMIT: usize = i32::MAX as usize;

/// Server messages whose bodies the relay reads.
pub(super) fn server_needs_body(tag: u8) -> bool {
    use tags::backend as b;
    tag == b::READY_FOR_QUERY || tag == b::PARAMETER_STATUS || tag == b::ERROR_RESPONSE
}

/// What the server scan learnt beyond bookkeeping.
#[derive(Default)]
pub(super) struct ServerSeen {
    pub(super) bad: Option<sluice_wire::WireError>,
    pub(super) params_changed: bool,
    /// A CopyInResponse (or the error that ended a COPY) showed that this
    /// many Syncs were ignored.
    pub(super) ignored_syncs: u32,
    /// The server reported a new session_authorization or is_superuser:
    /// something (a function, perhaps) changed the role.
    pub(super) role_changed: bool,
}

/// The parts of a `Cycle` a server message updates (borrowed apart from
/// its scanner, which is busy scanning).
pub(super) struct CycleView<'a> {
    pub(super) req: &'a mut Requests,
    pub(super) status: &'a mut TransactionStatus,
    pub(super) cycles_done: &'a mut u64,
    pub(super) xacts_done: &'a mut u64,
    pub(super) commits: &'a mut u64,
    pub(super) maybe_committed: &'a mut bool,
    pub(super) outside_block: &'a mut bool,
    pub(super) refused_transaction: &'a mut bool,
    pub(super) error_classes: &'a mut Vec<([u8; 2], u64)>,
}

/// Bookkeeping for one server message passed to the client:
/// ReadyForQuery ends a request, ErrorResponse is counted by class, a
/// ParameterStatus of a tracked parameter updates the client's view.
pub(super) fn on_server_message(
    seen: &mut ServerSeen,
    cycle: CycleView<'_>,
    tag: u8,
    body: &[u8],
    client_params: &mut Arc<crate::params::ParamSet>,
    refuse_transactions: bool,
) {
    use tags::backend as b;
    match tag {
        b::READY_FOR_QUERY => match TransactionStatus::decode(body) {
            Ok(s) => {
                if std::mem::take(cycle.maybe_committed) {
                    *cycle.commits += 1;
                }
                *cycle.outside_block = s == TransactionStatus::Idle;
                cycle.req.server_ready();
                *cycle.status = s;
                *cycle.cycles_done += 1;
                if s == TransactionStatus::Idle {
                    *cycle.xacts_done += 1;
                }
                if refuse_transactions && s != TransactionStatus::Idle {
                    *cycle.refused_transaction = true;
                }
            }
            Err(e) => seen.bad = Some(e),
        },
        b::COPY_IN_RESPONSE => seen.ignored_syncs += cycle.req.server_copy_in(),
        b::COMMAND_COMPLETE => {
            seen.ignored_syncs += cycle.req.server_done(false);
            // May this request have committed? A COMMIT (`AND CHAIN`,
            // `PREPARED`) anywhere; outside a block, any statement but one
            // that opens it: it commits as it ends, and a CALL or DO may
            // commit inside (review 43: `call p(); begin` answers 'T').
            // A block's end puts what follows outside it (ROLLBACK TO
            // SAVEPOINT, tagged ROLLBACK too, only makes this count more).
            // The body is there only when asked for (`watch_commits`).
            let opens = body.starts_with(b"BEGIN") || body.starts_with(b"START TRANSACTION");
            if body.starts_with(b"COMMIT") || (*cycle.outside_block && !opens) {
                *cycle.maybe_committed = true;
            }
            if opens {
                *cycle.outside_block = false;
            } else if body.starts_with(b"COMMIT")
                || body.starts_with(b"ROLLBACK")
                || body.starts_with(b"PREPARE TRANSACTION")
            {
                *cycle.outside_block = true;
            }
        }
        // (an Execute with a row limit: the statement may have written
        // whole, INSERT … RETURNING, and its implicit block commits at the
        // Sync; review 45)
        // (nor a FunctionCall's answer: the function may write, and
        // commits with it)
        b::PORTAL_SUSPENDED | b::FUNCTION_CALL_RESPONSE if *cycle.outside_block => {
            *cycle.maybe_committed = true
        }
        b::ERROR_RESPONSE => {
            seen.ignored_syncs += cycle.req.server_done(true);
            // (a CALL that committed, then failed)
            if *cycle.outside_block {
                *cycle.maybe_committed = true;
            }
            if let Ok(f) = sluice_wire::ErrorFields::decode(body)
                && let [a, b, ..] = f.code.as_bytes()
            {
                let class = [*a, *b];
                match cycle.error_classes.iter_mut().find(|(c, _)| *c == class) {
                    Some((_, n)) => *n += 1,
                    None => cycle.error_classes.push((class, 1)),
                }
            }
        }
        b::PARAMETER_STATUS => match ParameterStatus::decode(body) {
            Ok(p) => {
                if p.name == "session_authorization" || p.name == "is_superuser" {
                    seen.role_changed = true;
                }
                if let Some(name) = tracked_name(p.name) {
                    update_shared(client_params, name, p.value);
                    seen.params_changed = true;
                }
            }
            Err(e) => seen.bad = Some(e),
        },
        _ => {}
    }
}
