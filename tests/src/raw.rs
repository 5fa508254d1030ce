//! A minimal hand-written protocol v3 client over a raw TCP socket, for what
//! real drivers cannot do: send garbage or truncated startup packets,
//! SSLRequest, or nothing at all, and watch exactly what sluice answers.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Protocol version 3.0.
const PROTOCOL_V3: i32 = 196_608;
/// The SSLRequest code.
const SSL_REQUEST_CODE: i32 = 80_877_103;

/// What came back from the socket.
#[derive(Debug, PartialEq, Eq)]
pub enum RawReply {
    /// A complete backend message: type byte and body.
    Message(u8, Vec<u8>),
    /// The peer closed (or reset) the connection.
    Closed,
    /// Nothing complete arrived in time.
    TimedOut,
}

/// A raw TCP connection to sluice.
#[derive(Debug)]
pub struct RawClient {
    stream: TcpStream,
}

impl RawClient {
    /// Connects to 127.0.0.1:`port`.
    pub async fn connect(port: u16) -> RawClient {
        let stream = tokio::time::timeout(
            Duration::from_secs(10),
            TcpStream::connect(("127.0.0.1", port)),
        )
        .await
        .expect("TCP connect to sluice timed out")
        .expect("TCP connect to sluice");
        RawClient { stream }
    }

    /// Connects to 127.0.0.1:`port` and logs in as `user` to `db` (trust).
    pub async fn logged_in(port: u16, user: &str, db: &str) -> RawClient {
        let mut raw = Self::connect(port).await;
        raw.startup(user, db).await;
        raw.read_until_ready(Duration::from_secs(10)).await;
        raw
    }

    /// Connects to 127.0.0.1:`port` with a receive buffer of `bytes` (the
    /// kernel may round it): a client that reads slowly fills it soon.
    pub async fn connect_with_recv_buffer(port: u16, bytes: u32) -> RawClient {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket.set_recv_buffer_size(bytes).expect("SO_RCVBUF");
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let stream = tokio::time::timeout(Duration::from_secs(10), socket.connect(addr))
            .await
            .expect("TCP connect to sluice timed out")
            .expect("TCP connect to sluice");
        RawClient { stream }
    }

    /// The TCP stream, for a test that reads and writes at once.
    pub fn into_stream(self) -> TcpStream {
        self.stream
    }

    /// The client side's port.
    pub fn local_port(&self) -> u16 {
        self.stream.local_addr().map_or(0, |a| a.port())
    }

    /// Writes `bytes`; an error (peer already gone) is returned, not raised.
    pub async fn send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.stream.write_all(bytes).await?;
        self.stream.flush().await
    }

    /// Half-closes the connection (no more data from us).
    pub async fn shutdown_write(&mut self) {
        let _ = self.stream.shutdown().await;
    }

    /// Reads exactly one byte (the answer to SSLRequest).
    pub async fn read_byte(&mut self, timeout: Duration) -> RawReply {
        let mut byte = [0u8; 1];
        match tokio::time::timeout(timeout, self.stream.read_exact(&mut byte)).await {
            Ok(Ok(_)) => RawReply::Message(byte[0], Vec::new()),
            Ok(Err(_)) => RawReply::Closed,
            Err(_) => RawReply::TimedOut,
        }
    }

    /// Reads one backend message.
    pub async fn read_message(&mut self, timeout: Duration) -> RawReply {
        match tokio::time::timeout(timeout, self.read_message_unbounded()).await {
            Ok(Some((kind, body))) => RawReply::Message(kind, body),
            Ok(None) => RawReply::Closed,
            Err(_) => RawReply::TimedOut,
        }
    }

    async fn read_message_unbounded(&mut self) -> Option<(u8, Vec<u8>)> {
        let mut header = [0u8; 5];
        self.stream.read_exact(&mut header).await.ok()?;
        let len = i32::from_be_bytes([header[1], header[2], header[3], header[4]]);
        let body_len = usize::try_from(len.checked_sub(4)?).ok()?;
        let mut body = vec![0u8; body_len];
        self.stream.read_exact(&mut body).await.ok()?;
        Some((header[0], body))
    }

    /// Reads until the peer sends an ErrorResponse or closes; panics on any
    /// other outcome (a success message, or silence past `timeout`).
    /// Returns the error's fields, or `None` when it just closed.
    pub async fn expect_error_or_close(&mut self, timeout: Duration) -> Option<Vec<(u8, String)>> {
        loop {
            match self.read_message(timeout).await {
                RawReply::Message(b'E', body) => return Some(error_fields(&body)),
                RawReply::Message(b'N', _) => continue,
                RawReply::Closed => return None,
                other => panic!("expected an ErrorResponse or a close, got {other:?}"),
            }
        }
    }

    /// Sends a v3 startup packet for `user` and `db`.
    pub async fn startup(&mut self, user: &str, db: &str) {
        self.send(&startup_packet(&[("user", user), ("database", db)]))
            .await
            .expect("send startup packet");
    }

    /// Reads messages until ReadyForQuery; panics on an error or a close.
    /// Only works for logins that need no password (trust).
    pub async fn read_until_ready(&mut self, timeout: Duration) {
        loop {
            match self.read_message(timeout).await {
                RawReply::Message(b'Z', _) => return,
                RawReply::Message(b'E', body) => {
                    panic!("login failed: {:?}", error_fields(&body))
                }
                RawReply::Message(b'R', body) if body.get(..4) != Some(&[0, 0, 0, 0]) => {
                    panic!("sluice asked for a password ({body:?}); use auth_type=trust")
                }
                RawReply::Message(..) => continue,
                other => panic!("login did not complete: {other:?}"),
            }
        }
    }

    /// Message types up to ReadyForQuery, each error's SQLSTATE after its
    /// `E`; panics on a close or silence past `timeout`.
    pub async fn kinds_until_ready(&mut self, timeout: Duration) -> String {
        let (kinds, ready) = self.kinds_until(timeout).await;
        assert!(ready, "no ReadyForQuery (got {kinds:?}, then the end)");
        kinds
    }

    /// `kinds_until_ready`, or what came before the connection ended.
    pub async fn kinds_until_ready_or_close(&mut self, timeout: Duration) -> String {
        self.kinds_until(timeout).await.0
    }

    /// Message types up to ReadyForQuery (true) or the connection's end
    /// (false); panics on silence past `timeout`.
    async fn kinds_until(&mut self, timeout: Duration) -> (String, bool) {
        let mut kinds = String::new();
        loop {
            match self.read_message(timeout).await {
                RawReply::Message(kind, body) => {
                    kinds.push(char::from(kind));
                    if kind == b'E' {
                        kinds.push_str(error_field(&error_fields(&body), b'C').unwrap_or("?"));
                    }
                    if kind == b'Z' {
                        return (kinds, true);
                    }
                }
                RawReply::Closed => return (kinds, false),
                other => panic!("no ReadyForQuery (got {kinds:?}, then {other:?})"),
            }
        }
    }

    /// Runs `sql` with the simple protocol and returns the first column of
    /// every row (NULL as `None`); panics on an error.
    pub async fn simple_query(&mut self, sql: &str, timeout: Duration) -> Vec<Option<String>> {
        self.simple_query_bytes(sql.as_bytes(), timeout)
            .await
            .into_iter()
            .map(|cell| cell.map(|b| String::from_utf8_lossy(&b).into_owned()))
            .collect()
    }

    /// `simple_query` in bytes, for a session whose client_encoding is
    /// not UTF-8.
    pub async fn simple_query_bytes(
        &mut self,
        sql: &[u8],
        timeout: Duration,
    ) -> Vec<Option<Vec<u8>>> {
        self.send(&query_bytes(sql)).await.expect("send query");
        let shown = String::from_utf8_lossy(sql);
        let mut rows = Vec::new();
        loop {
            match self.read_message(timeout).await {
                RawReply::Message(b'D', body) => rows.push(first_column(&body)),
                RawReply::Message(b'Z', _) => return rows,
                RawReply::Message(b'E', body) => {
                    panic!("query {shown:?} failed: {:?}", error_fields(&body))
                }
                RawReply::Message(..) => continue,
                other => panic!("query {shown:?} got no answer: {other:?}"),
            }
        }
    }
}

/// A simple Query message.
pub fn query_message(sql: &str) -> Vec<u8> {
    query_bytes(sql.as_bytes())
}

fn query_bytes(sql: &[u8]) -> Vec<u8> {
    let mut message = vec![b'Q'];
    let len = i32::try_from(4 + sql.len() + 1).expect("query fits");
    message.extend_from_slice(&len.to_be_bytes());
    message.extend_from_slice(sql);
    message.push(0);
    message
}

/// The unnamed statement of `sql` parsed, bound and executed, then `end`:
/// b'H' (Flush: answer now, the batch stays open) or b'S' (Sync).
pub fn execute_message(sql: &str, end: u8) -> Vec<u8> {
    let mut parse = vec![0];
    parse.extend_from_slice(sql.as_bytes());
    parse.extend_from_slice(&[0, 0, 0]);
    let mut out = Vec::new();
    for (tag, body) in [
        (b'P', &parse[..]),
        (b'B', &[0u8; 8][..]),
        (b'E', &[0u8; 5][..]),
        (end, &[][..]),
    ] {
        out.push(tag);
        out.extend_from_slice(&length_prefixed(body));
    }
    out
}

/// A v3 StartupMessage with the given parameters.
pub fn startup_packet(params: &[(&str, &str)]) -> Vec<u8> {
    let mut body = PROTOCOL_V3.to_be_bytes().to_vec();
    for (key, value) in params {
        body.extend_from_slice(key.as_bytes());
        body.push(0);
        body.extend_from_slice(value.as_bytes());
        body.push(0);
    }
    body.push(0);
    length_prefixed(&body)
}

/// An SSLRequest packet.
pub fn ssl_request() -> Vec<u8> {
    length_prefixed(&SSL_REQUEST_CODE.to_be_bytes())
}

/// `body` preceded by its Int32 length (which counts itself).
pub fn length_prefixed(body: &[u8]) -> Vec<u8> {
    let len = i32::try_from(body.len() + 4).expect("packet fits");
    let mut packet = len.to_be_bytes().to_vec();
    packet.extend_from_slice(body);
    packet
}

/// The (code, value) fields of an ErrorResponse or NoticeResponse body.
pub fn error_fields(body: &[u8]) -> Vec<(u8, String)> {
    body.split(|b| *b == 0)
        .filter(|field| !field.is_empty())
        .map(|field| (field[0], String::from_utf8_lossy(&field[1..]).into_owned()))
        .collect()
}

/// The value of field `code` (b'C' for SQLSTATE, b'M' for the message).
pub fn error_field(fields: &[(u8, String)], code: u8) -> Option<&str> {
    fields
        .iter()
        .find(|(c, _)| *c == code)
        .map(|(_, v)| v.as_str())
}

fn first_column(data_row: &[u8]) -> Option<Vec<u8>> {
    let len = i32::from_be_bytes(data_row.get(2..6)?.try_into().ok()?);
    let len = usize::try_from(len).ok()?;
    Some(data_row.get(6..6 + len)?.to_vec())
}
