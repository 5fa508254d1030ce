//! Running PostgreSQL's own clients (psql, pgbench) against sluice, with a
//! clean environment and a deadline, and capturing what they print.

use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What a finished tool printed, and how it exited.
#[derive(Debug)]
pub struct ToolOutput {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl ToolOutput {
    /// Whether the tool exited 0.
    pub fn success(&self) -> bool {
        self.status.success()
    }
}

/// `psql -X -A -t -v ON_ERROR_STOP=1 -c sql` against sluice on `port`.
pub fn psql(port: u16, user: &str, password: &str, db: &str, sql: &str) -> ToolOutput {
    let mut cmd = client_command(&tool_path(sluice_testkit::psql_path()), password);
    cmd.args(["-X", "-A", "-t", "-v", "ON_ERROR_STOP=1"]);
    add_target(&mut cmd, port, user, db);
    cmd.arg("-c").arg(sql);
    run(cmd, Duration::from_secs(60))
}

/// psql with a whole connection string (`sslmode=…`, `sslrootcert=…`),
/// running `sql`.
pub fn psql_conninfo(conninfo: &str, password: &str, sql: &str) -> ToolOutput {
    let mut cmd = client_command(&tool_path(sluice_testkit::psql_path()), password);
    cmd.args([
        "-X",
        "-A",
        "-t",
        "-v",
        "ON_ERROR_STOP=1",
        "-d",
        conninfo,
        "-c",
        sql,
    ]);
    run(cmd, Duration::from_secs(60))
}

/// An interactive psql (commands on stdin, quiet, no psqlrc) against sluice
/// on `port`; the caller writes to its stdin and kills or waits for it.
pub fn psql_interactive(port: u16, user: &str, password: &str, db: &str) -> Child {
    let mut cmd = client_command(&tool_path(sluice_testkit::psql_path()), password);
    cmd.args(["-X", "-A", "-t", "-q"]);
    add_target(&mut cmd, port, user, db);
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn interactive psql")
}

/// `pgbench <args>` against sluice on `port`, killed after `deadline`.
pub fn pgbench(
    port: u16,
    user: &str,
    password: &str,
    db: &str,
    args: &[&str],
    deadline: Duration,
) -> ToolOutput {
    pgbench_env(port, user, password, db, args, deadline, &[])
}

/// Like [`pgbench`], with extra environment variables (`PGSSLMODE`…).
pub fn pgbench_env(
    port: u16,
    user: &str,
    password: &str,
    db: &str,
    args: &[&str],
    deadline: Duration,
    env: &[(&str, &str)],
) -> ToolOutput {
    let mut cmd = client_command(&tool_path(sluice_testkit::pgbench_path()), password);
    cmd.envs(env.iter().copied());
    cmd.args(args);
    // PGHOST in `env` (say localhost, for verify-full) wins over 127.0.0.1.
    let host = env
        .iter()
        .find(|(k, _)| *k == "PGHOST")
        .map_or("127.0.0.1", |(_, v)| *v);
    cmd.args(["-h", host, "-p", &port.to_string(), "-U", user]);
    cmd.arg(db);
    run(cmd, deadline)
}

/// pgbench running `select 1` (a script written into `dir`) as
/// [`crate::APP_USER`] on database postgres, with `args` (clients, time,
/// -M, -C…) and `env`; asserts that it succeeded with no failed
/// transaction.
pub async fn pgbench_select_one_ok(
    dir: &Path,
    port: u16,
    args: &[&str],
    env: &[(&str, &str)],
) -> ToolOutput {
    let script = dir.join("select_one.sql");
    std::fs::write(&script, "select 1;\n").expect("write pgbench script");
    let mut all: Vec<String> = vec!["-n".into(), "-f".into(), script.display().to_string()];
    all.extend(args.iter().map(|a| a.to_string()));
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let out = tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = all.iter().map(String::as_str).collect();
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        pgbench_env(
            port,
            crate::APP_USER,
            crate::APP_PASSWORD,
            "postgres",
            &args,
            Duration::from_secs(60),
            &env,
        )
    })
    .await
    .expect("pgbench task");
    assert!(out.success(), "pgbench: {}", out.stderr);
    assert!(
        out.stdout.contains("number of failed transactions: 0"),
        "{}",
        out.stdout
    );
    out
}

fn tool_path(
    found: Result<std::path::PathBuf, sluice_testkit::TestkitError>,
) -> std::path::PathBuf {
    found.unwrap_or_else(|e| panic!("PostgreSQL client tool not found: {e}"))
}

/// A command with no inherited `PG*` variables, C locale, and `PGPASSWORD`.
fn client_command(program: &Path, password: &str) -> Command {
    let mut cmd = Command::new(program);
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("PG") {
            cmd.env_remove(&key);
        }
    }
    cmd.env("LC_ALL", "C")
        .env("LANG", "C")
        .env("PGCONNECT_TIMEOUT", "10");
    if !password.is_empty() {
        cmd.env("PGPASSWORD", password);
    }
    cmd
}

fn add_target(cmd: &mut Command, port: u16, user: &str, db: &str) {
    cmd.args([
        "-h",
        "127.0.0.1",
        "-p",
        &port.to_string(),
        "-U",
        user,
        "-d",
        db,
    ]);
}

/// Runs `cmd` to completion; panics (after killing it) past `deadline`.
pub fn run(mut cmd: Command, deadline: Duration) -> ToolOutput {
    let description = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {description}: {e}"));
    let stdout = read_all(child.stdout.take());
    let stderr = read_all(child.stderr.take());
    let until = Instant::now() + deadline;
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if Instant::now() >= until {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{description} did not finish within {deadline:?}\nstderr: {}",
                stderr.join().unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    ToolOutput {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    }
}

fn read_all(pipe: Option<impl Read + Send + 'static>) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut text = String::new();
        if let Some(mut pipe) = pipe {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            text = String::from_utf8_lossy(&bytes).into_owned();
        }
        text
    })
}

/// The `number of failed transactions: N (...)` count of a pgbench report.
pub fn pgbench_failed(report: &str) -> Option<u64> {
    report
        .lines()
        .find_map(|line| line.strip_prefix("number of failed transactions:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
}

/// The `number of transactions actually processed: N` of a pgbench report.
pub fn pgbench_processed(report: &str) -> Option<u64> {
    report
        .lines()
        .find_map(|line| line.strip_prefix("number of transactions actually processed:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.split('/').next())
        .and_then(|n| n.parse().ok())
}

/// Runs sluice on `config` (an ini text whose `listen_port` gets a free
/// port) expecting it to refuse to start; returns what it said.
pub fn refused_at_startup(config: &crate::config::ConfigBuilder) -> String {
    let scratch = crate::scratch::ScratchDir::create();
    let ini = scratch.path().join("refused.ini");
    let text = config
        .clone()
        .set(
            "listen_port",
            &sluice_testkit::free_port().expect("port").to_string(),
        )
        .render();
    std::fs::write(&ini, text).expect("write ini");
    let out = crate::process::run_sluice(&[ini.as_os_str()], Duration::from_secs(20));
    assert!(!out.success(), "sluice started with:\n{}", config.render());
    format!("{}{}", out.stdout, out.stderr)
}
