//! Authentication: checking clients against the auth_file (PgBouncer's
//! userlist.txt) and logging in to PostgreSQL with passwords or SCRAM keys.

pub mod hba;
pub mod md5;
pub mod rules;
pub mod scram;
pub mod userlist;

pub use userlist::{Secret, Userlist};

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
