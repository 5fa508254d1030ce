//! Driving `pg_ctl`: start (waiting, with the log tail on failure), stop,
//! restart and reload. The server's stderr always goes to the log file via
//! `-l`, so no server process ever holds our output pipes.

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::bin_paths::tool;
use crate::command::{RunAs, pg_command, run};
use crate::error::TestkitError;

/// How long pg_ctl itself waits for start/stop (`-t`).
const PG_CTL_WAIT_SECS: u64 = 60;
/// Our own deadline for a pg_ctl invocation, a bit longer than its `-t`.
const PG_CTL_DEADLINE: Duration = Duration::from_secs(PG_CTL_WAIT_SECS + 30);
/// Lines of server log quoted in startup errors.
const LOG_TAIL_LINES: usize = 40;

/// Shutdown modes of `pg_ctl stop`.
#[derive(Clone, Copy, Debug)]
pub(crate) enum StopMode {
    Fast,
    Immediate,
}

impl StopMode {
    fn as_arg(self) -> &'static str {
        match self {
            StopMode::Fast => "fast",
            StopMode::Immediate => "immediate",
        }
    }
}

fn pg_ctl(action: &str, data_dir: &Path) -> Result<Command, TestkitError> {
    let mut cmd = pg_command(&tool("pg_ctl")?, RunAs::ServerOwner)?;
    cmd.arg(action).arg("-D").arg(data_dir);
    Ok(cmd)
}

/// `pg_ctl start -w`; on failure the error carries the log lines written
/// during this attempt.
pub(crate) fn start(data_dir: &Path, log_file: &Path, port: u16) -> Result<(), TestkitError> {
    let log_offset = std::fs::metadata(log_file).map(|m| m.len()).unwrap_or(0);
    let mut cmd = pg_ctl("start", data_dir)?;
    cmd.arg("-l")
        .arg(log_file)
        .args(["-w", "-t", &PG_CTL_WAIT_SECS.to_string()]);
    run(cmd, PG_CTL_DEADLINE)
        .map(drop)
        .map_err(|error| TestkitError::StartFailed {
            port,
            cause: error.to_string(),
            log_file: log_file.to_owned(),
            log_tail: log_tail(log_file, log_offset),
        })
}

/// `pg_ctl restart -w` (fast shutdown), logging to `log_file`.
pub(crate) fn restart(data_dir: &Path, log_file: &Path, port: u16) -> Result<(), TestkitError> {
    let log_offset = std::fs::metadata(log_file).map(|m| m.len()).unwrap_or(0);
    let mut cmd = pg_ctl("restart", data_dir)?;
    cmd.arg("-l")
        .arg(log_file)
        .args(["-m", "fast", "-w", "-t", &PG_CTL_WAIT_SECS.to_string()]);
    run(cmd, PG_CTL_DEADLINE)
        .map(drop)
        .map_err(|error| TestkitError::StartFailed {
            port,
            cause: error.to_string(),
            log_file: log_file.to_owned(),
            log_tail: log_tail(log_file, log_offset),
        })
}

/// `pg_ctl stop -w` with the given mode.
pub(crate) fn stop(data_dir: &Path, mode: StopMode) -> Result<(), TestkitError> {
    let mut cmd = pg_ctl("stop", data_dir)?;
    cmd.args([
        "-m",
        mode.as_arg(),
        "-w",
        "-t",
        &PG_CTL_WAIT_SECS.to_string(),
    ]);
    run(cmd, PG_CTL_DEADLINE).map(drop)
}

/// `pg_ctl reload` (SIGHUP: re-read postgresql.conf and pg_hba.conf).
pub(crate) fn reload(data_dir: &Path) -> Result<(), TestkitError> {
    run(pg_ctl("reload", data_dir)?, PG_CTL_DEADLINE).map(drop)
}

/// `pg_ctl promote -w`: a standby becomes a primary on a new timeline.
pub(crate) fn promote(data_dir: &Path) -> Result<(), TestkitError> {
    let mut cmd = pg_ctl("promote", data_dir)?;
    cmd.args(["-w", "-t", &PG_CTL_WAIT_SECS.to_string()]);
    run(cmd, PG_CTL_DEADLINE).map(drop)
}

/// Whether a failed start was caused by the port being taken.
pub(crate) fn is_address_in_use(error: &TestkitError) -> bool {
    match error {
        TestkitError::StartFailed {
            cause, log_tail, ..
        } => [cause, log_tail]
            .iter()
            .any(|text| text.contains("Address already in use")),
        _ => false,
    }
}

/// The last lines of `log_file` written after byte `offset` (or of the whole
/// file if nothing was written since).
fn log_tail(log_file: &Path, offset: u64) -> String {
    let read_from = |offset: u64| -> Option<String> {
        let mut file = std::fs::File::open(log_file).ok()?;
        file.seek(SeekFrom::Start(offset)).ok()?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).ok()?;
        Some(String::from_utf8_lossy(&bytes).into_owned())
    };
    let text = match read_from(offset) {
        Some(text) if !text.trim().is_empty() => text,
        _ => match read_from(0) {
            Some(text) => text,
            None => return "(log file unreadable or missing)".to_owned(),
        },
    };
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::Cluster;

    #[test]
    fn detects_a_taken_port() {
        let pg = Cluster::builder().start().unwrap();
        pg.stop().unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let taken = listener.local_addr().unwrap().port();
        pg.conf.write(&pg.data_dir, taken, pg.socket_dir()).unwrap();
        let error = start(&pg.data_dir, &pg.log_file, taken).unwrap_err();
        assert!(is_address_in_use(&error), "{error}");
    }
}
