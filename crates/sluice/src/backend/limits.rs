//! Connection budgets shared by several pools: `max_db_connections` (all
//! pools of a database) and `max_user_connections` (all pools of a user).
//! Atomics, so every worker thread sees the same count. A pool blocked by a
//! full budget may close an idle server of another pool sharing it, as
//! PgBouncer does, so idle servers never starve a waiting client.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Weak};

use super::pool::Pool;

/// A counter with an optional ceiling (0 = unlimited).
#[derive(Default)]
pub struct ConnLimit {
    max: AtomicU32,
    current: AtomicU32,
    /// Pools that count against this budget.
    members: Mutex<Vec<Weak<Pool>>>,
}

impl ConnLimit {
    pub fn new(max: u32) -> Self {
        Self {
            max: AtomicU32::new(max),
            current: AtomicU32::new(0),
            members: Mutex::default(),
        }
    }

    /// Registers a pool that counts against this budget.
    pub fn join(&self, pool: &Arc<Pool>) {
        let mut m = self.members.lock().unwrap_or_else(|p| p.into_inner());
        m.retain(|w| w.strong_count() > 0);
        m.push(Arc::downgrade(pool));
    }

    /// True when a ceiling is set and reached.
    pub fn is_full(&self) -> bool {
        let max = self.max.load(Ordering::Relaxed);
        max != 0 && self.current.load(Ordering::Relaxed) >= max
    }

    /// Closes the oldest idle server of another member pool; true if one
    /// was closed (and its unit given back).
    pub fn evict_idle(&self, except: &Pool) -> bool {
        let members: Vec<Arc<Pool>> = {
            let m = self.members.lock().unwrap_or_else(|p| p.into_inner());
            m.iter().filter_map(Weak::upgrade).collect()
        };
        members
            .iter()
            .filter(|p| !std::ptr::eq(Arc::as_ptr(p), except))
            .any(|p| p.close_oldest_idle())
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
