//! Throwaway PostgreSQL clusters for sluice's tests, benchmarks and lab.
//!
//! Every [`Cluster`] lives in its own temp directory on its own port, starts
//! in well under a second (no fsync, small buffers), and is stopped and
//! deleted when dropped. When the process runs as root, server tools run as
//! the `postgres` system user, because PostgreSQL refuses to run as root.
//!
//! ```no_run
//! let pg = sluice_testkit::Cluster::builder()
//!     .auth(sluice_testkit::ServerAuth::ScramSha256)
//!     .user("app", "secret")
//!     .start()?;
//! assert_eq!(pg.psql("postgres", "SELECT 1")?, "1");
//! # Ok::<(), sluice_testkit::TestkitError>(())
//! ```

mod bin_paths;
mod builder;
mod cluster;
mod command;
mod error;
mod initdb;
mod patroni;
mod pg_ctl;
mod port;
mod primary;
mod replica;
mod server_conf;
mod server_owner;
mod sql;
mod stale_dirs;
mod temp_dir;

pub use bin_paths::{BINDIR_ENV, bindir, pgbench_path, psql_path};
pub use builder::ClusterBuilder;
pub use cluster::{Cluster, SUPERUSER_PASSWORD};
pub use error::TestkitError;
pub use patroni::{PATRONI_SUPERUSER, PatroniCluster, PatroniNode};
pub use port::free_port;
pub use server_conf::ServerAuth;
