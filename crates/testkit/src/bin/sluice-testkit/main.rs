//! `sluice-testkit cluster ...`: starts a throwaway cluster (optionally with
//! pgbench data and a streaming replica) for the Python bench and demo
//! scripts, prints one JSON line about it, and removes everything when stdin
//! closes or on SIGTERM/SIGINT.

mod args;
mod json;
mod shutdown;

use std::io::Write;
use std::process::ExitCode;

use sluice_testkit::TestkitError;

fn main() -> ExitCode {
    shutdown::install_signal_handlers();
    let args = match args::parse(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::FAILURE;
        }
    };
    match serve(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("sluice-testkit: {error}");
            ExitCode::FAILURE
        }
    }
}

/// Starts everything, reports it, waits for the stop request; the clusters
/// are dropped (stopped and deleted) on every return path.
fn serve(args: args::ClusterArgs) -> Result<(), TestkitError> {
    let primary = args.builder.start()?;
    if let Some(scale) = args.pgbench_scale
        && !shutdown::signalled()
    {
        primary.pgbench_init("postgres", scale)?;
    }
    let replica = if args.replica && !shutdown::signalled() {
        Some(primary.start_replica()?)
    } else {
        None
    };
    let line = json::describe(&primary, replica.as_ref());
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{line}")
        .and_then(|()| stdout.flush())
        .map_err(|source| TestkitError::Io {
            context: "writing the cluster description to stdout".to_owned(),
            source,
        })?;
    drop(stdout);
    shutdown::wait_for_stop();
    drop(replica);
    drop(primary);
    Ok(())
}
