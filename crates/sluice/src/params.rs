//! The run-time parameters a client may set and expects to keep in
//! transaction mode (DESIGN.md §3). A client's wanted values and a server's
//! current values are both a `ParamSet`; when a client is given a server, the
//! difference is applied with SET. Sets are shared behind `Arc` so that the
//! common case — nothing changed — is a pointer comparison.

use std::fmt::Write as _;
use std::sync::Arc;

/// Parameters PostgreSQL reports with ParameterStatus that sluice keeps per
/// client, in the server's spelling.
pub const TRACKED: &[&str] = &[
    "client_encoding",
    "DateStyle",
    "TimeZone",
    "IntervalStyle",
    "standard_conforming_strings",
    "application_name",
];

/// The tracked spelling of `name`, if sluice tracks it.
pub fn tracked_name(name: &str) -> Option<&'static str> {
    TRACKED
        .iter()
        .copied()
        .find(|t| t.eq_ignore_ascii_case(name))
}

/// Values of tracked parameters, one slot per entry of `TRACKED`; values
/// are shared strings, so a copy-on-write copies pointers, not text.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct ParamSet {
    values: [Option<Arc<str>>; TRACKED.len()],
}

fn slot(name: &str) -> Option<usize> {
    TRACKED.iter().position(|t| *t == name)
}

impl ParamSet {
    pub fn get(&self, name: &'static str) -> Option<&str> {
        slot(name).and_then(|i| self.values[i].as_deref())
    }

    /// Sets `name`; returns whether the value changed.
    pub fn set(&mut self, name: &'static str, value: &str) -> bool {
        let Some(i) = slot(name) else {
            return false;
        };
        if self.values[i].as_deref() == Some(value) {
            return false;
        }
        self.values[i] = Some(value.into());
        true
    }

    pub fn iter(&self) -> impl Iterator<Item = (&'static str, &str)> {
        TRACKED
            .iter()
            .zip(self.values.iter())
            .filter_map(|(k, v)| v.as_deref().map(|v| (*k, v)))
    }

    /// The SET statements that make a server with `current` values match
    /// `self`, as one simple-protocol query; `None` when nothing differs.
    pub fn diff_sql(&self, current: &ParamSet) -> Option<String> {
        let mut sql = String::new();
        for (k, v) in self.iter() {
            if current.get(k) != Some(v) {
                sql.push_str("SET ");
                sql.push_str(k);
                sql.push_str(" TO ");
                push_literal(&mut sql, v);
                sql.push(';');
            }
        }
        (!sql.is_empty()).then_some(sql)
    }
}

/// Shares identical parameter sets between clients: thousands of clients of
/// one application set the same `application_name`, and each would
/// otherwise hold its own copy. Sharing also makes the "nothing to SET"
/// check a pointer comparison across clients.
#[derive(Debug, Default)]
pub struct ParamInterner {
    sets: std::sync::Mutex<std::collections::HashMap<u64, Vec<std::sync::Weak<ParamSet>>>>,
}

impl ParamInterner {
    /// The shared set equal to `set`, registering `set` if there is none.
    pub fn intern(&self, set: Arc<ParamSet>) -> Arc<ParamSet> {
        use std::hash::{BuildHasher, BuildHasherDefault};
        let hash = BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default()
            .hash_one(&*set);
        let mut sets = self.sets.lock().unwrap_or_else(|p| p.into_inner());
        let bucket = sets.entry(hash).or_default();
        bucket.retain(|w| w.strong_count() > 0);
        if let Some(found) = bucket
            .iter()
            .filter_map(std::sync::Weak::upgrade)
            .find(|s| **s == *set)
        {
            return found;
        }
        bucket.push(Arc::downgrade(&set));
        set
    }

    /// Forgets sets no client holds any more (janitor).
    pub fn prune(&self) {
        let mut sets = self.sets.lock().unwrap_or_else(|p| p.into_inner());
        sets.retain(|_, bucket| {
            bucket.retain(|w| w.strong_count() > 0);
            !bucket.is_empty()
        });
    }
}

/// A string literal read the same whatever the session's
/// `standard_conforming_strings` (a previous client may have turned it
/// off on the server): a value with a backslash is written `E'…'`, its
/// backslashes doubled.
pub fn push_literal(sql: &mut String, v: &str) {
    if v.contains('\\') {
        sql.push('E');
    }
    sql.push('\'');
    for c in v.chars() {
        if c == '\'' || c == '\\' {
            sql.push(c);
        }
        sql.push(c);
    }
    sql.push('\'');
}

/// `push_literal` in ASCII alone: other characters are Unicode escapes of
/// an `E'…'` string, which PostgreSQL reads the same whatever the
/// session's client_encoding (raw UTF-8 bytes on a LATIN1 session would be
/// read as other characters).
pub fn push_literal_ascii(sql: &mut String, v: &str) {
    push_escaped(sql, v, |sql, c| {
        let _ = match u32::from(c) {
            n if n <= 0xFFFF => write!(sql, "\\u{n:04x}"),
            n => write!(sql, "\\U{n:08x}"),
        };
    });
}

/// `push_literal` with every character past ASCII written by `escape`
/// inside an `E'…'` string (a value all ASCII is written plain).
fn push_escaped(sql: &mut String, v: &str, escape: impl Fn(&mut String, char)) {
    if v.is_ascii() {
        return push_literal(sql, v);
    }
    sql.push_str("E'");
    for c in v.chars() {
        match c {
            '\'' | '\\' => {
                sql.push(c);
                sql.push(c);
            }
            c if c.is_ascii() => sql.push(c),
            c => escape(sql, c),
        }
    }
    sql.push('\'');
}

/// The session's client_encoding is one whose multibyte characters may
/// hold bytes below 0x80 (SJIS, BIG5, GBK, UHC, GB18030, JOHAB, client-side
/// only in PostgreSQL): in `ソ`, SJIS 0x83 0x5C, the second byte is a
/// backslash to a reader of bytes. PostgreSQL converts a text to the
/// server's encoding before it reads it, sluice reads bytes: in such a text
/// with a byte of 0x80 or more, sluice cannot tell where its strings end
/// (a review hid `SET`s, a temporary table and a LISTEN behind `E'ソ'`).
/// Names as PostgreSQL matches them: letters and digits, in any case.
pub fn ascii_in_multibyte(set: &ParamSet) -> bool {
    const NAMES: &[&[u8]] = &[
        b"sjis",
        b"shiftjis",
        b"mskanji",
        b"win932",
        b"windows932",
        b"cp932",
        b"shiftjis2004",
        b"big5",
        b"win950",
        b"windows950",
        b"cp950",
        b"gbk",
        b"win936",
        b"windows936",
        b"cp936",
        b"uhc",
        b"win949",
        b"windows949",
        b"cp949",
        b"gb18030",
        b"johab",
    ];
    let Some(name) = set.get("client_encoding") else {
        return false;
    };
    let mut clean = [0u8; 16];
    let mut n = 0;
    for b in name.bytes().filter(u8::is_ascii_alphanumeric) {
        let Some(slot) = clean.get_mut(n) else {
            return false;
        };
        *slot = b.to_ascii_lowercase();
        n += 1;
    }
    NAMES.contains(&&clean[..n])
}

/// The session's client_encoding is UTF-8 (or unnamed), however spelled:
/// PostgreSQL reads `utf-8`, `UTF_8` and `Unicode` as UTF8 (it drops what
/// is not a letter or digit, and ignores case).
pub fn client_utf8(set: &ParamSet) -> bool {
    set.get("client_encoding").is_none_or(|e| {
        let clean: String = e
            .chars()
            .filter(char::is_ascii_alphanumeric)
            .map(|c| c.to_ascii_lowercase())
            .collect();
        clean == "utf8" || clean == "unicode"
    })
}

/// How setting values travel between sluice, which keeps text in UTF-8,
/// and a session (`session_vars`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TextMode {
    /// As they are: the session's client_encoding is UTF-8.
    Raw,
    /// Another client_encoding: read back as the hex of their UTF-8
    /// bytes, written with Unicode escapes (`push_literal_ascii`).
    Unicode,
    /// A SQL_ASCII database, which converts nothing and takes no Unicode
    /// escape: read back as the hex of their own bytes, kept one char per
    /// byte, written with byte escapes (`push_literal_bytes`).
    Bytes,
}

/// The `TextMode` of a session with these parameters on a server whose
/// database is SQL_ASCII or not (a client that never named a
/// client_encoding is taken to use UTF-8, as default databases do).
pub fn text_mode(set: &ParamSet, sql_ascii: bool) -> TextMode {
    if sql_ascii {
        return TextMode::Bytes;
    }
    let utf8 = set
        .get("client_encoding")
        .is_none_or(|e| e.eq_ignore_ascii_case("UTF8") || e.eq_ignore_ascii_case("UNICODE"));
    if utf8 {
        TextMode::Raw
    } else {
        TextMode::Unicode
    }
}

/// `push_literal` for `TextMode::Bytes`: chars U+0080 to U+00FF (the bytes
/// read back) written as `\xhh` in an `E'…'` string.
pub fn push_literal_bytes(sql: &mut String, v: &str) {
    push_escaped(sql, v, |sql, c| match u8::try_from(u32::from(c)) {
        Ok(b) => {
            let _ = write!(sql, "\\x{b:02x}");
        }
        // (not a byte read back: what it stands for cannot be known)
        Err(_) => sql.push('?'),
    });
}

/// Writes `v` as a literal for a session in `mode`.
pub fn push_literal_in(sql: &mut String, v: &str, mode: TextMode) {
    match mode {
        TextMode::Raw => push_literal(sql, v),
        TextMode::Unicode => push_literal_ascii(sql, v),
        TextMode::Bytes => push_literal_bytes(sql, v),
    }
}

/// Updates a shared set copy-on-write; returns whether anything changed.
pub fn update_shared(set: &mut Arc<ParamSet>, name: &'static str, value: &str) -> bool {
    if set.get(name) == Some(value) {
        return false;
    }
    Arc::make_mut(set).set(name, value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodings_whose_characters_may_hold_ascii_bytes() {
        let with = |name: &str| {
            let mut set = ParamSet::default();
            set.set("client_encoding", name);
            ascii_in_multibyte(&set)
        };
        for name in [
            "SJIS",
            "Shift_JIS",
            "win932",
            "BIG5",
            "GBK",
            "UHC",
            "GB18030",
            "JOHAB",
        ] {
            assert!(with(name), "{name}");
        }
        for name in [
            "UTF8",
            "LATIN1",
            "EUC_JP",
            "WIN1252",
            "SQL_ASCII",
            "a-very-long-unknown-name",
        ] {
            assert!(!with(name), "{name}");
        }
        assert!(!ascii_in_multibyte(&ParamSet::default()));
    }

    #[test]
    fn byte_literals_escape_the_bytes() {
        let mut sql = String::new();
        push_literal_bytes(&mut sql, "caf\u{e9} o'h\\");
        assert_eq!(sql, "E'caf\\xe9 o''h\\\\'");
    }

    #[test]
    fn ascii_literals_escape_the_rest() {
        let mut sql = String::new();
        push_literal_ascii(&mut sql, "caf\u{e9} o'h\\ \u{1f600}");
        assert_eq!(sql, "E'caf\\u00e9 o''h\\\\ \\U0001f600'");
        assert!(sql.is_ascii());
        let mut plain = String::new();
        push_literal_ascii(&mut plain, "o'hara");
        assert_eq!(plain, "'o''hara'");
    }

    #[test]
    fn diff_quotes_and_skips_equal() {
        let mut want = ParamSet::default();
        want.set("application_name", "o'hara");
        want.set("TimeZone", "UTC");
        let mut have = ParamSet::default();
        have.set("TimeZone", "UTC");
        assert_eq!(
            want.diff_sql(&have).as_deref(),
            Some("SET application_name TO 'o''hara';")
        );
        assert_eq!(want.diff_sql(&want), None);
        assert_eq!(tracked_name("datestyle"), Some("DateStyle"));
    }
}
