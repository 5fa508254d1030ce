//! The session loop of a logged-in client (its state is `client.rs`'s).
//! While idle it holds no server and almost no memory (its read buffer is
//! released); when bytes arrive it routes the request, gets a server from
//! the pool routing chose, and the relay moves bytes until the pool mode
//! says the server goes back.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use bytes::BytesMut;

use super::client::{Client, LOST_RETRIES, Listening, ReplicaWatch, RouteCache, Written};
use super::error::ClientError;
use super::relay::{self, RelayEnd};
use super::relay_io::READ_CHUNK;
use super::{parking, spare_buffers};
use crate::app::{App, Phase};
use crate::backend::pool::{AcquireError, Lease, Pool, Standby, Waiting};
use crate::clock::Mono;
use crate::net::Stream;
use sluice_config::ReadYourWrites;

/// The pool of host `i` of `topology` for `main`'s clients, from `hosts`
/// (a `RouteCache`'s) or looked up and kept there.
fn cached_host_pool(
    hosts: &mut Vec<Option<Arc<Pool>>>,
    topology: &Arc<crate::backend::topology::Topology>,
    app: &App,
    main: &Arc<Pool>,
    i: usize,
) -> Option<Arc<Pool>> {
    if let Some(Some(pool)) = hosts.get(i) {
        return Some(pool.clone());
    }
    let pool = app.host_pool(main, i, Some(topology))?;
    if hosts.len() <= i {
        hosts.resize(i + 1, None);
    }
    hosts[i] = Some(pool.clone());
    Some(pool)
}

/// Where a transaction goes (see `Client::route`).
struct Routed {
    pool: Arc<Pool>,
    /// The database's topology when it routes reads (looked up once per
    /// transaction).
    topology: Option<Arc<crate::backend::topology::Topology>>,
    /// It may write: remember its end for read-your-writes.
    may_write: bool,
    /// A replica whose last check is behind the client's last write: it
    /// serves the read only if it has replayed this far by now.
    verify: Option<u64>,
    /// The router found the request reads only (wherever it goes).
    read: bool,
    /// On a replica: its index in the topology, the position it has
    /// replayed as far as routing knows, and `replica_max_lag`.
    replica: Option<(usize, u64, Duration)>,
    /// The entry wants a replica (`target_session_attrs`) and none
    /// qualifies now: wait for one.
    standby_wait: bool,
}

/// How long a read after a write may wait for a replica to replay that
/// write before it goes to the primary instead.
const REPLAY_WAIT: Duration = Duration::from_millis(20);

/// Longest wait for a client to take a notification.
const NOTIFY_WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest wait for a client to take the replies to a batch answered
/// without a server (it holds none meanwhile).
const LOCAL_WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// How a session ended.
#[derive(Debug)]
pub enum SessionEnd {
    /// The client said Terminate or closed its socket.
    ClientLeft,
    Error(ClientError),
    /// Idle long enough to give its task up (`parking`): the client goes
    /// on in a new task when it sends something.
    Park,
}

impl Client {
    /// The pool this request's transaction runs on: a replica's when the
    /// database routes reads, the request provably only reads and a
    /// replica is up and caught up (with the client's own last write, for
    /// read-your-writes); otherwise the client's own pool (the primary).
    /// LISTEN and session mode always use the primary.
    fn route(&mut self, buf: &[u8]) -> Routed {
        if !self.app.routing_anywhere() {
            // (nothing kept alive that RELOAD took out of use)
            if self.route_cache.is_some() {
                self.route_cache = None;
            }
            return Routed {
                pool: self.pool.clone(),
                topology: None,
                may_write: false,
                verify: None,
                read: false,
                replica: None,
                standby_wait: false,
            };
        }
        let kept_pooled = self.kept_pooled();
        let epoch = self.app.route_epoch();
        if self.route_cache.as_ref().is_none_or(|c| c.epoch != epoch) {
            self.route_cache = Some(Box::new(RouteCache {
                epoch,
                topology: self.app.topology(&self.pool.database),
                settings: self.pool.settings(),
                limits: self.app.read_limits(),
                hosts: Vec::new(),
            }));
        }
        let Some(cache) = self.route_cache.as_deref_mut() else {
            unreachable!("filled above");
        };
        let primary = |may_write| Routed {
            pool: self.pool.clone(),
            topology: cache.topology.clone(),
            may_write,
            verify: None,
            read: false,
            replica: None,
            standby_wait: false,
        };
        let Some(topology) = cache.topology.clone() else {
            return primary(false);
        };
        if self.force_primary {
            // A "read" a replica refused: it writes.
            return primary(true);
        }
        let listening = self.carried.as_ref().is_some_and(|c| c.listen.is_some());
        let (limits, ryw) = cache.limits;
        let settings = cache.settings.clone();
        if settings.standby != Standby::No && !listening {
            // The entry asks for standbys: every transaction (every
            // session in session mode) on a replica, whatever it is.
            let picked = topology.pick_replica(limits, None);
            return match picked.and_then(|i| {
                cached_host_pool(&mut cache.hosts, &topology, &self.app, &self.pool, i)
            }) {
                Some(pool) => Routed {
                    pool,
                    ..primary(false)
                },
                None if settings.standby == Standby::Prefer => primary(false),
                None => Routed {
                    standby_wait: true,
                    ..primary(false)
                },
            };
        }
        let session = self.carried.as_ref().and_then(|c| c.session.as_deref());
        // (a client kept in transaction mode after a RELOAD to session
        // mode is routed as one: its writes count for its reads; review 42)
        if listening
            || !topology.reads
            || (settings.mode == sluice_config::PoolMode::Session && !kept_pooled)
        {
            return primary(false);
        }
        if let Some(until) = self.replicas_after {
            if std::time::Instant::now() < until {
                return primary(false);
            }
            self.replicas_after = None;
        }
        if session.is_some_and(crate::session_vars::SessionVars::keeps_reads_on_primary) {
            // (its writes count for read-your-writes: once it lets reads
            // go to replicas again, the next one must see them)
            return primary(true);
        }
        if crate::params::ascii_in_multibyte(&self.params) {
            // (sluice cannot tell where its strings end: a write may hide
            // in what reads as a SELECT)
            return primary(true);
        }
        let carried = self.carried.as_deref();
        let named = |name: &[u8]| carried?.statements.get(name).cloned();
        let own = topology.classifier();
        if super::route::request(buf, own.as_deref(), named) == sluice_router::Route::Primary {
            return primary(true);
        }
        if carried.is_some_and(|c| c.deferred_begin.is_some())
            && super::route::mentions_transaction(buf)
        {
            // The first request of a READ ONLY block sluice opened without
            // a server may change the block (`SET TRANSACTION READ WRITE`,
            // `ISOLATION LEVEL SERIALIZABLE`, a snapshot), which a standby
            // refuses: the block opens on the primary.
            return primary(true);
        }
        // From now on its writes are worth the read-your-writes position.
        self.reads_routed = true;
        let read_on_primary = || Routed {
            read: true,
            ..primary(false)
        };
        // Read-your-writes: a replica must have replayed the client's last
        // write: its position read right after it, or else the primary's
        // first check after it.
        let min_lsn = match self.last_write {
            Some(w) if ryw != ReadYourWrites::Off => match w
                .lsn
                .map(|l| topology.commit_position(l))
                .or_else(|| topology.primary_lsn_after(w.at))
            {
                Some(lsn) => Some(lsn),
                None => {
                    topology.reads_on_primary.fetch_add(1, Relaxed);
                    return read_on_primary();
                }
            },
            _ => None,
        };
        // Read-your-writes across clients: past every write that ended
        // before this read, whoever wrote.
        let min_lsn = match ryw {
            ReadYourWrites::Database => match topology.database_position() {
                Some(theirs) => min_lsn.max(theirs),
                None => {
                    topology.reads_on_primary.fetch_add(1, Relaxed);
                    return read_on_primary();
                }
            },
            _ => min_lsn,
        };
        // A replica known to be past it; else one that may be by now.
        let (picked, verify) = match topology.pick_replica(limits, min_lsn) {
            Some(i) => (Some(i), None),
            None if min_lsn.is_some() && topology.replay_wait_worthwhile() => {
                (topology.pick_replica(limits, None), min_lsn)
            }
            None => (None, None),
        };
        match picked
            .and_then(|i| cached_host_pool(&mut cache.hosts, &topology, &self.app, &self.pool, i))
        {
            Some(pool) => Routed {
                pool,
                topology: Some(topology.clone()),
                may_write: false,
                verify,
                read: true,
                replica: picked.map(|i| (i, min_lsn.unwrap_or(0), limits.time)),
                standby_wait: false,
            },
            None => {
                topology.reads_on_primary.fetch_add(1, Relaxed);
                read_on_primary()
            }
        }
    }

    /// A replica lease for a read that must see `lsn`: kept if the replica
    /// replays that far within `REPLAY_WAIT`, else given back (`None`: the
    /// read goes to the primary).
    async fn replayed(
        &self,
        mut lease: Lease,
        lsn: u64,
        topology: Option<&crate::backend::topology::Topology>,
    ) -> Option<Lease> {
        const SQL: &str = "select pg_catalog.pg_last_wal_replay_lsn()";
        let deadline = tokio::time::Instant::now() + REPLAY_WAIT;
        let missed = || {
            if let Some(t) = topology {
                t.note_replay_missed();
            }
        };
        loop {
            let check = crate::backend::login::run_query_rows(lease.server(), SQL);
            let rows = match tokio::time::timeout(REPLAY_WAIT, check).await {
                Ok(Ok(rows)) => rows,
                _ => {
                    lease.close();
                    missed();
                    return None;
                }
            };
            let replayed = rows
                .first()
                .and_then(|r| r.first())
                .and_then(|v| v.as_deref())
                .and_then(crate::backend::topology::parse_lsn);
            if replayed.is_some_and(|r| r >= lsn) {
                return Some(lease);
            }
            if tokio::time::Instant::now() >= deadline {
                lease.release();
                missed();
                return None;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Whether the clients' pool points at the primary the checks found
    /// (none while a failover is under way or two hosts claim the role on
    /// one timeline).
    fn primary_settled(&self, topology: &crate::backend::topology::Topology) -> bool {
        topology
            .primary()
            .is_some_and(|(_, addr)| self.pool.addr() == addr)
    }

    /// A transaction for the primary of a database that routes reads, when
    /// there is no settled primary or it is unreachable (a failover, a
    /// restart; `first` says why): waits up to `failover_hold` for the
    /// checks to find one, trying it each time they do, instead of failing
    /// the transaction. The pool follows the new primary on its own.
    /// A client that closes its end meanwhile ends the hold: its request
    /// is never sent (when the primary is back, clients gone on their own
    /// timeouts would otherwise all run at once).
    async fn hold_for_primary(&self, first: Option<AcquireError>) -> Result<Lease, SessionEnd> {
        match unless_closed(&self.stream, self.hold_for_primary_open(first)).await {
            Some(held) => held.map_err(SessionEnd::Error),
            None => Err(SessionEnd::ClientLeft),
        }
    }

    async fn hold_for_primary_open(
        &self,
        first: Option<AcquireError>,
    ) -> Result<Lease, ClientError> {
        let fail = |e: &AcquireError| ClientError::new(e.sqlstate(), e.to_string());
        let topology = self.app.topology(&self.pool.database);
        let config = self.app.config();
        let s = &config.settings;
        // Before the first checks have come back (a new topology) there is
        // nothing to fail over from: wait for them whatever the hold.
        let first_checks = topology.as_ref().is_some_and(|t| !t.checked());
        let hold = if first_checks {
            s.failover_hold
                .max(s.health_check_timeout + s.health_check_period)
        } else {
            s.failover_hold
        };
        let (Some(topology), false) = (topology, hold.is_zero()) else {
            return match first {
                Some(e) => Err(fail(&e)),
                None => Err(no_primary(self.database(), hold, "no primary")),
            };
        };
        let why = first
            .as_ref()
            .map_or("no primary known".to_owned(), |e| e.to_string());
        tracing::info!(
            user = %self.user(), db = %self.database(),
            "holding a transaction up to {hold:?} for the primary ({why})"
        );
        let deadline = tokio::time::Instant::now() + hold;
        let mut last = why;
        let mut first_pass = first.is_none();
        while self.app.phase() < Phase::WaitForServers {
            let now = tokio::time::Instant::now();
            if now >= deadline {
                break;
            }
            if !std::mem::take(&mut first_pass) {
                tokio::time::sleep((deadline - now).min(HOLD_POLL)).await;
            }
            if !self.primary_settled(&topology) {
                continue;
            }
            self.pool.forget_login_failure();
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match tokio::time::timeout(left, self.pool.acquire()).await {
                Ok(Ok(lease)) if lease.standby() => {
                    lease.close();
                    last = standby_error(&self.pool).to_string();
                }
                Ok(Ok(lease)) => return Ok(lease),
                Ok(Err(e)) if unreachable(&e) => last = e.to_string(),
                Ok(Err(e)) => return Err(fail(&e)),
                Err(_) => break,
            }
        }
        Err(no_primary(self.database(), hold, &last))
    }

    /// A replica's pool for an entry that asks for standbys
    /// (`target_session_attrs`) when none qualifies: waits up to
    /// `failover_hold` for one (a switchover, a lagging replica), unless
    /// the client closes its end meanwhile.
    async fn wait_for_standby(&self) -> Result<Arc<Pool>, SessionEnd> {
        match unless_closed(&self.stream, self.wait_for_standby_open()).await {
            Some(found) => found.map_err(SessionEnd::Error),
            None => Err(SessionEnd::ClientLeft),
        }
    }

    async fn wait_for_standby_open(&self) -> Result<Arc<Pool>, ClientError> {
        let hold = self.app.config().settings.failover_hold;
        let deadline = tokio::time::Instant::now() + hold;
        loop {
            if let Some(topology) = self.app.topology(&self.pool.database) {
                let (limits, _) = self.app.read_limits();
                if let Some(pool) = topology
                    .pick_replica(limits, None)
                    .and_then(|i| self.app.host_pool(&self.pool, i, Some(&topology)))
                {
                    return Ok(pool);
                }
            }
            if tokio::time::Instant::now() >= deadline || self.app.phase() >= Phase::WaitForServers
            {
                return Err(ClientError::new(
                    "08006",
                    format!(
                        "no standby of database \"{}\" within the lag limits for failover_hold ({hold:?}) \
                         (target_session_attrs asks for one)",
                        self.database()
                    ),
                ));
            }
            tokio::time::sleep(HOLD_POLL).await;
        }
    }

    /// Serves one request: a server from the pool, then the relay until
    /// the server goes back. `None`: the client goes on. Boxed by the
    /// caller, so its state exists only while a request is served.
    async fn serve_request(&mut self, buf: &mut BytesMut) -> Option<SessionEnd> {
        if buf.first() == Some(&sluice_wire::tags::frontend::TERMINATE) {
            return Some(SessionEnd::ClientLeft);
        }
        // In a READ ONLY block sluice answered without a server, the client
        // is in a transaction: PAUSE and a safe shutdown wait for it (they
        // count `DeferredBlock`s), so it goes on through them.
        let deferred = self
            .carried
            .as_ref()
            .and_then(|c| c.deferred_begin.as_ref());
        if let Some(block) = deferred {
            // (idle in its block: what the relay's clock would have said)
            let limit = self.pool.settings().idle_transaction_timeout;
            if !limit.is_zero() && block.since.elapsed() > limit {
                return Some(SessionEnd::Error(ClientError::new(
                    "25P03",
                    "idle transaction timeout",
                )));
            }
        }
        let deferred = deferred.is_some();
        if self.app.phase() >= Phase::WaitForServers && !deferred {
            return Some(SessionEnd::Error(ClientError::new(
                "57P01",
                "server shutting down",
            )));
        }
        // When the query began to wait, if it waited out a pause (or a
        // pause sent it back from the pool's line): its query_wait_timeout
        // counts from there in the pool's line and out a pause too.
        let mut queued = self.queued_since.take();
        // (Waiting, in SHOW CLIENTS, out a pause too, as on PgBouncer.)
        self.app.cancels.set_waiting(self.cancel, true);
        // (in a block sluice opened without a server, a cancel would
        // leave it failed, which sluice does not follow: the request runs)
        let cancellable = !deferred && cancellable(buf);
        if self.app.control.anything_paused() && !deferred {
            match self.wait_while_paused(queued, cancellable).await {
                Ok(Paused::Over(since)) => queued = since,
                Ok(Paused::Cancelled) => {
                    self.app.cancels.set_waiting(self.cancel, false);
                    return self.answer_cancelled_wait(buf).await;
                }
                Err(end) => return Some(end),
            }
        }
        let Routed {
            mut pool,
            topology,
            may_write,
            verify,
            read,
            replica,
            standby_wait,
        } = self.route(buf);
        if pool.host != 0
            && !deferred
            && self.may_defer_begin(buf)
            && let Some(block) = self.count_block(buf)
        {
            self.app.cancels.set_waiting(self.cancel, false);
            return self.defer_begin(buf, block).await;
        }
        if standby_wait {
            match self.wait_for_standby().await {
                Ok(p) => pool = p,
                Err(end) => {
                    self.app.cancels.set_waiting(self.cancel, false);
                    return Some(end);
                }
            }
        }
        let mut lease = None;
        if let Some(lsn) = verify {
            // A read after a write, on a replica that may not have it yet.
            let acquired = tokio::select! {
                biased;
                got = pool.acquire() => got,
                () = self.app.cancels.wait_cancelled(self.cancel), if cancellable => {
                    self.app.cancels.set_waiting(self.cancel, false);
                    return self.answer_cancelled_wait(buf).await;
                }
            };
            if let Ok(mut l) = acquired
                && l.localize().is_ok()
            {
                lease = Box::pin(self.replayed(l, lsn, topology.as_deref())).await;
            }
            if let Some(t) = &topology {
                let counter = match lease {
                    Some(_) => &t.reads_on_replicas,
                    None => &t.reads_on_primary,
                };
                counter.fetch_add(1, Relaxed);
            }
            if lease.is_none() {
                pool = self.pool.clone();
            }
        } else if pool.host != 0
            && let Some(t) = &topology
        {
            t.reads_on_replicas.fetch_add(1, Relaxed);
        }
        let mut lease = match lease {
            Some(l) => l,
            None => {
                let gate = topology.as_ref().filter(|_| pool.host == 0);
                let acquired = if gate.is_some_and(|t| !self.primary_settled(t)) {
                    self.hold_for_primary(None).await
                } else {
                    match self.acquire_notifying(&pool, queued, cancellable).await {
                        // Its request is never sent.
                        Waited::Left => Err(SessionEnd::ClientLeft),
                        Waited::Cancelled => {
                            self.app.cancels.set_waiting(self.cancel, false);
                            return self.answer_cancelled_wait(buf).await;
                        }
                        Waited::Got(Err(e)) if pool.host == 0 && unreachable(&e) => {
                            self.hold_for_primary(Some(e)).await
                        }
                        // A replica that cannot be reached or refuses the
                        // login (restarting, pg_hba, its connection limit,
                        // its failure still cached): the read runs on the
                        // primary, as it would had the checks seen the
                        // replica down already.
                        // (the request, untouched, goes round again, to
                        // the primary)
                        Waited::Got(Err(e))
                            if read
                                && pool.host != 0
                                && matches!(
                                    e,
                                    AcquireError::Login(_) | AcquireError::RecentFailure(..)
                                ) =>
                        {
                            tracing::debug!(
                                user = %self.user(), db = %self.database(),
                                "replica unreachable ({e}): the read runs on the primary"
                            );
                            self.app.cancels.set_waiting(self.cancel, false);
                            self.force_primary = true;
                            return None;
                        }
                        Waited::Got(other) => other.map_err(|e| {
                            SessionEnd::Error(ClientError::new(e.sqlstate(), e.to_string()))
                        }),
                    }
                };
                // A server of the primary's pool that said at login it is
                // a standby (a demoted primary back up before the checks
                // saw it) takes no transaction: wait for the primary.
                let acquired = match acquired {
                    Ok(l) if gate.is_some() && l.standby() => {
                        l.close();
                        self.hold_for_primary(Some(standby_error(&pool))).await
                    }
                    other => other,
                };
                self.app.cancels.set_waiting(self.cancel, false);
                let mut lease = match acquired {
                    Ok(l) => l,
                    Err(end) => return Some(end),
                };
                if let Err(e) = lease.localize() {
                    return Some(SessionEnd::Error(ClientError::new(
                        "08006",
                        format!("server connection failed: {e}"),
                    )));
                }
                if let Some(sql) = lease.check_due() {
                    let sql = sql.to_owned();
                    if !Box::pin(check_server(&mut lease, &sql)).await {
                        // Closed; the request (untouched) takes another
                        // server, a few times in a row at most.
                        lease.close();
                        self.lost_retries += 1;
                        if self.lost_retries >= LOST_RETRIES {
                            return Some(SessionEnd::Error(ClientError::new(
                                "08006",
                                "server connection failed: server_check_query failed on every \
                                 server tried",
                            )));
                        }
                        return None;
                    }
                }
                lease
            }
        };
        if self.app.cancels.end_wait(self.cancel).is_some() {
            // Killed while it waited, its end hidden from the watch behind
            // bytes it sent more (or not looked at yet): nothing of its
            // request is sent.
            lease.release();
            return Some(SessionEnd::ClientLeft);
        }
        // (taken whatever the request: a lone Sync's must not meet the
        // next request)
        if self.app.cancels.take_wait_cancel(self.cancel) && cancellable {
            // Cancelled as its wait ended: the server goes back untouched.
            lease.release();
            return self.answer_cancelled_wait(buf).await;
        }
        if self.app.control.anything_paused()
            && !deferred
            && self.app.control.is_paused(&self.pool.database)
        {
            // PAUSE came while it waited in the pool's line (a server
            // given back goes to the first waiter): the server goes back
            // untouched, and the request, nothing of it sent, waits out
            // the pause, its query_wait_timeout counted from its arrival
            // (as on PgBouncer).
            let waited = lease.stats.waited;
            self.queued_since = Some(queued.unwrap_or(lease.server().lent_at - waited));
            lease.release();
            return None;
        }
        self.idle_timeout = Some(lease.settings.client_idle_timeout);
        // (as `route` just read it for this database: none where it has
        // no topology, and no settings read per lease)
        let ryw = match (&topology, self.route_cache.as_deref()) {
            (Some(_), Some(cache)) => cache.limits.1,
            _ => ReadYourWrites::Off,
        };
        let every_client = ryw == ReadYourWrites::Database;
        self.want_commit_lsn = may_write
            && ryw != ReadYourWrites::Off
            && lease.host() == 0
            && (self.reads_routed || every_client);
        self.commit_lsn = None;
        self.force_primary = false;
        // A read on a replica may run again on the primary (refused or
        // lost); a read or a lone BEGIN on the primary, on another server
        // if its server turns out dead before it answers (a stale pooled
        // server after a restart or switchover), a few times in a row.
        let named = |name: &[u8]| self.carried.as_ref()?.statements.get(name).cloned();
        let again = if lease.host() != 0 {
            // (a transaction sent to a standby because the entry asks for
            // one stays there)
            read.then(|| {
                super::route::retry_safe(buf)
                    .or_else(|| super::route::retry_safe_batch(buf, named, false))
            })
            .flatten()
        } else if lease.settings.mode != sluice_config::PoolMode::Session
            && self.lost_retries < LOST_RETRIES
        {
            super::route::lost_retry_safe(buf, read).or_else(|| {
                read.then(|| super::route::retry_safe_batch(buf, named, true))
                    .flatten()
            })
        } else {
            None
        };
        // (not a block's first request: its BEGIN ran before it)
        let again = again.filter(|_| !deferred);
        self.retry_query = again.map(|n| bytes::Bytes::copy_from_slice(&buf[..n]));
        if self.retry_query.is_some() || lease.host() != 0 {
            // (a cancel is counted from this request on: see
            // `answer_cancelled`, and a frozen replica's in `turn.rs`)
            self.app.cancels.forget_cancel(self.cancel);
        }
        let mode = self.mode(&lease.settings);
        if mode != lease.settings.mode {
            let mut kept = (*lease.settings).clone();
            kept.mode = mode;
            lease.settings = Arc::new(kept);
        }
        let on_replica = lease.host() != 0;
        self.on_routed_primary = topology.is_some() && !on_replica;
        self.primary_read = read && self.on_routed_primary;
        // (a session-mode client's transactions too: its reads are not
        // routed, but others' are)
        // (a read on the primary too: the relay counts only what its
        // client sends after it in the period; review 44)
        self.write_ends = topology
            .clone()
            .filter(|t| every_client && t.reads && self.on_routed_primary);
        self.replica_watch = match (&topology, replica) {
            (Some(t), Some((host, seen, wait))) if every_client && on_replica => {
                Some(Box::new(ReplicaWatch {
                    topology: t.clone(),
                    host,
                    seen,
                    wait,
                }))
            }
            _ => None,
        };
        let end = relay::run(self, buf, lease).await;
        if !matches!(end, RelayEnd::Again)
            && let Some(c) = self.carried.as_mut()
        {
            // (the block is open on the server, or the client is told why
            // not, or gone)
            c.deferred_begin = None;
        }
        if let RelayEnd::Again = end {
            // (the request is still whole in `buf`)
            self.retry_query = None;
            return None;
        }
        if let RelayEnd::Retry = end
            && let Some(query) = self.retry_query.take()
        {
            if self.app.cancels.cancel_asked(self.cancel) {
                // The client cancelled it before any answer came (to a
                // frozen replica, say): it is not run again, and the
                // client hears what PostgreSQL says of a cancelled query
                // (found by a review: the re-run answered in full).
                return self.answer_cancelled().await;
            }
            // Refused by the replica (or lost with it, or its primary
            // server lost) before anything reached the client: the same
            // query, first, on the primary.
            if on_replica && let Some(t) = &topology {
                t.replica_retries.fetch_add(1, Relaxed);
            }
            if !on_replica {
                self.lost_retries += 1;
            }
            let mut again = BytesMut::with_capacity(query.len() + buf.len());
            again.extend_from_slice(&query);
            again.extend_from_slice(buf);
            *buf = again;
            self.force_primary = on_replica;
            return None;
        }
        self.retry_query = None;
        self.lost_retries = 0;
        if may_write {
            // After the transaction's last reply: the primary's position
            // read now (or any check of it taken from now on) covers it.
            self.last_write = Some(Written {
                at: std::time::Instant::now(),
                lsn: self.commit_lsn.take(),
            });
        }
        self.want_commit_lsn = false;
        match end {
            RelayEnd::Released | RelayEnd::Retry | RelayEnd::Again => None,
            RelayEnd::ClientLeft => Some(SessionEnd::ClientLeft),
            RelayEnd::Error(e) => Some(SessionEnd::Error(e)),
        }
    }

    /// Follows a LISTEN the client sent: waits until the hub listens, so
    /// that once the LISTEN commits no notification committed after it
    /// is missed. What reaches the client is what it has committed
    /// (`settle_listens`); an UNLISTEN waits for its commit there.
    pub async fn follow_listen(&mut self, statement: &crate::prepared::sql::Special) {
        use crate::prepared::sql::Special;
        if let Special::Listen(channel) = statement {
            let pool = self.pool.clone();
            let listening = self
                .carried()
                .listen
                .get_or_insert_with(|| Box::new(Listening::new(pool.clone())));
            pool.notify
                .subscribe(&pool, listening.id, &listening.tx, channel)
                .await;
        }
    }

    /// Applies the LISTENs and UNLISTENs whose transaction ended: what
    /// committed changes the channels delivered; the hub stops listening
    /// for the client where nothing it committed or still waits for
    /// needs it. A client left with no channel stops listening.
    pub(super) fn settle_listens(&mut self, ledger: &mut super::listens::ListenLedger) {
        use crate::prepared::sql::Special;
        let settled = std::mem::take(&mut ledger.settled);
        let Some(carried) = self.carried.as_mut() else {
            return;
        };
        let Some(listening) = carried.listen.as_mut() else {
            return;
        };
        // The committed channels follow the statements in order; the hub
        // stops listening for the client only where, after all of them,
        // nothing it committed or still waits for needs it (an UNLISTEN
        // then a LISTEN of the same channel keep it).
        let mut unheard = Vec::new();
        for (statement, committed) in settled {
            match (statement, committed) {
                (Special::Listen(channel), true) => {
                    listening.channels.insert(channel);
                }
                (Special::Listen(channel), false) => unheard.push(channel),
                (Special::Unlisten(Some(channel)), true) => {
                    listening.channels.remove(&channel);
                    unheard.push(channel);
                }
                (Special::Unlisten(None), true) => unheard.extend(listening.channels.drain()),
                _ => {}
            }
        }
        for channel in unheard {
            if !listening.channels.contains(&channel) && !ledger.listen_pending(&channel) {
                self.pool.notify.unsubscribe(listening.id, Some(&channel));
            }
        }
        if listening.channels.is_empty() && !ledger.is_pending() {
            // (dropping it leaves the hub)
            carried.listen = None;
        }
    }

    /// Waits for the client's next bytes while passing on notifications,
    /// at most `idle_timeout` (zero: no limit) of client silence.
    async fn wait_readable_listening(&mut self, idle_timeout: Duration) -> Result<(), SessionEnd> {
        let deadline =
            (!idle_timeout.is_zero()).then(|| tokio::time::Instant::now() + idle_timeout);
        loop {
            let Some(listening) = self.carried.as_mut().and_then(|c| c.listen.as_mut()) else {
                return Ok(());
            };
            let mut batch = BytesMut::new();
            let expired = async {
                match deadline {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = expired => {
                    return Err(SessionEnd::Error(ClientError::new("08P01", "client_idle_timeout")));
                }
                ready = std::future::poll_fn(|cx| self.stream.poll_read_ready(cx)) => {
                    return ready.map_err(|_| SessionEnd::ClientLeft);
                }
                message = listening.rx.recv() => {
                    let Some(message) = message else { return Ok(()) };
                    listening.pass(&mut batch, &message);
                    while let Ok(more) = listening.rx.try_recv() {
                        listening.pass(&mut batch, &more);
                    }
                    if batch.is_empty() {
                        continue;
                    }
                }
            }
            use tokio::io::AsyncWriteExt;
            match tokio::time::timeout(NOTIFY_WRITE_TIMEOUT, self.stream.write_all(&batch)).await {
                Ok(Ok(())) => {}
                _ => return Err(SessionEnd::ClientLeft),
            }
        }
    }

    /// A server from `pool`; a client still queued after
    /// `query_wait_notify` is told so once (PgBouncer's notice), written
    /// without waiting on a plain socket that takes it (a client whose
    /// socket is full, or over TLS, is not told). `None`: the client
    /// closed its end meanwhile, and left the line at once (PgBouncer
    /// drops a waiting client that closes): a client gone, say, on its
    /// own timeout, never has its query run, nor a server closed for it.
    /// `cancellable`: a cancel request ends the wait (`Waited::Cancelled`).
    async fn acquire_notifying(
        &mut self,
        pool: &Arc<Pool>,
        queued: Option<Mono>,
        cancellable: bool,
    ) -> Waited {
        // Told from within the acquire (its `tell` cannot borrow the
        // stream): a notice due, and when the client queued.
        let due = std::sync::atomic::AtomicBool::new(false);
        let queued_at = std::sync::atomic::AtomicU64::new(0);
        let mut acquire = std::pin::pin!(pool.acquire_noticing(queued, |w| match w {
            Waiting::Notice => due.store(true, Relaxed),
            Waiting::Queued(at) => queued_at.store(at.nanos(), Relaxed),
        }));
        let stream = &mut self.stream;
        let cancels = &self.app.cancels;
        let cancel = self.cancel;
        let mut watch = Watch::default();
        let mut cancelled = std::pin::pin!(async {
            if !cancellable {
                std::future::pending::<()>().await;
            }
            cancels.wait_cancelled(cancel).await;
        });
        std::future::poll_fn(|cx| {
            let polled = acquire.as_mut().poll(cx);
            // (Loads first: a swap is a locked instruction, every time.)
            if let Some(at) = Mono::from_nanos(queued_at.load(Relaxed)) {
                queued_at.store(0, Relaxed);
                // For SHOW CLIENTS, with the acquire's own clock read.
                cancels.set_wait_since(cancel, at);
            }
            if due.load(Relaxed) {
                due.store(false, Relaxed);
                let mut notice = BytesMut::new();
                sluice_wire::ErrorFields::new(
                    sluice_wire::Severity::Notice,
                    "00000",
                    "No server connection available in postgres backend, client being queued",
                )
                .encode(&mut notice);
                stream.try_write_whole(&notice);
            }
            if let std::task::Poll::Ready(got) = polled {
                return std::task::Poll::Ready(Waited::Got(got));
            }
            // (Looked at only once the server is not at hand: a cancel
            // that came before is seen when the wait ends.)
            if cancelled.as_mut().poll(cx).is_ready() {
                return std::task::Poll::Ready(Waited::Cancelled);
            }
            watch_closed(stream, &mut watch, cx).map(|()| Waited::Left)
        })
        .await
    }

    /// A request cancelled while it waited for a server: it never runs,
    /// and is answered as PostgreSQL answers a query cancelled at its
    /// first message: the error at once, then, once the client's messages
    /// up to the request's end are dropped (a Query or FunctionCall alone;
    /// else through the next Sync, as PostgreSQL skips after an error,
    /// read as they come and not kept), ReadyForQuery.
    async fn answer_cancelled_wait(&mut self, buf: &mut BytesMut) -> Option<SessionEnd> {
        self.app.cancels.take_wait_cancel(self.cancel);
        self.queued_since = None;
        tracing::debug!(
            user = %self.user(), db = %self.database(),
            "a request cancelled while it waited for a server is not run"
        );
        // Syncs and Flushes ahead of the request run nothing: a Sync is
        // answered as the server would (the client is between
        // transactions), a Flush has no answer.
        let mut out = BytesMut::new();
        let lead = leading_syncs(buf);
        for m in buf.chunks_exact(sluice_wire::HEADER_LEN).take(lead) {
            if m.first() == Some(&sluice_wire::tags::frontend::SYNC) {
                sluice_wire::ready_for_query(&mut out, sluice_wire::TransactionStatus::Idle);
            }
        }
        bytes::Buf::advance(buf, lead * sluice_wire::HEADER_LEN);
        out.extend_from_slice(&cancelled_error());
        if let Err(end) = self.write_local(&out).await {
            return Some(end);
        }
        if let Err(end) = self.skip_request(buf).await {
            return Some(end);
        }
        out.clear();
        sluice_wire::ready_for_query(&mut out, sluice_wire::TransactionStatus::Idle);
        self.write_local(&out).await.err()
    }

    /// Drops the client's messages through the end of the request at the
    /// start of `buf` (`answer_cancelled_wait`), reading what has not
    /// arrived yet (each read bounded by `client_idle_timeout`) without
    /// keeping more than one read of it.
    async fn skip_request(&mut self, buf: &mut BytesMut) -> Result<(), SessionEnd> {
        use bytes::Buf;
        use sluice_wire::tags::frontend as f;
        let alone = matches!(buf.first(), Some(&(f::QUERY | f::FUNCTION_CALL)));
        // Bytes of the message being dropped still to come, and whether
        // it ends the request.
        let (mut left, mut ends) = (0usize, false);
        loop {
            if left > 0 {
                let n = left.min(buf.len());
                buf.advance(n);
                left -= n;
                if left > 0 {
                    self.read_more(buf, 0).await?;
                    continue;
                }
                if ends {
                    return Ok(());
                }
            }
            let Some(&[tag, a, b, c, d]) = buf.first_chunk::<5>() else {
                self.read_more(buf, 0).await?;
                continue;
            };
            if tag == f::TERMINATE {
                return Err(SessionEnd::ClientLeft);
            }
            let len = i32::from_be_bytes([a, b, c, d]);
            let Some(len) = usize::try_from(len).ok().filter(|&l| l >= 4) else {
                return Err(SessionEnd::Error(ClientError::protocol(format!(
                    "invalid message length {len}"
                ))));
            };
            left = 1 + len;
            ends = alone || tag == f::SYNC;
        }
    }

    /// Answers a request that was cancelled before it answered anything
    /// (it opened no transaction: only such requests run again).
    async fn answer_cancelled(&mut self) -> Option<SessionEnd> {
        let mut out = cancelled_error();
        sluice_wire::ready_for_query(&mut out, sluice_wire::TransactionStatus::Idle);
        self.write_local(&out).await.err()
    }

    /// Whether the request at the start of `buf`, routed to a replica, is
    /// a lone `BEGIN … READ ONLY` (or `START TRANSACTION … READ ONLY`)
    /// whose block can wait for its first request before taking a server
    /// (transaction mode, the entry not asking for standbys, no block
    /// waiting already: a second BEGIN gets the server's warning).
    fn may_defer_begin(&self, buf: &[u8]) -> bool {
        let settings = self.pool.settings();
        // (with idle_transaction_timeout, a block idle before its first
        // query must end on time, which the relay's clock does: it opens
        // at once, as before)
        if settings.mode != sluice_config::PoolMode::Transaction
            || settings.standby != Standby::No
            || !settings.idle_transaction_timeout.is_zero()
        {
            return false;
        }
        // (ASCII only: text the server would refuse, bytes that are no
        // text in the client's encoding, is sent to it, not answered
        // BEGIN here; review 37)
        match sluice_wire::whole_message(buf) {
            Some((sluice_wire::tags::frontend::QUERY, body))
                if body.len() <= DEFERRED_BEGIN_LIMIT =>
            {
                let text = body.strip_suffix(b"\0").unwrap_or(body);
                text.is_ascii() && !text.contains(&0) && sluice_router::begins_read_only(text)
            }
            _ => false,
        }
    }

    /// A lone `BEGIN … READ ONLY` that would open its block on a replica
    /// is answered here, and the block opens on the server its first
    /// request goes to (`relay::sync::open_block`): a replica, unless
    /// that request may change the block in a way a standby refuses
    /// (`SET TRANSACTION READ WRITE`, `ISOLATION LEVEL SERIALIZABLE`: the
    /// primary). Before, such a block was opened on a replica at once, and
    /// its `SET TRANSACTION READ WRITE` got the standby's error where
    /// PostgreSQL allows it (review 25). The block's start, as
    /// `transaction_timestamp()` reads it, is its first request's.
    async fn defer_begin(
        &mut self,
        buf: &mut BytesMut,
        block: crate::backend::pool::DeferredBlock,
    ) -> Option<SessionEnd> {
        let text = &block.message[sluice_wire::HEADER_LEN..];
        let text = text.strip_suffix(b"\0").unwrap_or(text);
        let tag = crate::prepared::sql::transaction_start_tag(text);
        bytes::Buf::advance(buf, block.message.len());
        self.carried.get_or_insert_with(Box::default).deferred_begin = Some(block);
        let mut out = BytesMut::with_capacity(32);
        sluice_wire::MessageBuilder::new(&mut out, sluice_wire::tags::backend::COMMAND_COMPLETE)
            .cstr(tag)
            .finish();
        sluice_wire::ready_for_query(&mut out, sluice_wire::TransactionStatus::InTransaction);
        self.write_local(&out).await.err()
    }

    /// The BEGIN at the start of `buf` counted on the pool as a block, unless
    /// a PAUSE of its database came meanwhile: counted first, then the
    /// pause looked at, so that a PAUSE that saw no block sees none begin
    /// after it (review 38: a PAUSE between the client's look at it and
    /// the count reported all released, and the block then ran). Without
    /// the block, the BEGIN takes a server as before, and the look after
    /// the acquire sends it back to wait.
    fn count_block(&self, buf: &[u8]) -> Option<crate::backend::pool::DeferredBlock> {
        let (_, body) = sluice_wire::whole_message(buf)?;
        let message = bytes::Bytes::copy_from_slice(&buf[..sluice_wire::HEADER_LEN + body.len()]);
        let block = crate::backend::pool::DeferredBlock::new(&self.pool, message);
        (!self.app.control.is_paused(&self.pool.database)).then_some(block)
    }

    /// Writes replies sluice made itself, bounded by `LOCAL_WRITE_TIMEOUT`.
    async fn write_local(&mut self, out: &[u8]) -> Result<(), SessionEnd> {
        use tokio::io::AsyncWriteExt;
        match tokio::time::timeout(LOCAL_WRITE_TIMEOUT, self.stream.write_all(out)).await {
            Ok(Ok(())) => Ok(()),
            _ => {
                tracing::info!(
                    user = %self.user(), db = %self.database(),
                    "closing because: the client did not read its replies for {} s",
                    LOCAL_WRITE_TIMEOUT.as_secs()
                );
                Err(SessionEnd::ClientLeft)
            }
        }
    }

    /// A batch that only prepares or closes statements is answered here,
    /// without a server (see `prepared::idle_batch`), reading the rest of
    /// it first when it is not whole yet. Ok(true): it was, and left `buf`.
    /// Not while shutting down or paused: those answers come from the
    /// usual path.
    async fn answer_without_server(&mut self, buf: &mut BytesMut) -> Result<bool, SessionEnd> {
        use crate::prepared::idle_batch::{Answer, answer};
        if self.pool.settings().max_prepared_statements == 0
            || self.app.phase() >= Phase::WaitForServers
            || self.app.control.anything_paused()
        {
            return Ok(false);
        }
        let (app, scope) = (self.app.clone(), self.pool.scope);
        let mut out = BytesMut::new();
        loop {
            let params = &*self.params;
            let carried = self.carried.get_or_insert_with(Box::default);
            let context = crate::prepared::registry::ParseContext {
                session: carried.session.as_deref(),
                params,
            };
            let names = &mut carried.statements;
            match answer(buf, names, &app.statements, (scope, context), &mut out) {
                Answer::Done(n) => {
                    bytes::Buf::advance(buf, n);
                    break;
                }
                Answer::Partial => {
                    // (up to `PARTIAL_LIMIT`, past the window: review 32)
                    let most = crate::prepared::idle_batch::PARTIAL_LIMIT;
                    crate::held_memory::hold(&mut self.held, most, buf.len())
                        .map_err(SessionEnd::Error)?;
                    self.read_more(buf, most).await?;
                }
                Answer::Server => return Ok(false),
            }
        }
        self.write_local(&out).await.map(|()| true)
    }

    /// PAUSE (or KILL): new transactions wait until RESUME, as on
    /// PgBouncer: through a SIGTERM's wait for clients too, at most
    /// `query_wait_timeout`; SIGINT or SHUTDOWN ends the wait with
    /// "server shutting down"; a client that closes its end meanwhile
    /// leaves at once. Returns when the wait began, if it did.
    /// `cancellable`: a cancel request ends the wait (`Paused::Cancelled`).
    async fn wait_while_paused(
        &self,
        began: Option<Mono>,
        cancellable: bool,
    ) -> Result<Paused, SessionEnd> {
        let wait_timeout = self.pool.settings().query_wait_timeout;
        // (a request sent back from the pool's line has waited since then)
        let mut since = began;
        // Counted waiting in SHOW POOLS while it waits.
        let mut counted = None;
        let mut watch = Watch::default();
        // Registered once, and again only after they fire: a waiter keeps
        // its place among those RESUME wakes (first come, first served).
        let resumed = self.app.control.resumed.notified();
        let shutdown = self.app.phase_changed.notified();
        let cancelled = async {
            if !cancellable {
                std::future::pending::<()>().await;
            }
            self.app.cancels.wait_cancelled(self.cancel).await;
        };
        tokio::pin!(resumed, shutdown, cancelled);
        resumed.as_mut().enable();
        shutdown.as_mut().enable();
        loop {
            if !self.app.control.is_paused(&self.pool.database) {
                return Ok(Paused::Over(since));
            }
            if self.app.phase() >= Phase::WaitForServers {
                return Err(SessionEnd::Error(ClientError::new(
                    "57P01",
                    "server shutting down",
                )));
            }
            let now = Mono::now();
            let began = *since.get_or_insert(now);
            if counted.is_none() {
                self.app.cancels.set_wait_since(self.cancel, began);
                counted = Some(self.pool.paused_wait(began));
            }
            let deadline = (!wait_timeout.is_zero()).then(|| began + wait_timeout);
            if deadline.is_some_and(|d| now >= d) {
                return Err(SessionEnd::Error(ClientError::protocol(
                    "query_wait_timeout",
                )));
            }
            // Bounded wait: a missed wake-up costs at most a second.
            let second = now + Duration::from_secs(1);
            let until = deadline.map_or(second, |d| d.min(second)).to_tokio();
            let closed = std::future::poll_fn(|cx| watch_closed(&self.stream, &mut watch, cx));
            tokio::select! {
                _ = &mut resumed => {
                    resumed.set(self.app.control.resumed.notified());
                    resumed.as_mut().enable();
                }
                _ = &mut shutdown => {
                    shutdown.set(self.app.phase_changed.notified());
                    shutdown.as_mut().enable();
                }
                _ = tokio::time::sleep_until(until) => {}
                () = closed => return Err(SessionEnd::ClientLeft),
                () = &mut cancelled => return Ok(Paused::Cancelled),
            }
        }
    }

    /// Reads more of a message the client has begun, as idle clients are
    /// read: at most `client_idle_timeout` of silence. The buffer grows
    /// with what arrives, never by what a header announces, nor past
    /// `wanted` (the message's end, when it is held whole; else 0).
    async fn read_more(&mut self, buf: &mut BytesMut, wanted: usize) -> Result<(), SessionEnd> {
        let idle_timeout = self.pool.settings().client_idle_timeout;
        super::relay_io::reserve(buf, wanted);
        let read = tokio_util::io::read_buf(&mut self.stream, buf);
        let read = if idle_timeout.is_zero() {
            read.await
        } else {
            match tokio::time::timeout(idle_timeout, read).await {
                Ok(r) => r,
                Err(_) => {
                    return Err(SessionEnd::Error(ClientError::new(
                        "08P01",
                        "client_idle_timeout",
                    )));
                }
            }
        };
        match read {
            Ok(0) | Err(_) => Err(SessionEnd::ClientLeft),
            Ok(_) => Ok(()),
        }
    }

    /// Waits with `client_idle_timeout`; boxed by the caller because the
    /// timer would otherwise sit in every idle client's task.
    async fn wait_readable_with_timeout(
        &self,
        timeout: Duration,
    ) -> Result<std::io::Result<()>, ClientError> {
        tokio::time::timeout(
            timeout,
            std::future::poll_fn(|cx| self.stream.poll_read_ready(cx)),
        )
        .await
        .map_err(|_| ClientError::new("08P01", "client_idle_timeout"))
    }
}

/// How a client's wait for a server ended (`acquire_notifying`).
enum Waited {
    Got(Result<Lease, AcquireError>),
    /// The client closed its end.
    Left,
    /// A cancel request came for its request.
    Cancelled,
}

/// PostgreSQL's error for a cancelled query.
fn cancelled_error() -> BytesMut {
    let mut out = BytesMut::new();
    sluice_wire::ErrorFields::new(
        sluice_wire::Severity::Error,
        "57014",
        "canceling statement due to user request",
    )
    .encode(&mut out);
    out
}

/// How a wait out a PAUSE ended (`wait_while_paused`).
enum Paused {
    /// The pause is over: when the wait began, if it did.
    Over(Option<Mono>),
    /// A cancel request came for the request.
    Cancelled,
}

/// Whether a cancel request for the request at the start of `buf`, while
/// it waits for a server, stops it (`answer_cancelled_wait`): a Query, a
/// FunctionCall, or an extended-protocol batch; not a Sync or a Flush
/// first, which run nothing (PostgreSQL ignores a cancel that comes while
/// it waits for the next message; review 31: a cancelled lone Flush had
/// the client's next requests dropped until it happened to send a Sync).
fn cancellable(buf: &[u8]) -> bool {
    use sluice_wire::tags::frontend as f;
    let lead = leading_syncs(buf) * sluice_wire::HEADER_LEN;
    matches!(
        buf.get(lead),
        Some(
            &(f::QUERY
                | f::FUNCTION_CALL
                | f::PARSE
                | f::BIND
                | f::DESCRIBE
                | f::EXECUTE
                | f::CLOSE)
        )
    )
}

/// How many whole Syncs and Flushes (five bytes each) start `buf`: a
/// request behind them is still cancellable (review 32: a batch sent
/// behind a Flush ran after its cancel).
fn leading_syncs(buf: &[u8]) -> usize {
    use sluice_wire::tags::frontend as f;
    buf.chunks_exact(sluice_wire::HEADER_LEN)
        .take_while(|m| matches!(m, [f::SYNC | f::FLUSH, 0, 0, 0, 4]))
        .count()
}

/// `wait`'s output, or None once the client closes its end first (see
/// `watch_closed`).
async fn unless_closed<T>(stream: &Stream, wait: impl Future<Output = T>) -> Option<T> {
    let mut wait = std::pin::pin!(wait);
    let mut watch = Watch::default();
    std::future::poll_fn(|cx| {
        if let std::task::Poll::Ready(v) = wait.as_mut().poll(cx) {
            return std::task::Poll::Ready(Some(v));
        }
        watch_closed(stream, &mut watch, cx).map(|()| None)
    })
    .await
}

/// The watch on the end of a client whose request sluice holds
/// (`watch_closed`).
#[derive(Default)]
struct Watch {
    /// Once the client is readable and still open (it sent more, or its
    /// FIN is still on the way behind a Terminate): its end is looked at
    /// now and then, with the delay to the next look. Readiness stays set
    /// for the relay to read, so it cannot be waited on again.
    recheck: Option<(std::pin::Pin<Box<tokio::time::Sleep>>, Duration)>,
}

/// The first look again at a readable client's end, and the longest gap.
const RECHECK_FIRST: Duration = Duration::from_millis(20);
const RECHECK_MAX: Duration = Duration::from_millis(250);

/// Ready once the client closes its end while sluice holds its request
/// (`Stream::poll_peer_closed`, then `Stream::peer_hung_up` now and then
/// once it is readable).
fn watch_closed(
    stream: &Stream,
    watch: &mut Watch,
    cx: &mut std::task::Context<'_>,
) -> std::task::Poll<()> {
    use std::task::Poll;
    loop {
        match &mut watch.recheck {
            None => match stream.poll_peer_closed(cx) {
                Poll::Ready(true) => return Poll::Ready(()),
                Poll::Ready(false) => {
                    watch.recheck =
                        Some((Box::pin(tokio::time::sleep(RECHECK_FIRST)), RECHECK_FIRST));
                }
                Poll::Pending => return Poll::Pending,
            },
            Some((timer, delay)) => {
                std::task::ready!(timer.as_mut().poll(cx));
                if stream.peer_hung_up() {
                    return Poll::Ready(());
                }
                *delay = (*delay * 2).min(RECHECK_MAX);
                timer.as_mut().reset(tokio::time::Instant::now() + *delay);
            }
        }
    }
}

/// Transaction and statement mode lend a server only once the client's
/// next message is whole when it is one that sluice holds whole (Parse,
/// Bind, Describe, Close, Query), or a FunctionCall, or COPY's messages
/// outside a COPY (PostgreSQL ignores those): a client that trickles one
/// holds no server meanwhile (a review held the pool's only server with a
/// FunctionCall of 10 MiB sent a byte every 2 s). Some: the buffer
/// length the message is whole at. Err: it announces more than sluice
/// holds.
fn first_message_incomplete(buf: &[u8], tracked: bool) -> Result<Option<usize>, ClientError> {
    use sluice_wire::tags::frontend as f;
    if !tracked {
        return Ok(None);
    }
    let Some(&[tag, a, b, c, d]) = buf.first_chunk::<5>() else {
        return Ok(Some(sluice_wire::HEADER_LEN));
    };
    if !matches!(
        tag,
        f::PARSE
            | f::BIND
            | f::DESCRIBE
            | f::CLOSE
            | f::QUERY
            | f::FUNCTION_CALL
            | f::COPY_DATA
            | f::COPY_DONE
            | f::COPY_FAIL
    ) {
        return Ok(None);
    }
    let Ok(len) = usize::try_from(i32::from_be_bytes([a, b, c, d])) else {
        return Ok(None);
    };
    let total = len + 1;
    if total > relay::CLIENT_HELD_LIMIT {
        return Err(relay::held_too_large(total));
    }
    Ok((buf.len() < total).then_some(total))
}

/// Serves a logged-in client until it leaves or fails. This future lives as
/// long as the client, idle or not, so it holds only the client, an empty
/// buffer while idle, and a readiness wait; everything else is boxed.
pub async fn run(client: &mut Client) -> SessionEnd {
    let mut buf = client.take_early();
    let end = run_with(client, &mut buf).await;
    spare_buffers::give_back(buf);
    client.held.release();
    end
}

async fn run_with(client: &mut Client, buf: &mut BytesMut) -> SessionEnd {
    // This task's place on its worker's idle board (`parking`), from its
    // first idle wait on.
    let mut on_board: Option<parking::OnBoard> = None;
    loop {
        if buf.is_empty() {
            let idle_timeout = *client
                .idle_timeout
                .get_or_insert_with(|| client.pool.settings().client_idle_timeout);
            if idle_timeout.is_zero() && !client.is_listening() {
                // The common case reads at once: a read that finds nothing
                // registers the wake-up as a readiness wait would, for one
                // look at the socket a request instead of two. It reads
                // into the stack (not part of the idle future), so an
                // idle client still holds no buffer. A wait that lasts is
                // asked by its worker's sweep to park.
                let mut waited = false;
                let read = std::future::poll_fn(|cx| {
                    let mut chunk = [std::mem::MaybeUninit::<u8>::uninit(); READ_CHUNK];
                    let mut chunk = tokio::io::ReadBuf::uninit(&mut chunk);
                    let polled = tokio::io::AsyncRead::poll_read(
                        std::pin::Pin::new(&mut client.stream),
                        cx,
                        &mut chunk,
                    );
                    if polled.is_pending() {
                        if !waited {
                            waited = true;
                            match &on_board {
                                Some(b) => b.idle(cx.waker()),
                                None => on_board = parking::OnBoard::new(cx.waker()),
                            }
                        } else if on_board.as_ref().is_some_and(|b| b.park_asked(cx.waker())) {
                            return std::task::Poll::Ready(None);
                        }
                    }
                    polled.map(|r| {
                        Some(r.map(|()| {
                            let got = chunk.filled();
                            if !got.is_empty() {
                                *buf = spare_buffers::take();
                                buf.extend_from_slice(got);
                            }
                            got.len()
                        }))
                    })
                })
                .await;
                if waited && let Some(b) = &on_board {
                    b.busy();
                }
                match read {
                    None => return SessionEnd::Park,
                    Some(Ok(0) | Err(_)) => return SessionEnd::ClientLeft,
                    Some(Ok(_)) => {}
                }
            }
        }
        if buf.is_empty() {
            let idle_timeout = client.idle_timeout.unwrap_or_default();
            let ready = if client.is_listening() {
                match Box::pin(client.wait_readable_listening(idle_timeout)).await {
                    Ok(()) => Ok(()),
                    Err(end) => return end,
                }
            } else {
                match Box::pin(client.wait_readable_with_timeout(idle_timeout)).await {
                    Ok(r) => r,
                    Err(e) => return SessionEnd::Error(e),
                }
            };
            if ready.is_err() {
                return SessionEnd::ClientLeft;
            }
            *buf = spare_buffers::take();
            // poll_read (not try_read) so that a short read clears readiness.
            let read = std::future::poll_fn(|cx| {
                match tokio_util::io::poll_read_buf(std::pin::Pin::new(&mut client.stream), cx, buf)
                {
                    std::task::Poll::Pending => std::task::Poll::Ready(None),
                    std::task::Poll::Ready(r) => std::task::Poll::Ready(Some(r)),
                }
            })
            .await;
            match read {
                Some(Ok(0)) | Some(Err(_)) => return SessionEnd::ClientLeft,
                Some(Ok(_)) => {}
                // Readiness was stale: give the buffer back and wait again.
                None => {
                    spare_buffers::give_back(std::mem::take(buf));
                    continue;
                }
            }
        }
        let settings = client.pool.settings();
        if settings.disable_pqexec && buf.first() == Some(&sluice_wire::tags::frontend::QUERY) {
            return SessionEnd::Error(super::relay::pqexec_disallowed());
        }
        let tracked = client.mode(&settings) != sluice_config::PoolMode::Session;
        crate::held_memory::shrink(buf, &mut client.held);
        match first_message_incomplete(buf, tracked) {
            Ok(None) => {}
            Ok(Some(total)) => {
                if let Err(e) = crate::held_memory::hold(&mut client.held, total, buf.len()) {
                    return SessionEnd::Error(e);
                }
                if let Err(end) = Box::pin(client.read_more(buf, total)).await {
                    return end;
                }
                continue;
            }
            Err(e) => return SessionEnd::Error(e),
        }
        if tracked
            && client
                .carried
                .as_ref()
                .is_none_or(|c| c.deferred_begin.is_none())
            && matches!(
                buf.first(),
                Some(&(sluice_wire::tags::frontend::PARSE | sluice_wire::tags::frontend::CLOSE))
            )
        {
            match Box::pin(client.answer_without_server(buf)).await {
                Ok(true) => {
                    if buf.is_empty() {
                        // An idle client keeps no buffer.
                        spare_buffers::give_back(std::mem::take(buf));
                        client.held.release();
                    }
                    continue;
                }
                Ok(false) => {}
                Err(end) => return end,
            }
        }
        if let Some(end) = client.serve_request(buf).await {
            return end;
        }
        if buf.is_empty() {
            spare_buffers::give_back(std::mem::take(buf));
            client.held.release();
        }
    }
}

/// Runs `server_check_query` on a lease's server (bounded by
/// `CLEANUP_TIMEOUT`); false: the server is not fit to use.
async fn check_server(lease: &mut Lease, sql: &str) -> bool {
    let checked = tokio::time::timeout(
        super::client::CLEANUP_TIMEOUT,
        crate::backend::login::run_query(lease.server(), sql),
    )
    .await;
    match checked {
        Ok(Ok(())) => true,
        Ok(Err(e)) => {
            tracing::info!("closing because: server check failed ({e})");
            false
        }
        Err(_) => {
            tracing::info!("closing because: server check timed out");
            false
        }
    }
}

/// The longest lone `BEGIN … READ ONLY` (comments and all) whose block
/// waits for its first request (`Client::defer_begin`).
const DEFERRED_BEGIN_LIMIT: usize = 1024;

/// How often a held transaction looks for a primary.
const HOLD_POLL: Duration = Duration::from_millis(50);

/// The server could not be reached or is starting or stopping: what a
/// failover or restart looks like from a pool.
fn unreachable(e: &AcquireError) -> bool {
    use crate::backend::login::LoginError as L;
    match e {
        AcquireError::Login(L::Connect { .. } | L::Timeout | L::Read(_)) => true,
        AcquireError::Login(L::Rejected { code, .. }) | AcquireError::RecentFailure(code, _) => {
            code.starts_with("08") || code.starts_with("57P")
        }
        _ => false,
    }
}

/// Why a server of the primary's pool was not used: it is a standby.
fn standby_error(pool: &Pool) -> AcquireError {
    AcquireError::Login(crate::backend::login::LoginError::Rejected {
        code: "08006".to_owned(),
        message: format!(
            "{} is a standby, not the primary (a failover may be under way)",
            pool.addr()
        ),
    })
}

/// A transaction that waited `failover_hold` for a primary in vain.
fn no_primary(database: &str, hold: Duration, why: &str) -> ClientError {
    ClientError::new(
        "08006",
        format!("no primary for database \"{database}\" within failover_hold ({hold:?}): {why}"),
    )
}
