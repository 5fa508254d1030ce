//! TLS towards PostgreSQL: `server_tls_*` with libpq's sslmode meanings.
//! disable and allow never ask (libpq's allow would retry with TLS after a
//! refused plain login; sluice does not); prefer asks, and falls back to
//! plain TCP when refused or when the handshake fails (on a new
//! connection, as libpq does); require insists; verify-ca also checks the chain against
//! `server_tls_ca_file`; verify-full also the host name (DNS name or IP
//! address of the database entry). `server_tls_cert_file`/`key_file` are
//! the client certificate sluice presents (for `cert` in pg_hba.conf).
//! Certificates are not checked below verify-ca, as in libpq, but the
//! handshake's signatures always are.

use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, SignatureScheme};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use sluice_config::Settings;
use tokio::net::TcpStream;

use super::settings::{Mode, TlsError, load_certs, load_key, load_roots, provider, versions};
use super::stream::{TlsConn, TlsSocket};

/// What sluice does about TLS with its servers.
#[derive(Default)]
pub struct ServerTls {
    pub mode: Option<Mode>,
    connector: Option<tokio_rustls::TlsConnector>,
    /// The `server_tls_*` values this was made from: a RELOAD that changes
    /// them makes pools drop the servers opened under the old ones.
    key: String,
    /// Set when a RELOAD asked for a stricter mode whose files do not load:
    /// every new server connection fails with this (fail closed).
    refusal: Option<String>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("mode", &self.mode)
            .finish()
    }
}

/// Checks a server's certificate as the sslmode says.
#[derive(Debug)]
struct Verifier {
    provider: Arc<CryptoProvider>,
    /// None below verify-ca.
    chain: Option<Arc<WebPkiServerVerifier>>,
    check_name: bool,
}

impl ServerCertVerifier for Verifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(chain) = &self.chain else {
            return Ok(ServerCertVerified::assertion());
        };
        match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) if !self.check_name => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

impl ServerTls {
    /// From the `server_tls_*` settings; an error names the key at fault.
    pub fn from_settings(s: &Settings) -> Result<Self, TlsError> {
        let mode = Mode::parse("server_tls_sslmode", &s.server_tls_sslmode)?;
        let key = [
            &s.server_tls_sslmode,
            &s.server_tls_ca_file,
            &s.server_tls_cert_file,
            &s.server_tls_key_file,
            &s.server_tls_protocols,
            &s.server_tls_ciphers,
            &s.server_tls13_ciphers,
        ]
        .map(String::as_str)
        .join("\u{0}");
        if mode <= Mode::Allow {
            return Ok(Self {
                mode: Some(mode),
                connector: None,
                key,
                refusal: None,
            });
        }
        let provider = Arc::new(provider(
            "server",
            ("server_tls_ciphers", &s.server_tls_ciphers),
            ("server_tls13_ciphers", &s.server_tls13_ciphers),
            None,
            None,
        )?);
        let versions = versions("server_tls_protocols", &s.server_tls_protocols)?;
        let chain = if mode >= Mode::VerifyCa {
            if s.server_tls_ca_file.is_empty() {
                return Err(TlsError::Setting {
                    key: "server_tls_sslmode",
                    value: s.server_tls_sslmode.clone(),
                    reason: "needs server_tls_ca_file to check server certificates".into(),
                });
            }
            let roots = load_roots("server_tls_ca_file", &s.server_tls_ca_file)?;
            Some(WebPkiServerVerifier::builder_with_provider(roots, provider.clone()).build()?)
        } else {
            None
        };
        let verifier = Arc::new(Verifier {
            provider: provider.clone(),
            chain,
            check_name: mode == Mode::VerifyFull,
        });
        let builder = ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&versions)?
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let config = match (
            s.server_tls_cert_file.is_empty(),
            s.server_tls_key_file.is_empty(),
        ) {
            (true, true) => builder.with_no_client_auth(),
            (false, false) => builder.with_client_auth_cert(
                load_certs("server_tls_cert_file", &s.server_tls_cert_file)?,
                load_key("server_tls_key_file", &s.server_tls_key_file)?,
            )?,
            _ => {
                return Err(TlsError::Setting {
                    key: "server_tls_cert_file",
                    value: s.server_tls_cert_file.clone(),
                    reason: "server_tls_cert_file and server_tls_key_file go together".into(),
                });
            }
        };
        Ok(Self {
            mode: Some(mode),
            connector: Some(tokio_rustls::TlsConnector::from(Arc::new(config))),
            key,
            refusal: None,
        })
    }

    /// What a RELOAD leaves when it asks for `mode`, stricter than what is
    /// in force, and its files do not load: no server connection at all
    /// rather than a weaker one than the operator asked for.
    pub fn refusing(mode: Mode, why: String) -> Self {
        Self {
            mode: Some(mode),
            connector: None,
            key: String::new(),
            refusal: Some(format!(
                "server_tls_sslmode {mode:?} is configured but its files could not be loaded: {why}"
            )),
        }
    }

    /// Why new server connections are refused, if they are.
    pub fn refusal(&self) -> Option<&str> {
        self.refusal.as_deref()
    }

    /// Whether two configurations come from the same settings.
    pub fn same_settings(&self, other: &ServerTls) -> bool {
        self.key == other.key && self.refusal == other.refusal
    }

    /// Whether a new server connection starts with SSLRequest.
    pub fn requests(&self) -> bool {
        self.connector.is_some()
    }

    /// Whether a server that answers `N` is refused.
    pub fn required(&self) -> bool {
        self.mode.is_some_and(|m| m >= Mode::Require)
    }

    /// The handshake with the server at `host` (its name, for verify-full
    /// and SNI), after it answered `S`.
    pub async fn connect(&self, tcp: TcpStream, host: &str) -> Result<Box<TlsConn>, String> {
        let Some(connector) = &self.connector else {
            return Err("TLS is not configured".into());
        };
        let name = ServerName::try_from(host.to_owned())
            .map_err(|e| format!("server name {host:?}: {e}"))?;
        let tls = connector
            .connect(name, TlsSocket::new(tcp))
            .await
            .map_err(|e| e.to_string())?;
        Ok(Box::new(TlsConn::new(
            tokio_rustls::TlsStream::Client(tls),
            None,
        )))
    }
}
