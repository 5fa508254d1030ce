//! Reading whole messages during login and other slow paths, where clarity
//! beats zero-copy: the startup packet, authentication, the first
//! ParameterStatus burst. The relay loop does not use this.

use bytes::BytesMut;
use sluice_wire::{StartupPacket, WireError, split_frame, split_startup};
use tokio::io::AsyncReadExt;

use crate::net::Stream;

/// Why reading a message failed.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("connection closed")]
    Closed,
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Protocol(#[from] WireError),
}

/// Reads one typed message: its tag and body.
pub async fn read_message(
    stream: &mut Stream,
    buf: &mut BytesMut,
    limit: usize,
) -> Result<(u8, BytesMut), ReadError> {
    loop {
        if let Some(h) = split_frame(buf, limit)?
            && buf.len() >= h.total_len
        {
            let mut msg = buf.split_to(h.total_len);
            let body = msg.split_off(sluice_wire::HEADER_LEN);
            return Ok((h.tag, body));
        }
        if buf.capacity() - buf.len() < 1024 {
            buf.reserve(4096);
        }
        if stream.read_buf(buf).await? == 0 {
            return Err(ReadError::Closed);
        }
    }
}

/// Reads the untyped first packet of a client connection.
pub async fn read_startup(
    stream: &mut Stream,
    buf: &mut BytesMut,
) -> Result<StartupPacket, ReadError> {
    loop {
        if let Some((packet, used)) = split_startup(buf)? {
            let _ = buf.split_to(used);
            return Ok(packet);
        }
        if buf.capacity() - buf.len() < 512 {
            buf.reserve(1024);
        }
        if stream.read_buf(buf).await? == 0 {
            return Err(ReadError::Closed);
        }
    }
}
