//! Streaming replicas: pg_basebackup from a running cluster into a new temp
//! dir, give the copy its own port and socket, start it, and wait until it
//! is in recovery and its WAL receiver is streaming.

use std::time::{Duration, Instant};

use crate::bin_paths::tool;
use crate::cluster::Cluster;
use crate::command::{RunAs, pg_command, run};
use crate::error::TestkitError;
use crate::stale_dirs;
use crate::temp_dir::TempDir;

const BASEBACKUP_DEADLINE: Duration = Duration::from_secs(300);
const STREAMING_DEADLINE: Duration = Duration::from_secs(60);
const POLL_INTERVAL: Duration = Duration::from_millis(50);

impl Cluster {
    /// A hot standby of this cluster (`pg_basebackup -R -X stream`), started
    /// on its own port and already streaming. It has the same settings,
    /// roles and pg_hba.conf; dropping it removes it.
    pub fn start_replica(&self) -> Result<Cluster, TestkitError> {
        stale_dirs::sweep_once();
        let dir = TempDir::create()?;
        let mut replica = Cluster::unstarted(dir, self.conf.clone());
        self.base_backup_into(&replica)?;
        // The copied log belongs to the primary.
        let _ = std::fs::remove_file(&replica.log_file);
        replica.start_on_free_port()?;
        replica.wait_until_streaming()?;
        Ok(replica)
    }

    fn base_backup_into(&self, replica: &Cluster) -> Result<(), TestkitError> {
        let mut cmd = pg_command(&tool("pg_basebackup")?, RunAs::ServerOwner)?;
        cmd.arg("-D").arg(&replica.data_dir);
        cmd.args(["-R", "-X", "stream", "-c", "fast", "--no-sync"]);
        self.add_socket_args(&mut cmd);
        run(cmd, BASEBACKUP_DEADLINE).map(drop)
    }

    fn wait_until_streaming(&self) -> Result<(), TestkitError> {
        let deadline = Instant::now() + STREAMING_DEADLINE;
        let mut last_seen = String::new();
        while Instant::now() < deadline {
            match self.psql(
                "postgres",
                "SELECT pg_is_in_recovery(), (SELECT status FROM pg_stat_wal_receiver)",
            ) {
                Ok(state) if state == "t|streaming" => return Ok(()),
                Ok(state) => last_seen = state,
                Err(e) => last_seen = e.to_string(),
            }
            std::thread::sleep(POLL_INTERVAL);
        }
        Err(TestkitError::Timeout {
            what: format!(
                "replica on port {} to stream (last state: {last_seen:?})",
                self.port
            ),
            after: STREAMING_DEADLINE,
        })
    }
}
