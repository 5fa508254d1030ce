//! TLS on both sides, with rustls (ring provider: it builds in seconds on
//! two cores and has no OpenSSL to link). `settings` turns PgBouncer's
//! `client_tls_*` keys into a rustls configuration, `client_side` answers a
//! client's SSLRequest (or direct TLS) with it, and `stream` makes the
//! result usable wherever a TCP socket is.

mod client_side;
mod settings;
mod stream;

pub use client_side::ClientTls;
pub use stream::TlsConn;
