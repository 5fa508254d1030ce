//! The janitor's work on a pool: idle servers past their timeouts or
//! beyond `min_pool_size`'s need, RECONNECT, retiring a pool out of use,
//! and giving idle servers up to another pool's shared budget.

use super::*;

impl Pool {
    /// Marks the pool retired if it has had no client (nor a login on its
    /// way), no lent server, no server being opened and no waiter for
    /// `timeout` (autodb_idle_timeout), and none at all with
    /// `without_servers`: the check and the mark under one lock, so a
    /// client that joins meanwhile keeps it alive. Its servers are left to
    /// `retire`.
    pub fn mark_retired_if_unused(&self, timeout: Duration, without_servers: bool) -> bool {
        let mut st = self.lock();
        let opening = st.total as usize > st.active as usize + st.idle.len();
        if (without_servers && st.total > 0)
            || st.clients > 0
            || st.joining > 0
            || st.active > 0
            || opening
            || !st.waiters.is_empty()
            || st.last_used.elapsed() < timeout
        {
            return false;
        }
        st.retired = true;
        true
    }

    /// Closes every idle server and marks busy ones to close when released
    /// (RECONNECT).
    pub fn reconnect(&self) {
        let mut st = self.lock();
        st.generation += 1;
        let why = if st.retired {
            Closing::Retired
        } else {
            Closing::CloseNeeded
        };
        for s in st.idle.drain() {
            self.close_counted(&mut st, s, why);
        }
    }

    /// Takes the pool out of use (a RELOAD replaced its cluster): idle
    /// servers close now, lent ones when they come back, and none is kept
    /// idle again (a client that still held the pool may lease once more;
    /// that server closes on release too).
    pub fn retire(&self) {
        self.lock().retired = true;
        self.reconnect();
    }

    /// No client waits and no server is open or lent (a retired pool is
    /// done).
    pub fn drained(&self) -> bool {
        let st = self.lock();
        st.waiters.is_empty() && st.total == 0
    }

    pub fn maintain(
        self: &Arc<Self>,
        spawn: impl Fn(std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>),
    ) {
        let mut st = self.lock();
        expire_waiters(&mut st);
        let s = st.settings.clone();
        let life_expired = |server: &ServerConn| {
            !s.server_lifetime.is_zero() && server.created.elapsed() >= s.server_lifetime
        };
        let idle_expired = |server: &ServerConn| {
            !s.server_idle_timeout.is_zero() && server.last_used.elapsed() >= s.server_idle_timeout
        };
        let old = st.idle.take_expired(0, life_expired);
        // Idle timeouts stop at min_pool_size servers in all.
        let busy = st.total as usize - st.idle.len() - old.len();
        let keep_idle = (s.min_pool_size as usize).saturating_sub(busy);
        let unused = st.idle.take_expired(keep_idle, idle_expired);
        for server in old {
            self.close_counted(&mut st, server, Closing::Lifetime);
        }
        for server in unused {
            self.close_counted(&mut st, server, Closing::IdleTimeout);
        }
        // Above the pool's size (a RELOAD or SET shrank it): idle servers
        // close now, oldest first, as PgBouncer's janitor does; busy ones
        // close as they come back (`put_back`).
        let most = s.pool_size + s.reserve_pool_size;
        while s.pool_size > 0
            && st.total > most
            && let Some(server) = st.idle.remove_oldest()
        {
            self.close_counted(&mut st, server, Closing::TooMany);
        }
        let recent_failure = st
            .last_login_failure
            .as_ref()
            .is_some_and(|(at, _, _)| at.elapsed() < s.server_login_retry);
        let mut to_open = 0;
        while !recent_failure && st.total < s.min_pool_size && self.take_slot(&mut st, false) {
            to_open += 1;
        }
        drop(st);
        for _ in 0..to_open {
            let pool = self.clone();
            spawn(Box::pin(async move {
                if let Ok(lease) = pool.open_on_slot().await {
                    lease.release();
                }
            }));
        }
    }

    /// Makes room under a full shared budget by closing an idle server of
    /// another pool, if this pool itself could use the unit.
    pub(super) fn evict_for_limits(&self) {
        let room = {
            let st = self.lock();
            st.total < st.settings.pool_size && !st.waiters.is_empty()
        };
        if room {
            let _ = (self.db_limit.is_full() && self.db_limit.evict_idle(self))
                || (self.user_limit.is_full() && self.user_limit.evict_idle(self));
        }
    }

    /// Closes this pool's oldest idle server; true if there was one.
    pub fn close_oldest_idle(&self) -> bool {
        let mut st = self.lock();
        let Some(server) = st.idle.remove_oldest() else {
            return false;
        };
        self.close_counted(&mut st, server, Closing::Evicted);
        true
    }

    /// Closes all idle servers (PAUSE, shutdown).
    pub fn close_idle(&self, why: Closing) {
        let mut st = self.lock();
        let old = st.idle.drain();
        for s in old {
            self.close_counted(&mut st, s, why);
        }
    }
}
