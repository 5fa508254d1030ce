//! BackendKeyData ('K'): the key a client needs to cancel its query. sluice
//! gives each client a key of its own and maps it to the server in use.

use bytes::BytesMut;

use crate::{MessageBuilder, Reader, WireError, tags::backend};

/// Process id and secret key of a (real or virtual) backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BackendKeyData {
    pub process_id: i32,
    pub secret_key: i32,
}

impl BackendKeyData {
    pub fn decode(body: &[u8]) -> Result<Self, WireError> {
        let mut r = Reader::new(body);
        Ok(Self {
            process_id: r.i32()?,
            secret_key: r.i32()?,
        })
    }

    pub fn encode(&self, buf: &mut BytesMut) {
        MessageBuilder::new(buf, backend::BACKEND_KEY_DATA)
            .i32(self.process_id)
            .i32(self.secret_key)
            .finish();
    }
}
