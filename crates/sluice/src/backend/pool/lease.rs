//! A server lent to a client (`Lease`) and its way back: released clean to
//! the next waiter or the idle list, or closed. Dropping a lease without
//! releasing closes the server, so no path can leak a slot or a dirty
//! server. Also the rows SHOW SERVERS prints for servers lent.

use super::*;

/// One row of SHOW SERVERS.
#[derive(Debug, Clone)]
pub struct ServerRow {
    pub id: u64,
    /// Made before the last RECONNECT: closes when released.
    pub close_needed: bool,
    pub remote_pid: i32,
    pub created: std::time::SystemTime,
    pub local: Option<std::net::SocketAddr>,
    pub active: bool,
    /// Shared statements prepared on it (as of the lease, when lent).
    pub prepared_statements: usize,
    /// The TLS session, as SHOW SERVERS prints it (None: plain).
    pub tls: Option<Arc<str>>,
    /// Its host in the target's list (see `ServerConn::alternate`).
    pub alternate: u8,
    /// When it was last lent (idle) or was lent (active).
    pub used: Mono,
    generation: u64,
}

impl ServerRow {
    pub(super) fn of(server: &ServerConn, active: bool) -> Self {
        Self {
            id: server.id,
            close_needed: false,
            remote_pid: server.key.process_id,
            created: server.created_wall,
            local: server.local_addr,
            active,
            prepared_statements: server.statements.len(),
            tls: server.tls.clone(),
            alternate: server.alternate,
            used: if active {
                server.lent_at
            } else {
                server.last_used
            },
            generation: 0,
        }
    }
}

pub(super) fn forget_lent(st: &mut PoolState, id: u64) {
    if let Some(i) = st.lent.iter().position(|r| r.id == id) {
        st.lent.swap_remove(i);
    }
}

/// A server lent to a client. Release it with `Pool::release`; if dropped
/// instead, the server is closed and its slot freed.
pub struct Lease {
    /// What the client did with the server, added to the pool's totals on
    /// release.
    pub stats: TxStats,
    pool: Arc<Pool>,
    server: Option<Box<ServerConn>>,
    generation: u64,
    /// Settings as of the lease, read under the lock already taken to hand
    /// the server out.
    pub settings: Arc<PoolSettings>,
}

impl Lease {
    /// Its server was marked to close (RECONNECT, or a RELOAD that changed
    /// where or how servers connect) since it was lent.
    pub fn stale(&self) -> bool {
        self.pool.lock().generation != self.generation
    }

    /// The query to check its server with before use, if it is due
    /// (`server_check_query` after `server_check_delay` idle).
    pub fn check_due(&self) -> Option<&str> {
        let s = &self.settings;
        let server = self.server.as_ref()?;
        if s.server_check_query.is_empty()
            || server.lent_at.saturating_duration_since(server.last_used) < s.server_check_delay
        {
            return None;
        }
        Some(match s.server_check_query.as_str() {
            "<empty>" => "",
            sql => sql,
        })
    }

    /// Whether its server said at login it is a standby.
    pub fn standby(&self) -> bool {
        self.server.as_ref().is_some_and(|s| s.standby)
    }

    /// The pool's host index (see `Pool::host`).
    pub fn host(&self) -> u32 {
        self.pool.host
    }

    /// Moves the server to the calling worker's event loop if it lives on
    /// another; a server that cannot be moved is closed.
    pub fn localize(&mut self) -> std::io::Result<()> {
        let Some(server) = self.server.take() else {
            return Ok(());
        };
        if server.home_worker == current_worker() {
            self.server = Some(server);
            return Ok(());
        }
        let id = server.id;
        match server.move_to_current_worker() {
            Ok(s) => {
                self.server = Some(s);
                Ok(())
            }
            Err(e) => {
                // The socket is gone with the error; free its slot.
                self.pool.forget_active(id);
                Err(e)
            }
        }
    }

    #[cfg(test)]
    pub(super) fn server_id(&self) -> u64 {
        self.server.as_ref().map_or(0, |s| s.id)
    }

    pub fn server(&mut self) -> &mut ServerConn {
        self.server
            .as_mut()
            .expect("a lease holds its server until released")
    }

    /// Returns a clean server (ReadyForQuery 'I', nothing in flight).
    pub fn release(mut self) {
        if let Some(s) = self.server.take() {
            self.pool.put_back(s, self.generation, &self.stats);
        }
    }

    /// Closes the server: it cannot be proven clean.
    pub fn close(mut self) {
        if let Some(s) = self.server.take() {
            self.pool.discard(s, true, Closing::Unclean);
        }
    }

    /// Closes the server after asking PostgreSQL to cancel what it runs.
    /// For a server whose client left (or was killed, or timed out) in
    /// the middle of a query: closed alone, it would run the query to its
    /// end outside the pool's count, and a client that starts long
    /// queries and leaves, again and again, would take PostgreSQL's
    /// connections past `pool_size` and `max_db_connections`. The cancel
    /// runs in a task of its own, holding the lease (and its slot) until
    /// PostgreSQL has signalled the backend (at most `cancel_wait_timeout`):
    /// the client is told why it ends at once, however slow the host.
    pub fn cancel_then_close(self) {
        let Some(cancel) = self.cancel_request() else {
            return self.close();
        };
        tokio::spawn(async move {
            if let Err(e) = cancel.await {
                tracing::info!(db = %self.pool.database, "the query of a client that left could not be cancelled: {e}");
            }
            self.close();
        });
    }

    /// Asks PostgreSQL to cancel what the server runs without waiting for
    /// it: for a server that may not answer for long (a replica taken out
    /// of rotation; the request waits in its listen queue until it does).
    pub fn cancel_detached(&self) {
        if let Some(cancel) = self.cancel_request() {
            let database = self.pool.database.clone();
            tokio::spawn(async move {
                if let Err(e) = cancel.await {
                    tracing::info!(db = %database, "a query left on a server that does not answer could not be cancelled: {e}");
                }
            });
        }
    }

    /// The CancelRequest for the server's backend, sent when awaited.
    fn cancel_request(
        &self,
    ) -> Option<impl std::future::Future<Output = std::io::Result<()>> + Send + 'static> {
        let server = self.server.as_ref()?;
        let (settings, target) = self.pool.settings_and_target();
        let addr = target
            .alternates
            .addrs
            .get(usize::from(server.alternate))
            .unwrap_or(&target.addr)
            .clone();
        let key = server.key;
        Some(async move {
            crate::backend::cancel_request::send_cancel(
                &target,
                &addr,
                key,
                settings.cancel_wait_timeout,
            )
            .await
        })
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(s) = self.server.take() {
            self.pool.discard(s, true, Closing::Unclean);
        }
    }
}

/// Why the pool closes a server: PgBouncer's `closing because:` reasons
/// where it has one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Closing {
    /// Idle past `server_idle_timeout`.
    IdleTimeout,
    /// Older than `server_lifetime`.
    Lifetime,
    /// Above the pool size (a RELOAD shrank it).
    TooMany,
    /// Its address or login settings changed (RELOAD, a failover).
    ConfigChanged,
    /// Marked by RECONNECT (or KILL) while it was lent.
    CloseNeeded,
    /// Its pool was taken out of use (a RELOAD dropped the database).
    Retired,
    /// Closed to give its unit of a shared budget to another pool.
    Evicted,
    /// PAUSE closes the idle servers once nothing is lent.
    Paused,
    /// Shutdown.
    ShuttingDown,
    /// The server ended its connection while idle.
    ClosedWhileIdle,
    /// Given back with a send still in flight.
    Unsettled,
    /// Given back unproven: lost, broken or left mid-request.
    Unclean,
}

impl Closing {
    pub fn text(self) -> &'static str {
        match self {
            Self::IdleTimeout => "server idle timeout",
            Self::Lifetime => "server lifetime over",
            Self::TooMany => "too many servers in the pool",
            Self::ConfigChanged => "database configuration changed",
            Self::CloseNeeded => "close_needed",
            Self::Retired => "database removed",
            Self::Evicted => "evicted",
            Self::Paused => "pause mode",
            Self::ShuttingDown => "shutting down",
            Self::ClosedWhileIdle => "server conn crashed?",
            Self::Unsettled => "released with a send in flight",
            Self::Unclean => "server not clean (lost, broken or left mid-request)",
        }
    }
}

impl Pool {
    pub(super) fn lease(
        self: &Arc<Self>,
        st: &mut PoolState,
        mut server: Box<ServerConn>,
        now: Mono,
    ) -> Lease {
        // In the server, not the lease: a lease moves often, and every
        // byte more of it is copied each time.
        server.lent_at = now;
        let mut row = ServerRow::of(&server, true);
        row.generation = st.generation;
        st.lent.push(row);
        Lease {
            stats: TxStats::default(),
            pool: self.clone(),
            server: Some(server),
            generation: st.generation,
            settings: st.settings.clone(),
        }
    }

    pub(super) fn take_idle(self: &Arc<Self>, st: &mut PoolState, now: Mono) -> Option<Lease> {
        let worker = current_worker();
        let round_robin = st.settings.server_round_robin;
        while let Some(server) = if round_robin {
            st.idle.remove_oldest()
        } else {
            st.idle.pop_for(worker)
        } {
            let too_old = !st.settings.server_lifetime.is_zero()
                && now.saturating_duration_since(server.created) >= st.settings.server_lifetime;
            if too_old {
                self.close_counted(st, server, Closing::Lifetime);
                continue;
            }
            if server.closed_while_idle() {
                self.close_counted(st, server, Closing::ClosedWhileIdle);
                continue;
            }
            st.active += 1;
            return Some(self.lease(st, server, now));
        }
        None
    }

    /// Returns a server from a lease: to the first waiter, else to the idle
    /// stack.
    pub(super) fn put_back(&self, mut server: Box<ServerConn>, generation: u64, stats: &TxStats) {
        if !server.stream.settled() {
            // A send of its is still queued or in the kernel (io_uring):
            // it cannot go to another worker. Not expected (the server
            // answered everything sent), so it is simply closed.
            tracing::debug!(
                "server {} released with a send in flight: closed",
                server.id
            );
            self.lock().stats.add(stats);
            self.discard(server, true, Closing::Unsettled);
            return;
        }
        // The relay sets it as it ends (its own clock read); else now.
        if server.last_used <= server.lent_at {
            server.last_used = Mono::now();
        }
        let mut st = self.lock();
        // (a relay's end read before another's release: never backwards)
        st.last_used = st.last_used.max(server.last_used);
        st.stats.add(stats);
        forget_lent(&mut st, server.id);
        st.active = st.active.saturating_sub(1);
        // (the clock read just above serves: one read a release)
        let too_old = !st.settings.server_lifetime.is_zero()
            && server.last_used.saturating_duration_since(server.created)
                >= st.settings.server_lifetime;
        let over_size = st.total > st.settings.pool_size + st.settings.reserve_pool_size;
        // Above the pool size (a RELOAD shrank it): close, even with clients
        // waiting; they get the servers that remain.
        let why = if st.retired {
            Some(Closing::Retired)
        } else if generation != st.generation {
            Some(Closing::CloseNeeded)
        } else if too_old {
            Some(Closing::Lifetime)
        } else if over_size {
            Some(Closing::TooMany)
        } else {
            None
        };
        if let Some(why) = why {
            self.close_counted(&mut st, server, why);
            return;
        }
        while let Some(w) = st.waiters.pop_front() {
            match w.tx.send(Grant::Server(server)) {
                Ok(()) => {
                    st.active += 1;
                    return;
                }
                Err(Grant::Server(s)) => server = s,
                Err(Grant::Slot | Grant::Expired) => unreachable!("sent a server"),
            }
        }
        st.idle.push(server);
    }

    /// A lent server vanished without a `ServerConn` to close.
    pub(super) fn forget_active(&self, id: u64) {
        let mut st = self.lock();
        forget_lent(&mut st, id);
        st.active = st.active.saturating_sub(1);
        self.free_slot(&mut st, true);
    }

    pub(super) fn discard(&self, server: Box<ServerConn>, was_active: bool, why: Closing) {
        let mut st = self.lock();
        forget_lent(&mut st, server.id);
        if was_active {
            st.active = st.active.saturating_sub(1);
        }
        self.close_counted(&mut st, server, why);
    }

    /// Closes a server (a Terminate first, if its socket takes it), frees
    /// its slot, and logs why (`log_disconnections`).
    pub(super) fn close_counted(
        &self,
        st: &mut PoolState,
        mut server: Box<ServerConn>,
        why: Closing,
    ) {
        if st.settings.log_disconnections {
            tracing::info!(
                db = %self.database,
                user = %self.user,
                server = server.id,
                "closing because: {} (age={}s)",
                why.text(),
                server.created.elapsed().as_secs()
            );
        }
        server.stream.try_send_last(&[b'X', 0, 0, 0, 4]);
        drop(server);
        self.free_slot(st, true);
    }

    /// Servers lent and idle (SHOW SERVERS).
    pub fn servers(&self) -> Vec<ServerRow> {
        let st = self.lock();
        let mut rows = st.lent.clone();
        for r in &mut rows {
            r.close_needed = r.generation != st.generation;
        }
        st.idle.for_each(|s| rows.push(ServerRow::of(s, false)));
        rows
    }

    /// Servers lent before the last RECONNECT, still to be closed.
    pub fn close_pending(&self) -> usize {
        let st = self.lock();
        st.lent
            .iter()
            .filter(|r| r.generation != st.generation)
            .count()
    }
}
