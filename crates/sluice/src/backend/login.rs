//! Opening a server connection: connect within `server_connect_timeout`, send
//! the startup packet, answer cleartext, md5 or SCRAM-SHA-256 challenges,
//! collect ParameterStatus and BackendKeyData, run `connect_query`.

use bytes::BytesMut;
use sluice_wire::{
    Authentication, BackendKeyData, ErrorFields, MessageBuilder, ParameterStatus, PasswordMessage,
    encode_query, encode_startup, sasl_initial_response, sasl_response,
    tags::{backend, frontend},
};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpStream, UnixStream};

use super::server::ServerConn;
use super::target::{ServerAddr, ServerCredential, ServerTarget};
use crate::auth::{md5, scram};
use crate::codec::{ReadError, read_message};
use crate::net::Stream;
use crate::params::{ParamSet, tracked_name};

/// Largest message accepted from a server during login.
const LOGIN_MESSAGE_LIMIT: usize = 1 << 20;

/// Why a server connection could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum LoginError {
    #[error("could not connect to server {addr}: {source}")]
    Connect {
        addr: String,
        source: std::io::Error,
    },
    #[error("server login timed out")]
    Timeout,
    #[error("{message}")]
    Rejected { code: String, message: String },
    #[error("server requested {0}, which sluice cannot answer")]
    Unsupported(String),
    #[error(
        "no password for server user {0} (set password= in [databases] or add the user to auth_file)"
    )]
    NoPassword(String),
    #[error("server SCRAM exchange failed: {0}")]
    Scram(#[from] scram::ScramError),
    #[error("server connection: {0}")]
    Read(#[from] ReadError),
    #[error("{0}")]
    Tls(String),
}

impl LoginError {
    /// SQLSTATE to show a client that waited for this login.
    pub fn sqlstate(&self) -> &str {
        match self {
            Self::Rejected { code, .. } => code,
            Self::Timeout | Self::Connect { .. } | Self::Read(_) | Self::Tls(_) => "08006",
            _ => "28000",
        }
    }
}

impl From<std::io::Error> for LoginError {
    fn from(e: std::io::Error) -> Self {
        Self::Read(ReadError::Io(e))
    }
}

/// All ParameterStatus values a server sent at login, to greet clients with.
pub type Reported = Vec<(String, String)>;

/// Opens and logs in one server connection.
pub async fn open(
    target: &ServerTarget,
    credential: &ServerCredential,
) -> Result<(Box<ServerConn>, Reported), LoginError> {
    tokio::time::timeout(target.connect_timeout, open_inner(target, credential))
        .await
        .map_err(|_| LoginError::Timeout)?
}

async fn connect(
    addr: &ServerAddr,
    keepalive: &crate::net::Keepalive,
    dns: super::dns::DnsTtl,
    tls: &crate::tls::ServerTls,
) -> Result<Stream, LoginError> {
    let err = |source| LoginError::Connect {
        addr: addr.to_string(),
        source,
    };
    match addr {
        ServerAddr::Tcp { host, port } => {
            let s = super::dns::connect(host, *port, dns).await.map_err(err)?;
            s.set_nodelay(true).map_err(err)?;
            keepalive.apply(&s);
            if let Some(why) = tls.refusal() {
                return Err(LoginError::Tls(why.to_owned()));
            }
            if !tls.requests() {
                return Ok(Stream::plain_tcp(s));
            }
            match start_tls(s, host, tls).await {
                // prefer: a handshake that fails is retried in plain TCP on
                // a new connection, as libpq does.
                Err(LoginError::Tls(why)) if !tls.required() => {
                    tracing::warn!("{why}; server_tls_sslmode=prefer: connecting without TLS");
                    let s = super::dns::connect(host, *port, dns).await.map_err(err)?;
                    s.set_nodelay(true).map_err(err)?;
                    keepalive.apply(&s);
                    Ok(Stream::plain_tcp(s))
                }
                other => other,
            }
        }
        ServerAddr::Unix(path) => Ok(Stream::plain_unix(
            UnixStream::connect(path).await.map_err(err)?,
        )),
    }
}

/// Connects to the target's address, or to the first of its host list
/// that answers, in `load_balance_hosts` order (each try bounded by a
/// share of `server_connect_timeout`). Returns the host's index too.
async fn connect_any(target: &ServerTarget) -> Result<(Stream, u8), LoginError> {
    let hosts = &target.alternates;
    if hosts.addrs.is_empty() {
        let s = connect(&target.addr, &target.keepalive, target.dns, &target.tls).await?;
        return Ok((s, 0));
    }
    let share =
        (target.connect_timeout / hosts.addrs.len() as u32).max(std::time::Duration::from_secs(1));
    let mut last = None;
    for i in hosts.order() {
        let addr = &hosts.addrs[i];
        match tokio::time::timeout(
            share,
            connect(addr, &target.keepalive, target.dns, &target.tls),
        )
        .await
        {
            Ok(Ok(s)) => return Ok((s, u8::try_from(i).unwrap_or(0))),
            Ok(Err(e)) => {
                tracing::warn!("server {addr}: {e}; trying the next host of the list");
                last = Some(e);
            }
            Err(_) => {
                tracing::warn!("server {addr}: no answer within {share:?}; trying the next host");
                last = Some(LoginError::Timeout);
            }
        }
    }
    Err(last.unwrap_or(LoginError::Timeout))
}

/// Asks the server for TLS (SSLRequest) and runs the handshake when it
/// agrees; a refusal is plain TCP unless the sslmode requires TLS. (Unix
/// sockets are never asked, as libpq never asks.)
async fn start_tls(
    mut tcp: TcpStream,
    host: &str,
    tls: &crate::tls::ServerTls,
) -> Result<Stream, LoginError> {
    use tokio::io::AsyncReadExt;
    let mut out = BytesMut::with_capacity(8);
    sluice_wire::encode_ssl_request(&mut out);
    tcp.write_all(&out).await?;
    // One byte, read alone: nothing the server sends after it may be taken
    // as plain text.
    let mut answer = [0u8; 1];
    tcp.read_exact(&mut answer).await?;
    match answer[0] {
        b'S' => {
            tls.connect(tcp, host).await.map(Stream::Tls).map_err(|e| {
                LoginError::Tls(format!("TLS handshake with server {host} failed: {e}"))
            })
        }
        b'N' if !tls.required() => Ok(Stream::plain_tcp(tcp)),
        b'N' => Err(LoginError::Tls(format!(
            "server {host} does not support TLS, and server_tls_sslmode requires it"
        ))),
        other => Err(LoginError::Tls(format!(
            "server {host} answered SSLRequest with {:?}",
            char::from(other)
        ))),
    }
}

async fn open_inner(
    target: &ServerTarget,
    credential: &ServerCredential,
) -> Result<(Box<ServerConn>, Reported), LoginError> {
    let (mut stream, alternate) = connect_any(target).await?;
    let mut out = BytesMut::with_capacity(256);
    let mut params = vec![
        ("user", target.user.as_str()),
        ("database", target.dbname.as_str()),
    ];
    params.extend(
        target
            .startup_params
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str())),
    );
    encode_startup(&mut out, params);
    stream.write_all(&out).await?;

    let mut buf = BytesMut::with_capacity(1024);
    let mut scram_exchange: Option<scram::ClientExchange> = None;
    let mut key = BackendKeyData {
        process_id: 0,
        secret_key: 0,
    };
    let mut tracked = ParamSet::default();
    let mut reported = Reported::new();
    loop {
        let (tag, body) = read_message(&mut stream, &mut buf, LOGIN_MESSAGE_LIMIT).await?;
        match tag {
            backend::AUTHENTICATION => {
                out.clear();
                match Authentication::decode(&body).map_err(ReadError::from)? {
                    Authentication::Ok => continue,
                    Authentication::CleartextPassword => {
                        let pw = credential
                            .password
                            .as_deref()
                            .ok_or_else(|| LoginError::NoPassword(target.user.clone()))?;
                        PasswordMessage::encode_password(&mut out, pw);
                    }
                    Authentication::Md5Password { salt } => {
                        let hash = match (&credential.password, &credential.md5_hash) {
                            (Some(pw), _) => md5::password_hash(pw, &target.user),
                            (None, Some(h)) => h.clone(),
                            _ => return Err(LoginError::NoPassword(target.user.clone())),
                        };
                        PasswordMessage::encode_password(
                            &mut out,
                            &md5::salted_response(&hash, &salt),
                        );
                    }
                    Authentication::Sasl { mechanisms } => {
                        if !mechanisms.contains(&"SCRAM-SHA-256") {
                            return Err(LoginError::Unsupported(mechanisms.join(",")));
                        }
                        let cred = match (&credential.password, &credential.scram_keys) {
                            (Some(pw), _) => scram::ClientCredential::Password(pw.clone()),
                            (None, Some(k)) => scram::ClientCredential::Keys(k.clone()),
                            _ => return Err(LoginError::NoPassword(target.user.clone())),
                        };
                        let (ex, first) = scram::ClientExchange::start(cred);
                        scram_exchange = Some(ex);
                        sasl_initial_response(&mut out, "SCRAM-SHA-256", first.as_bytes());
                    }
                    Authentication::SaslContinue { data } => {
                        let ex = scram_exchange
                            .as_mut()
                            .ok_or_else(|| LoginError::Unsupported("SASL out of order".into()))?;
                        sasl_response(&mut out, ex.respond(data)?.as_bytes());
                    }
                    Authentication::SaslFinal { data } => {
                        let ex = scram_exchange
                            .as_ref()
                            .ok_or_else(|| LoginError::Unsupported("SASL out of order".into()))?;
                        ex.verify(data)?;
                        continue;
                    }
                    Authentication::Unsupported { code } => {
                        return Err(LoginError::Unsupported(format!(
                            "authentication method {code}"
                        )));
                    }
                }
                stream.write_all(&out).await?;
            }
            backend::PARAMETER_STATUS => {
                let p = ParameterStatus::decode(&body).map_err(ReadError::from)?;
                if let Some(name) = tracked_name(p.name) {
                    tracked.set(name, p.value);
                }
                reported.push((p.name.to_owned(), p.value.to_owned()));
            }
            backend::BACKEND_KEY_DATA => {
                key = BackendKeyData::decode(&body).map_err(ReadError::from)?;
            }
            backend::ERROR_RESPONSE => return Err(rejected(&body)),
            backend::READY_FOR_QUERY => break,
            _ => {} // NoticeResponse, NegotiateProtocolVersion
        }
    }
    let mut server = Box::new(ServerConn::new(stream, key, tracked));
    server.alternate = alternate;
    server.standby = reported
        .iter()
        .any(|(name, value)| name == "in_hot_standby" && value == "on");
    server.sql_ascii = reported
        .iter()
        .any(|(name, value)| name == "server_encoding" && value == "SQL_ASCII");
    server.buf = buf;
    if let Some(q) = &target.connect_query {
        run_query(&mut server, q).await?;
    }
    // Its login's sends are done (it answered them): the ring forgets
    // them, so the server may move to another worker. (Were one still
    // pending, the server could not move: `put_back` closes it, and a
    // lease on another worker fails to take it and opens another.)
    let _ = server.stream.settled();
    Ok((server, reported))
}

fn text_row(body: &[u8]) -> Result<TextRow, sluice_wire::WireError> {
    let mut r = sluice_wire::Reader::new(body);
    let columns = r.i16()?;
    (0..columns)
        .map(|_| {
            let len = r.i32()?;
            if len < 0 {
                return Ok(None);
            }
            let bytes = r.bytes(len as usize)?;
            Ok(Some(String::from_utf8_lossy(bytes).into_owned()))
        })
        .collect()
}

fn rejected(body: &[u8]) -> LoginError {
    match ErrorFields::decode(body) {
        Ok(f) => LoginError::Rejected {
            code: f.code.to_owned(),
            message: f.message.to_owned(),
        },
        Err(e) => LoginError::Read(e.into()),
    }
}

/// Runs `sql` on an idle server and waits for ReadyForQuery, discarding
/// results. Tracked ParameterStatus values update `server.params`. An
/// ErrorResponse is returned as `Rejected` after the server is ready again.
pub async fn run_query(server: &mut ServerConn, sql: &str) -> Result<(), LoginError> {
    run_query_rows(server, sql).await.map(drop)
}

/// A row of text values (None: NULL).
pub type TextRow = Vec<Option<String>>;

/// Like [`run_query`], returning the rows (text format) of its results.
pub async fn run_query_rows(
    server: &mut ServerConn,
    sql: &str,
) -> Result<Vec<TextRow>, LoginError> {
    query_rows(server, sql, false).await
}

/// Like [`run_query_rows`] for a text of several statements, returning the
/// rows of the first one only (the others run for their effects).
pub async fn run_query_first_rows(
    server: &mut ServerConn,
    sql: &str,
) -> Result<Vec<TextRow>, LoginError> {
    query_rows(server, sql, true).await
}

async fn query_rows(
    server: &mut ServerConn,
    sql: &str,
    first_only: bool,
) -> Result<Vec<TextRow>, LoginError> {
    let mut out = BytesMut::with_capacity(sql.len() + 6);
    encode_query(&mut out, sql);
    server.stream.write_all(&out).await?;
    Ok(read_rows(server, sql, usize::MAX, first_only, b'I')
        .await?
        .0)
}

/// Runs `sql` with text parameters `$1…` (extended protocol, unnamed
/// statement and portal), returning its first `max_rows` rows in text
/// format and how many it returned: a value from a client (a user name) is
/// never spliced into SQL.
pub async fn run_query_params(
    server: &mut ServerConn,
    sql: &str,
    params: &[&str],
    max_rows: usize,
) -> Result<(Vec<TextRow>, usize), LoginError> {
    // The unnamed statement is now sluice's own, which no client may bind
    // (review 31 ran auth_query's lookup from a client of its pool): the
    // next client's link closes it (`tracked::settle_unnamed`).
    server.statements.unnamed = Some(crate::prepared::client_names::Owner::default());
    let mut out = BytesMut::with_capacity(sql.len() + 64);
    MessageBuilder::new(&mut out, frontend::PARSE)
        .cstr("")
        .cstr(sql)
        .i16(0)
        .finish();
    let mut bind = MessageBuilder::new(&mut out, frontend::BIND)
        .cstr("")
        .cstr("")
        .i16(0)
        .i16(params.len() as i16);
    for p in params {
        bind = bind.i32(p.len() as i32).bytes(p.as_bytes());
    }
    bind.i16(0).finish();
    MessageBuilder::new(&mut out, frontend::EXECUTE)
        .cstr("")
        .i32(0)
        .finish();
    MessageBuilder::new(&mut out, frontend::SYNC).finish();
    server.stream.write_all(&out).await?;
    read_rows(server, sql, max_rows, false, b'I').await
}

/// Sends a client's Query message that opens a transaction block (a
/// deferred `BEGIN`) and reads its answer: an error, or a server left
/// outside a block, fails.
pub async fn open_block(server: &mut ServerConn, query: &[u8]) -> Result<(), LoginError> {
    server.stream.write_all(query).await?;
    read_rows(server, "BEGIN", 0, false, b'T').await.map(drop)
}

/// Reads a query's results up to ReadyForQuery: its first `max_rows`
/// DataRows and their count, or its error; with `first_only`, the rows
/// of the first statement only. The server must then be `status` ('I',
/// between transactions; 'T', in a block).
async fn read_rows(
    server: &mut ServerConn,
    sql: &str,
    max_rows: usize,
    first_only: bool,
    status: u8,
) -> Result<(Vec<TextRow>, usize), LoginError> {
    let mut rows = Vec::new();
    let mut count = 0usize;
    let mut failure = None;
    let mut first_done = false;
    loop {
        let (tag, body) =
            read_message(&mut server.stream, &mut server.buf, LOGIN_MESSAGE_LIMIT).await?;
        match tag {
            backend::PARAMETER_STATUS => {
                let p = ParameterStatus::decode(&body).map_err(ReadError::from)?;
                if let Some(name) = tracked_name(p.name) {
                    crate::params::update_shared(&mut server.params, name, p.value);
                }
            }
            backend::ERROR_RESPONSE => failure = Some(rejected(&body)),
            backend::COMMAND_COMPLETE => first_done = first_only,
            backend::DATA_ROW if first_done => {}
            backend::DATA_ROW => {
                count += 1;
                if rows.len() < max_rows {
                    rows.push(text_row(&body).map_err(ReadError::from)?);
                }
            }
            backend::COPY_IN_RESPONSE | backend::COPY_BOTH_RESPONSE => {
                return Err(LoginError::Unsupported("COPY in an internal query".into()));
            }
            backend::READY_FOR_QUERY => {
                return match failure {
                    Some(f) => Err(f),
                    None if body.first() == Some(&status) => Ok((rows, count)),
                    None => Err(LoginError::Unsupported(format!(
                        "internal query {sql:?} left the server in the wrong transaction state"
                    ))),
                };
            }
            _ => {}
        }
    }
}
