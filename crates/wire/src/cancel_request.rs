//! CancelRequest: sent on a new connection, carries the process id and
//! secret key that a server announced in BackendKeyData.

use bytes::BytesMut;

use crate::{MessageBuilder, Reader, WireError};

/// A cancel request's key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CancelRequest {
    pub process_id: i32,
    pub secret_key: i32,
}

impl CancelRequest {
    /// Decodes the body after the request code.
    pub fn decode(body: &[u8]) -> Result<Self, WireError> {
        let mut r = Reader::new(body);
        let process_id = r.i32()?;
        let secret_key = r.i32()?;
        if !r.is_empty() {
            return Err(WireError::Invalid {
                what: "cancel request",
                detail: "unexpected trailing bytes".into(),
            });
        }
        Ok(Self {
            process_id,
            secret_key,
        })
    }

    /// The whole 16-byte packet, to send to a server.
    pub fn encode(&self, buf: &mut BytesMut) {
        MessageBuilder::untyped(buf)
            .i32(80_877_102)
            .i32(self.process_id)
            .i32(self.secret_key)
            .finish();
    }
}
