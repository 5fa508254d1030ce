//! One running `sluice` daemon per test: its own scratch directory (ini,
//! auth file, log, unix socket), its own port, killed on drop. When a test
//! panics, the end of the daemon's log is printed to help find out why.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::config::{DIR_TOKEN, PORT_TOKEN};
use crate::scratch::ScratchDir;

/// How long sluice may take to start listening.
const START_TIMEOUT: Duration = Duration::from_secs(10);
/// Fresh ports to try when another process grabs ours first.
const START_ATTEMPTS: usize = 5;
/// Log lines shown when a test fails.
const LOG_TAIL_LINES: usize = 60;

/// Path of the sluice binary: `$SLUICE_BIN`, else `<workspace>/target/debug/sluice`.
pub fn sluice_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("SLUICE_BIN") {
        return PathBuf::from(path);
    }
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent directory");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace.join("target"));
    let binary = target.join("debug").join("sluice");
    assert!(
        binary.is_file(),
        "sluice binary not found at {}: run `cargo build -p sluice` first (or set SLUICE_BIN)",
        binary.display()
    );
    binary
}

/// Runs the sluice binary with `args` to completion (at most `deadline`),
/// for command-line checks such as `--check-config`.
pub fn run_sluice(args: &[&std::ffi::OsStr], deadline: Duration) -> crate::tools::ToolOutput {
    let mut cmd = Command::new(sluice_binary());
    cmd.args(args);
    crate::tools::run(cmd, deadline)
}

/// A sluice daemon started by a test.
#[derive(Debug)]
pub struct SluiceProcess {
    child: Child,
    port: u16,
    exit_status: Option<ExitStatus>,
    log_path: PathBuf,
    ini_path: PathBuf,
    /// Declared last so it is removed after the process is killed.
    dir: ScratchDir,
}

impl SluiceProcess {
    /// Starts sluice with `config`, an ini text in which `@PORT@` and `@DIR@`
    /// stand for the listen port and the scratch directory.
    pub fn start(config: &str) -> SluiceProcess {
        Self::start_with(config, None)
    }

    /// Like [`SluiceProcess::start`], also writing `auth_file` (if any) to
    /// `@DIR@/userlist.txt`.
    pub fn start_with(config: &str, auth_file: Option<&str>) -> SluiceProcess {
        Self::start_inner(config, auth_file, &[])
    }

    /// Like [`SluiceProcess::start`], with extra environment variables.
    pub fn start_with_env(config: &str, env: &[(&str, &str)]) -> SluiceProcess {
        Self::start_inner(config, None, env)
    }

    fn start_inner(config: &str, auth_file: Option<&str>, env: &[(&str, &str)]) -> SluiceProcess {
        let mut last_log = String::new();
        for _ in 0..START_ATTEMPTS {
            let port = sluice_testkit::free_port().expect("free port");
            let mut process = Self::spawn_in_scratch(config, auth_file, port, env);
            match process.wait_listening() {
                Ok(()) => return process,
                Err(log) if log.contains("in use") => last_log = log,
                Err(log) => panic!("sluice did not start on port {port}:\n{log}"),
            }
        }
        panic!("sluice did not start after {START_ATTEMPTS} attempts:\n{last_log}");
    }

    /// Writes the ini (and auth_file) into a new scratch directory and
    /// spawns sluice on `port`, without waiting for it.
    fn spawn_in_scratch(
        config: &str,
        auth_file: Option<&str>,
        port: u16,
        env: &[(&str, &str)],
    ) -> SluiceProcess {
        let dir = ScratchDir::create();
        let ini_path = dir.path().join("pgbouncer.ini");
        let log_path = dir.path().join("sluice.log");
        write_filled(&ini_path, config, port, dir.path());
        if let Some(text) = auth_file {
            std::fs::write(dir.path().join("userlist.txt"), text).expect("write userlist.txt");
        }
        SluiceProcess {
            child: spawn(&ini_path, &log_path, env),
            port,
            exit_status: None,
            log_path,
            ini_path,
            dir,
        }
    }

    /// Starts sluice on `port`, which another sluice may already hold (with
    /// `so_reuseport = 1`): waits for the log to say it listens, since the
    /// port itself listens already.
    pub fn start_sharing_port(config: &str, port: u16) -> SluiceProcess {
        let mut process = Self::spawn_in_scratch(config, None, port, &[]);
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) = process.try_exit_status() {
                panic!("second sluice exited with {status}:\n{}", process.log());
            }
            if process.log().contains("listening on") {
                return process;
            }
            assert!(
                Instant::now() < deadline,
                "second sluice did not start:\n{}",
                process.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until the port is in LISTEN state (checked in /proc, so no
    /// probe connection is counted as a client), or returns the log when
    /// the process died or the deadline passed.
    fn wait_listening(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) = self.try_exit_status() {
                return Err(format!("exited with {status}\n{}", self.log()));
            }
            if is_listening(self.child.id(), self.port) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "not listening after {START_TIMEOUT:?}\n{}",
                    self.log()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The TCP listen port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The daemon's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The scratch directory (also `@DIR@`, usable as unix_socket_dir).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Path of the ini file.
    pub fn ini_path(&self) -> &Path {
        &self.ini_path
    }

    /// Replaces the ini file (tokens filled in); takes effect on [`SluiceProcess::reload`].
    pub fn rewrite_config(&self, config: &str) {
        write_filled(&self.ini_path, config, self.port, self.dir.path());
    }

    /// Replaces `@DIR@/userlist.txt`.
    pub fn rewrite_auth_file(&self, text: &str) {
        std::fs::write(self.dir.path().join("userlist.txt"), text).expect("write userlist.txt");
    }

    /// Sends a signal by name ("HUP", "TERM", "INT", "QUIT", "KILL").
    pub fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.pid().to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{name} {} failed", self.pid());
    }

    /// SIGHUP: reload the configuration and auth file.
    pub fn reload(&self) {
        self.signal("HUP");
    }

    /// Waits up to `timeout` for the process to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.try_exit_status() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// [`SluiceProcess::wait_exit`] for async tests: sleeps on the tokio
    /// timer, so the test's client connections keep being driven meanwhile
    /// (a dropped client only closes its socket when its task runs).
    pub async fn wait_exit_async(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.try_exit_status() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        self.try_exit_status().is_none()
    }

    fn try_exit_status(&mut self) -> Option<ExitStatus> {
        if self.exit_status.is_none() {
            self.exit_status = self.child.try_wait().expect("try_wait on sluice");
        }
        self.exit_status
    }

    /// Everything sluice wrote to stdout and stderr so far.
    pub fn log(&self) -> String {
        std::fs::read(&self.log_path)
            .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
            .unwrap_or_default()
    }

    /// The last `lines` lines of [`SluiceProcess::log`].
    pub fn log_tail(&self, lines: usize) -> String {
        let log = self.log();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for SluiceProcess {
    fn drop(&mut self) {
        if self.try_exit_status().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if std::thread::panicking() {
            eprintln!(
                "--- last {LOG_TAIL_LINES} lines of the sluice log (port {}) ---\n{}\n--- end of sluice log ---",
                self.port,
                self.log_tail(LOG_TAIL_LINES)
            );
        }
    }
}

/// Runs the binary on `ini_path`, stdout and stderr into `log_path`.
fn spawn(ini_path: &Path, log_path: &Path, env: &[(&str, &str)]) -> Child {
    let log = File::create(log_path).expect("create sluice log file");
    let log_err = log.try_clone().expect("clone log file handle");
    Command::new(sluice_binary())
        .arg(ini_path)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::from(log))
        .stderr(Stdio::from(log_err))
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", sluice_binary().display()))
}

/// Writes `config` to `path` with the port and directory tokens filled in.
fn write_filled(path: &Path, config: &str, port: u16, dir: &Path) {
    let dir = dir.to_str().expect("scratch dir is UTF-8");
    let text = config
        .replace(PORT_TOKEN, &port.to_string())
        .replace(DIR_TOKEN, dir);
    std::fs::write(path, text).expect("write pgbouncer.ini");
}

/// Whether process `pid` holds a socket listening on `port`, per
/// /proc/net/tcp{,6} and /proc/<pid>/fd.
fn is_listening(pid: u32, port: u16) -> bool {
    const LISTEN: &str = "0A";
    let mut inodes = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let local_port = fields
                .get(1)
                .and_then(|addr| addr.rsplit(':').next())
                .and_then(|hex| u16::from_str_radix(hex, 16).ok());
            if local_port == Some(port)
                && fields.get(3) == Some(&LISTEN)
                && let Some(inode) = fields.get(9)
            {
                inodes.push(format!("socket:[{inode}]"));
            }
        }
    }
    if inodes.is_empty() {
        return false;
    }
    // The port may be held by another process (a postgres started by a
    // test running alongside took it between free_port() and our bind):
    // only a listening socket among sluice's own descriptors counts.
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten().any(|fd| {
        std::fs::read_link(fd.path())
            .is_ok_and(|target| inodes.iter().any(|i| target.as_os_str() == i.as_str()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ConfigBuilder;

    /// Another process's listener on our port is not sluice listening: the
    /// start is reported as "in use" (and retried on a fresh port) instead
    /// of handing the test a port whose sluice has exited.
    #[test]
    fn a_port_held_by_someone_else_is_not_taken_for_sluice_listening() {
        let squatter = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = squatter.local_addr().expect("addr").port();
        let config = ConfigBuilder::new().render();
        let mut process = SluiceProcess::spawn_in_scratch(&config, None, port, &[]);
        let outcome = process.wait_listening();
        let log = outcome.expect_err("sluice cannot listen on a held port");
        assert!(log.contains("in use"), "{log}");
        let started = SluiceProcess::start(&config);
        assert_ne!(started.port(), port);
    }
}
