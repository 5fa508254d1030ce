//! Which worker thread the caller runs on (per-core layout). A leaf: the
//! server records the worker that opened it, the idle stacks are kept per
//! worker, and neither needs the other to ask.

use std::cell::Cell;

thread_local! {
    static WORKER: Cell<usize> = const { Cell::new(0) };
}

/// Marks the calling thread as worker `index` (per-core layout).
pub fn set_current_worker(index: usize) {
    WORKER.with(|w| w.set(index));
}

/// The worker the calling thread is (0 outside the per-core layout).
pub fn current_worker() -> usize {
    WORKER.with(Cell::get)
}
