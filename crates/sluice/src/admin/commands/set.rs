//! SET key = value (or key TO value): one setting changed in memory,
//! validated like the file and applied through the reload's steps. The
//! key is a word or a double-quoted name; the value a single-quoted
//! string (two quotes for one, as in SQL), a double-quoted word, or a bare
//! word, as PgBouncer's console reads them.

use bytes::BytesMut;
use sluice_wire::{ErrorFields, Severity, command_complete};

use super::{Line, invalid_command};
use crate::admin::error;
use crate::app::App;

pub(super) fn run(app: &App, line: &Line<'_>, out: &mut BytesMut) {
    // After the verb (`SET`, three bytes of ASCII).
    let args = line.text.get(3..).unwrap_or_default();
    let Some((key, value)) = parse(args) else {
        error(out, "42601", &invalid_command(line.sql));
        return;
    };
    let (key, value) = (key.as_str(), value.as_str());
    if super::fake_param(key).is_some() {
        // A driver's session setting: PgBouncer's answer.
        ErrorFields::new(Severity::Notice, "00000", "SET ignored").encode(out);
        command_complete(out, "SET");
        return;
    }
    let mut config = (*app.config()).clone();
    if let Err(e) = config.settings.set(key, value) {
        error(out, "22023", &e.to_string());
        return;
    }
    // The same checks and steps as RELOAD (a value refused at startup is
    // refused here; TLS, hba, syslog… follow).
    let said = crate::reload::apply(app, config);
    if let Some(failed) = said.refused() {
        error(out, "22023", failed);
        return;
    }
    for s in said.errors.iter().chain(&said.warnings) {
        ErrorFields::new(Severity::Warning, "01000", s).encode(out);
    }
    // (PgBouncer's tag names what was set)
    command_complete(out, &format!("SET {key}={value}"));
}

/// The key and value of `SET`'s arguments; `None` when they are not
/// `key = value` or `key TO value`.
fn parse(args: &str) -> Option<(String, String)> {
    let rest = args.trim_start();
    let (key, rest) = match rest.strip_prefix('"') {
        Some(quoted) => unquote(quoted, '"')?,
        None => {
            let end = rest
                .find(|c: char| c.is_whitespace() || c == '=')
                .unwrap_or(rest.len());
            (rest[..end].to_owned(), &rest[end..])
        }
    };
    if key.is_empty() {
        return None;
    }
    let rest = rest.trim_start();
    let rest = match rest.strip_prefix('=') {
        Some(r) => r,
        None => {
            let to = rest.get(..2).filter(|w| w.eq_ignore_ascii_case("to"))?;
            let r = &rest[to.len()..];
            // `TO` is a word of its own.
            if !r.starts_with(|c: char| c.is_whitespace() || c == '\'' || c == '"') {
                return None;
            }
            r
        }
    };
    let rest = rest.trim_start();
    let (value, tail) = if let Some(quoted) = rest.strip_prefix('\'') {
        unquote(quoted, '\'')?
    } else if let Some(quoted) = rest.strip_prefix('"') {
        unquote(quoted, '"')?
    } else {
        // A bare word (PgBouncer's: letters, digits, `_`; and `.`, `-` for
        // times and numbers): SQL with spaces or quotes must be quoted.
        let end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')))
            .unwrap_or(rest.len());
        (rest[..end].to_owned(), &rest[end..])
    };
    (!value.is_empty() || rest.starts_with(['\'', '"']))
        .then_some(())
        .filter(|()| tail.trim().is_empty())
        .map(|()| (key, value))
}

/// The text of a quoted token whose opening `quote` is cut off already (a
/// doubled quote stands for one), and what follows its closing quote;
/// `None` when it is not closed.
fn unquote(text: &str, quote: char) -> Option<(String, &str)> {
    let mut value = String::new();
    let mut chars = text.char_indices();
    while let Some((i, c)) = chars.next() {
        if c != quote {
            value.push(c);
            continue;
        }
        let after = &text[i + c.len_utf8()..];
        if after.starts_with(quote) {
            value.push(quote);
            chars.next();
            continue;
        }
        return Some((value, after));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::parse;

    fn pair(k: &str, v: &str) -> Option<(String, String)> {
        Some((k.to_owned(), v.to_owned()))
    }

    #[test]
    fn values_are_read_as_sql_strings() {
        assert_eq!(
            parse(" default_pool_size = 9"),
            pair("default_pool_size", "9")
        );
        assert_eq!(
            parse(" default_pool_size=9"),
            pair("default_pool_size", "9")
        );
        assert_eq!(
            parse(" server_reset_query = 'select ''a=b'''"),
            pair("server_reset_query", "select 'a=b'")
        );
        assert_eq!(
            parse(" server_reset_query TO 'select 1 = 1'"),
            pair("server_reset_query", "select 1 = 1")
        );
        assert_eq!(
            parse(r#" "default_pool_size" = 9"#),
            pair("default_pool_size", "9")
        );
        assert_eq!(
            parse(" server_reset_query = ''"),
            pair("server_reset_query", "")
        );
        assert_eq!(parse(" verbose to 2"), pair("verbose", "2"));
        assert_eq!(
            parse(" server_idle_timeout = 0.5"),
            pair("server_idle_timeout", "0.5")
        );
        assert_eq!(
            parse(" pool_mode = transaction"),
            pair("pool_mode", "transaction")
        );
    }

    #[test]
    fn broken_lines_are_refused() {
        assert_eq!(parse(" default_pool_size"), None);
        assert_eq!(parse(" = 9"), None);
        assert_eq!(parse(" server_reset_query = 'unclosed"), None);
        assert_eq!(parse(" server_reset_query = 'a' 'b'"), None);
        assert_eq!(parse(" totally 5"), None);
        assert_eq!(parse(" x tomorrow"), None);
        // SQL must be quoted, as PgBouncer asks: a bare value is one word.
        assert_eq!(parse(" server_reset_query = DISCARD ALL"), None);
        assert_eq!(parse(" server_reset_query = E'x\\ny'"), None);
        assert_eq!(parse(" server_reset_query = it's"), None);
        assert_eq!(parse(" default_pool_size ="), None);
    }
}
