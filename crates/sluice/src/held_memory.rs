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
//! `max_held_memory_mb` is refused (53200) while the others go on. What
//! else clients make sluice keep counts too (reviews 32 to 35): prepared
//! statements (each distinct text once, with its entry, while it lives),
//! clients' statement names, and the session settings carried for each
//! client. A Parse past the budget fails with 53200 and the client goes
//! on; settings past it end their client.

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::frontend::error::ClientError;

/// Bytes granted, and the most that may be (0: no limit).
#[derive(Debug)]
pub struct HeldMemory {
    used: AtomicUsize,
    limit: AtomicUsize,
}

/// The process's budget: `max_held_memory_mb`, set at startup and by
/// each RELOAD (`App`).
pub static BUDGET: HeldMemory = HeldMemory::new();

impl HeldMemory {
    pub const fn new() -> Self {
        Self {
            used: AtomicUsize::new(0),
            limit: AtomicUsize::new(0),
        }
    }

    /// Bytes granted now (/metrics).
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// The most that may be granted, in bytes (0: no limit). Grants held
    /// past a lowered limit stay; only new ones are refused.
    pub fn set_limit(&self, bytes: usize) {
        self.limit.store(bytes, Ordering::Relaxed);
    }

    /// Takes `more` bytes (for something of `total` bytes), unless that
    /// passes the limit.
    fn take(&self, more: usize, total: usize) -> Result<(), Refused> {
        let limit = self.limit.load(Ordering::Relaxed);
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                let after = used.saturating_add(more);
                (limit == 0 || after <= limit).then_some(after)
            })
            .map(drop)
            .map_err(|_| Refused { size: total, limit })
    }

    fn give(&self, bytes: usize) {
        self.used.fetch_sub(bytes, Ordering::AcqRel);
    }
}

/// A share of a budget, given back when it is dropped or `release`d, so
/// that whatever holds it (a client, a statement) cannot leak it.
#[derive(Debug)]
pub struct Grant {
    budget: &'static HeldMemory,
    bytes: usize,
}

impl Default for Grant {
    fn default() -> Self {
        Self::on(&BUDGET)
    }
}

impl Grant {
    /// An empty grant of `budget`.
    pub fn on(budget: &'static HeldMemory) -> Self {
        Self { budget, bytes: 0 }
    }

    /// A grant of `bytes` (a statement's text), refused past the limit.
    pub fn of(budget: &'static HeldMemory, bytes: usize) -> Result<Self, Refused> {
        budget.take(bytes, bytes)?;
        Ok(Self { budget, bytes })
    }

    /// Takes `more` bytes into the grant, unless that passes the limit.
    pub fn add(&mut self, more: usize) -> Result<(), Refused> {
        self.budget.take(more, more)?;
        self.bytes += more;
        Ok(())
    }

    /// Takes `more` bytes into the grant even past the limit (memory that
    /// was held a moment ago and comes back).
    pub fn add_anyway(&mut self, more: usize) {
        self.budget.used.fetch_add(more, Ordering::AcqRel);
        self.bytes += more;
    }

    /// Makes the grant `size` bytes, taking what it lacks unless that
    /// passes the limit (it is left as it was then).
    pub fn resize(&mut self, size: usize) -> Result<(), Refused> {
        if size > self.bytes {
            self.add(size - self.bytes)
        } else {
            self.sub(self.bytes - size);
            Ok(())
        }
    }

    /// Gives `less` bytes of the grant back.
    pub fn sub(&mut self, less: usize) {
        let less = less.min(self.bytes);
        self.budget.give(less);
        self.bytes -= less;
    }

    /// Makes the grant cover a message of `size` bytes held whole, taking
    /// what it lacks unless that would pass the limit. Messages that fit
    /// `window` take nothing.
    pub fn cover(&mut self, size: usize, window: usize) -> Result<(), Refused> {
        if size <= window || size <= self.bytes {
            return Ok(());
        }
        self.budget.take(size - self.bytes, size)?;
        self.bytes = size;
        Ok(())
    }

    /// Gives the grant back (the buffer that held the message is gone).
    pub fn release(&mut self) {
        if self.bytes > 0 {
            self.budget.give(self.bytes);
        }
        self.bytes = 0;
    }
}

impl Drop for Grant {
    fn drop(&mut self) {
        self.release();
    }
}

/// Sets the process's budget to `mb` MiB (0: no limit).
pub fn set_limit_mb(mb: u32) {
    BUDGET.set_limit((mb as usize).saturating_mul(1 << 20));
}

/// Makes a client's `grant` cover its buffer, which holds `buffered`
/// bytes and is read on until `wanted` (a message held whole); a refusal
/// is the client's FATAL error.
pub fn hold(grant: &mut Grant, wanted: usize, buffered: usize) -> Result<(), ClientError> {
    use crate::frontend::relay_io::{BUFFER_LIMIT, READ_CHUNK};
    if wanted <= BUFFER_LIMIT {
        return Ok(());
    }
    grant
        .cover(reach(wanted, buffered, READ_CHUNK), BUFFER_LIMIT)
        .map_err(|refused| refused.fatal())
}

/// Once the message a client's grant covered is done (what is left of its
/// buffer fits the window), the buffer is made small again and the grant
/// given back: the allocation had stayed as large as the message, held by
/// a client idle in its transaction after a 5 MiB query, or with a byte of
/// its next message sent (review 32). Rare: only a buffer with a grant.
pub fn shrink(buf: &mut bytes::BytesMut, grant: &mut Grant) {
    use crate::frontend::relay_io::{BUFFER_LIMIT, READ_CHUNK};
    if grant.bytes == 0 || buf.len() > BUFFER_LIMIT {
        return;
    }
    let mut small = bytes::BytesMut::with_capacity(buf.len().max(READ_CHUNK));
    small.extend_from_slice(buf);
    *buf = small;
    grant.release();
}

/// How large a buffer that holds `buffered` bytes of a message whole at
/// `wanted` may grow by its next read: the room for a read doubles with
/// what has arrived (`relay_io::reserve`), so a grant follows the bytes
/// that came, not what a header announced (a client announcing 64 MiB and
/// sending nothing takes nothing from the others).
pub fn reach(wanted: usize, buffered: usize, chunk: usize) -> usize {
    wanted.min(buffered.saturating_mul(2).saturating_add(chunk))
}

/// Memory that would pass `max_held_memory_mb`.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{}", self.message())]
pub struct Refused {
    size: usize,
    limit: usize,
}

impl Refused {
    fn message(&self) -> String {
        if self.size > self.limit {
            format!(
                "out of memory: {} bytes is more than max_held_memory_mb ({} bytes) allows \
                 sluice to hold",
                self.size, self.limit
            )
        } else {
            format!(
                "out of memory: {} bytes cannot be held now; max_held_memory_mb ({} bytes) \
                 is taken by large messages and prepared statements",
                self.size, self.limit
            )
        }
    }

    /// PostgreSQL's SQLSTATE for it.
    pub const CODE: &'static str = "53200";

    /// The FATAL error for a client whose message it refused.
    pub fn fatal(&self) -> ClientError {
        ClientError::new(Self::CODE, self.message())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW: usize = 100;

    fn budget(limit: usize) -> &'static HeldMemory {
        let b = Box::leak(Box::new(HeldMemory::new()));
        b.set_limit(limit);
        b
    }

    #[test]
    fn small_messages_take_nothing() {
        let budget = budget(1);
        let mut g = Grant::on(budget);
        g.cover(WINDOW, WINDOW).unwrap();
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn a_grant_grows_to_its_largest_message_and_goes_back() {
        let budget = budget(1000);
        let mut g = Grant::on(budget);
        g.cover(300, WINDOW).unwrap();
        g.cover(200, WINDOW).unwrap();
        assert_eq!(budget.used(), 300);
        g.cover(700, WINDOW).unwrap();
        assert_eq!(budget.used(), 700);
        g.release();
        assert_eq!(budget.used(), 0);
        g.cover(400, WINDOW).unwrap();
        drop(g);
        assert_eq!(budget.used(), 0, "a dropped grant gives its bytes back");
    }

    #[test]
    fn a_message_past_the_limit_is_refused_and_takes_nothing() {
        let budget = budget(1000);
        let mut a = Grant::on(budget);
        let mut b = Grant::on(budget);
        a.cover(600, WINDOW).unwrap();
        let e = b.cover(500, WINDOW).unwrap_err();
        assert_eq!(e.fatal().code, "53200");
        assert!(e.to_string().contains("is taken by"), "{e}");
        assert_eq!(budget.used(), 600);
        b.cover(400, WINDOW).unwrap();
        assert_eq!(budget.used(), 1000);
        a.release();
        b.cover(900, WINDOW).unwrap();
        assert_eq!(budget.used(), 900);
        let e = a.cover(2000, WINDOW).unwrap_err();
        assert!(e.to_string().contains("more than"), "{e}");
    }

    #[test]
    fn statements_are_counted_and_refused_past_the_limit() {
        let budget = budget(1000);
        let a = Grant::of(budget, 800).unwrap();
        assert!(Grant::of(budget, 300).is_err());
        let b = Grant::of(budget, 200).unwrap();
        assert_eq!(budget.used(), 1000);
        drop((a, b));
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn a_grant_follows_what_arrived() {
        assert_eq!(reach(64 << 20, 10, 8), 28);
        assert_eq!(reach(64 << 20, 1 << 20, 8), (2 << 20) + 8);
        assert_eq!(reach(3 << 20, 2 << 20, 8), 3 << 20);
    }

    #[test]
    fn no_limit_still_counts() {
        let budget = budget(0);
        let mut g = Grant::on(budget);
        g.cover(usize::MAX / 2, WINDOW).unwrap();
        assert_eq!(budget.used(), usize::MAX / 2);
    }
}
