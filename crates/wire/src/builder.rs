//! Writes messages into a caller's buffer: header first, length patched in
//! when the message is finished. Appending to one buffer lets the daemon send
//! many messages with one write.

use bytes::{BufMut, BytesMut};

/// Appends one typed message to `buf`.
pub struct MessageBuilder<'a> {
    buf: &'a mut BytesMut,
    start: usize,
}

impl<'a> MessageBuilder<'a> {
    /// Starts a typed message with tag `tag`.
    pub fn new(buf: &'a mut BytesMut, tag: u8) -> Self {
        buf.put_u8(tag);
        let start = buf.len();
        buf.put_i32(0);
        Self { buf, start }
    }

    /// Starts an untyped message (startup packets have no tag byte).
    pub fn untyped(buf: &'a mut BytesMut) -> Self {
        let start = buf.len();
        buf.put_i32(0);
        Self { buf, start }
    }

    pub fn i16(self, v: i16) -> Self {
        self.buf.put_i16(v);
        self
    }

    pub fn i32(self, v: i32) -> Self {
        self.buf.put_i32(v);
        self
    }

    pub fn u8(self, v: u8) -> Self {
        self.buf.put_u8(v);
        self
    }

    pub fn bytes(self, v: &[u8]) -> Self {
        self.buf.put_slice(v);
        self
    }

    /// A string with its NUL terminator.
    pub fn cstr(self, v: &str) -> Self {
        self.buf.put_slice(v.as_bytes());
        self.buf.put_u8(0);
        self
    }

    /// Patches the length word. Messages sluice builds are far below 2 GiB.
    pub fn finish(self) {
        let len = (self.buf.len() - self.start) as i32;
        self.buf[self.start..self.start + 4].copy_from_slice(&len.to_be_bytes());
    }
}
