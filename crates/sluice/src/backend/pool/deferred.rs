//! Why this exists: a client whose lone `BEGIN … READ ONLY` sluice answered
//! without a server (`Client::defer_begin`) is inside a transaction block
//! that holds no server yet. PAUSE and a safe shutdown wait for blocks to
//! end; they count servers in use, so such a block is counted on its pool
//! as well, by a guard that cannot be forgotten: it counts while it lives.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::Pool;

/// The client's BEGIN, as it sent it, counted on its pool until dropped
/// (the block opened on a server, the client told why not, or gone).
pub struct DeferredBlock {
    pool: Arc<Pool>,
    /// The client's Query message.
    pub message: bytes::Bytes,
    /// When sluice answered it (`idle_transaction_timeout` counts from
    /// there).
    pub since: std::time::Instant,
}

impl DeferredBlock {
    pub fn new(pool: &Arc<Pool>, message: bytes::Bytes) -> Self {
        pool.deferred.fetch_add(1, Ordering::SeqCst);
        Self {
            pool: pool.clone(),
            message,
            since: std::time::Instant::now(),
        }
    }
}

impl Drop for DeferredBlock {
    fn drop(&mut self) {
        self.pool.deferred.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Pool {
    /// Clients of this pool in a block that holds no server yet.
    pub fn deferred_blocks(&self) -> u32 {
        self.deferred.load(Ordering::SeqCst)
    }

    /// No server in use and no block waiting for one: what PAUSE and a
    /// safe shutdown wait for.
    pub fn no_transactions(&self) -> bool {
        self.counts().active == 0 && self.deferred_blocks() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::pool::tests::test_pool;

    #[test]
    fn a_block_counts_while_it_lives() {
        let addr = crate::backend::target::ServerAddr::Tcp {
            host: "127.0.0.1".into(),
            port: 1,
        };
        let pool = Arc::new(test_pool(addr, 1, std::time::Duration::from_secs(1)));
        let a = DeferredBlock::new(&pool, bytes::Bytes::from_static(b"Q"));
        let b = DeferredBlock::new(&pool, bytes::Bytes::from_static(b"Q"));
        assert_eq!(pool.deferred_blocks(), 2);
        drop(a);
        assert_eq!(pool.deferred_blocks(), 1);
        drop(b);
        assert_eq!(pool.deferred_blocks(), 0);
    }
}
