//! Server side: connections to PostgreSQL, their login, and the pools that
//! share them among clients within the configured limits.

pub mod cancel;
pub mod cancel_request;
pub mod cluster;
pub mod dns;
pub mod idle;
pub mod limits;
pub mod login;
pub mod monitor;
pub mod notify_hub;
pub mod patroni;
pub mod peers;
pub mod pool;
pub mod server;
pub mod stats;
pub mod target;
pub mod topology;
pub mod worker_id;
