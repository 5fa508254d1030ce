//! A throwaway Patroni + etcd cluster on loopback ports, from Debian's
//! `patroni` and `etcd-server` packages: the high-availability stack the
//! seed ran (E5), for tests of a pooler that follows its leader.
//!
//! One etcd and `n` Patroni nodes live in one temp directory; node 0
//! bootstraps and leads at first, the others join as streaming replicas.
//! Patroni runs as the `postgres` OS user when the tests run as root.
//! Dropping the cluster kills each Patroni, stops its PostgreSQL
//! immediately (Patroni starts the postmaster in a session of its own, so
//! it outlives a killed Patroni), stops etcd and deletes the directory.
//! Patroni's REST API is spoken with a few lines of HTTP/1.0 by hand: the
//! testkit needs four requests, not an HTTP client.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::bin_paths::bindir;
use crate::command::{RunAs, pg_command};
use crate::error::TestkitError;
use crate::pg_ctl::{self, StopMode};
use crate::port::free_port;
use crate::temp_dir::{TempDir, give_to_server_owner, write_owned};

/// Patroni's superuser, as sluice's tests log in.
pub const PATRONI_SUPERUSER: (&str, &str) = ("postgres", "postgres");

/// How long a node may take to bootstrap or join.
const START_TIMEOUT: Duration = Duration::from_secs(90);

/// One Patroni-managed PostgreSQL.
#[derive(Debug)]
pub struct PatroniNode {
    name: String,
    pg_port: u16,
    rest_port: u16,
    data_dir: PathBuf,
    log: PathBuf,
    process: Option<Child>,
}

impl PatroniNode {
    /// Patroni's name for the node (`pg0`, `pg1`, …).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// PostgreSQL's port (on 127.0.0.1).
    pub fn pg_port(&self) -> u16 {
        self.pg_port
    }

    /// The node's REST API, `http://127.0.0.1:PORT`.
    pub fn rest_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.rest_port)
    }

    /// The last lines of the node's Patroni log (for failure messages).
    pub fn log_tail(&self) -> String {
        tail(&self.log)
    }
}

/// etcd and its Patroni nodes; see the module's documentation.
#[derive(Debug)]
pub struct PatroniCluster {
    nodes: Vec<PatroniNode>,
    etcd: Option<Child>,
    etcd_log: PathBuf,
    // Last: deleted after everything in it has stopped.
    dir: TempDir,
}

impl PatroniCluster {
    /// Starts etcd and `nodes` Patroni nodes, and returns once node 0
    /// leads and every other node is a running replica (about ten
    /// seconds).
    pub fn start(nodes: usize) -> Result<PatroniCluster, TestkitError> {
        if nodes == 0 {
            return Err(TestkitError::InvalidArgument(
                "a Patroni cluster needs at least one node".into(),
            ));
        }
        let patroni = which("patroni")?;
        let etcd = which("etcd")?;
        let dir = TempDir::create()?;
        let etcd_log = dir.path().join("etcd.log");
        let mut cluster = PatroniCluster {
            nodes: Vec::new(),
            etcd: None,
            etcd_log,
            dir,
        };
        let etcd_port = cluster.start_etcd(&etcd)?;
        for i in 0..nodes {
            let node = cluster.start_node(&patroni, i, etcd_port)?;
            cluster.nodes.push(node);
            let want = if i == 0 { "/primary" } else { "/replica" };
            cluster.wait_status(i, want, START_TIMEOUT)?;
        }
        Ok(cluster)
    }

    pub fn nodes(&self) -> &[PatroniNode] {
        &self.nodes
    }

    /// The node that answers 200 on `/primary`, if exactly one does.
    pub fn leader(&self) -> Result<Option<usize>, TestkitError> {
        let mut leaders = Vec::new();
        for (i, node) in self.nodes.iter().enumerate() {
            if http(node.rest_port, "GET", "/primary", None).0 == Some(200) {
                leaders.push(i);
            }
        }
        Ok(match leaders.as_slice() {
            [one] => Some(*one),
            _ => None,
        })
    }

    /// `patronictl switchover` by the REST API: hands the leader key to
    /// `candidate`, and returns once it answers as the primary.
    pub fn switchover(&self, candidate: usize) -> Result<(), TestkitError> {
        let leader = self.leader()?.ok_or_else(|| {
            TestkitError::InvalidArgument("no single leader to switch over from".into())
        })?;
        let (Some(old), Some(new)) = (self.nodes.get(leader), self.nodes.get(candidate)) else {
            return Err(TestkitError::InvalidArgument(format!(
                "no node {candidate} in a cluster of {}",
                self.nodes.len()
            )));
        };
        let body = format!(r#"{{"leader":"{}","candidate":"{}"}}"#, old.name, new.name);
        let (status, answer) = http(old.rest_port, "POST", "/switchover", Some(&body));
        if status != Some(200) {
            return Err(TestkitError::CommandFailed {
                command: format!("POST /switchover {body}"),
                status: format!("{status:?}"),
                stderr: answer,
                stdout: old.log_tail(),
            });
        }
        self.wait_status(candidate, "/primary", START_TIMEOUT)
    }

    /// Waits until every node but the leader answers 200 on `/replica`
    /// (a demoted leader has rejoined and streams).
    pub fn wait_replicas_running(&self, within: Duration) -> Result<(), TestkitError> {
        let deadline = Instant::now() + within;
        loop {
            let leader = self.leader()?;
            let mut settled = leader.is_some();
            for (i, node) in self.nodes.iter().enumerate() {
                if Some(i) != leader && http(node.rest_port, "GET", "/replica", None).0 != Some(200)
                {
                    settled = false;
                }
            }
            if settled {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(TestkitError::Timeout {
                    what: format!(
                        "every Patroni node but the leader to run as a replica\n{}",
                        self.logs()
                    ),
                    after: within,
                });
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn logs(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("--- {} ---\n{}", n.name, n.log_tail()))
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn start_etcd(&mut self, etcd: &Path) -> Result<u16, TestkitError> {
        let client = free_port()?;
        let peer = free_port()?;
        let client_url = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let log = open_log(&self.etcd_log)?;
        let mut cmd = Command::new(etcd);
        cmd.args(["--name", "t", "--data-dir"])
            .arg(self.dir.path().join("etcd"))
            .args(["--listen-client-urls", &client_url])
            .args(["--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("t={peer_url}")]);
        let child = spawn(cmd, log, "etcd")?;
        self.etcd = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(child) = self.etcd.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                return Err(TestkitError::StartFailed {
                    port: client,
                    cause: format!("etcd exited ({status})"),
                    log_file: self.etcd_log.clone(),
                    log_tail: tail(&self.etcd_log),
                });
            }
            if http(client, "GET", "/health", None).0 == Some(200) {
                return Ok(client);
            }
            if Instant::now() >= deadline {
                return Err(TestkitError::StartFailed {
                    port: client,
                    cause: "etcd not healthy after 30 s".into(),
                    log_file: self.etcd_log.clone(),
                    log_tail: tail(&self.etcd_log),
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn start_node(
        &self,
        patroni: &Path,
        i: usize,
        etcd_port: u16,
    ) -> Result<PatroniNode, TestkitError> {
        let dir = self.dir.path();
        let name = format!("pg{i}");
        let pg_port = free_port()?;
        let rest_port = free_port()?;
        let data_dir = dir.join(&name);
        let yml = dir.join(format!("{name}.yml"));
        let pgpass = dir.join(format!("pgpass{i}"));
        let (user, password) = PATRONI_SUPERUSER;
        let config = format!(
            "scope: sluice-test
name: {name}
restapi: {{listen: '127.0.0.1:{rest_port}', connect_address: '127.0.0.1:{rest_port}'}}
etcd3: {{hosts: '127.0.0.1:{etcd_port}'}}
bootstrap:
  dcs:
    ttl: 20
    loop_wait: 1
    retry_timeout: 5
    maximum_lag_on_failover: 1048576
    postgresql:
      use_pg_rewind: true
      parameters: {{wal_log_hints: 'on', max_wal_senders: 10, max_replication_slots: 10, hot_standby: 'on', fsync: 'off', synchronous_commit: 'off', max_connections: 200, shared_buffers: 32MB}}
      pg_hba:
      - local all all trust
      - host all all 127.0.0.1/32 trust
      - host replication replicator 127.0.0.1/32 trust
  initdb: [{{encoding: UTF8}}, {{locale: C}}]
postgresql:
  listen: '127.0.0.1:{pg_port}'
  connect_address: '127.0.0.1:{pg_port}'
  data_dir: '{data_dir}'
  bin_dir: '{bindir}'
  pgpass: '{pgpass}'
  authentication:
    superuser: {{username: {user}, password: {password}}}
    replication: {{username: replicator, password: rep-pass}}
    rewind: {{username: rewind_user, password: rewind-pass}}
  parameters: {{unix_socket_directories: '{dir}'}}
",
            data_dir = data_dir.display(),
            bindir = bindir()?.display(),
            pgpass = pgpass.display(),
            dir = dir.display(),
        );
        write_owned(&yml, &config)?;
        let log = dir.join(format!("patroni{i}.log"));
        let out = open_log(&log)?;
        give_to_server_owner(&log)?;
        let mut cmd = pg_command(patroni, RunAs::ServerOwner)?;
        cmd.arg(&yml)
            .current_dir(dir)
            .env("HOME", dir)
            .env("PGPASSFILE", &pgpass);
        let process = spawn(cmd, out, "patroni")?;
        Ok(PatroniNode {
            name,
            pg_port,
            rest_port,
            data_dir,
            log,
            process: Some(process),
        })
    }

    fn wait_status(&self, i: usize, path: &str, within: Duration) -> Result<(), TestkitError> {
        let node = &self.nodes[i];
        let deadline = Instant::now() + within;
        let mut last = (None, String::new());
        while Instant::now() < deadline {
            last = http(node.rest_port, "GET", path, None);
            if last.0 == Some(200) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(TestkitError::Timeout {
            what: format!(
                "Patroni {} to answer 200 on {path} (last: {:?} {})\n{}",
                node.name,
                last.0,
                last.1.trim(),
                node.log_tail()
            ),
            after: within,
        })
    }
}

impl Drop for PatroniCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            if let Some(mut child) = node.process.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
            if node.data_dir.join("postmaster.pid").exists() {
                let _ = pg_ctl::stop(&node.data_dir, StopMode::Immediate);
            }
        }
        if let Some(mut etcd) = self.etcd.take() {
            let _ = etcd.kill();
            let _ = etcd.wait();
        }
    }
}

/// A program on PATH (or in /usr/bin), or why the cluster cannot start.
fn which(program: &str) -> Result<PathBuf, TestkitError> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/usr/sbin")])
        .map(|d| d.join(program))
        .find(|p| p.is_file())
        .ok_or_else(|| TestkitError::NoPostgres {
            looked_in: format!(
                "PATH for `{program}` (Debian's `patroni` and `etcd-server` packages; \
                 scripts/install-deps.sh installs them)"
            ),
        })
}

fn open_log(path: &Path) -> Result<std::fs::File, TestkitError> {
    std::fs::File::create(path)
        .map_err(|e| TestkitError::io(format!("creating {}", path.display()), e))
}

fn spawn(mut cmd: Command, log: std::fs::File, what: &str) -> Result<Child, TestkitError> {
    let err = log
        .try_clone()
        .map_err(|e| TestkitError::io("duplicating a log file", e))?;
    cmd.stdin(Stdio::null()).stdout(log).stderr(err);
    cmd.spawn()
        .map_err(|e| TestkitError::io(format!("cannot start {what}"), e))
}

/// One HTTP/1.0 request to 127.0.0.1:`port`: (status, body); `None` when
/// nothing answers (refused, reset, timed out).
fn http(port: u16, method: &str, path: &str, body: Option<&str>) -> (Option<u16>, String) {
    let attempt = || -> std::io::Result<(Option<u16>, String)> {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
        stream.set_read_timeout(Some(Duration::from_secs(30)))?;
        stream.set_write_timeout(Some(Duration::from_secs(5)))?;
        let body = body.unwrap_or("");
        write!(
            stream,
            "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        )?;
        let mut answer = Vec::new();
        stream.take(1 << 20).read_to_end(&mut answer)?;
        let answer = String::from_utf8_lossy(&answer);
        let status = answer
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok());
        let body = answer
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default();
        Ok((status, body))
    };
    attempt().unwrap_or_else(|e| (None, e.to_string()))
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}
