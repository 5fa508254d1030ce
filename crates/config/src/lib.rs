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
mod key_info;
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
    AuthType, IoBackend, LoadBalanceHosts, PoolMode, ReadYourWrites, RuntimeKind, SessionObjects,
    UnknownChoice,
};
pub use config::Config;
pub use database::{Database, HostPort};
pub use error::{ConfigError, MAX_INCLUDE_DEPTH, Warning};
pub use key_info::KeyInfo;
pub use key_reference::{key_info, known_keys};
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
    let mut config = parse_str(&text, path)?;
    if config.settings.web_console {
        add_managed(&mut config)?;
    }
    Ok(config)
}

/// The `key=value` pairs of a connection string (keys lower-cased), as the
/// `[databases]` reader splits it.
pub fn connstring_pairs(text: &str) -> Result<Vec<(String, String)>, String> {
    connstring::parse_connstring(text).map(|ps| ps.into_iter().map(|p| (p.key, p.value)).collect())
}

/// Splits one `key = value` line of an ini file as the reader does (a
/// double-quoted key is unquoted).
pub fn ini_key_value(line: &str) -> Result<(String, String), String> {
    ini_reader::split_key_value(line)
}

/// `name` as an ini key the reader reads back as `name`: double-quoted
/// (a quote inside doubled) unless it is plain.
pub fn ini_key(name: &str) -> String {
    let plain = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b'*'));
    if plain {
        name.to_owned()
    } else {
        format!("\"{}\"", name.replace('"', "\"\""))
    }
}

/// Writes pairs back as a connection string, quoting values that need it.
pub fn connstring_text(pairs: &[(String, String)]) -> String {
    pairs
        .iter()
        .map(|(k, v)| {
            if !v.is_empty()
                && !v
                    .chars()
                    .any(|c| c.is_whitespace() || c == '\'' || c == '\\')
            {
                format!("{k}={v}")
            } else {
                format!("{k}='{}'", v.replace('\\', "\\\\").replace('\'', "\\'"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Adds the web console's databases (its file's `[databases]` section; a
/// name the main configuration has is a warning and stays the main one's).
fn add_managed(config: &mut Config) -> Result<(), ConfigError> {
    let path = config.web_console_path();
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(source) => return Err(ConfigError::Read { file: path, source }),
    };
    let managed = parse_str(&text, &path)?;
    for database in managed.databases {
        if config.database(&database.name).is_some() {
            config.warnings.push(Warning {
                file: path.clone(),
                line: database.line,
                message: format!(
                    "database {:?} is in the main configuration too; the web console's entry \
                     is ignored",
                    database.name
                ),
            });
            continue;
        }
        config.managed.push(database.name.clone());
        config.databases.push(database);
    }
    Ok(())
}

/// Reads configuration `text` as if it were the contents of `origin`:
/// `origin` names the file in messages, anchors relative `%include` and
/// auth file paths, and becomes the `conffile` setting. Included files are
/// read from disk.
pub fn parse_str(text: &str, origin: &Path) -> Result<Config, ConfigError> {
    let items = ini_reader::read_ini(text, origin)?;
    assemble::assemble(items, origin)
}

#[cfg(test)]
mod connstring_round_trip {
    use super::*;

    #[test]
    fn pairs_survive_writing_back() {
        let text = "host=/tmp port=5432 password='a b\\'c' dbname=x";
        let pairs = connstring_pairs(text).unwrap();
        let again = connstring_pairs(&connstring_text(&pairs)).unwrap();
        assert_eq!(pairs, again);
        assert_eq!(pairs[2].1, "a b'c");
    }

    #[test]
    fn ini_keys_survive_writing_back() {
        for name in [
            "plain_db",
            "my db",
            "a=b",
            "say \"hi\"",
            "\"",
            ";x",
            "[y]",
            "*",
        ] {
            let line = format!("{} = host=/tmp", ini_key(name));
            assert_eq!(ini_key_value(&line).unwrap().0, name, "{line}");
        }
    }
}
