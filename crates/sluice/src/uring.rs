//! Sends batched across connections (issue 13). With epoll, each message a
//! worker relays is one `sendto`; the send wakes its peer (a PostgreSQL
//! backend, a client), and the scheduler preempts the worker when that
//! syscall returns to user space, once or more per transaction. Here a
//! write hands its bytes to the worker's io_uring, and the worker's
//! flusher task sends everything queued in one turn of the event loop
//! with one `io_uring_enter`: one return to user space for many sends
//! (measured at 150 clients: involuntary context switches 0.30 -> 0.05
//! per transaction, proxy CPU per transaction about -20 %). Reads stay on
//! tokio's epoll.
//!
//! A write (`poll_send`) copies the bytes into a buffer of the ring's and
//! reports them written; more bytes for the same socket before the
//! flusher runs join that buffer. A socket has one send in flight at
//! most: a write while its send is in the kernel waits (Pending) for the
//! completion, so bytes keep their order and a peer that does not read
//! stops its writer as a full socket did. A failed send is reported by
//! the socket's next write or flush. Writes that must not wait (a
//! farewell, a notice) go straight to the socket when nothing of its is
//! pending, as with epoll.
//!
//! A stream dropped while its send is queued or in flight gives its
//! socket to the ring, which closes it after the completion: a descriptor
//! number is never reused while the kernel may still send to it. Such a
//! send never waits for room: one still in the kernel after its submit
//! (its peer takes nothing) is cancelled, as closing the socket would
//! have cut it.
//!
//! Keys: a stream remembers its send by ring, slot and generation, and
//! every lookup also compares the socket's descriptor with the slot's
//! (two open sockets never share a number), so a key left over from an
//! old send can never name another socket's send.
//!
//! The ring is per worker thread (per-core runtime only: a task on the
//! shared runtime may change threads; the control thread writes
//! directly), made at the first send. A server moves between workers
//! only with nothing pending (`settled`, checked where a server goes back
//! to its pool and at the end of its login). `io_backend` chooses: auto
//! (io_uring if the kernel allows it), epoll or io_uring.

use std::cell::{Cell, RefCell};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU8, AtomicU16, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use io_uring::{IoUring, opcode, squeue, types};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::net::{TcpStream, UnixStream};

/// Submission queue entries per ring.
const ENTRIES: u32 = 1024;
/// Completion queue entries: room for every send of a large flush (the
/// kernel keeps completions beyond it until reaped).
const CQ_ENTRIES: u32 = 8192;
/// Bytes one write hands over at most (the rest is written next time).
const MAX_SEND: usize = 64 * 1024;
/// Slots that keep their buffer between sends (the first ones, which
/// are taken first), and the largest buffer kept: 1 MiB a worker at most.
const KEEP_SLOTS: usize = 64;
const KEEP_CAPACITY: usize = 16 * 1024;
/// Set in the `user_data` of what is not a send (the poll that waits for
/// room before a send, a cancel): its completion is not a send's.
const NOT_A_SEND: u64 = 1 << 63;

/// 0: not chosen yet (epoll), 1: epoll, 2: io_uring.
static BACKEND: AtomicU8 = AtomicU8::new(0);

fn builder() -> io_uring::Builder {
    let mut b = IoUring::builder();
    b.setup_cqsize(CQ_ENTRIES);
    b
}

/// Decides the backend once at startup: `Err` when io_uring is asked for
/// and cannot be had. Returns the line to log.
pub fn choose(
    wanted: sluice_config::IoBackend,
    runtime: sluice_config::RuntimeKind,
) -> Result<String, String> {
    use sluice_config::IoBackend;
    // A ring like the workers' (its size, its memory limits), the send
    // and poll operations, and fast poll (5.7: a send that waits for
    // room does not hold a kernel thread).
    let probe = || -> io::Result<()> {
        let ring = builder().build(ENTRIES)?;
        if !ring.params().is_feature_fast_poll() {
            return Err(io::Error::other("the kernel has no io_uring fast poll"));
        }
        let mut probe = io_uring::Probe::new();
        ring.submitter().register_probe(&mut probe)?;
        for (code, name) in [
            (opcode::Send::CODE, "send"),
            (opcode::PollAdd::CODE, "poll"),
        ] {
            if !probe.is_supported(code) {
                return Err(io::Error::other(format!("no io_uring {name} operation")));
            }
        }
        Ok(())
    };
    let per_core = runtime == sluice_config::RuntimeKind::PerCore;
    let (backend, line) = match wanted {
        IoBackend::Epoll => (1, "epoll (io_backend = epoll)".to_owned()),
        IoBackend::IoUring if !per_core => {
            return Err("io_backend = io_uring needs runtime = per_core".to_owned());
        }
        IoBackend::IoUring => match probe() {
            Ok(()) => (2, "io_uring".to_owned()),
            Err(e) => {
                return Err(format!(
                    "io_backend = io_uring, but io_uring is unavailable: {e}"
                ));
            }
        },
        IoBackend::Auto if !per_core => (1, "epoll (io_uring serves per_core workers)".to_owned()),
        IoBackend::Auto => match probe() {
            Ok(()) => (2, "io_uring (io_backend = auto)".to_owned()),
            Err(e) => (
                1,
                format!("epoll (io_backend = auto; io_uring unavailable: {e})"),
            ),
        },
    };
    BACKEND.store(backend, Ordering::Relaxed);
    Ok(line)
}

/// What SHOW CONFIG shows for `io_backend`: the backend in use.
pub fn in_use() -> &'static str {
    if BACKEND.load(Ordering::Relaxed) == 2 {
        "io_uring"
    } else {
        "epoll"
    }
}

/// A socket whose stream was dropped mid-send: held only to be closed
/// after its send.
#[expect(dead_code, reason = "held to keep the descriptor open, never read")]
pub enum Held {
    Tcp(TcpStream),
    Unix(UnixStream),
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum State {
    Free,
    /// Bytes waiting for the next flush (no entry in the kernel yet).
    Queued,
    /// In the kernel.
    Sending,
    /// Failed (`error`); kept until the socket's stream looks (or is
    /// dropped).
    Failed,
}

/// One send. A slot changes state in place: nothing moves when a send
/// is queued, submitted or done, and its buffer stays for the next send
/// (in the first `KEEP_SLOTS` slots).
struct Slot {
    state: State,
    /// The generation of the slot's current (or last) use.
    generation: u32,
    fd: RawFd,
    buf: Vec<u8>,
    /// Bytes of `buf` already sent.
    sent: usize,
    waker: Option<Waker>,
    /// The socket, once its stream was dropped: closed after the send.
    held: Option<Held>,
    error: Option<io::Error>,
}

impl Slot {
    fn new() -> Self {
        Slot {
            state: State::Free,
            generation: 0,
            fd: -1,
            buf: Vec::new(),
            sent: 0,
            waker: None,
            held: None,
            error: None,
        }
    }

    /// Empties slot `i`'s buffer, keeping its allocation only in the first
    /// `KEEP_SLOTS` slots and up to `KEEP_CAPACITY`.
    fn empty_buffer(&mut self, i: usize) {
        if i < KEEP_SLOTS && self.buf.capacity() <= KEEP_CAPACITY {
            self.buf.clear();
        } else {
            self.buf = Vec::new();
        }
    }
}

struct Ring {
    id: u16,
    /// The ring's descriptor, registered with the worker's event loop
    /// (readable when completions wait). Declared before `uring`, so it
    /// is deregistered before the ring closes.
    completions: AsyncFd<RawFdRef>,
    uring: IoUring,
    slots: Vec<Slot>,
    /// Free slots below `KEEP_SLOTS` (taken first: they have a buffer),
    /// and the others.
    free: Vec<u32>,
    free_high: Vec<u32>,
    /// Slots with bytes queued since the last flush.
    queued: Vec<u32>,
    /// Sends the submission queue had no room for: pushed at the next
    /// flush (slot, wait for room).
    retry: Vec<(u32, bool)>,
    /// Sends of dropped streams to cut short (their peer takes nothing):
    /// keys whose cancel did not fit in the submission queue.
    cancels: Vec<u64>,
    /// Sends of dropped streams put in the submission queue since the
    /// last submit: those still in the kernel after it are cancelled.
    held_pushed: Vec<u64>,
    flusher: Option<Waker>,
}

struct RawFdRef(RawFd);

impl AsRawFd for RawFdRef {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// How a flush ended.
enum Flushed {
    Done,
    /// More came meanwhile (completions that queue a send again).
    WorkLeft,
    /// The kernel refused the submit (EBUSY, ENOMEM…).
    Refused,
}

enum ThreadRing {
    Unknown,
    Off,
    On(Box<Ring>),
}

thread_local! {
    static RING: RefCell<ThreadRing> = const { RefCell::new(ThreadRing::Unknown) };
    static WORKER: Cell<bool> = const { Cell::new(false) };
}

/// Marks the calling thread as a per-core worker: only those get a ring.
pub fn worker_thread() {
    WORKER.with(|w| w.set(true));
}

static RINGS: AtomicU16 = AtomicU16::new(0);
const SLOT_MASK: u32 = (1 << 24) - 1;

/// A send's key: its ring (15 bits), its slot and the slot's generation
/// (24 bits each). Never 0 (generations start at 1); the top bit is
/// `NOT_A_SEND`'s.
fn key(ring: u16, slot: u32, generation: u32) -> u64 {
    (u64::from(ring & 0x7fff) << 48)
        | (u64::from(slot & SLOT_MASK) << 24)
        | u64::from(generation & SLOT_MASK)
}

/// (ring, slot, generation) of a key.
fn split(key: u64) -> (u16, usize, u32) {
    (
        (key >> 48) as u16,
        ((key >> 24) as u32 & SLOT_MASK) as usize,
        key as u32 & SLOT_MASK,
    )
}

/// Runs `f` on this thread's ring, made on first use; `None` when this
/// thread sends directly (epoll chosen, not a per-core worker, or the
/// ring could not be made).
fn with_ring<T>(f: impl FnOnce(&mut Ring) -> T) -> Option<T> {
    RING.try_with(|r| {
        let mut r = r.borrow_mut();
        if matches!(*r, ThreadRing::Unknown) {
            *r = match make_ring() {
                Some(ring) => ThreadRing::On(ring),
                None => ThreadRing::Off,
            };
        }
        match &mut *r {
            ThreadRing::On(ring) => Some(f(ring)),
            _ => None,
        }
    })
    .ok()
    .flatten()
}

/// Runs `f` on this thread's ring if it has one already.
fn with_existing<T>(f: impl FnOnce(&mut Ring) -> T) -> Option<T> {
    RING.try_with(|r| match &mut *r.borrow_mut() {
        ThreadRing::On(ring) => Some(f(ring)),
        _ => None,
    })
    .ok()
    .flatten()
}

fn make_ring() -> Option<Box<Ring>> {
    if BACKEND.load(Ordering::Relaxed) != 2 || !WORKER.with(Cell::get) {
        return None;
    }
    let handle = tokio::runtime::Handle::try_current().ok()?;
    let uring = match builder().build(ENTRIES) {
        Ok(u) => u,
        Err(e) => {
            tracing::warn!("io_uring on this worker failed ({e}); it sends with sendto");
            return None;
        }
    };
    // SAFETY: the descriptor is the ring's, which lives beside this
    // registration in the same `Ring` and is closed after it
    // (`completions` is declared before `uring`; fields drop in order).
    let completions = match unsafe {
        AsyncFd::register_with_interest(RawFdRef(uring.as_raw_fd()), Interest::READABLE)
    } {
        Ok(fd) => fd,
        Err(e) => {
            tracing::warn!(
                "io_uring completions cannot be watched ({e}); this worker sends with sendto"
            );
            return None;
        }
    };
    handle.spawn(flusher());
    Some(Box::new(Ring {
        id: (RINGS.fetch_add(1, Ordering::Relaxed) % 0x7fff) + 1,
        uring,
        completions,
        slots: Vec::new(),
        free: Vec::new(),
        free_high: Vec::new(),
        queued: Vec::new(),
        retry: Vec::new(),
        cancels: Vec::new(),
        held_pushed: Vec::new(),
        flusher: None,
    }))
}

impl Ring {
    /// The slot a key names, if it is this ring's, its generation is
    /// current and it is the send of socket `fd`.
    fn slot(&mut self, key: u64, fd: RawFd) -> Option<&mut Slot> {
        let (ring, i, generation) = split(key);
        if ring != self.id {
            return None;
        }
        self.slots
            .get_mut(i)
            .filter(|s| s.generation == generation && s.state != State::Free && s.fd == fd)
    }

    /// The slot of a send the ring submitted, by its key alone.
    fn sending(&mut self, key: u64) -> Option<&mut Slot> {
        let (ring, i, generation) = split(key);
        if ring != self.id {
            return None;
        }
        self.slots
            .get_mut(i)
            .filter(|s| s.generation == generation && s.state == State::Sending)
    }

    fn owns(&self, key: u64) -> bool {
        split(key).0 == self.id
    }

    /// Frees the slot (a held socket closes here).
    fn release(&mut self, i: usize) {
        let Some(s) = self.slots.get_mut(i) else {
            return;
        };
        if s.state == State::Free {
            return;
        }
        s.state = State::Free;
        s.sent = 0;
        s.waker = None;
        s.held = None;
        s.error = None;
        s.empty_buffer(i);
        if i < KEEP_SLOTS {
            self.free.push(i as u32);
        } else {
            self.free_high.push(i as u32);
        }
    }

    /// A Failed slot's error, the slot freed.
    fn take_error(&mut self, i: usize) -> io::Error {
        let error = self.slots.get_mut(i).and_then(|s| s.error.take());
        self.release(i);
        error.unwrap_or_else(|| io::Error::other("send failed"))
    }

    fn new_slot(&mut self, fd: RawFd, data: &[u8]) -> Option<u64> {
        let i = match self.free.pop().or_else(|| self.free_high.pop()) {
            Some(i) => i as usize,
            None => {
                let i = self.slots.len();
                if i > SLOT_MASK as usize {
                    return None;
                }
                self.slots.push(Slot::new());
                i
            }
        };
        let s = &mut self.slots[i];
        let generation = (s.generation.wrapping_add(1) & SLOT_MASK).max(1);
        s.generation = generation;
        s.state = State::Queued;
        s.fd = fd;
        s.buf.extend_from_slice(data);
        self.queued.push(i as u32);
        if self.queued.len() == 1
            && let Some(w) = self.flusher.take()
        {
            w.wake();
        }
        Some(key(self.id, i as u32, generation))
    }

    /// Puts the slot's remaining bytes in the submission queue (after a
    /// poll for room when `wait_for_room`); with no room there, the send
    /// waits for the next flush.
    fn push(&mut self, i: usize, wait_for_room: bool) {
        let id = self.id;
        let Some(s) = self.slots.get_mut(i).filter(|s| s.state == State::Sending) else {
            return;
        };
        let rest = &s.buf[s.sent..];
        let send = opcode::Send::new(types::Fd(s.fd), rest.as_ptr(), rest.len() as u32)
            .flags(libc::MSG_NOSIGNAL)
            .build()
            .user_data(key(id, i as u32, s.generation));
        let held = s.held.is_some().then(|| key(id, i as u32, s.generation));
        let pushed = if wait_for_room {
            let poll = opcode::PollAdd::new(types::Fd(s.fd), libc::POLLOUT as u32)
                .build()
                .flags(squeue::Flags::IO_LINK)
                .user_data(key(id, i as u32, s.generation) | NOT_A_SEND);
            // SAFETY: the bytes stay in the slot's buffer, neither moved
            // nor freed until the completion is reaped (a dropped
            // stream's socket is held there too). Both entries go in
            // together or not at all: a linked poll links to its send.
            unsafe { self.uring.submission().push_multiple(&[poll, send]) }.is_ok()
        } else {
            // SAFETY: as above.
            unsafe { self.uring.submission().push(&send) }.is_ok()
        };
        if !pushed {
            self.retry.push((i as u32, wait_for_room));
        } else if let Some(k) = held {
            self.held_pushed.push(k);
        }
    }

    /// Cuts short the send `key` names and the poll before it, if they
    /// are still in the kernel (the send of a dropped stream whose peer
    /// takes nothing: its socket is then closed, not held).
    fn cancel(&mut self, key: u64) {
        let entries = [key, key | NOT_A_SEND].map(|target| {
            opcode::AsyncCancel::new(target)
                .build()
                .user_data(NOT_A_SEND)
        });
        // SAFETY: a cancel refers to no memory.
        if unsafe { self.uring.submission().push_multiple(&entries) }.is_err() {
            self.cancels.push(key);
        }
    }

    /// Sends everything queued since the last flush, then reaps; sends
    /// that reaping queues again (the rest of a short send, or a wait for
    /// room) go in the same flush, a few rounds at most.
    fn flush(&mut self) -> Flushed {
        for _ in 0..4 {
            self.reap();
            for key in std::mem::take(&mut self.cancels) {
                self.cancel(key);
            }
            let retry = std::mem::take(&mut self.retry);
            for (i, wait) in retry {
                self.push(i as usize, wait);
            }
            let mut queued = std::mem::take(&mut self.queued);
            for &i in &queued {
                let i = i as usize;
                if let Some(s) = self.slots.get_mut(i)
                    && s.state == State::Queued
                {
                    s.state = State::Sending;
                    self.push(i, false);
                }
            }
            queued.clear();
            self.queued = queued;
            if let Err(e) = self.uring.submit() {
                tracing::debug!("io_uring submit: {e}");
                self.reap();
                return Flushed::Refused;
            }
            self.reap();
            // A dropped stream's send still in the kernel after its
            // submit waits for a peer that takes nothing: cut it short.
            for key in std::mem::take(&mut self.held_pushed) {
                if self.sending(key).is_some() {
                    self.cancel(key);
                }
            }
            if !self.has_work() {
                return Flushed::Done;
            }
        }
        Flushed::WorkLeft
    }

    /// Anything for the flusher: bytes queued, entries not submitted,
    /// sends waiting for room in the submission queue, completions.
    fn has_work(&mut self) -> bool {
        !self.queued.is_empty()
            || !self.retry.is_empty()
            || !self.cancels.is_empty()
            || !self.uring.submission().is_empty()
            || self.uring.submission().cq_overflow()
            || !self.uring.completion().is_empty()
    }

    /// Wakes the flusher if there is anything for it.
    fn kick(&mut self) {
        if self.has_work()
            && let Some(w) = self.flusher.take()
        {
            w.wake();
        }
    }

    /// Takes the completions the kernel posted.
    /// One at a time (no buffer to fill): a completion may push a send
    /// again, which needs the ring.
    fn reap(&mut self) {
        loop {
            let next = self.uring.completion().next();
            let Some(c) = next else { return };
            let data = c.user_data();
            if data & NOT_A_SEND == 0 {
                self.complete(data, c.result());
            }
        }
    }

    fn complete(&mut self, data: u64, result: i32) {
        let i = split(data).1;
        let Some(s) = self.sending(data) else {
            return;
        };
        let again = result == -libc::EAGAIN || result == -libc::ECANCELED || result == -libc::EINTR;
        if again && s.held.is_none() {
            // No room (the socket is nonblocking; the linked poll failed
            // or the send was cut short): wait for room, then send again.
            self.push(i, true);
            return;
        }
        if result <= 0 {
            let error = if result == 0 {
                io::Error::from(io::ErrorKind::WriteZero)
            } else {
                io::Error::from_raw_os_error(-result)
            };
            self.fail(i, error);
            return;
        }
        s.sent += result as usize;
        if s.sent < s.buf.len() {
            if s.held.is_some() {
                // Its stream is gone and the peer is slow: no waiting.
                self.release(i);
            } else {
                self.push(i, false);
            }
            return;
        }
        let waker = s.waker.take();
        // The held socket (if any) closes here, after its last send.
        self.release(i);
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// Ends the slot's send with `error`, kept for its stream (or the
    /// held socket is closed).
    fn fail(&mut self, i: usize, error: io::Error) {
        let Some(s) = self
            .slots
            .get_mut(i)
            .filter(|s| matches!(s.state, State::Sending | State::Queued))
        else {
            return;
        };
        let waker = s.waker.take();
        if s.held.is_some() {
            self.release(i);
        } else {
            s.state = State::Failed;
            s.error = Some(error);
            s.empty_buffer(i);
        }
        if let Some(w) = waker {
            w.wake();
        }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // The thread ends. Sends the kernel still holds read buffers
        // freed here: leak those instead.
        for slot in std::mem::take(&mut self.slots) {
            if slot.state == State::Sending {
                std::mem::forget(slot);
            }
        }
    }
}

/// Keeps the waker of the task that polls, cloning only when it changed.
fn set_waker(slot: &mut Option<Waker>, cx: &Context<'_>) {
    match slot {
        Some(w) if w.will_wake(cx.waker()) => {}
        _ => *slot = Some(cx.waker().clone()),
    }
}

fn moved() -> io::Error {
    io::Error::other("socket moved to another worker with a send in flight")
}

/// A plain socket's send state, kept by its stream: 0 when nothing is
/// queued or in flight, else the ring slot's key.
#[derive(Debug, Default)]
pub struct Sending(u64);

impl Sending {
    #[cfg(test)]
    pub fn key(&self) -> u64 {
        self.0
    }

    /// Nothing of this socket's is queued or in the kernel (after taking
    /// the completions posted). A socket that is not settled must not
    /// leave its thread.
    pub fn settled(&mut self, fd: RawFd) -> bool {
        if self.0 == 0 {
            return true;
        }
        let key = self.0;
        let busy = with_existing(|ring| {
            if !ring.owns(key) {
                return true;
            }
            // Most often the flusher reaped the send long ago (the
            // server has answered it since): its slot is free.
            if ring.slot(key, fd).is_none() {
                return false;
            }
            ring.reap();
            ring.kick();
            ring.slot(key, fd).is_some()
        })
        .unwrap_or(true);
        if !busy {
            self.0 = 0;
        }
        !busy
    }

    /// A write. `None`: this thread has no ring (write directly).
    pub fn poll_send(
        &mut self,
        fd: RawFd,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Option<Poll<io::Result<usize>>> {
        if data.is_empty() {
            return Some(Poll::Ready(Ok(0)));
        }
        let key = self.0;
        let sent = with_ring(|ring| {
            if key != 0 {
                if !ring.owns(key) {
                    return Poll::Ready(Err(moved()));
                }
                match ring.slot(key, fd) {
                    Some(s) if s.state == State::Queued => {
                        // Not in the kernel yet: the bytes join the queue.
                        let n = data.len().min(MAX_SEND.saturating_sub(s.buf.len()));
                        if n == 0 {
                            set_waker(&mut s.waker, cx);
                            return Poll::Pending;
                        }
                        s.buf.extend_from_slice(&data[..n]);
                        return Poll::Ready(Ok(n));
                    }
                    Some(s) if s.state == State::Sending => {
                        set_waker(&mut s.waker, cx);
                        return Poll::Pending;
                    }
                    Some(_) => {
                        self.0 = 0;
                        return Poll::Ready(Err(ring.take_error(split(key).1)));
                    }
                    None => self.0 = 0,
                }
            }
            let n = data.len().min(MAX_SEND);
            match ring.new_slot(fd, &data[..n]) {
                Some(k) => {
                    self.0 = k;
                    Poll::Ready(Ok(n))
                }
                None => Poll::Ready(Err(io::Error::other("too many sends queued"))),
            }
        });
        if sent.is_none() && key != 0 {
            // Bytes of this socket's wait on another thread's ring: a
            // direct write would pass them.
            return Some(Poll::Ready(Err(moved())));
        }
        sent
    }

    /// A write that must not wait, whole or not at all: after what is
    /// queued if the flusher has not run yet (all of `data` fits), else
    /// `None` when nothing is pending (write to the socket directly),
    /// else WouldBlock.
    pub fn try_send(&mut self, fd: RawFd, data: &[u8]) -> Option<io::Result<usize>> {
        if self.0 == 0 {
            return None;
        }
        let key = self.0;
        let outcome = with_existing(|ring| {
            if !ring.owns(key) {
                return Some(Err(moved()));
            }
            match ring.slot(key, fd) {
                Some(s) if s.state == State::Queued && s.buf.len() + data.len() <= MAX_SEND => {
                    s.buf.extend_from_slice(data);
                    Some(Ok(data.len()))
                }
                Some(s) if s.state != State::Failed => Some(Err(io::ErrorKind::WouldBlock.into())),
                Some(_) => Some(Err(ring.take_error(split(key).1))),
                None => None,
            }
        });
        match outcome {
            Some(Some(r)) => {
                if r.is_err() && !matches!(&r, Err(e) if e.kind() == io::ErrorKind::WouldBlock) {
                    self.0 = 0;
                }
                Some(r)
            }
            Some(None) => {
                self.0 = 0;
                None
            }
            None => Some(Err(moved())),
        }
    }

    /// Ready when everything written has gone to the kernel's socket.
    pub fn poll_flush(&mut self, fd: RawFd, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.0 == 0 {
            return Poll::Ready(Ok(()));
        }
        let key = self.0;
        let state = with_existing(|ring| {
            if !ring.owns(key) {
                return None;
            }
            Some(match ring.slot(key, fd) {
                Some(s) if s.state != State::Failed => {
                    set_waker(&mut s.waker, cx);
                    Poll::Pending
                }
                Some(_) => Poll::Ready(Err(ring.take_error(split(key).1))),
                None => Poll::Ready(Ok(())),
            })
        })
        .flatten();
        match state {
            Some(Poll::Pending) => Poll::Pending,
            Some(Poll::Ready(r)) => {
                self.0 = 0;
                Poll::Ready(r)
            }
            // The send is on another worker's ring (or this thread has
            // none): the key stays, so that dropping the stream does not
            // close the socket under it.
            None => Poll::Ready(Err(moved())),
        }
    }

    /// The stream is dropped: if its bytes are not all sent, the ring
    /// keeps the socket until they are (a send waiting for room is cut
    /// short). Gives the socket back when nothing is pending.
    pub fn hand_over(&mut self, fd: RawFd, socket: Held) -> Option<Held> {
        if self.0 == 0 {
            return Some(socket);
        }
        let key = std::mem::take(&mut self.0);
        let mut socket = Some(socket);
        let kept = with_existing(|ring| {
            if !ring.owns(key) {
                return None;
            }
            let i = split(key).1;
            match ring.slot(key, fd) {
                Some(s) if s.state == State::Queued => {
                    // Sent at the next flush (and cut short there if it
                    // does not go at once).
                    s.held = socket.take();
                    Some(true)
                }
                Some(s) if s.state == State::Sending => {
                    // In the kernel: it waits for room (a send with room
                    // is done within its submit). Its peer is not taking
                    // it: cut short, as closing the socket would.
                    s.held = socket.take();
                    ring.cancel(key);
                    ring.kick();
                    Some(true)
                }
                Some(_) => {
                    ring.release(i);
                    Some(false)
                }
                None => Some(false),
            }
        })
        .flatten();
        match kept {
            Some(true) => None,
            Some(false) => socket,
            None => {
                // A send of this socket's is on another thread's ring (a
                // bug: sockets leave their thread settled). Closing it
                // could let the kernel send to a reused descriptor.
                tracing::error!("a socket dropped with a send on another worker's ring: left open");
                std::mem::forget(socket);
                None
            }
        }
    }
}

/// The worker's flusher: sends what its tasks queued, once per turn of
/// the event loop (it is woken by the first queued send and runs after
/// the tasks already scheduled), and takes completions the kernel posts
/// later (a send that waited for room).
async fn flusher() {
    loop {
        let ready = std::future::poll_fn(|cx| {
            let state = with_existing(|ring| {
                // Polled until Pending, so that the ring's descriptor
                // always holds this task's waker: completions taken
                // meanwhile by another task (`settled`) leave readiness
                // without work, and a later completion must still wake
                // the flusher. The flush takes the completions.
                while let Poll::Ready(ready) = ring.completions.poll_read_ready(cx) {
                    match ready {
                        Ok(mut guard) => guard.clear_ready(),
                        Err(e) => {
                            tracing::warn!("io_uring completions: {e}");
                            break;
                        }
                    }
                }
                if ring.has_work() {
                    true
                } else {
                    ring.flusher = Some(cx.waker().clone());
                    false
                }
            });
            match state {
                Some(true) => Poll::Ready(true),
                Some(false) => Poll::Pending,
                // No ring: the thread ends.
                None => Poll::Ready(false),
            }
        })
        .await;
        if !ready {
            return;
        }
        match with_existing(Ring::flush) {
            Some(Flushed::Done) => {}
            // More to do: after the worker's other tasks.
            Some(Flushed::WorkLeft) => tokio::task::yield_now().await,
            // Refused: the worker's tasks run, and the flusher does not
            // spin on the refusal.
            Some(Flushed::Refused) => tokio::time::sleep(Duration::from_millis(1)).await,
            None => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::net::Stream;

    fn runtime() -> tokio::runtime::Runtime {
        BACKEND.store(2, Ordering::Relaxed);
        worker_thread();
        crate::test_support::runtime()
    }

    fn pair() -> (Stream, UnixStream) {
        let (a, b) = UnixStream::pair().expect("socket pair");
        (Stream::plain_unix(a), b)
    }

    fn busy_slots() -> usize {
        with_existing(|ring| ring.slots.iter().filter(|s| s.state != State::Free).count())
            .unwrap_or(0)
    }

    async fn settle() {
        crate::test_support::let_tasks_run(Duration::from_millis(2)).await;
    }

    /// Writes of all sizes, some joining a queued send, arrive whole and
    /// in order, through the ring.
    #[test]
    fn bytes_arrive_in_order() {
        runtime().block_on(async {
            let (mut ours, mut theirs) = pair();
            let reader = tokio::spawn(async move {
                let mut all = Vec::new();
                theirs.read_to_end(&mut all).await.expect("read");
                all
            });
            let mut sent = Vec::new();
            for i in 0..2000u32 {
                let chunk: Vec<u8> = (0..(i * 37) % 9000).map(|j| (i + j) as u8).collect();
                ours.write_all(&chunk).await.expect("write");
                sent.extend_from_slice(&chunk);
                if i % 7 == 0 {
                    tokio::task::yield_now().await;
                }
            }
            assert!(
                with_existing(|_| ()).is_some(),
                "the writes went through a ring"
            );
            ours.flush().await.expect("flush");
            drop(ours);
            let got = reader.await.expect("reader");
            assert_eq!(got.len(), sent.len());
            assert!(got == sent, "same bytes, same order");
            settle().await;
            assert_eq!(busy_slots(), 0);
        });
    }

    /// A peer that does not read stops its writer (Pending, no growth);
    /// once it reads, the writer goes on. Dropped while its send waits
    /// for room, the socket is shut down and its slot freed: no
    /// descriptor is held for a peer that never reads.
    #[test]
    fn a_peer_that_does_not_read_stops_its_writer_only() {
        runtime().block_on(async {
            let (mut ours, mut theirs) = pair();
            let big = vec![7u8; 8 << 20];
            let stalled =
                tokio::time::timeout(Duration::from_millis(300), ours.write_all(&big)).await;
            assert!(stalled.is_err(), "the writer waits for its peer");
            // Another socket on the same worker is not held up.
            let (mut other, mut other_peer) = pair();
            other.write_all(b"hello").await.expect("write");
            let mut five = [0u8; 5];
            tokio::time::timeout(Duration::from_secs(5), other_peer.read_exact(&mut five))
                .await
                .expect("the other socket's bytes go out")
                .expect("read");
            assert_eq!(&five, b"hello");
            // The peer reads a little: the writer goes on.
            let mut some = vec![0u8; 64 << 10];
            tokio::time::timeout(Duration::from_secs(5), theirs.read_exact(&mut some))
                .await
                .expect("what was sent arrives")
                .expect("read");
            assert!(some.iter().all(|&b| b == 7));
            let more = tokio::time::timeout(Duration::from_millis(300), ours.write_all(&big)).await;
            assert!(more.is_err(), "still more than the peer takes");
            drop(ours);
            settle().await;
            assert_eq!(busy_slots(), 0, "the stalled send was cut short");
            // The peer finds the end after what was sent.
            let mut rest = Vec::new();
            let end =
                tokio::time::timeout(Duration::from_secs(5), theirs.read_to_end(&mut rest)).await;
            assert!(end.is_ok(), "the peer sees the socket closed");
            drop(other);
        });
    }

    /// A stream's key left from an old send (its slot's generation has
    /// come round again, now another socket's queued send) names nothing:
    /// its bytes never join the other socket's.
    #[test]
    fn an_old_key_never_reaches_another_sockets_send() {
        runtime().block_on(async {
            let (mut a, mut a_peer) = pair();
            let (mut b, mut b_peer) = pair();
            a.write_all(b"A1;").await.expect("write");
            settle().await;
            let Stream::Unix(pa) = &a else { unreachable!() };
            let old = pa.sending_key();
            assert_ne!(old, 0, "a's key outlives its send");
            // b's send takes a's old slot, with a's old generation.
            b.write_all(b"B;").await.expect("write");
            let Stream::Unix(pb) = &b else { unreachable!() };
            let (_, slot_b, _) = split(pb.sending_key());
            let (_, slot_a, gen_a) = split(old);
            assert_eq!(slot_a, slot_b, "the slot was reused");
            with_existing(|ring| {
                ring.slots[slot_b].generation = gen_a;
            });
            a.write_all(b"A2;").await.expect("write");
            a.flush().await.expect("flush");
            b.flush().await.expect("flush");
            drop((a, b));
            let mut got_a = Vec::new();
            let mut got_b = Vec::new();
            a_peer.read_to_end(&mut got_a).await.expect("read");
            b_peer.read_to_end(&mut got_b).await.expect("read");
            assert_eq!(got_a, b"A1;A2;");
            assert_eq!(got_b, b"B;");
        });
    }

    /// A burst of sends on many sockets at once takes many slots; after
    /// it, only the first `KEEP_SLOTS` keep a buffer (what a worker keeps
    /// stays bounded), and the next send takes one of those.
    #[test]
    fn a_burst_leaves_a_bounded_keep() {
        runtime().block_on(async {
            let mut pairs: Vec<_> = (0..KEEP_SLOTS * 3).map(|_| pair()).collect();
            // One turn (no yield): every send is queued at once.
            for (i, (ours, _)) in pairs.iter_mut().enumerate() {
                ours.write_all(&vec![i as u8; 1000 + i])
                    .await
                    .expect("write");
            }
            for (i, (ours, theirs)) in pairs.iter_mut().enumerate() {
                ours.flush().await.expect("flush");
                let mut got = vec![0u8; 1000 + i];
                theirs.read_exact(&mut got).await.expect("read");
                assert!(got.iter().all(|&b| b == i as u8), "socket {i}'s own bytes");
            }
            settle().await;
            assert_eq!(busy_slots(), 0);
            let (slots, kept, high) = with_existing(|ring| {
                (
                    ring.slots.len(),
                    ring.slots.iter().map(|s| s.buf.capacity()).sum::<usize>(),
                    ring.slots[KEEP_SLOTS..]
                        .iter()
                        .map(|s| s.buf.capacity())
                        .sum::<usize>(),
                )
            })
            .expect("a ring");
            assert!(slots >= KEEP_SLOTS * 3, "the burst took a slot a socket");
            assert_eq!(high, 0, "slots past KEEP_SLOTS keep no buffer");
            assert!(kept <= KEEP_SLOTS * KEEP_CAPACITY);
            let (mut a, mut a_peer) = pair();
            a.write_all(b"after;").await.expect("write");
            let Stream::Unix(pa) = &a else { unreachable!() };
            assert!(split(pa.sending_key()).1 < KEEP_SLOTS, "a low slot first");
            a.flush().await.expect("flush");
            drop(a);
            let mut got = Vec::new();
            a_peer.read_to_end(&mut got).await.expect("read");
            assert_eq!(got, b"after;");
        });
    }

    /// A write that must not wait goes straight to the socket when
    /// nothing is pending, joins a queued send whole, and is refused
    /// (not cut) when it does not fit.
    #[test]
    fn writes_that_must_not_wait() {
        runtime().block_on(async {
            let (mut a, mut a_peer) = pair();
            a.try_write_once(b"direct;");
            assert_eq!(busy_slots(), 0, "nothing pending: written directly");
            a.write_all(b"queued;").await.expect("write");
            a.try_write_once(b"joined;");
            a.try_write_once(&vec![b'x'; MAX_SEND]);
            a.flush().await.expect("flush");
            drop(a);
            let mut got = Vec::new();
            a_peer.read_to_end(&mut got).await.expect("read");
            assert_eq!(got, b"direct;queued;joined;");
        });
    }
}
