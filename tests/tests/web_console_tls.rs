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

/// A plain HTTP request; returns the status line.
async fn http_status(port: u16, request: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    s.write_all(request.as_bytes()).await.expect("write");
    let mut reply = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut reply)).await;
    String::from_utf8_lossy(&reply)
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test]
async fn cross_site_posts_plain_http_off_loopback_and_empty_passwords_are_refused() {
    let cluster = app_cluster(ServerAuth::Trust);
    let http = sluice_testkit::free_port().expect("port");
    let config = |addr: &str| {
        ConfigBuilder::for_cluster(&cluster)
            .set("auth_type", "md5")
            .set("auth_file", "@DIR@/userlist.txt")
            .set("admin_users", "admin,nopass")
            .sluice("metrics_addr", &format!("{addr}:{http}"))
            .sluice("web_console", "1")
            .auth_file("\"admin\" \"pw\"\n\"nopass\" \"\"\n")
    };
    let sluice = config("127.0.0.1").start();
    let auth = basic("admin", "pw");
    let body = r#"{"name":"x1","host":"127.0.0.1","port":5432}"#;
    let post = |extra: &str| {
        format!(
            "POST /api/databases HTTP/1.1\r\nHost: 127.0.0.1:{http}\r\nAuthorization: {auth}\r\n{extra}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
    };
    // What a form on another site can send: text/plain, or its own Origin.
    assert!(
        http_status(http, &post("Content-Type: text/plain\r\n"))
            .await
            .contains("403")
    );
    assert!(
        http_status(
            http,
            &post("Content-Type: application/json\r\nOrigin: http://evil.example\r\n")
        )
        .await
        .contains("403")
    );
    assert!(
        http_status(
            http,
            &post("Content-Type: application/json\r\nSec-Fetch-Site: cross-site\r\n")
        )
        .await
        .contains("403")
    );
    // The console's own page: same origin, JSON.
    assert!(
        http_status(
            http,
            &post(&format!(
                "Content-Type: application/json\r\nOrigin: http://127.0.0.1:{http}\r\n"
            ))
        )
        .await
        .contains("201")
    );
    // An empty password in the auth_file never opens the console.
    let get = |auth: &str| {
        format!(
            "GET /api/pools HTTP/1.1\r\nHost: x\r\nAuthorization: {auth}\r\nConnection: close\r\n\r\n"
        )
    };
    assert!(
        http_status(http, &get(&basic("nopass", "")))
            .await
            .contains("401")
    );
    assert!(http_status(http, &get(&auth)).await.contains("200"));
    drop(sluice);

    // On every address, without TLS: refused (passwords would travel in clear).
    let open = config("0.0.0.0").start();
    assert!(http_status(http, &get(&auth)).await.contains("403"));
    drop(open);
}
