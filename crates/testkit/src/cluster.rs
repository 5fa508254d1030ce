//! A running throwaway cluster: where it is, how to reach it, running SQL and
//! pgbench against it, controlling its lifecycle, and tearing it down (server
//! stopped immediately, directory removed) when dropped.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::bin_paths::{pgbench_path, psql_path};
use crate::builder::ClusterBuilder;
use crate::command::{RunAs, pg_command, run};
use crate::error::TestkitError;
use crate::pg_ctl::{self, StopMode};
use crate::port::free_port;
use crate::server_conf::{LOG_FILE, ServerConf};
use crate::temp_dir::TempDir;

/// Address the server listens on.
pub(crate) const HOST: &str = "127.0.0.1";
/// Superuser name; its password is the same string.
pub(crate) const SUPERUSER: &str = "postgres";
/// Password set for [`SUPERUSER`].
pub const SUPERUSER_PASSWORD: &str = "postgres";

/// Deadline for one psql invocation.
const PSQL_DEADLINE: Duration = Duration::from_secs(300);
/// How many fresh ports to try when another process steals ours.
const START_ATTEMPTS: usize = 8;

/// A throwaway PostgreSQL cluster in its own temp directory on its own port.
///
/// Dropping it stops the server (`pg_ctl stop -m immediate`) and deletes the
/// directory, also when a test panics.
#[derive(Debug)]
pub struct Cluster {
    pub(crate) port: u16,
    pub(crate) data_dir: PathBuf,
    pub(crate) log_file: PathBuf,
    pub(crate) conf: ServerConf,
    /// Declared last: dropped (deleted) after `Drop::drop` stopped the server.
    pub(crate) dir: TempDir,
}

impl Cluster {
    /// Starts describing a new primary cluster.
    pub fn builder() -> ClusterBuilder {
        ClusterBuilder::default()
    }

    /// A cluster whose data directory is `<dir>/data`, not yet started.
    pub(crate) fn unstarted(dir: TempDir, conf: ServerConf) -> Cluster {
        let data_dir = dir.path().join("data");
        Cluster {
            port: 0,
            log_file: data_dir.join(LOG_FILE),
            data_dir,
            conf,
            dir,
        }
    }

    /// Writes the configuration for a fresh free port and starts the server,
    /// moving to another port when the chosen one was taken meanwhile.
    pub(crate) fn start_on_free_port(&mut self) -> Result<(), TestkitError> {
        let mut attempt = 1;
        loop {
            self.port = free_port()?;
            self.conf
                .write(&self.data_dir, self.port, self.dir.path())?;
            match pg_ctl::start(&self.data_dir, &self.log_file, self.port) {
                Err(e) if attempt < START_ATTEMPTS && pg_ctl::is_address_in_use(&e) => {
                    attempt += 1;
                }
                result => return result,
            }
        }
    }

    /// Always "127.0.0.1".
    pub fn host(&self) -> &str {
        HOST
    }

    /// The TCP port (the unix socket uses the same number).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Directory holding the unix socket `.s.PGSQL.<port>`.
    pub fn socket_dir(&self) -> &Path {
        self.dir.path()
    }

    /// The data directory (PGDATA).
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// Always "postgres"; its password is also "postgres".
    pub fn superuser(&self) -> &str {
        SUPERUSER
    }

    /// Runs `sql` with `psql -X -A -t -v ON_ERROR_STOP=1 -c` as the superuser
    /// over the unix socket and returns stdout, trimmed. A multi-statement
    /// string runs as one implicit transaction (so no CREATE DATABASE in it).
    pub fn psql(&self, db: &str, sql: &str) -> Result<String, TestkitError> {
        self.psql_each(db, &[sql])
    }

    /// Like [`Cluster::psql`] with one `-c` per statement, each in its own
    /// transaction.
    pub(crate) fn psql_each(&self, db: &str, statements: &[&str]) -> Result<String, TestkitError> {
        let mut cmd = pg_command(&psql_path()?, RunAs::Invoker)?;
        cmd.args(["-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1"]);
        self.add_socket_args(&mut cmd);
        cmd.arg("-d").arg(db);
        for statement in statements {
            cmd.arg("-c").arg(statement);
        }
        Ok(run(cmd, PSQL_DEADLINE)?.stdout.trim().to_owned())
    }

    /// `pgbench -i -q -s <scale>` on `db`.
    pub fn pgbench_init(&self, db: &str, scale: u32) -> Result<(), TestkitError> {
        let mut cmd = pg_command(&pgbench_path()?, RunAs::Invoker)?;
        cmd.args(["-i", "-q", "-s", &scale.to_string()]);
        self.add_socket_args(&mut cmd);
        cmd.arg(db);
        let deadline = Duration::from_secs(300 + 60 * u64::from(scale));
        run(cmd, deadline).map(drop)
    }

    /// `-h <socket dir> -p <port> -U postgres`.
    pub(crate) fn add_socket_args(&self, cmd: &mut std::process::Command) {
        cmd.arg("-h")
            .arg(self.socket_dir())
            .args(["-p", &self.port.to_string(), "-U", SUPERUSER]);
    }

    /// `pg_ctl stop -m fast`; the cluster stays on disk for [`Cluster::start_again`].
    pub fn stop(&self) -> Result<(), TestkitError> {
        pg_ctl::stop(&self.data_dir, StopMode::Fast)
    }

    /// `pg_ctl start -w` on the same port after [`Cluster::stop`].
    pub fn start_again(&self) -> Result<(), TestkitError> {
        pg_ctl::start(&self.data_dir, &self.log_file, self.port)
    }

    /// `pg_ctl restart -m fast -w` on the same port.
    pub fn restart(&self) -> Result<(), TestkitError> {
        pg_ctl::restart(&self.data_dir, &self.log_file, self.port)
    }

    /// A shell command line that does what [`Cluster::restart`] does, for
    /// programs outside this process (the driver suites under `compat/`):
    /// `pg_ctl restart -m fast -w`, as the `postgres` user when we are root.
    pub fn restart_command_line(&self) -> Result<String, TestkitError> {
        let pg_ctl = crate::bin_paths::tool("pg_ctl")?;
        let as_owner = match crate::server_owner::server_owner()? {
            Some(_) => "runuser -u postgres -- ",
            None => "",
        };
        Ok(format!(
            "cd / && {as_owner}'{}' restart -D '{}' -l '{}' -m fast -w -t 60 >/dev/null",
            pg_ctl.display(),
            self.data_dir.display(),
            self.log_file.display()
        ))
    }

    /// The server's log so far (empty if it cannot be read).
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log_file).unwrap_or_default()
    }

    /// `pg_ctl promote -w`: this replica becomes a primary (on a new
    /// timeline) and stops following its old primary.
    pub fn promote(&self) -> Result<(), TestkitError> {
        pg_ctl::promote(&self.data_dir)
    }

    /// `pg_ctl reload`: re-reads postgresql.conf and pg_hba.conf.
    pub fn pg_ctl_reload(&self) -> Result<(), TestkitError> {
        pg_ctl::reload(&self.data_dir)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.data_dir.join("postmaster.pid").exists() {
            let _ = pg_ctl::stop(&self.data_dir, StopMode::Immediate);
        }
        // `self.dir` is dropped next, which deletes the directory.
    }
}
