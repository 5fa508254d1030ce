//! A bounds-checked cursor over a message body. Decoders use it so that no
//! byte sequence from a socket can make them index out of range.

use crate::WireError;

/// Reads big-endian integers and C strings from a byte slice.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Self { buf }
    }

    pub fn remaining(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if self.buf.len() < n {
            return Err(WireError::Truncated {
                wanted: n - self.buf.len(),
            });
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }

    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.buf)
    }

    pub fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.bytes(1)?[0])
    }

    pub fn i16(&mut self) -> Result<i16, WireError> {
        let b = self.bytes(2)?;
        Ok(i16::from_be_bytes([b[0], b[1]]))
    }

    pub fn i32(&mut self) -> Result<i32, WireError> {
        let b = self.bytes(4)?;
        Ok(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// A NUL-terminated string, without its terminator, as raw bytes.
    pub fn cstr_bytes(&mut self) -> Result<&'a [u8], WireError> {
        let end = self
            .buf
            .iter()
            .position(|&b| b == 0)
            .ok_or(WireError::UnterminatedString)?;
        let s = &self.buf[..end];
        self.buf = &self.buf[end + 1..];
        Ok(s)
    }

    /// A NUL-terminated UTF-8 string.
    pub fn cstr(&mut self) -> Result<&'a str, WireError> {
        std::str::from_utf8(self.cstr_bytes()?).map_err(|_| WireError::NotUtf8)
    }
}
