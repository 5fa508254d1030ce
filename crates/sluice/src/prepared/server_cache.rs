//! Which shared statements one server connection has prepared, bounded by
//! `max_prepared_statements` (least recently used goes first), and which it
//! still has to close.

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use super::registry::Statement;

/// Bytes of statement text one server keeps alive for its statements'
/// sake alone (a client preparing the text again then gets the same id,
/// which the server has): past that, a statement no client names any
/// more is let go. Before, a client that parsed and closed 8 MiB texts in
/// turn made sluice hold every one of them (up to
/// `max_prepared_statements` per server, 64 MiB each: a review-style
/// loop grew sluice by 320 MB in a few seconds, one client alone).
const KEPT_TEXT: usize = 1 << 20;

/// A statement as a server's cache holds it: alive for its sake while
/// its text fits `KEPT_TEXT`, else only while some client names it.
#[derive(Debug)]
enum Held {
    Kept(Arc<Statement>),
    Seen(Weak<Statement>),
}

impl Held {
    fn get(&self) -> Option<Arc<Statement>> {
        match self {
            Held::Kept(s) => Some(Arc::clone(s)),
            Held::Seen(w) => w.upgrade(),
        }
    }
}

/// Statements prepared on one server.
#[derive(Debug, Default)]
pub struct ServerStatements {
    /// Statement id → last use, and the statement itself: held here so
    /// that a client preparing the same text again (after closing it, or a
    /// driver's DEALLOCATE ALL) gets the same id, which the server has.
    used: HashMap<u64, (u64, Held), super::fast_hash::BuildWordHasher>,
    /// Text bytes of the statements held `Kept`.
    kept_bytes: usize,
    /// Statements held `Seen`.
    seen: usize,
    tick: u64,
    /// Statements the server still holds but must not be used again
    /// (evicted, or their plan went stale): closed before the next Parse.
    pub to_close: Vec<u64>,
    /// Closes sent and not answered yet, by statement: an error earlier in
    /// their batch may make the server skip them (see `close_sent`).
    closing: HashMap<u64, u32, super::fast_hash::BuildWordHasher>,
    /// The scope of the pool that lent the server last (`Pool::scope`),
    /// recorded on the statements it proves.
    pub scope: u64,
    /// The client whose unnamed statement the server may hold (None: it
    /// holds none); another client's link closes it first
    /// (`tracked::settle_unnamed`).
    pub unnamed: Option<super::client_names::Owner>,
}

impl ServerStatements {
    /// Marks `id` used; false if the server does not have it.
    pub fn touch(&mut self, id: u64) -> bool {
        self.tick += 1;
        match self.used.get_mut(&id) {
            Some((last, _)) => {
                *last = self.tick;
                true
            }
            None => false,
        }
    }

    /// Records that `id` is being prepared; returns the statement evicted
    /// to stay within `capacity` (0 = no limit), which the caller closes.
    pub fn insert(&mut self, statement: &Arc<Statement>, capacity: usize) -> Option<u64> {
        self.tick += 1;
        if self.seen > 0 {
            self.close_dead();
        }
        let mut evicted = None;
        if capacity > 0 && self.used.len() >= capacity {
            evicted = self
                .used
                .iter()
                .min_by_key(|(_, (last, _))| *last)
                .map(|(id, _)| *id);
            if let Some(old) = evicted {
                self.remove(old);
            }
        }
        let len = statement.text.len();
        let held = if self.kept_bytes + len <= KEPT_TEXT {
            self.kept_bytes += len;
            Held::Kept(Arc::clone(statement))
        } else {
            self.seen += 1;
            Held::Seen(Arc::downgrade(statement))
        };
        if let Some((_, old)) = self.used.insert(statement.id, (self.tick, held)) {
            self.unkeep(&old);
        }
        evicted
    }

    /// Takes `id` out of the cache.
    fn remove(&mut self, id: u64) -> Option<Arc<Statement>> {
        let (_, held) = self.used.remove(&id)?;
        self.unkeep(&held);
        held.get()
    }

    fn unkeep(&mut self, held: &Held) {
        match held {
            Held::Kept(s) => self.kept_bytes -= s.text.len(),
            Held::Seen(_) => self.seen -= 1,
        }
    }

    /// Statements no client names any more, and that this cache does not
    /// keep, can never be used again (a Parse of their text makes a new
    /// one): closed before the next Parse, so that the server lets their
    /// memory go too (review 33: a client's 30 texts of 2 MiB, each
    /// closed, stayed prepared on the server, 130 MB of its memory).
    fn close_dead(&mut self) {
        let before = self.used.len();
        let to_close = &mut self.to_close;
        self.used.retain(|&id, (_, held)| {
            let dead = matches!(held, Held::Seen(w) if w.strong_count() == 0);
            if dead {
                to_close.push(id);
            }
            !dead
        });
        self.seen -= before - self.used.len();
    }

    /// The server accepted the Parse of `id`: the statement is proven in
    /// this server's scope (valid SQL for its database and user).
    pub fn confirm(&self, id: u64) {
        if let Some(statement) = self.used.get(&id).and_then(|(_, h)| h.get()) {
            statement.prove(self.scope);
        }
    }

    /// The server refused the Parse of `id`: it does not have it, and the
    /// text is no longer proven in this server's scope.
    pub fn refuted(&mut self, id: u64) {
        if let Some(statement) = self.remove(id) {
            statement.refute(self.scope);
        }
    }

    /// Running `id` failed for a reason about its text (class 42): it is
    /// no longer proven in this server's scope, and the server's copy is
    /// closed before its next use (a Parse of it then reaches the server).
    pub fn distrust(&mut self, id: u64) {
        if let Some((_, held)) = self.used.get(&id) {
            if let Some(statement) = held.get() {
                statement.refute(self.scope);
            }
            self.retire(id);
        }
    }

    /// The server does not have `id` (its Parse failed or was skipped).
    pub fn forget(&mut self, id: u64) {
        self.remove(id);
    }

    /// The server has `id` but it must be closed and prepared again.
    pub fn retire(&mut self, id: u64) {
        if let Some((_, held)) = self.used.remove(&id) {
            self.unkeep(&held);
            self.to_close.push(id);
        }
    }

    /// A Close of `id` went to the server.
    pub fn close_sent(&mut self, id: u64) {
        *self.closing.entry(id).or_insert(0) += 1;
    }

    /// A Close of `id` is still on its way: a Parse of `id` sent now goes
    /// behind one more Close of it (one of no statement is no error), in
    /// case an error before the first one makes the server skip it.
    pub fn close_in_flight(&self, id: u64) -> bool {
        self.closing.contains_key(&id)
    }

    /// A Close of `id` was answered, failed or skipped. Skipped with no
    /// other Close of `id` behind it (`skipped`): the server still has the
    /// statement, to be closed before the next Parse.
    pub fn close_done(&mut self, id: u64, skipped: bool) {
        let left = match self.closing.get_mut(&id) {
            Some(n) => {
                *n -= 1;
                *n
            }
            None => 0,
        };
        if left == 0 {
            self.closing.remove(&id);
            if skipped {
                self.to_close.push(id);
            }
        }
    }

    /// Statements prepared on the server (SHOW SERVERS).
    pub fn len(&self) -> usize {
        self.used.len()
    }

    /// The server dropped every prepared statement (DISCARD ALL, DEALLOCATE ALL).
    pub fn clear(&mut self) {
        self.used.clear();
        self.kept_bytes = 0;
        self.seen = 0;
        self.to_close.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A skipped Close leaves the statement on the server: closed before
    /// the next Parse, unless another Close of it is already on its way.
    #[test]
    fn a_skipped_close_is_sent_again_unless_another_follows() {
        let mut server = ServerStatements::default();
        server.close_sent(7);
        server.close_sent(7);
        assert!(server.close_in_flight(7));
        server.close_done(7, true);
        assert!(server.to_close.is_empty(), "the second Close follows");
        server.close_done(7, true);
        assert_eq!(
            server.to_close,
            [7],
            "none left: closed before the next Parse"
        );
        assert!(!server.close_in_flight(7));
        server.close_sent(8);
        server.close_done(8, false);
        assert!(!server.close_in_flight(8));
        assert_eq!(server.to_close, [7]);
    }

    #[test]
    fn evicts_least_recently_used() {
        let registry = super::super::registry::Registry::default();
        let [a, b, c] = [b"1\0\0\0", b"2\0\0\0", b"3\0\0\0"].map(|t| registry.intern(t, None));
        let mut s = ServerStatements::default();
        assert_eq!(s.insert(&a, 2), None);
        assert_eq!(s.insert(&b, 2), None);
        assert!(s.touch(a.id));
        assert_eq!(s.insert(&c, 2), Some(b.id));
        assert!(!s.touch(b.id));
        assert!(s.touch(a.id) && s.touch(c.id));
        s.retire(c.id);
        assert_eq!(s.to_close, vec![c.id]);
        assert!(!s.touch(c.id));
    }

    /// Past `KEPT_TEXT`, a server's cache keeps a statement alive only
    /// while a client names it; what it keeps is counted back as it goes.
    #[test]
    fn a_server_keeps_a_bounded_text_alive() {
        let registry = super::super::registry::Registry::default();
        let mut s = ServerStatements::default();
        let big = |i: u8| {
            let mut text = vec![i; KEPT_TEXT / 2];
            text.extend_from_slice(b"\0\0\0");
            registry.intern(&text, None)
        };
        let (a, b) = (big(b'a'), big(b'b'));
        let (weak_b, weak_b_id) = (Arc::downgrade(&b), b.id);
        s.insert(&a, 0);
        s.insert(&b, 0);
        assert!(s.touch(a.id) && s.touch(b.id));
        drop(b);
        assert!(
            weak_b.upgrade().is_none(),
            "past the keep, nothing holds it"
        );
        let a_id = a.id;
        drop(a);
        assert_eq!(big(b'a').id, a_id, "within the keep, the same id");
        s.retire(a_id);
        let c = big(b'c');
        let weak_c = Arc::downgrade(&c);
        s.insert(&c, 0);
        drop(c);
        assert!(
            weak_c.upgrade().is_some(),
            "a retired statement's room is free again"
        );
        // b died: c's Parse closed it on the server first.
        assert_eq!(s.to_close, [a_id, weak_b_id]);
        assert_eq!(s.seen, 0);
    }

    #[test]
    fn a_statement_on_a_server_keeps_its_id() {
        let registry = super::super::registry::Registry::default();
        let mut s = ServerStatements::default();
        let first = registry.intern(b"select 1\0\0\0", None);
        s.insert(&first, 10);
        let id = first.id;
        drop(first);
        assert_eq!(registry.intern(b"select 1\0\0\0", None).id, id);
    }
}
