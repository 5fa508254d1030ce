//! A fast, non-cryptographic hasher for the statement maps on the hot path
//! (a Bind looks a name up in the client's map and an id in the server's).
//! The keys are a client's own statement names and sluice's own ids, so a
//! client crafting collisions can only slow down its own map; SipHash's
//! protection is not needed there and cost a tenth of the relay's time.

use std::hash::{BuildHasherDefault, Hasher};

/// Multiply-rotate hashing, one word at a time.
#[derive(Default, Clone, Copy)]
pub struct WordHasher {
    hash: u64,
}

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl WordHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.hash = (self.hash.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for WordHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut word = [0u8; 8];
            word[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(word));
        }
    }

    #[inline]
    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }

    #[inline]
    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.hash
    }
}

/// `HashMap` build-hasher using [`WordHasher`].
pub type BuildWordHasher = BuildHasherDefault<WordHasher>;
