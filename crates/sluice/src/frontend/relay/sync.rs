//! The server brought in line with its new client before anything of the
//! client's is sent: its parameters (client_encoding, DateStyle…) and the
//! session settings sluice keeps for the client, each by SQL for what
//! differs only. A server that went away meanwhile lets the request run
//! elsewhere; one that refuses settings another client's history made it
//! unable to take is closed and the request takes another.

use std::sync::Arc;

use bytes::BytesMut;

use super::RelayEnd;
use crate::backend::login::run_query;
use crate::backend::pool::Lease;
use crate::frontend::client::Client;
use crate::frontend::error::ClientError;

/// The server made to match the client's parameters and session settings
/// (`needs_sync`): SQL run only for what differs. `Err` ends the relay
/// before anything of the client's is sent. Boxed by its caller: rare, and
/// its state would otherwise sit in every relay's future.
pub(super) async fn sync_session(
    client: &mut Client,
    cbuf: &mut BytesMut,
    mut lease: Lease,
) -> Result<Lease, RelayEnd> {
    let server = lease.server();
    if !Arc::ptr_eq(&server.params, &client.params) {
        if let Some(sql) = client.params.diff_sql(&server.params)
            && let Err(e) = Box::pin(run_query(server, &sql)).await
        {
            client.app.cancels.unlink(client.cancel);
            lease.close();
            if server_gone(&e)
                && let Some(n) = unsent_retry(client, cbuf)
            {
                // Nothing of the request was sent: it may go elsewhere.
                bytes::Buf::advance(cbuf, n);
                return Err(RelayEnd::Retry);
            }
            return Err(RelayEnd::Error(ClientError::new(
                e.sqlstate(),
                e.to_string(),
            )));
        }
        server.params = client.params.clone();
    }
    if !crate::session_vars::same(&server.session, client.session()) {
        if let Some(sql) = crate::session_vars::apply_sql(
            server.session.as_deref(),
            client.session().as_deref(),
            crate::params::text_mode(&client.params, server.sql_ascii),
        ) && let Err(e) = Box::pin(run_query(server, &sql)).await
        {
            let canceling = client.app.cancels.unlink(client.cancel);
            if server_gone(&e)
                && let Some(n) = unsent_retry(client, cbuf)
            {
                lease.close();
                bytes::Buf::advance(cbuf, n);
                return Err(RelayEnd::Retry);
            }
            let error = ClientError::new(e.sqlstate(), e.to_string());
            // A rejected SET rolls back whole: the server is as it was
            // (unless a cancel of the client's may still reach it).
            if !canceling && matches!(e, crate::backend::login::LoginError::Rejected { .. }) {
                // The client's settings were taken by a server before: this
                // one refuses them for what another client did there (a
                // temp table fixes temp_buffers for the session). It can
                // never hold them: closed, and the request, untouched, goes
                // to another, a few times in a row at most (a setting no
                // server takes any more, a dropped role, must not close
                // every server). Settings no server ever took (a bad
                // startup option) close none.
                if client.settings_proven && client.sync_refusals + 1 < SYNC_TRIES {
                    client.sync_refusals += 1;
                    lease.close();
                    return Err(RelayEnd::Again);
                }
                lease.release();
            } else {
                lease.close();
            }
            client.sync_refusals = 0;
            return Err(RelayEnd::Error(error));
        }
        server.session = client.session().clone();
        client.settings_proven = true;
    }
    client.sync_refusals = 0;
    Ok(lease)
}

/// Opens the READ ONLY block sluice answered without a server
/// (`Client::defer_begin`) on the server its first request goes to: the
/// client's own BEGIN, its answer dropped (the client had it). A server
/// gone meanwhile lets the request, unsent, take another (as many times
/// in a row as a lost server allows); any other failure ends the client,
/// which believes itself in a block it does not have.
pub(super) async fn open_block(
    client: &mut Client,
    mut lease: Lease,
    begin: &[u8],
) -> Result<Lease, RelayEnd> {
    let opened = tokio::time::timeout(
        crate::frontend::client::CLEANUP_TIMEOUT,
        crate::backend::login::open_block(lease.server(), begin),
    )
    .await;
    let e = match opened {
        Ok(Ok(())) => return Ok(lease),
        Ok(Err(e)) => e,
        Err(_) => crate::backend::login::LoginError::Unsupported("BEGIN timed out".into()),
    };
    client.app.cancels.unlink(client.cancel);
    lease.close();
    if server_gone(&e) && client.lost_retries + 1 < crate::frontend::client::LOST_RETRIES {
        client.lost_retries += 1;
        return Err(RelayEnd::Again);
    }
    Err(RelayEnd::Error(ClientError::new(
        "08006",
        format!("the transaction block could not be opened on its server: {e}"),
    )))
}

/// Servers a request may try when each refuses the client's settings.
const SYNC_TRIES: u8 = 3;

/// Whether the server's parameters or session settings differ from the
/// client's (a pointer compare when they are the same).
pub(super) fn needs_sync(client: &Client, server: &crate::backend::server::ServerConn) -> bool {
    !Arc::ptr_eq(&server.params, &client.params)
        || !crate::session_vars::same(&server.session, client.session())
}

/// Whether a query sluice ran itself on a leased server failed because the
/// server went away (its connection ended, or it said it is shutting down)
/// rather than because it refused the query.
fn server_gone(e: &crate::backend::login::LoginError) -> bool {
    use crate::backend::login::LoginError;
    match e {
        LoginError::Read(_) => true,
        LoginError::Rejected { code, .. } => {
            matches!(code.as_str(), "57P01" | "57P02" | "57P03" | "57P05")
        }
        _ => false,
    }
}

/// The length of the request that may run again elsewhere, if `cbuf` still
/// starts with it (nothing of it sent yet): the session puts the request
/// back in front of the client's bytes for the retry, so it is taken out
/// here first.
fn unsent_retry(client: &Client, cbuf: &BytesMut) -> Option<usize> {
    let query = client.retry_query.as_ref()?;
    cbuf.starts_with(query).then_some(query.len())
}
