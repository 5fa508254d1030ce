//! Routing hints an application writes into its SQL comments
//! (`/* sluice: replica */`, `-- sluice: primary`). The tokenizer finds the
//! comments, so hint-like text inside a string constant is ignored.

use crate::Route;
use crate::lexer::{Kind, Lexer, Strings};

pub(crate) fn find(sql: &[u8]) -> Option<Route> {
    if u32::try_from(sql.len()).is_err() {
        return None;
    }
    let mut lexer = Lexer::new(sql, Strings::Standard).without_keywords();
    let (mut primary, mut replica, mut clean) = (false, false, true);
    while let Some(token) = lexer.next_token() {
        match token {
            Ok(t) if t.kind == Kind::Comment => {
                let text = sql
                    .get(t.start as usize..t.end as usize)
                    .unwrap_or_default();
                let body = match text.strip_prefix(b"--") {
                    Some(line) => line,
                    None => text
                        .get(2..text.len().saturating_sub(2))
                        .unwrap_or_default(),
                };
                scan(body, &mut primary, &mut replica);
            }
            Ok(_) => {}
            Err(_) => {
                clean = false;
                break;
            }
        }
    }
    if primary {
        Some(Route::Primary)
    } else if replica && clean {
        Some(Route::Replica)
    } else {
        None
    }
}

fn is_word(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// Whether `body[at..]` starts with `word` (lower case) as a whole word.
fn word_at(body: &[u8], at: usize, word: &[u8]) -> bool {
    body.get(at..at + word.len())
        .is_some_and(|w| w.eq_ignore_ascii_case(word))
        && !body.get(at + word.len()).copied().is_some_and(is_word)
}

/// Looks for `sluice <spaces> : <spaces> primary|replica` in a comment body.
fn scan(body: &[u8], primary: &mut bool, replica: &mut bool) {
    let mut from = 0;
    while let Some(p) = memchr::memchr2(b's', b'S', body.get(from..).unwrap_or_default()) {
        let at = from + p;
        from = at + 1;
        if at > 0 && body.get(at - 1).copied().is_some_and(is_word) {
            continue;
        }
        if !body
            .get(at..at + 6)
            .is_some_and(|w| w.eq_ignore_ascii_case(b"sluice"))
        {
            continue;
        }
        let mut i = at + 6;
        let skip_spaces = |mut i: usize| {
            while body.get(i).is_some_and(|b| b.is_ascii_whitespace()) {
                i += 1;
            }
            i
        };
        i = skip_spaces(i);
        if body.get(i) != Some(&b':') {
            continue;
        }
        i = skip_spaces(i + 1);
        if word_at(body, i, b"primary") {
            *primary = true;
        } else if word_at(body, i, b"replica") {
            *replica = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(s: &str) -> Option<Route> {
        find(s.as_bytes())
    }

    #[test]
    fn block_and_line_comments() {
        assert_eq!(h("/* sluice: replica */ select 1"), Some(Route::Replica));
        assert_eq!(h("select 1 /* sluice: primary */"), Some(Route::Primary));
        assert_eq!(h("/*sluice:replica*/select 1"), Some(Route::Replica));
        assert_eq!(h("/* SLUICE : Replica */ select 1"), Some(Route::Replica));
        assert_eq!(h("select 1 -- sluice: replica"), Some(Route::Replica));
        assert_eq!(h("--sluice:primary\nselect 1"), Some(Route::Primary));
        assert_eq!(
            h("/* app=web, sluice: replica, route=x */ select 1"),
            Some(Route::Replica)
        );
        assert_eq!(
            h("/* outer /* sluice: replica */ still outer */ select 1"),
            Some(Route::Replica)
        );
    }

    #[test]
    fn absent_or_not_a_hint() {
        assert_eq!(h("select 1"), None);
        assert_eq!(h(""), None);
        assert_eq!(h("select '/* sluice: replica */'"), None);
        assert_eq!(h("select $$ -- sluice: replica $$"), None);
        assert_eq!(h("select \"/* sluice: replica */\""), None);
        assert_eq!(h("/* nosluice: replica */"), None);
        assert_eq!(h("/* sluice: replicas */"), None);
        assert_eq!(h("/* sluice replica */"), None);
        assert_eq!(h("/* sluice: */"), None);
        assert_eq!(h("/* sluice: standby */"), None);
        assert_eq!(h("/* sluice:"), None);
    }

    #[test]
    fn conflicts_and_broken_text() {
        assert_eq!(
            h("/* sluice: replica */ select 1 /* sluice: primary */"),
            Some(Route::Primary)
        );
        assert_eq!(h("/* sluice: replica */ select 'oops"), None);
        assert_eq!(
            h("/* sluice: primary */ select 'oops"),
            Some(Route::Primary)
        );
        assert_eq!(h("/* sluice: replica"), None);
    }
}
