//! Describing a cluster before starting it: connection limits, the TCP
//! authentication method, extra roles, databases and settings.

use crate::cluster::Cluster;
use crate::error::TestkitError;
use crate::server_conf::{ServerAuth, ServerConf};
use crate::{primary, stale_dirs};

/// Collects options for [`Cluster::builder`]; [`ClusterBuilder::start`] creates the cluster.
#[derive(Clone, Debug, Default)]
pub struct ClusterBuilder {
    pub(crate) conf: ServerConf,
    pub(crate) users: Vec<(String, String)>,
    pub(crate) databases: Vec<String>,
}

impl ClusterBuilder {
    /// `max_connections` (default 100).
    pub fn max_connections(mut self, n: u32) -> Self {
        self.conf.max_connections = n;
        self
    }

    /// `superuser_reserved_connections` (default 3).
    pub fn superuser_reserved_connections(mut self, n: u32) -> Self {
        self.conf.superuser_reserved_connections = n;
        self
    }

    /// pg_hba method for TCP connections from 127.0.0.1 and ::1 (default
    /// trust); unix-socket connections are always trusted.
    pub fn auth(mut self, auth: ServerAuth) -> Self {
        self.conf.auth = auth;
        self
    }

    /// Adds a LOGIN, non-superuser role. Its password is stored as md5 when
    /// the auth method is `Md5`, as scram-sha-256 otherwise.
    pub fn user(mut self, name: &str, password: &str) -> Self {
        self.users.push((name.to_owned(), password.to_owned()));
        self
    }

    /// Adds a postgresql.conf line `key = 'value'` (a value already in single
    /// quotes is written as is). Later lines win over earlier ones and over
    /// the testkit's defaults, except `port` and `unix_socket_directories`.
    pub fn setting(mut self, key: &str, value: &str) -> Self {
        self.conf.extra.push((key.to_owned(), value.to_owned()));
        self
    }

    /// Serves TLS (`ssl = on`) with this certificate chain and key (PEM
    /// text), copied into the data directory.
    pub fn tls(mut self, cert_pem: &str, key_pem: &str) -> Self {
        self.conf.tls = Some((cert_pem.to_owned(), key_pem.to_owned()));
        self
    }

    /// TCP clients must use TLS (`hostssl` in pg_hba.conf).
    pub fn tls_only(mut self) -> Self {
        self.conf.tls_only = true;
        self
    }

    /// Adds a database owned by postgres.
    pub fn database(mut self, name: &str) -> Self {
        self.databases.push(name.to_owned());
        self
    }

    /// initdb, configure, start, then create roles and databases.
    pub fn start(self) -> Result<Cluster, TestkitError> {
        stale_dirs::sweep_once();
        let cluster = primary::create(self.conf.clone())?;
        primary::provision(&cluster, self.conf.auth, &self.users, &self.databases)?;
        Ok(cluster)
    }
}
