//! The routing rules: which statements are reads a hot standby runs exactly as
//! the primary would, and how a string of statements combines. Every rule
//! answers "read" only on positive evidence; anything it does not recognise
//! is a write.

use std::collections::HashSet;

use crate::Classifier;
use crate::keywords::Category;
use crate::lexer::{Kind, Strings};
use crate::tokens::{MAX_NAME, Tokens};

/// Whether every statement of `sql` may run on a replica.
pub(crate) fn is_read_only(c: &Classifier, sql: &[u8]) -> bool {
    let Some(t) = Tokens::new(sql, Strings::Standard) else {
        return false;
    };
    if !(Rules { c, t: &t }).all_reads() {
        return false;
    }
    if !t.plain_backslash {
        return true;
    }
    // With standard_conforming_strings off a backslash in '…' escapes the
    // next character, which moves where strings end; the text must be read
    // only either way.
    let Some(t) = Tokens::new(sql, Strings::Escaped) else {
        return false;
    };
    Rules { c, t: &t }.all_reads()
}

/// Whether `sql` is exactly one statement starting a read-only transaction.
pub(crate) fn begins_read_only(sql: &[u8]) -> bool {
    let Some(t) = Tokens::new(sql, Strings::Standard) else {
        return false;
    };
    let mut statements = t.statements().filter(|(lo, hi)| lo < hi);
    match (statements.next(), statements.next()) {
        (Some((lo, hi)), None) => begin_is_read_only(&t, lo, hi) == Some(true),
        _ => false,
    }
}

/// `BEGIN …` or `START TRANSACTION …`: `Some(true)` if it declares the
/// transaction read only, `Some(false)` if it is a valid start that does not,
/// `None` if it is not a transaction start this parser understands.
fn begin_is_read_only(t: &Tokens, lo: usize, hi: usize) -> Option<bool> {
    let i = match t.kw(lo)? {
        "begin" if t.is_any(lo + 1, &["work", "transaction"]) => lo + 2,
        "begin" => lo + 1,
        "start" if t.is(lo + 1, "transaction") => lo + 2,
        _ => return None,
    };
    transaction_modes(t, i, hi, true)
}

/// A transaction mode list. Read only means READ ONLY without READ WRITE
/// (PostgreSQL applies the modes in order, so a later one wins) and without
/// SERIALIZABLE, which a hot standby refuses ("cannot use serializable mode
/// in a hot standby").
fn transaction_modes(t: &Tokens, mut i: usize, hi: usize, may_be_empty: bool) -> Option<bool> {
    if i >= hi && !may_be_empty {
        return None;
    }
    let (mut read_only, mut read_write, mut serializable) = (false, false, false);
    while i < hi {
        match t.kw(i)? {
            "isolation" if t.is(i + 1, "level") => {
                i += 2;
                match t.kw(i)? {
                    "serializable" => {
                        serializable = true;
                        i += 1;
                    }
                    "repeatable" if t.is(i + 1, "read") => i += 2,
                    "read" if t.is_any(i + 1, &["committed", "uncommitted"]) => i += 2,
                    _ => return None,
                }
            }
            "read" if t.is(i + 1, "only") => {
                read_only = true;
                i += 2;
            }
            "read" if t.is(i + 1, "write") => {
                read_write = true;
                i += 2;
            }
            "deferrable" => i += 1,
            "not" if t.is(i + 1, "deferrable") => i += 2,
            _ => return None,
        }
        if i < hi && t.kind(i) == Some(Kind::Comma) {
            i += 1;
            if i >= hi {
                return None;
            }
        }
    }
    Some(read_only && !read_write && !serializable)
}

/// How a `COMMIT`/`END`/`ROLLBACK`/`ABORT` statement ends.
#[derive(PartialEq, Eq)]
enum Ending {
    /// Ends the transaction block.
    Block,
    /// `ROLLBACK TO SAVEPOINT x`: stays in the block.
    ToSavepoint,
}

fn ending(t: &Tokens, lo: usize, hi: usize) -> Option<Ending> {
    let mut i = lo + 1;
    if t.is_any(i, &["work", "transaction"]) {
        i += 1;
    }
    if i >= hi {
        return Some(Ending::Block);
    }
    if t.is(lo, "rollback") && t.is(i, "to") {
        i += 1;
        if t.is(i, "savepoint") {
            i += 1;
        }
        return (t.is_name(i) && i + 1 == hi).then_some(Ending::ToSavepoint);
    }
    // AND NO CHAIN is a plain end; AND CHAIN starts another transaction whose
    // characteristics this module does not track, and COMMIT PREPARED needs
    // the primary.
    (t.is(i, "and") && t.is(i + 1, "no") && t.is(i + 2, "chain") && i + 3 == hi)
        .then_some(Ending::Block)
}

/// A cursor's name as PostgreSQL would store it.
fn cursor_name(t: &Tokens, i: usize) -> Option<Vec<u8>> {
    let mut buf = [0u8; MAX_NAME];
    t.name(i, &mut buf).map(<[u8]>::to_vec)
}

struct Rules<'t, 'a> {
    c: &'t Classifier,
    t: &'t Tokens<'a>,
}

impl Rules<'_, '_> {
    fn all_reads(&self) -> bool {
        let t = self.t;
        // Inside a transaction this string opened with BEGIN READ ONLY.
        let mut read_only_block = false;
        // Cursors this string declared: fetching from any other cursor needs
        // the server that holds it (a WITH HOLD cursor on the primary).
        let mut cursors: HashSet<Vec<u8>> = HashSet::new();
        let mut any = false;
        for (lo, hi) in t.statements() {
            if lo == hi {
                continue;
            }
            any = true;
            let read = match t.kw(lo) {
                Some("begin" | "start") => {
                    let ro = begin_is_read_only(t, lo, hi) == Some(true);
                    read_only_block |= ro;
                    ro
                }
                Some("commit" | "end" | "abort" | "rollback") => match ending(t, lo, hi) {
                    Some(Ending::Block) if read_only_block => {
                        read_only_block = false;
                        true
                    }
                    Some(Ending::ToSavepoint) => read_only_block,
                    _ => false,
                },
                Some("savepoint") => read_only_block && t.is_name(lo + 1) && lo + 2 == hi,
                Some("release") => {
                    let i = if t.is(lo + 1, "savepoint") {
                        lo + 2
                    } else {
                        lo + 1
                    };
                    read_only_block && t.is_name(i) && i + 1 == hi
                }
                Some("set") => {
                    t.is(lo + 1, "transaction")
                        && transaction_modes(t, lo + 2, hi, false) == Some(true)
                }
                Some("declare") => match self.declare(lo, hi) {
                    Some(name) => {
                        cursors.insert(name);
                        true
                    }
                    None => false,
                },
                Some("fetch" | "move") => {
                    hi - lo >= 2 && cursor_name(t, hi - 1).is_some_and(|n| cursors.contains(&n))
                }
                Some("close") => {
                    hi - lo == 2
                        && !t.is(lo + 1, "all")
                        && cursor_name(t, lo + 1).is_some_and(|n| cursors.contains(&n))
                }
                _ => self.statement_is_read(lo, hi),
            };
            if !read {
                return false;
            }
        }
        any
    }

    /// A statement outside transaction control and cursors.
    fn statement_is_read(&self, lo: usize, hi: usize) -> bool {
        let t = self.t;
        if self.starts_query(lo) {
            return self.query_is_read(lo, hi);
        }
        match t.kw(lo) {
            // (`SHOW transaction_read_only` asks whether the server is a
            // standby: sluice presents one writable database, it reports
            // in_hot_standby off, so the primary answers; a driver asked
            // for read-write, pgx's target_session_attrs, checks exactly
            // this, and a replica's `on` made it refuse the connection)
            Some("show") => {
                let name = t.text(lo + 1);
                let name = name
                    .strip_prefix(b"\"")
                    .and_then(|n| n.strip_suffix(b"\""))
                    .unwrap_or(name);
                !(name.eq_ignore_ascii_case(b"transaction_read_only")
                    || name.eq_ignore_ascii_case(b"in_hot_standby"))
            }
            Some("explain") => self.explain_is_read(lo, hi),
            Some("copy") => self.copy_is_read(lo, hi),
            _ => false,
        }
    }

    /// SELECT, VALUES, TABLE, WITH or a parenthesised query.
    fn starts_query(&self, i: usize) -> bool {
        self.t.kind(i) == Some(Kind::LParen)
            || self.t.is_any(i, &["select", "values", "table", "with"])
    }

    /// `DECLARE name … CURSOR [WITHOUT HOLD] FOR <read>`: the cursor's name.
    fn declare(&self, lo: usize, hi: usize) -> Option<Vec<u8>> {
        let t = self.t;
        let name = cursor_name(t, lo + 1)?;
        let mut i = lo + 2;
        loop {
            if t.is_any(i, &["binary", "insensitive", "asensitive", "scroll"]) {
                i += 1;
            } else if t.is(i, "no") && t.is(i + 1, "scroll") {
                i += 2;
            } else {
                break;
            }
        }
        if !t.is(i, "cursor") {
            return None;
        }
        i += 1;
        if t.is(i, "without") && t.is(i + 1, "hold") {
            i += 2;
        }
        (t.is(i, "for") && self.starts_query(i + 1) && self.query_is_read(i + 1, hi))
            .then_some(name)
    }

    /// EXPLAIN without ANALYZE runs nothing, so it is a read whatever it
    /// explains (of the statements EXPLAIN accepts that need no session
    /// state); with ANALYZE it runs its statement, which must be a read.
    fn explain_is_read(&self, lo: usize, hi: usize) -> bool {
        let t = self.t;
        let mut i = lo + 1;
        let mut analyze = false;
        if t.kind(i) == Some(Kind::LParen) && !self.starts_query(i + 1) {
            let close = t.pair(i);
            let mut j = i + 1;
            while j < close {
                let mut k = j;
                while k < close && t.kind(k) != Some(Kind::Comma) {
                    k = t.pair(k).max(k) + 1;
                }
                // Option names are matched by their folded text, so a quoted
                // "analyze" counts too.
                let mut buf = [0u8; MAX_NAME];
                let name = t.name(j, &mut buf);
                if matches!(name, Some(b"analyze" | b"analyse")) && !self.is_false(j + 1, k) {
                    analyze = true;
                }
                j = k + 1;
            }
            i = close.max(i) + 1;
        } else {
            while t.is_any(i, &["analyze", "analyse", "verbose"]) {
                analyze |= !t.is(i, "verbose");
                i += 1;
            }
        }
        if i >= hi {
            return false;
        }
        if analyze {
            self.starts_query(i) && self.query_is_read(i, hi)
        } else {
            self.starts_query(i) || t.is_any(i, &["insert", "update", "delete", "merge", "declare"])
        }
    }

    /// An EXPLAIN option value turning the option off.
    fn is_false(&self, lo: usize, hi: usize) -> bool {
        let t = self.t;
        if hi != lo + 1 {
            return false;
        }
        match t.kind(lo) {
            Some(Kind::Ident) => t.is_any(lo, &["false", "off"]),
            Some(Kind::Number) => t.text(lo) == b"0",
            Some(Kind::String) => ["'false'", "'off'", "'0'"]
                .iter()
                .any(|v| t.text(lo).eq_ignore_ascii_case(v.as_bytes())),
            _ => false,
        }
    }

    /// `COPY table [(cols)] TO STDOUT …` or `COPY (<read>) TO STDOUT …`.
    /// COPY TO a file or program writes on the server it runs on, so only
    /// STDOUT counts.
    fn copy_is_read(&self, lo: usize, _hi: usize) -> bool {
        let t = self.t;
        let mut i = lo + 1;
        if t.is(i, "binary") {
            i += 1;
        }
        if t.kind(i) == Some(Kind::LParen) {
            let close = t.pair(i);
            if close <= i || !self.starts_query(i + 1) || !self.query_is_read(i + 1, close) {
                return false;
            }
            i = close + 1;
        } else {
            if !t.is_name(i) {
                return false;
            }
            i += 1;
            while t.kind(i) == Some(Kind::Dot) && t.is_name(i + 1) {
                i += 2;
            }
            if t.kind(i) == Some(Kind::LParen) {
                i = t.pair(i).max(i) + 1;
            }
        }
        // The options after STDOUT are constants and column names only.
        t.is(i, "to") && t.is(i + 1, "stdout")
    }

    /// A query (or the query part of DECLARE, EXPLAIN ANALYZE, COPY) reads
    /// only if it has no INTO, no data-modifying statement (in a CTE,
    /// however nested), no row-locking clause and calls only trusted
    /// functions.
    fn query_is_read(&self, lo: usize, hi: usize) -> bool {
        let t = self.t;
        for i in lo..hi {
            // After `.` or AS a keyword is only a name (`t.update`, `AS into`).
            let label = i > lo && (t.kind(i - 1) == Some(Kind::Dot) || t.is(i - 1, "as"));
            if !label {
                match t.kw(i) {
                    Some("into" | "insert" | "update" | "delete" | "merge") => return false,
                    Some("for") if t.is_any(i + 1, &["update", "share", "no", "key"]) => {
                        return false;
                    }
                    _ => {}
                }
            }
            if t.is_name(i)
                && t.kind(i + 1) == Some(Kind::LParen)
                && !self.call_is_trusted(lo, i, hi)
            {
                return false;
            }
        }
        true
    }

    /// The name ending at token `i` is followed by `(`. True if that is no
    /// function call at all (syntax, a type modifier, an alias's column
    /// list, a CTE's column list) or a call of a trusted function.
    fn call_is_trusted(&self, lo: usize, i: usize, hi: usize) -> bool {
        let t = self.t;
        let mut first = i;
        let mut parts = 1;
        while first >= lo + 2 && t.kind(first - 1) == Some(Kind::Dot) && t.is_name(first - 2) {
            first -= 2;
            parts += 1;
        }
        let before = (first > lo).then(|| first - 1);
        // `x::name(…)` and `CAST(x AS name(…))` are type modifiers, `AS
        // name(…)` an alias's column list.
        if let Some(b) = before
            && (t.kind(b) == Some(Kind::Cast) || t.is(b, "as"))
        {
            return true;
        }
        let mut buf = [0u8; MAX_NAME];
        match parts {
            1 => {
                if t.kind(i) == Some(Kind::Ident) && self.unqualified_syntax(i, before) {
                    return true;
                }
                if before.is_some_and(|b| self.is_alias_position(b)) || self.is_cte_name(i, hi) {
                    return true;
                }
                t.name(i, &mut buf).is_some_and(|n| self.c.trusts(None, n))
            }
            2 => {
                let mut schema = [0u8; MAX_NAME];
                match (t.name(first, &mut schema), t.name(i, &mut buf)) {
                    (Some(s), Some(n)) => self.c.trusts(Some(s), n),
                    _ => false,
                }
            }
            _ => false,
        }
    }

    /// An unquoted word followed by `(` that is syntax rather than a call.
    fn unqualified_syntax(&self, i: usize, before: Option<usize>) -> bool {
        let t = self.t;
        let after = |words: &[&str]| before.is_some_and(|b| t.is_any(b, words));
        // The word two before `i`, when `before` is `word`.
        let after_pair = |word: &str, words: &[&str]| {
            before.is_some_and(|b| b > 0 && t.is(b, word) && t.is_any(b - 1, words))
        };
        let after_operand = before.is_some_and(|b| self.ends_operand(b));
        match t.category(i) {
            // Reserved and column-name keywords can never name a function
            // unqualified: `IN (`, `EXISTS (`, `CAST(`, `numeric(10,2)`.
            Some(Category::Reserved | Category::ColName) => true,
            // These may name a user's function (`WHERE NOT like(x)` calls
            // one), but after an operand they are infix: `x NOT LIKE (…)`,
            // `t JOIN (…)`, `(a, b) OVERLAPS (…)`.
            Some(Category::TypeFunc) => match t.kw(i) {
                Some("like" | "ilike" | "similar") => {
                    after_operand
                        || before
                            .is_some_and(|b| b > 0 && t.is(b, "not") && self.ends_operand(b - 1))
                }
                Some("join" | "overlaps") => after_operand,
                _ => false,
            },
            _ => match t.kw(i) {
                Some("varying") => after(&["character", "char", "nchar", "bit"]),
                // `INTERVAL second(3)`, `DAY TO SECOND(3)`; `x SIMILAR TO
                // second(y)` would be a call.
                Some("second") => {
                    after(&["interval"])
                        || after_pair("to", &["year", "month", "day", "hour", "minute"])
                }
                Some("sets") => after(&["grouping"]),
                Some("materialized") => after_pair("not", &["as"]),
                Some("by") => after(&["group", "order", "partition"]),
                Some("zone") => after_pair("time", &["at"]),
                Some("first" | "next") => after(&["fetch"]),
                Some("operator") => self.is_operator_name(i + 1),
                _ => false,
            },
        }
    }

    /// `OPERATOR(schema.op)`: `(` at `open`, then `name .`… then an operator.
    fn is_operator_name(&self, open: usize) -> bool {
        let t = self.t;
        let close = t.pair(open);
        let mut k = open + 1;
        while t.is_name(k) && t.kind(k + 1) == Some(Kind::Dot) {
            k += 2;
        }
        t.kind(k) == Some(Kind::Op) && k + 1 == close
    }

    /// Whether the token at `b` ends an operand, so that a word after it can
    /// only be an infix keyword or an alias.
    fn ends_operand(&self, b: usize) -> bool {
        let t = self.t;
        match t.kind(b) {
            Some(Kind::Ident) => t.category(b) != Some(Category::Reserved),
            Some(
                Kind::QuotedIdent | Kind::String | Kind::Number | Kind::Param | Kind::RBracket,
            ) => true,
            Some(Kind::RParen) => true,
            _ => false,
        }
    }

    /// After a complete operand (a closing parenthesis, a literal, a name that
    /// is no keyword) a plain word can only be an alias: `generate_series(1,
    /// 3) g(i)`, `FROM t x(a, b)`, `WITH ORDINALITY u(x, n)`. The exception is
    /// `OPERATOR(…)`, which is followed by an operand.
    fn is_alias_position(&self, b: usize) -> bool {
        let t = self.t;
        match t.kind(b) {
            Some(Kind::RParen) => {
                let open = t.pair(b);
                !(open > 0 && open < b && t.is(open - 1, "operator"))
            }
            Some(Kind::String | Kind::Number | Kind::Param | Kind::QuotedIdent) => true,
            Some(Kind::Ident) => t.kw(b).is_none() || t.is(b, "ordinality"),
            _ => false,
        }
    }

    /// `name(cols) AS [NOT] [MATERIALIZED] (<statement>`: a CTE with a column
    /// list. A function's column definition list (`f() AS (a int)`) cannot
    /// start with these words.
    fn is_cte_name(&self, i: usize, hi: usize) -> bool {
        let t = self.t;
        let close = t.pair(i + 1);
        if close <= i + 1 {
            return false;
        }
        let mut k = close + 1;
        if !t.is(k, "as") {
            return false;
        }
        k += 1;
        if t.is(k, "not") {
            k += 1;
        }
        if t.is(k, "materialized") {
            k += 1;
        }
        if t.kind(k) != Some(Kind::LParen) || k + 1 >= hi {
            return false;
        }
        let body = k + 1;
        t.kind(body) == Some(Kind::LParen)
            || t.is_any(
                body,
                &[
                    "select", "with", "table", "insert", "update", "delete", "merge",
                ],
            )
            || (t.is(body, "values") && t.kind(body + 1) == Some(Kind::LParen))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &str) -> bool {
        begins_read_only(s.as_bytes())
    }

    #[test]
    fn read_only_starts() {
        assert!(b("BEGIN READ ONLY"));
        assert!(b("begin read only;"));
        assert!(b("begin transaction read only"));
        assert!(b("BEGIN WORK READ ONLY"));
        assert!(b(
            "BEGIN TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY"
        ));
        assert!(b("begin read only isolation level repeatable read"));
        assert!(b(
            "begin read only, isolation level read committed, deferrable"
        ));
        assert!(b(
            "begin isolation level read uncommitted not deferrable read only"
        ));
        assert!(b("START TRANSACTION READ ONLY"));
        assert!(b(
            "start transaction isolation level repeatable read, read only"
        ));
        assert!(b("/* sluice: replica */ begin read only -- go\n"));
        assert!(b(" ; begin read only ;; "));
    }

    #[test]
    fn not_read_only_starts() {
        assert!(!b(""));
        assert!(!b("begin"));
        assert!(!b("BEGIN;"));
        assert!(!b("start transaction"));
        assert!(!b("begin read write"));
        assert!(!b("begin isolation level repeatable read"));
        assert!(!b("begin read only read write"));
        assert!(!b("begin read write, read only, read write"));
        assert!(!b(
            "begin isolation level serializable read only deferrable"
        ));
        assert!(!b("begin read only; select 1"));
        assert!(!b("begin read only; commit; delete from t"));
        assert!(!b("select 1"));
        assert!(!b("set transaction read only"));
        assert!(!b("begin read only,"));
        assert!(!b("begin read"));
        assert!(!b("begin only"));
        assert!(!b("begin read only extra"));
        assert!(!b("begin isolation level"));
        assert!(!b("begin transaction transaction read only"));
        assert!(!b("start read only"));
        assert!(!b("begin read only 'x"));
        assert!(!b("begin \"read\" only"));
        assert!(!b("commit"));
    }

    #[test]
    fn modes_are_validated() {
        let t = Tokens::new(b"read only, read only", Strings::Standard).expect("tokenizes");
        assert_eq!(transaction_modes(&t, 0, 5, false), Some(true));
        let t = Tokens::new(b"", Strings::Standard).expect("tokenizes");
        assert_eq!(transaction_modes(&t, 0, 0, false), None);
        assert_eq!(transaction_modes(&t, 0, 0, true), Some(false));
    }
}
