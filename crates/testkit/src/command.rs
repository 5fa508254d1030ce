//! Spawning PostgreSQL tools the same way every time: a scrubbed environment
//! (no stray `PG*` variables, C locale so messages can be matched), dropping
//! to the `postgres` user for server-side tools when running as root, and a
//! deadline on every wait.

use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::error::TestkitError;
use crate::server_owner::server_owner;

/// Which account a tool runs as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RunAs {
    /// The current user (clients such as psql and pgbench).
    Invoker,
    /// The `postgres` user when we are root (initdb, pg_ctl, pg_basebackup).
    ServerOwner,
}

/// What a finished tool printed.
#[derive(Debug)]
pub(crate) struct Captured {
    pub(crate) stdout: String,
}

/// A `Command` for `program` with a clean environment, running as `run_as`.
pub(crate) fn pg_command(program: &Path, run_as: RunAs) -> Result<Command, TestkitError> {
    use std::os::unix::process::CommandExt;

    let mut cmd = Command::new(program);
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("PG") {
            cmd.env_remove(&key);
        }
    }
    cmd.env("LC_ALL", "C").env("LANG", "C");
    if run_as == RunAs::ServerOwner
        && let Some(owner) = server_owner()?
    {
        // std drops supplementary groups itself when switching away from root.
        cmd.uid(owner.uid).gid(owner.gid);
        cmd.env("HOME", &owner.home).env("USER", "postgres");
        // The caller's cwd may be unreadable for postgres, which makes the
        // tools print "could not identify current directory".
        cmd.current_dir("/");
    }
    Ok(cmd)
}

/// Runs `cmd` to completion (killing it after `timeout`) and returns its
/// stdout; a non-zero exit becomes `CommandFailed` with both outputs.
pub(crate) fn run(mut cmd: Command, timeout: Duration) -> Result<Captured, TestkitError> {
    let description = describe(&cmd);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .map_err(|e| TestkitError::io(format!("cannot start `{description}`"), e))?;
    let stdout = read_in_background(child.stdout.take());
    let stderr = read_in_background(child.stderr.take());

    let Some(status) = wait_until(&mut child, Instant::now() + timeout)
        .map_err(|e| TestkitError::io(format!("waiting for `{description}`"), e))?
    else {
        let _ = child.kill();
        let _ = child.wait();
        return Err(TestkitError::Timeout {
            what: format!("`{description}` to finish"),
            after: timeout,
        });
    };
    let stdout = join_reader(stdout);
    let stderr = join_reader(stderr);
    if status.success() {
        Ok(Captured { stdout })
    } else {
        Err(TestkitError::CommandFailed {
            command: description,
            status: status.to_string(),
            stderr,
            stdout,
        })
    }
}

/// Polls `child` until it exits or `deadline` passes (`Ok(None)`).
pub(crate) fn wait_until(
    child: &mut Child,
    deadline: Instant,
) -> std::io::Result<Option<ExitStatus>> {
    let mut pause = Duration::from_millis(1);
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok(None);
        }
        std::thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(Duration::from_millis(25));
    }
}

/// A short, human-readable command line for error messages.
fn describe(cmd: &Command) -> String {
    let program = Path::new(cmd.get_program())
        .file_name()
        .unwrap_or(cmd.get_program())
        .to_string_lossy()
        .into_owned();
    let mut line = program;
    for arg in cmd.get_args() {
        let arg = arg.to_string_lossy();
        line.push(' ');
        if arg.len() > 200 {
            line.push_str(&arg[..arg.floor_char_boundary(200)]);
            line.push_str("...");
        } else {
            line.push_str(&arg);
        }
    }
    line
}

fn read_in_background<R: Read + Send + 'static>(pipe: Option<R>) -> Option<JoinHandle<String>> {
    pipe.map(|mut pipe| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            String::from_utf8_lossy(&bytes).into_owned()
        })
    })
}

fn join_reader(reader: Option<JoinHandle<String>>) -> String {
    reader
        .and_then(|handle| handle.join().ok())
        .unwrap_or_default()
}
