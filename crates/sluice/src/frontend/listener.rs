//! Listening sockets (TCP on `listen_addr:listen_port`, Unix socket in
//! `unix_socket_dir`) and the accept loop that starts one task per client.
//! TCP sockets use SO_REUSEPORT when several workers (or a second sluice
//! during a rolling restart) listen on the same port.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use sluice_config::Settings;
use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::{TcpListener, UnixListener};

use super::client::Client;
use super::error::ClientError;
use super::login::{Admitted, login};
use super::parking;
use super::session::{self, SessionEnd};
use crate::app::{App, Phase};
use crate::net::Stream;

/// The TCP addresses `listen_addr` names ("*" = all IPv4 and IPv6).
pub fn tcp_addresses(settings: &Settings) -> std::io::Result<Vec<SocketAddr>> {
    let mut out = Vec::new();
    for host in settings
        .listen_addr
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
    {
        if host == "*" {
            out.push(SocketAddr::from(([0, 0, 0, 0], settings.listen_port)));
            out.push(SocketAddr::from(([0u16; 8], settings.listen_port)));
        } else {
            out.extend((host, settings.listen_port).to_socket_addrs()?);
        }
    }
    Ok(out)
}

/// Binds one TCP socket for listening; `listen()` comes when its worker
/// starts accepting.
pub fn bind_tcp(addr: SocketAddr, reuse_port: bool, defer_accept: u32) -> std::io::Result<Socket> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    if defer_accept > 0 {
        // tcp_defer_accept: woken only once the client has sent something
        // (its startup packet), as PgBouncer does on Linux.
        let value = libc::c_int::try_from(defer_accept).unwrap_or(libc::c_int::MAX);
        // SAFETY: a valid socket and a c_int of the size given.
        let rc = unsafe {
            libc::setsockopt(
                std::os::fd::AsRawFd::as_raw_fd(&socket),
                libc::IPPROTO_TCP,
                libc::TCP_DEFER_ACCEPT,
                std::ptr::from_ref(&value).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            tracing::warn!(
                "tcp_defer_accept on {addr}: {}",
                std::io::Error::last_os_error()
            );
        }
    }
    socket.set_reuse_address(true)?;
    if reuse_port {
        socket.set_reuse_port(true)?;
    }
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    socket.bind(&addr.into())?;
    socket.set_nonblocking(true)?;
    Ok(socket)
}

/// Path of the Unix socket for `port` in `dir`.
pub fn unix_socket_path(dir: &str, port: u16) -> PathBuf {
    PathBuf::from(dir).join(format!(".s.PGSQL.{port}"))
}

/// Binds the Unix socket, replacing a stale socket file. A live one (a
/// process answers there) means the port is taken: in a rolling restart
/// the old process closes its socket at SIGTERM, or each process has a
/// `unix_socket_dir` of its own.
pub fn bind_unix(
    path: &PathBuf,
    mode: u32,
    group: &str,
) -> std::io::Result<std::os::unix::net::UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    if path.exists() {
        // Another live process answering there means the port is taken.
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AddrInUse,
                format!("{} is in use", path.display()),
            ));
        }
        std::fs::remove_file(path)?;
    }
    let l = std::os::unix::net::UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    if !group.is_empty() {
        std::os::unix::fs::chown(path, None, Some(group_id(group)?))?;
    }
    l.set_nonblocking(true)?;
    Ok(l)
}

/// The id of group `name` (`unix_socket_group`): a name from the group
/// database, or a number.
fn group_id(name: &str) -> std::io::Result<u32> {
    if let Ok(gid) = name.parse::<u32>() {
        return Ok(gid);
    }
    let unknown = || {
        std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("unix_socket_group: no group named {name:?}"),
        )
    };
    let cname = std::ffi::CString::new(name).map_err(|_| unknown())?;
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    // SAFETY: zeroed is a valid `group` (pointers null); getgrnam_r fills
    // it with pointers into `buf`, which outlives its use here.
    let mut group: libc::group = unsafe { std::mem::zeroed() };
    let mut found: *mut libc::group = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the sizes given.
    let rc = unsafe {
        libc::getgrnam_r(
            cname.as_ptr(),
            &mut group,
            buf.as_mut_ptr(),
            buf.len(),
            &mut found,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::from_raw_os_error(rc));
    }
    if found.is_null() {
        return Err(unknown());
    }
    Ok(group.gr_gid)
}

/// A listening socket of either kind.
pub enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

impl Listener {
    async fn accept(&self) -> std::io::Result<Stream> {
        match self {
            Self::Tcp(l) => {
                let (s, _) = l.accept().await?;
                let _ = s.set_nodelay(true);
                Ok(Stream::plain_tcp(s))
            }
            Self::Unix(l) => Ok(Stream::plain_unix(l.accept().await?.0)),
        }
    }
}

/// A descriptor each accept loop holds in reserve: when accept fails for
/// lack of descriptors (EMFILE, ENFILE), it is closed so that the waiting
/// client can be accepted and told why, instead of hanging in the backlog.
/// One per loop: every worker has a listening socket of its own.
fn reserve_fd() -> Option<std::fs::File> {
    std::fs::File::open("/dev/null").ok()
}

/// Out of descriptors: frees the reserve, accepts one waiting client,
/// sends it 53300 and closes it, then takes the reserve again. Logged at
/// most once a second.
async fn refuse_one(listener: &Listener, reserve: &mut Option<std::fs::File>, e: &std::io::Error) {
    static LAST_LOG: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    if LAST_LOG.swap(now, Ordering::Relaxed) != now {
        tracing::warn!(
            "accept failed: {e}: refusing new clients until descriptors free up (raise the \
             open files limit, LimitNOFILE, or lower max_client_conn)"
        );
    }
    drop(reserve.take());
    let accepted =
        tokio::time::timeout(std::time::Duration::from_millis(100), listener.accept()).await;
    if let Ok(Ok(mut stream)) = accepted {
        let mut out = bytes::BytesMut::new();
        sluice_wire::ErrorFields::new(
            sluice_wire::Severity::Fatal,
            "53300",
            "no more connections allowed (the pooler is out of file descriptors)",
        )
        .encode(&mut out);
        stream.try_write_once(&out);
    }
    *reserve = reserve_fd();
}

/// Accepts clients until shutdown begins. `open` is this listener's place
/// in [`App::listening`]: it is given up only after the socket is closed,
/// so that SIGTERM's wait cannot end while a client may still be accepted.
pub async fn accept_loop(app: Arc<App>, listener: Listener, open: ListenerGuard) {
    accept_until_shutdown(&app, &listener).await;
    drop(listener);
    drop(open);
}

async fn accept_until_shutdown(app: &Arc<App>, listener: &Listener) {
    let mut reserve = reserve_fd();
    loop {
        let changed = app.phase_changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        if app.phase() != Phase::Running {
            return;
        }
        tokio::select! {
            r = listener.accept() => match r {
                Ok(stream) => {
                    // Counted before its task starts: SIGTERM's wait must
                    // see it even if the task has not run yet.
                    let (guard, count) = ClientCountGuard::new(app);
                    tokio::spawn(handle_connection(stream, guard, count));
                }
                Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                    refuse_one(listener, &mut reserve, &e).await;
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                }
                Err(e) => {
                    // ENOBUFS and friends: back off instead of spinning.
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            },
            _ = &mut changed => {}
        }
    }
}

/// A listening socket's place in [`App::listening`], taken before its
/// accept loop is spawned and given back when the loop has closed it.
pub struct ListenerGuard(Arc<App>);

impl ListenerGuard {
    pub fn new(app: &Arc<App>) -> Self {
        app.listening.fetch_add(1, Ordering::AcqRel);
        Self(app.clone())
    }
}

impl Drop for ListenerGuard {
    fn drop(&mut self) {
        self.0.listening.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A client's place in the client count, from its accept to its close.
struct ClientCountGuard(Arc<App>);

impl ClientCountGuard {
    /// Counts one more client; also returns the count with it.
    fn new(app: &Arc<App>) -> (Self, u32) {
        let count = app.clients.fetch_add(1, Ordering::AcqRel) + 1;
        (Self(app.clone()), count)
    }
}

impl Drop for ClientCountGuard {
    fn drop(&mut self) {
        self.0.clients.fetch_sub(1, Ordering::AcqRel);
        self.0.phase_changed.notify_waiters();
    }
}

/// One client connection from accept to close. This future lives as long
/// as the client: only small values stay in it, and the login and the
/// goodbye are boxed.
async fn handle_connection(stream: Stream, guard: ClientCountGuard, count: u32) {
    let app = guard.0.clone();
    let client = match Box::pin(log_in(&app, stream, count)).await {
        Some(Admitted::Client(c)) => c,
        Some(Admitted::Console(stream, role)) => {
            Box::pin(crate::admin::serve(app.clone(), stream, role)).await;
            return;
        }
        None => return,
    };
    // A task of its own for the session: the login's task ends here, and
    // the session's polls go through one future less.
    tokio::spawn(serve(client, guard));
}

/// A logged-in client's session, until it leaves or parks; a parked
/// client comes back here in a new task.
async fn serve(mut client: Box<Client>, guard: ClientCountGuard) {
    match session::run(&mut client).await {
        SessionEnd::Park => parking::park(Box::new(ParkedClient { client, guard })),
        end => Box::pin(say_goodbye(*client, end)).await,
    }
}

/// An idle client in its worker's lot (`parking`), with its place in the
/// client count.
struct ParkedClient {
    client: Box<Client>,
    guard: ClientCountGuard,
}

impl parking::Parkable for ParkedClient {
    fn readable_now(&self) -> bool {
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        self.client.stream.poll_read_ready(&mut cx).is_ready()
    }

    fn take_off(&mut self) -> std::io::Result<std::os::fd::RawFd> {
        let c = &mut *self.client;
        // A send still pending (a client that does not read): it stays
        // in its task. Checked first: a refusal here closes nothing, and
        // must not make KILL forget the socket.
        if !c.stream.settled() {
            return Err(std::io::ErrorKind::WouldBlock.into());
        }
        c.app
            .cancels
            .moving_socket(c.cancel, || c.stream.take_off())
    }

    fn resume(self: Box<Self>) {
        let ParkedClient { mut client, guard } = *self;
        // On a failure the socket is gone: the session reads an error
        // and says goodbye.
        let c = &mut *client;
        if let Err(e) = c
            .app
            .cancels
            .moving_socket(c.cancel, || c.stream.put_back())
        {
            tracing::warn!(user = %client.user(), "a parked client's socket could not go back on the event loop: {e}");
        }
        tokio::spawn(serve(client, guard));
    }
}

/// Login with `client_login_timeout`; errors are sent and logged here.
async fn log_in(app: &Arc<App>, stream: Stream, count: u32) -> Option<Admitted> {
    let (over_limit, login_timeout, log_pooler_errors) = {
        let config = app.config();
        let s = &config.settings;
        stream.set_keepalive(&crate::net::Keepalive::from_settings(s));
        (
            count > s.max_client_conn,
            s.client_login_timeout,
            s.log_pooler_errors,
        )
    };
    let deadline = (!login_timeout.is_zero()).then(|| tokio::time::Instant::now() + login_timeout);
    match login(app, stream, over_limit, deadline).await {
        Ok(c) => c,
        Err((mut stream, e)) => {
            app.count_login_failure(&e.code);
            if log_pooler_errors {
                tracing::warn!(peer = %stream.peer(), sqlstate = %e.code, "pooler error: {}", e.message);
            }
            e.send(&mut stream).await;
            None
        }
    }
}

/// Logs how a client left and tells it why, if it was thrown out.
async fn say_goodbye(mut client: Client, end: SessionEnd) {
    // Killed by an operator and still at a message boundary: told why,
    // as PgBouncer tells it.
    let end = match (end, client.app.cancels.killed(client.cancel)) {
        (SessionEnd::ClientLeft, Some(why)) => {
            SessionEnd::Error(ClientError::new("08P01", why.message()))
        }
        (end, _) => end,
    };
    client.leave();
    match end {
        SessionEnd::ClientLeft | SessionEnd::Park => {
            if client.app.config().settings.log_disconnections {
                tracing::info!(user = %client.user(), db = %client.database(), "closing because: client close request");
            }
        }
        SessionEnd::Error(e) => {
            let settings = &client.app.config().settings;
            if settings.log_disconnections {
                tracing::info!(user = %client.user(), db = %client.database(), sqlstate = %e.code, "closing because: {}", e.message);
            }
            if settings.log_pooler_errors {
                tracing::warn!(user = %client.user(), db = %client.database(), "pooler error: {}", e.message);
            }
            e.send(&mut client.stream).await;
        }
    }
}
