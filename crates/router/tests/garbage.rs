//! Feeds the router random and mangled input: whatever the bytes, it must not
//! panic, must stay within time on pathological shapes, and must never call
//! mangled SQL a read when the mangling spliced in a write.

use std::time::{Duration, Instant};

use sluice_router::{Classifier, Route, begins_read_only, hint};

/// xorshift64*: small, deterministic, good enough to shake a tokenizer.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        // n is small; the modulo bias does not matter here.
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Pieces that steer random text into the tokenizer's and the rules' corners.
const PIECES: &[&str] = &[
    "'",
    "''",
    "\"",
    "\"\"",
    "$$",
    "$a$",
    "$1",
    "$",
    "/*",
    "*/",
    "--",
    "\n",
    "\r",
    "(",
    ")",
    "[",
    "]",
    ";",
    ",",
    ".",
    "::",
    ":",
    "\\",
    "E'",
    "e'",
    "U&'",
    "U&\"",
    "B'",
    "X'",
    "N'",
    " ",
    "\t",
    "select",
    "SELECT",
    "insert",
    "update",
    "delete",
    "merge",
    "into",
    "for",
    "share",
    "key",
    "no",
    "with",
    "as",
    "materialized",
    "not",
    "values",
    "table",
    "explain",
    "analyze",
    "copy",
    "to",
    "stdout",
    "from",
    "begin",
    "start",
    "transaction",
    "read",
    "only",
    "write",
    "commit",
    "rollback",
    "savepoint",
    "release",
    "set",
    "declare",
    "cursor",
    "hold",
    "fetch",
    "close",
    "show",
    "operator",
    "nextval",
    "lower",
    "count",
    "f",
    "g",
    "x",
    "1",
    "0",
    "1e5",
    ".5",
    "+",
    "-",
    "*",
    "=",
    "<>",
    "~",
    "|",
    "sluice",
    "sluice:",
    "primary",
    "replica",
    "\u{e9}",
    "\u{81}",
    "ordinality",
    "by",
    "group",
    "grouping",
    "sets",
    "character",
    "varying",
    "second",
    "pg_catalog",
    "public",
    "\0",
    "{",
    "}",
];

fn check(classifier: &Classifier, sql: &[u8]) {
    let _ = classifier.classify(sql);
    let _ = hint(sql);
    let _ = begins_read_only(sql);
}

#[test]
fn random_bytes_never_panic() {
    let classifier =
        Classifier::default().with_read_only_functions(["f".to_owned(), "public.g".to_owned()]);
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for _ in 0..20_000 {
        let len = rng.below(96);
        let sql: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        check(&classifier, &sql);
    }
}

#[test]
fn random_sql_pieces_never_panic() {
    let classifier =
        Classifier::default().with_read_only_functions(["f".to_owned(), "public.g".to_owned()]);
    let mut rng = Rng(0x0123_4567_89ab_cdef);
    for _ in 0..40_000 {
        let n = rng.below(40);
        let mut sql = Vec::new();
        for _ in 0..n {
            let piece = PIECES[rng.below(PIECES.len())];
            sql.extend_from_slice(piece.as_bytes());
            if rng.below(3) == 0 {
                sql.push(b' ');
            }
        }
        check(&classifier, &sql);
    }
}

#[test]
fn mangled_corpus_never_panics() {
    let classifier = Classifier::default();
    let corpus = include_str!("corpus.txt");
    let cases: Vec<&str> = corpus
        .lines()
        .filter_map(|l| l.split_once('\t').map(|(_, sql)| sql))
        .filter(|sql| sql.len() < 2000)
        .collect();
    let mut rng = Rng(42);
    for _ in 0..20_000 {
        let mut sql = cases[rng.below(cases.len())].as_bytes().to_vec();
        for _ in 0..1 + rng.below(3) {
            let at = rng.below(sql.len() + 1);
            match rng.below(3) {
                0 => sql.truncate(at),
                1 => sql.insert(at, rng.next() as u8),
                _ => {
                    let piece = PIECES[rng.below(PIECES.len())].as_bytes();
                    sql.splice(at..at, piece.iter().copied());
                }
            }
        }
        check(&classifier, &sql);
    }
}

#[test]
fn spliced_writes_are_never_reads() {
    // Whatever garbage precedes it, a complete `; delete from t` that the
    // tokenizer reaches must keep the text off the replica; when garbage
    // swallows it (an open quote or comment) the text does not tokenize.
    let classifier = Classifier::default();
    let mut rng = Rng(7);
    for _ in 0..20_000 {
        let n = rng.below(12);
        let mut sql = b"select 1 ".to_vec();
        for _ in 0..n {
            sql.extend_from_slice(PIECES[rng.below(PIECES.len())].as_bytes());
            sql.push(b' ');
        }
        sql.extend_from_slice(b"\n; delete from t");
        assert_eq!(
            classifier.classify(&sql),
            Route::Primary,
            "{}",
            String::from_utf8_lossy(&sql)
        );
    }
}

#[test]
fn pathological_shapes_are_linear() {
    let classifier = Classifier::default();
    let mb = 1 << 20;
    let shapes: Vec<(&str, Vec<u8>)> = vec![
        ("deep parentheses", {
            let mut s = b"select ".to_vec();
            s.extend(std::iter::repeat_n(b'(', mb / 2));
            s.push(b'1');
            s.extend(std::iter::repeat_n(b')', mb / 2));
            s
        }),
        ("deep nested comments", {
            let mut s = b"select 1 ".to_vec();
            s.extend(b"/*".repeat(mb / 4));
            s.extend(b"*/".repeat(mb / 4));
            s
        }),
        ("unterminated nested comments", b"/*".repeat(mb / 2)),
        (
            "many dollar signs",
            b"select $a$ "
                .iter()
                .chain(b"$a".repeat(mb / 2).iter())
                .copied()
                .collect(),
        ),
        ("many quotes", b"'".repeat(mb)),
        ("many statements", b"select 1;".repeat(mb / 9)),
        ("many calls", b"select lower(lower(lower(".repeat(mb / 24)),
        ("one long identifier", b"a".repeat(mb)),
        ("many aliases", b"select 1 from t x(a) ".repeat(mb / 20)),
        ("explain options", {
            let mut s = b"explain (".to_vec();
            s.extend(b"costs off, ".repeat(mb / 11));
            s.extend(b"analyze) select 1");
            s
        }),
        ("many cursors", {
            let mut s = Vec::new();
            for i in 0..mb / 64 {
                s.extend(format!("declare c{i} cursor for select 1; fetch c{i};").bytes());
            }
            s.extend(b"fetch c0; close c1");
            s
        }),
        ("cte lists", b"with a(x) as (select 1), ".repeat(mb / 25)),
    ];
    for (name, sql) in shapes {
        let start = Instant::now();
        check(&classifier, &sql);
        let took = start.elapsed();
        assert!(took < Duration::from_secs(20), "{name}: {took:?}");
    }
}
