//! Splits the libpq-style connection strings of `[databases]` and `[users]`
//! entries into `key=value` pairs. Values may be single-quoted; inside
//! quotes `\'` and `''` stand for a quote and `\\` for a backslash.

/// One `key=value` pair; the key is lower-cased.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ConnParam {
    pub key: String,
    pub value: String,
}

/// Splits `text` into its parameters, in order. `Err` is the reason the
/// text is malformed.
pub(crate) fn parse_connstring(text: &str) -> Result<Vec<ConnParam>, String> {
    let mut params = Vec::new();
    let mut chars = text.chars().peekable();
    loop {
        skip_spaces(&mut chars);
        if chars.peek().is_none() {
            return Ok(params);
        }
        let mut key = String::new();
        while let Some(&c) = chars.peek() {
            if c == '=' || c.is_whitespace() {
                break;
            }
            key.push(c);
            chars.next();
        }
        if key.is_empty() {
            return Err("expected a parameter name before '='".to_string());
        }
        skip_spaces(&mut chars);
        if chars.next() != Some('=') {
            return Err(format!("expected '=' after {key:?}"));
        }
        skip_spaces(&mut chars);
        let value = if chars.peek() == Some(&'\'') {
            chars.next();
            let value = read_quoted(&mut chars)
                .ok_or_else(|| format!("unterminated quoted value for {key:?}"))?;
            if chars.peek().is_some_and(|c| !c.is_whitespace()) {
                return Err(format!(
                    "expected a space after the quoted value of {key:?}"
                ));
            }
            value
        } else {
            let mut value = String::new();
            while let Some(c) = chars.next_if(|c| !c.is_whitespace()) {
                value.push(c);
            }
            if value.is_empty() {
                return Err(format!("missing value for {key:?}"));
            }
            value
        };
        params.push(ConnParam {
            key: key.to_ascii_lowercase(),
            value,
        });
    }
}

fn skip_spaces(chars: &mut std::iter::Peekable<std::str::Chars<'_>>) {
    while chars.next_if(|c| c.is_whitespace()).is_some() {}
}

/// Reads a quoted value after its opening quote, through the closing one.
/// `None` if the closing quote is missing.
fn read_quoted(chars: &mut std::iter::Peekable<std::str::Chars<'_>>) -> Option<String> {
    let mut value = String::new();
    loop {
        match chars.next()? {
            '\\' => match chars.peek() {
                Some(&escaped @ ('\'' | '\\')) => {
                    value.push(escaped);
                    chars.next();
                }
                _ => value.push('\\'),
            },
            '\'' => {
                if chars.next_if_eq(&'\'').is_some() {
                    value.push('\'');
                } else {
                    return Some(value);
                }
            }
            c => value.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(text: &str) -> Vec<(String, String)> {
        parse_connstring(text)
            .unwrap()
            .into_iter()
            .map(|param| (param.key, param.value))
            .collect()
    }

    #[test]
    fn plain_pairs() {
        assert_eq!(
            pairs("host=localhost  port = 5432 dbname=x"),
            vec![
                ("host".into(), "localhost".into()),
                ("port".into(), "5432".into()),
                ("dbname".into(), "x".into()),
            ]
        );
        assert!(pairs("   ").is_empty());
    }

    #[test]
    fn quoted_values() {
        assert_eq!(
            pairs(r"connect_query='SELECT 1' password='it\'s' p2='a\\b' p3='x''y' p4='c:\d'"),
            vec![
                ("connect_query".into(), "SELECT 1".into()),
                ("password".into(), "it's".into()),
                ("p2".into(), r"a\b".into()),
                ("p3".into(), "x'y".into()),
                ("p4".into(), r"c:\d".into()),
            ]
        );
        assert_eq!(
            pairs("password=''"),
            vec![("password".into(), String::new())]
        );
    }

    #[test]
    fn malformed() {
        assert!(
            parse_connstring("host")
                .unwrap_err()
                .contains("expected '='")
        );
        assert!(parse_connstring("=x").is_err());
        assert!(
            parse_connstring("host=")
                .unwrap_err()
                .contains("missing value")
        );
        assert!(
            parse_connstring("q='abc")
                .unwrap_err()
                .contains("unterminated")
        );
        assert!(
            parse_connstring(r"q='abc\'")
                .unwrap_err()
                .contains("unterminated")
        );
        assert!(parse_connstring("q='a'b").is_err());
    }
}
