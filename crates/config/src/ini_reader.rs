//! The ini layer of pgbouncer.ini: comments, `[section]` headers,
//! `key = value` lines and `%include` directives, with no knowledge of what
//! the keys mean. Includes are textual: an included file continues the
//! current section, and a section it opens stays open after it ends.

use std::path::{Path, PathBuf};

use crate::error::{ConfigError, MAX_INCLUDE_DEPTH};

/// One meaningful line, in reading order across all included files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum IniItem {
    /// A `[name]` header; `name` is lower-cased.
    Section {
        name: String,
        file: PathBuf,
        line: usize,
    },
    /// A `key = value` line. `section` is the lower-cased current section
    /// (`None` before the first header); `key` is as written, except that a
    /// double-quoted key is unquoted.
    Entry {
        section: Option<String>,
        key: String,
        value: String,
        file: PathBuf,
        line: usize,
    },
}

/// Reads `text` as the contents of `origin`, following `%include`s
/// (relative to the including file's directory).
pub(crate) fn read_ini(text: &str, origin: &Path) -> Result<Vec<IniItem>, ConfigError> {
    let mut reader = IniReader {
        items: Vec::new(),
        section: None,
        open_files: vec![identity_of(origin)],
    };
    reader.read_text(text, origin)?;
    Ok(reader.items)
}

struct IniReader {
    items: Vec<IniItem>,
    section: Option<String>,
    /// Canonical paths of the files being read, outermost first.
    open_files: Vec<PathBuf>,
}

/// The canonical path of `path` when it exists, for include-loop checks.
fn identity_of(path: &Path) -> PathBuf {
    std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf())
}

impl IniReader {
    fn read_text(&mut self, text: &str, file: &Path) -> Result<(), ConfigError> {
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        for (index, raw_line) in text.lines().enumerate() {
            let line = index + 1;
            let trimmed = raw_line.trim();
            let syntax = |reason: String| ConfigError::Syntax {
                file: file.to_path_buf(),
                line,
                reason,
            };
            if trimmed.is_empty() || trimmed.starts_with(';') || trimmed.starts_with('#') {
                continue;
            }
            if let Some(directive) = trimmed.strip_prefix('%') {
                let (word, argument) = directive
                    .split_once(char::is_whitespace)
                    .unwrap_or((directive, ""));
                if !word.eq_ignore_ascii_case("include") {
                    return Err(syntax(format!("unknown directive %{word}")));
                }
                let argument = argument.trim();
                if argument.is_empty() {
                    return Err(syntax("%include needs a file name".to_string()));
                }
                self.include(Path::new(argument), file, line)?;
            } else if let Some(header) = trimmed.strip_prefix('[') {
                let name = header
                    .strip_suffix(']')
                    .ok_or_else(|| syntax(format!("section header {trimmed:?} lacks ']'")))?;
                let name = name.trim().to_ascii_lowercase();
                self.section = Some(name.clone());
                self.items.push(IniItem::Section {
                    name,
                    file: file.to_path_buf(),
                    line,
                });
            } else {
                let (key, value) = split_key_value(trimmed).map_err(syntax)?;
                self.items.push(IniItem::Entry {
                    section: self.section.clone(),
                    key,
                    value,
                    file: file.to_path_buf(),
                    line,
                });
            }
        }
        Ok(())
    }

    fn include(&mut self, target: &Path, from: &Path, line: usize) -> Result<(), ConfigError> {
        let included = match from.parent() {
            Some(dir) if target.is_relative() => dir.join(target),
            _ => target.to_path_buf(),
        };
        if self.open_files.len() > MAX_INCLUDE_DEPTH {
            return Err(ConfigError::IncludeTooDeep {
                file: from.to_path_buf(),
                line,
            });
        }
        let identity = identity_of(&included);
        if self.open_files.contains(&identity) {
            return Err(ConfigError::IncludeLoop {
                file: from.to_path_buf(),
                line,
                included,
            });
        }
        let text =
            std::fs::read_to_string(&included).map_err(|source| ConfigError::IncludeRead {
                file: from.to_path_buf(),
                line,
                included: included.clone(),
                source,
            })?;
        self.open_files.push(identity);
        let result = self.read_text(&text, &included);
        self.open_files.pop();
        result
    }
}

/// Splits `key = value`. A key may be double-quoted (`"my-db" = ...`), with
/// `""` standing for a quote inside it, so it can hold `=` or spaces.
pub(crate) fn split_key_value(line: &str) -> Result<(String, String), String> {
    let (key, rest) = if let Some(quoted) = line.strip_prefix('"') {
        let mut key = String::new();
        let mut chars = quoted.char_indices();
        let rest = loop {
            match chars.next() {
                None => return Err(format!("unterminated quoted name in {line:?}")),
                Some((at, '"')) => {
                    if quoted[at + 1..].starts_with('"') {
                        key.push('"');
                        chars.next();
                    } else {
                        break &quoted[at + 1..];
                    }
                }
                Some((_, c)) => key.push(c),
            }
        };
        (key, rest.trim_start())
    } else {
        match line.find('=') {
            Some(at) => (line[..at].trim_end().to_string(), &line[at..]),
            None => (line.to_string(), ""),
        }
    };
    let value = rest
        .strip_prefix('=')
        .ok_or_else(|| format!("expected \"key = value\", found {line:?}"))?;
    if key.is_empty() {
        return Err(format!("missing key before '=' in {line:?}"));
    }
    Ok((key, value.trim().to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_value_forms() {
        assert_eq!(
            split_key_value("a = b = c"),
            Ok(("a".to_string(), "b = c".to_string()))
        );
        assert_eq!(
            split_key_value("foodb ="),
            Ok(("foodb".to_string(), String::new()))
        );
        assert_eq!(
            split_key_value(r#""my ""odd"" db" = host=x"#),
            Ok((r#"my "odd" db"#.to_string(), "host=x".to_string()))
        );
        assert!(split_key_value("conffile").is_err());
        assert!(split_key_value("= x").is_err());
        assert!(split_key_value(r#""open = x"#).is_err());
    }

    #[test]
    fn sections_and_comments() {
        let items = read_ini(
            "; comment\n# another\n[PgBouncer]\n  listen_port = 1 \n",
            Path::new("x.ini"),
        )
        .unwrap();
        assert_eq!(items.len(), 2);
        assert_eq!(
            items[1],
            IniItem::Entry {
                section: Some("pgbouncer".to_string()),
                key: "listen_port".to_string(),
                value: "1".to_string(),
                file: PathBuf::from("x.ini"),
                line: 4,
            }
        );
    }

    #[test]
    fn bad_lines() {
        let err = read_ini("[pgbouncer\n", Path::new("x.ini")).unwrap_err();
        assert!(
            err.to_string().starts_with("x.ini:1: syntax error"),
            "{err}"
        );
        let err = read_ini("\n%define x\n", Path::new("x.ini")).unwrap_err();
        assert!(err.to_string().contains("x.ini:2:"), "{err}");
    }
}
