//! The state every worker thread shares: the loaded configuration, the
//! auth_file, the pools and their shared limits, the cancel keys, the client
//! count and the shutdown phase. Pools are created on first use and
//! reconfigured in place on RELOAD, so clients in flight keep their servers.

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use sluice_config::{Config, Database};
use tokio::sync::Notify;

use crate::auth::{Secret, Userlist};
use crate::backend::cancel::CancelRegistry;
use crate::backend::cluster::Cluster;
use crate::backend::limits::ConnLimit;
use crate::backend::pool::{Pool, PoolSettings};
use crate::backend::target::{ServerAddr, ServerCredential, ServerTarget};
use crate::backend::topology::{LagLimits, Topology};
use crate::operator::OperatorSwitches;
use crate::params::ParamInterner;
use crate::stats::StatsWindow;

/// Phases of a shutdown, in PgBouncer's terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum Phase {
    Running = 0,
    /// SIGTERM: no new clients; exit when the last client has gone.
    WaitForClients = 1,
    /// SIGINT: no new clients or transactions; exit when servers are
    /// released.
    WaitForServers = 2,
    /// SIGQUIT: exit now.
    Immediate = 3,
}

/// How to look up a user missing from auth_file: run `query` with `user`
/// as `$1`, as `auth_user`, on database entry `database`.
#[derive(Debug, Clone)]
pub struct AuthLookup {
    pub database: String,
    pub auth_user: String,
    pub query: String,
    pub user: String,
    /// Bound on getting a server and on the query itself.
    pub timeout: std::time::Duration,
}

/// Why a client cannot have a pool.
#[derive(Debug, thiserror::Error)]
pub enum PoolLookupError {
    #[error("database \"{0}\" does not exist")]
    NoDatabase(String),
}

/// Shared state of the daemon.
pub struct App {
    pub config_path: PathBuf,
    config: RwLock<Arc<Config>>,
    userlist: RwLock<Arc<Userlist>>,
    /// TLS towards clients, as `client_tls_*` last loaded well.
    client_tls: RwLock<Arc<crate::tls::ClientTls>>,
    /// hba rules and ident map, as last loaded well.
    auth_rules: RwLock<Arc<crate::auth::rules::AuthRules>>,
    /// TLS towards servers, as `server_tls_*` last loaded well.
    server_tls: RwLock<Arc<crate::tls::ServerTls>>,
    pools: Mutex<HashMap<(String, String), Arc<Pool>>>,
    /// Each database that routes reads or takes its hosts from Patroni:
    /// its topology and the pools of its single hosts.
    clusters: Mutex<HashMap<String, Arc<Cluster>>>,
    /// Databases whose topology a RELOAD retired after it had seen writes
    /// (`read_your_writes = database`): the next one starts as after a
    /// commit in doubt (taken with `clusters` locked).
    written_before: Mutex<std::collections::HashSet<String>>,
    /// Pools out of `pools` and `clusters` (RELOAD replaced or dropped
    /// them) while clients may still wait in them: the janitor keeps their
    /// waiters' query_wait_timeout (`retiring_pools`).
    retiring: Mutex<Vec<Arc<Pool>>>,
    db_limits: Mutex<HashMap<String, Arc<ConnLimit>>>,
    user_limits: Mutex<HashMap<String, Arc<ConnLimit>>>,
    /// Client budgets: `max_db_client_connections`, `max_user_client_connections`.
    db_client_limits: Mutex<HashMap<String, Arc<ConnLimit>>>,
    user_client_limits: Mutex<HashMap<String, Arc<ConnLimit>>>,
    pub cancels: Arc<CancelRegistry>,
    /// Cancel requests forwarded to the other sluices of a `[peers]` group.
    pub peers: crate::backend::peers::Peers,
    pub param_sets: ParamInterner,
    /// Shared server-side prepared statements (transaction mode).
    pub statements: crate::prepared::registry::Registry,
    /// PAUSE / DISABLE switches.
    pub control: OperatorSwitches,
    /// Averages for SHOW STATS.
    pub stats: StatsWindow,
    /// Refused logins by SQLSTATE (for /metrics).
    pub login_failures: Mutex<std::collections::BTreeMap<String, u64>>,
    pub clients: AtomicU32,
    /// Accept loops whose socket is still open (SIGTERM waits for them).
    pub listening: AtomicU32,
    phase: AtomicU8,
    pub phase_changed: Notify,
    /// Event loops of the workers, for work started outside a client task
    /// (opening min_pool_size servers): a server belongs on a worker.
    workers: OnceLock<Vec<tokio::runtime::Handle>>,
    next_worker: AtomicUsize,
    /// Itself, for tasks started from a `&App` (host checks).
    me: OnceLock<std::sync::Weak<App>>,
    /// Some database routes reads (has a topology).
    routing: std::sync::atomic::AtomicBool,
    /// Bumped whenever what a client's routing looked up may have changed
    /// (a RELOAD, a topology made or dropped): clients keep those lookups
    /// while it stands (see `route_epoch`).
    route_epoch: std::sync::atomic::AtomicU64,
}

impl App {
    pub fn new(config_path: PathBuf, config: Config, userlist: Userlist) -> Self {
        let peer_id = config.settings.peer_id;
        crate::held_memory::set_limit_mb(config.settings.max_held_memory_mb);
        Self {
            config_path,
            config: RwLock::new(Arc::new(config)),
            userlist: RwLock::new(Arc::new(userlist)),
            client_tls: RwLock::new(Arc::new(crate::tls::ClientTls::disabled())),
            server_tls: RwLock::new(Arc::default()),
            auth_rules: RwLock::new(Arc::default()),
            pools: Mutex::new(HashMap::new()),
            clusters: Mutex::new(HashMap::new()),
            written_before: Mutex::new(std::collections::HashSet::new()),
            retiring: Mutex::new(Vec::new()),
            db_limits: Mutex::new(HashMap::new()),
            user_limits: Mutex::new(HashMap::new()),
            db_client_limits: Mutex::new(HashMap::new()),
            user_client_limits: Mutex::new(HashMap::new()),
            cancels: Arc::new(CancelRegistry::new(peer_id)),
            peers: Default::default(),
            param_sets: ParamInterner::default(),
            statements: Default::default(),
            control: OperatorSwitches::default(),
            stats: StatsWindow::default(),
            login_failures: Mutex::default(),
            clients: AtomicU32::new(0),
            listening: AtomicU32::new(0),
            phase: AtomicU8::new(Phase::Running as u8),
            phase_changed: Notify::new(),
            workers: OnceLock::new(),
            next_worker: AtomicUsize::new(0),
            me: OnceLock::new(),
            routing: std::sync::atomic::AtomicBool::new(false),
            route_epoch: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Shares the state, which may then start tasks of its own.
    pub fn shared(self) -> Arc<Self> {
        let app = Arc::new(self);
        let _ = app.me.set(Arc::downgrade(&app));
        app
    }

    /// Records the workers' event loops (once, at startup).
    pub fn set_workers(&self, handles: Vec<tokio::runtime::Handle>) {
        let _ = self.workers.set(handles);
    }

    /// Runs `task` on the next worker, round robin (on the current runtime
    /// before the workers are known).
    pub fn spawn_on_worker(&self, task: impl Future<Output = ()> + Send + 'static) {
        match self.workers.get().filter(|w| !w.is_empty()) {
            Some(w) => {
                let i = self.next_worker.fetch_add(1, Ordering::Relaxed) % w.len();
                w[i].spawn(task);
            }
            None => {
                tokio::spawn(task);
            }
        }
    }

    pub fn config(&self) -> Arc<Config> {
        self.config
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// TLS towards clients.
    pub fn client_tls(&self) -> Arc<crate::tls::ClientTls> {
        self.client_tls
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Replaces the TLS configuration for clients that connect from now on.
    pub fn set_client_tls(&self, tls: crate::tls::ClientTls) {
        *self.client_tls.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(tls);
    }

    /// hba rules and the ident map.
    pub fn auth_rules(&self) -> Arc<crate::auth::rules::AuthRules> {
        self.auth_rules
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn set_auth_rules(&self, rules: crate::auth::rules::AuthRules) {
        *self.auth_rules.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(rules);
    }

    /// TLS towards servers (what new targets carry).
    pub fn server_tls(&self) -> Arc<crate::tls::ServerTls> {
        self.server_tls
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Replaces the TLS configuration towards servers; pools take it at
    /// their next RELOAD-made target (call before `reload`).
    pub fn set_server_tls(&self, tls: crate::tls::ServerTls) {
        *self.server_tls.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(tls);
    }

    pub fn userlist(&self) -> Arc<Userlist> {
        self.userlist
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn phase(&self) -> Phase {
        match self.phase.load(Ordering::Acquire) {
            0 => Phase::Running,
            1 => Phase::WaitForClients,
            2 => Phase::WaitForServers,
            _ => Phase::Immediate,
        }
    }

    /// Moves to a later phase (never back).
    pub fn begin_shutdown(&self, phase: Phase) {
        let before = self.phase.fetch_max(phase as u8, Ordering::AcqRel);
        if before < phase as u8 {
            crate::sd_notify::stopping(match phase {
                Phase::WaitForClients => "waiting for clients to leave",
                Phase::WaitForServers => "waiting for servers to be released",
                _ => "stopping",
            });
        }
        self.phase_changed.notify_waiters();
    }

    /// Every pool: those clients log in to and those of single hosts.
    /// Whether the pause of `db` (or the global one) is still in force.
    pub fn pause_in_force(&self, db: Option<&str>) -> bool {
        match db {
            Some(db) => self.control.is_paused(db),
            None => self.control.all_paused(),
        }
    }

    /// PAUSE's second half (the console's, and SIGUSR1's): waits until no
    /// server of `db` (or of any database) is lent to a client, then
    /// closes the idle ones. False if it gave up: `limit` passed, or the
    /// pause ended meanwhile.
    pub async fn wait_paused_released(
        &self,
        db: Option<&str>,
        limit: Option<std::time::Duration>,
    ) -> bool {
        let deadline = limit.map(|l| tokio::time::Instant::now() + l);
        loop {
            // (first: a pause ended meanwhile closes nothing; review 42)
            if !self.pause_in_force(db) {
                return false;
            }
            let pools: Vec<_> = self
                .pools()
                .into_iter()
                .filter(|p| db.is_none_or(|d| d == p.database))
                .collect();
            if pools.iter().all(|p| p.no_transactions()) {
                for p in pools {
                    p.close_idle(crate::backend::pool::Closing::Paused);
                }
                return true;
            }
            if deadline.is_some_and(|d| tokio::time::Instant::now() >= d) {
                return false;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    pub fn pools(&self) -> Vec<Arc<Pool>> {
        let mut all = self.main_pools();
        for cluster in self.clusters() {
            all.extend(cluster.pools());
        }
        all
    }

    /// The pools clients log in to, one per (database, user) (SHOW POOLS).
    pub fn main_pools(&self) -> Vec<Arc<Pool>> {
        self.pools
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }

    /// Whether `entry` sends reads to replicas.
    fn routes_reads(config: &Config, entry: &Database) -> bool {
        entry.route_reads.unwrap_or(config.settings.route_reads)
    }

    /// Whether `entry` has a topology: it routes reads, or its hosts are
    /// Patroni's members (then it follows the leader even when reads stay
    /// on the primary).
    fn has_topology(config: &Config, entry: &Database) -> bool {
        Self::routes_reads(config, entry) || entry_addrs(entry).is_empty()
    }

    /// Whether `topology` is what `entry` asks for now (its hosts, Patroni
    /// and routing): otherwise a RELOAD replaces it.
    fn fits(config: &Config, entry: &Database, topology: &Topology) -> bool {
        Self::has_topology(config, entry)
            && topology.reads == Self::routes_reads(config, entry)
            && topology.patroni == entry.patroni
            && topology.configured() == entry_addrs(entry).as_slice()
    }

    /// Whether any database routes reads (one load on the hot path when
    /// none does).
    pub fn routing_anywhere(&self) -> bool {
        self.routing.load(Ordering::Relaxed)
    }

    /// Lag limits for reads on replicas, and whether reads wait for the
    /// client's writes, as configured now.
    pub fn read_limits(&self) -> (LagLimits, sluice_config::ReadYourWrites) {
        let config = self.config();
        let s = &config.settings;
        (
            LagLimits {
                bytes: u64::from(s.replica_max_lag_bytes),
                time: s.replica_max_lag,
            },
            s.read_your_writes,
        )
    }

    /// The routing epoch: a client that looked up its database's
    /// topology, settings, lag limits and host pools under this value may
    /// use them until it changes. Read before those lookups.
    pub fn route_epoch(&self) -> u64 {
        self.route_epoch.load(Ordering::Acquire)
    }

    fn new_route_epoch(&self) {
        self.route_epoch.fetch_add(1, Ordering::AcqRel);
    }

    fn cluster(&self, database: &str) -> Option<Arc<Cluster>> {
        self.clusters
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(database)
            .cloned()
    }

    /// Every cluster, by database name.
    fn clusters(&self) -> Vec<Arc<Cluster>> {
        let mut all: Vec<_> = self
            .clusters
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        all.sort_by(|a, b| a.topology.database.cmp(&b.topology.database));
        all
    }

    /// The topology of `database` when it routes reads or takes its hosts
    /// from Patroni.
    pub fn topology(&self, database: &str) -> Option<Arc<Topology>> {
        self.cluster(database).map(|c| c.topology.clone())
    }

    /// Every topology (SHOW HOSTS, /metrics).
    pub fn topologies(&self) -> Vec<Arc<Topology>> {
        self.clusters()
            .into_iter()
            .map(|c| c.topology.clone())
            .collect()
    }

    /// Creates the cluster of `pool`'s database and starts its checks,
    /// logging in as `pool` does (the first pool of the database). The
    /// configuration is read under the clusters' lock, so that a login
    /// racing a RELOAD cannot bring back a cluster of the old one.
    fn ensure_topology(&self, pool: &Arc<Pool>) {
        let Some(me) = self.me.get().and_then(std::sync::Weak::upgrade) else {
            return;
        };
        let topology = {
            let mut map = self.clusters.lock().unwrap_or_else(|p| p.into_inner());
            let config = self.config();
            let Some(entry) = Self::database_entry(&config, &pool.database)
                .filter(|e| Self::has_topology(&config, e))
            else {
                return;
            };
            if map
                .get(&pool.database)
                .is_some_and(|c| Self::fits(&config, &entry, &c.topology))
            {
                return;
            }
            let cluster = Arc::new(Cluster::new(
                Topology::new(
                    pool.database.clone(),
                    entry_addrs(&entry),
                    entry.patroni.clone(),
                )
                .with_reads(Self::routes_reads(&config, &entry)),
            ));
            let t = cluster.topology.clone();
            let mut written = self
                .written_before
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&pool.database);
            if let Some(old) = map.insert(pool.database.clone(), cluster) {
                written |= old.topology.saw_writes();
                old.retire();
                self.retiring_add(old.pools());
            }
            if written {
                // (the writes the old one counted, and those of periods
                // still holding it, are counted nowhere this one sees)
                t.note_write_end_in_doubt();
            }
            self.routing.store(true, Ordering::Relaxed);
            t
        };
        self.new_route_epoch();
        let host: Arc<dyn crate::backend::monitor::MonitorHost> = me;
        // The hosts' checks first: members Patroni adds later get theirs
        // from `hosts_changed`, never twice.
        crate::backend::monitor::start(host.clone(), &topology, pool, |task| {
            self.spawn_on_worker(task)
        });
        crate::backend::patroni::start(host, &topology, |task| self.spawn_on_worker(task));
    }

    /// RELOAD: a database that stopped routing reads, or whose host list,
    /// Patroni or routing changed, loses its cluster (its checks end, its
    /// host pools drain); one that needs one now gets a fresh one.
    fn reload_topologies(&self, config: &Config) {
        let stale: Vec<String> = self
            .topologies()
            .into_iter()
            .filter(|t| {
                Self::database_entry(config, &t.database)
                    .is_none_or(|entry| !Self::fits(config, &entry, t))
            })
            .map(|t| t.database.clone())
            .collect();
        {
            let mut map = self.clusters.lock().unwrap_or_else(|p| p.into_inner());
            for db in &stale {
                if let Some(old) = map.remove(db) {
                    if old.topology.saw_writes() {
                        self.written_before
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .insert(db.clone());
                    }
                    old.retire();
                    self.retiring_add(old.pools());
                }
            }
            self.routing.store(!map.is_empty(), Ordering::Relaxed);
        }
        for pool in self.main_pools() {
            if let Some(entry) = Self::database_entry(config, &pool.database)
                && Self::has_topology(config, &entry)
            {
                self.ensure_topology(&pool);
            }
        }
    }

    /// The pool of host `index` for the clients of `main`, in the cluster
    /// of `topology` when given (a client's routing looked the index up
    /// there: a cluster a RELOAD has replaced since gives none).
    pub fn host_pool(
        &self,
        main: &Arc<Pool>,
        index: usize,
        topology: Option<&Arc<Topology>>,
    ) -> Option<Arc<Pool>> {
        let cluster = self.cluster(&main.database)?;
        if topology.is_some_and(|t| !Arc::ptr_eq(t, &cluster.topology)) {
            return None;
        }
        cluster.host_pool(&main.user, index, |addr| {
            let config = self.config();
            let entry = Self::database_entry(&config, &main.database)?;
            let (settings, mut target, mut credential) = self.resolve(&config, &entry, &main.user);
            target.addr = addr;
            credential.keep_learned(&main.target_and_credential().1);
            Some(Pool::new(
                main.database.clone(),
                main.user.clone(),
                target,
                credential,
                settings,
                limit_for(
                    &self.db_limits,
                    &main.database,
                    settings_db_max(&config, &entry),
                ),
                limit_for(&self.user_limits, &main.user, user_max(&config, &main.user)),
            ))
        })
    }

    /// The database entry for `name`: its own, or the `*` fallback.
    fn database_entry(config: &Config, name: &str) -> Option<Database> {
        if let Some(d) = config.database(name) {
            return Some(d.clone());
        }
        config.fallback_database.as_ref().map(|d| {
            let mut d = d.clone();
            d.name = name.to_owned();
            if d.dbname.is_none() {
                d.dbname = Some(name.to_owned());
            }
            d
        })
    }

    /// The pool for a client of `database` logged in as `user`.
    pub fn pool_for(&self, database: &str, user: &str) -> Result<Arc<Pool>, PoolLookupError> {
        self.pool_to_join(database, user).map(|(pool, _)| pool)
    }

    /// The pool a login of `user` to `database` joins, held for it until
    /// the guard drops: a pool forgotten before the guard was counted (a
    /// failed login's, `forget_disposable`) is not the one returned.
    pub fn pool_to_join(
        &self,
        database: &str,
        user: &str,
    ) -> Result<(Arc<Pool>, crate::backend::pool::Joining), PoolLookupError> {
        loop {
            let pool = self.pool_as(database, user, false)?;
            let joining = pool.joining();
            let kept = {
                let pools = self.pools.lock().unwrap_or_else(|p| p.into_inner());
                let key = (pool.database.clone(), pool.user.clone());
                pools.get(&key).is_some_and(|p| Arc::ptr_eq(p, &pool))
            };
            if kept {
                // (the idle-pool janitor leaves it alone for its timeout)
                pool.touch();
                return Ok((pool, joining));
            }
        }
    }

    /// A pool of `database` for `user` exists.
    pub fn has_pool(&self, database: &str, user: &str) -> bool {
        self.pools
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(&(database.to_owned(), user.to_owned()))
    }

    /// The pool in which `auth_user` runs `auth_query` on `database`: that
    /// user's own pool, even where the entry forces another `user=`. `true`
    /// when this call made it for a database only the `*` entry stands for:
    /// an unauthenticated client named it, so a failed login forgets it
    /// ([`App::forget_disposable`]) rather than keep a pool per invented
    /// name.
    pub fn auth_pool(
        &self,
        database: &str,
        auth_user: &str,
    ) -> Result<(Arc<Pool>, bool), PoolLookupError> {
        let existed = self.has_pool(database, auth_user);
        let pool = self.pool_as(database, auth_user, true)?;
        let unlisted = self.config().database(database).is_none();
        Ok((pool, !existed && unlisted))
    }

    /// autodb_idle_timeout: forgets pools of databases only the `*` entry
    /// stands for that have been unused that long (their servers close);
    /// pool_idle_timeout: forgets any other pool of clients' that has had
    /// no client and no server that long (made again at the next login).
    pub fn free_unused_pools(&self) {
        let config = self.config();
        let autodb = config
            .fallback_database
            .as_ref()
            .map(|_| config.settings.autodb_idle_timeout)
            .filter(|t| !t.is_zero());
        let idle = Some(config.settings.pool_idle_timeout).filter(|t| !t.is_zero());
        let pools = self.pools();
        for pool in &pools {
            let listed = config.database(&pool.database).is_some();
            if !listed && config.fallback_database.is_none() {
                // (a login that found the pool just before the RELOAD
                // joined it after the RELOAD's kill)
                self.disconnect_removed(pool);
                self.free_if_removed(pool);
                continue;
            }
            let (timeout, key, without_servers) = match (listed, autodb, idle) {
                (false, Some(t), _) => (t, "autodb_idle_timeout", false),
                (true, _, Some(t)) if pool.host == 0 => (t, "pool_idle_timeout", true),
                _ => continue,
            };
            if self.forget_if_unused(pool, timeout, without_servers) {
                tracing::info!(
                    db = %pool.database, user = %pool.user,
                    "pool unused for {key} ({timeout:?}): freed"
                );
            }
        }
        // A pause or DISABLE set on a removed database after the RELOAD
        // (while its clients drained) ends once its last pool is gone.
        let held = self.pools();
        self.control.forget_removed(|db| {
            Self::database_entry(&config, db).is_some() || held.iter().any(|p| p.database == db)
        });
    }

    /// A pool of a database the configuration no longer has: its clients
    /// are disconnected, as PgBouncer disconnects them (FATAL 08P01
    /// "database removed", each told by its own task, as by KILL; one in
    /// a transaction loses it: its server is rolled back, or, mid-query,
    /// the query is cancelled and the server closed).
    fn disconnect_removed(&self, pool: &Arc<Pool>) {
        let count = self
            .cancels
            .kill_and_cut(crate::backend::cancel::Kill::DatabaseRemoved, |_, m| {
                Arc::ptr_eq(&m.pool, pool)
            });
        if count > 0 {
            tracing::info!(
                db = %pool.database, user = %pool.user,
                "database removed from the configuration: {count} clients disconnected"
            );
        }
    }

    /// A pool of a database the configuration no longer has: let go
    /// (its idle servers closed) a few seconds after no client holds it
    /// and no server of it is lent; until then SHOW POOLS, PAUSE, KILL and
    /// a safe shutdown see it.
    fn free_if_removed(&self, pool: &Arc<Pool>) {
        // Unused for a few seconds (a login on its way counts: see
        // `pool_to_join`).
        const GRACE: std::time::Duration = std::time::Duration::from_secs(3);
        if self.forget_if_unused(pool, GRACE, false) {
            tracing::info!(
                db = %pool.database, user = %pool.user,
                "database removed from the configuration and its last client gone: pool freed"
            );
        }
    }

    fn retiring_add(&self, pools: impl IntoIterator<Item = Arc<Pool>>) {
        self.retiring
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(pools);
    }

    /// Pools retired while clients may wait in them; those drained of
    /// waiters and servers are let go.
    pub fn retiring_pools(&self) -> Vec<Arc<Pool>> {
        let mut retiring = self.retiring.lock().unwrap_or_else(|p| p.into_inner());
        retiring.retain(|p| !p.drained());
        retiring.clone()
    }

    /// A pool made by a login that then failed ([`App::auth_pool`]): it
    /// is forgotten unless clients came to it meanwhile (its own, when it
    /// is the auth user's pool: forgetting it under them closed their
    /// servers after every transaction; a review).
    pub fn forget_disposable(&self, pool: &Arc<Pool>) {
        self.forget_if_unused(pool, std::time::Duration::ZERO, false);
    }

    /// Forgets `pool` if it has been unused for `timeout`
    /// ([`Pool::mark_retired_if_unused`]). The check and the removal are
    /// one step under the map's lock: a login counted after the check
    /// finds the pool gone and makes another ([`App::pool_to_join`]), none
    /// joins a pool being freed.
    fn forget_if_unused(
        &self,
        pool: &Arc<Pool>,
        timeout: std::time::Duration,
        without_servers: bool,
    ) -> bool {
        {
            let mut pools = self.pools.lock().unwrap_or_else(|p| p.into_inner());
            if !pool.mark_retired_if_unused(timeout, without_servers) {
                return false;
            }
            let key = (pool.database.clone(), pool.user.clone());
            if pools.get(&key).is_some_and(|p| Arc::ptr_eq(p, pool)) {
                pools.remove(&key);
            }
        }
        self.forget_pool(pool);
        true
    }

    /// Drops a pool (and its database's cluster, when it was the last pool
    /// of that database): its servers close as they come back.
    pub fn forget_pool(&self, pool: &Arc<Pool>) {
        let last_of_database = {
            let mut pools = self.pools.lock().unwrap_or_else(|p| p.into_inner());
            let key = (pool.database.clone(), pool.user.clone());
            if pools.get(&key).is_some_and(|p| Arc::ptr_eq(p, pool)) {
                pools.remove(&key);
            }
            !pools.keys().any(|(db, _)| *db == pool.database)
        };
        self.retiring_add([pool.clone()]);
        pool.retire();
        if last_of_database {
            let mut map = self.clusters.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(cluster) = map.remove(&pool.database) {
                cluster.retire();
                self.retiring_add(cluster.pools());
            }
            self.routing.store(!map.is_empty(), Ordering::Relaxed);
        }
    }

    /// Teaches a login's proven secret to `pool` and to the host pools of
    /// its database's cluster that log in as the same user (replicas).
    pub fn learn_secret(&self, pool: &Arc<Pool>, user: &str, learnt: &crate::auth::Learnt) {
        let mut pools = vec![pool.clone()];
        if let Some(cluster) = self.cluster(&pool.database) {
            pools.extend(cluster.pools().into_iter().filter(|p| p.user == pool.user));
        }
        for p in pools {
            p.learn(user, learnt);
        }
    }

    /// Where and as whom a login of `user` to `database` looks up a password
    /// missing from auth_file: `None` when no `auth_user` applies.
    pub fn auth_lookup(&self, database: &str, user: &str) -> Option<AuthLookup> {
        let config = self.config();
        let entry = Self::database_entry(&config, database)?;
        let s = &config.settings;
        let auth_user = entry.auth_user.clone().or_else(|| s.auth_user.clone())?;
        Some(AuthLookup {
            database: entry
                .auth_dbname
                .clone()
                .or_else(|| s.auth_dbname.clone())
                .unwrap_or_else(|| database.to_owned()),
            auth_user,
            query: entry
                .auth_query
                .clone()
                .unwrap_or_else(|| s.auth_query.clone()),
            user: user.to_owned(),
            timeout: s
                .server_connect_timeout
                .max(std::time::Duration::from_secs(1)),
        })
    }

    fn pool_as(
        &self,
        database: &str,
        user: &str,
        exact_user: bool,
    ) -> Result<Arc<Pool>, PoolLookupError> {
        let (pool, entry, created) = self.main_pool(database, user, exact_user)?;
        let config = self.config();
        if created && Self::has_topology(&config, &entry) {
            self.ensure_topology(&pool);
            if let Some((_, addr)) = self.topology(database).and_then(|t| t.primary()) {
                pool.retarget(&addr);
            }
        }
        Ok(pool)
    }

    fn main_pool(
        &self,
        database: &str,
        user: &str,
        exact_user: bool,
    ) -> Result<(Arc<Pool>, Database, bool), PoolLookupError> {
        let config = self.config();
        let entry = Self::database_entry(&config, database)
            .ok_or_else(|| PoolLookupError::NoDatabase(database.to_owned()))?;
        let server_user = match &entry.user {
            Some(forced) if !exact_user => forced.clone(),
            _ => user.to_owned(),
        };
        let key = (database.to_owned(), server_user.clone());
        let mut pools = self.pools.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = pools.get(&key) {
            return Ok((p.clone(), entry, false));
        }
        let (settings, target, credential) = self.resolve(&config, &entry, &server_user);
        let db_limit = limit_for(&self.db_limits, database, settings_db_max(&config, &entry));
        let user_limit = limit_for(
            &self.user_limits,
            &server_user,
            user_max(&config, &server_user),
        );
        let pool = Arc::new(Pool::new(
            database.to_owned(),
            server_user,
            target,
            credential,
            settings,
            db_limit,
            user_limit,
        ));
        pool.join_limits(&pool);
        pools.insert(key, pool.clone());
        Ok((pool, entry, true))
    }

    fn resolve(
        &self,
        config: &Config,
        entry: &Database,
        server_user: &str,
    ) -> (PoolSettings, ServerTarget, ServerCredential) {
        let s = &config.settings;
        let u = config.user(server_user);
        let settings = PoolSettings {
            mode: u
                .and_then(|u| u.pool_mode)
                .or(entry.pool_mode)
                .unwrap_or(s.pool_mode),
            pool_size: u
                .and_then(|u| u.pool_size)
                .or(entry.pool_size)
                .unwrap_or(s.default_pool_size),
            min_pool_size: entry.min_pool_size.unwrap_or(s.min_pool_size),
            reserve_pool_size: u
                .and_then(|u| u.reserve_pool_size)
                .or(entry.reserve_pool_size)
                .unwrap_or(s.reserve_pool_size),
            reserve_pool_timeout: s.reserve_pool_timeout,
            query_wait_timeout: u
                .and_then(|u| u.query_wait_timeout)
                .or(entry.query_wait_timeout)
                .unwrap_or(s.query_wait_timeout),
            server_idle_timeout: s.server_idle_timeout,
            server_lifetime: entry.server_lifetime.unwrap_or(s.server_lifetime),
            server_login_retry: s.server_login_retry,
            server_reset_query: s.server_reset_query.clone(),
            server_reset_query_always: s.server_reset_query_always,
            server_check_delay: s.server_check_delay,
            server_check_query: s.server_check_query.clone(),
            idle_transaction_timeout: u
                .and_then(|u| u.idle_transaction_timeout)
                .unwrap_or(s.idle_transaction_timeout),
            transaction_timeout: u
                .and_then(|u| u.transaction_timeout)
                .unwrap_or(s.transaction_timeout),
            query_timeout: u.and_then(|u| u.query_timeout).unwrap_or(s.query_timeout),
            client_idle_timeout: u
                .and_then(|u| u.client_idle_timeout)
                .unwrap_or(s.client_idle_timeout),
            max_packet_size: s.max_packet_size as usize,
            max_prepared_statements: s.max_prepared_statements as usize,
            session_objects: s.track_session_objects,
            standby: crate::backend::pool::Standby::from_attrs(
                entry.target_session_attrs.as_deref(),
            ),
            disable_pqexec: s.disable_pqexec,
            log_connections: s.log_connections,
            log_disconnections: s.log_disconnections,
            server_round_robin: s.server_round_robin,
            cancel_wait_timeout: s.cancel_wait_timeout,
            query_wait_notify: s.query_wait_notify,
            server_fast_close: s.server_fast_close,
        };
        let mut startup_params = Vec::new();
        for (k, v) in [
            ("client_encoding", &entry.client_encoding),
            ("datestyle", &entry.datestyle),
            ("timezone", &entry.timezone),
            ("application_name", &entry.application_name),
        ] {
            if let Some(v) = v {
                startup_params.push((k.to_owned(), v.clone()));
            }
        }
        let addrs = entry_addrs(entry);
        let first = entry.hosts().into_iter().next();
        let addr = match &first {
            Some(h) => ServerAddr::new(h.host.as_deref(), h.port),
            None => ServerAddr::new(None, entry.port.unwrap_or(5432)),
        };
        // A host list that routes nothing: PgBouncer 1.25's
        // load_balance_hosts over every host (a topology decides the
        // address of the others).
        let alternates = if Self::has_topology(config, entry) {
            crate::backend::target::Alternates::default()
        } else {
            crate::backend::target::Alternates::new(
                addrs,
                entry.load_balance_hosts != Some(sluice_config::LoadBalanceHosts::Disable),
            )
        };
        let target = ServerTarget {
            addr,
            alternates,
            dbname: entry.dbname.clone().unwrap_or_else(|| entry.name.clone()),
            user: server_user.to_owned(),
            startup_params,
            connect_query: entry.connect_query.clone(),
            connect_timeout: s.server_connect_timeout,
            keepalive: crate::net::Keepalive::from_settings(s),
            dns: crate::backend::dns::DnsTtl::from_settings(s),
            tls: self.server_tls(),
        };
        // The entry's password is its forced user's (or, without one, any
        // user's), never auth_user's when auth_user has a pool of its own.
        let entry_password = match &entry.user {
            Some(forced) if forced != server_user => None,
            _ => entry.password.clone(),
        };
        let mut credential = ServerCredential {
            password: entry_password,
            ..Default::default()
        };
        if credential.password.is_none() {
            match self.userlist().get(server_user) {
                Some(Secret::Plain(p)) => credential.password = Some(p.clone()),
                Some(Secret::Md5(h)) => credential.md5_hash = Some(h.clone()),
                _ => {}
            }
        }
        (settings, target, credential)
    }

    /// Creates the pools of databases with a forced user, so that
    /// `min_pool_size` holds before any client arrives.
    pub fn prewarm(&self) {
        let config = self.config();
        for db in &config.databases {
            if let Some(user) = &db.user
                && (db.min_pool_size.unwrap_or(config.settings.min_pool_size) > 0
                    || Self::has_topology(&config, db))
                && let Err(e) = self.pool_for(&db.name, user)
            {
                tracing::warn!("cannot prepare pool {}: {e}", db.name);
            }
        }
    }

    /// Takes a client slot of `database` and `user` under
    /// `max_db_client_connections` and `max_user_client_connections`;
    /// `Err` names the limit that is full.
    pub fn admit_client(&self, database: &str, user: &str) -> Result<(), &'static str> {
        let config = self.config();
        let s = &config.settings;
        let db_max = Self::database_entry(&config, database)
            .and_then(|d| d.max_db_client_connections)
            .unwrap_or(s.max_db_client_connections);
        let user_max = config
            .user(user)
            .and_then(|u| u.max_user_client_connections)
            .unwrap_or(s.max_user_client_connections);
        let db = limit_for(&self.db_client_limits, database, db_max);
        if !db.try_take() {
            return Err("max_db_client_connections");
        }
        let u = limit_for(&self.user_client_limits, user, user_max);
        if !u.try_take() {
            db.give_back();
            return Err("max_user_client_connections");
        }
        Ok(())
    }

    /// Gives back what `admit_client` took.
    pub fn release_client(&self, database: &str, user: &str) {
        for (map, name) in [
            (&self.db_client_limits, database),
            (&self.user_client_limits, user),
        ] {
            if let Some(l) = map.lock().unwrap_or_else(|p| p.into_inner()).get(name) {
                l.give_back();
            }
        }
    }

    /// Counts a refused login.
    pub fn count_login_failure(&self, sqlstate: &str) {
        let mut m = self
            .login_failures
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        *m.entry(sqlstate.to_owned()).or_default() += 1;
    }

    /// Per-database totals of all pools (SHOW STATS, the averages sampler).
    pub fn totals_by_database(
        &self,
    ) -> std::collections::BTreeMap<String, crate::backend::stats::PoolStats> {
        let mut out: std::collections::BTreeMap<String, crate::backend::stats::PoolStats> =
            std::collections::BTreeMap::new();
        for p in self.pools() {
            out.entry(p.database.clone()).or_default().merge(&p.stats());
        }
        out
    }

    /// Applies a newly loaded configuration and auth_file (RELOAD/SIGHUP):
    /// pools take new sizes, timeouts, targets and passwords in place.
    pub fn reload(&self, config: Config, userlist: Option<Userlist>) {
        if let Some(userlist) = userlist {
            *self.userlist.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(userlist);
        }
        *self.config.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(config);
        let config = self.config();
        crate::held_memory::set_limit_mb(config.settings.max_held_memory_mb);
        self.reload_topologies(&config);
        let pools = self.pools();
        for pool in pools {
            let Some(entry) = Self::database_entry(&config, &pool.database) else {
                // Removed: its clients are disconnected (new logins get
                // 3D000); a pool no client has held for a few seconds is
                // let go now, its idle servers closed, so that the
                // database can be dropped; the others a few seconds after
                // their last client leaves (`free_unused_pools`).
                self.disconnect_removed(&pool);
                self.free_if_removed(&pool);
                continue;
            };
            let (settings, target, credential) = self.resolve(&config, &entry, &pool.user);
            let topology = self.topology(&pool.database);
            // Where a cluster decides addresses, the RELOAD keeps them
            // (read under the pool's lock: a retarget racing it stands):
            // a host pool's is its host's, the clients' pool follows the
            // primary.
            let keep_addr = topology.is_some() || pool.host != 0;
            limit_for(
                &self.db_limits,
                &pool.database,
                settings_db_max(&config, &entry),
            );
            limit_for(&self.user_limits, &pool.user, user_max(&config, &pool.user));
            pool.reconfigure(settings, target, credential, keep_addr);
            if pool.host == 0
                && let Some(t) = &topology
            {
                match t.primary() {
                    Some((_, addr)) => {
                        pool.retarget(&addr);
                    }
                    // Not on any host now (the list changed): the first
                    // host named until a primary is found.
                    None if !t.is_listed(&pool.addr()) => {
                        if let Some(first) = t.configured().first() {
                            pool.retarget(first);
                        }
                    }
                    None => {}
                }
            }
        }
        // (its clients are gone or going: its switches go now)
        self.control
            .forget_removed(|db| Self::database_entry(&config, db).is_some());
        self.new_route_epoch();
        self.prewarm();
    }
}

fn settings_db_max(config: &Config, entry: &Database) -> u32 {
    entry
        .max_db_connections
        .unwrap_or(config.settings.max_db_connections)
}

fn user_max(config: &Config, user: &str) -> u32 {
    config
        .user(user)
        .and_then(|u| u.max_user_connections)
        .unwrap_or(config.settings.max_user_connections)
}

/// The shared limit named `name`, created or updated to `max`.
fn limit_for(map: &Mutex<HashMap<String, Arc<ConnLimit>>>, name: &str, max: u32) -> Arc<ConnLimit> {
    let mut m = map.lock().unwrap_or_else(|p| p.into_inner());
    let limit = m
        .entry(name.to_owned())
        .or_insert_with(|| Arc::new(ConnLimit::new(max)))
        .clone();
    limit.set_max(max);
    limit
}

/// The hosts `entry` names, as addresses; none when it names only a
/// Patroni (its hosts are then Patroni's members).
fn entry_addrs(entry: &Database) -> Vec<ServerAddr> {
    if entry.host.as_deref().is_none_or(|h| h.trim().is_empty()) && !entry.patroni.is_empty() {
        return Vec::new();
    }
    entry
        .hosts()
        .into_iter()
        .map(|h| ServerAddr::new(h.host.as_deref(), h.port))
        .collect()
}

impl App {
    /// A database whose hosts are Patroni's members has nowhere to send a
    /// new pool's first login until Patroni has named them and the checks
    /// found the primary: a login waits for that, up to `failover_hold`
    /// (at least one check), and gets 08006 after.
    pub async fn wait_for_members(&self, pool: &Arc<Pool>) -> Result<(), String> {
        let Some(topology) = self.topology(&pool.database).filter(|t| t.learns_hosts()) else {
            return Ok(());
        };
        let config = self.config();
        let s = &config.settings;
        // (at least long enough for every Patroni URL to time out once
        // and a check to follow)
        let asks = u32::try_from(topology.patroni.len()).unwrap_or(u32::MAX);
        let hold = s.failover_hold.max(
            s.health_check_timeout
                .saturating_mul(asks.saturating_add(1))
                + s.health_check_period,
        );
        let deadline = tokio::time::Instant::now() + hold;
        loop {
            if topology.is_listed(&pool.addr()) {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline || self.phase() >= Phase::WaitForServers {
                return Err(format!(
                    "no primary for database \"{}\" within failover_hold ({hold:?}): Patroni \
                         ({}) has named none that answers",
                    pool.database,
                    topology.patroni.join(", ")
                ));
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
}

impl crate::backend::monitor::MonitorHost for App {
    fn dns_ttl(&self) -> crate::backend::dns::DnsTtl {
        crate::backend::dns::DnsTtl::from_settings(&self.config().settings)
    }

    fn check_settings(&self) -> (std::time::Duration, std::time::Duration, u32) {
        let config = self.config();
        let s = &config.settings;
        (
            s.health_check_period,
            s.health_check_timeout,
            s.health_check_threshold,
        )
    }

    fn stopping(&self) -> bool {
        self.phase() >= Phase::WaitForServers
    }

    fn is_current(&self, topology: &Arc<Topology>) -> bool {
        self.topology(&topology.database)
            .is_some_and(|t| Arc::ptr_eq(&t, topology))
    }

    /// The pools clients log in to follow the primary of the newest
    /// timeline; while there is none, they keep their address. Only the
    /// database's current topology speaks (one a RELOAD replaced may live
    /// on a while in a client's route cache).
    fn topology_changed(&self, topology: &Arc<Topology>) {
        if !self.is_current(topology) {
            return;
        }
        let Some((_, addr)) = topology.primary() else {
            return;
        };
        for pool in self.main_pools() {
            if pool.database == topology.database && pool.retarget(&addr) {
                tracing::warn!(db = %pool.database, user = %pool.user, "servers now open on the primary {addr}");
            }
        }
    }

    /// New members get their checks (logging in as a pool of the
    /// database does); a place another member took has its host pools
    /// point at it (their old servers close); clients look their routes
    /// up again.
    fn host_answered(&self, topology: &Arc<Topology>, i: usize, user: &str) {
        if let Some(cluster) = self.cluster(&topology.database)
            && Arc::ptr_eq(&cluster.topology, topology)
        {
            cluster.forget_login_failure(user, i);
        }
    }

    fn hosts_changed(&self, topology: &Arc<Topology>, news: &crate::backend::topology::MemberNews) {
        if !self.is_current(topology) {
            return;
        }
        if !news.added.is_empty()
            && let Some(me) = self.me.get().and_then(std::sync::Weak::upgrade)
            && let Some(pool) = self
                .main_pools()
                .into_iter()
                .find(|p| p.database == topology.database)
        {
            let host: Arc<dyn crate::backend::monitor::MonitorHost> = me;
            crate::backend::monitor::start_hosts(
                host,
                topology,
                &pool,
                news.added.clone(),
                |task| self.spawn_on_worker(task),
            );
        }
        if !news.readdressed.is_empty()
            && let Some(cluster) = self.cluster(&topology.database)
        {
            cluster.readdress(&news.readdressed);
        }
        self.new_route_epoch();
    }
}
