//! Authentication: checking clients against the auth_file (PgBouncer's
//! userlist.txt) and logging in to PostgreSQL with passwords or SCRAM keys.

pub mod md5;
pub mod scram;
pub mod userlist;

pub use userlist::{Secret, Userlist};
