//! Turns the ini layer's lines into a `Config`: each `[databases]`,
//! `[users]`, `[pgbouncer]` and `[sluice]` line goes to its parser, unknown
//! keys and sections become warnings, and relative auth file paths are
//! resolved against the directory of the file that named them.

use std::path::{Path, PathBuf};

use crate::config::Config;
use crate::database::Database;
use crate::entry_source::EntrySource;
use crate::error::{ConfigError, Warning};
use crate::ini_reader::IniItem;
use crate::key_reference::{field_name, key_info};
use crate::user_entry::UserEntry;

/// Sections whose lines are ignored without a warning.
const IGNORED_SECTIONS: &[&str] = &[];
/// Sections this crate reads.
const READ_SECTIONS: &[&str] = &["databases", "users", "peers", "pgbouncer", "sluice"];
/// The database name clients use for the admin console.
const ADMIN_DATABASE: &str = "pgbouncer";

/// Builds the configuration from `items`; `origin` becomes `conffile`.
pub(crate) fn assemble(items: Vec<IniItem>, origin: &Path) -> Result<Config, ConfigError> {
    let mut config = Config::default();
    config.settings.conffile = origin.display().to_string();
    for item in items {
        match item {
            IniItem::Section { name, file, line } => {
                let known = READ_SECTIONS.contains(&name.as_str())
                    || IGNORED_SECTIONS.contains(&name.as_str());
                if !known {
                    config.warnings.push(Warning {
                        file,
                        line,
                        message: format!("unknown section [{name}]; its lines are ignored"),
                    });
                }
            }
            IniItem::Entry {
                section,
                key,
                value,
                file,
                line,
            } => {
                let at = Location { file, line };
                match section.as_deref() {
                    Some("databases") => add_database(&mut config, &at, &key, &value)?,
                    Some("users") => add_user(&mut config, &at, &key, &value)?,
                    Some("peers") => add_peer(&mut config, &at, &key, &value)?,
                    Some(section @ ("pgbouncer" | "sluice")) => {
                        apply_setting(&mut config, &at, section, &key, &value)?;
                    }
                    Some(_) => {}
                    None => config
                        .warnings
                        .push(at.warning(format!("{key:?} appears before any [section]; ignored"))),
                }
            }
        }
    }
    Ok(config)
}

/// Where a line is.
struct Location {
    file: PathBuf,
    line: usize,
}

impl Location {
    fn warning(&self, message: String) -> Warning {
        Warning {
            file: self.file.clone(),
            line: self.line,
            message,
        }
    }

    fn entry<'a>(&'a self, kind: &'static str, name: &'a str) -> EntrySource<'a> {
        EntrySource {
            kind,
            file: &self.file,
            line: self.line,
            name,
        }
    }
}

fn add_database(
    config: &mut Config,
    at: &Location,
    name: &str,
    connstring: &str,
) -> Result<(), ConfigError> {
    if name == ADMIN_DATABASE {
        return Err(ConfigError::ReservedDatabaseName {
            file: at.file.clone(),
            line: at.line,
            name: name.to_string(),
        });
    }
    let database = Database::from_connstring(&at.entry("database", name), connstring)?;
    if name == "*" {
        if let Some(earlier) = &config.fallback_database {
            let message = redefined_message("fallback database \"*\"", earlier.line);
            config.warnings.push(at.warning(message));
        }
        config.fallback_database = Some(database);
        return Ok(());
    }
    match config.databases.iter_mut().find(|known| known.name == name) {
        Some(earlier) => {
            let message = redefined_message(&format!("database {name:?}"), earlier.line);
            config.warnings.push(at.warning(message));
            *earlier = database;
        }
        None => config.databases.push(database),
    }
    Ok(())
}

fn add_peer(
    config: &mut Config,
    at: &Location,
    id: &str,
    settings: &str,
) -> Result<(), ConfigError> {
    let peer = crate::peer_entry::PeerEntry::from_connstring(&at.entry("peer", id), settings)?;
    match config.peers.iter_mut().find(|known| known.id == peer.id) {
        Some(earlier) => {
            let message = redefined_message(&format!("peer {}", peer.id), earlier.line);
            config.warnings.push(at.warning(message));
            *earlier = peer;
        }
        None => config.peers.push(peer),
    }
    Ok(())
}

fn add_user(
    config: &mut Config,
    at: &Location,
    name: &str,
    settings: &str,
) -> Result<(), ConfigError> {
    let user = UserEntry::from_connstring(&at.entry("user", name), settings)?;
    match config.users.iter_mut().find(|known| known.name == name) {
        Some(earlier) => {
            let message = redefined_message(&format!("user {name:?}"), earlier.line);
            config.warnings.push(at.warning(message));
            *earlier = user;
        }
        None => config.users.push(user),
    }
    Ok(())
}

fn redefined_message(what: &str, earlier_line: usize) -> String {
    format!("{what} is defined again (earlier at line {earlier_line}); this definition wins")
}

fn apply_setting(
    config: &mut Config,
    at: &Location,
    section: &str,
    key: &str,
    value: &str,
) -> Result<(), ConfigError> {
    let Some(info) = key_info(key) else {
        let message = format!("unknown key {key:?} in [{section}]; ignored");
        config.warnings.push(at.warning(message));
        return Ok(());
    };
    if info.section != section {
        let message = format!(
            "{} belongs in [{}], not [{section}]; accepted anyway",
            info.key, info.section
        );
        config.warnings.push(at.warning(message));
    }
    let field = field_name(info.key);
    match config.settings.apply_field(&field, value) {
        Some(Ok(())) => {}
        Some(Err(reason)) => {
            return Err(ConfigError::InvalidValue {
                file: at.file.clone(),
                line: at.line,
                key: info.key.to_string(),
                value: value.to_string(),
                reason,
            });
        }
        None => {
            let message = format!("key {key:?} has no setting behind it; ignored");
            config.warnings.push(at.warning(message));
        }
    }
    resolve_auth_paths(config, &field, &at.file);
    Ok(())
}

/// Makes a relative `auth_file`, `auth_hba_file` or `auth_ident_file`
/// relative to the directory of `file`, the file that set it.
fn resolve_auth_paths(config: &mut Config, field: &str, file: &Path) {
    let settings = &mut config.settings;
    let path = match field {
        "auth_file" => &mut settings.auth_file,
        "auth_hba_file" => &mut settings.auth_hba_file,
        "auth_ident_file" => &mut settings.auth_ident_file,
        _ => return,
    };
    if let (Some(relative), Some(dir)) = (path.as_mut(), file.parent())
        && relative.is_relative()
    {
        *relative = dir.join(&*relative);
    }
}
