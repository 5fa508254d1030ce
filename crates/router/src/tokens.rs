//! The token list the rules work on: comments dropped, parentheses paired,
//! statements found at top-level semicolons, plus the small questions the
//! rules keep asking of a token (which keyword is it, what name does it spell
//! once folded the way PostgreSQL folds names).

use crate::keywords::{Category, KEYWORDS};
use crate::lexer::{Kind, Lexer, NOT_KEYWORD, Strings, Token};

/// PostgreSQL truncates identifiers to 63 bytes (NAMEDATALEN - 1); a longer
/// one may name something other than what its full text says, so it is never
/// trusted as a function name.
pub(crate) const MAX_NAME: usize = 63;

pub(crate) struct Tokens<'a> {
    s: &'a [u8],
    toks: Vec<Token>,
    /// Some plain string held a backslash (see [`Lexer::plain_backslash`]).
    pub plain_backslash: bool,
}

impl<'a> Tokens<'a> {
    /// Tokenizes `s`, or `None` if the text cannot be trusted: it does not
    /// tokenize, it may tokenize differently in another client encoding, a
    /// parenthesis is unbalanced or a `;` sits inside parentheses (the
    /// server would reject all of these before running anything).
    pub(crate) fn new(s: &'a [u8], mode: Strings) -> Option<Self> {
        if u32::try_from(s.len()).is_err() {
            return None;
        }
        let mut lexer = Lexer::new(s, mode);
        let mut toks: Vec<Token> = Vec::with_capacity((s.len() / 3).clamp(8, 4096));
        let mut open: Vec<u32> = Vec::new();
        while let Some(t) = lexer.next_token() {
            let mut t = t.ok()?;
            // Fits: there are fewer tokens than bytes.
            let here = toks.len() as u32;
            match t.kind {
                Kind::Comment => continue,
                Kind::LParen => open.push(here),
                Kind::RParen => {
                    let o = open.pop()?;
                    t.aux = o;
                    toks.get_mut(o as usize)?.aux = here;
                }
                Kind::Semicolon if !open.is_empty() => return None,
                _ => {}
            }
            toks.push(t);
        }
        if !open.is_empty() || lexer.ambiguous {
            return None;
        }
        Some(Tokens {
            s,
            toks,
            plain_backslash: lexer.plain_backslash,
        })
    }

    /// `(start, end)` token ranges of the statements, empty ones included.
    pub(crate) fn statements(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        let n = self.toks.len();
        let mut lo = 0;
        std::iter::from_fn(move || {
            if lo > n {
                return None;
            }
            let mut hi = lo;
            while hi < n && self.kind(hi) != Some(Kind::Semicolon) {
                hi += 1;
            }
            let range = (lo, hi);
            lo = hi + 1;
            Some(range)
        })
    }

    pub(crate) fn kind(&self, i: usize) -> Option<Kind> {
        self.toks.get(i).map(|t| t.kind)
    }

    pub(crate) fn text(&self, i: usize) -> &'a [u8] {
        self.toks
            .get(i)
            .and_then(|t| self.s.get(t.start as usize..t.end as usize))
            .unwrap_or_default()
    }

    /// The keyword an unquoted identifier spells, in lower case.
    pub(crate) fn kw(&self, i: usize) -> Option<&'static str> {
        self.keyword(i).map(|k| k.0)
    }

    pub(crate) fn category(&self, i: usize) -> Option<Category> {
        self.keyword(i).map(|k| k.1)
    }

    fn keyword(&self, i: usize) -> Option<(&'static str, Category)> {
        let t = self.toks.get(i)?;
        if t.kind != Kind::Ident || t.aux == NOT_KEYWORD {
            return None;
        }
        KEYWORDS.get(t.aux as usize).copied()
    }

    pub(crate) fn is(&self, i: usize, word: &str) -> bool {
        self.kw(i) == Some(word)
    }

    pub(crate) fn is_any(&self, i: usize, words: &[&str]) -> bool {
        self.kw(i).is_some_and(|k| words.contains(&k))
    }

    /// The partner of the parenthesis at `i` (itself if `i` is none).
    pub(crate) fn pair(&self, i: usize) -> usize {
        match self.toks.get(i) {
            Some(t) if matches!(t.kind, Kind::LParen | Kind::RParen) => t.aux as usize,
            _ => i,
        }
    }

    /// An identifier, quoted or not.
    pub(crate) fn is_name(&self, i: usize) -> bool {
        matches!(self.kind(i), Some(Kind::Ident | Kind::QuotedIdent))
    }

    /// The name token `i` spells as PostgreSQL resolves it: unquoted text
    /// folded to lower case (ASCII, as for UTF-8 databases), quoted text with
    /// `""` undone. `None` for a `U&"…"` name or one longer than 63 bytes.
    pub(crate) fn name<'b>(&self, i: usize, buf: &'b mut [u8; MAX_NAME]) -> Option<&'b [u8]> {
        let text = self.text(i);
        let mut n = 0;
        let mut push = |b: u8, n: &mut usize| -> Option<()> {
            *buf.get_mut(*n)? = b;
            *n += 1;
            Some(())
        };
        match self.kind(i)? {
            Kind::Ident => {
                for &b in text {
                    push(b.to_ascii_lowercase(), &mut n)?;
                }
            }
            Kind::QuotedIdent => {
                let body = text.strip_prefix(b"\"")?.strip_suffix(b"\"")?;
                let mut quote = false;
                for &b in body {
                    if b == b'"' && !quote {
                        quote = true;
                        continue;
                    }
                    quote = false;
                    push(b, &mut n)?;
                }
            }
            _ => return None,
        }
        buf.get(..n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(s: &str) -> Option<Tokens<'_>> {
        Tokens::new(s.as_bytes(), Strings::Standard)
    }

    #[test]
    fn statements_and_pairs() {
        let t = toks("select (1) ; ; select 2;").expect("tokenizes");
        let st: Vec<_> = t.statements().collect();
        assert_eq!(st, [(0, 4), (5, 5), (6, 8), (9, 9)]);
        assert_eq!(t.pair(1), 3);
        assert_eq!(t.pair(3), 1);
        assert_eq!(t.pair(0), 0);
        let empty = toks("").expect("tokenizes");
        assert_eq!(empty.statements().collect::<Vec<_>>(), [(0, 0)]);
    }

    #[test]
    fn rejects_what_the_server_rejects() {
        assert!(toks("select (1").is_none());
        assert!(toks("select 1)").is_none());
        assert!(toks("select (1; 2)").is_none());
        assert!(toks("select '").is_none());
        assert!(toks("select E'\u{e9}\\'").is_none());
    }

    #[test]
    fn names() {
        let t = toks("LoWer \"Lo\"\"W\" U&\"x\"").expect("tokenizes");
        let mut buf = [0; MAX_NAME];
        assert_eq!(t.name(0, &mut buf), Some(&b"lower"[..]));
        assert_eq!(t.name(1, &mut buf), Some(&b"Lo\"W"[..]));
        assert_eq!(t.name(2, &mut buf), None);
        let long = "a".repeat(64);
        let t = toks(&long).expect("tokenizes");
        assert_eq!(t.name(0, &mut buf), None);
        let ok = "a".repeat(63);
        let t = toks(&ok).expect("tokenizes");
        assert_eq!(t.name(0, &mut buf).map(<[u8]>::len), Some(63));
    }
}
