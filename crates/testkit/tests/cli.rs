//! The `sluice-testkit cluster` binary as the Python scripts use it: one JSON
//! line out, cleanup on stdin EOF or SIGTERM, exit status 0.

mod support;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_sluice-testkit");

/// Spawns the binary and reads its JSON line (within a deadline).
fn spawn(args: &[&str]) -> (Child, String) {
    let mut child = Command::new(BIN)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx
        .recv_timeout(Duration::from_secs(120))
        .expect("JSON line within 120 s");
    (child, line)
}

/// Naive extraction of a top-level JSON field's raw text.
fn field<'a>(json: &'a str, key: &str) -> &'a str {
    let start = json.find(&format!("\"{key}\":")).expect(key) + key.len() + 3;
    let rest = &json[start..];
    let end = rest.find([',', '}']).unwrap();
    rest[..end].trim_matches('"')
}

fn wait_exit(child: &mut Child) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(Instant::now() < deadline, "sluice-testkit did not exit");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn psql_tcp(port: &str, sql: &str) -> String {
    let out = Command::new(sluice_testkit::psql_path().unwrap())
        .args(["-X", "-A", "-t", "-c", sql])
        .arg(format!(
            "host=127.0.0.1 port={port} user=postgres password=postgres dbname=postgres"
        ))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

#[test]
fn cluster_until_stdin_closes() {
    let (mut child, line) = spawn(&[
        "cluster",
        "--max-connections",
        "44",
        "--auth",
        "md5",
        "--user",
        "app:pw:with:colons",
        "--set",
        "work_mem=5MB",
        "--database",
        "extra",
    ]);
    assert!(line.ends_with('\n'));
    assert_eq!(field(&line, "host"), "127.0.0.1");
    assert_eq!(field(&line, "superuser"), "postgres");
    assert_eq!(field(&line, "password"), "postgres");
    assert_eq!(field(&line, "replica_port"), "null");
    let port = field(&line, "port");
    let data_dir = PathBuf::from(field(&line, "data_dir"));
    assert!(data_dir.exists());
    assert!(PathBuf::from(field(&line, "socket_dir")).exists());

    assert_eq!(psql_tcp(port, "SHOW max_connections"), "44");
    assert_eq!(psql_tcp(port, "SHOW work_mem"), "5MB");
    assert_eq!(
        psql_tcp(
            port,
            "SELECT count(*) FROM pg_database WHERE datname = 'extra'"
        ),
        "1"
    );

    drop(child.stdin.take());
    assert!(wait_exit(&mut child).success());
    assert!(!data_dir.exists());
}

#[test]
fn cluster_with_replica_and_pgbench_until_sigterm() {
    let (mut child, line) = spawn(&["cluster", "--pgbench-scale", "1", "--replica"]);
    let replica_port = field(&line, "replica_port");
    assert_ne!(replica_port, "null");
    let data_dir = PathBuf::from(field(&line, "data_dir"));
    assert_eq!(
        psql_tcp(replica_port, "SELECT count(*) FROM pgbench_branches"),
        "1"
    );
    assert_eq!(psql_tcp(replica_port, "SELECT pg_is_in_recovery()"), "t");

    let pid = libc::pid_t::try_from(child.id()).unwrap();
    // SAFETY: sending SIGTERM to our own child process.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    assert!(wait_exit(&mut child).success());
    assert!(!data_dir.exists());
}

#[test]
fn bad_arguments_exit_1() {
    let out = Command::new(BIN)
        .args(["cluster", "--auth", "kerberos"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("kerberos"));
    assert!(out.stdout.is_empty());
}
