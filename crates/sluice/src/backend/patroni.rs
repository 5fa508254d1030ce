//! Patroni as a topology source: one task per database that names its
//! Patroni REST API (`patroni=` in the entry) asks `GET /cluster` every
//! check period. Patroni's leader (it holds the leader key in the DCS) is
//! the only host sluice lets take writes: a host that says it is a primary
//! but is not Patroni's leader (a demoted primary back up before Patroni
//! has rewound it) gets none, and while Patroni names no leader (a
//! switchover between two holders) writes wait. An entry that names no
//! hosts takes Patroni's members as its hosts, following them as they
//! join and leave. The JSON answer is read
//! with serde_json; the HTTP/1.0 request is small enough to write here.

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::monitor::MonitorHost;
use super::topology::{Member, Topology};

/// Largest answer read from Patroni.
const ANSWER_LIMIT: usize = 1 << 20;

/// Starts the task that follows Patroni for `topology`; it ends when the
/// topology is dropped.
pub fn start(
    host: Arc<dyn MonitorHost>,
    topology: &Arc<Topology>,
    spawn: impl Fn(std::pin::Pin<Box<dyn Future<Output = ()> + Send>>),
) {
    if !topology.patroni.is_empty() {
        spawn(Box::pin(watch(host, Arc::downgrade(topology))));
    }
}

async fn watch(host: Arc<dyn MonitorHost>, topology: Weak<Topology>) {
    // The member that answered last is asked first.
    let mut first = 0;
    loop {
        let (period, timeout, _) = host.check_settings();
        let Some(topo) = topology.upgrade() else {
            return;
        };
        if host.stopping() || !host.is_current(&topo) {
            return;
        }
        let at = Instant::now();
        let urls = topo.patroni.clone();
        let mut answer = Err("no Patroni member answered".to_owned());
        for k in 0..urls.len() {
            let i = (first + k) % urls.len();
            match tokio::time::timeout(timeout, cluster(&urls[i])).await {
                Ok(Ok(members)) => {
                    first = i;
                    answer = Ok(members);
                    break;
                }
                Ok(Err(e)) => answer = Err(format!("{}: {e}", urls[i])),
                Err(_) => answer = Err(format!("{}: no answer within {timeout:?}", urls[i])),
            }
        }
        // Where the entry names no hosts, Patroni's members are the hosts.
        if let Ok(members) = &answer {
            let news = topo.follow_members(members);
            for line in &news.log {
                tracing::warn!(db = %topo.database, "patroni: {line}");
            }
            if !news.added.is_empty() || !news.readdressed.is_empty() {
                host.hosts_changed(&topo, &news);
            }
        }
        // Patroni's view outlives a failed ask by a few periods, then
        // the hosts' own checks decide alone.
        let keep_for = (period * 4).max(Duration::from_secs(2)) + timeout;
        if let Some(change) = topo.record_patroni(answer, at, keep_for) {
            tracing::warn!(db = %topo.database, "patroni: {change}");
        }
        host.topology_changed(&topo);
        drop(topo);
        tokio::time::sleep(
            period
                .saturating_sub(at.elapsed())
                .max(Duration::from_millis(10)),
        )
        .await;
    }
}

/// `GET /cluster` of the member at `addr` (`host:port`).
async fn cluster(addr: &str) -> Result<Vec<Member>, String> {
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("cannot connect: {e}"))?;
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    let request = format!(
        "GET /cluster HTTP/1.0\r\nHost: {host}\r\nAccept: application/json\r\nConnection: close\r\n\r\n"
    );
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| format!("cannot send: {e}"))?;
    let mut answer = Vec::new();
    (&mut stream)
        .take(ANSWER_LIMIT as u64 + 1)
        .read_to_end(&mut answer)
        .await
        .map_err(|e| format!("cannot read: {e}"))?;
    if answer.len() > ANSWER_LIMIT {
        return Err(format!("answer larger than {ANSWER_LIMIT} bytes"));
    }
    members(&answer)
}

/// The members of a `/cluster` HTTP answer (status line, headers, JSON).
fn members(answer: &[u8]) -> Result<Vec<Member>, String> {
    let split = memchr::memmem::find(answer, b"\r\n\r\n").ok_or("no end of headers")?;
    let head = String::from_utf8_lossy(&answer[..split]);
    let status = head.lines().next().unwrap_or_default();
    if status.split_whitespace().nth(1) != Some("200") {
        return Err(format!("answered \"{status}\""));
    }
    if head
        .lines()
        .any(|l| l.to_ascii_lowercase().starts_with("transfer-encoding:"))
    {
        return Err("chunked answers are not read".to_owned());
    }
    let json: serde_json::Value =
        serde_json::from_slice(&answer[split + 4..]).map_err(|e| format!("bad JSON: {e}"))?;
    let list = json
        .get("members")
        .and_then(serde_json::Value::as_array)
        .ok_or("no members in the answer")?;
    Ok(list
        .iter()
        .filter_map(|m| {
            let text = |k: &str| m.get(k).and_then(serde_json::Value::as_str);
            Some(Member {
                name: text("name")?.to_owned(),
                role: text("role").unwrap_or("unknown").to_owned(),
                state: text("state").unwrap_or("unknown").to_owned(),
                host: text("host")?.to_owned(),
                port: u16::try_from(m.get("port")?.as_u64()?).ok()?,
            })
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_members_of_a_cluster_answer() {
        let body = r#"{"members": [{"name": "pg0", "role": "leader", "state": "running", "api_url": "http://127.0.0.1:18008/patroni", "host": "127.0.0.1", "port": 5441, "timeline": 1}, {"name": "pg1", "role": "replica", "state": "streaming", "host": "127.0.0.1", "port": 5442, "timeline": 1, "lag": 0}, {"name": "broken"}]}"#;
        let answer = format!("HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n{body}");
        let m = members(answer.as_bytes()).unwrap();
        assert_eq!(m.len(), 2);
        assert_eq!(
            (m[0].name.as_str(), m[0].role.as_str(), m[0].port),
            ("pg0", "leader", 5441)
        );
        assert_eq!(m[1].role, "replica");
        assert!(members(b"HTTP/1.0 503 Service Unavailable\r\n\r\n{}").is_err());
        assert!(members(b"HTTP/1.0 200 OK\r\n\r\nnot json").is_err());
        assert!(members(b"HTTP/1.0 200 OK").is_err());
        assert!(
            members(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\n{\r\n").is_err()
        );
    }
}
