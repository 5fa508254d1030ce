//! Writing pgbouncer.ini files for a test: one builder with sensible test
//! defaults (loopback only, no unix socket unless asked, trust auth) that a
//! test overrides key by key, plus the auth file next to it.

use sluice_testkit::Cluster;

use crate::process::SluiceProcess;

/// Token replaced by the listen port when the ini is written.
pub(crate) const PORT_TOKEN: &str = "@PORT@";
/// Token replaced by the process's scratch directory when the ini is written.
pub(crate) const DIR_TOKEN: &str = "@DIR@";

/// A pgbouncer.ini under construction. `[pgbouncer]` keys set later replace
/// earlier ones; the listen port and scratch directory are filled in by
/// [`SluiceProcess`].
#[derive(Clone, Debug)]
pub struct ConfigBuilder {
    databases: Vec<(String, String)>,
    users: Vec<(String, String)>,
    pgbouncer: Vec<(String, String)>,
    sluice: Vec<(String, String)>,
    auth_file: Option<String>,
}

impl Default for ConfigBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl ConfigBuilder {
    /// No databases; listens on 127.0.0.1 only, no unix socket, trust auth,
    /// session pooling, and two workers accepting from the start, so that
    /// every test crosses threads (sluice's default wakes the second worker
    /// only under load).
    pub fn new() -> Self {
        let mut builder = ConfigBuilder {
            databases: Vec::new(),
            users: Vec::new(),
            pgbouncer: Vec::new(),
            sluice: Vec::new(),
            auth_file: None,
        };
        builder = builder
            .set("listen_addr", "127.0.0.1")
            .set("listen_port", PORT_TOKEN)
            .set("unix_socket_dir", "")
            .set("auth_type", "trust")
            .set("pool_mode", "session")
            .sluice("workers", "2")
            .sluice("worker_busy_percent", "0");
        builder
    }

    /// [`ConfigBuilder::new`] plus a `postgres` database pointing at the
    /// cluster's `postgres` database.
    pub fn for_cluster(cluster: &Cluster) -> Self {
        Self::new().database_on(cluster, "postgres", "")
    }

    /// Adds `name = host=.. port=.. dbname=name <extra>` for `cluster`.
    pub fn database_on(self, cluster: &Cluster, name: &str, extra: &str) -> Self {
        let entry = format!(
            "host={} port={} dbname={name} {extra}",
            cluster.host(),
            cluster.port()
        );
        self.database(name, entry.trim_end())
    }

    /// Adds a raw `[databases]` line `name = entry`.
    pub fn database(mut self, name: &str, entry: &str) -> Self {
        self.databases.push((name.to_owned(), entry.to_owned()));
        self
    }

    /// Adds a raw `[users]` line `name = entry`.
    pub fn user(mut self, name: &str, entry: &str) -> Self {
        self.users.push((name.to_owned(), entry.to_owned()));
        self
    }

    /// Sets a `[pgbouncer]` key, replacing an earlier value.
    pub fn set(mut self, key: &str, value: &str) -> Self {
        self.pgbouncer.retain(|(k, _)| k != key);
        self.pgbouncer.push((key.to_owned(), value.to_owned()));
        self
    }

    /// Sets a `[sluice]` key.
    pub fn sluice(mut self, key: &str, value: &str) -> Self {
        self.sluice.retain(|(k, _)| k != key);
        self.sluice.push((key.to_owned(), value.to_owned()));
        self
    }

    /// Uses `text` as the auth file (written as `userlist.txt` next to the
    /// ini) and points `auth_file` at it.
    pub fn auth_file(mut self, text: &str) -> Self {
        self.auth_file = Some(text.to_owned());
        self.set("auth_file", &format!("{DIR_TOKEN}/userlist.txt"))
    }

    /// An auth file with plain-text passwords.
    pub fn userlist(self, entries: &[(&str, &str)]) -> Self {
        let text: String = entries
            .iter()
            .map(|(user, password)| format!("\"{user}\" \"{password}\"\n"))
            .collect();
        self.auth_file(&text)
    }

    /// The ini text, still holding the port and directory tokens.
    pub fn render(&self) -> String {
        let mut out = String::from("[databases]\n");
        for (name, entry) in &self.databases {
            out.push_str(&format!("{name} = {entry}\n"));
        }
        if !self.users.is_empty() {
            out.push_str("\n[users]\n");
            for (name, entry) in &self.users {
                out.push_str(&format!("{name} = {entry}\n"));
            }
        }
        out.push_str("\n[pgbouncer]\n");
        for (key, value) in &self.pgbouncer {
            out.push_str(&format!("{key} = {value}\n"));
        }
        if !self.sluice.is_empty() {
            out.push_str("\n[sluice]\n");
            for (key, value) in &self.sluice {
                out.push_str(&format!("{key} = {value}\n"));
            }
        }
        out
    }

    /// The auth file contents, if any.
    pub fn auth_file_text(&self) -> Option<&str> {
        self.auth_file.as_deref()
    }

    /// Starts sluice with this configuration (panics with the log if it
    /// does not come up).
    pub fn start(&self) -> SluiceProcess {
        SluiceProcess::start_with(&self.render(), self.auth_file_text())
    }
}
