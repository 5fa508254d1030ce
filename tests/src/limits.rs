//! Raising the open-files limit for tests with thousands of sockets.

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
