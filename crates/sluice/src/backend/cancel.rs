//! Cancel requests. Each client gets a BackendKeyData of sluice's own; while
//! it is linked to a server, its entry points at that server's address and
//! real key, so a CancelRequest arriving on a new connection is forwarded to
//! the server that runs the client's query, and to no other.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::BytesMut;
use sluice_wire::{BackendKeyData, CancelRequest};
use tokio::io::AsyncWriteExt;

use super::target::{ServerAddr, ServerTarget};
use crate::auth::scram::fill_random;

/// The server a client is linked to right now, if any.
#[derive(Debug, Default)]
pub struct CancelTarget {
    linked: Mutex<Option<(Arc<ServerTarget>, BackendKeyData)>>,
}

impl CancelTarget {
    pub fn link(&self, target: &Arc<ServerTarget>, key: BackendKeyData) {
        if let Ok(mut g) = self.linked.lock() {
            *g = Some((target.clone(), key));
        }
    }

    pub fn unlink(&self) {
        if let Ok(mut g) = self.linked.lock() {
            *g = None;
        }
    }

    fn current(&self) -> Option<(Arc<ServerTarget>, BackendKeyData)> {
        self.linked.lock().ok().and_then(|g| g.clone())
    }
}

/// All clients' keys.
#[derive(Debug, Default)]
pub struct CancelRegistry {
    clients: Mutex<HashMap<i32, (i32, Arc<CancelTarget>)>>,
}

impl CancelRegistry {
    /// Gives a new client a unique key and its cancel entry.
    pub fn register(&self) -> (BackendKeyData, Arc<CancelTarget>) {
        let target = Arc::new(CancelTarget::default());
        let mut map = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            let mut raw = [0u8; 8];
            fill_random(&mut raw);
            let pid = i32::from_be_bytes([raw[0], raw[1], raw[2], raw[3]]) & 0x7fff_ffff;
            let secret = i32::from_be_bytes([raw[4], raw[5], raw[6], raw[7]]);
            if pid == 0 || map.contains_key(&pid) {
                continue;
            }
            map.insert(pid, (secret, target.clone()));
            return (
                BackendKeyData {
                    process_id: pid,
                    secret_key: secret,
                },
                target,
            );
        }
    }

    pub fn unregister(&self, key: &BackendKeyData) {
        let mut map = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        map.remove(&key.process_id);
    }

    /// Forwards a client's cancel request. Unknown keys and clients that run
    /// nothing are ignored, as PostgreSQL does.
    pub async fn cancel(&self, req: CancelRequest) -> std::io::Result<bool> {
        let found = {
            let map = self.clients.lock().unwrap_or_else(|p| p.into_inner());
            map.get(&req.process_id)
                .filter(|(secret, _)| *secret == req.secret_key)
                .and_then(|(_, t)| t.current())
        };
        let Some((target, key)) = found else {
            return Ok(false);
        };
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
