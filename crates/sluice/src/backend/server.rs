//! One open, logged-in connection to PostgreSQL and what sluice knows of it:
//! its key for cancels, its current tracked parameters, and its age.

use crate::clock::Mono;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::BytesMut;
use sluice_wire::BackendKeyData;

use crate::net::Stream;
use crate::params::ParamSet;
use crate::prepared::server_cache::ServerStatements;

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
    pub created: Mono,
    /// When it last went back to its pool (or was made).
    pub last_used: Mono,
    /// When it was last lent (the clock read of that acquire).
    pub lent_at: Mono,
    /// The worker whose event loop this server's socket is registered with.
    pub home_worker: usize,
    /// Wall-clock connect time and local address (SHOW SERVERS).
    pub created_wall: std::time::SystemTime,
    pub local_addr: Option<std::net::SocketAddr>,
    /// Session settings applied on this server for its last client.
    pub session: Option<Arc<crate::session_vars::SessionVars>>,
    /// Shared statements prepared on this server (transaction mode).
    pub statements: Box<ServerStatements>,
    /// The server said at login it is a standby (`in_hot_standby`, sent by
    /// PostgreSQL 14 and later).
    pub standby: bool,
    /// The TLS session as SHOW SERVERS prints it, made once (None: plain).
    pub tls: Option<Arc<str>>,
    /// Which host of its target's list it is on (0: the first, or the only
    /// one): a cancel request for it goes there.
    pub alternate: u8,
    /// The database's encoding is SQL_ASCII: it converts nothing, so text
    /// is sent and read back as the client's bytes (`params::utf8`).
    pub sql_ascii: bool,
}

impl ServerConn {
    pub fn new(stream: Stream, key: BackendKeyData, params: ParamSet) -> Self {
        let now = Mono::now();
        let local_addr = stream.local_addr();
        let tls = stream.tls_description().map(Arc::from);
        Self {
            tls,
            created_wall: std::time::SystemTime::now(),
            local_addr,
            id: NEXT_SERVER_ID.fetch_add(1, Ordering::Relaxed),
            stream,
            buf: BytesMut::new(),
            key,
            params: Arc::new(params),
            created: now,
            last_used: now,
            lent_at: now,
            home_worker: super::worker_id::current_worker(),
            alternate: 0,
            sql_ascii: false,
            statements: Box::default(),
            session: None,
            standby: false,
        }
    }

    /// Makes the calling worker this server's home: a server used by a
    /// client on another worker would wake two threads per message.
    pub fn move_to_current_worker(self: Box<Self>) -> std::io::Result<Box<Self>> {
        let here = super::worker_id::current_worker();
        if self.home_worker == here {
            return Ok(self);
        }
        let Self {
            id,
            stream,
            buf,
            key,
            params,
            created,
            last_used,
            lent_at,
            created_wall,
            local_addr,
            statements,
            session,
            standby,
            tls,
            alternate,
            sql_ascii,
            ..
        } = *self;
        Ok(Box::new(Self {
            created_wall,
            local_addr,
            id,
            stream: stream.reregister().inspect_err(|e| {
                tracing::warn!("server {id} cannot move to this worker: {e}");
            })?,
            buf,
            key,
            params,
            created,
            last_used,
            lent_at,
            home_worker: here,
            statements,
            session,
            standby,
            tls,
            alternate,
            sql_ascii,
        }))
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
