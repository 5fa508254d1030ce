//! The whole configuration as read from pgbouncer.ini: databases, users,
//! settings, and the warnings worth logging.

use crate::database::Database;
use crate::error::Warning;
use crate::settings::Settings;
use crate::user_entry::UserEntry;

/// A fully read configuration.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Config {
    /// `[databases]` entries in file order, without the `*` entry. A name
    /// defined twice keeps its first position and its last definition.
    pub databases: Vec<Database>,
    /// The `*` entry: the template for databases not listed by name.
    pub fallback_database: Option<Database>,
    /// `[users]` entries in file order (same rule for repeated names).
    pub users: Vec<UserEntry>,
    /// `[peers]` entries in file order (same rule for repeated ids).
    pub peers: Vec<crate::peer_entry::PeerEntry>,
    /// Databases read from the web console's file (`web_console_file`),
    /// which it may change; they are in `databases` too.
    pub managed: Vec<String>,
    /// `[pgbouncer]` and `[sluice]` settings.
    pub settings: Settings,
    /// Unknown keys and other oddities, for the daemon to log.
    pub warnings: Vec<Warning>,
}

impl Config {
    /// The web console's file for a configuration read from `conffile`.
    pub fn web_console_path(&self) -> std::path::PathBuf {
        let own = &self.settings.web_console_file;
        let base = std::path::Path::new(&self.settings.conffile)
            .parent()
            .map(std::path::Path::to_path_buf)
            .unwrap_or_default();
        if own.is_empty() {
            base.join("sluice-web.ini")
        } else {
            base.join(own)
        }
    }

    /// The `[databases]` entry named exactly `name`. The `*` fallback is not
    /// consulted; see `fallback_database`.
    pub fn database(&self, name: &str) -> Option<&Database> {
        self.databases.iter().find(|database| database.name == name)
    }

    /// The `[users]` entry named exactly `name`.
    pub fn user(&self, name: &str) -> Option<&UserEntry> {
        self.users.iter().find(|user| user.name == name)
    }
}
