//! One stream type for TCP, TLS over TCP and Unix-domain sockets, on both
//! sides, so the session loop is written once and dispatches with a match,
//! not a vtable.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};

use crate::tls::TlsConn;

/// TCP keepalive as `tcp_keepalive`, `tcp_keepidle`, `tcp_keepintvl` and
/// `tcp_keepcnt` ask (0 = the kernel's default for that knob), and the
/// other per-connection socket options: `tcp_user_timeout` (ms) and
/// `tcp_socket_buffer` (bytes, both directions); 0 keeps the kernel's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Keepalive {
    pub enabled: bool,
    pub idle_secs: u32,
    pub interval_secs: u32,
    pub count: u32,
    pub user_timeout_ms: u32,
    pub socket_buffer: u32,
}

impl Keepalive {
    pub fn from_settings(s: &sluice_config::Settings) -> Self {
        Self {
            enabled: s.tcp_keepalive,
            idle_secs: s.tcp_keepidle,
            interval_secs: s.tcp_keepintvl,
            count: s.tcp_keepcnt,
            user_timeout_ms: s.tcp_user_timeout,
            socket_buffer: s.tcp_socket_buffer,
        }
    }

    /// Applies to a TCP socket; failures are logged, not fatal.
    pub fn apply(&self, stream: &TcpStream) {
        let sock = socket2::SockRef::from(stream);
        if self.user_timeout_ms > 0
            && let Err(e) = sock.set_tcp_user_timeout(Some(std::time::Duration::from_millis(
                self.user_timeout_ms.into(),
            )))
        {
            tracing::debug!("tcp_user_timeout: {e}");
        }
        if self.socket_buffer > 0 {
            let size = self.socket_buffer as usize;
            if let Err(e) = sock
                .set_send_buffer_size(size)
                .and_then(|()| sock.set_recv_buffer_size(size))
            {
                tracing::debug!("tcp_socket_buffer: {e}");
            }
        }
        if !self.enabled {
            return;
        }
        let mut ka = socket2::TcpKeepalive::new();
        if self.idle_secs > 0 {
            ka = ka.with_time(std::time::Duration::from_secs(self.idle_secs.into()));
        }
        if self.interval_secs > 0 {
            ka = ka.with_interval(std::time::Duration::from_secs(self.interval_secs.into()));
        }
        if self.count > 0 {
            ka = ka.with_retries(self.count);
        }
        if let Err(e) = sock.set_tcp_keepalive(&ka) {
            tracing::debug!("tcp keepalive: {e}");
        }
    }
}

/// A plain socket (TCP or Unix) and its sends through the worker's
/// io_uring (`uring`; writes go there when the worker has one, else
/// straight to the socket). Dropped with a send not done, it hands the
/// socket to the ring, which closes it after the send.
#[derive(Debug)]
pub struct Plain<S: Plainly> {
    socket: std::mem::ManuallyDrop<S>,
    sending: crate::uring::Sending,
}

/// What `Plain` wraps: a tokio socket the ring can hold.
pub trait Plainly: AsyncWrite + std::os::fd::AsRawFd + Unpin + Sized {
    fn held(self) -> crate::uring::Held;
    fn try_write_now(&self, buf: &[u8]) -> io::Result<usize>;
}

impl Plainly for TcpStream {
    fn held(self) -> crate::uring::Held {
        crate::uring::Held::Tcp(self)
    }
    fn try_write_now(&self, buf: &[u8]) -> io::Result<usize> {
        self.try_write(buf)
    }
}

impl Plainly for UnixStream {
    fn held(self) -> crate::uring::Held {
        crate::uring::Held::Unix(self)
    }
    fn try_write_now(&self, buf: &[u8]) -> io::Result<usize> {
        self.try_write(buf)
    }
}

impl<S: Plainly> Plain<S> {
    pub fn new(socket: S) -> Self {
        Self {
            socket: std::mem::ManuallyDrop::new(socket),
            sending: crate::uring::Sending::default(),
        }
    }

    /// The socket, once nothing of its is queued or sending (it may then
    /// leave the thread); else the stream back.
    pub fn into_inner(mut self) -> Result<S, Self> {
        if !self.settled() {
            return Err(self);
        }
        let mut this = std::mem::ManuallyDrop::new(self);
        // SAFETY: `this` is never dropped, so the socket is taken once.
        Ok(unsafe { std::mem::ManuallyDrop::take(&mut this.socket) })
    }

    /// Nothing queued or sending (completions taken first).
    pub fn settled(&mut self) -> bool {
        let fd = self.socket.as_raw_fd();
        self.sending.settled(fd)
    }

    /// Writes what can go now without waiting: to the socket when
    /// nothing of its is pending in the worker's ring, else after what is
    /// queued there if it all fits (WouldBlock if not).
    pub fn try_write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let fd = self.socket.as_raw_fd();
        match self.sending.try_send(fd, buf) {
            Some(r) => r,
            None => self.socket.try_write_now(buf),
        }
    }
}

#[cfg(test)]
impl<S: Plainly> Plain<S> {
    pub fn sending_key(&self) -> u64 {
        self.sending.key()
    }
}

impl<S: Plainly> std::ops::Deref for Plain<S> {
    type Target = S;
    fn deref(&self) -> &S {
        &self.socket
    }
}

impl<S: Plainly> Drop for Plain<S> {
    fn drop(&mut self) {
        // SAFETY: drop runs once, and nothing uses the socket after.
        let socket = unsafe { std::mem::ManuallyDrop::take(&mut self.socket) };
        let fd = socket.as_raw_fd();
        drop(self.sending.hand_over(fd, socket.held()));
    }
}

impl<S: Plainly> Plain<S> {
    fn poll_write(&mut self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let fd = self.socket.as_raw_fd();
        match self.sending.poll_send(fd, cx, buf) {
            Some(p) => p,
            None => Pin::new(&mut *self.socket).poll_write(cx, buf),
        }
    }

    fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let fd = self.socket.as_raw_fd();
        std::task::ready!(self.sending.poll_flush(fd, cx))?;
        Pin::new(&mut *self.socket).poll_flush(cx)
    }

    fn poll_shutdown(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // What is queued goes first.
        let fd = self.socket.as_raw_fd();
        std::task::ready!(self.sending.poll_flush(fd, cx))?;
        Pin::new(&mut *self.socket).poll_shutdown(cx)
    }
}

/// A connected socket.
#[derive(Debug)]
pub enum Stream {
    Tcp(Plain<TcpStream>),
    Unix(Plain<UnixStream>),
    Tls(Box<TlsConn>),
    /// Taken off the event loop while its client is parked (`take_off`):
    /// the socket is open, but nothing is registered for it; `put_back`
    /// registers it again. Reads and writes fail until then.
    Off(OffSocket),
}

/// A plain socket taken off the event loop (a parked client's: its
/// registration is what it would cost most while idle), or `Gone` for the
/// instant it moves, or after moving failed.
#[derive(Debug)]
pub enum OffSocket {
    Tcp(std::net::TcpStream),
    Unix(std::os::unix::net::UnixStream),
    Gone,
}

fn in_flight() -> io::Error {
    io::Error::new(io::ErrorKind::WouldBlock, "a send is still in flight")
}

fn off_the_loop() -> io::Error {
    io::Error::new(io::ErrorKind::NotConnected, "socket is off the event loop")
}

impl Stream {
    pub fn plain_tcp(s: TcpStream) -> Self {
        Self::Tcp(Plain::new(s))
    }

    pub fn plain_unix(s: UnixStream) -> Self {
        Self::Unix(Plain::new(s))
    }

    /// Nothing written is still queued or sending (io_uring): the stream
    /// may leave this worker. TLS writes go straight to the socket.
    pub fn settled(&mut self) -> bool {
        match self {
            Self::Tcp(s) => s.settled(),
            Self::Unix(s) => s.settled(),
            Self::Tls(_) | Self::Off(_) => true,
        }
    }

    /// Reads what is there without waiting; `WouldBlock` when nothing is.
    /// Over TLS this reads the raw socket: it serves only to probe an idle
    /// server, which is closed when anything at all arrived.
    pub fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Self::Tcp(s) => s.try_read(buf),
            Self::Unix(s) => s.try_read(buf),
            Self::Tls(t) => match t.tcp() {
                Some(s) => s.try_read(buf),
                None => Ok(0),
            },
            Self::Off(_) => Err(off_the_loop()),
        }
    }

    /// Polls for data (or EOF) without reading it. The waker is kept in the
    /// socket's registration, so a future built on this holds no state of
    /// its own: what an idle client's task costs.
    pub fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self {
            Self::Tcp(s) => s.poll_read_ready(cx),
            Self::Unix(s) => s.poll_read_ready(cx),
            Self::Tls(t) => t.poll_read_ready(cx),
            Self::Off(_) => Poll::Ready(Err(off_the_loop())),
        }
    }

    /// While sluice holds the client's request (it waits for a server, out
    /// a pause, or for a primary): Ready(true) once the client closed its
    /// end (its FIN has arrived, even behind data it sent: a driver's
    /// Terminate, then the close) or its socket failed; Ready(false) once
    /// it is readable and still open (it sent more: look again later with
    /// [`Stream::peer_hung_up`]); Pending meanwhile. Nothing is read, and
    /// readiness is left as it is for the relay.
    pub fn poll_peer_closed(&self, cx: &mut Context<'_>) -> Poll<bool> {
        let polled = match self {
            Self::Tcp(s) => s.poll_read_ready(cx),
            Self::Unix(s) => s.poll_read_ready(cx),
            // The socket under TLS: its readiness, not rustls' (the close
            // is a FIN there too, after a close_notify record).
            Self::Tls(t) => match t.tcp() {
                Some(s) => s.poll_read_ready(cx),
                None => return Poll::Ready(true),
            },
            Self::Off(_) => return Poll::Ready(true),
        };
        match polled {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Err(_)) => Poll::Ready(true),
            Poll::Ready(Ok(())) => Poll::Ready(self.peer_hung_up()),
        }
    }

    /// The peer closed its end (its FIN has arrived, even behind unread
    /// data) or the socket failed: POLLRDHUP, looked at without waiting
    /// and without reading.
    pub fn peer_hung_up(&self) -> bool {
        let fd = self.raw_fd();
        if fd < 0 {
            return true;
        }
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLRDHUP,
            revents: 0,
        };
        // SAFETY: one pollfd of ours, a zero timeout.
        let n = unsafe { libc::poll(&mut p, 1, 0) };
        n > 0 && p.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0
    }

    /// Sends a parting message (Terminate) without waiting, as far as the
    /// socket takes it now; over TLS encrypted, with close_notify.
    pub fn try_send_last(&mut self, last: &[u8]) {
        match self {
            Self::Tcp(s) => drop(s.try_write(last)),
            Self::Unix(s) => drop(s.try_write(last)),
            Self::Tls(t) => t.try_send_last(last),
            Self::Off(_) => {}
        }
    }

    /// Moves the socket's registration to the event loop of the calling
    /// thread (two epoll_ctl calls). Must run inside a runtime.
    pub fn reregister(self) -> io::Result<Self> {
        Ok(match self {
            Self::Tcp(s) => {
                let s = s.into_inner().map_err(|_| in_flight())?;
                Self::plain_tcp(TcpStream::from_std(s.into_std()?)?)
            }
            Self::Unix(s) => {
                let s = s.into_inner().map_err(|_| in_flight())?;
                Self::plain_unix(UnixStream::from_std(s.into_std()?)?)
            }
            Self::Tls(mut t) => {
                t.reregister()?;
                Self::Tls(t)
            }
            Self::Off(OffSocket::Tcp(s)) => Self::plain_tcp(TcpStream::from_std(s)?),
            Self::Off(OffSocket::Unix(s)) => Self::plain_unix(UnixStream::from_std(s)?),
            Self::Off(OffSocket::Gone) => return Err(off_the_loop()),
        })
    }

    /// Takes a plain socket off the event loop (one epoll_ctl; its
    /// registration's memory is freed) and gives its descriptor, to be
    /// watched elsewhere until `put_back`. A TLS stream stays registered
    /// (rustls holds the socket) and only gives its descriptor. On an
    /// error the socket is closed and the stream is `Off(Gone)`.
    pub fn take_off(&mut self) -> io::Result<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        if !self.settled() {
            return Err(in_flight());
        }
        let off = match std::mem::replace(self, Self::Off(OffSocket::Gone)) {
            Self::Tcp(s) => OffSocket::Tcp(s.into_inner().map_err(|_| in_flight())?.into_std()?),
            Self::Unix(s) => OffSocket::Unix(s.into_inner().map_err(|_| in_flight())?.into_std()?),
            other => {
                *self = other;
                return Ok(self.raw_fd());
            }
        };
        let fd = match &off {
            OffSocket::Tcp(s) => s.as_raw_fd(),
            OffSocket::Unix(s) => s.as_raw_fd(),
            OffSocket::Gone => -1,
        };
        *self = Self::Off(off);
        Ok(fd)
    }

    /// Registers a socket taken off (`take_off`) with the calling thread's
    /// event loop again; other streams are left as they are. On an error
    /// the socket is closed and the stream is `Off(Gone)`: reads fail.
    pub fn put_back(&mut self) -> io::Result<()> {
        if !matches!(self, Self::Off(_)) {
            return Ok(());
        }
        let off = std::mem::replace(self, Self::Off(OffSocket::Gone));
        *self = off.reregister()?;
        Ok(())
    }

    /// Applies keepalive settings (TCP only).
    pub fn set_keepalive(&self, keepalive: &Keepalive) {
        if let Some(s) = self.tcp() {
            keepalive.apply(s);
        }
    }

    /// SCRAM-SHA-256-PLUS channel binding data (a client over TLS).
    pub fn tls_end_point(&self) -> Option<std::sync::Arc<[u8]>> {
        match self {
            Self::Tls(t) => t.end_point(),
            _ => None,
        }
    }

    /// The `tls` column of SHOW CLIENTS/SERVERS (empty without TLS).
    pub fn tls_description(&self) -> Option<Box<str>> {
        match self {
            Self::Tls(t) => Some(t.describe().into_boxed_str()),
            _ => None,
        }
    }

    /// The common name of the client certificate the TLS handshake
    /// verified, if any.
    pub fn peer_certificate_cn(&self) -> Option<String> {
        match self {
            Self::Tls(t) => t
                .peer_certificates()
                .and_then(|chain| chain.first())
                .and_then(|leaf| crate::tls::x509::subject_common_name(leaf)),
            _ => None,
        }
    }

    /// Writes `bytes` if the socket takes them at once, all or nothing: only
    /// when the send queue has room for all of them (SIOCOUTQ against
    /// SO_SNDBUF), so a message is never cut. TLS streams get nothing.
    pub fn try_write_whole(&mut self, bytes: &[u8]) {
        use std::os::fd::AsRawFd;
        let fd = match self {
            Self::Tcp(s) => s.as_raw_fd(),
            Self::Unix(s) => s.as_raw_fd(),
            Self::Tls(_) | Self::Off(_) => return,
        };
        let mut queued: libc::c_int = 0;
        // SAFETY: TIOCOUTQ (SIOCOUTQ) writes one c_int.
        let rc = unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut queued) };
        let room = socket2::SockRef::from(&self.borrowed_fd(fd))
            .send_buffer_size()
            .ok()
            .map(|size| size / 2);
        if rc == 0 && room.is_some_and(|r| r >= queued as usize + bytes.len()) {
            self.try_write_once(bytes);
        }
    }

    fn borrowed_fd(&self, fd: std::os::fd::RawFd) -> std::os::fd::BorrowedFd<'_> {
        // SAFETY: `fd` is this stream's own descriptor, alive as long as it.
        unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) }
    }

    /// Writes `bytes` if the socket takes them at once (a farewell to a
    /// plain connection that must not wait); TLS streams get nothing.
    pub fn try_write_once(&mut self, bytes: &[u8]) {
        let _ = match self {
            Self::Tcp(s) => s.try_write(bytes),
            Self::Unix(s) => s.try_write(bytes),
            Self::Tls(_) | Self::Off(_) => Ok(0),
        };
    }

    /// The OS user id of a Unix-socket peer (SO_PEERCRED).
    pub fn peer_uid(&self) -> Option<u32> {
        match self {
            Self::Unix(s) => s.peer_cred().ok().map(|c| c.uid()),
            _ => None,
        }
    }

    /// The TCP socket, plain or under TLS.
    pub fn tcp(&self) -> Option<&TcpStream> {
        match self {
            Self::Tcp(s) => Some(s),
            Self::Unix(_) | Self::Off(_) => None,
            Self::Tls(t) => t.tcp(),
        }
    }

    /// TCP peer address (None for Unix sockets).
    pub fn peer_addr(&self) -> Option<std::net::SocketAddr> {
        match self {
            Self::Off(OffSocket::Tcp(s)) => s.peer_addr().ok(),
            _ => self.tcp().and_then(|s| s.peer_addr().ok()),
        }
    }

    /// TCP local address (None for Unix sockets).
    pub fn local_addr(&self) -> Option<std::net::SocketAddr> {
        match self {
            Self::Off(OffSocket::Tcp(s)) => s.local_addr().ok(),
            _ => self.tcp().and_then(|s| s.local_addr().ok()),
        }
    }

    /// The socket's descriptor (for KILL, which shuts it down).
    pub fn raw_fd(&self) -> i32 {
        use std::os::fd::AsRawFd;
        match self {
            Self::Tcp(s) => s.as_raw_fd(),
            Self::Unix(s) => s.as_raw_fd(),
            Self::Tls(t) => t.tcp().map_or(-1, |s| s.as_raw_fd()),
            Self::Off(OffSocket::Tcp(s)) => s.as_raw_fd(),
            Self::Off(OffSocket::Unix(s)) => s.as_raw_fd(),
            Self::Off(OffSocket::Gone) => -1,
        }
    }

    /// Peer address for logs and the console.
    pub fn peer(&self) -> String {
        match self {
            Self::Unix(_) | Self::Off(OffSocket::Unix(_)) => "unix".into(),
            _ => self
                .peer_addr()
                .map(|a| a.to_string())
                .unwrap_or_else(|| "?".into()),
        }
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Tcp(s) => Pin::new(&mut *s.socket).poll_read(cx, buf),
            Self::Unix(s) => Pin::new(&mut *s.socket).poll_read(cx, buf),
            Self::Tls(t) => Pin::new(&mut **t).poll_read(cx, buf),
            Self::Off(_) => Poll::Ready(Err(off_the_loop())),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Tcp(s) => s.poll_write(cx, buf),
            Self::Unix(s) => s.poll_write(cx, buf),
            Self::Tls(t) => Pin::new(&mut **t).poll_write(cx, buf),
            Self::Off(_) => Poll::Ready(Err(off_the_loop())),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Tcp(s) => s.poll_flush(cx),
            Self::Unix(s) => s.poll_flush(cx),
            Self::Tls(t) => Pin::new(&mut **t).poll_flush(cx),
            Self::Off(_) => Poll::Ready(Err(off_the_loop())),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Tcp(s) => s.poll_shutdown(cx),
            Self::Unix(s) => s.poll_shutdown(cx),
            Self::Tls(t) => Pin::new(&mut **t).poll_shutdown(cx),
            Self::Off(_) => Poll::Ready(Err(off_the_loop())),
        }
    }
}
