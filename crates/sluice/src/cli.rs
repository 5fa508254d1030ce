//! Command line: PgBouncer's flags, so an operator swaps the binary and
//! nothing else, plus `--check-config`.

use std::path::PathBuf;

use clap::{ArgAction, Parser};

/// sluice: a PostgreSQL connection pooler that reads pgbouncer.ini.
#[derive(Debug, Parser)]
#[command(name = "sluice", version, about)]
pub struct Cli {
    /// Run in the background (requires logfile or syslog).
    #[arg(short = 'd', long = "daemon")]
    pub daemon: bool,
    /// Do not log to stderr.
    #[arg(short = 'q', long = "quiet")]
    pub quiet: bool,
    /// More logging; repeat for more.
    #[arg(short = 'v', long = "verbose", action = ArgAction::Count)]
    pub verbose: u8,
    /// Switch to this OS user at startup.
    #[arg(short = 'u', long = "user")]
    pub user: Option<String>,
    /// PgBouncer's online restart; not supported (use so_reuseport).
    #[arg(short = 'R', long = "reboot", hide = true)]
    pub reboot: bool,
    /// Check the configuration file and exit.
    #[arg(long = "check-config")]
    pub check_config: bool,
    /// The configuration file (pgbouncer.ini format).
    pub config: PathBuf,
}
