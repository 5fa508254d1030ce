//! Shared handling for `[databases]` and `[users]` entries: both are a name
//! and a connection string of parameters, and both report problems the
//! same way, naming the file, line, entry and parameter.

use std::path::Path;

use crate::connstring::{ConnParam, parse_connstring};
use crate::error::ConfigError;

/// Where an entry came from, for error messages.
pub(crate) struct EntrySource<'a> {
    /// `"database"` or `"user"`.
    pub kind: &'static str,
    pub file: &'a Path,
    pub line: usize,
    pub name: &'a str,
}

/// Why one parameter could not be applied.
pub(crate) enum ParamProblem {
    /// The parameter name is not allowed for this kind of entry.
    Unknown,
    /// The value is unusable, for this reason.
    Invalid(String),
}

impl From<String> for ParamProblem {
    fn from(reason: String) -> Self {
        ParamProblem::Invalid(reason)
    }
}

impl EntrySource<'_> {
    /// `database "app"`, `user "alice"`.
    fn describe(&self) -> String {
        format!("{} {:?}", self.kind, self.name)
    }

    /// Splits `connstring` and hands each parameter to `apply`, turning the
    /// first problem into a `ConfigError` that names this entry.
    pub(crate) fn apply_params(
        &self,
        connstring: &str,
        mut apply: impl FnMut(&ConnParam) -> Result<(), ParamProblem>,
    ) -> Result<(), ConfigError> {
        let params = parse_connstring(connstring).map_err(|reason| ConfigError::Syntax {
            file: self.file.to_path_buf(),
            line: self.line,
            reason: format!("in the settings of {}: {reason}", self.describe()),
        })?;
        for param in &params {
            match apply(param) {
                Ok(()) => {}
                Err(ParamProblem::Unknown) => {
                    return Err(ConfigError::UnknownParameter {
                        file: self.file.to_path_buf(),
                        line: self.line,
                        entry: self.describe(),
                        parameter: param.key.clone(),
                    });
                }
                Err(ParamProblem::Invalid(reason)) => {
                    return Err(ConfigError::InvalidParameter {
                        file: self.file.to_path_buf(),
                        line: self.line,
                        entry: self.describe(),
                        parameter: param.key.clone(),
                        value: param.value.clone(),
                        reason,
                    });
                }
            }
        }
        Ok(())
    }
}
