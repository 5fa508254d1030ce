//! Errors told to a client as a PostgreSQL ErrorResponse with a SQLSTATE,
//! after which sluice closes that client and keeps serving everyone else.

use bytes::BytesMut;
use sluice_wire::{ErrorFields, Severity};
use tokio::io::AsyncWriteExt;

use crate::net::Stream;

/// A FATAL error for one client.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message} ({code})")]
pub struct ClientError {
    pub code: String,
    pub message: String,
}

impl ClientError {
    pub fn new(code: &str, message: impl Into<String>) -> Self {
        Self {
            code: code.to_owned(),
            message: message.into(),
        }
    }

    pub fn protocol(message: impl Into<String>) -> Self {
        Self::new("08P01", message)
    }

    /// Appends the ErrorResponse.
    pub fn encode(&self, buf: &mut BytesMut) {
        ErrorFields::new(Severity::Fatal, &self.code, &self.message).encode(buf);
    }

    /// Sends the error, best effort: the client may be gone already. A
    /// write the relay left unfinished is flushed first (over TLS it would
    /// otherwise swallow this one), and the stream is shut down after (TLS
    /// close_notify).
    pub async fn send(&self, stream: &mut Stream) {
        let mut buf = BytesMut::with_capacity(64 + self.message.len());
        self.encode(&mut buf);
        let write = async {
            stream.flush().await?;
            stream.write_all(&buf).await?;
            stream.shutdown().await
        };
        let _ = tokio::time::timeout(std::time::Duration::from_secs(2), write).await;
    }
}

impl From<crate::codec::ReadError> for ClientError {
    fn from(e: crate::codec::ReadError) -> Self {
        match e {
            crate::codec::ReadError::Protocol(e) => e.into(),
            e => Self::protocol(e.to_string()),
        }
    }
}

impl From<sluice_wire::WireError> for ClientError {
    fn from(e: sluice_wire::WireError) -> Self {
        match e {
            // PostgreSQL's code for it: feature_not_supported.
            sluice_wire::WireError::UnsupportedProtocol { .. } => Self::new("0A000", e.to_string()),
            e => Self::protocol(e.to_string()),
        }
    }
}
