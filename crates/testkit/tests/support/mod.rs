//! Helpers shared by the testkit's integration tests: logging in over TCP the
//! way a real client would, and bounded polling.

#![allow(dead_code)]

use std::process::Command;
use std::time::{Duration, Instant};

use sluice_testkit::{Cluster, psql_path};

/// Runs `SELECT current_user` over TCP as `user` with `password` (via
/// PGPASSWORD); `Ok(stdout)` on success, `Err(stderr)` on failure.
pub fn tcp_login(
    cluster: &Cluster,
    user: &str,
    password: &str,
    port: u16,
) -> Result<String, String> {
    let conninfo = format!(
        "host={} port={port} user={user} dbname=postgres connect_timeout=10",
        cluster.host()
    );
    let output = Command::new(psql_path().expect("psql"))
        .args([
            "-X",
            "-A",
            "-t",
            "-w",
            "-c",
            "SELECT current_user",
            &conninfo,
        ])
        .env("PGPASSWORD", password)
        .env("PGPASSFILE", "/nonexistent")
        .env_remove("PGUSER")
        .env_remove("PGDATABASE")
        .output()
        .expect("spawn psql");
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
    } else {
        Err(String::from_utf8_lossy(&output.stderr).into_owned())
    }
}

/// Polls `check` every 50 ms until it returns true; panics after `timeout`.
pub fn eventually(what: &str, timeout: Duration, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if check() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("timed out after {timeout:?} waiting for {what}");
}
