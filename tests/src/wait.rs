//! Bounded polling: every "wait until X" in the suite goes through these, so
//! nothing can wait forever and the failure message says what was awaited.

use std::future::Future;
use std::time::{Duration, Instant};

/// Polls `check` every 50 ms until it returns `Some`, for at most `timeout`.
/// Returns the value, or `None` after the deadline.
pub async fn eventually<T, F, Fut>(timeout: Duration, mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return Some(value);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Blocking version of [`eventually`].
pub fn eventually_sync<T>(timeout: Duration, mut check: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check() {
            return Some(value);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
