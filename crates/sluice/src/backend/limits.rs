//! Connection budgets shared by several pools: `max_db_connections` (all
//! pools of a database) and `max_user_connections` (all pools of a user).
//! Atomics, so every worker thread sees the same count.

use std::sync::atomic::{AtomicU32, Ordering};

/// A counter with an optional ceiling (0 = unlimited).
#[derive(Debug, Default)]
pub struct ConnLimit {
    max: AtomicU32,
    current: AtomicU32,
}

impl ConnLimit {
    pub fn new(max: u32) -> Self {
        Self {
            max: AtomicU32::new(max),
            current: AtomicU32::new(0),
        }
    }

    pub fn set_max(&self, max: u32) {
        self.max.store(max, Ordering::Relaxed);
    }

    /// True when a ceiling is set: waiters must then look again now and
    /// then, as another pool may free a unit.
    pub fn is_limited(&self) -> bool {
        self.max.load(Ordering::Relaxed) != 0
    }

    /// Takes one unit if the ceiling allows.
    pub fn try_take(&self) -> bool {
        let max = self.max.load(Ordering::Relaxed);
        self.current
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| {
                (max == 0 || c < max).then_some(c + 1)
            })
            .is_ok()
    }

    pub fn give_back(&self) {
        let _ = self
            .current
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| c.checked_sub(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceiling_holds_and_zero_is_unlimited() {
        let l = ConnLimit::new(2);
        assert!(l.try_take() && l.try_take());
        assert!(!l.try_take());
        l.give_back();
        assert!(l.try_take());
        let u = ConnLimit::new(0);
        assert!((0..1000).all(|_| u.try_take()));
    }
}
