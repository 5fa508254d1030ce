//! The HTTP endpoint (`metrics_addr`) as tests read it: one GET, one
//! sample out of `/metrics`, and a wait on the parked clients' gauge.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One GET; returns (status code, body).
pub async fn get(port: u16, path: &str) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect to metrics_addr");
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut text = String::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_string(&mut text))
        .await
        .expect("response in time")
        .unwrap();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("status line");
    let body = text.split("\r\n\r\n").nth(1).unwrap_or_default().to_owned();
    (status, body)
}

/// The value of the sample whose line starts with `prefix`.
pub fn sample(body: &str, prefix: &str) -> f64 {
    body.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no sample {prefix} in:\n{body}"))
}

/// Waits until `sluice_parked_clients` satisfies `ok` (10 s at most).
pub async fn parked_until(mport: u16, ok: impl Fn(f64) -> bool) -> f64 {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (_, body) = get(mport, "/metrics").await;
        let parked = sample(&body, "sluice_parked_clients{");
        if ok(parked) {
            return parked;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "sluice_parked_clients stayed at {parked}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
