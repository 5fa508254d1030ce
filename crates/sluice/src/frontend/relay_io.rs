//! One poll of the four directions of a linked client and server: write
//! what is scanned to each side, read what each side sent. Uses
//! `poll_read`/`poll_write`, which clear socket readiness after a short read
//! or write, so the next wait is a real wait and not a wasted `EAGAIN`
//! syscall. Returns as soon as anything moved; the caller scans and decides.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, BytesMut};
use tokio::io::AsyncWrite;
use tokio::time::Sleep;
use tokio_util::io::poll_read_buf;

use crate::net::Stream;

/// Bytes reserved for a read when the buffer has little room left.
pub const READ_CHUNK: usize = 8192;
/// Stop reading a side when this much is waiting to be written.
pub const BUFFER_LIMIT: usize = 256 * 1024;

/// What a poll produced.
#[derive(Debug)]
pub enum IoEvent {
    /// Bytes were read or written.
    Progress {
        client_read: bool,
    },
    ServerClosed,
    ServerFailed(io::Error),
    ClientGone,
    IdleTimeout,
    /// transaction_timeout: the client's transaction lasted too long.
    TransactionTimeout,
}

/// What one pass over the directions did.
enum Pass {
    /// Bytes moved; `read`: some were read (from either side),
    /// `client_read`: from the client; `client_flushed`: a write to the
    /// client took the last server bytes due to it (a message held until
    /// then, or sluice's own replies due after them, can go now: the
    /// relay must scan again).
    Moved {
        read: bool,
        client_read: bool,
        client_flushed: bool,
    },
    End(IoEvent),
}

/// Directions found blocked (Pending) since the task was last woken. The
/// relay loops within one poll of its task while bytes move, and a
/// socket's readiness cannot change before the task yields: polling a
/// blocked direction again would cost tokio's readiness check (a few
/// hundred instructions) for nothing, four times a transaction. Valid
/// only between two polls of `Sides` with no other wait in between: the
/// caller resets it after any other await, `Sides::poll` when it returns
/// Pending.
#[derive(Debug, Default, Clone, Copy)]
pub struct Blocked {
    server_write: bool,
    client_extra: bool,
    client_write: bool,
    server_read: bool,
    client_read: bool,
    /// The last pass that could read the client did not (see
    /// `Sides::poll_once`). Survives `clear`: the next such pass reads.
    client_skipped: bool,
}

impl Blocked {
    /// Every direction may be polled again (after a wake, or another
    /// await); a skipped client read stays owed.
    pub fn clear(&mut self) {
        *self = Blocked {
            client_skipped: self.client_skipped,
            ..Blocked::default()
        };
    }
}

/// The two sockets and their pending bytes.
pub struct Sides<'a> {
    pub client: &'a mut Stream,
    pub server: &'a mut Stream,
    /// Client bytes; the first `to_server` are scanned and due to the server.
    pub cbuf: &'a mut BytesMut,
    pub to_server: &'a mut usize,
    /// Server bytes; the first `to_client` are due to the client.
    pub sbuf: &'a mut BytesMut,
    pub to_client: &'a mut usize,
    pub read_client: bool,
    /// False when only the flush to the client remains before the server
    /// goes back (see `relay::run`).
    pub read_server: bool,
    /// Whether bytes written (none read) may change what the relay decides
    /// next (its end, its timers). False while replies are owed and the
    /// client is read as usual: the poll then goes on waiting after a
    /// write instead of returning, which saves the relay a turn of its loop
    /// (about 600 instructions) in every transaction. A write that takes
    /// the last bytes due to the client returns all the same (the scan
    /// holds a message back until then).
    pub writes_wake: bool,
    pub idle_timer: Option<Pin<&'a mut Sleep>>,
    /// transaction_timeout's deadline for the transaction under way.
    pub xact_timer: Option<Pin<&'a mut Sleep>>,
    /// Bytes written to the server and to the client (for SHOW STATS).
    pub written: &'a mut (u64, u64),
    /// With statement tracking: the rewritten bytes due to the server
    /// (instead of the first `to_server` bytes of `cbuf`).
    pub server_out: Option<&'a mut BytesMut>,
    /// With statement tracking: replies sluice wrote itself, due to the
    /// client before anything more of `sbuf`.
    pub client_extra: Option<&'a mut BytesMut>,
    /// Buffer lengths at which a message that must be held whole is
    /// complete (0: none): reading goes on past `BUFFER_LIMIT` until then.
    pub sbuf_wanted: usize,
    pub cbuf_wanted: usize,
    pub blocked: &'a mut Blocked,
}

/// Room for the next read: a chunk, or for a message held whole, room that
/// doubles with what has arrived but never passes what it still needs (so
/// a header announcing 64 MiB allocates nothing before the bytes come).
pub(super) fn reserve(buf: &mut BytesMut, wanted: usize) {
    if buf.capacity() - buf.len() >= 1024 {
        return;
    }
    let more = if wanted > buf.len() + READ_CHUNK {
        (wanted - buf.len()).min(buf.len().max(READ_CHUNK))
    } else {
        READ_CHUNK
    };
    buf.reserve(more);
}

impl Sides<'_> {
    /// Polls every enabled direction: returns when something was read (or
    /// written, with `writes_wake`), when a side ends or fails, or when a
    /// timer fires. (Inlined in both its callers: the relay's hot loop,
    /// and the rare pinned listener's; un-inlined, it cost the hot loop
    /// about 170 instructions a transaction.)
    #[inline(always)]
    pub fn poll(&mut self, cx: &mut Context<'_>) -> Poll<IoEvent> {
        loop {
            match self.poll_once(cx) {
                Poll::Ready(Pass::Moved {
                    read: false,
                    client_flushed: false,
                    ..
                }) if !self.writes_wake => {
                    // Writes only: what was cut short (a partial write) is
                    // polled again, and a direction found blocked is not.
                    continue;
                }
                Poll::Ready(Pass::Moved { client_read, .. }) => {
                    return Poll::Ready(IoEvent::Progress { client_read });
                }
                Poll::Ready(Pass::End(e)) => return Poll::Ready(e),
                Poll::Pending => break,
            }
        }
        if let Some(t) = self.idle_timer.as_mut()
            && t.as_mut().poll(cx).is_ready()
        {
            return Poll::Ready(IoEvent::IdleTimeout);
        }
        if let Some(t) = self.xact_timer.as_mut()
            && t.as_mut().poll(cx).is_ready()
        {
            return Poll::Ready(IoEvent::TransactionTimeout);
        }
        // The next poll follows a wake: every direction is looked at again.
        self.blocked.clear();
        Poll::Pending
    }

    /// One pass over the enabled directions; `Pending`: nothing moved.
    #[inline(always)]
    fn poll_once(&mut self, cx: &mut Context<'_>) -> Poll<Pass> {
        let mut moved = false;
        let mut client_read = false;
        let mut server_read = false;
        let mut client_flushed = false;
        // Only the flush of the last replies remains (see `read_server`).
        let flush_only = !self.read_server
            && (*self.to_client > 0 || self.client_extra.as_deref().is_some_and(|e| !e.is_empty()));
        if *self.to_server > 0 && !self.blocked.server_write {
            let (source, due) = match self.server_out.as_deref_mut() {
                Some(out) => (out, usize::MAX),
                None => (&mut *self.cbuf, *self.to_server),
            };
            let due = due.min(source.len());
            match Pin::new(&mut *self.server).poll_write(cx, &source[..due]) {
                Poll::Ready(Ok(n)) => {
                    source.advance(n);
                    *self.to_server -= n;
                    self.written.0 += n as u64;
                    moved = true;
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Pass::End(IoEvent::ServerFailed(e))),
                Poll::Pending => self.blocked.server_write = true,
            }
        }
        let mut extra_pending = false;
        if let Some(extra) = self.client_extra.as_deref_mut()
            && !extra.is_empty()
            && !self.blocked.client_extra
        {
            match Pin::new(&mut *self.client).poll_write(cx, extra) {
                Poll::Ready(Ok(n)) => {
                    extra.advance(n);
                    self.written.1 += n as u64;
                    moved = true;
                }
                Poll::Ready(Err(_)) => return Poll::Ready(Pass::End(IoEvent::ClientGone)),
                Poll::Pending => self.blocked.client_extra = true,
            }
        }
        if let Some(extra) = self.client_extra.as_deref() {
            extra_pending = !extra.is_empty();
        }
        if *self.to_client > 0 && !extra_pending && !self.blocked.client_write {
            match Pin::new(&mut *self.client).poll_write(cx, &self.sbuf[..*self.to_client]) {
                Poll::Ready(Ok(n)) => {
                    self.sbuf.advance(n);
                    *self.to_client -= n;
                    self.written.1 += n as u64;
                    moved = true;
                    client_flushed = *self.to_client == 0;
                }
                Poll::Ready(Err(_)) => return Poll::Ready(Pass::End(IoEvent::ClientGone)),
                Poll::Pending => self.blocked.client_write = true,
            }
        }
        if self.read_server
            && self.sbuf.len() < BUFFER_LIMIT.max(self.sbuf_wanted)
            && !self.blocked.server_read
        {
            reserve(self.sbuf, self.sbuf_wanted);
            match poll_read_buf(Pin::new(&mut *self.server), cx, self.sbuf) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Pass::End(IoEvent::ServerClosed)),
                Poll::Ready(Ok(_)) => {
                    moved = true;
                    server_read = true;
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Pass::End(IoEvent::ServerFailed(e))),
                Poll::Pending => self.blocked.server_read = true,
            }
        }
        // Stop reading a client whose bytes the server has not taken yet,
        // or that does not read sluice's own replies.
        let waiting_for_server = match self.server_out.as_deref() {
            Some(out) => out.len(),
            None => self.cbuf.len(),
        };
        let unread_replies = self.client_extra.as_deref().map_or(0, BytesMut::len);
        // With tracking, `cbuf` holds what is not rewritten yet: more is
        // read only while it is short, or a message held whole needs it.
        let unrewritten_full =
            self.server_out.is_some() && self.cbuf.len() >= BUFFER_LIMIT.max(self.cbuf_wanted);
        // A pass that read the server, or one that only flushes the last
        // replies (`flush_only`) and is not stalled, does not read the
        // client: the
        // relay scans first, and most often ends, and the session reads
        // the client next. The pass after a skip that read the server
        // reads the client, so it is never left unread while the relay
        // waits on anything else. This saves a readiness check that comes
        // back Pending (tokio's registration, about 200 instructions) in
        // every transaction; the client's registration from the earlier
        // pass still stands, and data it brought stays ready for the read.
        let may_read_client = self.read_client
            && waiting_for_server < BUFFER_LIMIT
            && unread_replies < BUFFER_LIMIT
            && !unrewritten_full
            && !self.blocked.client_read;
        // A flush that stalls (the client does not read) reads the client
        // again: a client that writes without reading (a large COPY
        // pipelined behind a large reply) must not block on a sluice that
        // waits for it to read, and its Terminate or close is seen.
        let flush_skips = flush_only && !self.blocked.client_write && !self.blocked.client_extra;
        let skip_client = flush_skips || (server_read && !self.blocked.client_skipped);
        if may_read_client {
            self.blocked.client_skipped = skip_client;
        }
        if may_read_client && !skip_client {
            reserve(self.cbuf, self.cbuf_wanted);
            match poll_read_buf(Pin::new(&mut *self.client), cx, self.cbuf) {
                Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => {
                    return Poll::Ready(Pass::End(IoEvent::ClientGone));
                }
                Poll::Ready(Ok(_)) => {
                    moved = true;
                    client_read = true;
                }
                Poll::Pending => self.blocked.client_read = true,
            }
        }
        if moved {
            return Poll::Ready(Pass::Moved {
                read: client_read || server_read,
                client_read,
                client_flushed,
            });
        }
        Poll::Pending
    }
}
