//! Slots and new servers: a slot counts a server open or opening against
//! `pool_size` and the shared budgets; a slot is turned into a server by a
//! login, retried while the server looks like it is restarting.

use super::*;

/// How long a new server connection is retried while the server looks
/// like it is restarting (capped by server_login_retry).
pub(super) const RESTART_GRACE: Duration = Duration::from_secs(3);

/// Pause between those retries.
pub(super) const RESTART_POLL: Duration = Duration::from_millis(100);

/// Failures a restarting server gives: connection refused, or 57P03 ("the
/// database system is starting up / shutting down").
pub(super) fn is_transient(e: &login::LoginError) -> bool {
    match e {
        login::LoginError::Connect { source, .. } => {
            source.kind() == std::io::ErrorKind::ConnectionRefused
        }
        login::LoginError::Rejected { code, .. } => code == "57P03",
        _ => false,
    }
}

/// A counted slot being turned into a server. Dropped unused, it frees the
/// slot.
pub(super) struct SlotGuard<'a> {
    pool: &'a Pool,
    armed: bool,
}

impl Drop for SlotGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            let mut st = self.pool.lock();
            self.pool.free_slot(&mut st, false);
        }
    }
}

/// Times a connection opened for an address the pool has since left is
/// opened again before the acquire fails.
pub(super) const RETARGET_RETRIES: u32 = 3;

impl Pool {
    /// Counts a new server if the pool (plus reserve) and the shared limits
    /// allow.
    pub(super) fn take_slot(&self, st: &mut PoolState, use_reserve: bool) -> bool {
        let mut cap = st.settings.pool_size;
        if use_reserve {
            cap += st.settings.reserve_pool_size;
        }
        if st.total >= cap {
            return false;
        }
        if !self.db_limit.try_take() {
            return false;
        }
        if !self.user_limit.try_take() {
            self.db_limit.give_back();
            return false;
        }
        st.total += 1;
        true
    }

    pub(super) async fn open_on_slot(self: &Arc<Self>) -> Result<Lease, AcquireError> {
        let mut guard = SlotGuard {
            pool: self,
            armed: true,
        };
        let started = Mono::now();
        let mut retargeted = 0;
        loop {
            let (target, credential, retry) = {
                let st = self.lock();
                let retry = st.settings.server_login_retry.min(RESTART_GRACE);
                (st.target.clone(), st.credential.clone(), retry)
            };
            let mut opened = login::open(&target, &credential).await;
            // A server restarting refuses connections, then says it is
            // starting up, for a moment: the client waits that moment out
            // instead of getting an error; unless the pool moves to another
            // address meanwhile (a failover): then it tries that one.
            let mut moved = false;
            while let Err(e) = &opened
                && is_transient(e)
                && started.elapsed() + RESTART_POLL < retry
            {
                tokio::time::sleep(RESTART_POLL).await;
                if self.lock().target.addr != target.addr {
                    moved = true;
                    break;
                }
                opened = login::open(&target, &credential).await;
            }
            if moved && retargeted < RETARGET_RETRIES {
                retargeted += 1;
                continue;
            }
            match opened {
                Ok((server, reported)) => {
                    let id = server.id;
                    let local = server.local_addr;
                    match self.opened(server, reported, &target.addr) {
                        Some(lease) => {
                            guard.armed = false;
                            if self.settings().log_connections {
                                match local {
                                    Some(from) => {
                                        tracing::info!(db = %self.database, user = %self.user, server = id, "new connection to server (from {from})")
                                    }
                                    None => {
                                        tracing::info!(db = %self.database, user = %self.user, server = id, "new connection to server")
                                    }
                                }
                            }
                            return Ok(lease);
                        }
                        // The pool moved (the primary changed) while this
                        // connection was being opened: it was made for the
                        // old address, and is closed.
                        None if retargeted < RETARGET_RETRIES => retargeted += 1,
                        None => {
                            return Err(login::LoginError::Unsupported(
                                "the pool's server address keeps changing".into(),
                            )
                            .into());
                        }
                    }
                }
                Err(e) => {
                    let e = AcquireError::from(e);
                    // Out of descriptors says nothing of the server: other
                    // clients are not failed fast for it.
                    if !out_of_descriptors(&e) {
                        tracing::warn!(db = %self.database, user = %self.user, "server login failed: {e}");
                        self.lock().last_login_failure =
                            Some((Mono::now(), e.sqlstate().to_owned(), e.to_string()));
                    }
                    return Err(e);
                }
            }
        }
    }

    /// A server opened for `addr` joins the pool, unless the pool has moved
    /// to another address meanwhile (`None`: the server is dropped).
    pub(super) fn opened(
        self: &Arc<Self>,
        server: Box<ServerConn>,
        reported: Reported,
        addr: &crate::backend::target::ServerAddr,
    ) -> Option<Lease> {
        let mut st = self.lock();
        if st.target.addr != *addr {
            return None;
        }
        st.last_login_failure = None;
        if st.welcome.is_none() {
            st.welcome = Some(Arc::new(Welcome {
                tracked: server.params.clone(),
                reported,
            }));
        }
        st.active += 1;
        Some(self.lease(&mut st, server, Mono::now()))
    }

    /// A slot was freed: let the first waiter that can use it open a server.
    pub(super) fn free_slot(&self, st: &mut PoolState, _was_server: bool) {
        st.total = st.total.saturating_sub(1);
        self.db_limit.give_back();
        self.user_limit.give_back();
        self.grant_slots(st);
    }

    /// Hands the waiters at the front of the line a slot each while the
    /// pool has room: after a slot is freed, and after a RELOAD or SET
    /// that raised the pool size (otherwise a line that never empties
    /// would never get the new servers: a new server is opened on a
    /// client's first look only when nobody waits).
    pub(super) fn grant_slots(&self, st: &mut PoolState) {
        while !st.waiters.is_empty() && self.take_slot(st, false) {
            let Some(w) = st.waiters.pop_front() else {
                unreachable!("checked non-empty");
            };
            if w.tx.send(Grant::Slot).is_err() {
                // (gone meanwhile: the slot goes to the next one)
                st.total -= 1;
                self.db_limit.give_back();
                self.user_limit.give_back();
            }
        }
    }
}
