//! NegotiateProtocolVersion ('v'): tells a client that asked for 3.x with
//! x > 0, or sent `_pq_.` options, what this side supports.

use bytes::BytesMut;

use crate::{MessageBuilder, tags::backend};

/// Appends NegotiateProtocolVersion: newest minor supported, and the
/// protocol options not recognised.
pub fn negotiate_protocol_version(buf: &mut BytesMut, newest_minor: i32, unrecognised: &[String]) {
    let mut m = MessageBuilder::new(buf, backend::NEGOTIATE_PROTOCOL_VERSION)
        .i32((3 << 16) | newest_minor)
        .i32(unrecognised.len() as i32);
    for o in unrecognised {
        m = m.cstr(o);
    }
    m.finish();
}
