//! Measures what classification costs: classifies every case of the test
//! corpus (`tests/corpus.txt`) in a loop and prints nanoseconds per
//! statement. Run with `cargo run --release -p sluice-router --example cost`.

use std::hint::black_box;
use std::time::Instant;

use sluice_router::{Classifier, hint};

/// The corpus' SQL texts, escapes undone (see tests/corpus.rs).
fn corpus() -> Vec<Vec<u8>> {
    include_str!("../tests/corpus.txt")
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once('\t').map(|(_, sql)| sql))
        .map(|sql| {
            let mut out = Vec::new();
            let mut bytes = sql.bytes();
            while let Some(b) = bytes.next() {
                if b != b'\\' {
                    out.push(b);
                    continue;
                }
                match bytes.next() {
                    Some(b'n') => out.push(b'\n'),
                    Some(b'r') => out.push(b'\r'),
                    Some(b't') => out.push(b'\t'),
                    Some(b'x') => {
                        let hex: Vec<u8> = bytes.by_ref().take(2).collect();
                        let hex = std::str::from_utf8(&hex).unwrap_or("00");
                        out.push(u8::from_str_radix(hex, 16).unwrap_or(0));
                    }
                    Some(other) => out.push(other),
                    None => {}
                }
            }
            out
        })
        .collect()
}

/// Runs `f` over `texts` until about `budget` seconds have passed; returns
/// nanoseconds per text.
fn measure(texts: &[Vec<u8>], budget: f64, mut f: impl FnMut(&[u8])) -> f64 {
    let mut rounds = 0u64;
    let start = Instant::now();
    while start.elapsed().as_secs_f64() < budget {
        for sql in texts {
            f(black_box(sql));
        }
        rounds += 1;
    }
    start.elapsed().as_nanos() as f64 / (rounds as f64 * texts.len() as f64)
}

fn main() {
    let classifier = Classifier::default();
    let all = corpus();
    let short: Vec<Vec<u8>> = all.iter().filter(|s| s.len() <= 200).cloned().collect();
    let bytes: usize = all.iter().map(Vec::len).sum();
    let typical = vec![b"SELECT \"users\".\"id\", \"users\".\"email\" FROM \"users\" WHERE \"users\".\"id\" = $1 LIMIT $2".to_vec()];

    // Warm up.
    measure(&all, 0.2, |s| {
        black_box(classifier.classify(s));
    });
    let per_all = measure(&all, 1.0, |s| {
        black_box(classifier.classify(s));
    });
    let per_short = measure(&short, 1.0, |s| {
        black_box(classifier.classify(s));
    });
    let per_typical = measure(&typical, 1.0, |s| {
        black_box(classifier.classify(s));
    });
    let per_hint = measure(&short, 0.5, |s| {
        black_box(hint(s));
    });
    println!(
        "classify, whole corpus ({} texts, {} bytes, incl. 20 kB texts): {:.0} ns/statement ({:.2} ns/byte)",
        all.len(),
        bytes,
        per_all,
        per_all * all.len() as f64 / bytes as f64
    );
    println!(
        "classify, corpus texts up to 200 bytes ({}): {:.0} ns/statement",
        short.len(),
        per_short
    );
    println!("classify, a typical ORM SELECT (81 bytes): {per_typical:.0} ns");
    println!("hint, corpus texts up to 200 bytes: {per_hint:.0} ns/statement");
}
