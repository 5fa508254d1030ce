//! Patroni as a topology source: one task per database that names its
//! Patroni REST API (`patroni=` in the entry) asks `GET /cluster` every
//! check period. Patroni's leader (it holds the leader key in the DCS) is
//! the only host sluice lets take writes: a host that says it is a primary
//! but is not Patroni's leader (a demoted primary back up before Patroni
//! has rewound it) gets none, and while Patroni names no leader (a
//! switchover between two holders) writes wait. An entry that names no
//! hosts takes Patroni's members as its hosts, following them as they
//! join and leave. A member Patroni names otherwise than the entry names
//! the same server (`127.0.0.1` for `localhost`, an address for a DNS
//! name) is matched by address. The JSON answer is read
//! with serde_json; the HTTP/1.0 request is small enough to write here.

use std::net::IpAddr;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::dns::{self, DnsTtl};
use super::monitor::MonitorHost;
use super::target::ServerAddr;
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
                Ok(Ok(mut members)) => {
                    first = i;
                    // (a lookup that hangs leaves the names as they are)
                    let naming = name_as_hosts(&mut members, topo.configured(), host.dns_ttl());
                    let _ = tokio::time::timeout(timeout, naming).await;
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

/// Patroni names a member by its connect address; the entry may name the
/// same server otherwise (`localhost` for `127.0.0.1`, a DNS name for an
/// address, or the reverse), and then neither its role nor its leadership
/// was matched: Patroni's fencing was lost without a word but the log's.
/// A host of the entry that no member is named as takes the member on its
/// port that shares an address with it, if exactly one does (a
/// round-robin name that covers several members matches none). Lookups go
/// through the DNS cache, and only when some host is unmatched.
async fn name_as_hosts(members: &mut [Member], configured: &[ServerAddr], ttl: DnsTtl) {
    let hosts: Vec<(&str, u16)> = configured
        .iter()
        .filter_map(|a| match a {
            ServerAddr::Tcp { host, port } => Some((host.as_str(), *port)),
            ServerAddr::Unix(_) => None,
        })
        .collect();
    let named = |m: &Member, (h, p): (&str, u16)| m.host == h && m.port == p;
    if hosts.iter().all(|&h| members.iter().any(|m| named(m, h))) {
        return;
    }
    let ips = |host: String, port: u16| async move {
        dns::resolve(&host, port, ttl)
            .await
            .map(|addrs| addrs.iter().map(std::net::SocketAddr::ip).collect())
            .unwrap_or_default()
    };
    let mut host_ips = Vec::with_capacity(hosts.len());
    for &(h, p) in &hosts {
        host_ips.push(ips(h.to_owned(), p).await);
    }
    let mut member_ips = Vec::with_capacity(members.len());
    for m in members.iter() {
        member_ips.push(ips(m.host.clone(), m.port).await);
    }
    alias_members(members, &hosts, &host_ips, &member_ips);
}

/// The matching of [`name_as_hosts`], its addresses looked up: `host_ips[j]`
/// are `hosts[j]`'s, `member_ips[i]` `members[i]`'s.
fn alias_members(
    members: &mut [Member],
    hosts: &[(&str, u16)],
    host_ips: &[Vec<IpAddr>],
    member_ips: &[Vec<IpAddr>],
) {
    let named = |m: &Member, (h, p): (&str, u16)| m.host == h && m.port == p;
    for (j, &(host, port)) in hosts.iter().enumerate() {
        if members.iter().any(|m| named(m, (host, port))) {
            continue;
        }
        let mut sharing = (0..members.len()).filter(|&i| {
            members[i].port == port
                && member_ips
                    .get(i)
                    .is_some_and(|ips| ips.iter().any(|ip| host_ips[j].contains(ip)))
        });
        if let (Some(i), None) = (sharing.next(), sharing.next())
            && !hosts.iter().any(|&h| named(&members[i], h))
        {
            members[i].host = host.to_owned();
        }
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
    fn members_named_otherwise_are_matched_by_address() {
        let member = |host: &str, port: u16| Member {
            name: format!("{host}:{port}"),
            role: "replica".into(),
            state: "streaming".into(),
            host: host.into(),
            port,
        };
        let ip = |s: &str| s.parse::<IpAddr>().expect("an address");
        let loopback = vec![ip("127.0.0.1"), ip("::1")];
        // `localhost` in the entry, Patroni's 127.0.0.1: matched, port by
        // port.
        let mut members = vec![member("127.0.0.1", 5432), member("127.0.0.1", 5433)];
        let hosts = [("localhost", 5432), ("localhost", 5433)];
        let ips = vec![vec![ip("127.0.0.1")], vec![ip("127.0.0.1")]];
        alias_members(
            &mut members,
            &hosts,
            &[loopback.clone(), loopback.clone()],
            &ips,
        );
        assert_eq!(members[0].host, "localhost");
        assert_eq!(members[1].host, "localhost");
        // Named alike already: nothing to do; another port: no match.
        let mut members = vec![member("127.0.0.1", 5432), member("127.0.0.1", 6000)];
        let hosts = [("127.0.0.1", 5432), ("localhost", 5433)];
        alias_members(&mut members, &hosts, &[loopback.clone(), loopback], &ips);
        assert_eq!(members[0].host, "127.0.0.1");
        assert_eq!(members[1].host, "127.0.0.1");
        // A round-robin name covering two members matches neither.
        let mut members = vec![member("10.0.0.1", 5432), member("10.0.0.2", 5432)];
        let hosts = [("pg.example", 5432)];
        let both = vec![ip("10.0.0.1"), ip("10.0.0.2")];
        let ips = vec![vec![ip("10.0.0.1")], vec![ip("10.0.0.2")]];
        alias_members(&mut members, &hosts, &[both], &ips);
        assert_eq!(members[0].host, "10.0.0.1");
        assert_eq!(members[1].host, "10.0.0.2");
        // Two names of one server: the first takes it, once.
        let mut members = vec![member("10.0.0.1", 5432)];
        let hosts = [("a.example", 5432), ("b.example", 5432)];
        let one = vec![ip("10.0.0.1")];
        alias_members(&mut members, &hosts, &[one.clone(), one.clone()], &[one]);
        assert_eq!(members[0].host, "a.example");
    }

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
