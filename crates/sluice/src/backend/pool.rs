//! A pool of server connections for one (database, user). Idle servers are
//! reused last-in first-out (warm caches); clients that find none wait first-in
//! first-out, up to `query_wait_timeout`, and after `reserve_pool_timeout` may
//! use the reserve. Slots count servers open or opening, so `pool_size`,
//! `max_db_connections` and `max_user_connections` hold across threads.
//! A server handed out is owned by a `Lease`; dropping a lease without
//! releasing closes the server, so no path can leak a slot or a dirty server.

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

/// How long a new server connection is retried while the server looks
/// like it is restarting (capped by server_login_retry).
const RESTART_GRACE: Duration = Duration::from_secs(3);
/// Pause between those retries.
const RESTART_POLL: Duration = Duration::from_millis(100);

/// Failures a restarting server gives: connection refused, or 57P03 ("the
/// database system is starting up / shutting down").
fn is_transient(e: &login::LoginError) -> bool {
    match e {
        login::LoginError::Connect { source, .. } => {
            source.kind() == std::io::ErrorKind::ConnectionRefused
        }
        login::LoginError::Rejected { code, .. } => code == "57P03",
        _ => false,
    }
}

/// How often a client blocked only by a shared (db/user) limit looks again.
const SHARED_LIMIT_RETRY: Duration = Duration::from_millis(50);

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

/// What a waiting client is handed.
enum Grant {
    Server(Box<ServerConn>),
    /// Permission to open a server; the slot is already counted.
    Slot,
    /// query_wait_timeout passed (the janitor's `expire_waiters`; the
    /// waiter is out of the line already).
    Expired,
}

struct Waiter {
    id: u64,
    tx: oneshot::Sender<Grant>,
    since: Mono,
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
    /// When the pool was last in use: made, a client left, a server came
    /// back (autodb_idle_timeout).
    last_used: Mono,
    /// Servers lent now (SHOW SERVERS).
    lent: Vec<ServerRow>,
    stats: PoolStats,
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

fn forget_lent(st: &mut PoolState, id: u64) {
    if let Some(i) = st.lent.iter().position(|r| r.id == id) {
        st.lent.swap_remove(i);
    }
}

enum FirstLook {
    Leased(Box<Lease>),
    Open,
    Failing(String, String),
    /// In line; the flag: the pool is retired (the janitor may no longer
    /// look at it, so the wait times itself).
    Wait(oneshot::Receiver<Grant>, u64, Arc<PoolSettings>, bool),
}

enum Recheck {
    Slot,
    Wait,
    Expired,
}

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
    generation: u64,
}

impl ServerRow {
    fn of(server: &ServerConn, active: bool) -> Self {
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
            generation: 0,
        }
    }
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
            self.pool.discard(s, true);
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(s) = self.server.take() {
            self.pool.discard(s, true);
        }
    }
}

fn expire_waiters(st: &mut PoolState) {
    let wait = st.settings.query_wait_timeout;
    if wait.is_zero() {
        return;
    }
    let now = Mono::now();
    while st
        .waiters
        .front()
        .is_some_and(|w| now.saturating_duration_since(w.since) >= wait)
    {
        if let Some(w) = st.waiters.pop_front() {
            // A waiter already gone (its future dropped) gets nothing.
            let _ = w.tx.send(Grant::Expired);
        }
    }
}

/// How often a client waiting out a lack of descriptors looks again.
const DESCRIPTOR_RETRY: Duration = Duration::from_millis(50);

/// A server connect failed because this process has no descriptor left.
fn out_of_descriptors(e: &AcquireError) -> bool {
    matches!(
        e,
        AcquireError::Login(LoginError::Connect { source, .. })
            if matches!(source.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
    )
}

/// A waiter's receiver while `acquire` waits: if the future is dropped
/// (its caller gave up), a server or slot handed over meanwhile would be
/// lost with the receiver; this gives it back and leaves the line.
struct WaitGuard<'a> {
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

/// A counted slot being turned into a server. Dropped unused, it frees the
/// slot.
struct SlotGuard<'a> {
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

/// Times a connection opened for an address the pool has since left is
/// opened again before the acquire fails.
const RETARGET_RETRIES: u32 = 3;

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
            self.close_counted(&mut st, s);
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
        PoolCounts {
            clients: st.clients,
            waiting: st.waiters.len() as u32,
            active: st.active,
            idle,
            opening: st.total.saturating_sub(st.active + idle),
            total: st.total,
            max_wait: st
                .waiters
                .front()
                .map_or(Duration::ZERO, |w| w.since.elapsed()),
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

    pub fn client_left(&self) {
        let mut st = self.lock();
        st.clients = st.clients.saturating_sub(1);
        st.last_used = Mono::now();
    }

    /// Retires the pool if it has had no client, no lent server, no server
    /// being opened and no waiter for `timeout` (autodb_idle_timeout): the
    /// check and the retirement under one lock, so a client that joins
    /// meanwhile keeps it alive.
    pub fn retire_if_unused(&self, timeout: Duration, without_servers: bool) -> bool {
        {
            let mut st = self.lock();
            let opening = st.total as usize > st.active as usize + st.idle.len();
            if (without_servers && st.total > 0)
                || st.clients > 0
                || st.active > 0
                || opening
                || !st.waiters.is_empty()
                || st.last_used.elapsed() < timeout
            {
                return false;
            }
            st.retired = true;
        }
        self.reconnect();
        true
    }

    /// Closes every idle server and marks busy ones to close when released
    /// (RECONNECT).
    pub fn reconnect(&self) {
        let mut st = self.lock();
        st.generation += 1;
        for s in st.idle.drain() {
            self.close_counted(&mut st, s);
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

    /// Applies new settings, target or credentials (RELOAD). Servers made
    /// for another target are closed as they come back.
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
        let mut credential = credential;
        credential.keep_learned(&st.credential);
        st.credential = credential;
        if target_changed {
            st.generation += 1;
            st.welcome = None;
            let old = st.idle.drain();
            for s in old {
                self.close_counted(&mut st, s);
            }
        }
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

    /// The greeting for a new client; opens a server if none was ever open.
    pub async fn welcome(self: &Arc<Self>) -> Result<Arc<Welcome>, AcquireError> {
        if let Some(w) = self.lock().welcome.clone() {
            return Ok(w);
        }
        let lease = self.acquire().await?;
        lease.release();
        self.lock().welcome.clone().ok_or(AcquireError::Closed)
    }

    /// First look: an idle server, a free slot, a recent login failure, or
    /// a place in line.
    fn first_look(self: &Arc<Self>, may_open: bool, now: Mono) -> FirstLook {
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
        st.waiters.push_back(Waiter { id, tx, since: now });
        FirstLook::Wait(rx, id, settings, st.retired)
    }

    /// Takes an idle server, or a slot to open one, or waits in line. When
    /// a new server cannot be opened for lack of file descriptors, the
    /// client waits in line for a server another client releases (until
    /// `query_wait_timeout`) instead of failing.
    pub async fn acquire(self: &Arc<Self>) -> Result<Lease, AcquireError> {
        self.acquire_noticing(|| {}).await
    }

    /// [`Pool::acquire`], calling `notice` once if the wait reaches
    /// `query_wait_notify` (on the timer the wait has anyway: a notice
    /// costs no timer of its own).
    pub async fn acquire_noticing(
        self: &Arc<Self>,
        mut notice: impl FnMut(),
    ) -> Result<Lease, AcquireError> {
        let started = Mono::now();
        let mut may_open = true;
        // Told once per acquire, however many rounds it takes.
        let mut noticed = false;
        let mut notice_once = || {
            if !std::mem::replace(&mut noticed, true) {
                notice();
            }
        };
        // The first round's clock is the acquire's; a later round (after
        // a failed open) reads its own, so that a server it finds idle is
        // stamped lent now, not when the client began to wait.
        let mut round = started;
        loop {
            match self
                .acquire_from(started, round, may_open, &mut notice_once)
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
                    if !wait.is_zero() && started.elapsed() >= wait {
                        return Err(AcquireError::WaitTimeout);
                    }
                    tokio::time::sleep(DESCRIPTOR_RETRY).await;
                    round = Mono::now();
                }
                other => return other,
            }
        }
    }

    async fn acquire_from(
        self: &Arc<Self>,
        started: Mono,
        round: Mono,
        may_open: bool,
        notice: &mut impl FnMut(),
    ) -> Result<Lease, AcquireError> {
        let (rx, waiter_id, settings, retired) = match self.first_look(may_open, round) {
            FirstLook::Leased(mut l) => {
                // Zero on the first round (no clock read for it).
                l.stats.waited = round.saturating_duration_since(started);
                return Ok(*l);
            }
            // Boxed: opening a server is rare and its future is large.
            FirstLook::Open => return Box::pin(self.open_on_slot()).await,
            FirstLook::Failing(code, msg) => return Err(AcquireError::RecentFailure(code, msg)),
            FirstLook::Wait(rx, id, settings, retired) => (rx, id, settings, retired),
        };
        // Dropped with the future (a caller that stops waiting): whatever
        // was handed over meanwhile goes back to the pool.
        let mut waiting = WaitGuard {
            pool: self,
            rx: Some(rx),
            id: waiter_id,
        };
        let wait_deadline =
            (!settings.query_wait_timeout.is_zero()).then(|| started + settings.query_wait_timeout);
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
                    notice();
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
    fn recheck(
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

    fn lease(
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

    fn take_idle(self: &Arc<Self>, st: &mut PoolState, now: Mono) -> Option<Lease> {
        let worker = current_worker();
        let round_robin = st.settings.server_round_robin;
        while let Some(server) = if round_robin {
            st.idle.remove_oldest()
        } else {
            st.idle.pop_for(worker)
        } {
            let too_old = !st.settings.server_lifetime.is_zero()
                && now.saturating_duration_since(server.created) >= st.settings.server_lifetime;
            if too_old || server.closed_while_idle() {
                self.close_counted(st, server);
                continue;
            }
            st.active += 1;
            return Some(self.lease(st, server, now));
        }
        None
    }

    /// Counts a new server if the pool (plus reserve) and the shared limits
    /// allow.
    fn take_slot(&self, st: &mut PoolState, use_reserve: bool) -> bool {
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

    async fn open_on_slot(self: &Arc<Self>) -> Result<Lease, AcquireError> {
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
    fn opened(
        self: &Arc<Self>,
        server: Box<ServerConn>,
        reported: Reported,
        addr: &super::target::ServerAddr,
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

    /// Returns a server from a lease: to the first waiter, else to the idle
    /// stack.
    fn put_back(&self, mut server: Box<ServerConn>, generation: u64, stats: &TxStats) {
        if !server.stream.settled() {
            // A send of its is still queued or in the kernel (io_uring):
            // it cannot go to another worker. Not expected (the server
            // answered everything sent), so it is simply closed.
            tracing::debug!(
                "server {} released with a send in flight: closed",
                server.id
            );
            self.lock().stats.add(stats);
            self.discard(server, true);
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
        if generation != st.generation || too_old || over_size || st.retired {
            self.close_counted(&mut st, server);
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
    fn forget_active(&self, id: u64) {
        let mut st = self.lock();
        forget_lent(&mut st, id);
        st.active = st.active.saturating_sub(1);
        self.free_slot(&mut st, true);
    }

    fn discard(&self, server: Box<ServerConn>, was_active: bool) {
        let mut st = self.lock();
        forget_lent(&mut st, server.id);
        if was_active {
            st.active = st.active.saturating_sub(1);
        }
        self.close_counted(&mut st, server);
    }

    fn close_counted(&self, st: &mut PoolState, mut server: Box<ServerConn>) {
        server.stream.try_send_last(&[b'X', 0, 0, 0, 4]);
        drop(server);
        self.free_slot(st, true);
    }

    /// A slot was freed: let the first waiter that can use it open a server.
    fn free_slot(&self, st: &mut PoolState, _was_server: bool) {
        st.total = st.total.saturating_sub(1);
        self.db_limit.give_back();
        self.user_limit.give_back();
        while !st.waiters.is_empty() {
            if !self.take_slot(st, false) {
                return;
            }
            let w = st.waiters.pop_front().expect("checked non-empty");
            if w.tx.send(Grant::Slot).is_ok() {
                return;
            }
            st.total -= 1;
            self.db_limit.give_back();
            self.user_limit.give_back();
        }
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
        let mut closing = st.idle.take_expired(0, life_expired);
        // Idle timeouts stop at min_pool_size servers in all.
        let busy = st.total as usize - st.idle.len() - closing.len();
        let keep_idle = (s.min_pool_size as usize).saturating_sub(busy);
        closing.extend(st.idle.take_expired(keep_idle, idle_expired));
        for server in closing {
            self.close_counted(&mut st, server);
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
    fn evict_for_limits(&self) {
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
        self.close_counted(&mut st, server);
        true
    }

    /// Closes all idle servers (shutdown).
    pub fn close_idle(&self) {
        let mut st = self.lock();
        let old = st.idle.drain();
        for s in old {
            self.close_counted(&mut st, s);
        }
    }
}
