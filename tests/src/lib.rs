//! Harness for sluice's integration tests: runs the real `sluice` binary in
//! front of throwaway PostgreSQL clusters (from `sluice-testkit`) and drives
//! it with real clients (tokio-postgres, psql, pgbench, raw sockets).
//!
//! Every helper bounds its waits, so a misbehaving pooler fails a test
//! instead of hanging the suite.

mod backends;
mod certs;
mod client;
mod clusters;
mod config;
mod console;
pub mod http;
mod limits;
pub mod msg;
mod process;
mod raw;
mod scratch;
pub mod sockets;
mod tls_client;
mod tools;
mod wait;

pub use backends::{count_backends, count_backends_psql, wait_for_backends};
pub use certs::Certs;
pub use client::{
    Tracked, column, config_for, connect, connect_as, connect_config, connect_listening,
    connect_tracked, expect_sqlstate, scalar, scalar_text, spawn_query, sqlstate,
    superuser_connect,
};
pub use clusters::{app_cluster, app_cluster_with, app_table, grant_create};
pub use config::ConfigBuilder;
pub use console::{ConsoleRow, console_rows, row_field};
pub use limits::{MigrateQueuedConnections, raise_fd_limit};
pub use process::{SluiceProcess, run_sluice, sluice_binary};
pub use raw::{
    RawClient, RawReply, error_field, error_fields, execute_message, length_prefixed,
    query_message, ssl_request, startup_packet,
};
pub use scratch::ScratchDir;
pub use sluice_testkit::{Cluster, ServerAuth};
pub use tls_client::RustlsConnector;
pub use tools::{
    ToolOutput, pgbench, pgbench_env, pgbench_failed, pgbench_processed, pgbench_select_one_ok,
    psql, psql_conninfo, psql_interactive, refused_at_startup, run as run_tool,
};
pub use wait::{eventually, eventually_sync};

/// User name the tests use for their own non-superuser roles.
pub const APP_USER: &str = "app";
/// Password of [`APP_USER`] in the clusters and in the auth files.
pub const APP_PASSWORD: &str = "app-secret";
