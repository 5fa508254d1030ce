//! Knowing when to tear the cluster down: SIGTERM/SIGINT (flag set by a
//! minimal async-signal-safe handler) or EOF on stdin (seen by a reader thread).

use std::io::Read;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

static SIGNALLED: AtomicBool = AtomicBool::new(false);
static STDIN_CLOSED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_signal: libc::c_int) {
    SIGNALLED.store(true, Ordering::SeqCst);
}

/// Installs the SIGTERM and SIGINT handlers.
pub fn install_signal_handlers() {
    let handler = on_signal as extern "C" fn(libc::c_int);
    for signal in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: the handler only stores to an atomic, which is
        // async-signal-safe; it lives for the whole program.
        unsafe {
            libc::signal(signal, handler as libc::sighandler_t);
        }
    }
}

/// Whether a stop signal arrived.
pub fn signalled() -> bool {
    SIGNALLED.load(Ordering::SeqCst)
}

/// Blocks until stdin reaches EOF (or fails) or a stop signal arrives.
pub fn wait_for_stop() {
    std::thread::spawn(|| {
        let mut stdin = std::io::stdin().lock();
        let mut buf = [0u8; 4096];
        loop {
            match stdin.read(&mut buf) {
                Ok(0) => break,
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
        }
        STDIN_CLOSED.store(true, Ordering::SeqCst);
    });
    while !signalled() && !STDIN_CLOSED.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(50));
    }
}
