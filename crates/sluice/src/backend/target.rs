//! Where and as whom a pool's server connections log in: resolved once from
//! a `[databases]` entry, the `[users]` section and the auth_file.

use std::time::Duration;

use crate::auth::scram::ScramKeys;

/// A PostgreSQL server address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerAddr {
    Tcp {
        host: String,
        port: u16,
    },
    /// Path of the socket file, e.g. /var/run/postgresql/.s.PGSQL.5432.
    Unix(String),
}

impl std::fmt::Display for ServerAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Tcp { host, port } => write!(f, "{host}:{port}"),
            Self::Unix(p) => f.write_str(p),
        }
    }
}

impl ServerAddr {
    /// From a config host (name, address, or socket directory) and port.
    pub fn new(host: Option<&str>, port: u16) -> Self {
        match host {
            Some(h) if h.starts_with('/') => Self::Unix(format!("{h}/.s.PGSQL.{port}")),
            Some(h) if !h.is_empty() => Self::Tcp {
                host: h.to_owned(),
                port,
            },
            _ => Self::Unix(format!("/var/run/postgresql/.s.PGSQL.{port}")),
        }
    }
}

/// What sluice proves itself with when logging in as the server user.
#[derive(Debug, Clone, Default)]
pub struct ServerCredential {
    pub password: Option<String>,
    /// md5(password || user) in hex, from an md5 auth_file entry.
    pub md5_hash: Option<String>,
    /// Learnt from a client's SCRAM login when the auth_file holds a SCRAM
    /// secret.
    pub scram_keys: Option<ScramKeys>,
}

impl ServerCredential {
    /// Keeps what `old` learnt from clients' logins (SCRAM keys, an md5
    /// hash from auth_query) where this credential, made from the
    /// configuration, has nothing of its own.
    pub fn keep_learned(&mut self, old: &ServerCredential) {
        if self.scram_keys.is_none() {
            self.scram_keys = old.scram_keys.clone();
        }
        if self.password.is_none() && self.md5_hash.is_none() {
            self.md5_hash = old.md5_hash.clone();
        }
    }
}

/// Everything needed to open one server connection.
#[derive(Debug, Clone)]
pub struct ServerTarget {
    pub addr: ServerAddr,
    pub dbname: String,
    pub user: String,
    /// Startup parameters from the database entry (client_encoding,
    /// datestyle, timezone, application_name).
    pub startup_params: Vec<(String, String)>,
    pub connect_query: Option<String>,
    pub connect_timeout: Duration,
    pub keepalive: crate::net::Keepalive,
    /// How long host name lookups are kept (`dns_max_ttl`,
    /// `dns_nxdomain_ttl`).
    pub dns: super::dns::DnsTtl,
    /// TLS as `server_tls_*` said when the target was made.
    pub tls: std::sync::Arc<crate::tls::ServerTls>,
    /// A host list without read routing (PgBouncer 1.25's `host=a,b`):
    /// every address, `addr` being the first. Empty for a single host.
    pub alternates: Alternates,
}

/// The hosts of a list that does not route reads, and how a new server
/// connection picks one (`load_balance_hosts`): `round-robin` (PgBouncer's
/// default) starts each connection at the next host, `disable` always at
/// the first; either way a host that fails is skipped for the next.
#[derive(Debug, Clone, Default)]
pub struct Alternates {
    pub addrs: std::sync::Arc<[ServerAddr]>,
    pub round_robin: bool,
    next: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

/// Cancel links of a server on host `i` of such a list (`i` > 0) carry
/// `ALTERNATE | i` as their host (see `cancel.rs`).
pub const ALTERNATE: u32 = 1 << 31;

impl PartialEq for Alternates {
    fn eq(&self, other: &Self) -> bool {
        self.addrs == other.addrs && self.round_robin == other.round_robin
    }
}

impl Alternates {
    pub fn new(addrs: Vec<ServerAddr>, round_robin: bool) -> Self {
        Self {
            addrs: if addrs.len() > 1 {
                addrs.into()
            } else {
                std::sync::Arc::from([])
            },
            round_robin,
            next: Default::default(),
        }
    }

    /// The order in which a new connection tries the hosts (indices).
    pub fn order(&self) -> impl Iterator<Item = usize> + use<> {
        let n = self.addrs.len().max(1);
        let start = if self.round_robin {
            self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % n
        } else {
            0
        };
        (0..n).map(move |i| (start + i) % n)
    }
}
