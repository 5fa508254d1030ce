//! systemd's notify protocol (`Type=notify` units): one datagram to the
//! socket named by `$NOTIFY_SOCKET` when sluice is ready to serve, around
//! each reload (`RELOADING=1`, then `READY=1` again) and when it begins to
//! stop. Without the variable nothing is sent; a failed send is logged once
//! at debug level and otherwise ignored (systemd then times out the unit,
//! which says more than sluice could).

use std::os::unix::net::UnixDatagram;

/// Tells systemd the service is up (listeners bound, workers running).
pub fn ready() {
    send(&format!(
        "READY=1\nMAINPID={}\nSTATUS=serving",
        std::process::id()
    ));
}

/// Tells systemd a reload began; `READY=1` follows when it is done.
pub fn reloading() {
    let now = monotonic_usec();
    send(&format!(
        "RELOADING=1\nMONOTONIC_USEC={now}\nSTATUS=reloading"
    ));
}

/// The reload is done (applied or refused): serving again.
pub fn reloaded() {
    send("READY=1\nSTATUS=serving");
}

/// Tells systemd sluice is shutting down (`why` shown by `systemctl status`).
pub fn stopping(why: &str) {
    send(&format!("STOPPING=1\nSTATUS={why}"));
}

fn send(message: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let sent = UnixDatagram::unbound().and_then(|socket| {
        let bytes = path.as_encoded_bytes();
        if let Some(name) = bytes.strip_prefix(b"@") {
            // An abstract socket (systemd's default for user services).
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
            socket.send_to_addr(message.as_bytes(), &addr)
        } else {
            socket.send_to(message.as_bytes(), &path)
        }
    });
    if let Err(e) = sent {
        tracing::debug!("sd_notify to {}: {e}", path.to_string_lossy());
    }
}

/// CLOCK_MONOTONIC in microseconds, as `RELOADING=1` wants it.
fn monotonic_usec() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into the pointer given.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    if rc != 0 {
        return 0;
    }
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000
        + u64::try_from(ts.tv_nsec).unwrap_or(0) / 1_000
}
