//! TLS on both sides, with rustls (ring provider: it builds in seconds on
//! two cores and has no OpenSSL to link). `settings` turns PgBouncer's
//! `*_tls_*` keys into rustls configurations, `client_side` answers a
//! client's SSLRequest (or direct TLS), `server_side` asks PostgreSQL for
//! TLS as libpq would, and `stream` makes either result usable wherever a
//! TCP socket is.

mod client_side;
mod server_side;
mod settings;
mod stream;
pub mod x509;

pub use client_side::ClientTls;
pub use server_side::ServerTls;
pub use settings::Mode;
pub use stream::TlsConn;
