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
}
