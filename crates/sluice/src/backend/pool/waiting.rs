//! Clients waiting for a server: first in, first out, each with a place
//! in line and a channel its server (or a slot to open one) is handed
//! over on; `query_wait_timeout`, the reserve, shared limits and a lack of
//! descriptors decide how long and what for.

use super::*;

/// How often a client blocked only by a shared (db/user) limit looks again.
pub(super) const SHARED_LIMIT_RETRY: Duration = Duration::from_millis(50);

/// What a waiting client is handed.
pub(super) enum Grant {
    Server(Box<ServerConn>),
    /// Permission to open a server; the slot is already counted.
    Slot,
    /// query_wait_timeout passed (the janitor's `expire_waiters`; the
    /// waiter is out of the line already).
    Expired,
}

/// What an acquire tells its caller while it waits.
#[derive(Debug, Clone, Copy)]
pub enum Waiting {
    /// In line; the query's wait began then (`Waiter::since`).
    Queued(Mono),
    /// The wait reached `query_wait_notify`.
    Notice,
}

pub(super) struct Waiter {
    pub(super) id: u64,
    pub(super) tx: oneshot::Sender<Grant>,
    /// When the client's query began to wait (`query_wait_timeout` counts
    /// from there): its place in line, or earlier, when it waited out a
    /// PAUSE first.
    pub(super) since: Mono,
}

pub(super) enum FirstLook {
    Leased(Box<Lease>),
    Open,
    Failing(String, String),
    /// In line; the flag: the pool is retired (the janitor may no longer
    /// look at it, so the wait times itself).
    Wait(oneshot::Receiver<Grant>, u64, Arc<PoolSettings>, bool),
}

pub(super) enum Recheck {
    Slot,
    Wait,
    Expired,
}

pub(super) fn expire_waiters(st: &mut PoolState) {
    let wait = st.settings.query_wait_timeout;
    if wait.is_zero() {
        return;
    }
    let now = Mono::now();
    // Not only from the front: a query that waited out a PAUSE first
    // counts from before its place in line.
    let expired = |w: &Waiter| now.saturating_duration_since(w.since) >= wait;
    if !st.waiters.iter().any(expired) {
        return;
    }
    let (gone, kept): (std::collections::VecDeque<Waiter>, _) = std::mem::take(&mut st.waiters)
        .into_iter()
        .partition(expired);
    st.waiters = kept;
    for w in gone {
        // A waiter already gone (its future dropped) gets nothing.
        let _ = w.tx.send(Grant::Expired);
    }
}

/// How often a client waiting out a lack of descriptors looks again.
pub(super) const DESCRIPTOR_RETRY: Duration = Duration::from_millis(50);

/// A server connect failed because this process has no descriptor left.
pub(super) fn out_of_descriptors(e: &AcquireError) -> bool {
    matches!(
        e,
        AcquireError::Login(LoginError::Connect { source, .. })
            if matches!(source.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
    )
}

/// A waiter's receiver while `acquire` waits: if the future is dropped
/// (its caller gave up), a server or slot handed over meanwhile would be
/// lost with the receiver; this gives it back and leaves the line.
pub(super) struct WaitGuard<'a> {
    pool: &'a Arc<Pool>,
    rx: Option<oneshot::Receiver<Grant>>,
    id: u64,
}

impl Drop for WaitGuard<'_> {
    fn drop(&mut self) {
        let Some(mut rx) = self.rx.take() else {
            return;
        };
        rx.close();
        let grant = rx.try_recv().ok();
        let mut st = self.pool.lock();
        st.waiters.retain(|w| w.id != self.id);
        match grant {
            None | Some(Grant::Expired) => {}
            Some(Grant::Slot) => self.pool.free_slot(&mut st, false),
            Some(Grant::Server(server)) => {
                // Counted lent by the releaser: lent, then released, as a
                // lease would be.
                let lease = self.pool.lease(&mut st, server, Mono::now());
                drop(st);
                lease.release();
            }
        }
    }
}

impl Pool {
    /// First look: an idle server, a free slot, a recent login failure, or
    /// a place in line.
    /// `queued`: when the query began to wait (see `Waiter::since`).
    pub(super) fn first_look(
        self: &Arc<Self>,
        may_open: bool,
        now: Mono,
        queued: Mono,
    ) -> FirstLook {
        let mut st = self.lock();
        if let Some(lease) = self.take_idle(&mut st, now) {
            return FirstLook::Leased(Box::new(lease));
        }
        let settings = st.settings.clone();
        // After a failed login, wait server_login_retry before trying again;
        // meanwhile clients that would need a new server fail fast.
        if st.total == 0
            && let Some((at, code, msg)) = &st.last_login_failure
            && now.saturating_duration_since(*at) < settings.server_login_retry
        {
            return FirstLook::Failing(code.clone(), msg.clone());
        }
        if may_open && st.waiters.is_empty() && self.take_slot(&mut st, false) {
            return FirstLook::Open;
        }
        let (tx, rx) = oneshot::channel();
        st.next_waiter_id += 1;
        let id = st.next_waiter_id;
        // In the order the queries began to wait: one that waited out a
        // PAUSE keeps its place ahead of later ones (RESUME wakes them all
        // at once, in no sure order across workers).
        let at = if st.waiters.back().is_none_or(|w| w.since <= queued) {
            st.waiters.len()
        } else {
            st.waiters.partition_point(|w| w.since <= queued)
        };
        st.waiters.insert(
            at,
            Waiter {
                id,
                tx,
                since: queued,
            },
        );
        FirstLook::Wait(rx, id, settings, st.retired)
    }

    /// Takes an idle server, or a slot to open one, or waits in line. When
    /// a new server cannot be opened for lack of file descriptors, the
    /// client waits in line for a server another client releases (until
    /// `query_wait_timeout`) instead of failing.
    pub async fn acquire(self: &Arc<Self>) -> Result<Lease, AcquireError> {
        self.acquire_noticing(None, |_| {}).await
    }

    /// [`Pool::acquire`], telling `tell` once when the client queues (with
    /// the acquire's own clock read: its caller needs none) and once if
    /// the wait reaches `query_wait_notify` (on the timer the wait has
    /// anyway: a notice costs no timer of its own). `queued`: when the
    /// query began to wait, if before this call (a PAUSE waited out):
    /// `query_wait_timeout` counts from there, as PgBouncer counts it from
    /// the query's start.
    pub async fn acquire_noticing(
        self: &Arc<Self>,
        queued: Option<Mono>,
        mut tell: impl FnMut(Waiting),
    ) -> Result<Lease, AcquireError> {
        let started = Mono::now();
        let queued = queued.unwrap_or(started);
        let mut may_open = true;
        // Each told once per acquire, however many rounds it takes.
        let (mut told_queued, mut noticed) = (false, false);
        let mut notice_once = |w: Waiting| {
            let told = match w {
                Waiting::Queued(_) => &mut told_queued,
                Waiting::Notice => &mut noticed,
            };
            if !std::mem::replace(told, true) {
                tell(w);
            }
        };
        // The first round's clock is the acquire's; a later round (after
        // a failed open) reads its own, so that a server it finds idle is
        // stamped lent now, not when the client began to wait.
        let mut round = started;
        loop {
            match self
                .acquire_from(started, queued, round, may_open, &mut notice_once)
                .await
            {
                Err(e) if out_of_descriptors(&e) => {
                    if may_open {
                        tracing::warn!(
                            db = %self.database, user = %self.user,
                            "cannot open a server ({e}): the client waits for one in use"
                        );
                    }
                    may_open = false;
                    // A waiter may still be handed a slot, and the open fail
                    // again at once: look again at most every 50 ms, and no
                    // longer than query_wait_timeout.
                    let wait = self.settings().query_wait_timeout;
                    if !wait.is_zero() && queued.elapsed() >= wait {
                        return Err(AcquireError::WaitTimeout);
                    }
                    tokio::time::sleep(DESCRIPTOR_RETRY).await;
                    round = Mono::now();
                }
                other => return other,
            }
        }
    }

    pub(super) async fn acquire_from(
        self: &Arc<Self>,
        started: Mono,
        queued: Mono,
        round: Mono,
        may_open: bool,
        tell: &mut impl FnMut(Waiting),
    ) -> Result<Lease, AcquireError> {
        let (rx, waiter_id, settings, retired) = match self.first_look(may_open, round, queued) {
            FirstLook::Leased(mut l) => {
                // Zero on the first round (no clock read for it).
                l.stats.waited = round.saturating_duration_since(started);
                return Ok(*l);
            }
            // Boxed: opening a server is rare and its future is large.
            FirstLook::Open => return Box::pin(self.open_on_slot()).await,
            FirstLook::Failing(code, msg) => return Err(AcquireError::RecentFailure(code, msg)),
            FirstLook::Wait(rx, id, settings, retired) => {
                tell(Waiting::Queued(queued));
                (rx, id, settings, retired)
            }
        };
        // Dropped with the future (a caller that stops waiting): whatever
        // was handed over meanwhile goes back to the pool.
        let mut waiting = WaitGuard {
            pool: self,
            rx: Some(rx),
            id: waiter_id,
        };
        let wait_deadline =
            (!settings.query_wait_timeout.is_zero()).then(|| queued + settings.query_wait_timeout);
        let reserve_at =
            (settings.reserve_pool_size > 0).then(|| started + settings.reserve_pool_timeout);
        let shared_limit = self.db_limit.is_limited() || self.user_limit.is_limited();
        let mut notice_at =
            (!settings.query_wait_notify.is_zero()).then(|| started + settings.query_wait_notify);
        let mut first_round = true;
        // The first look's clock is this round's: one read fewer a wait.
        let mut fresh = true;
        loop {
            if shared_limit {
                // Another pool may sit on idle servers of the same budget.
                self.evict_for_limits();
            }
            // Wake up only for something that can change the answer: the
            // reserve opening, the deadline, or a shared limit to re-check.
            let now = if std::mem::take(&mut fresh) {
                round
            } else {
                Mono::now()
            };
            let mut next_check = now + Duration::from_secs(3600);
            if shared_limit {
                // Look again at once after an eviction, then now and then.
                let delay = if std::mem::take(&mut first_round) {
                    Duration::ZERO
                } else {
                    SHARED_LIMIT_RETRY
                };
                next_check = now + delay;
            }
            if let Some(r) = reserve_at.filter(|r| *r > now) {
                next_check = next_check.min(r);
            }
            // The deadline alone arms no timer: the janitor hands an
            // expired waiter `Grant::Expired` (within its tick). A timer per
            // wait cost about a tenth of a queued transaction's work.
            // A pool retired before the client queued may be out of the
            // janitor's sight (one retired later is kept in sight by its
            // waiters: `App::retiring_pools`).
            let timed =
                retired || next_check < now + Duration::from_secs(3600) || notice_at.is_some();
            if timed && let Some(d) = wait_deadline {
                next_check = next_check.min(d);
            }
            if let Some(n) = notice_at {
                if n <= now {
                    notice_at = None;
                    tell(Waiting::Notice);
                } else {
                    next_check = next_check.min(n);
                }
            }
            let Some(rx) = waiting.rx.as_mut() else {
                return Err(AcquireError::Closed);
            };
            let waited = if timed {
                tokio::time::timeout_at(next_check.to_tokio(), &mut *rx).await
            } else {
                Ok((&mut *rx).await)
            };
            let grant = match waited {
                Ok(Ok(grant)) => Some(grant),
                Ok(Err(_)) => {
                    waiting.rx = None;
                    return Err(AcquireError::Closed);
                }
                Err(_) => None,
            };
            let grant = match grant {
                Some(g) => g,
                None => match self.recheck(waiter_id, reserve_at, wait_deadline) {
                    // A grant sent between the timer and the recheck wins;
                    // the slot just taken goes back.
                    Recheck::Slot => {
                        rx.close();
                        match rx.try_recv() {
                            Ok(g) => {
                                let mut st = self.lock();
                                self.free_slot(&mut st, false);
                                g
                            }
                            Err(_) => Grant::Slot,
                        }
                    }
                    Recheck::Wait => continue,
                    Recheck::Expired => {
                        rx.close();
                        match rx.try_recv() {
                            Ok(g) => g,
                            Err(_) => {
                                waiting.rx = None;
                                return Err(AcquireError::WaitTimeout);
                            }
                        }
                    }
                },
            };
            // Taken: nothing is left for the guard to give back.
            waiting.rx = None;
            let mut lease = match grant {
                Grant::Server(s) => {
                    let now = Mono::now();
                    let mut st = self.lock();
                    // The releaser counted it active and removed it from
                    // `lent`; it is lent again here.
                    self.lease(&mut st, s, now)
                }
                Grant::Slot => Box::pin(self.open_on_slot()).await?,
                Grant::Expired => return Err(AcquireError::WaitTimeout),
            };
            lease.stats.waited = lease.server().lent_at.saturating_duration_since(started);
            return Ok(lease);
        }
    }

    /// A waiter's periodic look: the reserve, a shared limit that freed up,
    /// or the end of its patience.
    pub(super) fn recheck(
        &self,
        waiter_id: u64,
        reserve_at: Option<Mono>,
        wait_deadline: Option<Mono>,
    ) -> Recheck {
        let mut st = self.lock();
        let now = Mono::now();
        let use_reserve = reserve_at.is_some_and(|r| now >= r);
        let first = st.waiters.front().map(|w| w.id) == Some(waiter_id);
        if (first || use_reserve) && self.take_slot(&mut st, use_reserve) {
            st.waiters.retain(|w| w.id != waiter_id);
            return Recheck::Slot;
        }
        if wait_deadline.is_some_and(|d| now >= d) {
            st.waiters.retain(|w| w.id != waiter_id);
            return Recheck::Expired;
        }
        Recheck::Wait
    }

    /// Periodic upkeep: closes servers idle or alive too long, opens servers
    /// up to `min_pool_size`. Returns how many servers to open.
    /// Hands the waiters whose query_wait_timeout has passed
    /// `Grant::Expired` (waits arm no timer of their own for it). The
    /// line is in arrival order, so they are at its front.
    pub fn expire_waiters(&self) {
        let mut st = self.lock();
        expire_waiters(&mut st);
    }
}
