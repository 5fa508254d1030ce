//! Read/write routing for sluice: decides from SQL text alone whether a
//! transaction may run on a read-only hot-standby replica. It fails closed:
//! only text proven read-only goes to a replica, so that the standby never
//! answers 25006 ("cannot execute … in a read-only transaction") where the
//! primary would have succeeded, and nothing that must reach the primary
//! (a write, a lock, a sequence step, a notification) is lost.
//!
//! The crate is pure (no I/O, no global state but two read-only tables) and
//! linear in the length of the text. A real tokenizer hides keywords inside
//! strings, quoted identifiers, dollar quotes and comments; see `README.md`
//! for the rules and for what text alone cannot prove.
//!
//! Cost, measured with `cargo run --release -p sluice-router --example cost`
//! on a 2-core AMD EPYC VM: about 1,370 ns per statement over the whole test
//! corpus (489 texts, including 20 kB ones; about 4 ns per byte), 450 ns per
//! corpus text of up to 200 bytes, 390 ns for an 81-byte ORM `SELECT … WHERE
//! id = $1 LIMIT $2`; `hint` alone about 160 ns per short text.

mod classify;
mod functions;
mod hint;
mod keywords;
mod lexer;
mod tokens;

use std::collections::HashSet;

/// Where a transaction goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Route {
    Primary,
    Replica,
}

/// Classifies SQL text with a built-in list of functions known not to write.
#[derive(Debug, Clone, Default)]
pub struct Classifier {
    /// Extra read-only function names: `name` (also matching
    /// `pg_catalog.name`) or `schema.name`, stored as given.
    extra: HashSet<String>,
}

impl Classifier {
    /// Adds function names known read-only (e.g. learnt from pg_proc:
    /// provolatile in ('i','s') ... ) to the built-in list.
    ///
    /// A name is `name` or `schema.name` (a `pg_catalog.` prefix is dropped).
    /// Names are matched the way PostgreSQL resolves them: an unquoted name in
    /// the SQL is folded to lower case before the comparison, a quoted one is
    /// compared as written, so pass `pg_proc.proname` as stored. An
    /// unqualified entry matches unqualified calls only; `public.f` matches
    /// only `public.f(`.
    pub fn with_read_only_functions(mut self, names: impl IntoIterator<Item = String>) -> Self {
        for name in names {
            let name = name.trim();
            let name = name.strip_prefix("pg_catalog.").unwrap_or(name);
            if !name.is_empty() {
                self.extra.insert(name.to_owned());
            }
        }
        self
    }

    /// A whole simple-Query string (zero or more statements separated by
    /// ';'). Replica only if EVERY statement is a read (see rules) — an empty
    /// string is Replica-neutral: return Primary for empty/only-comments text.
    pub fn classify(&self, sql: &[u8]) -> Route {
        if classify::is_read_only(self, sql) {
            Route::Replica
        } else {
            Route::Primary
        }
    }

    /// Whether a call of `schema.name` (`schema` absent for an unqualified
    /// call) may run on a replica. Both are folded already.
    fn trusts(&self, schema: Option<&[u8]>, name: &[u8]) -> bool {
        let builtin_scope = match schema {
            None => true,
            Some(s) => s == b"pg_catalog",
        };
        if builtin_scope {
            return functions::is_builtin(name)
                || std::str::from_utf8(name).is_ok_and(|n| self.extra.contains(n));
        }
        if self.extra.is_empty() {
            return false;
        }
        let (Some(s), Ok(n)) = (schema, std::str::from_utf8(name)) else {
            return false;
        };
        std::str::from_utf8(s).is_ok_and(|s| self.extra.contains(&format!("{s}.{n}")))
    }
}

/// A routing hint in a comment anywhere in the text: `/* sluice: primary */`
/// or `/* sluice: replica */` (case-insensitive, spaces optional around ':',
/// also `-- sluice: replica` line comments). None if absent.
///
/// Text inside strings is no comment. If both hints appear, primary wins; a
/// replica hint in text that does not tokenize (an unterminated quote) is
/// ignored.
pub fn hint(sql: &[u8]) -> Option<Route> {
    hint::find(sql)
}

/// Whether the text is exactly a transaction start that declares READ ONLY
/// (`BEGIN READ ONLY`, `BEGIN TRANSACTION ISOLATION LEVEL REPEATABLE READ READ
/// ONLY`, `START TRANSACTION READ ONLY`, with any option order) — such a
/// transaction may go to a replica whatever follows, since PostgreSQL itself
/// refuses writes in it.
///
/// Exactly one statement (comments and empty statements aside). False when
/// READ WRITE also appears (the later mode wins in PostgreSQL) and for
/// ISOLATION LEVEL SERIALIZABLE, which a hot standby refuses. Note that
/// PostgreSQL lets `SET TRANSACTION READ WRITE` undo READ ONLY before the
/// transaction's first query; a standby refuses that statement, so a caller
/// pinning the transaction to a replica may want to classify later
/// statements too.
pub fn begins_read_only(sql: &[u8]) -> bool {
    classify::begins_read_only(sql)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(sql: &str) -> Route {
        Classifier::default().classify(sql.as_bytes())
    }

    #[test]
    fn questions_about_the_node_go_to_the_primary() {
        for sql in ["SHOW transaction_read_only", "show IN_HOT_STANDBY"] {
            assert_eq!(c(sql), Route::Primary, "{sql}");
        }
        assert_eq!(c("SHOW search_path"), Route::Replica);
        // (the documented way to see where a read ran)
        assert_eq!(c("select pg_is_in_recovery()"), Route::Replica);
        assert_eq!(c("select current_setting('work_mem')"), Route::Replica);
    }

    #[test]
    fn basics() {
        assert_eq!(c("select 1"), Route::Replica);
        assert_eq!(c("delete from t"), Route::Primary);
        assert_eq!(c(""), Route::Primary);
        assert_eq!(c("/* x */ -- y"), Route::Primary);
        assert_eq!(c(";;"), Route::Primary);
    }

    #[test]
    fn extra_functions() {
        let sql = b"select my_func(1), public.f(2)";
        assert_eq!(Classifier::default().classify(sql), Route::Primary);
        let cl = Classifier::default().with_read_only_functions(["my_func".to_owned()]);
        assert_eq!(cl.classify(sql), Route::Primary);
        assert_eq!(cl.classify(b"select my_func(1)"), Route::Replica);
        assert_eq!(cl.classify(b"select MY_FUNC(1)"), Route::Replica);
        assert_eq!(cl.classify(b"select \"MY_FUNC\"(1)"), Route::Primary);
        assert_eq!(cl.classify(b"select pg_catalog.my_func(1)"), Route::Replica);
        assert_eq!(cl.classify(b"select other.my_func(1)"), Route::Primary);
        let cl = cl.with_read_only_functions(["public.f".to_owned(), " pg_catalog.g ".to_owned()]);
        assert_eq!(cl.classify(sql), Route::Replica);
        assert_eq!(cl.classify(b"select f(1)"), Route::Primary);
        assert_eq!(cl.classify(b"select g(1), pg_catalog.g(2)"), Route::Replica);
        let cl = Classifier::default().with_read_only_functions(["MyFunc".to_owned()]);
        assert_eq!(cl.classify(b"select \"MyFunc\"()"), Route::Replica);
        assert_eq!(cl.classify(b"select MyFunc()"), Route::Primary);
    }
}
