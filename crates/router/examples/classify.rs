//! A debugging aid: prints how the router sees each SQL text given on the
//! command line (`cargo run -p sluice-router --example classify -- 'select 1'`).

use sluice_router::{Classifier, begins_read_only, hint};

fn main() {
    let classifier = Classifier::default();
    for sql in std::env::args().skip(1) {
        let sql = sql.as_bytes();
        println!(
            "{:?}\thint={:?}\tbegins_read_only={}\t{}",
            classifier.classify(sql),
            hint(sql),
            begins_read_only(sql),
            String::from_utf8_lossy(sql)
        );
    }
}
