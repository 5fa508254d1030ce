//! The state of a logged-in client, apart from what it does: its stream,
//! pool, settings, what it carries between servers, and what routing keeps
//! for it. The session loop (`session.rs`), the relay and the tracked
//! statements all work on it; keeping it here lets them depend on it
//! without depending on one another.

use std::sync::Arc;
use std::time::Duration;

use crate::app::App;
use crate::backend::cancel::CancelHandle;
use crate::backend::pool::Pool;
use crate::net::Stream;
use crate::params::ParamSet;

/// A client after login.
pub struct Client {
    pub stream: Stream,
    pub app: Arc<App>,
    pub pool: Arc<Pool>,
    /// Tracked parameters as the client set them.
    pub params: Arc<ParamSet>,
    pub cancel: CancelHandle,
    /// The login name, kept only when the pool logs in as a forced user
    /// (otherwise it is the pool's user).
    pub(super) login_user: Option<Box<str>>,
    /// Its share of `max_held_memory_mb`: the largest message held whole
    /// since its read buffer was last given back.
    pub(super) held: crate::held_memory::Grant,
    /// What the client carries from server to server; boxed once it has
    /// any, so that an idle client without any costs one pointer.
    pub(super) carried: Option<Box<Carried>>,
    /// `client_idle_timeout` as of the last lease (zero = none; `None`
    /// before the first lease).
    pub(super) idle_timeout: Option<Duration>,
    /// The client's last transaction that may have written (only where
    /// reads are routed): read-your-writes.
    pub(super) last_write: Option<Written>,
    /// Set by the session before a lease: the relay reads the primary's
    /// WAL position after the transaction (read-your-writes) into
    /// `commit_lsn`.
    pub(super) want_commit_lsn: bool,
    pub(super) commit_lsn: Option<u64>,
    /// `read_your_writes = database`, set by the session before a lease
    /// of the primary that may write: the relay tells this topology when
    /// each of the period's transactions ends, and the WAL position read
    /// after it (`commit_lsn`) goes there too.
    pub(super) write_ends: Option<Arc<crate::backend::topology::Topology>>,
    /// `read_your_writes = database`, set by the session before a lease
    /// of a replica: a block left open there has each of its later
    /// requests wait for the replica to replay the writes that ended
    /// before it (`relay::replay`).
    pub(super) replica_watch: Option<Box<ReplicaWatch>>,
    /// It was served in transaction or statement mode: what it carries
    /// (statements under sluice's names, settings) follows it from server
    /// to server, so it stays served so after a RELOAD to session mode
    /// (`Client::mode`).
    pub(super) served_pooled: bool,
    /// A read routed to a replica, kept to run again on the primary if the
    /// replica refuses it (see `cycle::Retry`).
    pub(super) retry_query: Option<bytes::Bytes>,
    /// The next request goes to the primary (its retry).
    pub(super) force_primary: bool,
    /// This lease is the primary's, in a database that routes reads.
    pub(super) on_routed_primary: bool,
    /// This lease is the primary's, for a read the router sent there.
    pub(super) primary_read: bool,
    /// Requests run again in a row because their server was found dead.
    pub(super) lost_retries: u8,
    /// When the request now going round again began to wait, if a PAUSE
    /// sent it back from the pool's line (its query_wait_timeout counts
    /// from there).
    pub(super) queued_since: Option<crate::clock::Mono>,
    /// Servers in a row that refused the client's settings (`relay::sync::SYNC_TRIES`).
    pub(super) sync_refusals: u8,
    /// A server has taken the client's session settings (applied them, or
    /// they were read back from it): a server refusing them later refuses
    /// them for its own history. Startup settings are not yet.
    pub(super) settings_proven: bool,
    /// A replica refused the client's read for its isolation level (a role
    /// or database whose transactions default to serializable, which a
    /// standby refuses): its reads stay on the primary until then, instead
    /// of paying two round trips each.
    pub(super) replicas_after: Option<std::time::Instant>,
    /// The client has sent a transaction that reads only: the primary's
    /// WAL position is read after its writes (read-your-writes). A client
    /// that only ever writes does not pay for it.
    pub(super) reads_routed: bool,
    /// Routing's lookups, kept while they hold (see `RouteCache`).
    pub(super) route_cache: Option<Box<RouteCache>>,
    /// Its slot, key and counts are given back (`leave`).
    left: bool,
}

/// What routing looked up for a client, kept while the app's routing
/// epoch stands (a RELOAD or a topology made or dropped ends it): a
/// transaction finds its database's topology, settings, lag limits and
/// host pools without a shared lock or an allocation.
pub(super) struct RouteCache {
    pub(super) epoch: u64,
    pub(super) topology: Option<Arc<crate::backend::topology::Topology>>,
    pub(super) settings: Arc<crate::backend::pool::PoolSettings>,
    pub(super) limits: (
        crate::backend::topology::LagLimits,
        sluice_config::ReadYourWrites,
    ),
    /// Host pools by host index, looked up on first use.
    pub(super) hosts: Vec<Option<Arc<Pool>>>,
}

/// When a client's transaction that may have written ended, and the
/// primary's WAL position right after it when that could be read.
#[derive(Debug, Clone, Copy)]
pub(super) struct Written {
    pub(super) at: std::time::Instant,
    pub(super) lsn: Option<u64>,
}

/// A replica lease under `read_your_writes = database` (see
/// `Client::replica_watch`).
pub(super) struct ReplicaWatch {
    pub(super) topology: Arc<crate::backend::topology::Topology>,
    /// The replica's index in the topology.
    pub(super) host: usize,
    /// A position it is known to have replayed.
    pub(super) seen: u64,
    /// The longest wait for one request: `replica_max_lag`, the lag past
    /// which the router stops sending it reads.
    pub(super) wait: Duration,
}

/// How many dead servers in a row a request may meet before its client
/// gets the error (each is closed: a pool of stale servers empties fast).
pub(super) const LOST_RETRIES: u8 = 8;

/// What a transaction-mode client keeps of its session while it holds no
/// server: its named statements, its settings, its LISTENs.
#[derive(Default)]
pub struct Carried {
    pub statements: crate::prepared::client_names::ClientNames,
    /// Session settings that follow the client.
    pub session: Option<Arc<crate::session_vars::SessionVars>>,
    /// Their share of `max_held_memory_mb` (review 35: clients holding
    /// settings of 1 MB each grew sluice past the budget unseen).
    pub session_held: crate::held_memory::Grant,
    /// Those it logged in with (startup parameters, `options=-c`): what
    /// RESET, RESET ALL and DISCARD ALL give back, as PostgreSQL's do.
    pub startup: Option<Arc<crate::session_vars::SessionVars>>,
    /// Channels the client LISTENs to through the pool's hub.
    pub listen: Option<Box<Listening>>,
    /// Bytes the client sent with its login, after it (a request written
    /// without waiting for ReadyForQuery): the session reads them first.
    pub early: bytes::BytesMut,
    /// A lone `BEGIN … READ ONLY` sluice answered without a server (the
    /// Query message, as sent): the block opens on the server its first
    /// request goes to (see `Client::defer_begin`).
    pub deferred_begin: Option<crate::backend::pool::DeferredBlock>,
}

/// A client's subscription to its pool's LISTEN hub; leaving unsubscribes.
pub struct Listening {
    pub id: u64,
    pub rx: crate::backend::notify_hub::Inbox,
    pub tx: crate::backend::notify_hub::Outbox,
    /// Channels of the client's committed LISTENs: what reaches it. The
    /// hub may also send for a LISTEN whose transaction has not ended
    /// (or has just rolled back).
    pub channels: std::collections::HashSet<String>,
    pool: Arc<Pool>,
}

static NEXT_LISTENER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

impl Listening {
    pub(super) fn new(pool: Arc<Pool>) -> Self {
        let (tx, rx) = crate::backend::notify_hub::mailbox();
        Self {
            id: NEXT_LISTENER.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            rx,
            tx,
            channels: std::collections::HashSet::new(),
            pool,
        }
    }

    /// Adds `notification` to `batch` if the client listens to its
    /// channel (a LISTEN rolled back, or an UNLISTEN committed, before it
    /// was delivered: dropped, as PostgreSQL drops it); the hub's own
    /// warnings (NoticeResponse) always.
    pub fn pass(&self, batch: &mut bytes::BytesMut, notification: &[u8]) {
        if notification.first() == Some(&sluice_wire::tags::backend::NOTICE_RESPONSE)
            || crate::backend::notify_hub::notification_channel(notification)
                .is_some_and(|c| self.channels.contains(c))
        {
            batch.extend_from_slice(notification);
        }
    }
}

impl Drop for Listening {
    fn drop(&mut self) {
        self.pool.notify.unsubscribe(self.id, None);
    }
}

/// Timeout for best-effort cleanup queries (ROLLBACK, reset query).
pub const CLEANUP_TIMEOUT: Duration = Duration::from_secs(5);

impl Drop for Client {
    fn drop(&mut self) {
        self.leave();
    }
}

impl Client {
    /// The pool mode this client is served in: the pool's, except that a
    /// client served in transaction or statement mode that carries
    /// anything stays in transaction mode after a RELOAD to session mode
    /// (its Binds would reach the server under names the server never
    /// got: review 40). It takes session mode when it logs in again.
    pub(super) fn mode(
        &self,
        settings: &crate::backend::pool::PoolSettings,
    ) -> sluice_config::PoolMode {
        match settings.mode {
            sluice_config::PoolMode::Session if self.kept_pooled() => {
                sluice_config::PoolMode::Transaction
            }
            mode => mode,
        }
    }

    /// Whether it stays in transaction mode should its pool's be session
    /// (`Client::mode`).
    pub(super) fn kept_pooled(&self) -> bool {
        self.served_pooled && self.carried.is_some()
    }

    pub fn new(
        stream: Stream,
        app: Arc<App>,
        pool: Arc<Pool>,
        params: Arc<ParamSet>,
        cancel: CancelHandle,
        user: String,
    ) -> Self {
        let login_user = (user != pool.user).then(|| user.into_boxed_str());
        Self {
            stream,
            app,
            pool,
            params,
            cancel,
            login_user,
            held: Default::default(),
            carried: None,
            idle_timeout: None,
            last_write: None,
            want_commit_lsn: false,
            write_ends: None,
            replica_watch: None,
            served_pooled: false,
            commit_lsn: None,
            retry_query: None,
            force_primary: false,
            on_routed_primary: false,
            primary_read: false,
            lost_retries: 0,
            queued_since: None,
            sync_refusals: 0,
            settings_proven: false,
            replicas_after: None,
            reads_routed: false,
            route_cache: None,
            left: false,
        }
    }

    /// Gives back the client's cancel slot, its pool's and its database's
    /// counts: once, when it says goodbye, or when its task ends any other
    /// way (a panic unwinding left a ghost client counted for good, and
    /// max_db_client_connections refused real ones; found by a review).
    pub fn leave(&mut self) {
        if std::mem::replace(&mut self.left, true) {
            return;
        }
        self.app.cancels.unregister(self.cancel);
        self.pool.client_left();
        self.app.release_client(self.database(), self.user());
    }

    /// What the client carries, created on first use.
    pub fn carried(&mut self) -> &mut Carried {
        self.carried.get_or_insert_with(Box::default)
    }

    /// What the client sent after its login packet before the session
    /// began (empty, nearly always).
    pub fn take_early(&mut self) -> bytes::BytesMut {
        self.carried
            .as_deref_mut()
            .map(|c| std::mem::take(&mut c.early))
            .unwrap_or_default()
    }

    /// The client's named statements, if it has any state at all.
    pub fn statements_if_any(&mut self) -> Option<&mut crate::prepared::client_names::ClientNames> {
        self.carried.as_deref_mut().map(|c| &mut c.statements)
    }

    /// The client's session settings (`None`: nothing set).
    pub fn session(&self) -> &Option<Arc<crate::session_vars::SessionVars>> {
        const NOTHING: &Option<Arc<crate::session_vars::SessionVars>> = &None;
        self.carried.as_ref().map_or(NOTHING, |c| &c.session)
    }

    /// The client now keeps (Some) or no longer keeps its server for the
    /// session objects it owns there; logged, and shown in SHOW CLIENTS.
    pub fn set_pinned(&mut self, reason: Option<String>) {
        match &reason {
            Some(why) => tracing::info!(
                user = %self.user(), db = %self.database(),
                "client pinned to its server by its session objects ({why})"
            ),
            None => tracing::debug!(user = %self.user(), db = %self.database(), "client unpinned"),
        }
        self.app
            .cancels
            .set_pinned(self.cancel, reason.map(String::into_boxed_str));
    }

    pub fn set_session(&mut self, vars: Option<Arc<crate::session_vars::SessionVars>>) {
        if vars.is_some() || self.carried.is_some() {
            self.carried().session = vars;
        }
    }

    pub(super) fn is_listening(&self) -> bool {
        self.carried.as_ref().is_some_and(|c| c.listen.is_some())
    }

    /// The name the client logged in with.
    pub fn user(&self) -> &str {
        self.login_user.as_deref().unwrap_or(&self.pool.user)
    }

    pub fn database(&self) -> &str {
        &self.pool.database
    }
}
