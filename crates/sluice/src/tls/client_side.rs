//! TLS towards clients: the rustls server configuration made from
//! `client_tls_*` (rebuilt on RELOAD; a broken new one keeps the old), the
//! answer to SSLRequest, and the handshake, after SSLRequest or directly
//! (PostgreSQL 17's direct TLS, which must negotiate ALPN `postgresql`).
//! PgBouncer's sslmode meanings: allow/prefer take TLS when asked, require
//! refuses plain TCP logins, verify-ca/verify-full also want a client
//! certificate signed by `client_tls_ca_file`. Unix-socket clients are not
//! asked for TLS, as in PgBouncer.

use std::sync::Arc;

use rustls::ServerConfig;
use rustls::server::WebPkiClientVerifier;
use sluice_config::Settings;
use tokio::net::TcpStream;

use super::settings::{Mode, TlsError, load_certs, load_key, load_roots, provider, versions};
use super::stream::{TlsConn, TlsSocket};

/// A client's handshake gets this long, even where client_login_timeout
/// is 0 (no bound): a stalled ClientHello holds up to 64 KiB in rustls.
const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// ALPN protocol name of PostgreSQL (required for direct TLS).
pub const ALPN_POSTGRESQL: &[u8] = b"postgresql";

/// What sluice does with clients' TLS.
pub struct ClientTls {
    pub mode: Mode,
    acceptor: Option<tokio_rustls::TlsAcceptor>,
    /// The same certificate for the web console (HTTPS: ALPN http/1.1, no
    /// client certificate asked).
    web: Option<tokio_rustls::TlsAcceptor>,
    /// SCRAM-SHA-256-PLUS data of the certificate (None when its signature
    /// algorithm names no hash, e.g. Ed25519: PLUS is then not offered).
    end_point: Option<Arc<[u8]>>,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field("mode", &self.mode)
            .field("configured", &self.acceptor.is_some())
            .finish()
    }
}

impl ClientTls {
    /// No TLS: SSLRequest is answered `N`.
    pub fn disabled() -> Self {
        Self {
            mode: Mode::Disable,
            acceptor: None,
            web: None,
            end_point: None,
        }
    }

    /// From the `client_tls_*` settings; an error names the key at fault.
    /// `want_certificates`: some client may authenticate with a certificate
    /// (auth_type cert, or a cert line in the hba file), so below
    /// verify-ca one is asked for, and checked against client_tls_ca_file
    /// when given (a client without one can still log in otherwise).
    pub fn from_settings(s: &Settings, want_certificates: bool) -> Result<Self, TlsError> {
        let mode = Mode::parse("client_tls_sslmode", &s.client_tls_sslmode)?;
        if mode == Mode::Disable {
            return Ok(Self::disabled());
        }
        if s.client_tls_key_file.is_empty() || s.client_tls_cert_file.is_empty() {
            if mode >= Mode::Require {
                return Err(TlsError::Setting {
                    key: "client_tls_sslmode",
                    value: s.client_tls_sslmode.clone(),
                    reason: "needs client_tls_key_file and client_tls_cert_file".into(),
                });
            }
            tracing::warn!(
                "client_tls_sslmode = {} without client_tls_key_file and client_tls_cert_file: \
                 clients asking for TLS are answered without it",
                s.client_tls_sslmode
            );
            return Ok(Self {
                mode,
                acceptor: None,
                web: None,
                end_point: None,
            });
        }
        let provider = Arc::new(provider(
            "client",
            ("client_tls_ciphers", &s.client_tls_ciphers),
            ("client_tls13_ciphers", &s.client_tls13_ciphers),
            Some(("client_tls_ecdhcurve", &s.client_tls_ecdhcurve)),
            Some(("client_tls_dheparams", &s.client_tls_dheparams)),
        )?);
        let versions = versions("client_tls_protocols", &s.client_tls_protocols)?;
        let certs = load_certs("client_tls_cert_file", &s.client_tls_cert_file)?;
        let key = load_key("client_tls_key_file", &s.client_tls_key_file)?;
        let mut web = ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&versions)?
            .with_no_client_auth()
            .with_single_cert(certs.clone(), key.clone_key())?;
        web.alpn_protocols = vec![b"http/1.1".to_vec()];
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&versions)?;
        let builder = if mode >= Mode::VerifyCa {
            if s.client_tls_ca_file.is_empty() {
                return Err(TlsError::Setting {
                    key: "client_tls_sslmode",
                    value: s.client_tls_sslmode.clone(),
                    reason: "needs client_tls_ca_file to check client certificates".into(),
                });
            }
            let roots = load_roots("client_tls_ca_file", &s.client_tls_ca_file)?;
            builder.with_client_cert_verifier(
                WebPkiClientVerifier::builder_with_provider(roots, provider).build()?,
            )
        } else if want_certificates && !s.client_tls_ca_file.is_empty() {
            let roots = load_roots("client_tls_ca_file", &s.client_tls_ca_file)?;
            builder.with_client_cert_verifier(
                WebPkiClientVerifier::builder_with_provider(roots, provider)
                    .allow_unauthenticated()
                    .build()?,
            )
        } else {
            if want_certificates {
                tracing::warn!(
                    "certificate authentication needs client_tls_ca_file: no client certificate \
                     is asked for, and cert logins fail"
                );
            }
            builder.with_no_client_auth()
        };
        let end_point = certs
            .first()
            .and_then(|leaf| super::x509::end_point_binding(leaf))
            .map(Arc::from);
        let mut config = builder.with_single_cert(certs, key)?;
        config.alpn_protocols = vec![ALPN_POSTGRESQL.to_vec()];
        Ok(Self {
            mode,
            acceptor: Some(tokio_rustls::TlsAcceptor::from(Arc::new(config))),
            web: Some(tokio_rustls::TlsAcceptor::from(Arc::new(web))),
            end_point,
        })
    }

    /// The acceptor for the web console's HTTPS, when certificates are set.
    pub fn web_acceptor(&self) -> Option<tokio_rustls::TlsAcceptor> {
        self.web.clone()
    }

    /// The same certificates under a stricter mode: what a RELOAD that asks
    /// for more (say require) but cannot load its files leaves in force, so
    /// a broken reload never lets plain logins in that the new file forbids.
    pub fn at_least(&self, mode: Mode) -> Self {
        Self {
            mode: self.mode.max(mode),
            acceptor: self.acceptor.clone(),
            web: self.web.clone(),
            end_point: self.end_point.clone(),
        }
    }

    /// Whether an SSLRequest gets `S`.
    pub fn offers(&self) -> bool {
        self.acceptor.is_some()
    }

    /// Whether a TCP client must use TLS to log in.
    pub fn required(&self) -> bool {
        self.mode >= Mode::Require
    }

    /// Runs the handshake on `tcp`. `direct`: the client started with a
    /// ClientHello instead of SSLRequest, and must have chosen ALPN
    /// `postgresql`.
    pub async fn accept(&self, tcp: TcpStream, direct: bool) -> std::io::Result<Box<TlsConn>> {
        let Some(acceptor) = &self.acceptor else {
            return Err(std::io::Error::other("TLS is not configured"));
        };
        let tls = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(TlsSocket::new(tcp)))
            .await
            .map_err(|_| {
                std::io::Error::new(std::io::ErrorKind::TimedOut, "TLS handshake timed out")
            })??;
        let conn = TlsConn::new(tokio_rustls::TlsStream::Server(tls), self.end_point.clone());
        if direct && conn.negotiated_protocol() != Some(ALPN_POSTGRESQL) {
            return Err(std::io::Error::other(
                "direct TLS connection without ALPN protocol \"postgresql\"",
            ));
        }
        Ok(Box::new(conn))
    }
}
