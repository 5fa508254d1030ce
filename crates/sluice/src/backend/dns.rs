//! Host names of `[databases]` entries, looked up through a cache as
//! PgBouncer does: an answer is kept `dns_max_ttl` (the record's own TTL is
//! not known to getaddrinfo, and PgBouncer ignores it too), a failure
//! `dns_nxdomain_ttl`; 0 looks up every time. Addresses are tried in the
//! resolver's order. IP literals never touch the cache.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long answers and failures are kept (`dns_max_ttl`,
/// `dns_nxdomain_ttl`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DnsTtl {
    pub answer: Duration,
    pub failure: Duration,
}

impl Default for DnsTtl {
    fn default() -> Self {
        Self {
            answer: Duration::from_secs(15),
            failure: Duration::from_secs(15),
        }
    }
}

impl DnsTtl {
    pub fn from_settings(s: &sluice_config::Settings) -> Self {
        Self {
            answer: s.dns_max_ttl,
            failure: s.dns_nxdomain_ttl,
        }
    }
}

struct Cached {
    at: Instant,
    result: Result<Vec<SocketAddr>, (io::ErrorKind, String)>,
}

/// Names kept at most; past this, expired entries go, then everything.
const MAX_NAMES: usize = 4096;

/// Host and port → what the last lookup said.
type Names = HashMap<(Box<str>, u16), Cached>;

static CACHE: Mutex<Option<Names>> = Mutex::new(None);

/// Host names in the cache (SHOW LISTS `dns_names`).
pub fn cached_names() -> usize {
    let cache = CACHE.lock().unwrap_or_else(|p| p.into_inner());
    cache.as_ref().map_or(0, HashMap::len)
}

/// A name of the cache as SHOW DNS_HOSTS lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedName {
    pub host: Box<str>,
    /// Whole seconds until it is looked up again (0 once stale).
    pub ttl_left: u64,
    /// Its addresses (`ip:port`, `[ip6]:port`), none for a failed lookup.
    pub addrs: Vec<SocketAddr>,
}

/// Every name in the cache, sorted by name then port (PgBouncer walks its
/// tree of names in order).
pub fn cached(ttl: DnsTtl) -> Vec<CachedName> {
    let cache = CACHE.lock().unwrap_or_else(|p| p.into_inner());
    let mut names: Vec<_> = cache
        .iter()
        .flatten()
        .map(|((host, port), c)| {
            let keep = if c.result.is_ok() {
                ttl.answer
            } else {
                ttl.failure
            };
            let left = keep.saturating_sub(c.at.elapsed()).as_secs();
            let addrs = c.result.as_ref().ok().cloned().unwrap_or_default();
            (host.clone(), *port, left, addrs)
        })
        .collect();
    names.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
    names
        .into_iter()
        .map(|(host, _, ttl_left, addrs)| CachedName {
            host,
            ttl_left,
            addrs,
        })
        .collect()
}

/// The addresses of `host:port`, from the cache while fresh.
pub async fn resolve(host: &str, port: u16, ttl: DnsTtl) -> io::Result<Vec<SocketAddr>> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    let key = (Box::<str>::from(host), port);
    if let Some(hit) = lookup_cached(&key, ttl) {
        return hit.map_err(|(kind, message)| io::Error::new(kind, message));
    }
    let looked_up = tokio::net::lookup_host((host, port))
        .await
        .map(|addrs| addrs.collect::<Vec<_>>())
        .and_then(|addrs| {
            if addrs.is_empty() {
                Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("{host}: no address"),
                ))
            } else {
                Ok(addrs)
            }
        });
    let keep = match &looked_up {
        Ok(_) => ttl.answer,
        Err(_) => ttl.failure,
    };
    if !keep.is_zero() {
        let mut cache = CACHE.lock().unwrap_or_else(|p| p.into_inner());
        let cache = cache.get_or_insert_with(HashMap::new);
        if cache.len() >= MAX_NAMES {
            let longest = ttl.answer.max(ttl.failure);
            cache.retain(|_, c| c.at.elapsed() < longest);
            if cache.len() >= MAX_NAMES {
                cache.clear();
            }
        }
        let result = match &looked_up {
            Ok(addrs) => Ok(addrs.clone()),
            Err(e) => Err((e.kind(), e.to_string())),
        };
        cache.insert(
            key,
            Cached {
                at: Instant::now(),
                result,
            },
        );
    }
    looked_up
}

#[allow(clippy::type_complexity)]
fn lookup_cached(
    key: &(Box<str>, u16),
    ttl: DnsTtl,
) -> Option<Result<Vec<SocketAddr>, (io::ErrorKind, String)>> {
    let cache = CACHE.lock().unwrap_or_else(|p| p.into_inner());
    let cached = cache.as_ref()?.get(key)?;
    let keep = match cached.result {
        Ok(_) => ttl.answer,
        Err(_) => ttl.failure,
    };
    (cached.at.elapsed() < keep).then(|| cached.result.clone())
}

/// Connects to the first address of `host:port` that answers.
pub async fn connect(host: &str, port: u16, ttl: DnsTtl) -> io::Result<tokio::net::TcpStream> {
    let mut last = None;
    for addr in resolve(host, port, ttl).await? {
        match tokio::net::TcpStream::connect(addr).await {
            Ok(s) => return Ok(s),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no address")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn literals_bypass_and_names_are_kept_for_their_ttl() {
        let ttl = DnsTtl {
            answer: Duration::from_secs(60),
            failure: Duration::from_secs(60),
        };
        let addrs = resolve("127.0.0.1", 5432, ttl).await.unwrap();
        assert_eq!(addrs, vec!["127.0.0.1:5432".parse().unwrap()]);
        let first = resolve("localhost", 6001, ttl).await.unwrap();
        assert!(!first.is_empty());
        assert!(lookup_cached(&("localhost".into(), 6001), ttl).is_some());
        // A zero TTL neither reads nor keeps.
        let none = DnsTtl {
            answer: Duration::ZERO,
            failure: Duration::ZERO,
        };
        assert!(lookup_cached(&("localhost".into(), 6001), none).is_none());
        resolve("localhost", 6002, none).await.unwrap();
        assert!(lookup_cached(&("localhost".into(), 6002), ttl).is_none());
        // A failure is kept too (the name cannot exist: .invalid).
        assert!(resolve("nowhere.invalid", 1, ttl).await.is_err());
        assert!(matches!(
            lookup_cached(&("nowhere.invalid".into(), 1), ttl),
            Some(Err(_))
        ));
        // SHOW DNS_HOSTS: both kept names, in order, the failure without
        // addresses; the name looked up with a zero TTL is not there.
        let shown = cached(ttl);
        let local = shown
            .iter()
            .find(|n| &*n.host == "localhost")
            .expect("localhost is listed");
        assert!(local.ttl_left > 50 && local.ttl_left <= 60, "{local:?}");
        assert!(local.addrs.iter().all(|a| a.port() == 6001), "{local:?}");
        let failed = shown
            .iter()
            .find(|n| &*n.host == "nowhere.invalid")
            .expect("the failure is listed");
        assert!(failed.addrs.is_empty());
        assert!(
            shown
                .iter()
                .all(|n| n.addrs.iter().all(|a| a.port() != 6002))
        );
        assert!(cached(none).iter().all(|n| n.ttl_left == 0));
    }
}
