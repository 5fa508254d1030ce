//! Helpers shared by unit tests that drive tasks on a runtime of their own
//! (the ring's, the parking lot's): written once so that they stay alike.

use std::time::Duration;

/// A current-thread runtime with timers and I/O, as a worker has.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// Lets the runtime's other tasks (and the kernel) run: 20 rounds of a
/// yield and a sleep of `step`.
pub async fn let_tasks_run(step: Duration) {
    for _ in 0..20 {
        tokio::task::yield_now().await;
        tokio::time::sleep(step).await;
    }
}
