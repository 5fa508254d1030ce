//! Cancel requests. Each client gets a BackendKeyData of sluice's own; while
//! it is linked to a server, its slot holds that server's real key, so a
//! CancelRequest arriving on a new connection is forwarded to the server
//! that runs the client's query, and to no other.
//! Slots live in fixed chunks found by the client's process id (its low bits
//! are the slot index, its high bits random): 32 bytes per client, no map, and
//! linking a server for a transaction is one atomic store.

use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use bytes::BytesMut;
use sluice_wire::{BackendKeyData, CancelRequest};
use tokio::io::AsyncWriteExt;

use super::pool::Pool;
use super::target::ServerAddr;
use crate::auth::scram::fill_random;

const INDEX_BITS: u32 = 21;
const INDEX_MASK: i32 = (1 << INDEX_BITS) - 1;
const CHUNK: usize = 1024;
/// 2^21 clients at most (far above any max_client_conn).
const MAX_CHUNKS: usize = (1 << INDEX_BITS) / CHUNK;

#[derive(Default)]
struct Slot {
    /// The client's process id; 0 when the slot is free.
    pid: AtomicI32,
    secret: AtomicI32,
    /// The linked server's key (pid << 32 | secret); 0 when not linked.
    server: AtomicU64,
    pool: Mutex<Option<Arc<Pool>>>,
}

/// A client's key and where its slot is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CancelHandle {
    pub key: BackendKeyData,
    index: u32,
}

/// All clients' cancel slots.
pub struct CancelRegistry {
    chunks: Box<[OnceLock<Box<[Slot]>>]>,
    /// Free slot indices, and the first never used.
    free: Mutex<(Vec<u32>, u32)>,
}

impl Default for CancelRegistry {
    fn default() -> Self {
        Self {
            chunks: (0..MAX_CHUNKS).map(|_| OnceLock::new()).collect(),
            free: Mutex::new((Vec::new(), 0)),
        }
    }
}

fn pack(key: BackendKeyData) -> u64 {
    (u64::from(key.process_id as u32) << 32) | u64::from(key.secret_key as u32)
}

fn unpack(v: u64) -> BackendKeyData {
    BackendKeyData {
        process_id: (v >> 32) as u32 as i32,
        secret_key: v as u32 as i32,
    }
}

impl CancelRegistry {
    fn slot(&self, index: u32) -> Option<&Slot> {
        let chunk = self.chunks.get(index as usize / CHUNK)?.get()?;
        chunk.get(index as usize % CHUNK)
    }

    /// Gives a new client of `pool` a key and a slot; `None` when all 2^21
    /// slots are taken.
    pub fn register(&self, pool: &Arc<Pool>) -> Option<CancelHandle> {
        let index = {
            let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
            match free.0.pop() {
                Some(i) => i,
                None if (free.1 as usize) < MAX_CHUNKS * CHUNK => {
                    free.1 += 1;
                    free.1 - 1
                }
                None => return None,
            }
        };
        let chunk = self.chunks[index as usize / CHUNK]
            .get_or_init(|| (0..CHUNK).map(|_| Slot::default()).collect());
        let slot = &chunk[index as usize % CHUNK];
        let mut raw = [0u8; 6];
        fill_random(&mut raw);
        let high = (i32::from(u16::from_be_bytes([raw[0], raw[1]])) % 1023) + 1;
        let key = BackendKeyData {
            process_id: (high << INDEX_BITS) | index as i32,
            secret_key: i32::from_be_bytes([raw[2], raw[3], raw[4], raw[5]]),
        };
        *slot.pool.lock().unwrap_or_else(|p| p.into_inner()) = Some(pool.clone());
        slot.server.store(0, Ordering::Relaxed);
        slot.secret.store(key.secret_key, Ordering::Relaxed);
        slot.pid.store(key.process_id, Ordering::Release);
        Some(CancelHandle { key, index })
    }

    pub fn unregister(&self, handle: CancelHandle) {
        if let Some(slot) = self.slot(handle.index) {
            slot.pid.store(0, Ordering::Release);
            slot.server.store(0, Ordering::Relaxed);
            *slot.pool.lock().unwrap_or_else(|p| p.into_inner()) = None;
            self.free
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .0
                .push(handle.index);
        }
    }

    /// The client now runs on the server with `server_key`.
    pub fn link(&self, handle: CancelHandle, server_key: BackendKeyData) {
        if let Some(slot) = self.slot(handle.index) {
            slot.server.store(pack(server_key), Ordering::Release);
        }
    }

    pub fn unlink(&self, handle: CancelHandle) {
        if let Some(slot) = self.slot(handle.index) {
            slot.server.store(0, Ordering::Release);
        }
    }

    /// Forwards a client's cancel request. Unknown keys and clients that run
    /// nothing are ignored, as PostgreSQL does.
    pub async fn cancel(&self, req: CancelRequest) -> std::io::Result<bool> {
        let found = self
            .slot((req.process_id & INDEX_MASK) as u32)
            .filter(|s| {
                req.process_id != 0
                    && s.pid.load(Ordering::Acquire) == req.process_id
                    && s.secret.load(Ordering::Relaxed) == req.secret_key
            })
            .and_then(|s| {
                let server = s.server.load(Ordering::Acquire);
                let pool = s.pool.lock().unwrap_or_else(|p| p.into_inner()).clone();
                (server != 0)
                    .then_some(())
                    .and(pool)
                    .map(|p| (p, unpack(server)))
            });
        let Some((pool, key)) = found else {
            return Ok(false);
        };
        let target = pool.settings_and_target().1;
        let mut buf = BytesMut::with_capacity(16);
        CancelRequest {
            process_id: key.process_id,
            secret_key: key.secret_key,
        }
        .encode(&mut buf);
        let send = async {
            match &target.addr {
                ServerAddr::Tcp { host, port } => {
                    let mut s = tokio::net::TcpStream::connect((host.as_str(), *port)).await?;
                    s.write_all(&buf).await
                }
                ServerAddr::Unix(p) => {
                    let mut s = tokio::net::UnixStream::connect(p).await?;
                    s.write_all(&buf).await
                }
            }
        };
        tokio::time::timeout(target.connect_timeout, send)
            .await
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "cancel timed out"))??;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_pack_round_trip() {
        let k = BackendKeyData {
            process_id: -5,
            secret_key: i32::MIN,
        };
        assert_eq!(unpack(pack(k)), k);
    }
}
