//! The admin console: the virtual database `pgbouncer` (alias `sluice`),
//! simple query protocol only, with PgBouncer's commands and column sets so
//! that dashboards, runbooks and pgbouncer_exporter work unchanged.
//! `admin_users` may run everything, `stats_users` only SHOW.

mod commands;
pub(crate) mod hosts;
pub(crate) mod result;
pub(crate) mod show;
pub(crate) mod sockets;

use std::sync::Arc;

use bytes::BytesMut;
use sluice_wire::{
    Authentication, ErrorFields, ParameterStatus, Severity, TransactionStatus, query_text,
    ready_for_query, tags::frontend,
};
use tokio::io::AsyncWriteExt;

use crate::app::App;
use crate::codec::read_message;
use crate::frontend::error::ClientError;
use crate::net::Stream;

/// Names of the virtual database.
pub const CONSOLE_DATABASES: &[&str] = &["pgbouncer", "sluice"];
/// Largest console command accepted.
const COMMAND_LIMIT: usize = 64 * 1024;
/// How long a console session may take to read a reply: one that does not
/// read is closed, its reply (a listing may be megabytes) freed.
const WRITE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// What a console user may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Admin,
    Stats,
}

/// The role of `user`, or an error for users who may not use the console.
pub fn role_of(app: &App, user: &str) -> Result<Role, ClientError> {
    let config = app.config();
    let s = &config.settings;
    if s.auth_type == sluice_config::AuthType::Any || s.admin_users.iter().any(|u| u == user) {
        return Ok(Role::Admin);
    }
    if s.stats_users.iter().any(|u| u == user) {
        return Ok(Role::Stats);
    }
    Err(ClientError::new(
        "42501",
        format!("permission denied: \"{user}\" is not in admin_users or stats_users"),
    ))
}

/// Greets a console user (after authentication) and serves commands until
/// the client leaves.
pub async fn serve(app: Arc<App>, mut stream: Stream, role: Role) {
    let mut out = BytesMut::with_capacity(512);
    Authentication::Ok.encode(&mut out);
    for (name, value) in [
        (
            "server_version",
            concat!(env!("CARGO_PKG_VERSION"), " (sluice)"),
        ),
        ("server_encoding", "UTF8"),
        ("client_encoding", "UTF8"),
        ("DateStyle", "ISO"),
        ("TimeZone", "UTC"),
        ("standard_conforming_strings", "on"),
        ("integer_datetimes", "on"),
        ("application_name", ""),
    ] {
        ParameterStatus { name, value }.encode(&mut out);
    }
    // An admin's session has a cancel key: a cancel ends the global pause
    // (PgBouncer's way out of a PAUSE that waits). A stats user's has
    // none: it may not end a pause.
    let key =
        (role == Role::Admin).then(|| app.control.console_key(|| app.cancels.console_key_shape()));
    sluice_wire::BackendKeyData {
        process_id: key.as_ref().map_or(0, |k| k.process_id),
        secret_key: key.as_ref().map_or(0, |k| k.secret_key),
    }
    .encode(&mut out);
    ready_for_query(&mut out, TransactionStatus::Idle);
    if stream.write_all(&out).await.is_err() {
        return;
    }
    let mut buf = BytesMut::new();
    // After an extended-protocol message (refused), skip to Sync, which
    // gets the one ReadyForQuery, as PostgreSQL does after an error.
    let mut skipping_to_sync = false;
    loop {
        let (tag, body) = match read_message(&mut stream, &mut buf, COMMAND_LIMIT).await {
            Ok(m) => m,
            // A message too long or badly framed is told, as PostgreSQL
            // tells it, before the connection ends.
            Err(crate::codec::ReadError::Protocol(e)) => {
                out.clear();
                sluice_wire::ErrorFields::new(
                    sluice_wire::Severity::Fatal,
                    "08P01",
                    &e.to_string(),
                )
                .encode(&mut out);
                let _ = stream.write_all(&out).await;
                let _ = stream.flush().await;
                return;
            }
            Err(_) => return,
        };
        out.clear();
        match tag {
            frontend::TERMINATE => return,
            frontend::QUERY => {
                match query_text(&body) {
                    Ok(sql) => commands::run(&app, role, sql, &mut out).await,
                    Err(e) => error(&mut out, "08P01", &e.to_string()),
                }
                ready_for_query(&mut out, TransactionStatus::Idle);
            }
            frontend::SYNC => {
                skipping_to_sync = false;
                ready_for_query(&mut out, TransactionStatus::Idle);
            }
            _ if skipping_to_sync => continue,
            other => {
                skipping_to_sync = true;
                let message = match other {
                    frontend::PARSE | frontend::BIND | frontend::EXECUTE => {
                        "extended query protocol not supported by admin console".to_owned()
                    }
                    other => format!("unsupported packet type for admin console: {other}"),
                };
                error(&mut out, "08P01", &message);
            }
        }
        match tokio::time::timeout(WRITE_TIMEOUT, stream.write_all(&out)).await {
            Ok(Ok(())) => {}
            _ => return,
        }
        if out.capacity() > 1 << 20 {
            out = BytesMut::with_capacity(512);
        }
    }
}

/// Appends an ErrorResponse (the session goes on).
fn error(out: &mut BytesMut, code: &str, message: &str) {
    ErrorFields::new(Severity::Error, code, message).encode(out);
}
