//! Authentication: checking clients against the auth_file (PgBouncer's
//! userlist.txt) and logging in to PostgreSQL with passwords or SCRAM keys.

pub mod hba;
pub mod md5;
pub mod rules;
pub mod scram;
pub mod userlist;

pub use userlist::{Secret, Userlist};

/// PBKDF2 (a plain password checked against a SCRAM secret, a SCRAM
/// secret made from a plain one) costs up to ~100 ms of CPU with a
/// secret's iterations (4,096 to 100,000). It runs off the event loop, a
/// few at a time, for client logins and the web console's logins alike: a
/// flood of wrong passwords queues here (within `client_login_timeout`, or
/// the HTTP request's time) instead of stalling the transactions of the
/// clients on the same worker. `None`: the work could not run.
pub async fn derive<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    static DERIVING: std::sync::LazyLock<std::sync::Arc<tokio::sync::Semaphore>> =
        std::sync::LazyLock::new(|| {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            std::sync::Arc::new(tokio::sync::Semaphore::new((cores / 2).max(1)))
        });
    let turn = DERIVING.clone().acquire_owned().await.ok()?;
    // (the turn is held by the work itself: a login given up meanwhile
    // does not let another derivation start beside it)
    tokio::task::spawn_blocking(move || {
        let done = work();
        drop(turn);
        done
    })
    .await
    .ok()
}

/// What a client's login proved that lets sluice log in to the server as
/// that user without a configured password.
#[derive(Debug, Default)]
pub struct Learnt {
    /// From a SCRAM exchange against a stored SCRAM secret.
    pub scram_keys: Option<scram::ScramKeys>,
    /// An md5 hash auth_query returned (md5(password || user), hex).
    pub md5_hash: Option<String>,
    /// The console user pgbouncer over the Unix socket from sluice's own
    /// OS user: an admin whatever admin_users says (PgBouncer's rule).
    pub local_admin: bool,
}
