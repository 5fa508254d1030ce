//! Finding the PostgreSQL binaries: `pg_config --bindir` first (Debian points
//! it at /usr/lib/postgresql/<major>/bin), then the newest
//! /usr/lib/postgresql/*/bin. `SLUICE_PG_BINDIR` overrides both.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use crate::command::run;
use crate::error::TestkitError;

/// Environment variable that, when set, names the binary directory to use.
pub const BINDIR_ENV: &str = "SLUICE_PG_BINDIR";

const DEBIAN_ROOT: &str = "/usr/lib/postgresql";

/// The directory holding `initdb`, `pg_ctl`, `postgres`, `psql`, `pgbench`...
pub fn bindir() -> Result<PathBuf, TestkitError> {
    static FOUND: OnceLock<PathBuf> = OnceLock::new();
    if let Some(dir) = FOUND.get() {
        return Ok(dir.clone());
    }
    let dir = locate()?;
    Ok(FOUND.get_or_init(|| dir).clone())
}

/// Path of `psql` in [`bindir`].
pub fn psql_path() -> Result<PathBuf, TestkitError> {
    tool("psql")
}

/// Path of `pgbench` in [`bindir`].
pub fn pgbench_path() -> Result<PathBuf, TestkitError> {
    tool("pgbench")
}

/// Path of a tool in [`bindir`], checked to exist.
pub(crate) fn tool(name: &str) -> Result<PathBuf, TestkitError> {
    let path = bindir()?.join(name);
    if path.is_file() {
        Ok(path)
    } else {
        Err(TestkitError::NoPostgres {
            looked_in: format!("{} (no `{name}` there)", path.display()),
        })
    }
}

fn locate() -> Result<PathBuf, TestkitError> {
    let mut looked_in = Vec::new();
    if let Some(dir) = std::env::var_os(BINDIR_ENV) {
        let dir = PathBuf::from(dir);
        if has_server(&dir) {
            return Ok(dir);
        }
        looked_in.push(format!("${BINDIR_ENV}={}", dir.display()));
    }
    match from_pg_config() {
        Some(dir) if has_server(&dir) => return Ok(dir),
        Some(dir) => looked_in.push(format!("pg_config --bindir = {}", dir.display())),
        None => looked_in.push("pg_config (not runnable)".to_owned()),
    }
    if let Some(dir) = newest_debian_bindir() {
        return Ok(dir);
    }
    looked_in.push(format!("{DEBIAN_ROOT}/*/bin"));
    Err(TestkitError::NoPostgres {
        looked_in: looked_in.join(", "),
    })
}

fn has_server(dir: &Path) -> bool {
    dir.join("initdb").is_file() && dir.join("pg_ctl").is_file()
}

fn from_pg_config() -> Option<PathBuf> {
    let mut cmd = Command::new("pg_config");
    cmd.arg("--bindir");
    let out = run(cmd, Duration::from_secs(10)).ok()?;
    let line = out.stdout.trim();
    (!line.is_empty()).then(|| PathBuf::from(line))
}

/// The highest-numbered /usr/lib/postgresql/<major>/bin that has a server.
fn newest_debian_bindir() -> Option<PathBuf> {
    let entries = std::fs::read_dir(DEBIAN_ROOT).ok()?;
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let major: f64 = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            has_server(&bin).then_some((major, bin))
        })
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, bin)| bin)
}
