//! LISTEN and UNLISTEN take effect when their transaction commits, as on
//! PostgreSQL: a LISTEN rolled back (an explicit ROLLBACK, an error in an
//! implicit transaction, a failed block ended by COMMIT) never delivers,
//! and an UNLISTEN rolled back never stops anything. The pool's hub
//! (`backend::notify_hub`) listens as soon as a LISTEN is sent, so that
//! nothing committed after the LISTEN's own commit is missed; what the
//! client has committed decides what reaches it (`Listening::channels`).
//!
//! The ledger is the pure part: the statements a link sent, each with the
//! position of its request in the reply stream, settled from what the
//! server answers (a CommandComplete `COMMIT`; a ReadyForQuery `I` after
//! an error or a `ROLLBACK`, or after neither). Savepoints are not
//! followed: a LISTEN undone by `ROLLBACK TO SAVEPOINT` counts with its
//! transaction, and so does one rolled back by `ROLLBACK AND CHAIN`.

use sluice_wire::TransactionStatus;

use crate::prepared::sql::Special;

/// LISTEN and UNLISTEN statements of one link, sent and not yet settled.
#[derive(Debug, Default)]
pub(super) struct ListenLedger {
    /// (position of its request in the reply stream, the statement).
    pending: Vec<(u64, Special)>,
    /// An ErrorResponse since the last ReadyForQuery.
    error: bool,
    /// A CommandComplete `ROLLBACK` since the last ReadyForQuery.
    rolled_back: bool,
    /// Settled, in order: (statement, committed). The client applies them.
    pub(super) settled: Vec<(Special, bool)>,
}

impl ListenLedger {
    /// A LISTEN or UNLISTEN sent in the request at `position` (counted as
    /// `Requests` counts them).
    pub(super) fn sent(&mut self, position: u64, statement: Special) {
        self.pending.push((position, statement));
    }

    /// Statements wait for their transaction's end.
    #[inline]
    pub(super) fn is_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// A LISTEN to `channel` still waits for its transaction's end.
    pub(super) fn listen_pending(&self, channel: &str) -> bool {
        self.pending
            .iter()
            .any(|(_, s)| matches!(s, Special::Listen(c) if c == channel))
    }

    pub(super) fn on_error(&mut self) {
        self.error = true;
    }

    /// A CommandComplete (its tag, without the NUL) answering the request
    /// at `answering`: a `COMMIT` commits what that request and the ones
    /// before it sent (a COMMIT of a failed block says `ROLLBACK`).
    pub(super) fn on_command_complete(&mut self, tag: &[u8], answering: u64) {
        if tag == b"COMMIT" {
            self.settle(answering, true);
            self.error = false;
            self.rolled_back = false;
        } else if tag == b"ROLLBACK" {
            self.rolled_back = true;
        }
    }

    /// A ReadyForQuery that closed the request at `closed`: idle, the
    /// transaction of what it and the ones before it sent is over.
    pub(super) fn on_ready(&mut self, status: TransactionStatus, closed: u64) {
        if status == TransactionStatus::Idle {
            let committed = !self.error && !self.rolled_back;
            self.settle(closed, committed);
        }
        self.error = false;
        self.rolled_back = false;
    }

    /// The link ended with statements unsettled (the server was lost, or
    /// the client left): their transaction did not commit.
    pub(super) fn abandon(&mut self) {
        self.settle(u64::MAX, false);
        self.error = false;
        self.rolled_back = false;
    }

    fn settle(&mut self, upto: u64, committed: bool) {
        let split = self.pending.partition_point(|(p, _)| *p <= upto);
        self.settled
            .extend(self.pending.drain(..split).map(|(_, s)| (s, committed)));
    }

    pub(super) fn clear(&mut self) {
        self.pending.clear();
        self.settled.clear();
        self.error = false;
        self.rolled_back = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use TransactionStatus::{Failed, Idle, InTransaction};

    fn listen(c: &str) -> Special {
        Special::Listen(c.into())
    }

    fn unlisten(c: Option<&str>) -> Special {
        Special::Unlisten(c.map(Into::into))
    }

    #[test]
    fn an_implicit_transaction_commits_unless_it_fails() {
        let mut l = ListenLedger::default();
        l.sent(1, listen("a"));
        l.on_command_complete(b"LISTEN", 1);
        l.on_ready(Idle, 1);
        assert_eq!(l.settled, [(listen("a"), true)]);
        l.settled.clear();
        // "listen b; select 1/0": the whole string is one transaction.
        l.sent(2, listen("b"));
        l.on_command_complete(b"LISTEN", 2);
        l.on_error();
        l.on_ready(Idle, 2);
        assert_eq!(l.settled, [(listen("b"), false)]);
        assert!(!l.is_pending());
    }

    #[test]
    fn a_block_settles_at_its_commit_or_rollback() {
        let mut l = ListenLedger::default();
        l.on_ready(InTransaction, 1); // BEGIN
        l.sent(2, listen("a"));
        l.sent(2, unlisten(Some("z")));
        l.on_ready(InTransaction, 2);
        assert!(l.settled.is_empty() && l.is_pending());
        l.on_command_complete(b"ROLLBACK", 3);
        l.on_ready(Idle, 3);
        assert_eq!(
            l.settled,
            [(listen("a"), false), (unlisten(Some("z")), false)]
        );
        l.settled.clear();
        l.on_ready(InTransaction, 4);
        l.sent(5, listen("c"));
        l.on_ready(InTransaction, 5);
        l.on_command_complete(b"COMMIT", 6);
        assert_eq!(l.settled, [(listen("c"), true)]);
    }

    #[test]
    fn a_failed_block_ended_by_commit_rolls_back() {
        let mut l = ListenLedger::default();
        l.sent(1, listen("a"));
        l.on_ready(InTransaction, 1);
        l.on_error();
        l.on_ready(Failed, 2);
        // COMMIT of a failed block answers ROLLBACK.
        l.on_command_complete(b"ROLLBACK", 3);
        l.on_ready(Idle, 3);
        assert_eq!(l.settled, [(listen("a"), false)]);
    }

    #[test]
    fn an_error_recovered_by_a_savepoint_still_commits() {
        let mut l = ListenLedger::default();
        l.sent(1, listen("a"));
        l.on_ready(InTransaction, 1);
        l.on_error();
        l.on_ready(Failed, 2);
        l.on_command_complete(b"ROLLBACK", 3); // ROLLBACK TO SAVEPOINT s
        l.on_ready(InTransaction, 3);
        l.on_command_complete(b"COMMIT", 4);
        l.on_ready(Idle, 4);
        assert_eq!(l.settled, [(listen("a"), true)]);
    }

    #[test]
    fn a_pipelined_request_waits_for_its_own_transaction() {
        let mut l = ListenLedger::default();
        l.sent(1, listen("a"));
        l.sent(2, listen("b"));
        l.on_ready(Idle, 1);
        assert_eq!(l.settled, [(listen("a"), true)]);
        assert!(l.listen_pending("b") && !l.listen_pending("a"));
        l.on_error();
        l.on_ready(Idle, 2);
        assert_eq!(l.settled, [(listen("a"), true), (listen("b"), false)]);
    }

    #[test]
    fn an_abandoned_link_commits_nothing() {
        let mut l = ListenLedger::default();
        l.sent(1, listen("a"));
        l.on_ready(InTransaction, 1);
        l.sent(2, unlisten(None));
        l.abandon();
        assert_eq!(l.settled, [(listen("a"), false), (unlisten(None), false)]);
        assert!(!l.is_pending());
    }
}
