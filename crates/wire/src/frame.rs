//! Framing of typed messages: one tag byte, then a big-endian i32 length that
//! counts itself. This is the only parsing done on every message of the hot
//! path, so it reads five bytes and nothing else.

use crate::WireError;

/// Tag byte plus the length word.
pub const HEADER_LEN: usize = 5;

/// The header of one typed message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub tag: u8,
    /// Whole message size on the wire, tag byte included.
    pub total_len: usize,
}

impl Header {
    /// Size of the body after the header.
    pub fn body_len(&self) -> usize {
        self.total_len - HEADER_LEN
    }
}

/// Reads the header at the start of `buf`. Returns `Ok(None)` when fewer than
/// five bytes are there. A length below 4 or a message larger than `limit`
/// bytes is an error. The message itself may still be incomplete: compare
/// `total_len` with `buf.len()`.
pub fn split_frame(buf: &[u8], limit: usize) -> Result<Option<Header>, WireError> {
    let Some(head) = buf.get(..HEADER_LEN) else {
        return Ok(None);
    };
    let len = i32::from_be_bytes([head[1], head[2], head[3], head[4]]);
    if len < 4 {
        return Err(WireError::BadLength(len.into()));
    }
    let total_len = len as usize + 1;
    if total_len > limit {
        return Err(WireError::TooLarge {
            len: total_len,
            limit,
        });
    }
    Ok(Some(Header {
        tag: head[0],
        total_len,
    }))
}

/// The tag and body of the message at the start of `buf`, when it is
/// whole there and its length word is valid; `None` otherwise.
pub fn whole_message(buf: &[u8]) -> Option<(u8, &[u8])> {
    let header = split_frame(buf, usize::MAX).ok()??;
    let body = buf.get(HEADER_LEN..header.total_len)?;
    Some((header.tag, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_whole_message_is_only_one_all_there() {
        assert_eq!(whole_message(b"Q\0\0\0\x06x\0"), Some((b'Q', &b"x\0"[..])));
        assert_eq!(whole_message(b"Q\0\0\0\x06x"), None);
        assert_eq!(whole_message(b"Q\0\0\0\x03"), None);
        assert_eq!(whole_message(b"Q\0\0"), None);
    }

    #[test]
    fn short_buffer_is_incomplete() {
        assert_eq!(split_frame(b"Q\0\0", 100), Ok(None));
    }

    #[test]
    fn reads_tag_and_length() {
        let h = split_frame(b"Z\0\0\0\x05I", 100).unwrap().unwrap();
        assert_eq!(h.tag, b'Z');
        assert_eq!(h.total_len, 6);
        assert_eq!(h.body_len(), 1);
    }

    #[test]
    fn rejects_bad_and_huge_lengths() {
        assert!(matches!(
            split_frame(b"Q\0\0\0\x03", 100),
            Err(WireError::BadLength(3))
        ));
        assert!(matches!(
            split_frame(b"Q\xff\xff\xff\xff", 100),
            Err(WireError::BadLength(-1))
        ));
        assert!(matches!(
            split_frame(b"Q\0\0\x10\0", 100),
            Err(WireError::TooLarge { .. })
        ));
    }
}
