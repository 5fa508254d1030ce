//! Runs the classification corpus in `tests/corpus.txt` and reports every
//! case whose route differs from the expected one, plus two derived checks
//! per case that must hold for any correct classifier: a write stays a write
//! behind a read, and a read followed by a write is a write.

use sluice_router::{Classifier, Route};

/// One corpus line: its line number, expected route and SQL bytes.
struct Case {
    line: usize,
    route: Route,
    sql: Vec<u8>,
}

fn unescape(s: &str) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(s.len());
    let mut bytes = s.bytes();
    while let Some(b) = bytes.next() {
        if b != b'\\' {
            out.push(b);
            continue;
        }
        match bytes.next() {
            Some(b'n') => out.push(b'\n'),
            Some(b'r') => out.push(b'\r'),
            Some(b't') => out.push(b'\t'),
            Some(b'\\') => out.push(b'\\'),
            Some(b'x') => {
                let hex: Vec<u8> = bytes.by_ref().take(2).collect();
                let hex = std::str::from_utf8(&hex).map_err(|e| e.to_string())?;
                out.push(u8::from_str_radix(hex, 16).map_err(|e| format!("\\x{hex}: {e}"))?);
            }
            other => return Err(format!("unknown escape \\{:?}", other.map(char::from))),
        }
    }
    Ok(out)
}

fn corpus() -> Vec<Case> {
    let text = include_str!("corpus.txt");
    let mut cases = Vec::new();
    let mut errors = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line_no = i + 1;
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((route, sql)) = line.split_once('\t') else {
            errors.push(format!("line {line_no}: no tab"));
            continue;
        };
        let route = match route {
            "R" => Route::Replica,
            "P" => Route::Primary,
            other => {
                errors.push(format!(
                    "line {line_no}: route {other:?} is neither R nor P"
                ));
                continue;
            }
        };
        match unescape(sql) {
            Ok(sql) => cases.push(Case {
                line: line_no,
                route,
                sql,
            }),
            Err(e) => errors.push(format!("line {line_no}: {e}")),
        }
    }
    assert!(
        errors.is_empty(),
        "malformed corpus:\n{}",
        errors.join("\n")
    );
    cases
}

fn show(sql: &[u8]) -> String {
    let s = String::from_utf8_lossy(sql);
    if s.len() > 160 {
        let cut = s.char_indices().nth(150).map_or(s.len(), |(i, _)| i);
        format!("{}… ({} bytes)", &s[..cut], sql.len())
    } else {
        s.into_owned()
    }
}

/// Only whitespace, semicolons and (unnested) comments.
fn is_blank(mut sql: &[u8]) -> bool {
    loop {
        sql = sql.trim_ascii_start();
        if let Some(rest) = sql.strip_prefix(b";") {
            sql = rest;
        } else if let Some(rest) = sql.strip_prefix(b"--") {
            let end = rest.iter().position(|&b| b == b'\n').unwrap_or(rest.len());
            sql = &rest[end..];
        } else if let Some(rest) = sql.strip_prefix(b"/*") {
            match rest.windows(2).position(|w| w == b"*/") {
                Some(end) => sql = &rest[end + 2..],
                None => return false,
            }
        } else {
            return sql.is_empty();
        }
    }
}

#[test]
fn corpus_routes() {
    let cases = corpus();
    assert!(cases.len() >= 220, "only {} cases", cases.len());
    let classifier = Classifier::default();
    let mismatches: Vec<String> = cases
        .iter()
        .filter_map(|c| {
            let got = classifier.classify(&c.sql);
            (got != c.route).then(|| {
                format!(
                    "line {}: expected {:?}, got {:?}: {}",
                    c.line,
                    c.route,
                    got,
                    show(&c.sql)
                )
            })
        })
        .collect();
    assert!(
        mismatches.is_empty(),
        "{} of {} cases misrouted:\n{}",
        mismatches.len(),
        cases.len(),
        mismatches.join("\n")
    );
}

#[test]
fn derived_cases() {
    let classifier = Classifier::default();
    let mut failures = Vec::new();
    for c in corpus() {
        match c.route {
            // Blank text is Primary only because there is nothing to read.
            Route::Primary if is_blank(&c.sql) => {}
            Route::Primary => {
                // A read before a write cannot make it a read.
                let mut sql = b"select 1; ".to_vec();
                sql.extend_from_slice(&c.sql);
                if classifier.classify(&sql) != Route::Primary {
                    failures.push(format!(
                        "line {}: `select 1; ` + case is not Primary",
                        c.line
                    ));
                }
            }
            Route::Replica => {
                // A write after a read makes the string a write. The newline
                // ends a trailing line comment.
                let mut sql = c.sql.clone();
                sql.extend_from_slice(b"\n; delete from t");
                if classifier.classify(&sql) != Route::Primary {
                    failures.push(format!(
                        "line {}: case + `; delete from t` is not Primary",
                        c.line
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
