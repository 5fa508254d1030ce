//! PostgreSQL refuses to run as root. When the testkit itself runs as root
//! (containers, CI), server-side tools are run as the `postgres` system user;
//! this module looks that user up once.

use std::ffi::{CStr, CString};
use std::path::PathBuf;
use std::sync::OnceLock;

use crate::error::TestkitError;

/// The system account that owns and runs the server processes.
#[derive(Debug, Clone)]
pub(crate) struct ServerOwner {
    pub(crate) uid: u32,
    pub(crate) gid: u32,
    pub(crate) home: PathBuf,
}

const SERVER_USER: &str = "postgres";

/// `Ok(None)` when not running as root (tools run as the current user),
/// otherwise the `postgres` account to switch to.
pub(crate) fn server_owner() -> Result<Option<&'static ServerOwner>, TestkitError> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(None);
    }
    static OWNER: OnceLock<Option<ServerOwner>> = OnceLock::new();
    OWNER
        .get_or_init(|| lookup(SERVER_USER))
        .as_ref()
        .map(Some)
        .ok_or(TestkitError::NoPostgresUser)
}

/// Looks a user up in the password database with the re-entrant `getpwnam_r`.
fn lookup(name: &str) -> Option<ServerOwner> {
    let c_name = CString::new(name).ok()?;
    let mut buf_len = 16 * 1024;
    loop {
        let mut buf = vec![0 as libc::c_char; buf_len];
        // SAFETY: passwd is plain old data; an all-zero value is valid.
        let mut entry: libc::passwd = unsafe { std::mem::zeroed() };
        let mut result: *mut libc::passwd = std::ptr::null_mut();
        // SAFETY: every pointer refers to live, correctly sized storage owned
        // by this frame; getpwnam_r writes strings only into `buf`.
        let rc = unsafe {
            libc::getpwnam_r(
                c_name.as_ptr(),
                &mut entry,
                buf.as_mut_ptr(),
                buf.len(),
                &mut result,
            )
        };
        if rc == libc::ERANGE && buf_len < 1024 * 1024 {
            buf_len *= 4;
            continue;
        }
        if rc != 0 || result.is_null() {
            return None;
        }
        let home = if entry.pw_dir.is_null() {
            PathBuf::from("/")
        } else {
            // SAFETY: pw_dir points to a NUL-terminated string inside `buf`,
            // which is still alive here.
            let dir = unsafe { CStr::from_ptr(entry.pw_dir) };
            PathBuf::from(dir.to_string_lossy().into_owned())
        };
        return Some(ServerOwner {
            uid: entry.pw_uid,
            gid: entry.pw_gid,
            home,
        });
    }
}
