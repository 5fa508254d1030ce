//! One open, logged-in connection to PostgreSQL and what sluice knows of it:
//! its key for cancels, its current tracked parameters, and its age.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use bytes::BytesMut;
use sluice_wire::BackendKeyData;

use crate::net::Stream;
use crate::params::ParamSet;

static NEXT_SERVER_ID: AtomicU64 = AtomicU64::new(1);

/// A server connection at a message boundary, ready for a query.
#[derive(Debug)]
pub struct ServerConn {
    pub id: u64,
    pub stream: Stream,
    /// Bytes read from the server and not yet forwarded.
    pub buf: BytesMut,
    pub key: BackendKeyData,
    /// Current values of the tracked parameters on this server.
    pub params: Arc<ParamSet>,
    pub created: Instant,
    pub last_used: Instant,
}

impl ServerConn {
    pub fn new(stream: Stream, key: BackendKeyData, params: ParamSet) -> Self {
        let now = Instant::now();
        Self {
            id: NEXT_SERVER_ID.fetch_add(1, Ordering::Relaxed),
            stream,
            buf: BytesMut::new(),
            key,
            params: Arc::new(params),
            created: now,
            last_used: now,
        }
    }

    /// True when the server closed the socket or sent something while idle
    /// (PostgreSQL sends FATAL before it terminates a backend). Costs an
    /// atomic load unless the socket was signalled readable, and then one
    /// non-blocking read.
    pub fn closed_while_idle(&self) -> bool {
        let mut probe = [0u8; 1];
        !matches!(self.stream.try_read(&mut probe), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
    }
}
