//! A TLS connection that stands where a TCP socket stands in `net::Stream`:
//! rustls (through tokio-rustls) over a TCP socket whose event-loop
//! registration can be moved to another worker, as servers move. Two things
//! differ from a socket and are handled here, once: decrypted bytes may wait
//! inside rustls when the socket has nothing to read (readiness must say
//! so), and encrypted bytes may wait inside rustls after a write returned
//! (a write is reported done only once they are on the socket, so that a
//! relay that never flushes does not leave a reply behind; the caller
//! retries the same bytes, as relay_io and write_all do, and a writer that
//! starts afresh after an abandoned write flushes first).

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

fn gone() -> io::Error {
    io::Error::new(io::ErrorKind::NotConnected, "TLS socket moved away")
}

/// The TCP socket under a TLS connection; `None` only for the instant it is
/// moved to another event loop.
#[derive(Debug)]
pub struct TlsSocket(Option<TcpStream>);

impl TlsSocket {
    pub fn new(tcp: TcpStream) -> Self {
        Self(Some(tcp))
    }

    fn pinned(&mut self) -> io::Result<Pin<&mut TcpStream>> {
        self.0.as_mut().map(Pin::new).ok_or_else(gone)
    }
}

impl AsyncRead for TlsSocket {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.get_mut().pinned()?.poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsSocket {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().pinned()?.poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().pinned()?.poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().pinned()?.poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().pinned()?.poll_shutdown(cx)
    }
}

/// An established TLS connection, either side.
pub struct TlsConn {
    tls: tokio_rustls::TlsStream<TlsSocket>,
    /// `tls-server-end-point` data of the certificate sluice presented (a
    /// client connection whose certificate allows it).
    end_point: Option<Arc<[u8]>>,
    /// Plaintext bytes taken by a write whose encrypted form is not all on
    /// the socket yet: reported to the caller once it is.
    taken: usize,
}

impl std::fmt::Debug for TlsConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsConn")
            .field("tcp", &self.tcp())
            .finish_non_exhaustive()
    }
}

impl TlsConn {
    pub fn new(tls: tokio_rustls::TlsStream<TlsSocket>, end_point: Option<Arc<[u8]>>) -> Self {
        Self {
            tls,
            end_point,
            taken: 0,
        }
    }

    /// Channel binding data for SCRAM-SHA-256-PLUS, when there is one.
    pub fn end_point(&self) -> Option<Arc<[u8]>> {
        self.end_point.clone()
    }

    /// The verified certificate chain the peer presented (leaf first).
    pub fn peer_certificates(&self) -> Option<&[rustls_pki_types::CertificateDer<'static>]> {
        match &self.tls {
            tokio_rustls::TlsStream::Server(s) => s.get_ref().1.peer_certificates(),
            tokio_rustls::TlsStream::Client(c) => c.get_ref().1.peer_certificates(),
        }
    }

    /// The TCP socket (for addresses, keepalive, the descriptor).
    pub fn tcp(&self) -> Option<&TcpStream> {
        self.tls.get_ref().0.0.as_ref()
    }

    /// Ready when decrypted bytes wait in rustls (or the peer closed), else
    /// when the socket is.
    pub fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let (socket, state) = self.tls.get_ref();
        if !state.wants_read() {
            return Poll::Ready(Ok(()));
        }
        match &socket.0 {
            Some(tcp) => tcp.poll_read_ready(cx),
            None => Poll::Ready(Err(gone())),
        }
    }

    /// Moves the socket's registration to the calling thread's event loop.
    pub fn reregister(&mut self) -> io::Result<()> {
        let socket = self.tls.get_mut().0;
        let tcp = socket.0.take().ok_or_else(gone)?;
        socket.0 = Some(TcpStream::from_std(tcp.into_std()?)?);
        Ok(())
    }

    /// What SHOW CLIENTS and SHOW SERVERS print in `tls`, in PgBouncer's
    /// form: `TLSv1.3/TLS_AES_256_GCM_SHA384/ECDH=X25519`.
    pub fn describe(&self) -> String {
        let state = self.tls.get_ref().1;
        let version = match state.protocol_version() {
            Some(rustls::ProtocolVersion::TLSv1_3) => "TLSv1.3".to_owned(),
            Some(rustls::ProtocolVersion::TLSv1_2) => "TLSv1.2".to_owned(),
            Some(other) => format!("{other:?}"),
            None => "?".to_owned(),
        };
        let cipher = state.negotiated_cipher_suite().map_or_else(
            || "?".to_owned(),
            |s| super::settings::openssl_suite_name(&s),
        );
        let group = state.negotiated_key_exchange_group().map_or_else(
            || "?".to_owned(),
            |g| match format!("{:?}", g.name()).as_str() {
                "secp256r1" => "prime256v1".to_owned(),
                other => other.to_owned(),
            },
        );
        format!("{version}/{cipher}/ECDH={group}")
    }

    /// Sends `last` (a Terminate) and close_notify without waiting, as far
    /// as the socket takes them now: for a connection about to be dropped.
    pub fn try_send_last(&mut self, last: &[u8]) {
        fn seal<D>(conn: &mut rustls::ConnectionCommon<D>, last: &[u8]) -> Vec<u8> {
            use std::io::Write;
            let _ = conn.writer().write_all(last);
            conn.send_close_notify();
            let mut out = Vec::new();
            while conn.wants_write() {
                if conn.write_tls(&mut out).is_err() {
                    break;
                }
            }
            out
        }
        let (socket, records) = match &mut self.tls {
            tokio_rustls::TlsStream::Client(c) => {
                let (socket, conn) = c.get_mut();
                let records = seal(conn, last);
                (socket, records)
            }
            tokio_rustls::TlsStream::Server(s) => {
                let (socket, conn) = s.get_mut();
                let records = seal(conn, last);
                (socket, records)
            }
        };
        if let Some(tcp) = socket.0.as_ref() {
            let _ = tcp.try_write(&records);
        }
    }

    /// The ALPN protocol agreed on, if any.
    pub fn negotiated_protocol(&self) -> Option<&[u8]> {
        self.tls.get_ref().1.alpn_protocol()
    }
}

impl AsyncRead for TlsConn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tls).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsConn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let me = self.get_mut();
        if me.taken > 0 {
            // The caller retries the write we took: finish sending it.
            ready!(Pin::new(&mut me.tls).poll_flush(cx))?;
            let n = std::mem::take(&mut me.taken);
            return Poll::Ready(Ok(n.min(buf.len())));
        }
        let n = ready!(Pin::new(&mut me.tls).poll_write(cx, buf))?;
        match Pin::new(&mut me.tls).poll_flush(cx) {
            Poll::Ready(Ok(())) => Poll::Ready(Ok(n)),
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => {
                me.taken = n;
                Poll::Pending
            }
        }
    }

    /// Also ends a write taken earlier whose caller went away (a relay
    /// that stopped mid-reply): what follows is a new write.
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        ready!(Pin::new(&mut me.tls).poll_flush(cx))?;
        me.taken = 0;
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tls).poll_shutdown(cx)
    }
}
