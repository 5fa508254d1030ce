//! The server configuration the testkit writes: fast-and-unsafe durability
//! settings, logging to a file, replication enabled, caller extras, and the
//! pg_hba.conf that applies the chosen authentication method to TCP clients.

use std::path::Path;

use crate::error::TestkitError;
use crate::sql::literal;
use crate::temp_dir::write_owned;

/// Name of the file (inside the data directory) holding our settings; it is
/// included from the end of postgresql.conf so its lines win.
pub(crate) const CONF_FILE: &str = "sluice.conf";

/// Name of the server log (inside the data directory).
pub(crate) const LOG_FILE: &str = "postgresql.log";

/// Authentication method required of TCP clients (unix-socket clients are
/// always trusted).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServerAuth {
    Trust,
    Password,
    Md5,
    ScramSha256,
}

impl ServerAuth {
    /// The pg_hba.conf method name.
    pub fn hba_method(self) -> &'static str {
        match self {
            ServerAuth::Trust => "trust",
            ServerAuth::Password => "password",
            ServerAuth::Md5 => "md5",
            ServerAuth::ScramSha256 => "scram-sha-256",
        }
    }

    /// How passwords are stored: md5 for `Md5` (otherwise the server would
    /// silently upgrade the exchange to SCRAM), scram-sha-256 otherwise.
    pub fn password_encryption(self) -> &'static str {
        match self {
            ServerAuth::Md5 => "md5",
            _ => "scram-sha-256",
        }
    }

    /// Parses the pg_hba.conf method name (as used on the command line).
    pub fn from_hba_method(name: &str) -> Option<ServerAuth> {
        [
            ServerAuth::Trust,
            ServerAuth::Password,
            ServerAuth::Md5,
            ServerAuth::ScramSha256,
        ]
        .into_iter()
        .find(|auth| auth.hba_method() == name)
    }
}

/// The server certificate and key in the data directory, when TLS is on.
const TLS_CERT_FILE: &str = "server.crt";
const TLS_KEY_FILE: &str = "server.key";

/// Settings shared by a primary and the replicas made from it.
#[derive(Clone, Debug)]
pub(crate) struct ServerConf {
    pub(crate) max_connections: u32,
    pub(crate) superuser_reserved_connections: u32,
    pub(crate) auth: ServerAuth,
    pub(crate) extra: Vec<(String, String)>,
    /// Certificate and key (PEM text) to serve TLS with (`ssl = on`).
    pub(crate) tls: Option<(String, String)>,
    /// TCP clients must use TLS (`hostssl` lines instead of `host`).
    pub(crate) tls_only: bool,
}

impl Default for ServerConf {
    fn default() -> Self {
        ServerConf {
            max_connections: 100,
            superuser_reserved_connections: 3,
            auth: ServerAuth::Trust,
            extra: Vec::new(),
            tls: None,
            tls_only: false,
        }
    }
}

impl ServerConf {
    /// Contents of [`CONF_FILE`] for a server on `port` with its socket in `socket_dir`.
    pub(crate) fn render(&self, port: u16, socket_dir: &Path) -> Result<String, TestkitError> {
        let mut lines = vec![
            "# Written by sluice-testkit; regenerated on every start.".to_owned(),
            "fsync = off".to_owned(),
            "synchronous_commit = off".to_owned(),
            "full_page_writes = off".to_owned(),
            "shared_buffers = '32MB'".to_owned(),
            "listen_addresses = '127.0.0.1'".to_owned(),
            format!("max_connections = {}", self.max_connections),
            format!(
                "superuser_reserved_connections = {}",
                self.superuser_reserved_connections
            ),
            format!(
                "password_encryption = '{}'",
                self.auth.password_encryption()
            ),
            "wal_level = replica".to_owned(),
            "max_wal_senders = 5".to_owned(),
            "wal_keep_size = '64MB'".to_owned(),
            "hot_standby = on".to_owned(),
            "log_destination = 'stderr'".to_owned(),
            "logging_collector = off".to_owned(),
            "log_min_messages = warning".to_owned(),
        ];
        if self.tls.is_some() {
            lines.push("ssl = on".to_owned());
            lines.push(format!("ssl_cert_file = '{TLS_CERT_FILE}'"));
            lines.push(format!("ssl_key_file = '{TLS_KEY_FILE}'"));
        }
        for (key, value) in &self.extra {
            lines.push(format!("{key} = {}", conf_value(value)?));
        }
        let socket_dir = socket_dir.to_str().ok_or_else(|| {
            TestkitError::InvalidArgument(format!("{} is not UTF-8", socket_dir.display()))
        })?;
        lines.push(format!(
            "unix_socket_directories = {}",
            literal(socket_dir)?
        ));
        lines.push(format!("port = {port}"));
        lines.push(String::new());
        Ok(lines.join("\n"))
    }

    /// Contents of pg_hba.conf.
    pub(crate) fn render_hba(&self) -> String {
        let method = self.auth.hba_method();
        let host = if self.tls_only { "hostssl" } else { "host   " };
        format!(
            "# Written by sluice-testkit.\n\
             local all         all              trust\n\
             local replication all              trust\n\
             {host}  all         all 127.0.0.1/32 {method}\n\
             {host}  all         all ::1/128      {method}\n\
             host  replication all 127.0.0.1/32 {method}\n\
             host  replication all ::1/128      {method}\n"
        )
    }

    /// Writes [`CONF_FILE`] (port and socket included) into `data_dir`.
    pub(crate) fn write(
        &self,
        data_dir: &Path,
        port: u16,
        socket_dir: &Path,
    ) -> Result<(), TestkitError> {
        write_owned(&data_dir.join(CONF_FILE), &self.render(port, socket_dir)?)
    }

    /// After initdb: hooks [`CONF_FILE`] into postgresql.conf and replaces pg_hba.conf.
    pub(crate) fn install(&self, data_dir: &Path) -> Result<(), TestkitError> {
        let main_conf = data_dir.join("postgresql.conf");
        let mut text = std::fs::read_to_string(&main_conf)
            .map_err(|e| TestkitError::io(format!("reading {}", main_conf.display()), e))?;
        text.push_str(&format!("\ninclude '{CONF_FILE}'\n"));
        write_owned(&main_conf, &text)?;
        if let Some((cert, key)) = &self.tls {
            write_owned(&data_dir.join(TLS_CERT_FILE), cert)?;
            let key_path = data_dir.join(TLS_KEY_FILE);
            write_owned(&key_path, key)?;
            // PostgreSQL refuses a key others can read.
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&key_path, std::fs::Permissions::from_mode(0o600))
                .map_err(|e| TestkitError::io(format!("chmod {}", key_path.display()), e))?;
        }
        write_owned(&data_dir.join("pg_hba.conf"), &self.render_hba())
    }
}

/// A value for postgresql.conf: quoted unless the caller already quoted it.
fn conf_value(value: &str) -> Result<String, TestkitError> {
    if value.len() >= 2 && value.starts_with('\'') && value.ends_with('\'') {
        Ok(value.to_owned())
    } else if value.contains('\n') {
        Err(TestkitError::InvalidArgument(format!(
            "setting value {value:?} contains a newline"
        )))
    } else {
        literal(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extras_come_after_defaults_and_before_port() {
        let conf = ServerConf {
            extra: vec![
                ("work_mem".into(), "8MB".into()),
                ("x.y".into(), "'q'".into()),
            ],
            ..ServerConf::default()
        };
        let text = conf.render(5555, Path::new("/tmp/a'b")).unwrap();
        let work_mem = text.find("work_mem = '8MB'").unwrap();
        assert!(text.find("shared_buffers").unwrap() < work_mem);
        assert!(text.contains("x.y = 'q'\n"));
        assert!(text.contains("unix_socket_directories = '/tmp/a''b'"));
        assert!(text.trim_end().ends_with("port = 5555"));
    }

    #[test]
    fn auth_names_round_trip() {
        for auth in [
            ServerAuth::Trust,
            ServerAuth::Password,
            ServerAuth::Md5,
            ServerAuth::ScramSha256,
        ] {
            assert_eq!(ServerAuth::from_hba_method(auth.hba_method()), Some(auth));
        }
        assert!(
            ServerConf::default()
                .render_hba()
                .contains("127.0.0.1/32 trust")
        );
    }
}
