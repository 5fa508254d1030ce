//! One private directory per cluster: it holds the data directory and the
//! unix socket, is unique across threads and processes, and is removed when
//! its owner is dropped (also while a test panics).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::TestkitError;
use crate::server_owner::server_owner;

/// Every testkit directory name starts with this, followed by `<pid>-`.
pub(crate) const PREFIX: &str = "sluice-testkit-";

/// Longest base directory we use; the socket path
/// `<base>/<name>/.s.PGSQL.<port>.lock` must stay under ~107 bytes.
const MAX_BASE_LEN: usize = 40;

/// A directory that is deleted, with everything in it, on drop.
#[derive(Debug)]
pub(crate) struct TempDir {
    path: PathBuf,
}

impl TempDir {
    /// Creates `<temp>/sluice-testkit-<pid>-<counter>-<random>`, owned by the
    /// server owner when running as root.
    pub(crate) fn create() -> Result<TempDir, TestkitError> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let base = base_dir();
        let pid = std::process::id();
        let mut last_error = None;
        for _ in 0..16 {
            let n = COUNTER.fetch_add(1, Ordering::Relaxed);
            let path = base.join(format!("{PREFIX}{pid}-{n}-{:08x}", random_u32()));
            match std::fs::create_dir(&path) {
                Ok(()) => {
                    let dir = TempDir { path };
                    give_to_server_owner(&dir.path)?;
                    return Ok(dir);
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last_error = Some(e),
                Err(e) => {
                    return Err(TestkitError::io(format!("creating {}", path.display()), e));
                }
            }
        }
        Err(TestkitError::io(
            format!("creating a unique directory in {}", base.display()),
            last_error.unwrap_or_else(|| std::io::Error::other("name collisions")),
        ))
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// `std::env::temp_dir()`, or /tmp when that path is too long for sockets.
pub(crate) fn base_dir() -> PathBuf {
    let base = std::env::temp_dir();
    if base.as_os_str().len() > MAX_BASE_LEN {
        PathBuf::from("/tmp")
    } else {
        base
    }
}

/// Makes `path` owned by the `postgres` user when we run as root, so the
/// server tools (which run as that user) can write there.
pub(crate) fn give_to_server_owner(path: &Path) -> Result<(), TestkitError> {
    if let Some(owner) = server_owner()? {
        std::os::unix::fs::chown(path, Some(owner.uid), Some(owner.gid)).map_err(|e| {
            TestkitError::io(format!("giving {} to user postgres", path.display()), e)
        })?;
    }
    Ok(())
}

/// Writes a file and hands it to the server owner.
pub(crate) fn write_owned(path: &Path, contents: &str) -> Result<(), TestkitError> {
    std::fs::write(path, contents)
        .map_err(|e| TestkitError::io(format!("writing {}", path.display()), e))?;
    give_to_server_owner(path)
}

/// A random number without a dependency: std's hasher keys are random per instance.
fn random_u32() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    hasher.finish() as u32
}
