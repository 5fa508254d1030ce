//! The web console over HTTPS: with `web_console = 1` and `client_tls_*`
//! certificates, the HTTP endpoint (console, API, /metrics) speaks TLS with
//! the clients' certificate, so Basic passwords never travel in clear.

use std::sync::Arc;
use std::time::Duration;

use rustls_pki_types::{CertificateDer, ServerName, pem::PemObject};
use sluice_tests::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// `Authorization: Basic …` for `user:password` (RFC 4648 base64).
fn basic(user: &str, password: &str) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let input = format!("{user}:{password}").into_bytes();
    let mut out = String::new();
    for chunk in input.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(T[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    format!("Basic {out}")
}

async fn https_get(port: u16, ca: &std::path::Path, path: &str, auth: &str) -> String {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).expect("CA") {
        roots.add(cert.expect("cert")).expect("add");
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let mut tls = connector
        .connect(ServerName::try_from("localhost").expect("name"), tcp)
        .await
        .expect("TLS handshake with the web console");
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: {auth}\r\nConnection: close\r\n\r\n"
    );
    tls.write_all(request.as_bytes()).await.expect("write");
    let mut response = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), tls.read_to_end(&mut response)).await;
    String::from_utf8_lossy(&response).into_owned()
}

#[tokio::test]
async fn the_web_console_speaks_https_with_the_client_certificate() {
    let cluster = app_cluster(ServerAuth::Trust);
    let certs = Certs::make(APP_USER);
    let http = sluice_testkit::free_port().expect("port");
    let sluice = ConfigBuilder::for_cluster(&cluster)
        .set("auth_type", "md5")
        .set("auth_file", "@DIR@/userlist.txt")
        .set("admin_users", "admin")
        .set("client_tls_sslmode", "prefer")
        .set("client_tls_cert_file", &certs.path("server.crt"))
        .set("client_tls_key_file", &certs.path("server.key"))
        .sluice("metrics_addr", &format!("127.0.0.1:{http}"))
        .sluice("web_console", "1")
        .auth_file("\"admin\" \"console-pw\"\n\"app\" \"app\"\n")
        .start();
    let body = https_get(
        http,
        &certs.file("ca.crt"),
        "/api/pools",
        &basic("admin", "console-pw"),
    )
    .await;
    assert!(body.starts_with("HTTP/1.1 200"), "{body}");
    assert!(body.contains("application/json"), "{body}");
    let metrics = https_get(http, &certs.file("ca.crt"), "/metrics", "none").await;
    assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
    let denied = https_get(
        http,
        &certs.file("ca.crt"),
        "/api/pools",
        &basic("admin", "wrong"),
    )
    .await;
    assert!(denied.starts_with("HTTP/1.1 401"), "{denied}");

    // Plain HTTP gets no answer a browser could use (a TLS alert at most).
    let mut plain = tokio::net::TcpStream::connect(("127.0.0.1", http))
        .await
        .expect("connect");
    plain
        .write_all(b"GET /api/pools HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("write");
    let mut reply = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), plain.read_to_end(&mut reply)).await;
    assert!(!reply.starts_with(b"HTTP/1.1"), "{reply:?}");
    drop(sluice);
}
