//! CommandComplete, DataRow and EmptyQueryResponse: what sluice needs to
//! answer a query itself (the admin console).

use bytes::BytesMut;

use crate::{MessageBuilder, tags::backend};

/// Appends CommandComplete with `tag` (e.g. "SHOW", "SELECT 3").
pub fn command_complete(buf: &mut BytesMut, tag: &str) {
    MessageBuilder::new(buf, backend::COMMAND_COMPLETE)
        .cstr(tag)
        .finish();
}

/// Appends a DataRow of text values; `None` is SQL NULL.
pub fn data_row<S: AsRef<str>>(buf: &mut BytesMut, values: &[Option<S>]) {
    let mut m = MessageBuilder::new(buf, backend::DATA_ROW).i16(values.len() as i16);
    for v in values {
        m = match v {
            Some(v) => m.i32(v.as_ref().len() as i32).bytes(v.as_ref().as_bytes()),
            None => m.i32(-1),
        };
    }
    m.finish();
}

/// Appends EmptyQueryResponse.
pub fn empty_query_response(buf: &mut BytesMut) {
    MessageBuilder::new(buf, backend::EMPTY_QUERY_RESPONSE).finish();
}
