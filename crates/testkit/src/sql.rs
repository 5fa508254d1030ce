//! Quoting names and strings for the SQL and config lines the testkit writes,
//! so user names, passwords and paths with quotes cannot break them.

use crate::error::TestkitError;

/// `name` as a double-quoted SQL identifier.
pub(crate) fn ident(name: &str) -> Result<String, TestkitError> {
    reject_nul(name)?;
    Ok(format!("\"{}\"", name.replace('"', "\"\"")))
}

/// `value` as a single-quoted SQL string literal (standard_conforming_strings).
pub(crate) fn literal(value: &str) -> Result<String, TestkitError> {
    reject_nul(value)?;
    Ok(format!("'{}'", value.replace('\'', "''")))
}

fn reject_nul(text: &str) -> Result<(), TestkitError> {
    if text.contains('\0') {
        Err(TestkitError::InvalidArgument(format!(
            "{text:?} contains a NUL byte"
        )))
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_are_doubled() {
        assert_eq!(ident("a\"b").unwrap(), "\"a\"\"b\"");
        assert_eq!(literal("it's").unwrap(), "'it''s'");
        assert!(literal("a\0b").is_err());
    }
}
