//! Why a byte sequence is not a valid protocol message. Every variant maps to
//! SQLSTATE 08P01 (protocol_violation) when it has to be told to a client.

/// A malformed or oversized message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("invalid message length {0}")]
    BadLength(i64),
    #[error("message of {len} bytes exceeds the limit of {limit} bytes")]
    TooLarge { len: usize, limit: usize },
    #[error("message truncated: wanted {wanted} more bytes")]
    Truncated { wanted: usize },
    #[error("string is not terminated")]
    UnterminatedString,
    #[error("string is not valid UTF-8")]
    NotUtf8,
    #[error("unsupported frontend protocol {major}.{minor}")]
    UnsupportedProtocol { major: u16, minor: u16 },
    #[error("unexpected message type '{}'", char::from(*.0))]
    UnexpectedTag(u8),
    #[error("invalid {what}: {detail}")]
    Invalid { what: &'static str, detail: String },
}
