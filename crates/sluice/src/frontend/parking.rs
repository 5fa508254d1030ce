//! Idle clients without a task. A client waiting for its next request is
//! a tokio task (its cell is aligned to 128 bytes and holds the session's
//! future) on top of its `Client` and its socket's registration. A client
//! idle for 1–2 s (`PARK_AFTER_SWEEPS`) gives its task up: the `Client`
//! waits in its worker's lot, its socket still registered with the
//! worker's event loop, and a waker of the lot's own says when the client
//! sends something (or its socket closes: KILL's shutdown wakes it too); a
//! new task then takes the client on where the old one stopped. What stays
//! is the `Client`, the registration and a small waker (issue 13: 19,000
//! idle clients, 835 bytes each measured, from 1,118; the freed memory
//! goes back to the system by jemalloc's background thread, `main.rs`).
//!
//! Two parts, both per worker thread (per-core runtime only; on the shared
//! runtime a task may change threads, and nothing parks):
//! - the idle board: a client's task is on it from its first idle wait
//!   on; each wait marks it idle with the sweep it began at, and the end
//!   of the wait marks it busy (two small writes a transaction, no timer
//!   and no allocation). A task sweeps the board once a second and wakes
//!   the waits idle for `PARK_AFTER_SWEEPS` sweeps, which then end their
//!   task (`SessionEnd::Park`);
//! - the lot: parked clients by slot; each slot's waker, given to the
//!   socket's readiness, puts the slot in the ready list and wakes the
//!   lot's task, which spawns the client's new task (`Parkable::resume`).
//!   A generation per slot keeps a late wake from resuming the slot's
//!   next client.

use std::cell::RefCell;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

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
pub trait Parkable: Send + 'static {
    /// Polls the socket's read readiness (Ready also when it closed or
    /// failed: the new task finds out).
    fn poll_readable(&self, cx: &mut Context<'_>) -> Poll<()>;
    /// Gives the client a task again (spawned on the current worker).
    fn resume(self: Box<Self>);
}

/// What the slots' wakers fill and the lot's task empties. Wakers are
/// `Send + Sync`: a lock each, never contended across threads (a worker's
/// sockets wake on that worker).
struct Lot {
    slots: Mutex<Slots>,
    ready: Mutex<Vec<(usize, u64)>>,
    lot_waker: Mutex<Option<Waker>>,
}

#[derive(Default)]
struct Slots {
    parked: Vec<Option<(u64, Box<dyn Parkable>)>>,
    free: Vec<usize>,
    generation: u64,
}

/// A slot's waker: names the slot and its generation (a slot reused by
/// another client ignores the old client's wake).
struct SlotWaker {
    slot: usize,
    generation: u64,
    lot: Arc<Lot>,
}

impl Wake for SlotWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        lock(&self.lot.ready).push((self.slot, self.generation));
        let waker = lock(&self.lot.lot_waker).clone();
        if let Some(w) = waker {
            w.wake();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

thread_local! {
    static LOT: RefCell<Option<Arc<Lot>>> = const { RefCell::new(None) };
}

/// This worker's lot, made (with its task) on first use.
fn this_lot() -> Option<Arc<Lot>> {
    LOT.try_with(|l| {
        l.borrow_mut()
            .get_or_insert_with(|| {
                let lot = Arc::new(Lot {
                    slots: Mutex::new(Slots::default()),
                    ready: Mutex::new(Vec::new()),
                    lot_waker: Mutex::new(None),
                });
                tokio::spawn(run_lot(lot.clone()));
                lot
            })
            .clone()
    })
    .ok()
}

/// Parks `client` on this worker's lot. It resumes at once if its socket
/// is readable already (or if there is no lot: the thread is ending).
pub fn park(client: Box<dyn Parkable>) {
    let Some(lot) = this_lot() else {
        client.resume();
        return;
    };
    // The slot is filled under the same lock as the socket is given its
    // waker: a wake in between (another thread's event loop, or tokio's
    // budget waking at once) finds the client there. The waker takes
    // only the ready list's lock.
    let mut slots = lock(&lot.slots);
    slots.generation += 1;
    let generation = slots.generation;
    let slot = match slots.free.pop() {
        Some(i) => i,
        None => {
            slots.parked.push(None);
            slots.parked.len() - 1
        }
    };
    let waker = Waker::from(Arc::new(SlotWaker {
        slot,
        generation,
        lot: lot.clone(),
    }));
    if client
        .poll_readable(&mut Context::from_waker(&waker))
        .is_ready()
    {
        slots.free.push(slot);
        drop(slots);
        client.resume();
        return;
    }
    slots.parked[slot] = Some((generation, client));
    PARKED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// Clients parked, all workers (`sluice_parked_clients`).
pub fn parked() -> usize {
    PARKED.load(std::sync::atomic::Ordering::Relaxed)
}

static PARKED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The lot's task: resumes the clients whose sockets woke.
async fn run_lot(lot: Arc<Lot>) {
    loop {
        let ready = std::future::poll_fn(|cx| {
            let mut w = lock(&lot.lot_waker);
            if w.as_ref().is_none_or(|w| !w.will_wake(cx.waker())) {
                *w = Some(cx.waker().clone());
            }
            drop(w);
            let ready = std::mem::take(&mut *lock(&lot.ready));
            if ready.is_empty() {
                Poll::Pending
            } else {
                Poll::Ready(ready)
            }
        })
        .await;
        for (slot, generation) in ready {
            let client = {
                let mut slots = lock(&lot.slots);
                let current = slots
                    .parked
                    .get(slot)
                    .and_then(Option::as_ref)
                    .is_some_and(|(g, _)| *g == generation);
                if !current {
                    continue;
                }
                let taken = slots.parked[slot].take();
                slots.free.push(slot);
                taken
            };
            if let Some((_, client)) = client {
                PARKED.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
                client.resume();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

    use super::*;

    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, SeqCst);
        }
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime")
    }

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

    struct Fake {
        ready: bool,
        waker: Arc<Mutex<Option<Waker>>>,
        resumed: Arc<AtomicUsize>,
    }

    impl Parkable for Fake {
        fn poll_readable(&self, cx: &mut Context<'_>) -> Poll<()> {
            if self.ready {
                return Poll::Ready(());
            }
            *lock(&self.waker) = Some(cx.waker().clone());
            Poll::Pending
        }

        fn resume(self: Box<Self>) {
            self.resumed.fetch_add(1, SeqCst);
        }
    }

    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    #[test]
    fn a_parked_client_resumes_when_its_socket_wakes_and_only_then() {
        runtime().block_on(async {
            let fake = |ready: bool| {
                let waker = Arc::new(Mutex::new(None));
                let resumed = Arc::new(AtomicUsize::new(0));
                let f = Fake {
                    ready,
                    waker: waker.clone(),
                    resumed: resumed.clone(),
                };
                (Box::new(f), waker, resumed)
            };
            let (a, a_waker, a_resumed) = fake(false);
            park(a);
            settle().await;
            assert_eq!(a_resumed.load(SeqCst), 0, "parked until its socket wakes");
            let old = lock(&a_waker).clone().expect("a waker given to the socket");
            old.wake_by_ref();
            settle().await;
            assert_eq!(a_resumed.load(SeqCst), 1);
            // The slot goes to the next client; the first one's waker,
            // firing late, does not resume it.
            let (b, _b_waker, b_resumed) = fake(false);
            park(b);
            old.wake_by_ref();
            settle().await;
            assert_eq!((a_resumed.load(SeqCst), b_resumed.load(SeqCst)), (1, 0));
            // A client readable already is not parked at all.
            let (c, _, c_resumed) = fake(true);
            park(c);
            assert_eq!(c_resumed.load(SeqCst), 1);
        });
    }
}
