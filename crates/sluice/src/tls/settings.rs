//! PgBouncer's TLS keys, read into rustls terms: the sslmode, the protocol
//! list (`secure`, `tlsv1.2`…), cipher lists (OpenSSL's keywords mean "every
//! suite rustls offers", which are all AEAD with forward secrecy; named
//! suites restrict), the ECDH curve, and PEM files. What rustls cannot do
//! (TLS 1.0/1.1, finite-field DHE) is said in the log, never silently
//! pretended; a list that leaves nothing usable is an error.

use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::{RootCertStore, SupportedProtocolVersion};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// Why a TLS configuration cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{key} = {value}: {reason}")]
    Setting {
        key: &'static str,
        value: String,
        reason: String,
    },
    #[error("{key} {path}: {reason}")]
    File {
        key: &'static str,
        path: String,
        reason: String,
    },
    #[error("TLS: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("TLS client certificate verifier: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
}

fn setting(key: &'static str, value: &str, reason: impl Into<String>) -> TlsError {
    TlsError::Setting {
        key,
        value: value.to_owned(),
        reason: reason.into(),
    }
}

/// libpq's and PgBouncer's sslmode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Mode {
    Disable,
    Allow,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl Mode {
    pub fn parse(key: &'static str, value: &str) -> Result<Mode, TlsError> {
        Ok(match value.trim().to_ascii_lowercase().as_str() {
            "" | "disable" => Mode::Disable,
            "allow" => Mode::Allow,
            "prefer" => Mode::Prefer,
            "require" => Mode::Require,
            "verify-ca" => Mode::VerifyCa,
            "verify-full" => Mode::VerifyFull,
            _ => {
                return Err(setting(
                    key,
                    value,
                    "expected disable, allow, prefer, require, verify-ca or verify-full",
                ));
            }
        })
    }
}

/// The protocol versions a `*_tls_protocols` value allows.
pub fn versions(
    key: &'static str,
    value: &str,
) -> Result<Vec<&'static SupportedProtocolVersion>, TlsError> {
    let mut tls12 = false;
    let mut tls13 = false;
    for word in value
        .split(|c: char| c == ',' || c == ':' || c.is_whitespace())
        .filter(|w| !w.is_empty())
    {
        match word.to_ascii_lowercase().as_str() {
            "secure" | "default" => (tls12, tls13) = (true, true),
            "all" | "legacy" => {
                (tls12, tls13) = (true, true);
                tracing::warn!(
                    "{key} = {value}: TLS 1.0 and 1.1 are not offered (rustls has only 1.2 and 1.3)"
                );
            }
            "tlsv1.2" => tls12 = true,
            "tlsv1.3" => tls13 = true,
            "tlsv1" | "tlsv1.0" | "tlsv1.1" => {
                tracing::warn!(
                    "{key} = {value}: {word} is not offered (rustls has only TLS 1.2 and 1.3)"
                );
            }
            _ => return Err(setting(key, value, format!("unknown protocol {word}"))),
        }
    }
    let mut out = Vec::new();
    if tls12 {
        out.push(&rustls::version::TLS12);
    }
    if tls13 {
        out.push(&rustls::version::TLS13);
    }
    if out.is_empty() {
        return Err(setting(
            key,
            value,
            "no protocol left that rustls offers (tlsv1.2, tlsv1.3)",
        ));
    }
    Ok(out)
}

/// OpenSSL's names of the TLS 1.2 suites rustls offers.
const OPENSSL_TLS12_NAMES: &[(&str, &str)] = &[
    (
        "ECDHE-ECDSA-AES128-GCM-SHA256",
        "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
    ),
    (
        "ECDHE-ECDSA-AES256-GCM-SHA384",
        "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
    ),
    (
        "ECDHE-ECDSA-CHACHA20-POLY1305",
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
    ),
    (
        "ECDHE-RSA-AES128-GCM-SHA256",
        "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
    ),
    (
        "ECDHE-RSA-AES256-GCM-SHA384",
        "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
    ),
    (
        "ECDHE-RSA-CHACHA20-POLY1305",
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
    ),
];

/// A suite's standard name: rustls calls TLS 1.3 suites `TLS13_…`, the
/// RFC and OpenSSL `TLS_…`.
pub fn suite_name(suite: &rustls::SupportedCipherSuite) -> String {
    let debug = format!("{:?}", suite.suite());
    match debug.strip_prefix("TLS13_") {
        Some(rest) => format!("TLS_{rest}"),
        None => debug,
    }
}

/// A suite's name as OpenSSL (and so PgBouncer's SHOW output) gives it:
/// the RFC name for TLS 1.3, OpenSSL's own for TLS 1.2.
pub fn openssl_suite_name(suite: &rustls::SupportedCipherSuite) -> String {
    let iana = suite_name(suite);
    OPENSSL_TLS12_NAMES
        .iter()
        .find(|(_, i)| *i == iana)
        .map_or(iana, |(openssl, _)| (*openssl).to_owned())
}

/// Which of `suites` (of one TLS version) a cipher list keeps. Named suites
/// (OpenSSL or IANA names) restrict to those; a suite name rustls does not
/// have is warned about and skipped. A list of keywords and OpenSSL
/// selections only (default, secure, HIGH, !aNULL, ECDHE…) keeps every
/// suite rustls offers, all of them AEAD with forward secrecy.
fn pick_suites(
    key: &'static str,
    value: &str,
    tls13: bool,
    suites: &[rustls::SupportedCipherSuite],
) -> Result<Vec<rustls::SupportedCipherSuite>, TlsError> {
    let of_version: Vec<_> = suites
        .iter()
        .copied()
        .filter(|s| matches!(s, rustls::SupportedCipherSuite::Tls13(_)) == tls13)
        .collect();
    let mut named = Vec::new();
    let mut missing = Vec::new();
    let mut selections = Vec::new();
    for word in value
        .split(|c: char| c == ':' || c == ',' || c.is_whitespace())
        .filter(|w| !w.is_empty())
    {
        let iana = OPENSSL_TLS12_NAMES
            .iter()
            .find(|(openssl, _)| openssl.eq_ignore_ascii_case(word))
            .map_or(word, |(_, iana)| iana);
        if let Some(suite) = of_version
            .iter()
            .find(|s| suite_name(s).eq_ignore_ascii_case(iana))
        {
            named.push(*suite);
        } else if word.to_ascii_uppercase().starts_with("TLS_")
            || word.get(1..).is_some_and(|rest| rest.contains('-'))
        {
            missing.push(word);
        } else {
            selections.push(word);
        }
    }
    if !missing.is_empty() {
        tracing::warn!(
            "{key} = {value}: not offered by rustls, skipped: {}",
            missing.join(" ")
        );
    }
    let exclusions: Vec<&str> = selections
        .iter()
        .copied()
        .filter(|w| w.starts_with(['!', '-']))
        .collect();
    if named.is_empty() && !exclusions.is_empty() {
        tracing::warn!(
            "{key} = {value}: exclusions are not applied ({}); every suite rustls offers is used",
            exclusions.join(" ")
        );
    }
    if !named.is_empty() {
        if !selections.is_empty() {
            tracing::warn!(
                "{key} = {value}: the named suites are used; {} ignored",
                selections.join(" ")
            );
        }
        return Ok(named);
    }
    if missing.is_empty() || !selections.is_empty() {
        return Ok(of_version);
    }
    Err(setting(key, value, "names no cipher suite rustls offers"))
}

/// A ring provider restricted as `ciphers`, `tls13_ciphers` and `ecdhcurve`
/// say; `dheparams` other than none/auto is only warned about.
pub fn provider(
    prefix: &'static str,
    ciphers: (&'static str, &str),
    tls13_ciphers: (&'static str, &str),
    ecdhcurve: Option<(&'static str, &str)>,
    dheparams: Option<(&'static str, &str)>,
) -> Result<CryptoProvider, TlsError> {
    let mut p = rustls::crypto::ring::default_provider();
    let all = p.cipher_suites.clone();
    let mut suites = pick_suites(ciphers.0, ciphers.1, false, &all)?;
    suites.extend(pick_suites(tls13_ciphers.0, tls13_ciphers.1, true, &all)?);
    p.cipher_suites = suites;
    if let Some((key, value)) = ecdhcurve {
        let wanted: Vec<String> = value
            .split([':', ','])
            .map(|w| w.trim().to_ascii_lowercase())
            .filter(|w| !w.is_empty() && w != "auto")
            .collect();
        if !wanted.is_empty() {
            let groups: Vec<_> = p
                .kx_groups
                .iter()
                .copied()
                .filter(|g| {
                    let name = match format!("{:?}", g.name()).as_str() {
                        "X25519" => "x25519",
                        "secp256r1" => "prime256v1",
                        "secp384r1" => "secp384r1",
                        _ => "",
                    };
                    wanted.iter().any(|w| {
                        w == name
                            || (name == "prime256v1" && (w == "p-256" || w == "secp256r1"))
                            || (name == "secp384r1" && w == "p-384")
                    })
                })
                .collect();
            if groups.is_empty() {
                return Err(setting(
                    key,
                    value,
                    "names no curve rustls offers (x25519, prime256v1, secp384r1)",
                ));
            }
            p.kx_groups = groups;
        }
    }
    if let Some((key, value)) = dheparams
        && !matches!(
            value.trim().to_ascii_lowercase().as_str(),
            "" | "none" | "auto"
        )
    {
        tracing::warn!(
            "{key} = {value}: finite-field DHE is not offered ({prefix} key exchange is ECDHE only)"
        );
    }
    Ok(p)
}

/// The certificates of a PEM file, leaf first.
pub fn load_certs(key: &'static str, path: &str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let file_error = |reason: String| TlsError::File {
        key,
        path: path.to_owned(),
        reason,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| file_error(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(e.to_string()))?;
    if certs.is_empty() {
        return Err(file_error("no certificate in the file".into()));
    }
    Ok(certs)
}

/// The private key of a PEM file.
pub fn load_key(key: &'static str, path: &str) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| TlsError::File {
        key,
        path: path.to_owned(),
        reason: e.to_string(),
    })
}

/// The CA certificates of a PEM file, as trust anchors.
pub fn load_roots(key: &'static str, path: &str) -> Result<Arc<RootCertStore>, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in load_certs(key, path)? {
        roots.add(cert).map_err(|e| TlsError::File {
            key,
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
    }
    Ok(Arc::new(roots))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protocol_lists() {
        assert_eq!(versions("k", "secure").unwrap().len(), 2);
        assert_eq!(versions("k", "tlsv1.3").unwrap().len(), 1);
        assert_eq!(versions("k", "tlsv1.1,tlsv1.2").unwrap().len(), 1);
        assert!(versions("k", "tlsv1.1").is_err());
        assert!(versions("k", "sslv3").is_err());
    }

    #[test]
    fn cipher_lists() {
        let all = rustls::crypto::ring::default_provider().cipher_suites;
        let tls12 = pick_suites("k", "default", false, &all).unwrap();
        assert!(tls12.len() >= 6, "{tls12:?}");
        assert_eq!(
            pick_suites("k", "HIGH:!aNULL:!MD5", false, &all)
                .unwrap()
                .len(),
            tls12.len()
        );
        let one = pick_suites("k", "ECDHE-RSA-AES256-GCM-SHA384", false, &all).unwrap();
        assert_eq!(one.len(), 1);
        let iana = pick_suites("k", "TLS_AES_128_GCM_SHA256", true, &all).unwrap();
        assert_eq!(iana.len(), 1);
        assert_eq!(
            pick_suites(
                "k",
                "TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256",
                true,
                &all
            )
            .unwrap()
            .len(),
            2
        );
        // A real suite rustls lacks restricts to nothing: an error, not "all".
        assert!(pick_suites("k", "ECDHE-RSA-AES256-SHA384", false, &all).is_err());
        // Named suites win over selections in the same list.
        let mixed = pick_suites("k", "ECDHE-RSA-AES128-GCM-SHA256:!aNULL", false, &all).unwrap();
        assert_eq!(mixed.len(), 1);
    }

    #[test]
    fn modes() {
        assert_eq!(Mode::parse("k", "verify-full").unwrap(), Mode::VerifyFull);
        assert!(Mode::parse("k", "sometimes").is_err());
        assert!(Mode::Require > Mode::Prefer);
    }
}
