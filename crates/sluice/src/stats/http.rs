//! The HTTP endpoint on `metrics_addr`: `GET /metrics` (Prometheus text
//! format), `GET /health` (200 when sluice can serve, 503 while paused,
//! shutting down, or when a pool's server logins keep failing), and with
//! `web_console` the console's page and API (`web.rs`). A few fixed routes
//! do not need an HTTP framework: a request is read with a timeout and
//! size limits (8 KiB of head, 64 KiB of body), one response is written,
//! the connection closes.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::app::{App, Phase};

const REQUEST_LIMIT: usize = 8192;
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// HTTP connections served at once.
const CONNECTIONS: usize = 128;
/// HTTP connections served at once from one address: one client holding
/// connections open cannot take every slot and fail the health checks of
/// the others (a review kept `/health` down with 40 idle sockets). A
/// newcomer from an address at its limit takes the place of that
/// address's oldest connection still sending its request head (review
/// 50: eight idle sockets from the prober's own address failed every
/// `/health`).
const CONNECTIONS_PER_ADDRESS: usize = 8;
/// How long a newcomer waits for the place of a connection it closed.
const PLACE_WAIT: Duration = Duration::from_secs(1);

/// Binds `metrics_addr`, before the workers start (a start that fails
/// here has accepted no client). With `so_reuseport` two processes share
/// it through a rolling restart, as they share the PostgreSQL port.
pub fn bind(addr: &str, reuse_port: bool) -> std::io::Result<std::net::TcpListener> {
    use std::net::ToSocketAddrs;
    let at = addr
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "no address"))?;
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(at),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )?;
    socket.set_reuse_address(true)?;
    if reuse_port {
        socket.set_reuse_port(true)?;
    }
    socket.bind(&at.into())?;
    socket.listen(128)?;
    socket.set_nonblocking(true)?;
    Ok(socket.into())
}

/// Serves until the process exits.
pub async fn serve(app: Arc<App>, listener: TcpListener) {
    let registry = Arc::new(super::metrics::registry(app.clone()));
    // Connections served at once; more are closed at once (a flood must
    // not take the descriptors the PostgreSQL listener needs).
    let slots = Arc::new(tokio::sync::Semaphore::new(CONNECTIONS));
    let per_address = Arc::new(PerAddress::default());
    let unread = Arc::new(Unread::default());
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let (mine, made_way) = match PerAddress::take(&per_address, peer.ip()) {
                    Some(mine) => (mine, false),
                    None if unread.close_oldest_of(peer.ip()) => {
                        // (its place is given back once its task sees it)
                        (PerAddress::take_over(&per_address, peer.ip()), true)
                    }
                    None => {
                        drop(stream);
                        continue;
                    }
                };
                // Every place taken: the oldest connection that has not
                // sent its request yet makes way (idle sockets from many
                // addresses kept `/health` down; a review), or this one
                // is closed. One of its own address's that made way gives
                // it its place too (review 51: it closed two).
                let slot = slots.clone().try_acquire_owned().ok();
                if slot.is_none() && !made_way && !unread.close_oldest() {
                    drop(stream);
                    continue;
                }
                let (app, registry) = (app.clone(), registry.clone());
                let (slots, unread) = (slots.clone(), unread.clone());
                tokio::spawn(async move {
                    let slot = match slot {
                        Some(s) => s,
                        None => match tokio::time::timeout(PLACE_WAIT, slots.acquire_owned()).await
                        {
                            Ok(Ok(s)) => s,
                            _ => return,
                        },
                    };
                    let _slot = (slot, mine);
                    let reading = Unread::enter(&unread, peer.ip());
                    // With the web console and client_tls_* certificates,
                    // the whole endpoint speaks HTTPS (its passwords and
                    // its changes never travel in clear).
                    let tls = app
                        .config()
                        .settings
                        .web_console
                        .then(|| app.client_tls().web_acceptor())
                        .flatten();
                    let served = tokio::time::timeout(REQUEST_TIMEOUT, async {
                        match tls {
                            None => answer(&app, &registry, stream, false, &reading).await,
                            Some(acceptor) => {
                                let stream = acceptor.accept(stream).await?;
                                answer(&app, &registry, stream, true, &reading).await
                            }
                        }
                    });
                    tokio::select! {
                        _ = served => {}
                        () = reading.closed.notified() => {}
                    }
                });
            }
            Err(e) => {
                tracing::warn!("metrics accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// The connections that have not sent their whole request head yet,
/// oldest first (a few hundred at most: a scan is cheap), after the last
/// number given.
#[derive(Default)]
struct Unread(std::sync::Mutex<Line>);

type Line = (
    u64,
    std::collections::VecDeque<(u64, std::net::IpAddr, Arc<tokio::sync::Notify>)>,
);

/// One connection in `Unread` until its head is whole or it ends.
struct Reading {
    unread: Arc<Unread>,
    id: u64,
    /// Told when the connection must make way.
    closed: Arc<tokio::sync::Notify>,
}

impl Unread {
    fn lock(&self) -> std::sync::MutexGuard<'_, Line> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn enter(unread: &Arc<Unread>, ip: std::net::IpAddr) -> Reading {
        let closed = Arc::new(tokio::sync::Notify::new());
        let mut q = unread.lock();
        q.0 += 1;
        let id = q.0;
        q.1.push_back((id, ip, closed.clone()));
        Reading {
            unread: unread.clone(),
            id,
            closed,
        }
    }

    /// Tells the oldest connection still reading its head to close; false
    /// if there is none.
    fn close_oldest(&self) -> bool {
        // (its place is free once its task sees it: `notify_one` keeps
        // the word for a task not waiting yet)
        self.lock()
            .1
            .pop_front()
            .map(|(_, _, c)| c.notify_one())
            .is_some()
    }

    /// Tells the oldest connection from `ip` still reading its head to
    /// close; false if there is none.
    fn close_oldest_of(&self, ip: std::net::IpAddr) -> bool {
        let mut q = self.lock();
        let Some(i) = q.1.iter().position(|(_, from, _)| *from == ip) else {
            return false;
        };
        q.1.remove(i).map(|(_, _, c)| c.notify_one()).is_some()
    }
}

impl Reading {
    /// The head is whole: the connection is served to its end.
    fn done(&self) {
        let mut q = self.unread.lock();
        if let Some(i) = q.1.iter().position(|(id, _, _)| *id == self.id) {
            q.1.remove(i);
        }
    }
}

impl Drop for Reading {
    fn drop(&mut self) {
        self.done();
    }
}

/// Connections open per client address.
#[derive(Default)]
struct PerAddress(std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>);

/// One connection counted for its address until dropped.
struct AddressSlot {
    counts: Arc<PerAddress>,
    ip: std::net::IpAddr,
}

impl PerAddress {
    /// A place for one more connection from `ip`, if it has fewer than
    /// `CONNECTIONS_PER_ADDRESS`.
    fn take(counts: &Arc<PerAddress>, ip: std::net::IpAddr) -> Option<AddressSlot> {
        let mut map = counts.0.lock().unwrap_or_else(|p| p.into_inner());
        let n = map.entry(ip).or_insert(0);
        if *n >= CONNECTIONS_PER_ADDRESS {
            return None;
        }
        *n += 1;
        Some(AddressSlot {
            counts: counts.clone(),
            ip,
        })
    }
}

impl PerAddress {
    /// A place for one more connection from `ip` whatever its count: one
    /// of its connections was just told to make way.
    fn take_over(counts: &Arc<PerAddress>, ip: std::net::IpAddr) -> AddressSlot {
        let mut map = counts.0.lock().unwrap_or_else(|p| p.into_inner());
        *map.entry(ip).or_insert(0) += 1;
        AddressSlot {
            counts: counts.clone(),
            ip,
        }
    }
}

impl Drop for AddressSlot {
    fn drop(&mut self) {
        let mut map = self.counts.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = map.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.ip);
            }
        }
    }
}

/// Why sluice cannot serve now, if it cannot.
pub fn unhealthy(app: &App) -> Option<String> {
    if app.phase() != Phase::Running {
        return Some("shutting down".into());
    }
    if app.control.is_paused("") {
        return Some("paused".into());
    }
    app.main_pools()
        .iter()
        .find(|p| p.is_failing())
        .map(|p| format!("no reachable server for {}/{}", p.database, p.user))
}

/// Largest request body (the web console's JSON).
const BODY_LIMIT: usize = 64 * 1024;

async fn answer<S: AsyncRead + AsyncWrite + Unpin>(
    app: &Arc<App>,
    registry: &prometheus_client::registry::Registry,
    mut stream: S,
    tls: bool,
    reading: &Reading,
) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break Some(i + 4);
        }
        if let Some(i) = buf.windows(2).position(|w| w == b"\n\n") {
            break Some(i + 2);
        }
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            break None;
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.len() > REQUEST_LIMIT {
            return respond(
                &mut stream,
                "431 Request Header Fields Too Large",
                "text/plain",
                "too large\n",
                &[],
            )
            .await;
        }
    };
    reading.done();
    let head_end = head_end.unwrap_or(buf.len());
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.lines();
    let mut parts = lines.next().unwrap_or("").split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let header = |name: &str| {
        head.lines().skip(1).find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_owned())
        })
    };
    let route = path.split('?').next().unwrap_or("");
    if app.config().settings.web_console && super::web::owns(route) {
        let refusal = web_refusal(app, tls, method, &header);
        let access = match refusal {
            Some(r) => Err(r),
            None => {
                // Checked off the event loop (a SCRAM secret is thousands of
                // HMACs), a few at a time with client logins' (a flood of
                // wrong guesses took 1.1 cores; a review), before any body
                // is read.
                let (app, auth) = (app.clone(), header("authorization"));
                // (no delay before a 401, which held the endpoint's
                // connections: failures share one budget instead, review
                // 50)
                let checked =
                    crate::auth::derive(move || super::web::authorize(&app, auth.as_deref())).await;
                match checked {
                    Some(Ok(a)) => Ok(a),
                    Some(Err(super::web::Refused::Throttled)) => {
                        Err(super::web::Response::throttled())
                    }
                    _ => Err(super::web::Response::unauthorized()),
                }
            }
        };
        let access = match access {
            Ok(a) => a,
            Err(r) => {
                return respond(&mut stream, r.status, r.content_type, &r.body, &r.headers).await;
            }
        };
        let length = match header("content-length").map(|l| l.parse::<usize>()) {
            None => 0,
            Some(Ok(n)) => n,
            // (not read as no body: RFC 9112 6.3)
            Some(Err(_)) => {
                return respond(
                    &mut stream,
                    "400 Bad Request",
                    "text/plain",
                    "bad Content-Length\n",
                    &[],
                )
                .await;
            }
        };
        if length > BODY_LIMIT {
            return respond(
                &mut stream,
                "413 Payload Too Large",
                "text/plain",
                "too large\n",
                &[],
            )
            .await;
        }
        let mut body = buf[head_end..].to_vec();
        while body.len() < length {
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..n]);
        }
        body.truncate(length);
        // On the blocking pool: a change takes the config file's lock and
        // reloads, which must not hold up the control thread's ticks and
        // signals (a lock held elsewhere froze them; a review).
        let (app, method, path) = (app.clone(), method.to_owned(), path.to_owned());
        let response = tokio::task::spawn_blocking(move || {
            super::web::handle(
                &app,
                access,
                &super::web::Request {
                    method: &method,
                    path: &path,
                    body: &body,
                },
            )
        })
        .await
        .unwrap_or_else(|_| super::web::Response {
            status: "500 Internal Server Error",
            content_type: "text/plain",
            body: "failed\n".to_owned(),
            headers: Vec::new(),
        });
        return respond(
            &mut stream,
            response.status,
            response.content_type,
            &response.body,
            &response.headers,
        )
        .await;
    }
    if method != "GET" {
        return respond(
            &mut stream,
            "405 Method Not Allowed",
            "text/plain",
            "GET only\n",
            &[],
        )
        .await;
    }
    match route {
        "/metrics" => {
            let body = super::metrics::render(registry);
            respond(
                &mut stream,
                "200 OK",
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                &body,
                &[],
            )
            .await
        }
        "/health" => match unhealthy(app) {
            None => respond(&mut stream, "200 OK", "text/plain", "ok\n", &[]).await,
            Some(why) => {
                respond(
                    &mut stream,
                    "503 Service Unavailable",
                    "text/plain",
                    &format!("{why}\n"),
                    &[],
                )
                .await
            }
        },
        _ => {
            respond(
                &mut stream,
                "404 Not Found",
                "text/plain",
                "try /metrics or /health\n",
                &[],
            )
            .await
        }
    }
}

/// Why a web console request is refused before its credentials are even
/// looked at: a console on a non-loopback address without TLS (passwords
/// would travel in clear), or a change that a browser could have been made
/// to send from another site (no JSON content type, a foreign Origin,
/// `Sec-Fetch-Site: cross-site`).
fn web_refusal(
    app: &App,
    tls: bool,
    method: &str,
    header: &impl Fn(&str) -> Option<String>,
) -> Option<super::web::Response> {
    use super::web::Response;
    let config = app.config();
    let loopback = config
        .settings
        .metrics_addr
        .as_deref()
        .and_then(|a| a.parse::<std::net::SocketAddr>().ok())
        .is_some_and(|a| a.ip().is_loopback());
    if !tls && !loopback {
        return Some(Response::error(
            "403 Forbidden",
            "the web console on a non-loopback metrics_addr needs TLS (client_tls_key_file and \
             client_tls_cert_file)",
        ));
    }
    if method == "GET" {
        return None;
    }
    // A cross-site form can only POST (PATCH and DELETE need a preflight
    // sluice never answers), and never with a JSON content type.
    let json = method != "POST"
        || header("content-type").is_some_and(|t| {
            t.trim()
                .to_ascii_lowercase()
                .starts_with("application/json")
        });
    let cross_site = header("sec-fetch-site").is_some_and(|s| s.trim() == "cross-site");
    let foreign = match (header("origin"), header("host")) {
        (Some(origin), Some(host)) => {
            let origin = origin.trim();
            let origin_host = origin.split_once("://").map_or(origin, |(_, h)| h);
            !origin_host.eq_ignore_ascii_case(host.trim())
        }
        (Some(_), None) => true,
        (None, _) => false,
    };
    (!json || cross_site || foreign).then(|| {
        Response::error(
            "403 Forbidden",
            "changes need Content-Type: application/json from the console's own origin",
        )
    })
}

async fn respond<S: AsyncWrite + Unpin>(
    stream: &mut S,
    status: &str,
    content_type: &str,
    body: &str,
    extra: &[String],
) -> std::io::Result<()> {
    let mut head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for line in extra {
        head.push_str(line);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_address_holds_a_few_places_and_gives_them_back() {
        let counts = Arc::new(PerAddress::default());
        let a: std::net::IpAddr = [127, 0, 0, 2].into();
        let b: std::net::IpAddr = [127, 0, 0, 3].into();
        let held: Vec<_> = (0..CONNECTIONS_PER_ADDRESS)
            .map(|_| PerAddress::take(&counts, a).expect("a place"))
            .collect();
        assert!(
            PerAddress::take(&counts, a).is_none(),
            "a's places are taken"
        );
        assert!(PerAddress::take(&counts, b).is_some(), "b has its own");
        drop(held);
        assert!(PerAddress::take(&counts, a).is_some(), "given back");
        assert!(
            counts.0.lock().expect("lock").is_empty(),
            "no address left counted"
        );
    }
}
