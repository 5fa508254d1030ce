//! Why a configuration was refused (`ConfigError`), and the non-fatal
//! remarks made while reading it (`Warning`). Every message about a file
//! starts with `file:line:` so it can be found, and names the key and the
//! reason.

use std::fmt;
use std::path::PathBuf;

/// Deepest allowed `%include` nesting.
pub const MAX_INCLUDE_DEPTH: usize = 10;

/// A configuration that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The top-level file could not be read.
    #[error("{}: cannot read configuration file: {source}", file.display())]
    Read {
        file: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A `%include`d file could not be read.
    #[error(
        "{}:{line}: cannot read included file {}: {source}",
        file.display(),
        included.display()
    )]
    IncludeRead {
        file: PathBuf,
        line: usize,
        included: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A `%include` names a file that is already being read.
    #[error(
        "{}:{line}: %include loop: {} is already being read",
        file.display(),
        included.display()
    )]
    IncludeLoop {
        file: PathBuf,
        line: usize,
        included: PathBuf,
    },

    /// `%include`s nested deeper than `MAX_INCLUDE_DEPTH`.
    #[error("{}:{line}: %include nested more than {MAX_INCLUDE_DEPTH} files deep", file.display())]
    IncludeTooDeep { file: PathBuf, line: usize },

    /// A line that is not a section header, comment, `%include` or
    /// `key = value`, or a malformed connection string.
    #[error("{}:{line}: syntax error: {reason}", file.display())]
    Syntax {
        file: PathBuf,
        line: usize,
        reason: String,
    },

    /// A `[pgbouncer]` or `[sluice]` key with an unusable value.
    #[error("{}:{line}: invalid value {value:?} for {key}: {reason}", file.display())]
    InvalidValue {
        file: PathBuf,
        line: usize,
        key: String,
        value: String,
        reason: String,
    },

    /// A parameter of a `[databases]` or `[users]` entry with an unusable
    /// value. `entry` says which, e.g. `database "app"` or `user "alice"`.
    #[error(
        "{}:{line}: invalid value {value:?} for {parameter} of {entry}: {reason}",
        file.display()
    )]
    InvalidParameter {
        file: PathBuf,
        line: usize,
        entry: String,
        parameter: String,
        value: String,
        reason: String,
    },

    /// A parameter PgBouncer does not know in a `[databases]` or `[users]`
    /// entry (PgBouncer refuses these too). `entry` is as above.
    #[error("{}:{line}: unknown parameter {parameter:?} for {entry}", file.display())]
    UnknownParameter {
        file: PathBuf,
        line: usize,
        entry: String,
        parameter: String,
    },

    /// `[databases]` may not define the admin console's name.
    #[error("{}:{line}: database name {name:?} is reserved for the admin console", file.display())]
    ReservedDatabaseName {
        file: PathBuf,
        line: usize,
        name: String,
    },

    /// `Settings::set` with a key that is not known.
    #[error("unknown configuration parameter {key:?}")]
    UnknownKey { key: String },

    /// `Settings::set` with a value that is not valid for the key.
    #[error("invalid value {value:?} for {key}: {reason}")]
    InvalidSetting {
        key: String,
        value: String,
        reason: String,
    },

    /// `Settings::set` on a key that only takes effect at startup.
    #[error("{key} cannot be changed while running; restart to change it")]
    NotChangeable { key: String },
}

/// Something odd but harmless in a configuration file, such as an unknown
/// key. The daemon logs these.
#[derive(Clone, Debug, PartialEq)]
pub struct Warning {
    pub file: PathBuf,
    pub line: usize,
    pub message: String,
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.file.display(), self.line, self.message)
    }
}
