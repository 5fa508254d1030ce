//! One budget, for the whole process, of the memory that clients' large
//! messages take while sluice holds them whole. Transaction and statement
//! mode read a Parse, Bind, Describe, Close, Query or FunctionCall whole
//! before anything of it goes to a server (they are rewritten), up to
//! 64 MiB each: without a bound across clients, a few hundred logged-in
//! clients each sending one such message (slowly, as the trickle rules
//! allow minutes for it) made sluice take tens of GiB and the kernel end
//! it, with every other client's connection. A message that fits the
//! relay's window (`BUFFER_LIMIT`, 256 KiB) takes nothing from the budget,
//! so ordinary traffic never touches it; one larger takes a `Grant` of its
//! size before more of it is read, and a client whose message would pass
//! `max_held_memory` is refused (53200) while the others go on.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::frontend::error::ClientError;

/// Bytes granted to the messages held now.
#[derive(Default)]
pub struct HeldMemory {
    used: AtomicUsize,
}

impl HeldMemory {
    /// Bytes granted now (/metrics).
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }
}

/// One client's share of the budget: the size of the largest message it
/// held whole since its buffer was last given back. Given back when it is
/// dropped or `release`d, so a client that leaves in any way frees it.
#[derive(Default)]
pub struct Grant {
    budget: Option<Arc<HeldMemory>>,
    bytes: usize,
}

impl Grant {
    /// Makes the grant cover a message of `size` bytes held whole, taking
    /// what it lacks from `budget` unless that would pass `limit` bytes (0:
    /// no limit). Messages that fit `window` take nothing.
    pub fn cover(
        &mut self,
        budget: &Arc<HeldMemory>,
        size: usize,
        window: usize,
        limit: usize,
    ) -> Result<(), ClientError> {
        if size <= window || size <= self.bytes {
            return Ok(());
        }
        let more = size - self.bytes;
        let taken = budget
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                let after = used.checked_add(more)?;
                (limit == 0 || after <= limit).then_some(after)
            });
        if taken.is_err() {
            return Err(refused(size, limit));
        }
        if self.budget.is_none() {
            self.budget = Some(Arc::clone(budget));
        }
        self.bytes = size;
        Ok(())
    }

    /// Gives the grant back (the buffer that held the message is gone).
    pub fn release(&mut self) {
        if let Some(budget) = &self.budget
            && self.bytes > 0
        {
            budget.used.fetch_sub(self.bytes, Ordering::AcqRel);
        }
        self.bytes = 0;
    }
}

impl Drop for Grant {
    fn drop(&mut self) {
        self.release();
    }
}

/// How large a buffer that holds `buffered` bytes of a message whole at
/// `wanted` may grow by its next read: the room for a read doubles with
/// what has arrived (`relay_io::reserve`), so a grant follows the bytes
/// that came, not what a header announced (a client announcing 64 MiB and
/// sending nothing takes nothing from the others).
pub fn reach(wanted: usize, buffered: usize, chunk: usize) -> usize {
    wanted.min(buffered.saturating_mul(2).saturating_add(chunk))
}

/// What a client whose message does not fit the budget gets: PostgreSQL's
/// out-of-memory SQLSTATE, with what was asked and why.
fn refused(size: usize, limit: usize) -> ClientError {
    ClientError::new(
        "53200",
        format!(
            "out of memory: a message of {size} bytes cannot be held whole now; \
             max_held_memory ({limit} bytes) is taken by other large messages"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW: usize = 100;

    #[test]
    fn small_messages_take_nothing() {
        let budget = Arc::new(HeldMemory::default());
        let mut g = Grant::default();
        g.cover(&budget, WINDOW, WINDOW, 1).unwrap();
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn a_grant_grows_to_its_largest_message_and_goes_back() {
        let budget = Arc::new(HeldMemory::default());
        let mut g = Grant::default();
        g.cover(&budget, 300, WINDOW, 1000).unwrap();
        g.cover(&budget, 200, WINDOW, 1000).unwrap();
        assert_eq!(budget.used(), 300);
        g.cover(&budget, 700, WINDOW, 1000).unwrap();
        assert_eq!(budget.used(), 700);
        g.release();
        assert_eq!(budget.used(), 0);
        g.cover(&budget, 400, WINDOW, 1000).unwrap();
        drop(g);
        assert_eq!(budget.used(), 0, "a dropped grant gives its bytes back");
    }

    #[test]
    fn a_message_past_the_limit_is_refused_and_takes_nothing() {
        let budget = Arc::new(HeldMemory::default());
        let mut a = Grant::default();
        let mut b = Grant::default();
        a.cover(&budget, 600, WINDOW, 1000).unwrap();
        let e = b.cover(&budget, 500, WINDOW, 1000).unwrap_err();
        assert_eq!(e.code, "53200");
        assert_eq!(budget.used(), 600);
        b.cover(&budget, 400, WINDOW, 1000).unwrap();
        assert_eq!(budget.used(), 1000);
        a.release();
        b.cover(&budget, 900, WINDOW, 1000).unwrap();
        assert_eq!(budget.used(), 900);
    }

    #[test]
    fn a_grant_follows_what_arrived() {
        assert_eq!(reach(64 << 20, 10, 8), 28);
        assert_eq!(reach(64 << 20, 1 << 20, 8), (2 << 20) + 8);
        assert_eq!(reach(3 << 20, 2 << 20, 8), 3 << 20);
    }

    #[test]
    fn no_limit_still_counts() {
        let budget = Arc::new(HeldMemory::default());
        let mut g = Grant::default();
        g.cover(&budget, usize::MAX / 2, WINDOW, 0).unwrap();
        assert_eq!(budget.used(), usize::MAX / 2);
    }
}
