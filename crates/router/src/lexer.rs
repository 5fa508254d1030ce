//! A tokenizer that follows PostgreSQL's own scanner (`scan.l`) closely enough
//! that a keyword the router sees is a keyword the server sees: string
//! constants of every kind, quoted identifiers, dollar quotes, nested block
//! comments and line comments hide their contents. It is linear in the input:
//! every byte is looked at a bounded number of times, and the searches for a
//! closing quote or dollar-quote tag go forward only.

use memchr::{memchr, memchr2, memmem};

use crate::keywords;

/// What a token is. Whitespace is dropped; comments are tokens so that
/// [`crate::hint`] can read them, and the classifier skips them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// An unquoted identifier or keyword.
    Ident,
    /// A `"quoted"` or `U&"quoted"` identifier.
    QuotedIdent,
    /// Any string constant: `'…'`, `E'…'`, `B'…'`, `X'…'`, `N'…'`, `U&'…'`
    /// or a dollar-quoted string.
    String,
    Number,
    /// A `$1` parameter.
    Param,
    /// A run of operator characters.
    Op,
    LParen,
    RParen,
    LBracket,
    RBracket,
    Comma,
    Semicolon,
    Dot,
    /// `::`
    Cast,
    Colon,
    /// `-- …` or `/* … */`, with its delimiters.
    Comment,
}

/// One token: its kind, where it is, and for an [`Kind::Ident`] its index in
/// the keyword table (or [`NOT_KEYWORD`]); the classifier stores the index of
/// a parenthesis' partner in `aux`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Token {
    pub kind: Kind,
    pub start: u32,
    pub end: u32,
    pub aux: u32,
}

pub(crate) const NOT_KEYWORD: u32 = u32::MAX;

/// The text cannot be tokenized the way the server would; the classifier
/// fails closed on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LexError {
    /// A quote, quoted identifier, dollar quote or block comment never ends.
    Unterminated,
    /// A byte PostgreSQL's grammar has no use for (`\`, `{`, NUL, control
    /// characters, a lone `$`), or an empty quoted identifier.
    Invalid,
}

/// How plain `'…'` strings treat a backslash: with
/// `standard_conforming_strings` on (PostgreSQL's default) it is an ordinary
/// character, with it off it escapes the next character, as in `E'…'`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Strings {
    Standard,
    Escaped,
}

pub(crate) struct Lexer<'a> {
    s: &'a [u8],
    i: usize,
    mode: Strings,
    /// A plain string held a backslash, so the text would tokenize
    /// differently with `standard_conforming_strings` off.
    pub plain_backslash: bool,
    /// A backslash escape directly followed a byte of a multi-byte character.
    /// In client encodings such as SJIS or BIG5 that backslash may be the
    /// second byte of a character rather than an escape, so the server (which
    /// converts the text first) may end the string elsewhere.
    pub ambiguous: bool,
    /// Look identifiers up in the keyword table (the hint scanner does not
    /// need to).
    keywords: bool,
}

fn is_ident_start(b: u8) -> bool {
    b.is_ascii_alphabetic() || b == b'_' || b >= 0x80
}

fn is_ident_cont(b: u8) -> bool {
    is_ident_start(b) || b.is_ascii_digit() || b == b'$'
}

fn is_dollar_tag_cont(b: u8) -> bool {
    is_ident_start(b) || b.is_ascii_digit()
}

fn is_op_char(b: u8) -> bool {
    matches!(
        b,
        b'~' | b'!'
            | b'@'
            | b'#'
            | b'^'
            | b'&'
            | b'|'
            | b'`'
            | b'?'
            | b'+'
            | b'-'
            | b'*'
            | b'/'
            | b'%'
            | b'<'
            | b'>'
            | b'='
    )
}

fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c)
}

impl<'a> Lexer<'a> {
    /// The caller guarantees `s.len() <= u32::MAX`.
    pub(crate) fn new(s: &'a [u8], mode: Strings) -> Self {
        Lexer {
            s,
            i: 0,
            mode,
            plain_backslash: false,
            ambiguous: false,
            keywords: true,
        }
    }

    /// Leaves every identifier's keyword index at [`NOT_KEYWORD`].
    pub(crate) fn without_keywords(mut self) -> Self {
        self.keywords = false;
        self
    }

    fn at(&self, i: usize) -> Option<u8> {
        self.s.get(i).copied()
    }

    fn token(&self, kind: Kind, start: usize, end: usize, aux: u32) -> Token {
        // Positions fit: the input is at most u32::MAX bytes long.
        Token {
            kind,
            start: start as u32,
            end: end as u32,
            aux,
        }
    }

    /// The next token, `None` at the end, or an error after which the caller
    /// must stop.
    pub(crate) fn next_token(&mut self) -> Option<Result<Token, LexError>> {
        while self.at(self.i).is_some_and(is_space) {
            self.i += 1;
        }
        let start = self.i;
        let b = self.at(start)?;
        let next = self.at(start + 1);
        let result = match b {
            b'-' if next == Some(b'-') => {
                let rest = self.s.get(start..).unwrap_or_default();
                let end = memchr2(b'\n', b'\r', rest).map_or(self.s.len(), |p| start + p);
                Ok((Kind::Comment, end))
            }
            b'/' if next == Some(b'*') => self.block_comment(start),
            b'\'' => self.string(start + 1, self.mode),
            b'"' => self.quoted_ident(start + 1),
            b'$' => self.dollar(start),
            b'(' => Ok((Kind::LParen, start + 1)),
            b')' => Ok((Kind::RParen, start + 1)),
            b'[' => Ok((Kind::LBracket, start + 1)),
            b']' => Ok((Kind::RBracket, start + 1)),
            b',' => Ok((Kind::Comma, start + 1)),
            b';' => Ok((Kind::Semicolon, start + 1)),
            b':' if next == Some(b':') => Ok((Kind::Cast, start + 2)),
            b':' => Ok((Kind::Colon, start + 1)),
            b'.' if next.is_some_and(|n| n.is_ascii_digit()) => {
                Ok((Kind::Number, self.number(start)))
            }
            b'.' => Ok((Kind::Dot, start + 1)),
            b'0'..=b'9' => Ok((Kind::Number, self.number(start))),
            _ if is_op_char(b) => Ok((Kind::Op, self.operator(start))),
            _ if is_ident_start(b) => self.word(start),
            _ => Err(LexError::Invalid),
        };
        Some(match result {
            Ok((kind, end)) => {
                self.i = end;
                let aux = if kind == Kind::Ident && self.keywords {
                    let word = self.s.get(start..end).unwrap_or_default();
                    keywords::lookup(word).map_or(NOT_KEYWORD, u32::from)
                } else {
                    0
                };
                Ok(self.token(kind, start, end, aux))
            }
            Err(e) => {
                // Stay at the end so that a caller who ignores the error
                // cannot loop forever.
                self.i = self.s.len();
                Err(e)
            }
        })
    }

    /// `/* … */`, nesting as PostgreSQL's comments do.
    fn block_comment(&self, start: usize) -> Result<(Kind, usize), LexError> {
        let mut depth = 0usize;
        let mut i = start + 2;
        loop {
            let rest = self.s.get(i..).unwrap_or_default();
            let p = i + memchr2(b'*', b'/', rest).ok_or(LexError::Unterminated)?;
            match (self.at(p), self.at(p + 1)) {
                (Some(b'/'), Some(b'*')) => {
                    depth += 1;
                    i = p + 2;
                }
                (Some(b'*'), Some(b'/')) => {
                    if depth == 0 {
                        return Ok((Kind::Comment, p + 2));
                    }
                    depth -= 1;
                    i = p + 2;
                }
                _ => i = p + 1,
            }
        }
    }

    /// The body of a string constant starting at `i` (just past the opening
    /// quote); returns the position past the closing quote.
    fn string(&mut self, mut i: usize, mode: Strings) -> Result<(Kind, usize), LexError> {
        loop {
            let rest = self.s.get(i..).unwrap_or_default();
            let found = match mode {
                Strings::Standard => memchr(b'\'', rest),
                Strings::Escaped => memchr2(b'\'', b'\\', rest),
            };
            let p = i + found.ok_or(LexError::Unterminated)?;
            if mode == Strings::Standard && !self.plain_backslash {
                let body = self.s.get(i..p).unwrap_or_default();
                self.plain_backslash = memchr(b'\\', body).is_some();
            }
            if self.at(p) == Some(b'\\') {
                if p > 0 && self.at(p - 1).is_some_and(|b| b >= 0x80) {
                    self.ambiguous = true;
                }
                if p + 1 >= self.s.len() {
                    return Err(LexError::Unterminated);
                }
                i = p + 2;
            } else if self.at(p + 1) == Some(b'\'') {
                i = p + 2;
            } else {
                return Ok((Kind::String, p + 1));
            }
        }
    }

    /// A string whose backslashes never escape (bit and hex strings,
    /// `U&'…'`), whatever `standard_conforming_strings` says.
    fn literal_string(&mut self, i: usize) -> Result<(Kind, usize), LexError> {
        let saved = self.plain_backslash;
        let r = self.string(i, Strings::Standard);
        self.plain_backslash = saved;
        r
    }

    fn quoted_ident(&self, mut i: usize) -> Result<(Kind, usize), LexError> {
        let body_start = i;
        loop {
            let rest = self.s.get(i..).unwrap_or_default();
            let p = i + memchr(b'"', rest).ok_or(LexError::Unterminated)?;
            if self.at(p + 1) == Some(b'"') {
                i = p + 2;
            } else if p == body_start {
                return Err(LexError::Invalid);
            } else {
                return Ok((Kind::QuotedIdent, p + 1));
            }
        }
    }

    /// `$1`, `$$…$$` or `$tag$…$tag$`.
    fn dollar(&self, start: usize) -> Result<(Kind, usize), LexError> {
        let mut j = start + 1;
        match self.at(j) {
            Some(d) if d.is_ascii_digit() => {
                while self.at(j).is_some_and(|d| d.is_ascii_digit()) {
                    j += 1;
                }
                return Ok((Kind::Param, j));
            }
            Some(b'$') => {}
            Some(c) if is_ident_start(c) => {
                while self.at(j).is_some_and(is_dollar_tag_cont) {
                    j += 1;
                }
                if self.at(j) != Some(b'$') {
                    return Err(LexError::Invalid);
                }
            }
            _ => return Err(LexError::Invalid),
        }
        let tag = self.s.get(start..=j).ok_or(LexError::Invalid)?;
        let body = self.s.get(j + 1..).unwrap_or_default();
        let p = memmem::find(body, tag).ok_or(LexError::Unterminated)?;
        Ok((Kind::String, j + 1 + p + tag.len()))
    }

    fn number(&self, start: usize) -> usize {
        let digits = |mut i: usize| {
            while self.at(i).is_some_and(|d| d.is_ascii_digit() || d == b'_') {
                i += 1;
            }
            i
        };
        let mut i = digits(start);
        if self.at(i) == Some(b'.') && self.at(i + 1) != Some(b'.') {
            i = digits(i + 1);
        }
        if matches!(self.at(i), Some(b'e' | b'E')) {
            let sign = usize::from(matches!(self.at(i + 1), Some(b'+' | b'-')));
            if self.at(i + 1 + sign).is_some_and(|d| d.is_ascii_digit()) {
                i = digits(i + 1 + sign);
            }
        }
        i
    }

    /// A run of operator characters, cut before a comment start as the
    /// server's scanner cuts it.
    fn operator(&self, start: usize) -> usize {
        let mut i = start;
        while let Some(b) = self.at(i) {
            if !is_op_char(b) {
                break;
            }
            let n = self.at(i + 1);
            if i > start && ((b == b'-' && n == Some(b'-')) || (b == b'/' && n == Some(b'*'))) {
                break;
            }
            i += 1;
        }
        i
    }

    /// An identifier, or one of the prefixed literals `E'`, `B'`, `X'`, `N'`,
    /// `U&'` and `U&"`.
    fn word(&mut self, start: usize) -> Result<(Kind, usize), LexError> {
        let b = self.at(start).unwrap_or(0).to_ascii_lowercase();
        let n1 = self.at(start + 1);
        match (b, n1) {
            (b'e', Some(b'\'')) => return self.string(start + 2, Strings::Escaped),
            (b'b' | b'x', Some(b'\'')) => return self.literal_string(start + 2),
            (b'n', Some(b'\'')) => return self.string(start + 2, self.mode),
            (b'u', Some(b'&')) => match self.at(start + 2) {
                Some(b'\'') => return self.literal_string(start + 3),
                Some(b'"') => return self.quoted_ident(start + 3),
                _ => {}
            },
            _ => {}
        }
        let mut i = start + 1;
        while self.at(i).is_some_and(is_ident_cont) {
            i += 1;
        }
        Ok((Kind::Ident, i))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(s: &str) -> Result<Vec<(Kind, String)>, LexError> {
        let mut l = Lexer::new(s.as_bytes(), Strings::Standard);
        let mut out = Vec::new();
        while let Some(t) = l.next_token() {
            let t = t?;
            let text = String::from_utf8_lossy(&s.as_bytes()[t.start as usize..t.end as usize]);
            out.push((t.kind, text.into_owned()));
        }
        Ok(out)
    }

    fn only(s: &str) -> Kind {
        let k = kinds(s).expect("lexes");
        assert_eq!(k.len(), 1, "{s}: {k:?}");
        k[0].0
    }

    #[test]
    fn strings() {
        assert_eq!(only("'it''s'"), Kind::String);
        assert_eq!(only("E'it\\'s'"), Kind::String);
        assert_eq!(only("e'a\\\\'"), Kind::String);
        assert_eq!(only("B'0101'"), Kind::String);
        assert_eq!(only("X'ff'"), Kind::String);
        assert_eq!(only("N'abc'"), Kind::String);
        assert_eq!(only("U&'d\\0061t'"), Kind::String);
        assert_eq!(only("'a\\'"), Kind::String);
        assert_eq!(kinds("'abc").unwrap_err(), LexError::Unterminated);
        assert_eq!(kinds("E'abc\\'").unwrap_err(), LexError::Unterminated);
    }

    #[test]
    fn identifiers() {
        assert_eq!(only("\"a\"\"b\""), Kind::QuotedIdent);
        assert_eq!(only("U&\"d\\0061t\""), Kind::QuotedIdent);
        assert_eq!(only("a$b$"), Kind::Ident);
        assert_eq!(only("ident_1"), Kind::Ident);
        assert_eq!(only("é"), Kind::Ident);
        assert_eq!(kinds("\"\"").unwrap_err(), LexError::Invalid);
        assert_eq!(kinds("\"abc").unwrap_err(), LexError::Unterminated);
        // `E` followed by something else is an identifier.
        assert_eq!(only("e"), Kind::Ident);
        assert_eq!(only("Ex"), Kind::Ident);
    }

    #[test]
    fn dollar_quotes() {
        assert_eq!(only("$$ ; delete $$"), Kind::String);
        assert_eq!(only("$a$ $$ $b$ $a$"), Kind::String);
        assert_eq!(only("$a$x$ab$a$"), Kind::String);
        assert_eq!(only("$1"), Kind::Param);
        assert_eq!(kinds("$a$ x").unwrap_err(), LexError::Unterminated);
        assert_eq!(kinds("$ x").unwrap_err(), LexError::Invalid);
        assert_eq!(kinds("$a x").unwrap_err(), LexError::Invalid);
    }

    #[test]
    fn comments() {
        assert_eq!(only("/* a /* b */ c */"), Kind::Comment);
        assert_eq!(only("/**/"), Kind::Comment);
        assert_eq!(only("-- x"), Kind::Comment);
        assert_eq!(kinds("/* /* */").unwrap_err(), LexError::Unterminated);
        assert_eq!(kinds("/*/").unwrap_err(), LexError::Unterminated);
        let k = kinds("a+/*x*/b").expect("lexes");
        assert_eq!(k[1], (Kind::Op, "+".to_owned()));
        assert_eq!(k[2].0, Kind::Comment);
        let k = kinds("a*--x\nb").expect("lexes");
        assert_eq!(k[1], (Kind::Op, "*".to_owned()));
        assert_eq!(k[3], (Kind::Ident, "b".to_owned()));
    }

    #[test]
    fn numbers_and_punctuation() {
        let k = kinds("1.5e-3 .5 1..2 1into x::int a[1:2]").expect("lexes");
        let texts: Vec<_> = k.iter().map(|(_, t)| t.as_str()).collect();
        assert_eq!(
            texts,
            [
                "1.5e-3", ".5", "1", ".", ".2", "1", "into", "x", "::", "int", "a", "[", "1", ":",
                "2", "]"
            ]
        );
        assert_eq!(kinds("\\x").unwrap_err(), LexError::Invalid);
        assert_eq!(kinds("{").unwrap_err(), LexError::Invalid);
        assert_eq!(kinds("\0").unwrap_err(), LexError::Invalid);
    }

    #[test]
    fn flags() {
        let mut l = Lexer::new(b"select 'a\\' , E'b'", Strings::Standard);
        while let Some(Ok(_)) = l.next_token() {}
        assert!(l.plain_backslash);
        assert!(!l.ambiguous);
        let mut l = Lexer::new(b"select E'\x81\\' ; x'", Strings::Standard);
        while let Some(Ok(_)) = l.next_token() {}
        assert!(l.ambiguous);
        let mut l = Lexer::new(b"select B'\\', U&'\\0041'", Strings::Standard);
        while let Some(Ok(_)) = l.next_token() {}
        assert!(!l.plain_backslash);
    }
}
