//! Cancel requests. Each client gets a BackendKeyData of sluice's own; while
//! it is linked to a server, its slot holds that server's real key, so a
//! CancelRequest arriving on a new connection is forwarded to the server
//! that runs the client's query, and to no other.
//! Slots live in fixed chunks, found by index from the client's own handle:
//! linking a server for a transaction is one atomic store. A key is random
//! throughout (31 bits of process id, 32 of secret), so that guessing one
//! that cancels another client's query takes about 2^63 / clients tries;
//! a map from process id to slot, touched at login, logout and cancel
//! only, finds the slot of a cancel request.
//! With `peer_id` set (several sluices behind one address, `[peers]`), the
//! process id carries the peer id (14 bits) above 17 random bits, and the
//! secret's two low bits count how many more times the request may be
//! forwarded between peers (PgBouncer's scheme: 3, compared as all ones):
//! 47 random bits.

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use sluice_wire::{BackendKeyData, CancelRequest};

use super::pool::Pool;
use crate::auth::scram::fill_random;

/// How long a killed client's task has to say goodbye (where its stream
/// is at a message boundary) before its socket is shut down for good.
pub const KILL_GRACE: std::time::Duration = std::time::Duration::from_millis(500);

const INDEX_BITS: u32 = 21;
/// Draws of a process id that another client holds before a login is
/// refused (only near 2^17 clients of one peer can it come to that).
const PID_DRAWS: usize = 64;
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
    /// The linked server's pool host (see `Pool::host`): 0, the client's
    /// own pool; `i + 1`, host `i` of its database.
    host: std::sync::atomic::AtomicU32,
    /// Cancel requests for this client being forwarded now: its server
    /// must not go to another client until they are done (PostgreSQL may
    /// not have signalled the backend yet), as PgBouncer's
    /// `sv_being_canceled`.
    canceling: AtomicU32,
    /// A cancel request for this client failed after it may have reached
    /// PostgreSQL (timed out): whether its server was signalled, and
    /// when, is not known.
    cancel_unsure: AtomicBool,
    /// A cancel request for the client's query was forwarded since
    /// `forget_cancel` (a read that may run again elsewhere is not, then).
    cancel_asked: AtomicBool,
    /// Waiting in line for a server.
    waiting: AtomicBool,
    /// A cancel request came while the client waited for a server: its
    /// request is answered 57014 and never runs (`take_wait_cancel`).
    wait_cancelled: AtomicBool,
    /// Wakes the client's own wait then (each its own: a cancel wakes no
    /// other waiting client).
    wait_cancel: tokio::sync::Notify,
    /// Why an operator disconnects the client (`Kill`), 0 when not.
    killed: AtomicU8,
    /// When its last request arrived, as `Mono::nanos` (0: none yet).
    request_at: AtomicU64,
    /// When its present wait for a server (or out a pause) began, as
    /// `Mono::nanos` (0: not known, the wait has just begun).
    wait_since: AtomicU64,
    /// Who the client is (SHOW CLIENTS, KILL). Taken by unregister before
    /// the client's socket closes, so a holder of this lock may act on fd.
    meta: Mutex<Option<ClientMeta>>,
}

/// What SHOW CLIENTS tells about a client.
#[derive(Clone)]
pub struct ClientMeta {
    pub pool: Arc<Pool>,
    pub user: Box<str>,
    pub peer: Option<std::net::SocketAddr>,
    pub local: Option<std::net::SocketAddr>,
    pub connected: std::time::SystemTime,
    pub application_name: Box<str>,
    /// The client's socket, for KILL.
    pub fd: i32,
    /// Session objects that keep the client on its server (transaction
    /// mode), as "temp_tables,cursors"; None when not pinned.
    pub pinned: Option<Box<str>>,
    /// The TLS session, as SHOW CLIENTS prints it (None: plain).
    pub tls: Option<Box<str>>,
}

/// One row of SHOW CLIENTS.
#[derive(Clone)]
pub struct ClientRow {
    pub pid: i32,
    pub meta: ClientMeta,
    pub waiting: bool,
    /// When its last request arrived (None: none yet).
    pub request_at: Option<crate::clock::Mono>,
    /// When its present wait began, while it waits and once known.
    pub wait_since: Option<crate::clock::Mono>,
    /// The linked server's backend pid.
    pub server_pid: Option<i32>,
}

/// Why an operator disconnects clients: PgBouncer's reasons, sent as
/// FATAL 08P01 and logged as "closing because: …".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kill {
    /// KILL [db].
    DatabaseRemoved = 1,
    /// KILL_CLIENT.
    AdminForced = 2,
}

impl Kill {
    fn from_u8(v: u8) -> Option<Self> {
        match v {
            1 => Some(Self::DatabaseRemoved),
            2 => Some(Self::AdminForced),
            _ => None,
        }
    }

    pub fn message(self) -> &'static str {
        match self {
            Self::DatabaseRemoved => "database removed",
            Self::AdminForced => "admin forced disconnect",
        }
    }
}

/// A client `kill` picked.
#[derive(Debug, Clone, Copy)]
pub struct Killed {
    key: BackendKeyData,
}

/// A client's key and where its slot is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CancelHandle {
    pub key: BackendKeyData,
    index: u32,
}

/// A client's slot while its login is not over: given up when dropped
/// before `keep` (a login that fails, or whose future client_login_timeout
/// drops mid-write: its slot, its process id and its socket number stayed
/// registered, and KILL could later shut a newcomer's socket).
pub struct Registration<'a> {
    cancels: &'a CancelRegistry,
    handle: Option<CancelHandle>,
}

impl Registration<'_> {
    pub fn key(&self) -> Option<BackendKeyData> {
        self.handle.map(|h| h.key)
    }

    /// The login is over: the slot is the client's until `unregister`.
    pub fn keep(mut self) -> Option<CancelHandle> {
        self.handle.take()
    }
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        if let Some(handle) = self.handle.take() {
            self.cancels.unregister(handle);
        }
    }
}

/// All clients' cancel slots.
pub struct CancelRegistry {
    chunks: Box<[OnceLock<Box<[Slot]>>]>,
    /// Free slot indices, the first never used, and which slot each
    /// client's process id names.
    free: Mutex<Free>,
    /// `peer_id` (0: no peering), fixed at startup.
    peer_id: u32,
    /// Told when a forwarded cancel request is done (any client's).
    cancel_done: tokio::sync::Notify,
}

/// The slots in use and free, under one lock.
#[derive(Default)]
struct Free {
    slots: Vec<u32>,
    /// Slots below this have been used.
    used: u32,
    by_pid: std::collections::HashMap<i32, u32>,
}

impl Default for CancelRegistry {
    fn default() -> Self {
        Self::new(0)
    }
}

/// Random process id bits when peering (the peer id takes the 14 above).
const PEER_RANDOM_BITS: u32 = 17;
/// The secret's forwarding budget bits.
const TTL_MASK: i32 = 0b11;

impl CancelRegistry {
    pub fn new(peer_id: u32) -> Self {
        Self {
            chunks: (0..MAX_CHUNKS).map(|_| OnceLock::new()).collect(),
            free: Mutex::new(Free::default()),
            peer_id: peer_id.min(sluice_config::MAX_PEER_ID),
            cancel_done: tokio::sync::Notify::new(),
        }
    }

    /// `peer_id` as of startup (0: no peering).
    pub fn peer_id(&self) -> u32 {
        self.peer_id
    }

    /// A random process id of this sluice's shape (never 0): 31 random
    /// bits; with peering, the peer id above 17.
    fn random_pid(&self, raw: [u8; 4]) -> i32 {
        let random = i32::from_be_bytes(raw) & i32::MAX;
        if self.peer_id == 0 {
            random
        } else {
            ((self.peer_id as i32) << PEER_RANDOM_BITS) | (random & ((1 << PEER_RANDOM_BITS) - 1))
        }
    }

    /// The peer a cancel request's key belongs to, when it is another
    /// sluice of the group's (peering on), with the request as it is to be
    /// forwarded (one forward spent); `Err(peer)` when its budget is spent.
    /// A cancel key for an admin's console session, shaped like a
    /// client's: with `peer_id`, it names this peer and carries a full
    /// forwarding budget, so that a peer that gets its cancel forwards it
    /// here. Never 0/0 (no key, to clients).
    pub fn console_key_shape(&self) -> (i32, i32) {
        loop {
            let mut raw = [0u8; 8];
            fill_random(&mut raw);
            let pid = self.random_pid([raw[0], raw[1], raw[2], raw[3]]);
            let secret = i32::from_be_bytes([raw[4], raw[5], raw[6], raw[7]]);
            if pid != 0 {
                return (pid, self.secret_as_issued(secret));
            }
        }
    }

    /// A cancel request's secret as its key was handed out, whatever
    /// forwarding budget a copy from a peer has spent.
    pub fn secret_as_issued(&self, secret_key: i32) -> i32 {
        if self.peer_id == 0 {
            secret_key
        } else {
            secret_key | TTL_MASK
        }
    }

    pub fn for_peer(&self, req: &CancelRequest) -> Option<Result<(u32, CancelRequest), u32>> {
        if self.peer_id == 0 {
            return None;
        }
        let peer = ((req.process_id as u32) >> PEER_RANDOM_BITS) & sluice_config::MAX_PEER_ID;
        if peer == self.peer_id {
            return None;
        }
        let ttl = req.secret_key & TTL_MASK;
        if ttl == 0 {
            return Some(Err(peer));
        }
        Some(Ok((
            peer,
            CancelRequest {
                process_id: req.process_id,
                secret_key: (req.secret_key & !TTL_MASK) | (ttl - 1),
            },
        )))
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
    /// slots are taken (or, with peering, the 2^17 process ids nearly).
    pub fn register(&self, meta: ClientMeta) -> Option<CancelHandle> {
        let mut raw = [0u8; 4 * PID_DRAWS + 4];
        fill_random(&mut raw);
        let (draws, secret) = raw.split_at(4 * PID_DRAWS);
        let secret = i32::from_be_bytes(secret.try_into().ok()?);
        let (index, process_id) = {
            let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
            let pid = draws
                .chunks_exact(4)
                .filter_map(|d| d.try_into().ok())
                .map(|d| self.random_pid(d))
                .find(|&pid| pid != 0 && !free.by_pid.contains_key(&pid))?;
            let index = match free.slots.pop() {
                Some(i) => i,
                None if (free.used as usize) < (1usize << INDEX_BITS) => {
                    free.used += 1;
                    free.used - 1
                }
                None => return None,
            };
            free.by_pid.insert(pid, index);
            (index, pid)
        };
        let chunk = self.chunks[index as usize / CHUNK]
            .get_or_init(|| (0..CHUNK).map(|_| Slot::default()).collect());
        let slot = &chunk[index as usize % CHUNK];
        let key = BackendKeyData {
            process_id,
            secret_key: self.secret_as_issued(secret),
        };
        *slot.meta.lock().unwrap_or_else(|p| p.into_inner()) = Some(meta);
        slot.server.store(0, Ordering::Relaxed);
        slot.waiting.store(false, Ordering::Relaxed);
        slot.wait_cancelled.store(false, Ordering::Relaxed);
        slot.killed.store(0, Ordering::Relaxed);
        slot.request_at.store(0, Ordering::Relaxed);
        slot.wait_since.store(0, Ordering::Relaxed);
        slot.secret.store(key.secret_key, Ordering::Relaxed);
        slot.pid.store(key.process_id, Ordering::Release);
        Some(CancelHandle { key, index })
    }

    /// `register`, given up unless kept (see `Registration`).
    pub fn register_for_login(&self, meta: ClientMeta) -> Option<Registration<'_>> {
        Some(Registration {
            cancels: self,
            handle: Some(self.register(meta)?),
        })
    }

    /// Records why the client keeps its server (None: it no longer does).
    pub fn set_pinned(&self, handle: CancelHandle, reason: Option<Box<str>>) {
        if let Some(slot) = self.slot(handle.index)
            && let Some(meta) = slot.meta.lock().unwrap_or_else(|p| p.into_inner()).as_mut()
        {
            meta.pinned = reason;
        }
    }

    /// Runs `f`, an operation on the client's socket that closes it when
    /// it fails (taking it off or putting it back on an event loop), with
    /// KILL held off: KILL takes the same lock before it shuts `fd` down,
    /// and a failure forgets `fd` under it, so KILL never reaches a
    /// descriptor number that another connection got in the meantime.
    pub fn moving_socket<T, E>(
        &self,
        handle: CancelHandle,
        f: impl FnOnce() -> Result<T, E>,
    ) -> Result<T, E> {
        let Some(slot) = self.slot(handle.index) else {
            return f();
        };
        let mut meta = slot.meta.lock().unwrap_or_else(|p| p.into_inner());
        let result = f();
        if result.is_err()
            && let Some(m) = meta.as_mut()
        {
            m.fd = -1;
        }
        result
    }

    pub fn unregister(&self, handle: CancelHandle) {
        if let Some(slot) = self.slot(handle.index) {
            let mut meta = slot.meta.lock().unwrap_or_else(|p| p.into_inner());
            slot.pid.store(0, Ordering::Release);
            slot.server.store(0, Ordering::Relaxed);
            *meta = None;
            drop(meta);
            let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
            free.by_pid.remove(&handle.key.process_id);
            free.slots.push(handle.index);
        }
    }

    /// The client now runs on the server with `server_key`, for a request
    /// that arrived at `request_at`.
    pub fn link(
        &self,
        handle: CancelHandle,
        server_key: BackendKeyData,
        host: u32,
        request_at: crate::clock::Mono,
    ) {
        if let Some(slot) = self.slot(handle.index) {
            slot.host.store(host, Ordering::Relaxed);
            slot.request_at.store(request_at.nanos(), Ordering::Relaxed);
            slot.server.store(pack(server_key), Ordering::Release);
        }
    }

    /// Forgets cancel requests forwarded so far (before a request that may
    /// run again elsewhere is linked).
    pub fn forget_cancel(&self, handle: CancelHandle) {
        if let Some(slot) = self.slot(handle.index) {
            slot.cancel_asked.store(false, Ordering::Relaxed);
        }
    }

    /// Whether a cancel request was forwarded since `forget_cancel`.
    pub fn cancel_asked(&self, handle: CancelHandle) -> bool {
        self.slot(handle.index)
            .is_some_and(|s| s.cancel_asked.load(Ordering::Relaxed))
    }

    /// The client no longer runs on its server. Returns whether a cancel
    /// request for it is being forwarded: the server may still receive
    /// it, and must wait for it (`cancels_done`) before another client
    /// gets it. (Sequentially consistent with `cancel`'s count-then-read:
    /// either the request sees no server, or this sees the request.)
    pub fn unlink(&self, handle: CancelHandle) -> bool {
        let Some(slot) = self.slot(handle.index) else {
            return false;
        };
        slot.server.store(0, Ordering::SeqCst);
        slot.canceling.load(Ordering::SeqCst) != 0
    }

    /// The client runs on the server with `server_key` again (after
    /// `unlink`, while sluice ran its own queries on it).
    pub fn relink(&self, handle: CancelHandle, server_key: BackendKeyData) {
        if let Some(slot) = self.slot(handle.index) {
            slot.server.store(pack(server_key), Ordering::Release);
        }
    }

    /// Waits until no cancel request for the client is being forwarded,
    /// at most `limit`. True when its server may go to another client;
    /// false if a request still is forwarded, or one failed in a way that
    /// leaves the server's state unknown (close it).
    pub async fn cancels_done(&self, handle: CancelHandle, limit: std::time::Duration) -> bool {
        let Some(slot) = self.slot(handle.index) else {
            return true;
        };
        let wait = async {
            loop {
                let done = self.cancel_done.notified();
                tokio::pin!(done);
                done.as_mut().enable();
                if slot.canceling.load(Ordering::SeqCst) == 0 {
                    return;
                }
                done.await;
            }
        };
        tokio::time::timeout(limit, wait).await.is_ok()
            && !slot.cancel_unsure.swap(false, Ordering::Relaxed)
    }

    /// The client waits for a server (or no longer does).
    pub fn set_waiting(&self, handle: CancelHandle, waiting: bool) {
        if let Some(slot) = self.slot(handle.index) {
            slot.waiting.store(waiting, Ordering::SeqCst);
            if !waiting {
                slot.wait_since.store(0, Ordering::Relaxed);
            }
        }
    }

    /// The client no longer waits; returns why it was killed meanwhile, if
    /// it was (one look at its slot for both).
    pub fn end_wait(&self, handle: CancelHandle) -> Option<Kill> {
        let slot = self.slot(handle.index)?;
        slot.waiting.store(false, Ordering::SeqCst);
        slot.wait_since.store(0, Ordering::Relaxed);
        Kill::from_u8(slot.killed.load(Ordering::Acquire))
    }

    /// Whether a cancel request came while the client waited for a
    /// server (its request is then not run); the mark is taken.
    pub fn take_wait_cancel(&self, handle: CancelHandle) -> bool {
        self.slot(handle.index).is_some_and(|s| {
            s.wait_cancelled.load(Ordering::SeqCst)
                && s.wait_cancelled.swap(false, Ordering::SeqCst)
        })
    }

    /// Ready once a cancel request comes for the client while it waits for
    /// a server (see `take_wait_cancel`).
    pub async fn wait_cancelled(&self, handle: CancelHandle) {
        let Some(slot) = self.slot(handle.index) else {
            return std::future::pending().await;
        };
        loop {
            let told = slot.wait_cancel.notified();
            tokio::pin!(told);
            told.as_mut().enable();
            if slot.wait_cancelled.load(Ordering::Acquire) {
                return;
            }
            told.await;
        }
    }

    /// The client's wait began at `since` (told once it did not end at
    /// once: a server at hand costs no clock read).
    pub fn set_wait_since(&self, handle: CancelHandle, since: crate::clock::Mono) {
        if let Some(slot) = self.slot(handle.index) {
            slot.wait_since.store(since.nanos(), Ordering::Relaxed);
            slot.request_at.store(since.nanos(), Ordering::Relaxed);
        }
    }

    /// Every logged-in client (SHOW CLIENTS).
    pub fn clients(&self) -> Vec<ClientRow> {
        let used = self.free.lock().unwrap_or_else(|p| p.into_inner()).used;
        let mut out = Vec::new();
        for index in 0..used {
            let Some(slot) = self.slot(index) else {
                continue;
            };
            let meta = slot.meta.lock().unwrap_or_else(|p| p.into_inner());
            let pid = slot.pid.load(Ordering::Acquire);
            if let (Some(meta), true) = (meta.as_ref(), pid != 0) {
                let server = slot.server.load(Ordering::Acquire);
                let waiting = slot.waiting.load(Ordering::Relaxed);
                let nanos =
                    |a: &AtomicU64| crate::clock::Mono::from_nanos(a.load(Ordering::Relaxed));
                out.push(ClientRow {
                    pid,
                    meta: meta.clone(),
                    waiting,
                    request_at: nanos(&slot.request_at),
                    wait_since: nanos(&slot.wait_since).filter(|_| waiting),
                    server_pid: (server != 0).then(|| unpack(server).process_id),
                });
            }
        }
        out
    }

    /// Disconnects the clients `select` picks, for `why`. Their sockets
    /// are shut for reading: each client's task reads the end and says
    /// goodbye with PgBouncer's FATAL (`killed`) when its stream is at a
    /// message boundary, as a client that left otherwise. Returns who was
    /// picked, for [`CancelRegistry::cut`]: a client that never lets its
    /// task read to the end (it keeps pipelining) is cut off by that.
    pub fn kill(&self, why: Kill, select: impl Fn(i32, &ClientMeta) -> bool) -> Vec<Killed> {
        self.shut(|pid, meta, slot| {
            if !select(pid, meta) {
                return false;
            }
            slot.killed.store(why as u8, Ordering::Release);
            // SAFETY: the fd is the client's open socket: unregister
            // (which runs before the socket is closed) needs the lock
            // `shut` holds.
            unsafe { libc::shutdown(meta.fd, libc::SHUT_RD) };
            true
        })
    }

    /// `kill`, then, `KILL_GRACE` later, `cut` of the clients it picked
    /// that are still connected. Returns how many it picked.
    pub fn kill_and_cut(
        self: &Arc<Self>,
        why: Kill,
        select: impl Fn(i32, &ClientMeta) -> bool,
    ) -> usize {
        let killed = self.kill(why, select);
        let count = killed.len();
        if !killed.is_empty() {
            let cancels = Arc::clone(self);
            tokio::spawn(async move {
                tokio::time::sleep(KILL_GRACE).await;
                let cut = cancels.cut(&killed);
                if cut > 0 {
                    tracing::info!(
                        "{cut} killed clients cut off after {KILL_GRACE:?} without a goodbye"
                    );
                }
            });
        }
        count
    }

    /// Shuts down for good the sockets of clients `kill` picked that are
    /// still connected: the same clients (process id and secret), so never
    /// a newcomer on a reused slot.
    pub fn cut(&self, killed: &[Killed]) -> usize {
        self.shut(|pid, meta, slot| {
            let found = killed.iter().any(|k| {
                k.key.process_id == pid && k.key.secret_key == slot.secret.load(Ordering::Relaxed)
            });
            if found {
                // SAFETY: as in `kill`.
                unsafe { libc::shutdown(meta.fd, libc::SHUT_RDWR) };
            }
            found
        })
        .len()
    }

    /// Runs `act` on every registered client with its socket open, under
    /// its slot's lock; returns the keys of those it acted on.
    fn shut(&self, act: impl Fn(i32, &ClientMeta, &Slot) -> bool) -> Vec<Killed> {
        let used = self.free.lock().unwrap_or_else(|p| p.into_inner()).used;
        let mut acted = Vec::new();
        for index in 0..used {
            let Some(slot) = self.slot(index) else {
                continue;
            };
            let meta = slot.meta.lock().unwrap_or_else(|p| p.into_inner());
            let pid = slot.pid.load(Ordering::Acquire);
            if let Some(m) = meta.as_ref()
                && pid != 0
                && m.fd >= 0
                && act(pid, m, slot)
            {
                acted.push(Killed {
                    key: BackendKeyData {
                        process_id: pid,
                        secret_key: slot.secret.load(Ordering::Relaxed),
                    },
                });
            }
        }
        acted
    }

    /// Why the client was killed, if it was and has not been told yet.
    pub fn killed(&self, handle: CancelHandle) -> Option<Kill> {
        let slot = self.slot(handle.index)?;
        Kill::from_u8(slot.killed.load(Ordering::Acquire))
    }

    /// The client cannot be told why it was killed (its stream is not at
    /// a message boundary): it is closed without a word.
    pub fn forget_kill(&self, handle: CancelHandle) {
        if let Some(slot) = self.slot(handle.index) {
            slot.killed.store(0, Ordering::Release);
        }
    }

    /// The slot of the client whose key a cancel request gives.
    fn find(&self, req: &CancelRequest) -> Option<&Slot> {
        let index = *self
            .free
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .by_pid
            .get(&req.process_id)?;
        // A forwarded request spent some of its budget bits.
        let secret = self.secret_as_issued(req.secret_key);
        self.slot(index).filter(|s| {
            req.process_id != 0
                && s.pid.load(Ordering::Acquire) == req.process_id
                && s.secret.load(Ordering::Relaxed) == secret
        })
    }

    /// Forwards a client's cancel request. Unknown keys and clients that run
    /// nothing are ignored, as PostgreSQL does.
    /// `host_target` gives the target of host `i` of a pool's database.
    pub async fn cancel(
        &self,
        req: CancelRequest,
        host_target: impl Fn(&Arc<Pool>, u32) -> Option<Arc<super::target::ServerTarget>>,
    ) -> std::io::Result<bool> {
        let slot = self.find(&req);
        // Counted before the server is read (see `unlink`), uncounted when
        // done, whatever the outcome.
        let mut forwarding = slot.map(|slot| Forwarding::new(slot, &self.cancel_done));
        let linked = || {
            slot.and_then(|s| {
                let server = s.server.load(Ordering::SeqCst);
                let host = s.host.load(Ordering::Relaxed);
                let pool = s
                    .meta
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .as_ref()
                    .map(|m| m.pool.clone());
                (server != 0)
                    .then_some(())
                    .and(pool)
                    .map(|p| (p, host, unpack(server)))
            })
        };
        let mut found = linked();
        // Waiting for a server: its request is answered 57014 instead of
        // running once it gets one (PgBouncer drops such a cancel, and the
        // query runs later all the same).
        if found.is_none()
            && let Some(s) = slot
            && s.server.load(Ordering::SeqCst) == 0
            && s.waiting.load(Ordering::SeqCst)
        {
            if !s.wait_cancelled.swap(true, Ordering::SeqCst) {
                s.wait_cancel.notify_waiters();
            }
            if s.waiting.load(Ordering::SeqCst) {
                return Ok(true);
            }
            // The wait ended between the look and the mark: the mark is
            // taken back, unless the client saw it (its end of wait
            // stores, then looks; this marks, then looks: one of the two
            // sees the other), and the request goes to the server the
            // client may have by now (a review: else it was dropped).
            s.wait_cancelled.store(false, Ordering::SeqCst);
            found = linked();
        }
        let Some((pool, host, key)) = found else {
            return Ok(false);
        };
        if let Some(s) = slot {
            s.cancel_asked.store(true, Ordering::Relaxed);
        }
        let target = match host {
            0 => pool.settings_and_target().1,
            // A server on host `i` of a list without routing.
            i if i & super::target::ALTERNATE != 0 => {
                let target = pool.settings_and_target().1;
                let alt = (i & !super::target::ALTERNATE) as usize;
                match target.alternates.addrs.get(alt) {
                    Some(addr) => {
                        let mut t = (*target).clone();
                        t.addr = addr.clone();
                        Arc::new(t)
                    }
                    None => return Ok(false),
                }
            }
            i => match host_target(&pool, i) {
                Some(t) => t,
                None => return Ok(false),
            },
        };
        // From here a failure leaves the server's state unknown.
        if let Some(f) = forwarding.as_mut() {
            f.clean = false;
        }
        // PostgreSQL closes the connection once it has signalled the
        // backend: until then the server is not lent again (`unlink`).
        super::cancel_request::send_cancel(
            &target,
            &target.addr,
            key,
            pool.settings().cancel_wait_timeout,
        )
        .await?;
        if let Some(f) = forwarding.as_mut() {
            f.clean = true;
        }
        Ok(true)
    }
}

/// One cancel request being forwarded for a client's slot.
struct Forwarding<'a> {
    slot: &'a Slot,
    done: &'a tokio::sync::Notify,
    /// False while the request is on its way to PostgreSQL: dropped
    /// then (a timeout), the server's state is unknown.
    clean: bool,
}

impl<'a> Forwarding<'a> {
    fn new(slot: &'a Slot, done: &'a tokio::sync::Notify) -> Self {
        slot.canceling.fetch_add(1, Ordering::SeqCst);
        Self {
            slot,
            done,
            clean: true,
        }
    }
}

impl Drop for Forwarding<'_> {
    fn drop(&mut self) {
        if !self.clean {
            self.slot.cancel_unsure.store(true, Ordering::Relaxed);
        }
        self.slot.canceling.fetch_sub(1, Ordering::SeqCst);
        self.done.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(fd: i32) -> ClientMeta {
        let addr = super::super::target::ServerAddr::Tcp {
            host: "127.0.0.1".into(),
            port: 1,
        };
        ClientMeta {
            pool: Arc::new(super::super::pool::tests::test_pool(
                addr,
                1,
                std::time::Duration::ZERO,
            )),
            user: "u".into(),
            peer: None,
            local: None,
            connected: std::time::SystemTime::now(),
            application_name: "".into(),
            fd,
            pinned: None,
            tls: None,
        }
    }

    /// KILL marks the client and shuts its socket for reading (its task
    /// reads the end and can still write the error); `cut` then shuts the
    /// same client's socket for good, and never a newcomer's on the slot.
    #[test]
    fn kill_marks_shuts_for_reading_and_cut_spares_a_newcomer() {
        use std::io::{Read, Write};
        use std::os::fd::AsRawFd;
        use std::os::unix::net::UnixStream;
        let reg = CancelRegistry::new(0);
        let (mut ours, mut theirs) = UnixStream::pair().expect("pair");
        let first = reg.register(meta(ours.as_raw_fd())).expect("slot");
        let bystander_pair = UnixStream::pair().expect("pair");
        let bystander = reg
            .register(meta(bystander_pair.0.as_raw_fd()))
            .expect("slot");
        let killed = reg.kill(Kill::DatabaseRemoved, |pid, _| pid == first.key.process_id);
        assert_eq!(killed.len(), 1);
        assert_eq!(reg.killed(first), Some(Kill::DatabaseRemoved));
        assert_eq!(reg.killed(bystander), None);
        let mut byte = [0u8; 1];
        assert_eq!(ours.read(&mut byte).expect("read"), 0, "the end is read");
        ours.write_all(b"E")
            .expect("the farewell can still be written");
        assert_eq!(theirs.read(&mut byte).expect("read"), 1);
        reg.forget_kill(first);
        assert_eq!(reg.killed(first), None);

        // The client leaves; a newcomer takes its slot: `cut` spares it.
        reg.unregister(first);
        let (newcomer_sock, mut newcomer_peer) = UnixStream::pair().expect("pair");
        let newcomer = reg.register(meta(newcomer_sock.as_raw_fd())).expect("slot");
        assert_eq!(newcomer.index, first.index, "the slot is reused");
        assert_eq!(reg.cut(&killed), 0);
        assert_eq!(reg.killed(newcomer), None);
        (&newcomer_sock)
            .write_all(b"x")
            .expect("the newcomer's socket is whole");
        assert_eq!(newcomer_peer.read(&mut byte).expect("read"), 1);

        // A killed client still there is cut off for good.
        let again = reg.kill(Kill::AdminForced, |pid, _| pid == newcomer.key.process_id);
        assert_eq!(reg.killed(newcomer), Some(Kill::AdminForced));
        assert_eq!(reg.cut(&again), 1);
        assert!(
            (&newcomer_sock).write_all(b"x").is_err(),
            "shut for writing too"
        );
    }

    /// A cancel request for a client waiting for a server marks it and
    /// wakes its wait (that client's only); one for a client neither
    /// linked nor waiting does nothing; a newcomer on the slot starts clean.
    #[tokio::test]
    async fn a_cancel_for_a_waiting_client_ends_its_wait() {
        use std::os::fd::AsRawFd;
        use std::time::Duration;
        let reg = CancelRegistry::new(0);
        let pair = std::os::unix::net::UnixStream::pair().expect("pair");
        let client = reg.register(meta(pair.0.as_raw_fd())).expect("slot");
        let other = reg.register(meta(pair.1.as_raw_fd())).expect("slot");
        let request = |h: CancelHandle| CancelRequest {
            process_id: h.key.process_id,
            secret_key: h.key.secret_key,
        };
        let no_host = |_: &Arc<Pool>, _: u32| None;
        assert!(!reg.cancel(request(client), no_host).await.expect("idle"));
        assert!(!reg.take_wait_cancel(client), "idle: nothing to cancel");
        reg.set_waiting(client, true);
        reg.set_waiting(other, true);
        let wait = reg.wait_cancelled(client);
        let cancel = async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            reg.cancel(request(client), no_host).await.expect("waiting")
        };
        let ((), sent) =
            tokio::time::timeout(Duration::from_secs(5), async { tokio::join!(wait, cancel) })
                .await
                .expect("the wait ends with the cancel");
        assert!(sent);
        assert!(
            tokio::time::timeout(Duration::from_millis(50), reg.wait_cancelled(other))
                .await
                .is_err(),
            "the other waiting client is not cancelled"
        );
        assert!(reg.take_wait_cancel(client));
        assert!(!reg.take_wait_cancel(client), "taken once");
        assert!(!reg.take_wait_cancel(other));
        assert!(reg.cancel(request(client), no_host).await.expect("again"));
        reg.unregister(client);
        let newcomer = reg.register(meta(pair.0.as_raw_fd())).expect("slot");
        assert_eq!(newcomer.index, client.index, "the slot is reused");
        assert!(!reg.take_wait_cancel(newcomer), "a newcomer starts clean");
    }

    #[tokio::test]
    async fn a_server_with_a_cancel_on_its_way_waits_for_it() {
        use std::os::fd::AsRawFd;
        use std::time::Duration;
        let reg = CancelRegistry::new(0);
        let pair = std::os::unix::net::UnixStream::pair().expect("pair");
        let client = reg.register(meta(pair.0.as_raw_fd())).expect("slot");
        let slot = reg.slot(client.index).expect("slot");
        assert!(
            !reg.unlink(client),
            "no cancel: the server goes back at once"
        );
        // A request counted before the relay unlinks is seen by it.
        let forwarding = Forwarding::new(slot, &reg.cancel_done);
        assert!(reg.unlink(client));
        assert!(
            !reg.cancels_done(client, Duration::from_millis(30)).await,
            "still on its way"
        );
        let waited = reg.cancels_done(client, Duration::from_secs(5));
        let done = async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            drop(forwarding);
        };
        let (settled, ()) = tokio::join!(waited, done);
        assert!(settled, "done: the server may go to another client");
        // A request dropped on its way (timed out) leaves the server's
        // state unknown: it is closed, once.
        let mut lost = Forwarding::new(slot, &reg.cancel_done);
        lost.clean = false;
        drop(lost);
        assert!(!reg.cancels_done(client, Duration::from_secs(1)).await);
        assert!(reg.cancels_done(client, Duration::from_secs(1)).await);
    }

    /// A key is random throughout: its process id does not give away the
    /// slot (it once carried the slot index in its low 21 bits, leaving
    /// 42 bits to guess, 30 with peering), and a cancel request finds its
    /// client by the whole key only.
    #[test]
    fn keys_are_random_and_found_whole() {
        for peer in [0, 3] {
            let reg = CancelRegistry::new(peer);
            let keys: Vec<_> = (0..200)
                .map(|i| reg.register(meta(i)).expect("slot"))
                .collect();
            let pids: std::collections::HashSet<_> =
                keys.iter().map(|k| k.key.process_id).collect();
            assert_eq!(pids.len(), keys.len(), "process ids are unique");
            let (random, secret_random) = if peer == 0 {
                (i32::MAX, -1)
            } else {
                ((1 << PEER_RANDOM_BITS) - 1, !TTL_MASK)
            };
            let ored = keys.iter().fold(0, |a, k| a | k.key.process_id);
            let anded = keys.iter().fold(-1, |a, k| a & k.key.process_id);
            assert_eq!(ored & random, random, "every process id bit varies");
            assert_eq!(anded & random, 0, "every process id bit varies");
            let secrets = keys.iter().fold(0, |a, k| a | k.key.secret_key);
            assert_eq!(secrets & secret_random, secret_random);
            for k in &keys {
                assert!(k.key.process_id > 0);
                assert_eq!(
                    k.key.process_id >> PEER_RANDOM_BITS == peer as i32,
                    peer != 0
                );
                let req = |secret_key| CancelRequest {
                    process_id: k.key.process_id,
                    secret_key,
                };
                assert!(reg.find(&req(k.key.secret_key)).is_some());
                assert!(reg.find(&req(k.key.secret_key ^ 4)).is_none());
            }
            let gone = keys[7];
            reg.unregister(gone);
            let req = CancelRequest {
                process_id: gone.key.process_id,
                secret_key: gone.key.secret_key,
            };
            assert!(reg.find(&req).is_none(), "a client that left is not found");
            assert!(
                reg.find(&CancelRequest {
                    process_id: 0,
                    secret_key: 0
                })
                .is_none()
            );
        }
    }

    /// A login's registration is given up unless the login keeps it (a
    /// login future dropped by client_login_timeout mid-write once left
    /// its slot, key and socket number registered).
    #[test]
    fn a_registration_not_kept_is_given_up() {
        let reg = CancelRegistry::new(0);
        let req = |key: BackendKeyData| CancelRequest {
            process_id: key.process_id,
            secret_key: key.secret_key,
        };
        let dropped = reg.register_for_login(meta(1)).expect("slot");
        let key = dropped.key().expect("a key");
        assert!(reg.find(&req(key)).is_some());
        drop(dropped);
        assert!(reg.find(&req(key)).is_none(), "given up");
        assert!(reg.clients().is_empty());
        let kept = reg.register_for_login(meta(2)).expect("slot");
        let handle = kept.keep().expect("a handle");
        assert!(reg.find(&req(handle.key)).is_some(), "kept");
        assert_eq!(reg.clients().len(), 1);
    }

    #[test]
    fn keys_pack_round_trip() {
        let k = BackendKeyData {
            process_id: -5,
            secret_key: i32::MIN,
        };
        assert_eq!(unpack(pack(k)), k);
    }

    #[test]
    fn peered_keys_name_their_peer_and_spend_a_forward_each_hop() {
        let one = CancelRegistry::new(1);
        let two = CancelRegistry::new(2);
        // A key as member 2 hands it out: peer id above 17 random bits, all
        // forwarding bits set.
        let key = BackendKeyData {
            process_id: (2 << PEER_RANDOM_BITS) | 5,
            secret_key: 0x1234_5670 | TTL_MASK,
        };
        let req = CancelRequest {
            process_id: key.process_id,
            secret_key: key.secret_key,
        };
        assert!(two.for_peer(&req).is_none(), "its own key stays");
        let Some(Ok((peer, once))) = one.for_peer(&req) else {
            panic!("member 1 forwards it");
        };
        assert_eq!(peer, 2);
        assert_eq!(once.secret_key & TTL_MASK, 2);
        let twice = one.for_peer(&once).and_then(Result::ok).map(|(_, r)| r);
        let thrice = twice.and_then(|r| one.for_peer(&r)).and_then(Result::ok);
        let spent = thrice.map(|(_, r)| r).expect("three forwards");
        assert_eq!(spent.secret_key & TTL_MASK, 0);
        assert_eq!(one.for_peer(&spent).map(|r| r.is_err()), Some(true));
        // Without peering nothing is forwarded.
        assert!(CancelRegistry::new(0).for_peer(&req).is_none());
    }

    #[test]
    fn a_console_key_is_forwarded_to_its_peer_and_known_there() {
        let one = CancelRegistry::new(1);
        let two = CancelRegistry::new(2);
        let (process_id, secret_key) = two.console_key_shape();
        assert_ne!((process_id, secret_key), (0, 0));
        let req = CancelRequest {
            process_id,
            secret_key,
        };
        assert!(two.for_peer(&req).is_none(), "its own key stays");
        let Some(Ok((peer, forwarded))) = one.for_peer(&req) else {
            panic!("another member forwards it");
        };
        assert_eq!(peer, 2);
        // Spent budget or not, it is the key handed out.
        assert_eq!(two.secret_as_issued(forwarded.secret_key), secret_key);
        let (pid, secret) = CancelRegistry::new(0).console_key_shape();
        assert!(pid > 0);
        assert_eq!(CancelRegistry::new(0).secret_as_issued(secret), secret);
    }
}
