//! ParameterStatus ('S' from the server): a run-time parameter's value. sluice
//! records them per server and replays the client's view at login.

use bytes::BytesMut;

use crate::{MessageBuilder, Reader, WireError, tags::backend};

/// One reported parameter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParameterStatus<'a> {
    pub name: &'a str,
    pub value: &'a str,
}

impl<'a> ParameterStatus<'a> {
    pub fn decode(body: &'a [u8]) -> Result<Self, WireError> {
        let mut r = Reader::new(body);
        Ok(Self {
            name: r.cstr()?,
            value: r.cstr()?,
        })
    }

    pub fn encode(&self, buf: &mut BytesMut) {
        MessageBuilder::new(buf, backend::PARAMETER_STATUS)
            .cstr(self.name)
            .cstr(self.value)
            .finish();
    }
}
