//! Log output: stderr (unless -q or -d) and `logfile`, at a level from
//! `verbose` and -v, in a PgBouncer-like one-line format.

use std::sync::Mutex;

use tracing::Level;
use tracing_subscriber::fmt::writer::{BoxMakeWriter, MakeWriterExt};

/// Starts logging. Fails only when the log file cannot be opened.
pub fn init(logfile: &str, to_stderr: bool, verbosity: u32) -> std::io::Result<()> {
    let level = match verbosity {
        0 => Level::INFO,
        1 => Level::DEBUG,
        _ => Level::TRACE,
    };
    let file = if logfile.is_empty() {
        None
    } else {
        Some(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(logfile)?,
        )
    };
    let writer = match (file, to_stderr) {
        (Some(f), true) => BoxMakeWriter::new(std::io::stderr.and(Mutex::new(f))),
        (Some(f), false) => BoxMakeWriter::new(Mutex::new(f)),
        (None, true) => BoxMakeWriter::new(std::io::stderr),
        (None, false) => BoxMakeWriter::new(std::io::sink),
    };
    tracing_subscriber::fmt()
        .with_writer(writer)
        .with_max_level(level)
        .with_ansi(false)
        .with_target(false)
        .init();
    Ok(())
}
