//! The clocks that run while a client holds a server: one idle clock at a
//! time (which one follows from where the period stands, `idle_clock`, a
//! pure choice with unit tests) and `transaction_timeout`'s. A clock is
//! armed only when its kind changes, so a loop turn that changes nothing
//! allocates nothing.

use std::pin::Pin;
use std::time::Duration;

use tokio::time::Sleep;

use crate::backend::pool::PoolSettings;

/// Which idle clock runs while linked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum IdleKind {
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
    /// A replica owes replies: a look now and then at whether the checks
    /// took it out of rotation (frozen, cut off), in which case a read
    /// that has not answered runs on the primary, and one that cannot run
    /// again ends if the client cancelled it and the replica has been
    /// silent a whole look (the cancel would wait for the thaw); and at
    /// the client's end (as `Unread` looks).
    Replica,
}

/// How often a client that is not read (buffers full) is looked at for
/// its close (`IdleKind::Unread`).
pub(super) const UNREAD_LOOK: Duration = Duration::from_secs(1);

/// How often a read on a replica that has not answered looks at the
/// replica's health (`IdleKind::Replica`).
pub(super) const REPLICA_LOOK: Duration = Duration::from_secs(1);

/// How often a session between transactions looks whether its server was
/// marked to close (`server_fast_close`).
pub(super) const FAST_CLOSE_POLL: Duration = Duration::from_secs(1);

/// How long a transaction-mode client may stall halfway through a message
/// while it holds a server (other clients may be waiting for it).
pub(super) const MESSAGE_STALL_TIMEOUT: Duration = Duration::from_secs(30);

/// The slowest a message may come in all, past `MESSAGE_STALL_TIMEOUT`
/// (bytes a second): a client that sends a byte now and then is never
/// silent for long, and held its server for good (a review trickled a
/// 10 MiB message a byte every 3 s). 64 MiB, the most sluice holds whole,
/// may take 30 s plus 8.5 minutes.
pub(super) const MESSAGE_MIN_RATE: u64 = 128 << 10;

/// The settings the clocks follow (zero: that clock never runs).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Limits {
    pub query: Duration,
    pub client_idle: Duration,
    pub idle_transaction: Duration,
    pub transaction: Duration,
    pub fast_close: bool,
}

impl Limits {
    fn of(settings: &PoolSettings) -> Self {
        Limits {
            query: settings.query_timeout,
            client_idle: settings.client_idle_timeout,
            idle_transaction: settings.idle_transaction_timeout,
            transaction: settings.transaction_timeout,
            fast_close: settings.server_fast_close,
        }
    }
}

/// Where the period stands after a turn's scans.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Standing {
    /// The server owes replies.
    pub owed: bool,
    /// Replies are owed while the client is not read (its buffers full):
    /// its close, or KILL's, would go unseen until the server answers.
    pub unread_client: bool,
    /// A replica owes replies (a read that may still run on the primary
    /// waits for its first answer, or one that cannot runs).
    pub replica_owes: bool,
    /// The client is halfway through a message sluice is ready to read.
    pub mid_message: bool,
    /// That message's end, as a position in the client's stream (which
    /// message it is), and the bytes of it still to come.
    pub message_end: u64,
    pub message_left: u64,
    /// A pinned client between transactions.
    pub pinned_idle: bool,
    /// A session-mode session between transactions.
    pub session_at_rest: bool,
    /// Inside a transaction block, or in the implicit transaction of an
    /// extended-protocol batch with no Sync yet.
    pub in_transaction: bool,
}

/// The idle clock that should run, and for how long; the first that
/// applies wins.
#[inline(always)]
pub(super) fn idle_clock(s: &Standing, limits: &Limits) -> Option<(IdleKind, Duration)> {
    if s.owed && s.replica_owes {
        // (query_timeout's deadline bounds its looks: `Clocks::arm`)
        Some((IdleKind::Replica, REPLICA_LOOK))
    } else if s.owed && !limits.query.is_zero() {
        // query_timeout: timed per request (re-armed at each
        // ReadyForQuery, see `Clocks::arm`).
        Some((IdleKind::Query, limits.query))
    } else if s.unread_client {
        Some((IdleKind::Unread, UNREAD_LOOK))
    } else if s.mid_message {
        Some((IdleKind::Message, MESSAGE_STALL_TIMEOUT))
    } else if s.pinned_idle {
        (!limits.client_idle.is_zero()).then_some((IdleKind::Client, limits.client_idle))
    } else if s.session_at_rest && limits.fast_close {
        // server_fast_close: a session between transactions gives up a
        // server a RECONNECT or RELOAD marked (looked at each second).
        Some((IdleKind::FastClose, FAST_CLOSE_POLL))
    } else {
        (!limits.idle_transaction.is_zero() && !s.owed && s.in_transaction)
            .then_some((IdleKind::Transaction, limits.idle_transaction))
    }
}

type Timer = Pin<Box<Sleep>>;

/// The period's running clocks.
pub(super) struct Clocks {
    limits: Limits,
    idle: Option<(IdleKind, Timer)>,
    /// Requests and Executes answered when the query_timeout clock was
    /// last armed.
    query_cycle: u64,
    /// When the request owed now times out (query_timeout), if it does.
    query_deadline: Option<tokio::time::Instant>,
    /// transaction_timeout: runs from the first message of a transaction
    /// to the ReadyForQuery that ends it (the lease begins with one).
    transaction: Option<Timer>,
    /// Transactions ended when `transaction` was last looked at.
    xact_mark: u64,
    /// What a replica had answered at the last `Replica` look.
    replica_mark: Option<u64>,
    /// The message the `Message` clock runs for (its end in the client's
    /// stream), and when it must be whole whatever comes meanwhile.
    message: Option<(u64, tokio::time::Instant)>,
}

impl Clocks {
    pub(super) fn new(settings: &PoolSettings) -> Self {
        let limits = Limits::of(settings);
        Clocks {
            transaction: (!limits.transaction.is_zero())
                .then(|| Box::pin(tokio::time::sleep(limits.transaction))),
            limits,
            idle: None,
            query_cycle: 0,
            query_deadline: None,
            xact_mark: 0,
            replica_mark: None,
            message: None,
        }
    }

    /// Arms what `s` asks for; `cycles_done` and `xacts_done` are the
    /// period's counts (a new request, or an answered Execute, restarts
    /// query_timeout's clock; an ended transaction transaction_timeout's).
    #[inline(always)]
    pub(super) fn arm(&mut self, s: &Standing, cycles_done: u64, xacts_done: u64) {
        // query_timeout counts from the turn a request is first owed in
        // (whichever clock runs: a read waiting on a replica looks at it
        // too).
        let mut next_request = false;
        if !s.owed || self.limits.query.is_zero() {
            self.query_deadline = None;
        } else if self.query_deadline.is_none() || self.query_cycle != cycles_done {
            self.query_deadline = Some(tokio::time::Instant::now() + self.limits.query);
            self.query_cycle = cycles_done;
            next_request = true;
        }
        match idle_clock(s, &self.limits) {
            None => self.idle = None,
            Some((kind, after)) => {
                let timed = matches!(kind, IdleKind::Query | IdleKind::Replica);
                if (timed && next_request) || self.idle.as_ref().is_none_or(|(k, _)| *k != kind) {
                    let sleep = match (kind, self.query_deadline) {
                        (IdleKind::Query, Some(at)) => tokio::time::sleep_until(at),
                        (IdleKind::Replica, Some(at)) => {
                            tokio::time::sleep_until(at.min(tokio::time::Instant::now() + after))
                        }
                        (IdleKind::Message, _) => {
                            // Silence ends it (the client's bytes start
                            // that clock again), and so does the message's
                            // whole time, which they do not.
                            let now = tokio::time::Instant::now();
                            let whole = match self.message {
                                Some((end, at)) if end == s.message_end => at,
                                _ => {
                                    let at = now
                                        + after
                                        + Duration::from_secs(s.message_left / MESSAGE_MIN_RATE);
                                    self.message = Some((s.message_end, at));
                                    at
                                }
                            };
                            tokio::time::sleep_until(whole.min(now + after))
                        }
                        _ => tokio::time::sleep(after),
                    };
                    self.idle = Some((kind, Box::pin(sleep)));
                }
            }
        }
        if !self.limits.transaction.is_zero() {
            let between = !s.owed && !s.in_transaction;
            // A transaction ended (ReadyForQuery 'I'), even if the client
            // has pipelined the next one already: its clock starts again.
            let ended = self.xact_mark != xacts_done;
            self.xact_mark = xacts_done;
            if between || ended {
                self.transaction = None;
            }
            if !between && self.transaction.is_none() {
                self.transaction = Some(Box::pin(tokio::time::sleep(self.limits.transaction)));
            }
        }
    }

    /// The request owed has run past query_timeout.
    pub(super) fn query_expired(&self) -> bool {
        self.query_deadline
            .is_some_and(|at| tokio::time::Instant::now() >= at)
    }

    /// At a `Replica` look: the replica answered nothing since the last
    /// look (`answered` counts what it has answered: it only grows).
    pub(super) fn replica_silent(&mut self, answered: u64) -> bool {
        self.replica_mark.replace(answered) == Some(answered)
    }

    /// The idle clock running, if one is.
    pub(super) fn idle_kind(&self) -> Option<IdleKind> {
        self.idle.as_ref().map(|(k, _)| *k)
    }

    /// The client sent something: the idle clocks start again (not
    /// query_timeout's).
    #[inline(always)]
    pub(super) fn client_active(&mut self) {
        if self.idle_kind().is_some_and(|k| k != IdleKind::Query) {
            self.idle = None;
        }
    }

    /// The idle clock went off and was dealt with: the next turn arms it
    /// again if it still applies.
    pub(super) fn idle_done(&mut self) {
        self.idle = None;
    }

    /// The idle and the transaction clock, for the poll.
    #[inline(always)]
    pub(super) fn timers(&mut self) -> (Option<Pin<&mut Sleep>>, Option<Pin<&mut Sleep>>) {
        (
            self.idle.as_mut().map(|(_, t)| t.as_mut()),
            self.transaction.as_mut().map(|t| t.as_mut()),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn all_limits() -> Limits {
        Limits {
            query: 7 * S,
            client_idle: 5 * S,
            idle_transaction: 3 * S,
            transaction: 11 * S,
            fast_close: true,
        }
    }

    /// Clocks with every limit set and nothing armed yet.
    fn clocks() -> Clocks {
        Clocks {
            limits: all_limits(),
            idle: None,
            query_cycle: 0,
            query_deadline: None,
            transaction: None,
            xact_mark: 0,
            replica_mark: None,
            message: None,
        }
    }

    #[test]
    fn a_replica_is_silent_only_after_a_whole_look_without_an_answer() {
        let mut c = clocks();
        assert!(
            !c.replica_silent(10),
            "the first look has nothing to compare"
        );
        assert!(!c.replica_silent(25), "it answered since");
        assert!(c.replica_silent(25));
        assert!(!c.replica_silent(26));
    }

    #[test]
    fn query_timeout_runs_while_replies_are_owed_whatever_else_holds() {
        let s = Standing {
            owed: true,
            unread_client: true,
            mid_message: true,
            in_transaction: true,
            ..Default::default()
        };
        assert_eq!(
            idle_clock(&s, &all_limits()),
            Some((IdleKind::Query, 7 * S))
        );
        // Without query_timeout, an unread client is looked at instead.
        let limits = Limits {
            query: Duration::ZERO,
            ..all_limits()
        };
        assert_eq!(
            idle_clock(&s, &limits),
            Some((IdleKind::Unread, UNREAD_LOOK))
        );
    }

    #[test]
    fn a_read_on_a_replica_looks_at_its_health_until_it_answers() {
        let s = Standing {
            owed: true,
            replica_owes: true,
            unread_client: true,
            ..Default::default()
        };
        assert_eq!(
            idle_clock(&s, &Limits::default()),
            Some((IdleKind::Replica, REPLICA_LOOK))
        );
        // With query_timeout too: its deadline bounds the looks.
        assert_eq!(
            idle_clock(&s, &all_limits()),
            Some((IdleKind::Replica, REPLICA_LOOK))
        );
    }

    #[tokio::test]
    async fn a_replica_read_keeps_query_timeouts_deadline() {
        let mut clocks = Clocks {
            limits: Limits {
                query: Duration::from_millis(300),
                ..all_limits()
            },
            ..clocks()
        };
        let waiting = Standing {
            owed: true,
            replica_owes: true,
            ..Default::default()
        };
        clocks.arm(&waiting, 0, 0);
        assert_eq!(clocks.idle_kind(), Some(IdleKind::Replica));
        let deadline = clocks.query_deadline.expect("query_timeout runs");
        // (the look comes at the deadline, not a second later)
        assert_eq!(
            clocks.idle.as_ref().map(|(_, t)| t.deadline()),
            Some(deadline)
        );
        assert!(!clocks.query_expired());
        // The replica answers: query_timeout goes on from the same start.
        let answered = Standing {
            replica_owes: false,
            ..waiting
        };
        clocks.arm(&answered, 0, 0);
        assert_eq!(clocks.idle_kind(), Some(IdleKind::Query));
        assert_eq!(
            clocks.idle.as_ref().map(|(_, t)| t.deadline()),
            Some(deadline)
        );
    }

    #[test]
    fn a_stalled_message_is_timed_even_with_no_timeout_set() {
        let s = Standing {
            mid_message: true,
            in_transaction: true,
            ..Default::default()
        };
        assert_eq!(
            idle_clock(&s, &Limits::default()),
            Some((IdleKind::Message, MESSAGE_STALL_TIMEOUT))
        );
    }

    #[test]
    fn idle_in_a_transaction_is_timed_only_when_nothing_is_owed() {
        let idle = Standing {
            in_transaction: true,
            ..Default::default()
        };
        assert_eq!(
            idle_clock(&idle, &all_limits()),
            Some((IdleKind::Transaction, 3 * S))
        );
        let limits = Limits {
            query: Duration::ZERO,
            ..all_limits()
        };
        let waiting = Standing { owed: true, ..idle };
        assert_eq!(idle_clock(&waiting, &limits), None);
        // Between transactions no clock runs.
        assert_eq!(idle_clock(&Standing::default(), &all_limits()), None);
    }

    #[test]
    fn a_pinned_client_between_transactions_has_client_idle_timeout() {
        let s = Standing {
            pinned_idle: true,
            session_at_rest: true,
            ..Default::default()
        };
        assert_eq!(
            idle_clock(&s, &all_limits()),
            Some((IdleKind::Client, 5 * S))
        );
        let limits = Limits {
            client_idle: Duration::ZERO,
            ..all_limits()
        };
        assert_eq!(idle_clock(&s, &limits), None);
    }

    #[test]
    fn a_session_at_rest_looks_for_fast_close_only_when_asked() {
        let s = Standing {
            session_at_rest: true,
            ..Default::default()
        };
        assert_eq!(
            idle_clock(&s, &all_limits()),
            Some((IdleKind::FastClose, FAST_CLOSE_POLL))
        );
        let limits = Limits {
            fast_close: false,
            ..all_limits()
        };
        assert_eq!(idle_clock(&s, &limits), None);
    }

    #[tokio::test]
    async fn query_timeout_starts_again_with_each_request() {
        let mut clocks = clocks();
        let owed = Standing {
            owed: true,
            ..Default::default()
        };
        clocks.arm(&owed, 0, 0);
        let first = clocks.idle.as_ref().map(|(_, t)| t.deadline());
        std::thread::sleep(Duration::from_millis(2));
        // The same request: the clock goes on.
        clocks.arm(&owed, 0, 0);
        assert_eq!(clocks.idle.as_ref().map(|(_, t)| t.deadline()), first);
        // The next request: it starts again.
        clocks.arm(&owed, 1, 0);
        let second = clocks.idle.as_ref().map(|(_, t)| t.deadline());
        assert!(second > first, "{second:?} after {first:?}");
        // A client message does not restart query_timeout's clock.
        clocks.client_active();
        assert_eq!(clocks.idle_kind(), Some(IdleKind::Query));
    }

    #[tokio::test]
    async fn the_transaction_clock_runs_from_a_transactions_start_to_its_end() {
        let mut clocks = clocks();
        let inside = Standing {
            in_transaction: true,
            ..Default::default()
        };
        clocks.arm(&inside, 0, 0);
        let started = clocks.transaction.as_ref().map(|t| t.deadline());
        assert!(started.is_some());
        std::thread::sleep(Duration::from_millis(2));
        clocks.arm(&inside, 1, 0);
        assert_eq!(clocks.transaction.as_ref().map(|t| t.deadline()), started);
        // It ended and the next one is already under way: a new clock.
        clocks.arm(&inside, 2, 1);
        let next = clocks.transaction.as_ref().map(|t| t.deadline());
        assert!(next > started);
        // Between transactions: none.
        clocks.arm(&Standing::default(), 3, 2);
        assert!(clocks.transaction.is_none());
    }

    #[tokio::test]
    async fn a_message_must_be_whole_within_its_time_however_it_trickles() {
        let mut clocks = clocks();
        let message = |end: u64, left: u64| Standing {
            mid_message: true,
            message_end: end,
            message_left: left,
            ..Default::default()
        };
        let start = tokio::time::Instant::now();
        // 1 MiB to come: 30 s of silence ends it, or 38 s in all.
        clocks.arm(&message(5000, 1 << 20), 0, 0);
        let (end, whole) = clocks.message.expect("the message's time");
        assert_eq!(end, 5000);
        let allowed = whole - start;
        assert!(
            allowed >= Duration::from_secs(38) && allowed < Duration::from_millis(38_500),
            "{allowed:?}"
        );
        // Its bytes restart the silence, never the whole time.
        std::thread::sleep(Duration::from_millis(2));
        clocks.client_active();
        clocks.arm(&message(5000, (1 << 20) - 1), 0, 0);
        assert_eq!(clocks.message, Some((5000, whole)));
        let deadline = clocks.idle.as_ref().map(|(_, t)| t.deadline());
        assert!(deadline.is_some_and(|d| d <= whole && d > start + MESSAGE_STALL_TIMEOUT));
        // The next message has a time of its own.
        clocks.client_active();
        clocks.arm(&message(9000, 10), 0, 0);
        assert!(
            clocks
                .message
                .is_some_and(|(end, at)| end == 9000 && at > whole - Duration::from_secs(8))
        );
    }
}
