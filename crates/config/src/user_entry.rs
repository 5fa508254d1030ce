//! One `[users]` entry: per-user overrides of pool and timeout settings,
//! read from its connection-string-style value.

use std::time::Duration;

use crate::choices::PoolMode;
use crate::codecs::{Choice, Codec, parse_count};
use crate::connstring::ConnParam;
use crate::entry_source::{EntrySource, ParamProblem};
use crate::error::ConfigError;
use crate::time_text::{parse_optional_seconds, parse_seconds};

/// A `[users]` entry. `None` means "not set here": the database's or the
/// global setting applies.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct UserEntry {
    pub name: String,
    pub pool_mode: Option<PoolMode>,
    pub pool_size: Option<u32>,
    pub reserve_pool_size: Option<u32>,
    pub max_user_connections: Option<u32>,
    pub max_user_client_connections: Option<u32>,
    pub query_timeout: Option<Duration>,
    /// `-1` in the file means unset.
    pub query_wait_timeout: Option<Duration>,
    pub idle_transaction_timeout: Option<Duration>,
    pub transaction_timeout: Option<Duration>,
    pub client_idle_timeout: Option<Duration>,
    /// Line of the entry in the file that defined it.
    pub line: usize,
}

/// The parameters a `[users]` entry may use, with a description for the
/// docs. The reader accepts exactly these.
pub(crate) const USER_PARAMETERS: &[(&str, &str)] = &[
    ("pool_mode", "Pool mode for all of this user's connections."),
    (
        "pool_size",
        "Pool size for this user's pools; overrides the database's and default_pool_size.",
    ),
    (
        "reserve_pool_size",
        "Reserve pool size for this user's pools.",
    ),
    ("max_user_connections", "Overrides max_user_connections."),
    (
        "max_user_client_connections",
        "Overrides max_user_client_connections.",
    ),
    ("query_timeout", "Overrides query_timeout. (seconds)"),
    (
        "query_wait_timeout",
        "Overrides query_wait_timeout; -1 means not set. (seconds)",
    ),
    (
        "idle_transaction_timeout",
        "Overrides idle_transaction_timeout. (seconds)",
    ),
    (
        "transaction_timeout",
        "Overrides transaction_timeout. (seconds)",
    ),
    (
        "client_idle_timeout",
        "Overrides client_idle_timeout. (seconds)",
    ),
];

impl UserEntry {
    /// Builds the entry `source.name = settings`.
    pub(crate) fn from_connstring(
        source: &EntrySource<'_>,
        settings: &str,
    ) -> Result<UserEntry, ConfigError> {
        let mut user = UserEntry {
            name: source.name.to_string(),
            line: source.line,
            ..UserEntry::default()
        };
        source.apply_params(settings, |param| user.apply(param))?;
        Ok(user)
    }

    fn apply(&mut self, param: &ConnParam) -> Result<(), ParamProblem> {
        let text = param.value.as_str();
        match param.key.as_str() {
            "pool_mode" => self.pool_mode = Some(Choice::<PoolMode>::parse(text)?),
            "pool_size" => self.pool_size = Some(parse_count(text)?),
            "reserve_pool_size" => self.reserve_pool_size = Some(parse_count(text)?),
            "max_user_connections" => self.max_user_connections = Some(parse_count(text)?),
            "max_user_client_connections" => {
                self.max_user_client_connections = Some(parse_count(text)?);
            }
            "query_timeout" => self.query_timeout = Some(parse_seconds(text)?),
            "query_wait_timeout" => self.query_wait_timeout = parse_optional_seconds(text)?,
            "idle_transaction_timeout" => {
                self.idle_transaction_timeout = Some(parse_seconds(text)?);
            }
            "transaction_timeout" => self.transaction_timeout = Some(parse_seconds(text)?),
            "client_idle_timeout" => self.client_idle_timeout = Some(parse_seconds(text)?),
            _ => return Err(ParamProblem::Unknown),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn every_documented_parameter_is_accepted() {
        let source = EntrySource {
            kind: "user",
            file: Path::new("test.ini"),
            line: 1,
            name: "alice",
        };
        for (name, _) in USER_PARAMETERS {
            let value = if *name == "pool_mode" {
                "statement"
            } else {
                "3"
            };
            UserEntry::from_connstring(&source, &format!("{name}={value}")).unwrap();
        }
    }
}
