//! Query ('Q'): a simple-protocol query string. Read by the admin console
//! and by session-state tracking; the hot path forwards it untouched.

use bytes::BytesMut;

use crate::{MessageBuilder, Reader, WireError, tags::frontend};

/// The SQL text of a Query body.
pub fn query_text(body: &[u8]) -> Result<&str, WireError> {
    Reader::new(body).cstr()
}

/// Appends a Query message.
pub fn encode_query(buf: &mut BytesMut, sql: &str) {
    MessageBuilder::new(buf, frontend::QUERY).cstr(sql).finish();
}
