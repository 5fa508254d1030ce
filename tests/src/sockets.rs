//! A copy of one of another process's TCP sockets (pidfd_getfd, Linux 5.6+;
//! the tests run as root), to read the options sluice set on it with
//! getsockopt: what `tcp_user_timeout`, `tcp_socket_buffer` and
//! `tcp_defer_accept` did cannot be seen from the other end.

use std::os::fd::{FromRawFd, OwnedFd, RawFd};

/// The socket of process `pid` whose local port is `local` and remote port
/// `remote` (a listening socket when `remote` is 0).
pub fn socket_of(pid: u32, local: u16, remote: u16) -> Option<OwnedFd> {
    socket_where(pid, |l, r| l == local && r == remote)
}

/// A socket of process `pid` connected to remote port `remote`.
pub fn socket_to(pid: u32, remote: u16) -> Option<OwnedFd> {
    socket_where(pid, |_, r| r == remote)
}

fn socket_where(pid: u32, wanted: impl Fn(u16, u16) -> bool) -> Option<OwnedFd> {
    let mut inodes = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(table).ok()?;
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let port = |field: Option<&&str>| {
                field
                    .and_then(|a| a.rsplit(':').next())
                    .and_then(|h| u16::from_str_radix(h, 16).ok())
            };
            if let (Some(l), Some(r)) = (port(f.get(1)), port(f.get(2)))
                && wanted(l, r)
            {
                inodes.extend(f.get(9).map(|i| format!("socket:[{i}]")));
            }
        }
    }
    let fd_number = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .ok()?
        .flatten()
        .find(|fd| {
            std::fs::read_link(fd.path())
                .is_ok_and(|t| inodes.iter().any(|i| t.as_os_str() == i.as_str()))
        })?
        .file_name()
        .to_str()?
        .parse::<RawFd>()
        .ok()?;
    // SAFETY: plain syscalls; the descriptors returned are owned here.
    unsafe {
        let pidfd = libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0);
        if pidfd < 0 {
            return None;
        }
        let pidfd = OwnedFd::from_raw_fd(pidfd as RawFd);
        let fd = libc::syscall(
            libc::SYS_pidfd_getfd,
            std::os::fd::AsRawFd::as_raw_fd(&pidfd),
            fd_number,
            0,
        );
        (fd >= 0).then(|| OwnedFd::from_raw_fd(fd as RawFd))
    }
}

/// An integer socket option.
pub fn int_option(fd: &OwnedFd, level: libc::c_int, name: libc::c_int) -> Option<i64> {
    let mut value: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: a valid descriptor and a c_int of the size given.
    let rc = unsafe {
        libc::getsockopt(
            std::os::fd::AsRawFd::as_raw_fd(fd),
            level,
            name,
            std::ptr::from_mut(&mut value).cast(),
            &mut len,
        )
    };
    (rc == 0).then_some(i64::from(value))
}
