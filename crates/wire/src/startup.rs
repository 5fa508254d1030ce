//! The first packet of a connection, which has no tag byte: a StartupMessage,
//! an SSLRequest, a GSSENCRequest or a CancelRequest, told apart by the code
//! after the length.

use bytes::BytesMut;

use crate::{CancelRequest, MessageBuilder, Reader, WireError};

/// Protocol 3.0 as the startup code carries it.
pub const PROTOCOL_V3: i32 = 3 << 16;
const SSL_REQUEST_CODE: i32 = 80_877_103;
const GSSENC_REQUEST_CODE: i32 = 80_877_104;
const CANCEL_REQUEST_CODE: i32 = 80_877_102;
/// PostgreSQL's own limit on a startup packet (MAX_STARTUP_PACKET_LENGTH).
const MAX_STARTUP_LEN: usize = 10_000;

/// The parameters of a StartupMessage in the order the client sent them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StartupParams(pub Vec<(String, String)>);

impl StartupParams {
    /// The value of `key`; the last one when it is given twice, as
    /// PostgreSQL takes it.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// What the first packet asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartupPacket {
    Startup {
        /// Minor protocol version asked for (major is always 3 here).
        minor: u16,
        params: StartupParams,
        /// Parameters named `_pq_.*`, which a newer client may send and a
        /// server that does not know them must list in
        /// NegotiateProtocolVersion.
        unknown_protocol_options: Vec<String>,
    },
    SslRequest,
    GssEncRequest,
    Cancel(CancelRequest),
}

/// Splits the first packet off `buf`. `Ok(None)`: not all of it has arrived.
/// Returns the packet and how many bytes it took.
pub fn split_startup(buf: &[u8]) -> Result<Option<(StartupPacket, usize)>, WireError> {
    let Some(len_bytes) = buf.get(..4) else {
        return Ok(None);
    };
    let len = i32::from_be_bytes([len_bytes[0], len_bytes[1], len_bytes[2], len_bytes[3]]);
    if len < 8 {
        return Err(WireError::BadLength(len.into()));
    }
    let len = len as usize;
    if len > MAX_STARTUP_LEN {
        return Err(WireError::TooLarge {
            len,
            limit: MAX_STARTUP_LEN,
        });
    }
    let Some(packet) = buf.get(4..len) else {
        return Ok(None);
    };
    let mut r = Reader::new(packet);
    let code = r.i32()?;
    let parsed = match code {
        SSL_REQUEST_CODE if r.is_empty() => StartupPacket::SslRequest,
        GSSENC_REQUEST_CODE if r.is_empty() => StartupPacket::GssEncRequest,
        CANCEL_REQUEST_CODE => StartupPacket::Cancel(CancelRequest::decode(r.rest())?),
        _ => {
            let major = (code >> 16) as u16;
            let minor = (code & 0xffff) as u16;
            if major != 3 {
                return Err(WireError::UnsupportedProtocol { major, minor });
            }
            let mut params = Vec::new();
            let mut unknown_protocol_options = Vec::new();
            loop {
                let key = r.cstr()?;
                if key.is_empty() {
                    break;
                }
                let value = r.cstr()?;
                if key.starts_with("_pq_.") {
                    unknown_protocol_options.push(key.to_owned());
                } else {
                    params.push((key.to_owned(), value.to_owned()));
                }
            }
            if !r.is_empty() {
                return Err(WireError::Invalid {
                    what: "startup packet",
                    detail: "data after the terminator".into(),
                });
            }
            StartupPacket::Startup {
                minor,
                params: StartupParams(params),
                unknown_protocol_options,
            }
        }
    };
    Ok(Some((parsed, len)))
}

/// Appends a protocol 3.0 StartupMessage with `params` to `buf`.
pub fn encode_startup<'a>(
    buf: &mut BytesMut,
    params: impl IntoIterator<Item = (&'a str, &'a str)>,
) {
    let mut m = MessageBuilder::untyped(buf).i32(PROTOCOL_V3);
    for (k, v) in params {
        m = m.cstr(k).cstr(v);
    }
    m.u8(0).finish();
}

/// Appends an SSLRequest to `buf`.
pub fn encode_ssl_request(buf: &mut BytesMut) {
    MessageBuilder::untyped(buf).i32(SSL_REQUEST_CODE).finish();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_startup() {
        let mut buf = BytesMut::new();
        encode_startup(&mut buf, [("user", "alice"), ("database", "db")]);
        let (p, used) = split_startup(&buf).unwrap().unwrap();
        assert_eq!(used, buf.len());
        let StartupPacket::Startup { minor, params, .. } = p else {
            panic!("not a startup")
        };
        assert_eq!(minor, 0);
        assert_eq!(params.get("user"), Some("alice"));
        assert_eq!(params.get("database"), Some("db"));
    }

    #[test]
    fn ssl_request_and_partial() {
        let mut buf = BytesMut::new();
        encode_ssl_request(&mut buf);
        assert_eq!(split_startup(&buf[..6]), Ok(None));
        assert_eq!(
            split_startup(&buf).unwrap().unwrap().0,
            StartupPacket::SslRequest
        );
    }

    #[test]
    fn rejects_oversized_and_old_protocol() {
        assert!(split_startup(&[0, 1, 0, 0, 0, 3, 0, 0]).is_err());
        let old = [0, 0, 0, 8, 0, 2, 0, 0];
        assert!(matches!(
            split_startup(&old),
            Err(WireError::UnsupportedProtocol { major: 2, .. })
        ));
    }
}
