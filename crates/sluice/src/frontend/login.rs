//! A client's way in: SSL/GSS negotiation (refused for now), cancel
//! requests, the startup packet, limits, authentication, the pool lookup and
//! the greeting (AuthenticationOk, ParameterStatus, BackendKeyData,
//! ReadyForQuery).

use std::sync::Arc;

use bytes::BytesMut;
use sluice_wire::{
    Authentication, ParameterStatus, StartupPacket, StartupParams, TransactionStatus,
    negotiate_protocol_version, ready_for_query,
};
use tokio::io::AsyncWriteExt;

use super::auth::{Known, authenticate};
use super::client::Client;
use super::error::ClientError;
use crate::admin::{CONSOLE_DATABASES, Role, role_of};
use crate::app::{App, Phase};
use crate::auth::Learnt;
use crate::codec::{ReadError, read_startup};
use crate::net::Stream;
use crate::params::{ParamSet, tracked_name};
use crate::session_vars::SessionVars;
use sluice_config::AuthType;

/// Startup parameters that are not run-time settings.
const STRUCTURAL_PARAMS: &[&str] = &["user", "database", "replication", "options"];

/// Where a login leads.
pub enum Admitted {
    /// Boxed: the connection's task then holds a pointer, not the client
    /// twice (as login's result and as the session's), which keeps every
    /// idle client's task in a smaller allocation.
    Client(Box<Client>),
    /// The admin console, with the user's role.
    Console(Stream, Role),
}

/// What login_inner decided, before the stream joins it.
enum Decided {
    Pooled(Box<LoggedIn>),
    Console(Role),
    /// The client asked for TLS and was answered `S`: the handshake comes
    /// next, then the startup packet again.
    StartTls,
}

/// First byte of a TLS record carrying a handshake (a ClientHello sent
/// without SSLRequest: direct TLS).
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// Runs the login of one connection, until `deadline` (client_login_timeout:
/// past it the client is told so, 08P01, as PgBouncer does). `Ok(None)`:
/// the connection was a cancel request (or a TLS handshake that failed) and
/// is done.
pub async fn login(
    app: &Arc<App>,
    mut stream: Stream,
    over_client_limit: bool,
    deadline: Option<tokio::time::Instant>,
) -> Result<Option<Admitted>, (Stream, ClientError)> {
    let timed_out = || {
        tracing::info!("closing because: client_login_timeout");
        ClientError::protocol("client_login_timeout")
    };
    let tls = app.client_tls();
    if tls.offers()
        && let Stream::Tcp(tcp) = &stream
    {
        let mut first = [0u8; 1];
        let peeked = match deadline {
            Some(at) => tokio::time::timeout_at(at, tcp.peek(&mut first)).await,
            None => Ok(tcp.peek(&mut first).await),
        };
        let Ok(peeked) = peeked else {
            return Err((stream, timed_out()));
        };
        if peeked.is_ok() && first[0] == TLS_HANDSHAKE_RECORD {
            stream = match upgrade(&tls, stream, true, deadline).await {
                Some(s) => s,
                None => return Ok(None),
            };
        }
    }
    loop {
        let step = login_inner(app, &mut stream, over_client_limit, &tls);
        let decided = match deadline {
            Some(at) => tokio::time::timeout_at(at, step).await,
            None => Ok(step.await),
        };
        let Ok(decided) = decided else {
            return Err((stream, timed_out()));
        };
        match decided {
            Ok(Some(Decided::Pooled(parts))) => {
                return Ok(Some(Admitted::Client(Box::new(parts.into_client(stream)))));
            }
            Ok(Some(Decided::Console(role))) => return Ok(Some(Admitted::Console(stream, role))),
            Ok(Some(Decided::StartTls)) => {
                stream = match upgrade(&tls, stream, false, deadline).await {
                    Some(s) => s,
                    None => return Ok(None),
                };
            }
            Ok(None) => return Ok(None),
            Err(e) => return Err((stream, e)),
        }
    }
}

/// The TLS handshake on a TCP client, within the login's `deadline`
/// (client_login_timeout) as well as its own limit; `None` when it failed
/// or took too long (logged; no PostgreSQL error can reach a client whose
/// handshake did not finish).
async fn upgrade(
    tls: &crate::tls::ClientTls,
    stream: Stream,
    direct: bool,
    deadline: Option<tokio::time::Instant>,
) -> Option<Stream> {
    let Stream::Tcp(tcp) = stream else {
        return None;
    };
    let peer = tcp.peer_addr().map(|a| a.to_string()).unwrap_or_default();
    // Nothing is left in the worker's ring: the answer to SSLRequest was
    // flushed (direct TLS writes nothing before).
    let Ok(tcp) = tcp.into_inner() else {
        tracing::warn!(peer = %peer, "TLS handshake: a send still in flight");
        return None;
    };
    let accepted = match deadline {
        Some(at) => match tokio::time::timeout_at(at, tls.accept(tcp, direct)).await {
            Ok(accepted) => accepted,
            Err(_) => {
                tracing::info!(peer = %peer, "closing because: client_login_timeout (TLS handshake)");
                return None;
            }
        },
        None => tls.accept(tcp, direct).await,
    };
    match accepted {
        Ok(s) => Some(Stream::Tls(s)),
        Err(e) => {
            tracing::warn!(peer = %peer, "TLS handshake error: {e}");
            None
        }
    }
}

/// Console logins past `max_client_conn` that may be in progress at once.
const CONSOLE_LOGINS_OVER_LIMIT: usize = 16;

static CONSOLE_LOGINS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// One console login past `max_client_conn`, until it ends.
struct ConsoleLogin;

impl ConsoleLogin {
    fn take() -> Option<Self> {
        use std::sync::atomic::Ordering::Relaxed;
        CONSOLE_LOGINS
            .fetch_update(Relaxed, Relaxed, |n| {
                (n < CONSOLE_LOGINS_OVER_LIMIT).then_some(n + 1)
            })
            .ok()
            .map(|_| ConsoleLogin)
    }
}

impl Drop for ConsoleLogin {
    fn drop(&mut self) {
        CONSOLE_LOGINS.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Gives the client budget back if the login fails after `admit_client`.
struct AdmittedClient<'a> {
    app: &'a App,
    database: &'a str,
    user: &'a str,
    done: bool,
}

impl AdmittedClient<'_> {
    /// The login succeeded: the budget is given back when the client leaves.
    fn keep(mut self) {
        self.done = true;
    }
}

impl Drop for AdmittedClient<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.app.release_client(self.database, self.user);
        }
    }
}

/// Everything login learns, before the stream joins it into a `Client`.
struct LoggedIn {
    app: Arc<App>,
    pool: Arc<crate::backend::pool::Pool>,
    params: Arc<ParamSet>,
    session: Option<Arc<SessionVars>>,
    cancel: crate::backend::cancel::CancelHandle,
    user: String,
    /// What the client sent after its login (see `Carried::early`).
    early: BytesMut,
}

impl LoggedIn {
    fn into_client(self, stream: Stream) -> Client {
        let mut client = Client::new(
            stream,
            self.app,
            self.pool,
            self.params,
            self.cancel,
            self.user,
        );
        if let Some(startup) = &self.session {
            client.carried().startup = Some(startup.clone());
        }
        client.set_session(self.session);
        if !self.early.is_empty() {
            client.carried().early = self.early;
        }
        client
    }
}

async fn login_inner(
    app: &Arc<App>,
    stream: &mut Stream,
    over_client_limit: bool,
    tls: &crate::tls::ClientTls,
) -> Result<Option<Decided>, ClientError> {
    let mut buf = BytesMut::new();
    let mut first = true;
    let (mut ssl_asked, mut gss_asked) = (false, false);
    let (minor, params, unknown_options) = loop {
        let packet = match read_startup(stream, &mut buf).await {
            Ok(packet) => packet,
            // Gone before its first byte: a TCP health check (a load
            // balancer's), not a failed login; nothing to tell or count.
            Err(ReadError::Closed) if first && buf.is_empty() => return Ok(None),
            Err(ReadError::Io(e))
                if first && buf.is_empty() && e.kind() == std::io::ErrorKind::ConnectionReset =>
            {
                return Ok(None);
            }
            Err(e) => return Err(e.into()),
        };
        first = false;
        match packet {
            StartupPacket::SslRequest if tls.offers() && matches!(stream, Stream::Tcp(_)) => {
                // Bytes sent after SSLRequest, before our answer, would be
                // taken as if they came encrypted (CVE-2021-23222's kind).
                if !buf.is_empty() {
                    return Err(ClientError::protocol(
                        "received unencrypted data after SSL request",
                    ));
                }
                // Flushed: the handshake takes the socket itself, with no
                // send of the worker's ring still pending on it.
                stream
                    .write_all(b"S")
                    .await
                    .map_err(|e| ClientError::protocol(e.to_string()))?;
                stream
                    .flush()
                    .await
                    .map_err(|e| ClientError::protocol(e.to_string()))?;
                return Ok(Some(Decided::StartTls));
            }
            StartupPacket::SslRequest | StartupPacket::GssEncRequest
                if matches!(stream, Stream::Tls(_)) =>
            {
                // (PostgreSQL ends such a connection too)
                return Err(ClientError::protocol(
                    "encryption requested on a connection that is already encrypted",
                ));
            }
            StartupPacket::SslRequest | StartupPacket::GssEncRequest => {
                // Each may be asked once (libpq may ask GSSAPI, then SSL);
                // PostgreSQL ends a connection that asks again.
                let asked = match packet {
                    StartupPacket::SslRequest => &mut ssl_asked,
                    _ => &mut gss_asked,
                };
                if std::mem::replace(asked, true) {
                    return Err(ClientError::protocol(
                        "encryption negotiation requested twice",
                    ));
                }
                stream
                    .write_all(b"N")
                    .await
                    .map_err(|e| ClientError::protocol(e.to_string()))?;
            }
            StartupPacket::Cancel(req) => {
                let secret = app.cancels.secret_as_issued(req.secret_key);
                if app.control.is_console_key(req.process_id, secret) {
                    // An admin's Ctrl-C on the console: the global pause
                    // ends, as PgBouncer's (not while shutting down).
                    if app.phase() == crate::app::Phase::Running && app.control.all_paused() {
                        tracing::info!("cancel request from the console: resuming");
                        app.control.resume_all_only();
                    }
                    return Ok(None);
                }
                match app.cancels.for_peer(&req) {
                    Some(Ok((peer, forwarded))) => {
                        let config = app.config();
                        if let Err(e) = app.peers.forward(&config, peer, forwarded).await
                            && crate::backend::peers::may_warn()
                        {
                            tracing::warn!("sending cancel request to peer {peer} failed: {e}");
                        }
                        return Ok(None);
                    }
                    Some(Err(peer)) => {
                        if crate::backend::peers::may_warn() {
                            tracing::warn!(
                                "cancel request for peer {peer} dropped: forwarded three times \
                                 already (is every peer's peer_id unique and in [peers]?)"
                            );
                        }
                        return Ok(None);
                    }
                    None => {}
                }
                let host_target = |pool: &Arc<crate::backend::pool::Pool>, host: u32| {
                    app.host_pool(pool, host as usize - 1, None)
                        .map(|p| p.settings_and_target().1)
                };
                if let Err(e) = app.cancels.cancel(req, host_target).await {
                    tracing::warn!("sending cancel request failed: {e}");
                }
                return Ok(None);
            }
            StartupPacket::Startup {
                minor,
                params,
                unknown_protocol_options,
            } => break (minor, params, unknown_protocol_options),
        }
    };
    if tls.required() && matches!(stream, Stream::Tcp(_)) {
        return Err(ClientError::protocol("SSL required"));
    }
    // SIGTERM (wait for clients) closes the listeners but serves those
    // already accepted: a rolling restart must not refuse them.
    if app.phase() >= Phase::WaitForServers {
        return Err(ClientError::new("57P03", "pooler is shutting down"));
    }
    let user = params
        .get("user")
        .filter(|u| !u.is_empty())
        .ok_or_else(|| {
            ClientError::new(
                "28000",
                "no PostgreSQL user name specified in startup packet",
            )
        })?
        .to_owned();
    let database = params
        .get("database")
        .filter(|d| !d.is_empty())
        .unwrap_or(&user)
        .to_owned();
    // The console is exempt, as PgBouncer's is: an operator must get in
    // to see why the pooler is full (only admin_users and stats_users
    // pass its authentication); a few logins at a time, so that clients
    // that never authenticate cannot take every descriptor (a review held
    // 150 at the password step, nothing but the open files limit above).
    let console = CONSOLE_DATABASES.contains(&database.as_str());
    if over_client_limit && !console {
        return Err(ClientError::new(
            "53300",
            "no more connections allowed (max_client_conn)",
        ));
    }
    let _console_login = match over_client_limit {
        true => Some(ConsoleLogin::take().ok_or_else(|| {
            ClientError::new(
                "53300",
                "no more connections allowed (max_client_conn; console logins in progress)",
            )
        })?),
        false => None,
    };
    if params
        .get("replication")
        .is_some_and(|r| r != "false" && r != "0" && r != "off")
    {
        return Err(ClientError::new(
            "08P01",
            "replication connections are not supported by sluice",
        ));
    }
    let mut out = BytesMut::with_capacity(512);
    if minor > 0 || !unknown_options.is_empty() {
        negotiate_protocol_version(&mut out, 0, &unknown_options);
    }

    let config = app.config();
    if !out.is_empty() {
        stream
            .write_all(&out)
            .await
            .map_err(|e| ClientError::protocol(e.to_string()))?;
        out.clear();
    }
    let learnt = authenticate_client(app, stream, &mut buf, &config, &database, &user).await?;
    if CONSOLE_DATABASES.contains(&database.as_str()) {
        let role = if learnt.local_admin {
            Role::Admin
        } else {
            role_of(app, &user)?
        };
        log_login(&config.settings, stream, "pgbouncer", &user);
        return Ok(Some(Decided::Console(role)));
    }
    if app.control.is_disabled(&database) {
        return Err(ClientError::new(
            "57P03",
            format!("database \"{database}\" is disabled"),
        ));
    }
    app.admit_client(&database, &user).map_err(|limit| {
        ClientError::new("53300", format!("client connections exceeded ({limit})"))
    })?;
    let admitted = AdmittedClient {
        app,
        database: &database,
        user: &user,
        done: false,
    };
    // (a failed login elsewhere that made this pool leaves it to us)
    let (pool, _joining) = app
        .pool_to_join(&database, &user)
        .map_err(|e| ClientError::new("3D000", e.to_string()))?;
    app.learn_secret(&pool, &user, &learnt);
    app.wait_for_members(&pool)
        .await
        .map_err(|message| ClientError::new("08006", message))?;
    // A pool that never had a server opens one for the greeting: not while
    // its database is paused (PgBouncer launches none then either; review
    // 40). The wait ends with the pause, a shutdown or the login's
    // deadline.
    while !pool.has_welcome()
        && app.control.is_paused(&database)
        && app.phase() == crate::app::Phase::Running
    {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let welcome = pool
        .welcome()
        .await
        .map_err(|e| ClientError::new(e.sqlstate(), e.to_string()))?;
    let (mut client_params, session) = client_params(
        &welcome.tracked,
        &params,
        &config.settings.ignore_startup_parameters,
    )?;
    // application_name_add_host: "<name> - <addr>:<port>", PgBouncer's form.
    if config.settings.application_name_add_host
        && let Some(peer) = stream.peer_addr()
    {
        let name = client_params
            .get("application_name")
            .filter(|n| !n.is_empty())
            .unwrap_or("app");
        let with_host = format!("{name} - {}:{}", peer.ip(), peer.port());
        crate::params::update_shared(&mut client_params, "application_name", &with_host);
    }
    let client_params = app.param_sets.intern(client_params);

    let meta = crate::backend::cancel::ClientMeta {
        pool: pool.clone(),
        user: user.clone().into_boxed_str(),
        peer: stream.peer_addr(),
        local: stream.local_addr(),
        connected: std::time::SystemTime::now(),
        // (as PostgreSQL shows it, in NAMEDATALEN - 1 bytes: SHOW CLIENTS
        // of thousands of 9 KB names was tens of megabytes; a review)
        application_name: shown_name(client_params.get("application_name").unwrap_or_default())
            .into(),
        fd: stream.raw_fd(),
        pinned: None,
        tls: stream.tls_description(),
    };
    let exhausted = || {
        ClientError::new(
            "53300",
            "no more connections allowed (cancel keys exhausted)",
        )
    };
    let registration = app.cancels.register_for_login(meta).ok_or_else(exhausted)?;
    let key = registration.key().ok_or_else(exhausted)?;
    Authentication::Ok.encode(&mut out);
    // A database with a topology is one endpoint that takes writes, not a
    // standby, whichever server greeted first (the first host listed may
    // be a replica); one whose entry asks for standbys is one. libpq's
    // `target_session_attrs` reads this.
    let hot_standby = app
        .topology(&database)
        .map(|_| match pool.settings().standby {
            crate::backend::pool::Standby::No => "off",
            _ => "on",
        });
    for (name, value) in &welcome.reported {
        let value = match hot_standby {
            Some(v) if name == "in_hot_standby" => v,
            _ => tracked_name(name)
                .and_then(|t| client_params.get(t))
                .unwrap_or(value),
        };
        ParameterStatus { name, value }.encode(&mut out);
    }
    key.encode(&mut out);
    if !config.settings.login_notify_message.is_empty() {
        sluice_wire::ErrorFields::new(
            sluice_wire::Severity::Notice,
            "00000",
            &config.settings.login_notify_message,
        )
        .encode(&mut out);
    }
    ready_for_query(&mut out, TransactionStatus::Idle);
    if let Err(e) = stream.write_all(&out).await {
        return Err(ClientError::protocol(e.to_string()));
    }
    let cancel = registration.keep().ok_or_else(exhausted)?;
    log_login(&config.settings, stream, &database, &user);
    pool.client_joined();
    admitted.keep();
    Ok(Some(Decided::Pooled(Box::new(LoggedIn {
        app: app.clone(),
        pool,
        params: client_params,
        session,
        cancel,
        user,
        early: buf,
    }))))
}

/// `name` cut to PostgreSQL's NAMEDATALEN - 1 bytes (at a character's
/// start), as pg_stat_activity shows an application_name.
fn shown_name(name: &str) -> &str {
    let mut end = name.len().min(63);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    &name[..end]
}

/// Checks the client's password (or lets it in, as `auth_type` says)
/// against the auth_file or, for a user missing from it, what auth_query
/// finds; returns what the proof teaches the pool about logging in as that
/// user.
async fn authenticate_client(
    app: &Arc<App>,
    stream: &mut Stream,
    buf: &mut BytesMut,
    config: &sluice_config::Config,
    database: &str,
    user: &str,
) -> Result<Learnt, ClientError> {
    let userlist = app.userlist();
    // PgBouncer's usage.md: the console user pgbouncer logs in without a
    // password over the Unix socket from the pooler's own OS user, as admin.
    if CONSOLE_DATABASES.contains(&database)
        && user == "pgbouncer"
        && stream.peer_uid() == Some(crate::auth::rules::own_uid())
    {
        return Ok(Learnt {
            local_admin: true,
            ..Learnt::default()
        });
    }
    let rules = app.auth_rules();
    let auth_type = match config.settings.auth_type {
        AuthType::Hba => by_hba(&rules, stream, database, user).await?,
        AuthType::Cert => {
            certificate_names_user(&rules, stream, None, user)?;
            AuthType::Trust
        }
        t => t,
    };
    if auth_type == AuthType::Trust {
        return known_without_password(app, config, &userlist, database, user).await;
    }
    let (known, disposable) = match app.auth_lookup(database, user) {
        Some(lookup)
            if userlist.get(user).is_none()
                && !CONSOLE_DATABASES.contains(&database)
                && auth_type != AuthType::Any =>
        {
            let found = super::auth_query::lookup(app, &lookup).await?;
            (Known::Queried(found.secret), found.disposable)
        }
        _ => (Known::File(&userlist), None),
    };
    let proven = authenticate(stream, buf, auth_type, &known, user).await;
    if let Some(pool) = disposable
        && proven.is_err()
    {
        app.forget_disposable(&pool);
    }
    // A queried md5 hash (or plain password) the client just answered for
    // is what the pool logs in with as this user.
    let md5_hash = match &known {
        Known::Queried(Some(secret)) => secret.md5_hash(user),
        _ => None,
    };
    Ok(Learnt {
        scram_keys: proven?,
        md5_hash,
        ..Learnt::default()
    })
}

/// A client let in without a password (trust, cert, peer) must still be a
/// user sluice knows, as in PgBouncer: in auth_file or `[users]`, or found
/// by auth_query (a role without a password counts: certificate users
/// often have none). Without an auth_file and auth_user, any name is
/// admitted (warned about at startup for trust).
async fn known_without_password(
    app: &Arc<App>,
    config: &sluice_config::Config,
    userlist: &crate::auth::Userlist,
    database: &str,
    user: &str,
) -> Result<Learnt, ClientError> {
    if userlist.get(user).is_some() || config.user(user).is_some() {
        return Ok(Learnt::default());
    }
    let unknown = || ClientError::new("28000", format!("no such user: \"{user}\""));
    if !CONSOLE_DATABASES.contains(&database)
        && let Some(lookup) = app.auth_lookup(database, user)
    {
        let found = super::auth_query::lookup(app, &lookup).await?;
        if !found.exists {
            if let Some(pool) = found.disposable {
                app.forget_disposable(&pool);
            }
            return Err(unknown());
        }
        return Ok(Learnt {
            md5_hash: found.secret.and_then(|s| s.md5_hash(user)),
            ..Learnt::default()
        });
    }
    if config.settings.auth_file.is_none() {
        return Ok(Learnt::default());
    }
    Err(unknown())
}

/// The `auth_type` the first matching hba line asks of this connection:
/// `Trust` when the line's method needs no password (trust) or already
/// admitted the client (cert, peer); an error when it refuses it (reject,
/// or no line), with PostgreSQL's messages. The console's two names are
/// one database here: a line for `pgbouncer` covers `sluice` too.
async fn by_hba(
    rules: &crate::auth::rules::AuthRules,
    stream: &Stream,
    database: &str,
    user: &str,
) -> Result<AuthType, ClientError> {
    use crate::auth::hba::{Conn, Method};
    let database = if CONSOLE_DATABASES.contains(&database) {
        CONSOLE_DATABASES[0]
    } else {
        database
    };
    let conn = Conn {
        unix: matches!(stream, Stream::Unix(_)),
        tls: matches!(stream, Stream::Tls(_)),
        addr: stream.peer_addr().map(|a| a.ip()),
        database,
        user,
    };
    let describe = || {
        let host = conn
            .addr
            .map_or_else(|| "[local]".to_owned(), |a| a.to_string());
        let encryption = if conn.tls {
            "SSL encryption"
        } else {
            "no encryption"
        };
        format!("host \"{host}\", user \"{user}\", database \"{database}\", {encryption}")
    };
    let rule = rules
        .hba
        .as_ref()
        .and_then(|h| h.decide(&conn))
        .ok_or_else(|| {
            ClientError::new("28000", format!("no pg_hba.conf entry for {}", describe()))
        })?;
    Ok(match rule.method {
        Method::Reject => {
            return Err(ClientError::new(
                "28000",
                format!("pg_hba.conf rejects connection for {}", describe()),
            ));
        }
        Method::Trust => AuthType::Trust,
        Method::Md5 => AuthType::Md5,
        Method::ScramSha256 => AuthType::ScramSha256,
        Method::Password => AuthType::Plain,
        Method::Cert => {
            certificate_names_user(rules, stream, rule.map.as_deref(), user)?;
            AuthType::Trust
        }
        Method::Peer => {
            let no_credentials = || ClientError::new("28000", "could not get peer credentials");
            let uid = stream.peer_uid().ok_or_else(no_credentials)?;
            // The name service may be slow (LDAP, sssd): not on a worker.
            let os_user =
                tokio::task::spawn_blocking(move || crate::auth::rules::os_user_name(uid))
                    .await
                    .ok()
                    .flatten()
                    .ok_or_else(no_credentials)?;
            if !rules.ident.allows(rule.map.as_deref(), &os_user, user) {
                return Err(ClientError::new(
                    "28000",
                    format!("Peer authentication failed for user \"{user}\""),
                ));
            }
            AuthType::Trust
        }
    })
}

/// `cert` authentication: the verified client certificate's CN is `user`
/// (or maps to it).
fn certificate_names_user(
    rules: &crate::auth::rules::AuthRules,
    stream: &Stream,
    map: Option<&str>,
    user: &str,
) -> Result<(), ClientError> {
    let cn = stream.peer_certificate_cn().ok_or_else(|| {
        ClientError::new("28000", "connection requires a valid client certificate")
    })?;
    if rules.ident.allows(map, &cn, user) {
        Ok(())
    } else {
        Err(ClientError::new(
            "28000",
            format!("certificate authentication failed for user \"{user}\""),
        ))
    }
}

/// PgBouncer's `login attempt` line (`log_connections`).
fn log_login(settings: &sluice_config::Settings, stream: &Stream, database: &str, user: &str) {
    if settings.log_connections {
        let tls = stream.tls_description();
        tracing::info!(
            peer = %stream.peer(),
            "login attempt: db={database} user={user} tls={} replication=no",
            tls.as_deref().unwrap_or("no")
        );
    }
}

/// The client's wanted parameters: the server's greeting overridden by the
/// startup packet (and `options=-c name=value`). Parameters listed in
/// `ignore_startup_parameters` are dropped, as in PgBouncer; any other
/// (`search_path`, `extra_float_digits`, `-c statement_timeout=…`) becomes
/// the client's session setting, applied on every server it is given
/// (where PgBouncer refuses the login).
fn client_params(
    welcome: &Arc<ParamSet>,
    startup: &StartupParams,
    ignored: &[String],
) -> Result<(Arc<ParamSet>, Option<Arc<SessionVars>>), ClientError> {
    let mut params = welcome.clone();
    let mut session: Vec<(String, String)> = Vec::new();
    let is_ignored = |k: &str| ignored.iter().any(|i| i.eq_ignore_ascii_case(k));
    let mut apply = |k: &str, v: &str| -> Result<(), ClientError> {
        if let Some(name) = tracked_name(k) {
            crate::params::update_shared(&mut params, name, v);
        } else if !is_ignored(k) {
            if k.is_empty() || k.len() > 63 {
                return Err(ClientError::protocol(format!(
                    "invalid startup parameter name: {k:?}"
                )));
            }
            session.push((k.to_owned(), v.to_owned()));
        }
        Ok(())
    };
    for (k, v) in &startup.0 {
        if k == "options" {
            for setting in parse_options(v) {
                let (name, value) = setting?;
                apply(&name, &value)?;
            }
        } else if !STRUCTURAL_PARAMS.contains(&k.as_str()) {
            apply(k, v)?;
        }
    }
    let session = (!session.is_empty()).then(|| Arc::new(SessionVars::from_pairs(session)));
    Ok((params, session))
}

/// Splits `-c name=value` and `--name=value` out of an `options` string.
fn parse_options(options: &str) -> Vec<Result<(String, String), ClientError>> {
    let mut out = Vec::new();
    let mut words = options.split_whitespace();
    while let Some(w) = words.next() {
        let setting = if w == "-c" {
            words.next()
        } else if let Some(s) = w.strip_prefix("-c").or_else(|| w.strip_prefix("--")) {
            Some(s)
        } else {
            out.push(Err(ClientError::protocol("unsupported options startup parameter: only '-c config=val' and '--config=val' are allowed")));
            continue;
        };
        match setting.and_then(|s| s.split_once('=')) {
            Some((k, v)) => out.push(Ok((k.replace('-', "_"), v.to_owned()))),
            None => out.push(Err(ClientError::protocol("unsupported options startup parameter: only '-c config=val' and '--config=val' are allowed"))),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn application_names_show_as_postgresql_shows_them() {
        assert_eq!(shown_name("psql"), "psql");
        assert_eq!(shown_name(&"x".repeat(9000)), "x".repeat(63));
        // (a two-byte character across the cut is left out whole)
        let name = format!("{}é", "x".repeat(62));
        assert_eq!(shown_name(&name), "x".repeat(62));
    }

    #[test]
    fn options_are_parsed() {
        let got: Vec<_> = parse_options("-c application_name=x --TimeZone=UTC")
            .into_iter()
            .map(|r| r.unwrap())
            .collect();
        assert_eq!(
            got,
            vec![
                ("application_name".to_owned(), "x".to_owned()),
                ("TimeZone".to_owned(), "UTC".to_owned())
            ]
        );
        assert!(parse_options("-x").pop().unwrap().is_err());
    }
}
