//! `[peers]`: several sluices behind one address (so_reuseport, a TCP load
//! balancer) forward each other the cancel requests that land on the wrong
//! process. A client's cancel key names the `peer_id` of the sluice that
//! gave it (see `cancel.rs`); a request for another peer is sent on to
//! that peer's address as it came, one forward spent. At most `pool_size`
//! requests are in flight to one peer (default `default_pool_size`), each
//! bounded by `cancel_wait_timeout`. SHOW PEERS and SHOW PEER_POOLS read
//! this.

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::BytesMut;
use sluice_config::{Config, PeerEntry};
use sluice_wire::CancelRequest;
use tokio::io::AsyncWriteExt;

/// What is going on with one peer.
#[derive(Debug)]
pub struct PeerState {
    /// Requests being sent to it.
    pub active: AtomicU32,
    /// Requests waiting for a slot (`pool_size` in flight).
    pub waiting: AtomicU32,
    slots: tokio::sync::Semaphore,
    size: u32,
}

/// The peers' states, by peer id.
#[derive(Debug, Default)]
pub struct Peers {
    states: Mutex<HashMap<u32, Arc<PeerState>>>,
}

/// Longest a forward may take when `cancel_wait_timeout` is 0.
const FALLBACK_TIMEOUT: Duration = Duration::from_secs(15);

impl Peers {
    /// The state of `peer` as configured now (a RELOAD that changes its
    /// pool_size starts a new one).
    pub fn state(&self, entry: &PeerEntry, default_size: u32) -> Arc<PeerState> {
        let size = entry.pool_size.unwrap_or(default_size).max(1);
        let mut states = self.states.lock().unwrap_or_else(|p| p.into_inner());
        let state = states.entry(entry.id).or_insert_with(|| new_state(size));
        if state.size != size {
            *state = new_state(size);
        }
        state.clone()
    }

    /// The state of peer `id` if it was used (SHOW PEER_POOLS).
    pub fn known(&self, id: u32) -> Option<Arc<PeerState>> {
        let states = self.states.lock().unwrap_or_else(|p| p.into_inner());
        states.get(&id).cloned()
    }

    /// Sends `req` on to peer `id`.
    pub async fn forward(&self, config: &Config, id: u32, req: CancelRequest) -> io::Result<()> {
        let Some(entry) = config.peers.iter().find(|p| p.id == id) else {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("no [peers] entry for peer_id {id}"),
            ));
        };
        let s = &config.settings;
        let state = self.state(entry, s.default_pool_size);
        let timeout = Some(s.cancel_wait_timeout)
            .filter(|t| !t.is_zero())
            .unwrap_or(FALLBACK_TIMEOUT);
        let dns = super::dns::DnsTtl::from_settings(s);
        let send = async {
            let permit = {
                let _waiting = Counted::new(&state.waiting);
                state.slots.acquire().await
            };
            let _permit = permit.map_err(|_| io::Error::other("peer slots closed"))?;
            let _active = Counted::new(&state.active);
            send_to(entry, dns, req).await
        };
        tokio::time::timeout(timeout, send).await.map_err(|_| {
            io::Error::new(
                io::ErrorKind::TimedOut,
                format!("forwarding a cancel request to peer {id} timed out"),
            )
        })?
    }
}

/// Whether a failed forward may be logged now: at most one line a second
/// (anyone can send cancel requests, so anyone could flood the log).
pub fn may_warn() -> bool {
    static LAST: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    LAST.swap(now, Ordering::Relaxed) != now
}

/// One in a counter while it lives (dropped with a timed-out future too).
struct Counted<'a>(&'a AtomicU32);

impl<'a> Counted<'a> {
    fn new(counter: &'a AtomicU32) -> Self {
        counter.fetch_add(1, Ordering::Relaxed);
        Self(counter)
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

fn new_state(size: u32) -> Arc<PeerState> {
    Arc::new(PeerState {
        active: AtomicU32::new(0),
        waiting: AtomicU32::new(0),
        slots: tokio::sync::Semaphore::new(size as usize),
        size,
    })
}

/// Connects to the peer (TCP, a Unix socket directory, or an abstract
/// Unix socket) and writes the CancelRequest.
async fn send_to(entry: &PeerEntry, dns: super::dns::DnsTtl, req: CancelRequest) -> io::Result<()> {
    let mut buf = BytesMut::with_capacity(16);
    req.encode(&mut buf);
    if let Some(name) = entry.host.strip_prefix('@') {
        // Abstract namespace: a non-blocking connect (a peer whose backlog
        // is full answers EAGAIN at once instead of blocking a worker).
        let mut path = vec![0u8];
        path.extend_from_slice(format!("{name}/.s.PGSQL.{}", entry.port).as_bytes());
        let addr = socket2::SockAddr::unix(
            <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(&path),
        )?;
        let socket = socket2::Socket::new(socket2::Domain::UNIX, socket2::Type::STREAM, None)?;
        socket.set_nonblocking(true)?;
        socket.connect(&addr)?;
        let std_stream: std::os::unix::net::UnixStream = socket.into();
        let mut s = tokio::net::UnixStream::from_std(std_stream)?;
        s.write_all(&buf).await
    } else if entry.host.starts_with('/') {
        let path = std::path::Path::new(&entry.host).join(format!(".s.PGSQL.{}", entry.port));
        let mut s = tokio::net::UnixStream::connect(path).await?;
        s.write_all(&buf).await
    } else {
        let mut s = super::dns::connect(&entry.host, entry.port, dns).await?;
        s.write_all(&buf).await
    }
}
