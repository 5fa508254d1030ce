//! Reads PgBouncer's pgbouncer.ini (plus sluice's `[sluice]` section) into
//! typed settings, so sluice can replace PgBouncer without config changes.
//! `load` reads a file and its `%include`s; `parse_str` reads text.
//! `known_keys` and `reference_markdown` describe every key, for SHOW
//! CONFIG, RELOAD and docs/config.md.

// Errors carry the file, line, key, value and reason as separate fields so
// callers can report them precisely; they are built once per failed load,
// never on a hot path, so their size does not matter.
#![allow(clippy::result_large_err, reason = "config errors are rare and cold")]

mod assemble;
mod choices;
mod codecs;
mod config;
mod connstring;
mod database;
mod entry_source;
mod error;
mod ini_reader;
mod key_reference;
mod peer_entry;
mod reference_markdown;
mod settings;
mod settings_access;
mod settings_macro;
mod time_text;
mod user_entry;

use std::path::Path;

pub use choices::{
    AuthType, LoadBalanceHosts, PoolMode, ReadYourWrites, RuntimeKind, SessionObjects,
    UnknownChoice,
};
pub use config::Config;
pub use database::{Database, HostPort};
pub use error::{ConfigError, MAX_INCLUDE_DEPTH, Warning};
pub use key_reference::{KeyInfo, key_info, known_keys};
pub use peer_entry::{MAX_PEER_ID, PeerEntry};
pub use reference_markdown::reference_markdown;
pub use settings::{DEFAULT_AUTH_QUERY, Settings};
pub use user_entry::UserEntry;

/// Reads the configuration file at `path`, following `%include`s.
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        file: path.to_path_buf(),
        source,
    })?;
    parse_str(&text, path)
}

/// Reads configuration `text` as if it were the contents of `origin`:
/// `origin` names the file in messages, anchors relative `%include` and
/// auth file paths, and becomes the `conffile` setting. Included files are
/// read from disk.
pub fn parse_str(text: &str, origin: &Path) -> Result<Config, ConfigError> {
    let items = ini_reader::read_ini(text, origin)?;
    assemble::assemble(items, origin)
}
