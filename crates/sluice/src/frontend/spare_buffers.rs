//! Read buffers kept for the next request, per worker thread. An idle
//! client holds no buffer (idle memory is what 100,000 clients cost), so
//! each request took a fresh 8 KiB buffer from the allocator and gave it
//! back after: with jemalloc that is its slow path (a slab of that size
//! class filled and flushed), about 1,500 instructions a transaction, a
//! tenth of the proxy's user-space work (callgrind, pgbench -S). A short,
//! bounded stack per thread hands the same few buffers round instead.

use std::cell::RefCell;

use bytes::BytesMut;

use super::relay_io::READ_CHUNK;

/// Buffers kept per thread: enough for the clients one worker has mid-
/// request at once on a busy pool; 1 MiB a thread at most (256 KiB when,
/// as usual, they are one chunk each).
const KEPT: usize = 32;

/// A buffer kept is at most this large: one grown for a big message goes
/// back to the allocator.
const KEPT_CAPACITY: usize = 4 * READ_CHUNK;

thread_local! {
    static SPARE: RefCell<Vec<BytesMut>> = const { RefCell::new(Vec::new()) };
}

/// An empty buffer with room for at least one read chunk.
pub fn take() -> BytesMut {
    let mut buf = SPARE
        .try_with(|s| s.borrow_mut().pop())
        .ok()
        .flatten()
        .unwrap_or_default();
    // A kept buffer may have been advanced: this takes its room back
    // without allocating (it is empty and not shared).
    buf.reserve(READ_CHUNK);
    buf
}

/// Gives back a buffer whose bytes are all used (a buffer with bytes in
/// it, or grown past `KEPT_CAPACITY`, is dropped instead).
pub fn give_back(mut buf: BytesMut) {
    // `capacity()` counts only the room after the bytes already read, so
    // the whole allocation is judged by reclaiming it (which also moves
    // an empty buffer's start back to the beginning): one larger than
    // `KEPT_CAPACITY`, or smaller than a chunk, is not kept.
    if !buf.is_empty() || buf.try_reclaim(KEPT_CAPACITY + 1) || !buf.try_reclaim(READ_CHUNK) {
        return;
    }
    let _ = SPARE.try_with(|s| {
        let mut s = s.borrow_mut();
        if s.len() < KEPT {
            s.push(buf);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_goes_round() {
        let mut b = take();
        assert!(b.capacity() >= READ_CHUNK);
        let at = b.as_ptr() as usize;
        b.extend_from_slice(b"hello");
        let _ = b.split_to(5);
        give_back(b);
        let again = take();
        assert!(again.is_empty());
        assert!(again.capacity() >= READ_CHUNK);
        assert_eq!(again.as_ptr() as usize, at, "the same allocation came back");
    }

    #[test]
    fn full_or_huge_buffers_are_not_kept() {
        let mut full = take();
        full.extend_from_slice(b"x");
        give_back(full);
        let mut huge = BytesMut::with_capacity(KEPT_CAPACITY * 2);
        huge.clear();
        give_back(huge);
        // A huge buffer read almost to its end has little room left
        // after its bytes, and is still huge.
        let mut read = BytesMut::with_capacity(1 << 20);
        read.resize((1 << 20) - 1024, b'x');
        bytes::Buf::advance(&mut read, (1 << 20) - 1024);
        assert!(read.capacity() < KEPT_CAPACITY);
        give_back(read);
        SPARE.with(|s| {
            assert!(
                s.borrow()
                    .iter()
                    .all(|b| b.is_empty() && b.capacity() <= KEPT_CAPACITY)
            );
        });
        // The stack stays bounded however much is given back.
        for _ in 0..KEPT * 3 {
            give_back(BytesMut::with_capacity(READ_CHUNK));
        }
        SPARE.with(|s| assert!(s.borrow().len() <= KEPT));
    }
}
