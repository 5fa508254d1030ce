//! A pool of server connections for one (database, user). Idle servers are
//! reused last-in first-out (warm caches); clients that find none wait first-in
//! first-out, up to `query_wait_timeout`, and after `reserve_pool_timeout` may
//! use the reserve. Slots count servers open or opening, so `pool_size`,
//! `max_db_connections` and `max_user_connections` hold across threads.
//! A server handed out is owned by a `Lease`; dropping a lease without
//! releasing closes the server, so no path can leak a slot or a dirty server.
//!
//! This file holds the pool's state, its settings and counts, and the calls
//! that read or change them; `waiting.rs` the clients in line, `opening.rs`
//! slots and new servers, `lease.rs` a server lent and its way back,
//! `upkeep.rs` the janitor's work.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::clock::Mono;

use sluice_config::PoolMode;
use tokio::sync::oneshot;

use super::idle::IdleServers;
use super::limits::ConnLimit;
use super::login::{self, LoginError, Reported};
use super::server::ServerConn;
use super::stats::{PoolStats, TxStats};
use super::target::{ServerCredential, ServerTarget};
use super::worker_id::current_worker;
use crate::params::ParamSet;

mod deferred;
mod lease;
mod opening;
mod upkeep;
mod waiting;

#[cfg(test)]
pub(crate) mod tests;

pub use deferred::DeferredBlock;
pub use lease::{Closing, Lease, ServerRow};
pub use waiting::Waiting;
use waiting::{Grant, Waiter, expire_waiters, out_of_descriptors};

/// Per-pool settings, resolved from [pgbouncer], [databases] and [users].
#[derive(Debug, Clone, PartialEq)]
pub struct PoolSettings {
    pub mode: PoolMode,
    pub pool_size: u32,
    pub min_pool_size: u32,
    pub reserve_pool_size: u32,
    pub reserve_pool_timeout: Duration,
    pub query_wait_timeout: Duration,
    pub server_idle_timeout: Duration,
    pub server_lifetime: Duration,
    pub server_login_retry: Duration,
    pub server_reset_query: String,
    pub server_reset_query_always: bool,
    /// A server idle longer than `server_check_delay` runs
    /// `server_check_query` before it is lent (empty: never; PgBouncer's
    /// `<empty>`: an empty query).
    pub server_check_delay: Duration,
    pub server_check_query: String,
    pub idle_transaction_timeout: Duration,
    /// A transaction (from the client's first message to the
    /// ReadyForQuery that ends it) lasting longer ends the client; zero:
    /// never (PgBouncer 1.25's `transaction_timeout`).
    pub transaction_timeout: Duration,
    pub client_idle_timeout: Duration,
    /// A request the server has not finished answering after this long
    /// ends the client (every pool mode); zero: never.
    pub query_timeout: Duration,
    pub max_packet_size: usize,
    /// Shared statements kept per server in transaction and statement mode
    /// (0: named statements pass through unchanged).
    pub max_prepared_statements: usize,
    /// Temporary tables, WITH HOLD cursors and session advisory locks:
    /// pin the client to its server, or remove them after the transaction.
    pub session_objects: sluice_config::SessionObjects,
    /// `target_session_attrs` of the entry, where reads are routed.
    pub standby: Standby,
    /// The simple query protocol ends the client (`disable_pqexec`).
    pub disable_pqexec: bool,
    /// Log new server connections (`log_connections`).
    pub log_connections: bool,
    /// Log server closes and why (`log_disconnections`).
    pub log_disconnections: bool,
    /// Lend the server idle the longest, not the most recent
    /// (`server_round_robin`).
    pub server_round_robin: bool,
    /// Longest time to forward a cancel request (0: only the connect
    /// timeout bounds it).
    pub cancel_wait_timeout: Duration,
    /// A client queued this long is told so (0: never).
    pub query_wait_notify: Duration,
    /// Session mode: a server marked to close ends its session at the next
    /// transaction boundary (`server_fast_close`).
    pub server_fast_close: bool,
}

/// Where a database entry's transactions go by `target_session_attrs`
/// (only where it routes reads).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Standby {
    /// As the router decides (any, read-write, primary).
    #[default]
    No,
    /// A replica if one qualifies, else the primary (prefer-standby).
    Prefer,
    /// A replica only, waiting up to failover_hold for one (read-only,
    /// standby).
    Only,
}

impl Standby {
    pub fn from_attrs(attrs: Option<&str>) -> Self {
        match attrs {
            Some("read-only" | "standby") => Standby::Only,
            Some("prefer-standby") => Standby::Prefer,
            _ => Standby::No,
        }
    }
}

/// Greeting for new clients: the ParameterStatus values of the first server.
#[derive(Debug)]
pub struct Welcome {
    pub reported: Reported,
    pub tracked: Arc<ParamSet>,
}

struct PoolState {
    settings: Arc<PoolSettings>,
    target: Arc<ServerTarget>,
    credential: ServerCredential,
    idle: IdleServers,
    waiters: VecDeque<Waiter>,
    /// Servers open or being opened.
    total: u32,
    /// Servers lent to clients.
    active: u32,
    next_waiter_id: u64,
    welcome: Option<Arc<Welcome>>,
    last_login_failure: Option<(Mono, String, String)>,
    /// Bumped by a reconnect: older servers are closed when released.
    generation: u64,
    /// Out of use (its cluster was replaced): every server closes when
    /// released, none is kept idle.
    retired: bool,
    /// Clients logged in to this pool.
    clients: u32,
    /// Logins on their way to it (`Pool::joining`).
    joining: u32,
    /// Clients waiting out a PAUSE, by when they began (SHOW POOLS counts
    /// them waiting, as PgBouncer does).
    paused: std::collections::BTreeMap<Mono, u32>,
    /// When the pool was last in use: made, a client left, a server came
    /// back (autodb_idle_timeout).
    last_used: Mono,
    /// Servers lent now (SHOW SERVERS).
    lent: Vec<ServerRow>,
    stats: PoolStats,
}

/// A client counted as waiting out a PAUSE (`Pool::paused_wait`).
pub struct PausedWait {
    pool: Arc<Pool>,
    since: Mono,
}

impl Drop for PausedWait {
    fn drop(&mut self) {
        let mut st = self.pool.lock();
        if let Some(n) = st.paused.get_mut(&self.since) {
            *n -= 1;
            if *n == 0 {
                st.paused.remove(&self.since);
            }
        }
    }
}

/// Counts shown by the console and checked by tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolCounts {
    /// Clients logged in (waiting ones included).
    pub clients: u32,
    pub waiting: u32,
    pub active: u32,
    pub idle: u32,
    /// Servers being opened.
    pub opening: u32,
    pub total: u32,
    /// How long the first client in line has waited.
    pub max_wait: Duration,
}

/// Why no server could be had.
#[derive(Debug, thiserror::Error)]
pub enum AcquireError {
    #[error("query_wait_timeout")]
    WaitTimeout,
    #[error("{0}")]
    Login(#[from] LoginError),
    #[error("server login has been failing, cached error: {1} (server_login_retry)")]
    RecentFailure(String, String),
    #[error("pool is closed")]
    Closed,
}

impl AcquireError {
    pub fn sqlstate(&self) -> &str {
        match self {
            Self::WaitTimeout => "08P01",
            Self::Login(e) => e.sqlstate(),
            Self::RecentFailure(code, _) => code,
            Self::Closed => "57P01",
        }
    }
}

/// The pool of one (database, user).
pub struct Pool {
    pub database: String,
    pub user: String,
    /// LISTEN fan-out for this pool's clients (transaction mode).
    pub notify: super::notify_hub::NotifyHub,
    /// 0: the pool clients log in to (the first host, or the primary when
    /// reads are routed); `i + 1`: the pool of host `i` of the entry, for
    /// transactions routed to a replica.
    pub host: u32,
    /// Names this pool's (database, user) for statements proven by its
    /// servers (`Statement::proven`): a Parse is answered without a server
    /// only for a text a server of the same pair accepted. Never 0.
    pub scope: u64,
    db_limit: Arc<ConnLimit>,
    user_limit: Arc<ConnLimit>,
    state: Mutex<PoolState>,
    /// Clients in a block that holds no server yet (`DeferredBlock`).
    deferred: std::sync::atomic::AtomicU32,
}

/// A pool dropped with servers still counted (a host pool RELOAD took out
/// of use, whose last lease came back with its server kept idle) gives
/// their units of the shared budgets back.
impl Drop for Pool {
    fn drop(&mut self) {
        let total = self
            .state
            .get_mut()
            .map_or_else(|p| p.into_inner().total, |st| st.total);
        for _ in 0..total {
            self.db_limit.give_back();
            self.user_limit.give_back();
        }
    }
}

/// A pool owns its LISTEN hub.
impl super::notify_hub::HubOwner for Pool {
    fn hub(&self) -> &super::notify_hub::NotifyHub {
        &self.notify
    }

    fn database(&self) -> &str {
        &self.database
    }

    fn target_and_credential(&self) -> (Arc<ServerTarget>, ServerCredential) {
        Pool::target_and_credential(self)
    }
}

/// A pool counts against its database's and user's budgets.
impl super::limits::Member for Pool {
    fn close_oldest_idle(&self) -> bool {
        Pool::close_oldest_idle(self)
    }
}

impl Pool {
    pub fn new(
        database: String,
        user: String,
        target: ServerTarget,
        credential: ServerCredential,
        settings: PoolSettings,
        db_limit: Arc<ConnLimit>,
        user_limit: Arc<ConnLimit>,
    ) -> Self {
        let scope = {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            (&database, &user).hash(&mut h);
            h.finish() | 1
        };
        Self {
            database,
            user,
            host: 0,
            scope,
            notify: Default::default(),
            db_limit,
            user_limit,
            deferred: Default::default(),
            state: Mutex::new(PoolState {
                settings: Arc::new(settings),
                target: Arc::new(target),
                credential,
                idle: IdleServers::default(),
                waiters: VecDeque::new(),
                total: 0,
                active: 0,
                next_waiter_id: 0,
                welcome: None,
                last_login_failure: None,
                generation: 0,
                retired: false,
                clients: 0,
                joining: 0,
                paused: std::collections::BTreeMap::new(),
                last_used: Mono::now(),
                lent: Vec::new(),
                stats: PoolStats::default(),
            }),
        }
    }

    /// The pool of host `index` of the entry (see `host`).
    pub fn for_host(mut self, index: usize) -> Self {
        self.host = u32::try_from(index).unwrap_or(u32::MAX - 1) + 1;
        self
    }

    /// Points new server connections at `addr` (the primary moved): idle
    /// servers of the old address are closed now, busy ones when they come
    /// back. Returns whether anything changed.
    pub fn retarget(&self, addr: &super::target::ServerAddr) -> bool {
        let mut st = self.lock();
        if st.target.addr == *addr {
            return false;
        }
        let mut target = (*st.target).clone();
        target.addr = addr.clone();
        st.target = Arc::new(target);
        st.generation += 1;
        st.welcome = None;
        st.last_login_failure = None;
        for s in st.idle.drain() {
            self.close_counted(&mut st, s, Closing::ConfigChanged);
        }
        true
    }

    /// Where new server connections go.
    pub fn addr(&self) -> super::target::ServerAddr {
        self.lock().target.addr.clone()
    }

    /// Lets the next acquire try to log in even if a login failed within
    /// `server_login_retry` (the checks say the server is back).
    pub fn forget_login_failure(&self) {
        self.lock().last_login_failure = None;
    }

    /// Joins the shared budgets this pool counts against.
    pub fn join_limits(&self, me: &Arc<Pool>) {
        self.db_limit.join(me);
        self.user_limit.join(me);
    }

    fn lock(&self) -> MutexGuard<'_, PoolState> {
        // A panic while holding the lock leaves counts that are still
        // consistent (every change is a single step), so keep serving.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Current settings and target (one lock).
    pub fn settings_and_target(&self) -> (Arc<PoolSettings>, Arc<ServerTarget>) {
        let st = self.lock();
        (st.settings.clone(), st.target.clone())
    }

    /// Where and how to log in, for a connection outside the pool (LISTEN).
    pub fn target_and_credential(&self) -> (Arc<ServerTarget>, ServerCredential) {
        let st = self.lock();
        (st.target.clone(), st.credential.clone())
    }

    pub fn settings(&self) -> Arc<PoolSettings> {
        self.lock().settings.clone()
    }

    pub fn counts(&self) -> PoolCounts {
        let st = self.lock();
        let idle = st.idle.len() as u32;
        let paused: u32 = st.paused.values().sum();
        PoolCounts {
            clients: st.clients,
            waiting: st.waiters.len() as u32 + paused,
            active: st.active,
            idle,
            opening: st.total.saturating_sub(st.active + idle),
            total: st.total,
            max_wait: {
                let now = Mono::now();
                st.waiters
                    .iter()
                    .map(|w| w.since)
                    .chain(st.paused.keys().next().copied())
                    .map(|since| now.saturating_duration_since(since))
                    .max()
                    .unwrap_or_default()
            },
        }
    }

    /// A client waits out a PAUSE since `since`, until the guard drops.
    pub fn paused_wait(self: &Arc<Self>, since: Mono) -> PausedWait {
        *self.lock().paused.entry(since).or_insert(0) += 1;
        PausedWait {
            pool: self.clone(),
            since,
        }
    }

    /// Totals since start.
    pub fn stats(&self) -> PoolStats {
        self.lock().stats.clone()
    }

    /// True while logins to the server fail and no server is open: the
    /// pool cannot serve (/health).
    pub fn is_failing(&self) -> bool {
        let st = self.lock();
        st.total == 0
            && st.last_login_failure.as_ref().is_some_and(|(at, _, _)| {
                at.elapsed() < st.settings.server_login_retry.max(Duration::from_secs(1))
            })
    }

    /// A client logged in to this pool.
    pub fn client_joined(&self) {
        let mut st = self.lock();
        st.clients += 1;
        st.stats.client_logins += 1;
    }

    /// Marks the pool used now (a login is on its way to it).
    pub fn touch(&self) {
        self.lock().last_used = Mono::now();
    }

    /// A login on its way to the pool, until the guard drops (after
    /// `client_joined`, or on failure): meanwhile the pool is not retired
    /// as unused (`mark_retired_if_unused`).
    pub fn joining(self: &Arc<Self>) -> Joining {
        self.lock().joining += 1;
        Joining(self.clone())
    }

    pub fn client_left(&self) {
        let mut st = self.lock();
        st.clients = st.clients.saturating_sub(1);
        st.last_used = Mono::now();
    }

    /// Applies new settings, target or credentials (RELOAD). Servers made
    /// for another target are closed as they come back; a login failure
    /// kept for `server_login_retry` is forgotten.
    pub fn reconfigure(
        &self,
        settings: PoolSettings,
        mut target: ServerTarget,
        credential: ServerCredential,
        keep_addr: bool,
    ) {
        let mut st = self.lock();
        if keep_addr {
            target.addr = st.target.addr.clone();
        }
        let target_changed = st.target.addr != target.addr
            || st.target.alternates != target.alternates
            || st.target.dbname != target.dbname
            || st.target.user != target.user
            || st.target.startup_params != target.startup_params
            || !st.target.tls.same_settings(&target.tls);
        st.settings = Arc::new(settings);
        st.target = Arc::new(target);
        // (the operator may have fixed what made logins fail: the next
        // acquire tries again, not the cached error)
        st.last_login_failure = None;
        let mut credential = credential;
        credential.keep_learned(&st.credential);
        st.credential = credential;
        if target_changed {
            st.generation += 1;
            st.welcome = None;
            let old = st.idle.drain();
            for s in old {
                self.close_counted(&mut st, s, Closing::ConfigChanged);
            }
        }
        // A larger pool serves the clients already in line at once.
        self.grant_slots(&mut st);
    }

    /// What the login of a client as `user` proved (SCRAM keys, an md5
    /// hash auth_query returned): kept only when this pool logs in to the
    /// server as that same user (another user's secrets would make every
    /// server login fail) and no password is configured for it. Replaces
    /// what an older login taught (the password changed in PostgreSQL).
    pub fn learn(&self, user: &str, learnt: &crate::auth::Learnt) {
        let mut st = self.lock();
        if st.credential.password.is_some() || st.target.user != user {
            return;
        }
        if let Some(keys) = &learnt.scram_keys {
            st.credential.scram_keys = Some(keys.clone());
        }
        if let Some(hash) = &learnt.md5_hash {
            st.credential.md5_hash = Some(hash.clone());
        }
    }

    /// Whether a greeting for new clients is at hand (no server to open).
    pub fn has_welcome(&self) -> bool {
        self.lock().welcome.is_some()
    }

    /// The greeting for a new client; opens a server if none was ever open.
    pub async fn welcome(self: &Arc<Self>) -> Result<Arc<Welcome>, AcquireError> {
        if let Some(w) = self.lock().welcome.clone() {
            return Ok(w);
        }
        let lease = self.acquire().await?;
        lease.release();
        self.lock().welcome.clone().ok_or(AcquireError::Closed)
    }
}

/// A login on its way to a pool (`Pool::joining`).
pub struct Joining(Arc<Pool>);

impl Drop for Joining {
    fn drop(&mut self) {
        let mut st = self.0.lock();
        st.joining = st.joining.saturating_sub(1);
    }
}
