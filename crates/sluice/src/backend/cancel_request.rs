//! PostgreSQL's CancelRequest sent to a server: for a client's Ctrl-C
//! (`cancel.rs`), and for a query whose client is gone (`Lease::
//! cancel_then_close`). Apart from the cancel registry, which knows pools,
//! so that a pool's lease can use it.

use bytes::BytesMut;
use sluice_wire::{BackendKeyData, CancelRequest};
use tokio::io::AsyncWriteExt;

use super::target::{ServerAddr, ServerTarget};

/// Sends PostgreSQL's CancelRequest for the backend `key` at `addr` (one
/// of `target`'s), and waits until PostgreSQL has signalled it (it closes
/// the connection), at most `cancel_wait_timeout` (0: the target's
/// connect timeout).
pub async fn send_cancel(
    target: &ServerTarget,
    addr: &ServerAddr,
    key: BackendKeyData,
    cancel_wait_timeout: std::time::Duration,
) -> std::io::Result<()> {
    let mut buf = BytesMut::with_capacity(16);
    CancelRequest {
        process_id: key.process_id,
        secret_key: key.secret_key,
    }
    .encode(&mut buf);
    let send = async {
        match addr {
            ServerAddr::Tcp { host, port } => {
                let mut s = crate::backend::dns::connect(host, *port, target.dns).await?;
                s.write_all(&buf).await?;
                until_closed(&mut s).await
            }
            ServerAddr::Unix(p) => {
                let mut s = tokio::net::UnixStream::connect(p).await?;
                s.write_all(&buf).await?;
                until_closed(&mut s).await
            }
        }
    };
    let wait = match cancel_wait_timeout {
        d if d.is_zero() => target.connect_timeout,
        d => d,
    };
    tokio::time::timeout(wait, send)
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "cancel timed out"))?
}

/// Reads until the server closes the cancel connection (it sends
/// nothing; a few bytes at most are read and dropped).
async fn until_closed(s: &mut (impl tokio::io::AsyncRead + Unpin)) -> std::io::Result<()> {
    use tokio::io::AsyncReadExt;
    let mut scrap = [0u8; 64];
    while s.read(&mut scrap).await? != 0 {}
    Ok(())
}
