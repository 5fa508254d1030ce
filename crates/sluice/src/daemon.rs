//! Process-level chores PgBouncer's flags ask for: -d (fork into the
//! background), -u (switch OS user), and refusing settings sluice does not
//! implement rather than silently ignoring them.

use std::ffi::CString;

use sluice_config::{AuthType, Settings};

/// A setting sluice cannot honour; startup stops with this.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Unsupported(String);

/// Refuses configurations that would silently behave differently.
pub fn check_supported(s: &Settings) -> Result<(), Unsupported> {
    match s.auth_type {
        AuthType::Any
        | AuthType::Trust
        | AuthType::Plain
        | AuthType::Md5
        | AuthType::ScramSha256
        | AuthType::Cert
        | AuthType::Hba => {}
        other => {
            return Err(Unsupported(format!(
                "auth_type = {} is not supported by sluice (no {} library is linked): use hba \
                 with md5, scram-sha-256 or cert, or auth_query",
                other.as_str(),
                other.as_str().to_ascii_uppercase()
            )));
        }
    }
    if crate::logging::facility_code(&s.syslog_facility).is_none() {
        return Err(Unsupported(format!(
            "syslog_facility = {} is not a syslog facility (auth, authpriv, daemon, user, \
             local0-local7…)",
            s.syslog_facility
        )));
    }
    if !s.dns_zone_check_period.is_zero() {
        return Err(Unsupported(
            "dns_zone_check_period needs PgBouncer's c-ares zone serial checks, which sluice \
             does not do: set it to 0 (host names are looked up again once dns_max_ttl has \
             passed)"
                .into(),
        ));
    }
    if !s.resolv_conf.is_empty() {
        return Err(Unsupported(format!(
            "resolv_conf = {} needs PgBouncer's c-ares resolver; sluice uses the system's \
             (/etc/resolv.conf, nsswitch): remove the setting",
            s.resolv_conf
        )));
    }
    Ok(())
}

/// Warns about settings that are accepted but can do nothing here (once
/// logging runs: at startup and on RELOAD).
pub fn warn_without_effect(s: &Settings) {
    if s.auth_type == AuthType::Trust && s.auth_file.is_none() {
        tracing::warn!(
            "auth_type = trust without an auth_file admits any user name; set auth_file to \
             admit only the users listed there (PgBouncer's rule)"
        );
    }
    // Tuning knobs of PgBouncer's own event loop: nothing in sluice to
    // turn, said once rather than ignored in silence.
    let defaults = Settings::default();
    for (key, set, why) in [
        (
            "pkt_buf",
            s.pkt_buf != defaults.pkt_buf,
            "sluice's buffers grow with what arrives (bounded by max_packet_size)",
        ),
        (
            "sbuf_loopcnt",
            s.sbuf_loopcnt != defaults.sbuf_loopcnt,
            "each connection is a task of its own; the runtime's budget keeps a busy one \
             from starving the others",
        ),
        (
            "suspend_timeout",
            s.suspend_timeout != defaults.suspend_timeout,
            "SUSPEND and online restart (-R) are not implemented; restarts use so_reuseport",
        ),
        (
            "auth_ldap_options",
            s.auth_ldap_options != defaults.auth_ldap_options,
            "sluice links no LDAP library (auth_type = ldap is refused)",
        ),
        (
            "job_name (service_name)",
            s.job_name != defaults.job_name,
            "it names the Windows service",
        ),
    ] {
        if set {
            tracing::warn!("{key} is set but has no effect in sluice: {why}");
        }
    }
}

/// Forks; the parent exits, the child leaves the terminal.
pub fn daemonize() -> std::io::Result<()> {
    // SAFETY: called before sluice starts a thread of its own. jemalloc's
    // background thread may run: jemalloc takes its locks around fork
    // (pthread_atfork), and main starts the thread again in the child.
    match unsafe { libc::fork() } {
        -1 => return Err(std::io::Error::last_os_error()),
        0 => {}
        _ => std::process::exit(0),
    }
    // SAFETY: plain syscalls on the child's own process and descriptors.
    unsafe {
        if libc::setsid() == -1 {
            return Err(std::io::Error::last_os_error());
        }
        let devnull = CString::new("/dev/null").expect("static string");
        let fd = libc::open(devnull.as_ptr(), libc::O_RDWR);
        if fd >= 0 {
            libc::dup2(fd, 0);
            libc::dup2(fd, 1);
            libc::dup2(fd, 2);
            if fd > 2 {
                libc::close(fd);
            }
        }
    }
    Ok(())
}

/// Switches to `user`'s uid and gid (no-op when already that user).
pub fn switch_user(user: &str) -> std::io::Result<()> {
    let name = CString::new(user).map_err(|_| std::io::Error::other("user name contains NUL"))?;
    // SAFETY: getpwnam returns a pointer into static storage or null; read
    // at once, before any other call that could overwrite it.
    let (uid, gid) = unsafe {
        let pw = libc::getpwnam(name.as_ptr());
        if pw.is_null() {
            return Err(std::io::Error::other(format!("no such user {user}")));
        }
        ((*pw).pw_uid, (*pw).pw_gid)
    };
    // SAFETY: plain syscalls.
    unsafe {
        if libc::geteuid() == uid {
            return Ok(());
        }
        if libc::setgid(gid) != 0 || libc::setuid(uid) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}
