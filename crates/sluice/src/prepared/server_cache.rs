//! Which shared statements one server connection has prepared, bounded by
//! `max_prepared_statements` (least recently used goes first), and which it
//! still has to close.

use std::collections::HashMap;

/// Statements prepared on one server.
#[derive(Debug, Default)]
pub struct ServerStatements {
    /// Statement id → last use.
    used: HashMap<u64, u64, super::fast_hash::BuildWordHasher>,
    tick: u64,
    /// Statements the server still holds but must not be used again
    /// (evicted, or their plan went stale): closed before the next Parse.
    pub to_close: Vec<u64>,
}

impl ServerStatements {
    /// Marks `id` used; false if the server does not have it.
    pub fn touch(&mut self, id: u64) -> bool {
        self.tick += 1;
        match self.used.get_mut(&id) {
            Some(last) => {
                *last = self.tick;
                true
            }
            None => false,
        }
    }

    /// Records that `id` is being prepared; returns the statement evicted
    /// to stay within `capacity` (0 = no limit), which the caller closes.
    pub fn insert(&mut self, id: u64, capacity: usize) -> Option<u64> {
        self.tick += 1;
        let mut evicted = None;
        if capacity > 0 && self.used.len() >= capacity {
            evicted = self
                .used
                .iter()
                .min_by_key(|(_, last)| **last)
                .map(|(id, _)| *id);
            if let Some(old) = evicted {
                self.used.remove(&old);
            }
        }
        self.used.insert(id, self.tick);
        evicted
    }

    /// The server does not have `id` (its Parse failed or was skipped).
    pub fn forget(&mut self, id: u64) {
        self.used.remove(&id);
    }

    /// The server has `id` but it must be closed and prepared again.
    pub fn retire(&mut self, id: u64) {
        if self.used.remove(&id).is_some() {
            self.to_close.push(id);
        }
    }

    /// The server dropped every prepared statement (DISCARD ALL, DEALLOCATE ALL).
    pub fn clear(&mut self) {
        self.used.clear();
        self.to_close.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_least_recently_used() {
        let mut s = ServerStatements::default();
        assert_eq!(s.insert(1, 2), None);
        assert_eq!(s.insert(2, 2), None);
        assert!(s.touch(1));
        assert_eq!(s.insert(3, 2), Some(2));
        assert!(!s.touch(2));
        assert!(s.touch(1) && s.touch(3));
        s.retire(3);
        assert_eq!(s.to_close, vec![3]);
        assert!(!s.touch(3));
    }
}
