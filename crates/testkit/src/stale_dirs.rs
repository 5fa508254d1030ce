//! Cleaning up after test processes that were killed (Ctrl-C in `cargo
//! test`, CI timeouts): their destructors never ran, so their postmasters
//! still run and their directories remain. Once per process, before the first
//! cluster starts, directories of dead testkit processes are stopped and removed.

use std::path::Path;
use std::sync::Once;

use crate::pg_ctl::{self, StopMode};
use crate::temp_dir::{PREFIX, base_dir};

/// Runs [`sweep`] the first time it is called in this process.
pub(crate) fn sweep_once() {
    static SWEPT: Once = Once::new();
    SWEPT.call_once(sweep);
}

/// Stops and removes every `sluice-testkit-<pid>-...` directory whose
/// creating process no longer exists. Best effort: errors are ignored.
fn sweep() {
    let Ok(entries) = std::fs::read_dir(base_dir()) else {
        return;
    };
    let me = std::process::id();
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(owner_pid) else {
            continue;
        };
        if pid == me || process_exists(pid) {
            continue;
        }
        let dir = entry.path();
        stop_leftover_server(&dir.join("data"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// The pid in a directory name made by `TempDir::create`.
fn owner_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix(PREFIX)?;
    let (pid, _) = rest.split_once('-')?;
    pid.parse().ok()
}

/// Whether `pid` is a live process (zombies, which only wait to be reaped by
/// a possibly lazy parent, count as dead).
fn process_exists(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return true;
    };
    // SAFETY: signal 0 only checks whether the process exists.
    let rc = unsafe { libc::kill(pid, 0) };
    if rc != 0 {
        return std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH);
    }
    !is_zombie(pid)
}

/// Reads the state field of /proc/<pid>/stat ("pid (comm) S ...").
fn is_zombie(pid: libc::pid_t) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let (_, rest) = stat.rsplit_once(") ")?;
            Some(rest.starts_with('Z'))
        })
        .unwrap_or(false)
}

fn stop_leftover_server(data_dir: &Path) {
    if data_dir.join("postmaster.pid").exists() {
        let _ = pg_ctl::stop(data_dir, StopMode::Immediate);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_owner_pid() {
        assert_eq!(owner_pid("sluice-testkit-123-4-abcd0123"), Some(123));
        assert_eq!(owner_pid("sluice-testkit-x-4-abcd0123"), None);
        assert_eq!(owner_pid("other-123-4"), None);
        assert!(process_exists(std::process::id()));
    }
}
