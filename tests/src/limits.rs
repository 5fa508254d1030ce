//! System limits tests need: the open-files limit for tests with thousands
//! of sockets, and the sysctl that migrates queued connections between
//! so_reuseport listeners.

/// Raises this process's soft RLIMIT_NOFILE (inherited by sluice) so that
/// thousands of sockets fit on both ends.
pub fn raise_fd_limit(wanted: u64) {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct we pass.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit), 0);
        if limit.rlim_cur < wanted {
            limit.rlim_cur = wanted.min(limit.rlim_max);
            assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &limit), 0);
        }
    }
    assert!(
        limit.rlim_cur >= wanted.min(5_000),
        "RLIMIT_NOFILE is only {} (hard {})",
        limit.rlim_cur,
        limit.rlim_max
    );
}

/// Lets the kernel hand connections still queued on a closing listener to
/// another listener of the same SO_REUSEPORT group, as an operator doing
/// rolling restarts would configure it. Restores the old value on drop.
pub struct MigrateQueuedConnections(Option<String>);

const MIGRATE_SYSCTL: &str = "/proc/sys/net/ipv4/tcp_migrate_req";

impl MigrateQueuedConnections {
    pub fn enable() -> Self {
        let old = std::fs::read_to_string(MIGRATE_SYSCTL).ok();
        if old.is_some() && std::fs::write(MIGRATE_SYSCTL, "1").is_err() {
            eprintln!("cannot set {MIGRATE_SYSCTL}: queued connections may be reset");
        }
        Self(old)
    }
}

impl Drop for MigrateQueuedConnections {
    fn drop(&mut self) {
        if let Some(old) = &self.0 {
            let _ = std::fs::write(MIGRATE_SYSCTL, old.trim());
        }
    }
}
