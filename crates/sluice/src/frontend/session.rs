//! A logged-in client. While idle it holds no server and almost no memory
//! (its read buffer is released); when bytes arrive it gets a server from its
//! pool and the relay moves bytes until the pool mode says the server goes
//! back.

use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use sluice_wire::BackendKeyData;

use super::error::ClientError;
use super::relay::{self, RelayEnd};
use super::relay_io::READ_CHUNK;
use crate::app::{App, Phase};
use crate::backend::cancel::CancelTarget;
use crate::backend::pool::Pool;
use crate::net::Stream;
use crate::params::ParamSet;

/// A client after login.
pub struct Client {
    pub stream: Stream,
    pub app: Arc<App>,
    pub pool: Arc<Pool>,
    /// Tracked parameters as the client set them.
    pub params: Arc<ParamSet>,
    pub key: BackendKeyData,
    pub cancel: Arc<CancelTarget>,
    pub user: String,
    pub database: String,
    /// `client_idle_timeout` as of the last lease (zero = none; `None`
    /// before the first lease).
    idle_timeout: Option<Duration>,
}

/// How a session ended.
#[derive(Debug)]
pub enum SessionEnd {
    /// The client said Terminate or closed its socket.
    ClientLeft,
    Error(ClientError),
}

impl Client {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        stream: Stream,
        app: Arc<App>,
        pool: Arc<Pool>,
        params: Arc<ParamSet>,
        key: BackendKeyData,
        cancel: Arc<CancelTarget>,
        user: String,
        database: String,
    ) -> Self {
        Self {
            stream,
            app,
            pool,
            params,
            key,
            cancel,
            user,
            database,
            idle_timeout: None,
        }
    }

    /// Serves the client until it leaves or fails.
    pub async fn serve(mut self) -> (Self, SessionEnd) {
        let end = self.serve_inner().await;
        self.app.cancels.unregister(&self.key);
        (self, end)
    }

    async fn serve_inner(&mut self) -> SessionEnd {
        let mut buf = BytesMut::new();
        loop {
            if buf.is_empty() {
                match self.wait_for_request(&mut buf).await {
                    Ok(true) => {}
                    Ok(false) => return SessionEnd::ClientLeft,
                    Err(e) => return SessionEnd::Error(e),
                }
            }
            if buf.first() == Some(&sluice_wire::tags::frontend::TERMINATE) {
                return SessionEnd::ClientLeft;
            }
            if self.app.phase() >= Phase::WaitForServers {
                return SessionEnd::Error(ClientError::new("57P01", "the pooler is shutting down"));
            }
            // Boxed, like the relay below: an idle client's task holds
            // neither future's state.
            let lease = match Box::pin(self.pool.acquire()).await {
                Ok(l) => l,
                Err(e) => {
                    return SessionEnd::Error(ClientError::new(e.sqlstate(), e.to_string()));
                }
            };
            self.idle_timeout = Some(lease.settings.client_idle_timeout);
            // Boxed so that an idle client's task stays small.
            match Box::pin(relay::run(self, &mut buf, lease)).await {
                RelayEnd::Released => {}
                RelayEnd::ClientLeft => return SessionEnd::ClientLeft,
                RelayEnd::Error(e) => return SessionEnd::Error(e),
            }
            if buf.is_empty() {
                buf = BytesMut::new();
            }
        }
    }

    /// Waits for the next request. `Ok(false)`: the client closed.
    async fn wait_for_request(&mut self, buf: &mut BytesMut) -> Result<bool, ClientError> {
        let idle_timeout = *self
            .idle_timeout
            .get_or_insert_with(|| self.pool.settings().client_idle_timeout);
        loop {
            let ready = if idle_timeout.is_zero() {
                self.stream.readable().await
            } else {
                // Boxed: the timer would otherwise sit in every idle task.
                match Box::pin(tokio::time::timeout(idle_timeout, self.stream.readable())).await {
                    Ok(r) => r,
                    Err(_) => return Err(ClientError::new("08P01", "client_idle_timeout")),
                }
            };
            if ready.is_err() {
                return Ok(false);
            }
            buf.reserve(READ_CHUNK);
            // poll_read (not try_read) so that a short read clears readiness.
            let read = std::future::poll_fn(|cx| {
                match tokio_util::io::poll_read_buf(std::pin::Pin::new(&mut self.stream), cx, buf) {
                    std::task::Poll::Pending => std::task::Poll::Ready(None),
                    std::task::Poll::Ready(r) => std::task::Poll::Ready(Some(r)),
                }
            })
            .await;
            match read {
                Some(Ok(0)) | Some(Err(_)) => return Ok(false),
                Some(Ok(_)) => return Ok(true),
                // Readiness was stale: give the buffer back and wait again.
                None => *buf = BytesMut::new(),
            }
        }
    }
}

/// Timeout for best-effort cleanup queries (ROLLBACK, reset query).
pub const CLEANUP_TIMEOUT: Duration = Duration::from_secs(5);
