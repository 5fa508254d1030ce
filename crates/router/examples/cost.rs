//! What classifying a statement costs: every statement of the routing
//! corpus (`tests/corpus.txt`) classified many times over, the median of
//! several runs reported per statement, for reads and for the rest.
//! `cargo run --release -p sluice-router --example cost`. A measurement to
//! read, not a test: nothing here can fail.

use std::time::Instant;

use sluice_router::{Classifier, Route};

/// Times each statement is classified per run, and runs (median taken).
const REPEAT: usize = 2_000;
const RUNS: usize = 7;

fn main() {
    let classifier = Classifier::default();
    let mut reads = Vec::new();
    let mut others = Vec::new();
    for line in include_str!("../tests/corpus.txt").lines() {
        let Some((route, sql)) = line.split_once('\t') else {
            continue;
        };
        // (escapes left as they are: the cost of the bytes is what counts)
        match route {
            "R" => reads.push(sql.as_bytes()),
            "P" => others.push(sql.as_bytes()),
            _ => {}
        }
    }
    let pgbench = [
        &b"SELECT abalance FROM pgbench_accounts WHERE aid = 48213;"[..],
        b"UPDATE pgbench_accounts SET abalance = abalance + -3019 WHERE aid = 48213;",
    ];
    for (name, set) in [
        ("corpus reads", &reads[..]),
        ("corpus writes and the rest", &others[..]),
        ("pgbench -S / TPC-B statements", &pgbench[..]),
    ] {
        let bytes: usize = set.iter().map(|s| s.len()).sum();
        let mut per = Vec::new();
        let mut replica = 0;
        for _ in 0..RUNS {
            let start = Instant::now();
            for _ in 0..REPEAT {
                for sql in set {
                    if std::hint::black_box(classifier.classify(std::hint::black_box(sql)))
                        == Route::Replica
                    {
                        replica += 1;
                    }
                }
            }
            per.push(start.elapsed().as_nanos() as f64 / (REPEAT * set.len()) as f64);
        }
        per.sort_by(f64::total_cmp);
        println!(
            "{name}: {} statements, {:.0} bytes on average: {:.0} ns per statement (median of {RUNS} runs; {} replica verdicts)",
            set.len(),
            bytes as f64 / set.len() as f64,
            per[RUNS / 2],
            replica / (RUNS * REPEAT),
        );
    }
}
