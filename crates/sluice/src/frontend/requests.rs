//! How many ReadyForQuery messages a server still owes a linked client,
//! counted from what the server says, never from what the client claims.
//!
//! Query, FunctionCall and Sync each earn one ReadyForQuery, except Syncs
//! that arrive while the server is in COPY FROM STDIN: PostgreSQL ignores
//! those. A client's CopyDone or CopyFail only *claims* that a COPY was
//! running; PostgreSQL ignores a CopyDone outside COPY and still answers
//! the Syncs before it. So the Syncs before a CopyDone are discounted only
//! once the server's CopyInResponse for that very request has been read.
//! A COPY that the server ends with an error before the client's CopyDone
//! (bad data, a constraint) has read the Syncs sent right after its start,
//! before any data, in COPY: those are discounted when the error is read.
//! Getting this wrong either way hurts: too few owed and the server goes
//! back to the pool with a reply still coming (the next client gets it),
//! too many and the client keeps its server, and replies sluice writes
//! itself come one ReadyForQuery late. Where PostgreSQL's answer depends on
//! timing (an error while Syncs were on the way), the count is marked
//! unsure and the server is closed instead of shared.

use std::collections::VecDeque;

use sluice_wire::tags;

/// Unconfirmed COPY ends kept; past this a claim is dropped (its Syncs
/// stay owed, which only keeps the claiming client on its server).
const CLAIMS_LIMIT: usize = 64;

/// What a client message passed on means for the request bookkeeping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Counted {
    /// Query or FunctionCall: a request answered up to ReadyForQuery.
    Request,
    Sync,
    Execute,
    /// CopyDone or CopyFail: `ignored_syncs` Syncs are now known to have
    /// been ignored by PostgreSQL (0 until the server confirmed the COPY).
    CopyEnded {
        ignored_syncs: u32,
    },
    Terminate,
    Other,
}

/// Request bookkeeping of one linked period.
#[derive(Debug, Default)]
pub(super) struct Requests {
    /// ReadyForQuery messages owed.
    pub(super) outstanding: u32,
    /// Extended-protocol messages sent since the last Sync the server
    /// answers (an ignored one closes nothing).
    pub(super) unsynced: bool,
    /// ReadyForQuery-earning messages sent, and ReadyForQuery seen (plus
    /// Syncs known to be ignored): positions in the reply stream.
    sent: u64,
    seen: u64,
    /// `sent` when the latest Execute, Query or FunctionCall went out: its
    /// CopyInResponse, if any, comes when `seen` reaches this.
    start: u64,
    /// That start was an Execute (its COPY leaves the batch unsynced).
    start_extended: bool,
    /// Syncs sent since that start with nothing else in between (anything
    /// else would have ended a COPY with an error).
    syncs: u32,
    /// A CopyDone or CopyFail already followed that start: a COPY it began
    /// is over, and a later one claims nothing.
    start_ended: bool,
    /// Syncs sent since that start with nothing but Syncs and Flushes
    /// before them (no data): a COPY the start began read them in COPY,
    /// whatever ends it.
    quiet_syncs: u32,
    /// Only Syncs and Flushes were sent since that start.
    quiet: bool,
    /// Client COPY ends not yet confirmed.
    claims: VecDeque<Claim>,
    /// The server is in COPY FROM STDIN for the start at this position and
    /// the client has not ended it yet.
    server_copy: Option<u64>,
    /// The server is in COPY FROM STDIN (CopyInResponse seen, no
    /// CommandComplete or ErrorResponse yet); true once Syncs were
    /// discounted for it. (Even Syncs sent before any data are not sure on
    /// an error: PostgreSQL may fail before it reads input, on a view, a
    /// BEFORE STATEMENT trigger, a cancel; a review of a change that
    /// trusted them.)
    copy_active: Option<bool>,
    /// An Execute was sent since the last ReadyForQuery (it may end a
    /// failed transaction block: ROLLBACK through the extended protocol).
    executed: bool,
    /// A COPY whose Syncs were discounted ended in an error: PostgreSQL
    /// may have left COPY before reading some of them and answered those,
    /// so the count cannot be trusted and the server must not be shared.
    unsure: bool,
    /// The client ended a COPY with Syncs sent inside it, and the server
    /// has not said yet how the COPY ended (`holding_client`).
    copy_end_pending: bool,
}

/// A client's CopyDone or CopyFail awaiting the server's word.
#[derive(Debug, Clone, Copy)]
struct Claim {
    start: u64,
    syncs: u32,
    extended: bool,
    /// `sent` at the end: if still the same when confirmed, no Sync since
    /// has closed the batch.
    end: u64,
}

impl Requests {
    /// Nothing owed and nothing half-sent.
    pub(super) fn at_rest(&self) -> bool {
        self.outstanding == 0 && !self.unsynced
    }

    /// Nothing sent since the last ReadyForQuery could change the
    /// transaction status it reported (no request, no Execute in flight).
    pub(super) fn status_current(&self) -> bool {
        self.outstanding == 0 && !self.executed
    }

    /// An Execute was sent since the last ReadyForQuery.
    pub(super) fn executed(&self) -> bool {
        self.executed
    }

    /// Requests (Query, FunctionCall, Sync) sent in this linked period.
    pub(super) fn sent(&self) -> u64 {
        self.sent
    }

    /// Requests answered (ReadyForQuery seen, plus Syncs known to be
    /// ignored): the position in the reply stream, as `sent` counts.
    pub(super) fn seen(&self) -> u64 {
        self.seen
    }

    /// The reply count may be wrong (see `unsure`): close, do not share.
    pub(super) fn unsure(&self) -> bool {
        self.unsure
    }

    /// Nothing more of the client's goes to the server for now: it ended
    /// a simple-protocol COPY with Syncs sent inside it, and until the
    /// server says how the COPY ended (and, when that leaves the count
    /// unsure, until the server goes), what PostgreSQL answers to those
    /// Syncs is not known. A request sent behind them would be answered
    /// after replies sluice cannot count, and lost with the server (a
    /// review: a Query pipelined there was never answered). Held, it goes
    /// to the next server. Not once nothing is surely owed while the
    /// period cannot end there (`idle` false: a transaction block is open,
    /// whose end the client must send, or the client is pinned; or a
    /// batch is open), nor for a COPY
    /// started by an Execute, whose end PostgreSQL sends only at the
    /// client's Sync or Flush.
    pub(super) fn holding_client(&self, idle: bool) -> bool {
        !self.start_extended
            && (self.copy_end_pending
                || (self.unsure && (self.outstanding > 0 || (idle && !self.unsynced))))
    }

    /// Accounts for one client message sent on to the server.
    pub(super) fn client(&mut self, tag: u8) -> Counted {
        use tags::frontend as f;
        match tag {
            f::QUERY | f::FUNCTION_CALL => {
                self.request_sent();
                Counted::Request
            }
            f::SYNC => {
                self.outstanding = self.outstanding.saturating_add(1);
                self.unsynced = false;
                self.sent += 1;
                self.syncs = self.syncs.saturating_add(1);
                if self.quiet {
                    self.quiet_syncs = self.quiet_syncs.saturating_add(1);
                }
                Counted::Sync
            }
            f::TERMINATE => Counted::Terminate,
            f::FLUSH => Counted::Other,
            f::COPY_DATA => {
                self.quiet = false;
                Counted::Other
            }
            f::COPY_DONE | f::COPY_FAIL => {
                self.quiet = false;
                Counted::CopyEnded {
                    ignored_syncs: self.copy_ended(),
                }
            }
            f::EXECUTE => {
                self.unsynced = true;
                self.executed = true;
                self.start_extended = true;
                self.started();
                Counted::Execute
            }
            _ => {
                self.other_sent();
                Counted::Other
            }
        }
    }

    /// A simple Query (or FunctionCall) went to the server.
    pub(super) fn request_sent(&mut self) {
        self.outstanding = self.outstanding.saturating_add(1);
        self.unsynced = false;
        self.start_extended = false;
        self.started();
        self.sent += 1;
    }

    /// An Execute, Query or FunctionCall (which may start a COPY) went out.
    fn started(&mut self) {
        self.start = self.sent;
        self.start_ended = false;
        self.syncs = 0;
        self.quiet_syncs = 0;
        self.quiet = true;
    }

    /// An extended-protocol message other than Execute, Sync and Flush
    /// went to the server: it would end a COPY with an error, so Syncs
    /// before it are not discounted by a later CopyDone.
    pub(super) fn other_sent(&mut self) {
        self.unsynced = true;
        self.syncs = 0;
        self.quiet = false;
    }

    /// CopyDone or CopyFail: returns the Syncs now known to be ignored.
    fn copy_ended(&mut self) -> u32 {
        let syncs = std::mem::take(&mut self.syncs);
        if std::mem::replace(&mut self.start_ended, true) {
            return 0;
        }
        let confirmed = self.server_copy == Some(self.start);
        if confirmed {
            self.server_copy = None;
        }
        if syncs == 0 {
            return 0;
        }
        // (only while the COPY may still run: confirmed, or its request not
        // answered yet; a COPY that failed before the Syncs were read is
        // over, and a CopyDone after it gets no answer: holding would wait
        // for good, a review)
        self.copy_end_pending = confirmed || self.seen <= self.start;
        let claim = Claim {
            start: self.start,
            syncs,
            extended: self.start_extended,
            end: self.sent,
        };
        if confirmed {
            self.discount(claim);
            return syncs;
        }
        if self.claims.len() < CLAIMS_LIMIT {
            self.claims.push_back(claim);
        }
        0
    }

    fn discount(&mut self, claim: Claim) {
        self.outstanding = self.outstanding.saturating_sub(claim.syncs);
        self.seen += u64::from(claim.syncs);
        if claim.extended && self.sent == claim.end {
            // The ignored Syncs closed nothing: the Execute's batch is
            // open until a Sync the server answers.
            self.unsynced = true;
        }
        if self.copy_active.is_some() {
            self.copy_active = Some(true);
        }
    }

    fn drop_stale_claims(&mut self) {
        while self.claims.front().is_some_and(|c| c.start < self.seen) {
            self.claims.pop_front();
        }
    }

    /// PostgreSQL ignored `n` Queries or FunctionCalls: they followed an
    /// error in an extended-protocol batch, before its Sync. No
    /// ReadyForQuery comes for them. `batch_open`: no Sync follows them
    /// yet, so the server ignores all until one comes: it is not at rest
    /// (a Query sent meanwhile did not close the batch, as it seemed to).
    pub(super) fn requests_ignored(&mut self, n: u32, batch_open: bool) {
        self.outstanding = self.outstanding.saturating_sub(n);
        self.seen += u64::from(n);
        if batch_open {
            self.unsynced = true;
        }
        self.drop_stale_claims();
    }

    /// The server sent ReadyForQuery.
    pub(super) fn server_ready(&mut self) {
        self.copy_end_pending = false;
        self.executed = false;
        self.outstanding = self.outstanding.saturating_sub(1);
        self.seen += 1;
        self.server_copy = None;
        self.copy_active = None;
        self.drop_stale_claims();
    }

    /// The server sent CommandComplete (`failed` false) or ErrorResponse:
    /// a COPY FROM STDIN it was in has ended. Returns the Syncs now known
    /// to be ignored (a COPY that failed before the client ended it).
    pub(super) fn server_done(&mut self, failed: bool) -> u32 {
        self.copy_end_pending = false;
        let Some(discounted) = self.copy_active.take() else {
            return 0;
        };
        let copy_start = self.server_copy.take();
        if !failed {
            return 0;
        }
        if discounted {
            self.unsure = true;
            return 0;
        }
        if copy_start != Some(self.start) || self.start_ended || self.quiet_syncs == 0 {
            return 0;
        }
        // The client has not ended this COPY: the Syncs sent before any
        // data were read in COPY, unless the error (a timeout, a cancel)
        // came before they arrived. The client's CopyDone or CopyFail, when
        // it comes, claims nothing.
        self.start_ended = true;
        let syncs = self.quiet_syncs;
        self.discount(Claim {
            start: self.start,
            syncs,
            extended: self.start_extended,
            end: self.start + u64::from(syncs),
        });
        self.unsure = true;
        syncs
    }

    /// The server sent CopyInResponse: returns the Syncs now known to be
    /// ignored (the client already ended this COPY).
    pub(super) fn server_copy_in(&mut self) -> u32 {
        self.drop_stale_claims();
        self.copy_active = Some(false);
        match self.claims.front() {
            Some(&claim) if claim.start == self.seen => {
                self.claims.pop_front();
                self.discount(claim);
                claim.syncs
            }
            _ => {
                self.server_copy = Some(self.seen);
                0
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tags::frontend as f;

    fn send(r: &mut Requests, tags: &[u8]) -> u32 {
        let mut ignored = 0;
        for &t in tags {
            if let Counted::CopyEnded { ignored_syncs } = r.client(t) {
                ignored += ignored_syncs;
            }
        }
        ignored
    }

    #[test]
    fn queries_ignored_after_an_extended_error_are_not_owed() {
        // Parse (fails), Bind, Execute, Query, Sync: PostgreSQL answers the
        // error and the Sync's ReadyForQuery; the Query is ignored.
        let mut r = Requests::default();
        send(&mut r, &[f::PARSE, f::BIND, f::EXECUTE, f::QUERY, f::SYNC]);
        assert_eq!(r.outstanding, 2);
        r.requests_ignored(1, false);
        r.server_ready();
        assert!(r.at_rest());
        // Without the Sync yet: the server still ignores until one comes.
        let mut r = Requests::default();
        send(&mut r, &[f::PARSE, f::BIND, f::EXECUTE, f::QUERY]);
        r.requests_ignored(1, true);
        assert_eq!(r.outstanding, 0);
        assert!(!r.at_rest(), "the batch is open until a Sync");
        send(&mut r, &[f::SYNC]);
        r.server_ready();
        assert!(r.at_rest());
    }

    #[test]
    fn requests_behind_a_copy_with_syncs_inside_wait_for_its_end() {
        // Query COPY; CopyInResponse; data, Sync, Sync, CopyDone: what the
        // client sends next waits until the server ends the COPY.
        let mut r = Requests::default();
        send(&mut r, &[f::QUERY]);
        assert_eq!(r.server_copy_in(), 0);
        send(&mut r, &[f::COPY_DATA, f::SYNC, f::SYNC]);
        assert!(!r.holding_client(true));
        send(&mut r, &[f::COPY_DONE]);
        assert!(r.holding_client(true), "until the COPY's end");
        // It failed: PostgreSQL may answer the Syncs or not; held until
        // the server goes (at rest by the count, outside a block).
        r.server_done(true);
        assert!(r.unsure());
        assert!(r.holding_client(false), "ReadyForQuery still owed");
        r.server_ready();
        assert!(r.at_rest());
        assert!(r.holding_client(true));
        assert!(!r.holding_client(false), "in a block the client must go on");
        // Ended well: nothing in doubt.
        let mut r = Requests::default();
        send(&mut r, &[f::QUERY]);
        r.server_copy_in();
        send(&mut r, &[f::SYNC, f::COPY_DATA, f::COPY_DONE]);
        assert!(r.holding_client(true));
        r.server_done(false);
        assert!(!r.holding_client(true));
        // tokio-postgres: Execute, Sync, data, CopyDone, Sync, failing:
        // PostgreSQL may have failed before reading the first Sync (a view,
        // a trigger, a cancel), so the count is unsure.
        let mut r = Requests::default();
        send(&mut r, &[f::BIND, f::EXECUTE, f::SYNC]);
        r.server_copy_in();
        send(&mut r, &[f::COPY_DATA, f::COPY_DONE, f::SYNC]);
        r.server_done(true);
        assert!(r.unsure());
        // A COPY that failed on its data before the Syncs were read: it is
        // over, the Sync answered; the CopyDone after it gets no answer.
        let mut r = Requests::default();
        send(&mut r, &[f::QUERY]);
        r.server_copy_in();
        send(&mut r, &[f::COPY_DATA]);
        r.server_done(true);
        r.server_ready();
        send(&mut r, &[f::SYNC]);
        r.server_ready();
        send(&mut r, &[f::COPY_DONE]);
        assert!(!r.holding_client(true), "nothing will answer the CopyDone");
        // An Execute's COPY: its end comes only at the client's Sync.
        let mut r = Requests::default();
        send(&mut r, &[f::BIND, f::EXECUTE]);
        r.server_copy_in();
        send(&mut r, &[f::SYNC, f::COPY_DATA, f::COPY_DONE]);
        assert!(!r.holding_client(true));
    }

    #[test]
    fn copy_done_without_copy_discounts_nothing() {
        let mut r = Requests::default();
        // Sync then CopyDone with no COPY: PostgreSQL answers the Sync.
        assert_eq!(send(&mut r, &[f::SYNC, f::COPY_DONE]), 0);
        assert_eq!(r.outstanding, 1);
        r.server_ready();
        assert!(r.at_rest());
        // Execute, Sync, CopyDone, where the Execute was no COPY.
        send(&mut r, &[f::BIND, f::EXECUTE, f::SYNC, f::COPY_DONE]);
        assert_eq!(r.outstanding, 1);
        r.server_ready();
        assert!(r.at_rest());
        assert!(r.claims.is_empty());
    }

    #[test]
    fn extended_copy_discounts_once_the_server_confirms() {
        // libpq: Execute, Sync; CopyInResponse; data, CopyDone, Sync.
        let mut r = Requests::default();
        send(&mut r, &[f::PARSE, f::BIND, f::EXECUTE, f::SYNC]);
        assert_eq!(r.server_copy_in(), 0);
        assert_eq!(
            send(&mut r, &[f::COPY_DATA, f::COPY_DONE, f::SYNC]),
            1,
            "the Sync after Execute was ignored"
        );
        assert_eq!(r.outstanding, 1);
        r.server_ready();
        assert!(r.at_rest());
    }

    #[test]
    fn pipelined_copy_end_waits_for_copy_in_response() {
        let mut r = Requests::default();
        send(
            &mut r,
            &[f::BIND, f::EXECUTE, f::SYNC, f::COPY_DONE, f::SYNC],
        );
        assert_eq!(r.outstanding, 2, "not discounted on the client's word");
        assert_eq!(r.server_copy_in(), 1);
        assert_eq!(r.outstanding, 1);
        r.server_ready();
        assert!(r.at_rest());
    }

    #[test]
    fn simple_query_copy_and_a_later_request() {
        let mut r = Requests::default();
        send(&mut r, &[f::QUERY, f::SYNC, f::COPY_DONE, f::QUERY]);
        assert_eq!(r.outstanding, 3);
        assert_eq!(r.server_copy_in(), 1);
        r.server_ready();
        assert_eq!(r.outstanding, 1);
        r.server_ready();
        assert!(r.at_rest());
    }

    #[test]
    fn a_message_between_ends_the_claim() {
        // Execute, Sync, Parse (would abort a COPY), CopyDone: no discount.
        let mut r = Requests::default();
        send(&mut r, &[f::EXECUTE, f::SYNC, f::PARSE, f::COPY_DONE]);
        assert_eq!(r.server_copy_in(), 0);
        assert_eq!(r.outstanding, 1);
    }

    #[test]
    fn an_earlier_reply_does_not_confirm_a_later_copy() {
        // Sync, Execute, Sync, CopyDone: the first ReadyForQuery belongs to
        // the first Sync; the COPY is confirmed after it.
        let mut r = Requests::default();
        send(&mut r, &[f::SYNC, f::EXECUTE, f::SYNC, f::COPY_DONE]);
        r.server_ready();
        assert_eq!(r.outstanding, 1);
        assert_eq!(r.server_copy_in(), 1);
        assert_eq!(r.outstanding, 0);
        assert!(r.unsynced, "the ignored Sync closed no batch");
    }

    #[test]
    fn an_ignored_sync_leaves_the_batch_open() {
        // Execute of a COPY, Sync (ignored), CopyDone: the batch is open
        // until another Sync is answered.
        let mut r = Requests::default();
        send(&mut r, &[f::PARSE, f::BIND, f::EXECUTE, f::SYNC]);
        r.server_copy_in();
        send(&mut r, &[f::COPY_DONE]);
        r.server_done(false);
        assert!(!r.at_rest(), "unsynced: the implicit transaction is open");
        send(&mut r, &[f::SYNC]);
        r.server_ready();
        assert!(r.at_rest());
        // Pipelined, with the closing Sync sent before the confirmation.
        send(&mut r, &[f::EXECUTE, f::SYNC, f::COPY_DONE, f::SYNC]);
        r.server_copy_in();
        assert!(!r.unsynced, "the Sync after CopyDone closes the batch");
    }

    #[test]
    fn a_failed_copy_with_discounted_syncs_is_unsure() {
        let mut r = Requests::default();
        send(&mut r, &[f::QUERY]);
        r.server_copy_in();
        send(&mut r, &[f::COPY_DATA, f::SYNC, f::COPY_DONE]);
        r.server_done(true);
        assert!(r.unsure(), "PostgreSQL may have answered that Sync");
        // Without discounted Syncs an error is ordinary.
        let mut r = Requests::default();
        send(&mut r, &[f::QUERY]);
        r.server_copy_in();
        send(&mut r, &[f::COPY_DATA, f::COPY_DONE]);
        r.server_done(true);
        assert!(!r.unsure());
    }

    #[test]
    fn a_copy_failing_before_the_client_ends_it_discounts_its_quiet_syncs() {
        // tokio-postgres: Bind, Execute, Sync; CopyInResponse; data; the
        // server errors on the data; then CopyDone (or CopyFail), Sync.
        let mut r = Requests::default();
        send(&mut r, &[f::BIND, f::EXECUTE, f::SYNC]);
        assert_eq!(r.server_copy_in(), 0);
        send(&mut r, &[f::COPY_DATA]);
        assert_eq!(r.server_done(true), 1, "the Sync after Execute");
        assert_eq!(r.outstanding, 0);
        assert!(r.unsynced, "the ignored Sync closed nothing");
        assert_eq!(send(&mut r, &[f::COPY_DONE, f::SYNC]), 0);
        assert_eq!(r.outstanding, 1);
        r.server_ready();
        assert!(r.at_rest());
        assert!(r.unsure(), "an async error may have come before the Sync");
    }

    #[test]
    fn a_failing_copy_discounts_no_sync_sent_after_data() {
        // Query (COPY); data; Sync; error: the Sync may be answered.
        let mut r = Requests::default();
        send(&mut r, &[f::QUERY]);
        r.server_copy_in();
        send(&mut r, &[f::COPY_DATA, f::SYNC]);
        assert_eq!(r.server_done(true), 0);
        assert_eq!(r.outstanding, 2);
        // A COPY that succeeds discounts nothing here either.
        let mut r = Requests::default();
        send(&mut r, &[f::EXECUTE, f::SYNC]);
        r.server_copy_in();
        assert_eq!(r.server_done(false), 0);
        assert_eq!(r.outstanding, 1);
    }

    #[test]
    fn only_the_first_copy_end_after_a_start_claims() {
        // COPY, CopyDone, Sync, stray CopyDone: the Sync came after the COPY
        // ended and is answered.
        let mut r = Requests::default();
        send(&mut r, &[f::QUERY, f::COPY_DONE, f::SYNC, f::COPY_DONE]);
        assert_eq!(r.server_copy_in(), 0);
        assert_eq!(r.outstanding, 2);
        r.server_ready();
        r.server_ready();
        assert!(r.at_rest());
    }

    #[test]
    fn claims_are_bounded() {
        let mut r = Requests::default();
        for _ in 0..1000 {
            send(&mut r, &[f::EXECUTE, f::SYNC, f::COPY_DONE]);
        }
        assert!(r.claims.len() <= CLAIMS_LIMIT);
        assert_eq!(r.outstanding, 1000);
    }
}
