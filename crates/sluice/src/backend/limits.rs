//! Connection budgets shared by several pools: `max_db_connections` (all
//! pools of a database) and `max_user_connections` (all pools of a user).
//! Atomics, so every worker thread sees the same count. A pool blocked by a
//! full budget may close an idle server of another pool sharing it, as
//! PgBouncer does, so idle servers never starve a waiting client. A
//! budget knows its pools only as `Member`s (it does not depend on the
//! pool, which depends on it).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// What a budget asks of a pool that counts against it.
pub trait Member: Send + Sync {
    /// Closes the member's oldest idle server (giving its unit back);
    /// true if there was one.
    fn close_oldest_idle(&self) -> bool;
}

/// A counter with an optional ceiling (0 = unlimited).
#[derive(Default)]
pub struct ConnLimit {
    max: AtomicU32,
    current: AtomicU32,
    /// Pools that count against this budget.
    members: Mutex<Vec<Weak<dyn Member>>>,
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
    pub fn join<M: Member + 'static>(&self, pool: &Arc<M>) {
        let mut m = self.members.lock().unwrap_or_else(|p| p.into_inner());
        m.retain(|w| w.strong_count() > 0);
        let pool: Arc<dyn Member> = pool.clone();
        m.push(Arc::downgrade(&pool));
    }

    /// True when a ceiling is set and reached.
    pub fn is_full(&self) -> bool {
        let max = self.max.load(Ordering::Relaxed);
        max != 0 && self.current.load(Ordering::Relaxed) >= max
    }

    /// Closes the oldest idle server of another member pool; true if one
    /// was closed (and its unit given back).
    pub fn evict_idle<M: Member>(&self, except: &M) -> bool {
        let members: Vec<Arc<dyn Member>> = {
            let m = self.members.lock().unwrap_or_else(|p| p.into_inner());
            m.iter().filter_map(Weak::upgrade).collect()
        };
        let except = std::ptr::from_ref(except).cast::<()>();
        members
            .iter()
            .filter(|p| Arc::as_ptr(p).cast::<()>() != except)
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

    /// A member with `idle` idle servers.
    struct Idle(AtomicU32);

    impl Member for Idle {
        fn close_oldest_idle(&self) -> bool {
            self.0
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
                .is_ok()
        }
    }

    #[test]
    fn a_full_budget_evicts_from_another_member_only() {
        let l = ConnLimit::new(2);
        let me = Arc::new(Idle(AtomicU32::new(5)));
        let other = Arc::new(Idle(AtomicU32::new(1)));
        l.join(&me);
        l.join(&other);
        assert!(l.evict_idle(&*me), "the other member's idle server");
        assert_eq!(other.0.load(Ordering::Relaxed), 0);
        assert!(!l.evict_idle(&*me), "never its own");
        assert_eq!(me.0.load(Ordering::Relaxed), 5);
        // A dropped member is forgotten.
        drop(other);
        let third = Arc::new(Idle(AtomicU32::new(1)));
        l.join(&third);
        assert_eq!(l.members.lock().map(|m| m.len()).unwrap_or(0), 2);
    }
}
