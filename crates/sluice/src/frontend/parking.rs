//! Idle clients without a task. A client waiting for its next request is
//! a tokio task (its cell is aligned to 128 bytes and holds the session's
//! future) on top of its `Client` and its socket's registration with the
//! worker's event loop (tokio's, 256 bytes). A client idle for 1–2 s
//! (`PARK_AFTER_SWEEPS`) gives both up: the `Client` waits in its
//! worker's lot, its plain socket taken off tokio and watched by the
//! lot's own epoll set, whose one descriptor is on tokio's loop. When the
//! client sends something (or its socket closes: KILL's shutdown wakes
//! it too), the lot registers the socket with tokio again and a new task
//! takes the client on where the old one stopped. What stays is the
//! `Client` and a slot (issue 13: 19,000 idle clients, 532 bytes each
//! measured, from 1,118; the freed memory goes back to the system by
//! jemalloc's background thread, `main.rs`). A TLS client parks too, its
//! socket still registered with tokio (rustls holds it).
//!
//! Two parts, both per worker thread (per-core runtime only; on the shared
//! runtime a task may change threads, and nothing parks):
//! - the idle board: a client's task is on it from its first idle wait
//!   on; each wait marks it idle with the sweep it began at, and the end
//!   of the wait marks it busy (two small writes a transaction, no timer
//!   and no allocation). A task sweeps the board once a second and wakes
//!   the waits idle for `PARK_AFTER_SWEEPS` sweeps, which then end their
//!   task (`SessionEnd::Park`);
//! - the lot: parked clients by slot, and an epoll set whose events name
//!   a slot and its generation (a slot reused by another client ignores
//!   an event meant for the old one); the lot's task empties the set and
//!   resumes those clients (`Parkable::resume`). Parking and resuming
//!   cost two epoll_ctl calls each way: once per idle second at most.

use std::cell::RefCell;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::task::Waker;
use std::time::Duration;

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// How long a client is idle before it gives its task up (1–2 sweeps).
pub const PARK_AFTER_SWEEPS: u64 = 2;
const SWEEP: Duration = Duration::from_secs(1);

/// A client's task on the board: registered at its first idle wait and
/// kept until the task ends, so that a transaction costs two small writes
/// (idle, busy) and no allocation.
struct Waiting {
    /// The sweep its current idle wait began at.
    since: u64,
    generation: u64,
    waker: Waker,
    /// Waiting for its next request now.
    idle: bool,
    /// The sweep asked it to park (it was woken for that).
    park: bool,
}

struct Board {
    /// Which board (thread) this is, 0 until first used.
    id: u64,
    /// Parking runs on per-core workers only (set at first use): with the
    /// shared runtime a task and the sweep may run on any thread, and a
    /// board per thread would not see its own waits.
    enabled: bool,
    sweep: u64,
    generation: u64,
    entries: Vec<Option<Waiting>>,
    free: Vec<usize>,
}

thread_local! {
    static BOARD: RefCell<Board> = const {
        RefCell::new(Board {
            id: 0,
            enabled: false,
            sweep: 0,
            generation: 0,
            entries: Vec::new(),
            free: Vec::new(),
        })
    };
}

static BOARDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// An idle wait's place on its worker's board; taken off when dropped.
/// On a per-core worker a task never changes threads; with the shared
/// runtime it may, and a wait polled on another thread than its board's
/// is simply never asked to park (the sweep drops its entry).
pub struct OnBoard {
    index: usize,
    generation: u64,
    board: u64,
}

impl Board {
    fn entry(&mut self, at: &OnBoard) -> Option<&mut Waiting> {
        if self.id != at.board {
            return None;
        }
        self.entries
            .get_mut(at.index)
            .and_then(Option::as_mut)
            .filter(|w| w.generation == at.generation)
    }
}

impl OnBoard {
    /// Puts the waiting task on the board (`None` while the thread ends,
    /// outside a runtime, or on the shared runtime).
    pub fn new(waker: &Waker) -> Option<OnBoard> {
        BOARD
            .try_with(|b| {
                let mut b = b.borrow_mut();
                if b.id == 0 {
                    // First use on this thread: a per-core worker gets
                    // its sweep; anything else never parks.
                    let handle = tokio::runtime::Handle::try_current().ok()?;
                    b.enabled =
                        handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread;
                    if b.enabled {
                        handle.spawn(sweep_forever());
                    }
                    b.id = BOARDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                }
                if !b.enabled {
                    return None;
                }
                b.generation += 1;
                let entry = Waiting {
                    since: b.sweep,
                    generation: b.generation,
                    waker: waker.clone(),
                    idle: true,
                    park: false,
                };
                let index = match b.free.pop() {
                    Some(i) => {
                        b.entries[i] = Some(entry);
                        i
                    }
                    None => {
                        b.entries.push(Some(entry));
                        b.entries.len() - 1
                    }
                };
                Some(OnBoard {
                    index,
                    generation: b.generation,
                    board: b.id,
                })
            })
            .ok()
            .flatten()
    }

    /// An idle wait begins (the entry is there from an earlier one).
    pub fn idle(&self, waker: &Waker) {
        let _ = BOARD.try_with(|b| {
            let b = &mut *b.borrow_mut();
            let sweep = b.sweep;
            if let Some(w) = b.entry(self) {
                w.since = sweep;
                w.idle = true;
                w.park = false;
                if !w.waker.will_wake(waker) {
                    w.waker = waker.clone();
                }
            }
        });
    }

    /// The idle wait ended: the client sent something.
    pub fn busy(&self) {
        let _ = BOARD.try_with(|b| {
            if let Some(w) = b.borrow_mut().entry(self) {
                // (a request that came as the sweep asked to park answers it)
                w.idle = false;
                w.park = false;
            }
        });
    }

    /// Whether the sweep asked this wait to park; keeps the waker current.
    pub fn park_asked(&self, waker: &Waker) -> bool {
        BOARD
            .try_with(|b| {
                let mut b = b.borrow_mut();
                match b.entry(self) {
                    Some(w) => {
                        if !w.waker.will_wake(waker) {
                            w.waker = waker.clone();
                        }
                        w.park
                    }
                    None => false,
                }
            })
            .unwrap_or(false)
    }
}

impl Drop for OnBoard {
    fn drop(&mut self) {
        let _ = BOARD.try_with(|b| {
            let mut b = b.borrow_mut();
            if b.entry(self).is_some() {
                b.entries[self.index] = None;
                b.free.push(self.index);
            }
        });
    }
}

/// The worker's sweep: once a second, wakes the waits idle for
/// `PARK_AFTER_SWEEPS` sweeps, asking them to park.
async fn sweep_forever() {
    let mut tick = tokio::time::interval(SWEEP);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let wake = BOARD.try_with(|b| {
            let b = &mut *b.borrow_mut();
            b.sweep += 1;
            let now = b.sweep;
            let mut wake = Vec::new();
            for w in b.entries.iter_mut().flatten() {
                let idle = now.saturating_sub(w.since);
                if w.idle && !w.park && idle >= PARK_AFTER_SWEEPS {
                    w.park = true;
                    wake.push(w.waker.clone());
                }
            }
            if b.free.len() == b.entries.len() {
                // Every wait parked or ended: the board's peak length goes
                // (an old `OnBoard` finds no entry of its generation).
                b.entries = Vec::new();
                b.free = Vec::new();
            }
            wake
        });
        let Ok(wake) = wake else { return };
        for w in wake {
            w.wake();
        }
    }
}

/// A client that can wait in the lot.
pub trait Parkable: 'static {
    /// Something to read already (data, EOF, or decrypted bytes waiting
    /// in rustls): the client is resumed instead of parked.
    fn readable_now(&self) -> bool;
    /// Takes the socket off the worker's event loop where it can (a plain
    /// socket; a TLS one stays registered) and gives its descriptor, for
    /// the lot to watch.
    fn take_off(&mut self) -> std::io::Result<RawFd>;
    /// Gives the client a task again (spawned on the current worker),
    /// with its socket back on the event loop.
    fn resume(self: Box<Self>);
}

/// A worker's parked clients by slot, and the epoll set that watches
/// their sockets (its descriptor is registered with the worker's event
/// loop, so one readiness wakes the lot's task for all of them).
struct Lot {
    epoll: Arc<AsyncFd<OwnedFd>>,
    parked: Vec<Option<Parked>>,
    free: Vec<u32>,
    generation: u32,
}

struct Parked {
    generation: u32,
    fd: RawFd,
    client: Box<dyn Parkable>,
}

thread_local! {
    static LOT: RefCell<Option<Lot>> = const { RefCell::new(None) };
}

/// What a socket's event says: its slot and the slot's generation (a
/// slot reused by another client ignores an event meant for the old one).
fn key(slot: u32, generation: u32) -> u64 {
    (u64::from(slot) << 32) | u64::from(generation)
}

impl Lot {
    /// The lot of this worker, made (with its task) on first use.
    fn new() -> std::io::Result<Lot> {
        // SAFETY: epoll_create1 takes flags only; the descriptor returned
        // is new and owned here.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` was just opened and nothing else owns it.
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: the AsyncFd owns the OwnedFd, whose descriptor stays
        // open and the same until the AsyncFd is dropped.
        let epoll = unsafe { AsyncFd::register_with_interest(owned, Interest::READABLE) }?;
        let epoll = Arc::new(epoll);
        tokio::spawn(run_lot(epoll.clone()));
        Ok(Lot {
            epoll,
            parked: Vec::new(),
            free: Vec::new(),
            generation: 0,
        })
    }

    fn ctl(&self, op: libc::c_int, fd: RawFd, key: u64) -> std::io::Result<()> {
        let mut event = libc::epoll_event {
            events: (libc::EPOLLIN | libc::EPOLLRDHUP | libc::EPOLLONESHOT) as u32,
            u64: key,
        };
        // SAFETY: both descriptors are open (the lot's own, and a parked
        // client's, owned by its slot); `event` is a valid epoll_event.
        let rc = unsafe { libc::epoll_ctl(self.epoll.get_ref().as_raw_fd(), op, fd, &mut event) };
        if rc < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Puts `client` in a slot, its socket watched; gives it back if the
    /// kernel refuses the watch.
    fn put(&mut self, fd: RawFd, client: Box<dyn Parkable>) -> Result<(), Box<dyn Parkable>> {
        self.generation = self.generation.wrapping_add(1);
        let generation = self.generation;
        let slot = match self.free.pop() {
            Some(i) => i,
            None => match u32::try_from(self.parked.len()) {
                Ok(i) => {
                    self.parked.push(None);
                    i
                }
                Err(_) => return Err(client),
            },
        };
        if let Err(e) = self.ctl(libc::EPOLL_CTL_ADD, fd, key(slot, generation)) {
            tracing::debug!("parking a client: epoll_ctl: {e}");
            self.free.push(slot);
            return Err(client);
        }
        self.parked[slot as usize] = Some(Parked {
            generation,
            fd,
            client,
        });
        Ok(())
    }

    /// Takes the client an event names out of its slot (`None` for a
    /// stale event) and stops watching its socket.
    fn take(&mut self, key: u64) -> Option<Box<dyn Parkable>> {
        let (slot, generation) = ((key >> 32) as u32, key as u32);
        let place = self.parked.get_mut(slot as usize)?;
        if place.as_ref()?.generation != generation {
            return None;
        }
        let parked = place.take()?;
        self.free.push(slot);
        if let Err(e) = self.ctl(libc::EPOLL_CTL_DEL, parked.fd, 0) {
            tracing::debug!("resuming a client: epoll_ctl: {e}");
        }
        Some(parked.client)
    }
}

/// Parks `client` on this worker's lot. It resumes at once if it has
/// something to read already, or if it cannot be parked (the thread is
/// ending, the lot cannot be made, or the kernel refuses the watch).
pub fn park(mut client: Box<dyn Parkable>) {
    if client.readable_now() || !lot_ready() {
        client.resume();
        return;
    }
    // Bytes that arrive from here on make the socket ready in the lot's
    // set as soon as it is added (epoll checks readiness on ADD).
    let fd = match client.take_off() {
        Ok(fd) => fd,
        Err(e) => {
            tracing::debug!("parking a client: {e}");
            client.resume();
            return;
        }
    };
    let put = LOT.try_with(|l| match l.borrow_mut().as_mut() {
        Some(lot) => lot.put(fd, client),
        None => Err(client),
    });
    match put {
        Ok(Ok(())) => {
            PARKED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(Err(client)) => client.resume(),
        // The thread is ending (its runtime is gone): the client goes
        // with it.
        Err(_) => {}
    }
}

/// Makes this worker's lot if there is none; false if it cannot (then
/// not tried again for `LOT_RETRY`: a worker out of descriptors keeps
/// its idle clients in their tasks rather than try for each).
fn lot_ready() -> bool {
    LOT.try_with(|l| {
        let mut l = l.borrow_mut();
        if l.is_some() {
            return true;
        }
        let now = std::time::Instant::now();
        let failed = LOT_FAILED.get();
        if failed.is_some_and(|t| now.duration_since(t) < LOT_RETRY) {
            return false;
        }
        match Lot::new() {
            Ok(lot) => {
                *l = Some(lot);
                true
            }
            Err(e) => {
                tracing::warn!("idle clients cannot park on this worker: {e}");
                LOT_FAILED.set(Some(now));
                false
            }
        }
    })
    .unwrap_or(false)
}

const LOT_RETRY: Duration = Duration::from_secs(10);

thread_local! {
    static LOT_FAILED: std::cell::Cell<Option<std::time::Instant>> = const { std::cell::Cell::new(None) };
}

/// Clients parked, all workers (`sluice_parked_clients`).
pub fn parked() -> usize {
    PARKED.load(std::sync::atomic::Ordering::Relaxed)
}

static PARKED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Events taken from the lot's set at a time.
const EVENTS: usize = 64;
/// Clients resumed in one poll of the lot's task at most: a mass wake
/// (KILL of a database, a network blip) yields between batches instead
/// of stalling the worker's other clients.
const RESUMES_PER_POLL: usize = 256;

/// Forgets this worker's lot when its task ends, so that a later park
/// makes a new one rather than wait in a lot nobody drains.
struct LotTask(Arc<AsyncFd<OwnedFd>>);

impl LotTask {
    fn take_lot(&self) -> Option<Lot> {
        LOT.try_with(|l| {
            let mut l = l.borrow_mut();
            if l.as_ref()
                .is_some_and(|lot| Arc::ptr_eq(&lot.epoll, &self.0))
            {
                l.take()
            } else {
                None
            }
        })
        .ok()
        .flatten()
    }

    /// The watch failed (the runtime is alive): every parked client gets
    /// its task back.
    fn resume_all(&self) {
        let Some(mut lot) = self.take_lot() else {
            return;
        };
        for parked in std::mem::take(&mut lot.parked).into_iter().flatten() {
            let _ = lot.ctl(libc::EPOLL_CTL_DEL, parked.fd, 0);
            PARKED.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
            parked.client.resume();
        }
    }
}

impl Drop for LotTask {
    fn drop(&mut self) {
        // The task was dropped (its runtime shuts down): the parked
        // clients are left as they are, their sockets open (a closed one
        // would free a descriptor number KILL may still name).
        if let Some(mut lot) = self.take_lot() {
            std::mem::forget(std::mem::take(&mut lot.parked));
        }
    }
}

/// The lot's task: resumes the clients whose sockets woke. It must run on
/// the lot's own thread (it finds the lot there): parking is enabled on
/// per-core (current-thread) runtimes only, where every task does.
async fn run_lot(epoll: Arc<AsyncFd<OwnedFd>>) {
    let task = LotTask(epoll);
    let epoll = &task.0;
    let mut events = [libc::epoll_event { events: 0, u64: 0 }; EVENTS];
    loop {
        let mut guard = match epoll.readable().await {
            Ok(g) => g,
            Err(e) => {
                tracing::warn!("parked clients' watch failed: {e}");
                task.resume_all();
                return;
            }
        };
        let mut resumed = 0;
        let drained = loop {
            if resumed >= RESUMES_PER_POLL {
                break false;
            }
            // SAFETY: the lot's descriptor is open while `epoll` is, and
            // `events` has room for EVENTS entries.
            let n = unsafe {
                libc::epoll_wait(
                    epoll.get_ref().as_raw_fd(),
                    events.as_mut_ptr(),
                    EVENTS as libc::c_int,
                    0,
                )
            };
            let Ok(n) = usize::try_from(n) else {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                tracing::warn!("parked clients' watch: epoll_wait: {e}");
                task.resume_all();
                return;
            };
            if n == 0 {
                break true;
            }
            for event in &events[..n] {
                let key = event.u64;
                let client = LOT
                    .try_with(|l| l.borrow_mut().as_mut().and_then(|lot| lot.take(key)))
                    .ok()
                    .flatten();
                if let Some(client) = client {
                    PARKED.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
                    client.resume();
                    resumed += 1;
                }
            }
        };
        if drained {
            guard.clear_ready();
        } else {
            // More events wait: readiness stays set, so the next
            // `readable` returns at once, after the worker's other tasks.
            drop(guard);
            tokio::task::yield_now().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    use std::task::Wake;

    use super::*;

    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, SeqCst);
        }
    }

    use crate::test_support::runtime;

    #[test]
    fn a_lasting_wait_is_asked_to_park_and_leaves_the_board() {
        runtime().block_on(async {
            let count = Arc::new(Count(AtomicUsize::new(0)));
            let waker = Waker::from(count.clone());
            let lasting = OnBoard::new(&waker).expect("on the board");
            let short = OnBoard::new(&waker).expect("on the board");
            assert!(!lasting.park_asked(&waker));
            drop(short);
            tokio::time::sleep(SWEEP * (PARK_AFTER_SWEEPS as u32 + 1)).await;
            assert_eq!(
                count.0.load(SeqCst),
                1,
                "woken once, the short wait not at all"
            );
            assert!(lasting.park_asked(&waker));
            // A request came instead of the park: the next idle wait is
            // asked again, however long the request took.
            lasting.busy();
            assert!(!lasting.park_asked(&waker));
            tokio::time::sleep(SWEEP * (PARK_AFTER_SWEEPS as u32 + 2)).await;
            lasting.idle(&waker);
            assert!(!lasting.park_asked(&waker));
            tokio::time::sleep(SWEEP * (PARK_AFTER_SWEEPS as u32 + 1)).await;
            assert_eq!(count.0.load(SeqCst), 2, "asked again");
            assert!(lasting.park_asked(&waker));
            drop(lasting);
            BOARD.with(|b| assert!(b.borrow().entries.iter().all(Option::is_none)));
        });
    }

    /// A parked client on one end of a socket pair; the test holds the
    /// other end.
    struct Fake {
        socket: Option<std::os::unix::net::UnixStream>,
        resumed: Arc<AtomicUsize>,
    }

    impl Parkable for Fake {
        fn readable_now(&self) -> bool {
            let mut byte = 0u8;
            self.socket.as_ref().is_some_and(|s| {
                // SAFETY: one byte into `byte`, from the test's own socket.
                let rc = unsafe {
                    libc::recv(
                        s.as_raw_fd(),
                        (&raw mut byte).cast(),
                        1,
                        libc::MSG_PEEK | libc::MSG_DONTWAIT,
                    )
                };
                rc >= 0
            })
        }

        fn take_off(&mut self) -> std::io::Result<RawFd> {
            self.socket
                .as_ref()
                .map(AsRawFd::as_raw_fd)
                .ok_or_else(|| std::io::Error::other("no socket"))
        }

        fn resume(self: Box<Self>) {
            self.resumed.fetch_add(1, SeqCst);
        }
    }

    fn fake() -> (Box<Fake>, std::os::unix::net::UnixStream, Arc<AtomicUsize>) {
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().expect("socket pair");
        ours.set_nonblocking(true).expect("nonblocking");
        let resumed = Arc::new(AtomicUsize::new(0));
        let f = Fake {
            socket: Some(ours),
            resumed: resumed.clone(),
        };
        (Box::new(f), theirs, resumed)
    }

    async fn settle() {
        crate::test_support::let_tasks_run(Duration::from_millis(5)).await;
    }

    #[test]
    fn a_parked_client_resumes_when_its_socket_wakes_and_only_then() {
        runtime().block_on(async {
            use std::io::Write;
            let (a, mut a_peer, a_resumed) = fake();
            let (b, b_peer, b_resumed) = fake();
            park(a);
            park(b);
            settle().await;
            assert_eq!(parked(), 2);
            assert_eq!(a_resumed.load(SeqCst), 0, "parked until its socket wakes");
            a_peer.write_all(b"Q").expect("write");
            settle().await;
            assert_eq!((a_resumed.load(SeqCst), b_resumed.load(SeqCst)), (1, 0));
            // The slot (and likely the descriptor's number) goes to the
            // next client, who is not woken by the first one's event.
            let (c, c_peer, c_resumed) = fake();
            park(c);
            settle().await;
            assert_eq!(c_resumed.load(SeqCst), 0);
            // A closed peer wakes (EOF, as KILL's shutdown does).
            drop(b_peer);
            drop(c_peer);
            settle().await;
            assert_eq!(
                (
                    a_resumed.load(SeqCst),
                    b_resumed.load(SeqCst),
                    c_resumed.load(SeqCst)
                ),
                (1, 1, 1)
            );
            assert_eq!(parked(), 0);
            // A client with something to read already is not parked.
            let (d, mut d_peer, d_resumed) = fake();
            d_peer.write_all(b"Q").expect("write");
            park(d);
            assert_eq!(d_resumed.load(SeqCst), 1);
            LOT.with(|l| {
                let l = l.borrow();
                let lot = l.as_ref().expect("a lot");
                assert!(lot.parked.iter().all(Option::is_none));
                assert_eq!(lot.free.len(), lot.parked.len());
            });
        });
    }
}
