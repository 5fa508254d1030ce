//! LISTEN in transaction mode. A client's LISTEN cannot stay on a pooled
//! server: the server goes to other clients after the transaction. So each
//! pool keeps one extra server connection of its own that LISTENs to every
//! channel some client of the pool listens to, and hands each notification
//! to those clients, which write it when they are between transactions
//! (where PostgreSQL itself delivers them). NOTIFY needs nothing special:
//! PostgreSQL sends to listeners after commit, never on rollback.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use sluice_wire::{Reader, tags};
use tokio::io::AsyncWriteExt;
use tokio::sync::{Notify, mpsc, oneshot};

use super::login;
use super::target::{ServerCredential, ServerTarget};
use crate::codec::read_message;

/// What the hub needs of the pool that owns it (the hub knows the pool
/// only through this: the pool holds the hub, not the other way round).
pub trait HubOwner: Send + Sync + 'static {
    fn hub(&self) -> &NotifyHub;
    fn database(&self) -> &str;
    /// Where and as whom the hub's own server connection logs in.
    fn target_and_credential(&self) -> (Arc<ServerTarget>, ServerCredential);
}

/// Notifications queued for one client that is busy or slow to read;
/// beyond this the hub waits for room (`DELIVER_WAIT`).
pub const CLIENT_QUEUE: usize = 4096;
/// Their bytes, at most (review 47: 4,096 notifications of 8 KB, 34 MB a
/// client that does not read, made ten such clients cost 350 MB); one
/// notification always fits an empty queue.
pub const CLIENT_QUEUE_BYTES: usize = 1 << 20;
/// How long the hub waits for room in a client's full queue before it
/// drops the notification for that client: a burst larger than the queue
/// reaches a client that reads (its task drains the queue while the hub
/// waits; before, 10,000 notifications of one transaction reached a
/// reading listener as 4,096). One that does not read costs the other
/// listeners this wait once: it is then `lagging`, gets what fits without
/// waiting, and is waited for again only once it has read its whole
/// queue (so a client reading slowly on purpose holds the hub at most
/// this long for every `CLIENT_QUEUE` notifications it reads). The wait is
/// one for all the full queues of a notification.
const DELIVER_WAIT: Duration = Duration::from_millis(100);
/// How often a delivery waiting for room in a queue full of bytes looks
/// again.
const ROOM_POLL: Duration = Duration::from_millis(1);
/// How long a LISTEN waits for the hub to listen before it goes on.
const SUBSCRIBE_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause before the hub connects again after its server failed.
const RECONNECT_DELAY: Duration = Duration::from_millis(500);
/// Largest message the hub reads (a notification payload is < 8000 bytes).
const MESSAGE_LIMIT: usize = 1 << 20;

/// A client's queue of notifications (`mailbox`), bounded in count and
/// in bytes: the hub's end.
#[derive(Clone)]
pub struct Outbox {
    tx: mpsc::Sender<Bytes>,
    queued: Arc<AtomicUsize>,
}

/// The client's end.
pub struct Inbox {
    rx: mpsc::Receiver<Bytes>,
    queued: Arc<AtomicUsize>,
}

/// A new queue for one listening client.
pub fn mailbox() -> (Outbox, Inbox) {
    let (tx, rx) = mpsc::channel(CLIENT_QUEUE);
    let queued = Arc::new(AtomicUsize::new(0));
    (
        Outbox {
            tx,
            queued: queued.clone(),
        },
        Inbox { rx, queued },
    )
}

impl Outbox {
    /// Queues `message` if it fits in count and in bytes.
    fn try_send(&self, message: Bytes) -> Result<(), mpsc::error::TrySendError<Bytes>> {
        if self.tx.is_closed() {
            return Err(mpsc::error::TrySendError::Closed(message));
        }
        let len = message.len();
        let before = self.queued.fetch_add(len, Ordering::AcqRel);
        if before > 0 && before + len > CLIENT_QUEUE_BYTES {
            self.queued.fetch_sub(len, Ordering::AcqRel);
            return Err(mpsc::error::TrySendError::Full(message));
        }
        self.tx.try_send(message).inspect_err(|_| {
            self.queued.fetch_sub(len, Ordering::AcqRel);
        })
    }

    /// Queues `message`, waiting for room until `deadline`: whether it
    /// was queued (or the client is gone).
    async fn send_by(&self, message: Bytes, deadline: tokio::time::Instant) -> bool {
        loop {
            match self.try_send(message.clone()) {
                Ok(()) | Err(mpsc::error::TrySendError::Closed(_)) => return true,
                Err(mpsc::error::TrySendError::Full(_)) => {}
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(ROOM_POLL).await;
        }
    }

    /// Nothing is queued.
    fn drained(&self) -> bool {
        self.queued.load(Ordering::Acquire) == 0 && self.tx.capacity() == self.tx.max_capacity()
    }
}

impl Inbox {
    pub async fn recv(&mut self) -> Option<Bytes> {
        let message = self.rx.recv().await?;
        self.queued.fetch_sub(message.len(), Ordering::AcqRel);
        Some(message)
    }

    pub fn try_recv(&mut self) -> Result<Bytes, mpsc::error::TryRecvError> {
        let message = self.rx.try_recv()?;
        self.queued.fetch_sub(message.len(), Ordering::AcqRel);
        Ok(message)
    }
}

/// One listening client.
#[derive(Clone)]
struct Subscriber {
    id: u64,
    tx: Outbox,
}

#[derive(Default)]
struct HubState {
    /// Channel → its listeners.
    channels: HashMap<String, Vec<Subscriber>>,
    /// Client → the channels it is among the listeners of.
    by_client: HashMap<u64, HashSet<String>>,
    /// Channels the hub's server listens to now.
    listening: HashSet<String>,
    /// Channels whose UNLISTEN is on its way to the hub's server: a client
    /// subscribing to one waits for it to be listened to again (review
    /// 49).
    unlistening: HashSet<String>,
    /// Channels whose listeners changed since the hub's server was last
    /// brought in line (review 47: looking at every channel at every
    /// change made LISTEN quadratic, 2.6 ms of CPU for a LISTEN and
    /// UNLISTEN with 15,000 channels listened to).
    dirty: HashSet<String>,
    /// Waiting for the hub to listen to a channel.
    confirm: Vec<(String, oneshot::Sender<()>)>,
    running: bool,
    /// Clients whose queue stayed full for `DELIVER_WAIT`: not waited for
    /// again until one of their notifications fits.
    lagging: HashSet<u64>,
}

/// The LISTEN fan-out of one pool.
#[derive(Default)]
pub struct NotifyHub {
    state: Mutex<HubState>,
    changed: Notify,
}

impl NotifyHub {
    fn lock(&self) -> std::sync::MutexGuard<'_, HubState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds client `id` to `channel` and waits (bounded) until the hub's
    /// server listens to it, so that a NOTIFY sent after the client's
    /// LISTEN returned reaches it.
    pub async fn subscribe(&self, pool: &Arc<impl HubOwner>, id: u64, tx: &Outbox, channel: &str) {
        let wait = {
            let mut st = self.lock();
            let subs = st.channels.entry(channel.to_owned()).or_default();
            if !subs.iter().any(|s| s.id == id) {
                subs.push(Subscriber { id, tx: tx.clone() });
                st.by_client
                    .entry(id)
                    .or_default()
                    .insert(channel.to_owned());
            }
            if st.listening.contains(channel) && !st.unlistening.contains(channel) {
                None
            } else {
                st.dirty.insert(channel.to_owned());
                let (done, wait) = oneshot::channel();
                st.confirm.push((channel.to_owned(), done));
                if !st.running {
                    st.running = true;
                    let owner: Arc<dyn HubOwner> = pool.clone();
                    tokio::spawn(run(Arc::downgrade(&owner)));
                }
                Some(wait)
            }
        };
        self.changed.notify_one();
        if let Some(wait) = wait
            && tokio::time::timeout(SUBSCRIBE_TIMEOUT, wait).await.is_err()
        {
            tracing::warn!(db = %pool.database(), channel, "LISTEN: the pool's listening connection is not ready; notifications may be missed");
            // (the client is told too, as when the connection is lost:
            // review 51)
            let _ = tx.try_send(lost_notice("it did not listen within 10 s"));
        }
    }

    /// Removes client `id` from `channel`, or from every channel.
    pub fn unsubscribe(&self, id: u64, channel: Option<&str>) {
        {
            let mut st = self.lock();
            let st = &mut *st;
            let names: Vec<String> = match channel {
                Some(c) => {
                    let mine = st.by_client.get_mut(&id).is_some_and(|m| m.remove(c));
                    if st.by_client.get(&id).is_some_and(HashSet::is_empty) {
                        st.by_client.remove(&id);
                    }
                    match mine {
                        true => vec![c.to_owned()],
                        false => Vec::new(),
                    }
                }
                None => {
                    st.lagging.remove(&id);
                    st.by_client
                        .remove(&id)
                        .map(|m| m.into_iter().collect())
                        .unwrap_or_default()
                }
            };
            for name in names {
                let Some(subs) = st.channels.get_mut(&name) else {
                    continue;
                };
                subs.retain(|s| s.id != id);
                if subs.is_empty() {
                    st.channels.remove(&name);
                    st.dirty.insert(name);
                }
            }
        }
        self.changed.notify_one();
    }

    /// The hub's server listens to nothing (lost, or not logged in yet):
    /// every wanted channel is to be listened to again.
    fn not_listening(&self) {
        let mut st = self.lock();
        st.listening.clear();
        st.unlistening.clear();
        let all: Vec<String> = st.channels.keys().cloned().collect();
        st.dirty.extend(all);
    }

    /// Hands `message` (a NoticeResponse) to every listening client once,
    /// without waiting.
    fn tell_all(&self, message: &Bytes) {
        let st = self.lock();
        let mut told = HashSet::new();
        for sub in st.channels.values().flatten() {
            if told.insert(sub.id) {
                let _ = sub.tx.try_send(message.clone());
            }
        }
    }

    /// Hands `message` to the channel's listeners, waiting for room in a
    /// full queue at most `DELIVER_WAIT` (see there).
    async fn deliver(&self, message: Bytes) {
        use mpsc::error::TrySendError;
        let Some(channel) = notification_channel(&message) else {
            return;
        };
        let full: Vec<Subscriber> = {
            let mut st = self.lock();
            let HubState {
                channels, lagging, ..
            } = &mut *st;
            let Some(subs) = channels.get(channel) else {
                return;
            };
            let mut full = Vec::new();
            for sub in subs {
                if !lagging.is_empty() && sub.tx.drained() {
                    lagging.remove(&sub.id);
                }
                match sub.tx.try_send(message.clone()) {
                    Ok(()) => {}
                    Err(TrySendError::Full(_)) if !lagging.contains(&sub.id) => {
                        full.push(sub.clone());
                    }
                    Err(TrySendError::Full(_)) => {
                        tracing::debug!(channel, "notification dropped for a lagging client");
                    }
                    Err(TrySendError::Closed(_)) => {}
                }
            }
            full
        };
        // One deadline for all: many full queues cost one wait, not one
        // each (review 28: 100 non-reading listeners held the hub 10 s).
        // A send that fits at once still goes after it (the timeout polls
        // it first).
        let deadline = tokio::time::Instant::now() + DELIVER_WAIT;
        for sub in full {
            if !sub.tx.send_by(message.clone(), deadline).await {
                self.lock().lagging.insert(sub.id);
                tracing::warn!(
                    channel,
                    "a listening client does not read its notifications: those that do not fit \
                     its queue ({CLIENT_QUEUE}, {CLIENT_QUEUE_BYTES} bytes) are dropped until it \
                     has read them all"
                );
            }
        }
    }
}

/// The warning every listening client gets when the hub's connection is
/// lost: what is notified until it listens again is lost, and a client
/// connected to PostgreSQL itself would have seen its connection end.
fn lost_notice(why: &str) -> Bytes {
    let mut out = BytesMut::new();
    sluice_wire::ErrorFields::new(
        sluice_wire::Severity::Warning,
        "01000",
        &format!(
            "sluice's LISTEN connection for this database was lost ({why}): notifications \
             sent until it listens again may be missed"
        ),
    )
    .encode(&mut out);
    out.freeze()
}

/// The channel of a NotificationResponse (whole message).
/// The channel a NotificationResponse names.
pub fn notification_channel(message: &[u8]) -> Option<&str> {
    let mut r = Reader::new(message.get(sluice_wire::HEADER_LEN..)?);
    r.i32().ok()?;
    r.cstr().ok()
}

fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// The hub's task: keeps a server connection listening to the wanted
/// channels and fans out what it receives; ends when nobody listens.
async fn run(pool: Weak<dyn HubOwner>) {
    loop {
        let Some(p) = pool.upgrade() else { return };
        let (target, credential) = p.target_and_credential();
        let opened = login::open(&target, &credential).await;
        let mut server = match opened {
            Ok((server, _)) => server,
            Err(e) => {
                tracing::warn!(db = %p.database(), "LISTEN connection failed: {e}");
                p.hub().not_listening();
                if stop_if_unused(&*p) {
                    return;
                }
                drop(p);
                tokio::time::sleep(RECONNECT_DELAY).await;
                continue;
            }
        };
        p.hub().not_listening();
        drop(p);
        match serve(&pool, &mut server).await {
            Served::Unused => return,
            Served::Failed(why) => {
                tracing::warn!("LISTEN connection lost: {why}; reconnecting");
                if let Some(p) = pool.upgrade() {
                    // (nothing listens until the hub is back: a LISTEN
                    // meanwhile waits for it, review 51)
                    p.hub().not_listening();
                    p.hub().tell_all(&lost_notice(&why));
                }
                tokio::time::sleep(RECONNECT_DELAY).await;
            }
        }
    }
}

enum Served {
    Unused,
    Failed(String),
}

/// Marks the hub stopped if no client listens; true if so.
fn stop_if_unused(pool: &dyn HubOwner) -> bool {
    let mut st = pool.hub().lock();
    if st.channels.is_empty() {
        st.running = false;
        st.listening.clear();
        st.unlistening.clear();
        st.dirty.clear();
        for (_, done) in st.confirm.drain(..) {
            drop(done);
        }
        return true;
    }
    false
}

async fn serve(pool: &Weak<dyn HubOwner>, server: &mut super::server::ServerConn) -> Served {
    loop {
        let Some(p) = pool.upgrade() else {
            return Served::Unused;
        };
        if stop_if_unused(&*p) {
            return Served::Unused;
        }
        // Bring the server's LISTENs in line with the wanted channels: one
        // query each, so that a channel PostgreSQL refuses costs no other.
        // (only the channels whose listeners changed: `dirty`)
        let ops: Vec<(String, bool)> = {
            let mut st = p.hub().lock();
            let st = &mut *st;
            let ops: Vec<(String, bool)> = st
                .dirty
                .drain()
                .filter_map(
                    |c| match (st.channels.contains_key(&c), st.listening.contains(&c)) {
                        (true, false) => Some((c, true)),
                        (false, true) => Some((c, false)),
                        _ => None,
                    },
                )
                .collect();
            for (name, listen) in &ops {
                if !listen {
                    st.unlistening.insert(name.clone());
                }
            }
            ops
        };
        if !ops.is_empty() {
            let statements: Vec<String> = ops
                .iter()
                .map(|(name, listen)| match listen {
                    true => format!("LISTEN {}", quote_ident(name)),
                    false => format!("UNLISTEN {}", quote_ident(name)),
                })
                .collect();
            let done = match query_each(&*p, server, &statements).await {
                Ok(done) => done,
                Err(e) => return Served::Failed(e),
            };
            let mut st = p.hub().lock();
            for ((name, listen), ok) in ops.into_iter().zip(done) {
                match (listen, ok) {
                    (true, true) => {
                        st.listening.insert(name);
                    }
                    // Refused: its listeners hear nothing (their own
                    // server refused it too), and it is not asked again.
                    (true, false) => {
                        if let Some(subs) = st.channels.remove(&name) {
                            for sub in subs {
                                if let Some(mine) = st.by_client.get_mut(&sub.id) {
                                    mine.remove(&name);
                                }
                            }
                        }
                    }
                    (false, _) => {
                        st.listening.remove(&name);
                        st.unlistening.remove(&name);
                        // (a client subscribed while the UNLISTEN was
                        // on its way: listen again)
                        if st.channels.contains_key(&name) {
                            st.dirty.insert(name);
                        }
                    }
                }
            }
            let confirm = std::mem::take(&mut st.confirm);
            for (channel, done) in confirm {
                if st.listening.contains(&channel) {
                    let _ = done.send(());
                } else if st.channels.contains_key(&channel) {
                    st.confirm.push((channel, done));
                }
            }
            continue;
        }
        let changed = p.hub().changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        tokio::select! {
            _ = &mut changed => {}
            read = read_message(&mut server.stream, &mut server.buf, MESSAGE_LIMIT) => {
                match read {
                    Ok((tag, body)) => on_message(&*p, tag, body).await,
                    Err(e) => return Served::Failed(e.to_string()),
                }
            }
        }
    }
}

async fn on_message(pool: &dyn HubOwner, tag: u8, body: BytesMut) {
    if tag == tags::backend::NOTIFICATION_RESPONSE {
        let mut message = BytesMut::with_capacity(body.len() + sluice_wire::HEADER_LEN);
        sluice_wire::MessageBuilder::new(&mut message, tag)
            .bytes(&body)
            .finish();
        pool.hub().deliver(message.freeze()).await;
    }
}

/// Runs `sql` on the hub's server, delivering notifications that arrive
/// meanwhile.
/// Runs each statement as its own query (sent in one write): whether each
/// succeeded. Notifications that arrive meanwhile are handed on.
async fn query_each(
    pool: &dyn HubOwner,
    server: &mut super::server::ServerConn,
    statements: &[String],
) -> Result<Vec<bool>, String> {
    let mut out = BytesMut::new();
    for sql in statements {
        sluice_wire::encode_query(&mut out, sql);
    }
    server
        .stream
        .write_all(&out)
        .await
        .map_err(|e| e.to_string())?;
    let deadline = Duration::from_secs(30);
    let mut done = Vec::with_capacity(statements.len());
    let mut failed = false;
    while done.len() < statements.len() {
        let read = tokio::time::timeout(
            deadline,
            read_message(&mut server.stream, &mut server.buf, MESSAGE_LIMIT),
        )
        .await
        .map_err(|_| "LISTEN timed out".to_string())?;
        let (tag, body) = read.map_err(|e| e.to_string())?;
        match tag {
            tags::backend::READY_FOR_QUERY => done.push(!std::mem::take(&mut failed)),
            tags::backend::ERROR_RESPONSE => {
                failed = true;
                let why = sluice_wire::ErrorFields::decode(&body)
                    .map(|f| f.message.to_owned())
                    .unwrap_or_default();
                tracing::warn!(db = %pool.database(), "LISTEN connection: {why}");
            }
            _ => on_message(pool, tag, body).await,
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn note(len: usize) -> Bytes {
        Bytes::from(vec![b'A'; len])
    }

    #[tokio::test]
    async fn a_queue_is_bounded_in_bytes_and_frees_what_is_read() {
        let (tx, mut rx) = mailbox();
        // One notification always fits an empty queue, whatever its size.
        tx.try_send(note(CLIENT_QUEUE_BYTES + 1)).expect("first");
        assert!(tx.try_send(note(1)).is_err(), "over the byte bound");
        assert_eq!(
            rx.recv().await.map(|b| b.len()),
            Some(CLIENT_QUEUE_BYTES + 1)
        );
        assert!(tx.drained());
        for _ in 0..CLIENT_QUEUE_BYTES / 8192 {
            tx.try_send(note(8192)).expect("fits");
        }
        assert!(tx.try_send(note(8192)).is_err(), "1 MiB held");
        rx.try_recv().expect("one read");
        tx.try_send(note(8192)).expect("room again");
        // A wait for room ends when the client reads, or at its deadline.
        let deadline = tokio::time::Instant::now() + Duration::from_millis(20);
        assert!(!tx.send_by(note(8192), deadline).await, "nobody read");
        let reader = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(5)).await;
            rx.try_recv().expect("read");
            rx
        });
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        assert!(tx.send_by(note(8192), deadline).await, "room made");
        drop(reader.await);
        // A client gone takes nothing and holds nothing.
        assert!(tx.send_by(note(8192), deadline).await);
    }
}
