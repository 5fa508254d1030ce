//! The one error type of the testkit, so callers can `?` every failure and
//! still see which command failed, what it printed and what the server logged.

use std::path::PathBuf;
use std::time::Duration;

/// Everything that can go wrong while finding, starting, using or stopping a
/// throwaway PostgreSQL cluster.
#[derive(Debug, thiserror::Error)]
pub enum TestkitError {
    /// No directory with PostgreSQL server binaries was found.
    #[error("no PostgreSQL binaries found (looked in: {looked_in})")]
    NoPostgres { looked_in: String },

    /// Running as root, but there is no `postgres` system user to run the server as.
    #[error(
        "running as root, but there is no `postgres` system user (PostgreSQL refuses to run as root)"
    )]
    NoPostgresUser,

    /// A file-system or process-spawning operation failed.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },

    /// A PostgreSQL tool ran but exited unsuccessfully.
    #[error("`{command}` failed ({status})\nstderr:\n{stderr}\nstdout:\n{stdout}")]
    CommandFailed {
        command: String,
        status: String,
        stderr: String,
        stdout: String,
    },

    /// The server did not come up; `log_tail` holds the end of its log.
    #[error("PostgreSQL did not start on port {port}: {cause}\n--- last lines of {} ---\n{log_tail}", log_file.display())]
    StartFailed {
        port: u16,
        cause: String,
        log_file: PathBuf,
        log_tail: String,
    },

    /// Something we waited for did not happen in time.
    #[error("timed out after {after:?} waiting for {what}")]
    Timeout { what: String, after: Duration },

    /// A caller-supplied value cannot be used (for example a name containing NUL).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}

impl TestkitError {
    /// Wraps an I/O error with a description of what was being attempted.
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        TestkitError::Io {
            context: context.into(),
            source,
        }
    }
}
