//! The client's answers to authentication requests, all tagged 'p':
//! PasswordMessage (cleartext or md5), SASLInitialResponse and SASLResponse.
//! Which one it is depends on what was asked, so decoding takes that context.

use bytes::BytesMut;

use crate::{MessageBuilder, Reader, WireError, tags::frontend};

/// A decoded 'p' message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PasswordMessage<'a> {
    Password(&'a str),
    SaslInitial { mechanism: &'a str, data: &'a [u8] },
    Sasl(&'a [u8]),
}

impl<'a> PasswordMessage<'a> {
    pub fn decode_password(body: &'a [u8]) -> Result<Self, WireError> {
        let mut r = Reader::new(body);
        Ok(Self::Password(r.cstr()?))
    }

    pub fn decode_sasl_initial(body: &'a [u8]) -> Result<Self, WireError> {
        let mut r = Reader::new(body);
        let mechanism = r.cstr()?;
        let len = r.i32()?;
        let data = if len < 0 {
            &[][..]
        } else {
            r.bytes(len as usize)?
        };
        Ok(Self::SaslInitial { mechanism, data })
    }

    pub fn decode_sasl(body: &'a [u8]) -> Self {
        Self::Sasl(body)
    }

    /// Appends a cleartext or md5 PasswordMessage.
    pub fn encode_password(buf: &mut BytesMut, password: &str) {
        MessageBuilder::new(buf, frontend::PASSWORD)
            .cstr(password)
            .finish();
    }
}

/// Appends a SASLInitialResponse.
pub fn sasl_initial_response(buf: &mut BytesMut, mechanism: &str, data: &[u8]) {
    MessageBuilder::new(buf, frontend::PASSWORD)
        .cstr(mechanism)
        .i32(data.len() as i32)
        .bytes(data)
        .finish();
}

/// Appends a SASLResponse.
pub fn sasl_response(buf: &mut BytesMut, data: &[u8]) {
    MessageBuilder::new(buf, frontend::PASSWORD)
        .bytes(data)
        .finish();
}
