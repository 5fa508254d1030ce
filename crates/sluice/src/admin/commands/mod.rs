//! Console commands: a line is split and its permission checked here, then
//! each command runs from a file of its own (show, reload, pause, switches,
//! reconnect, set, kill, shutdown), answering like PgBouncer.

mod kill;
mod pause;
mod reconnect;
mod reload;
mod set;
mod show;
mod shutdown;
mod switches;

use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;

use super::{Role, error};
use crate::app::App;

/// How long PAUSE and WAIT_CLOSE wait for servers before they give up.
const WAIT_LIMIT: Duration = Duration::from_secs(60);

/// A command line, split.
struct Line<'a> {
    /// The line as sent, for error messages.
    sql: &'a str,
    /// Trimmed, without its final `;`.
    text: &'a str,
    /// The first word, upper-cased.
    verb: String,
    /// The one argument (a database, an id, a mode), unquoted.
    arg: Option<&'a str>,
}

impl Line<'_> {
    /// The argument (a database, an id, a mode).
    fn arg(&self) -> Option<&str> {
        self.arg
    }

    /// PgBouncer's `<CMD> command issued` / `<CMD> '<db>' command issued`
    /// line, for the commands that act (not SHOW, nor SET, whose value may
    /// be a secret).
    fn log_issued(&self) {
        const ACTING: &[&str] = &[
            "RELOAD",
            "PAUSE",
            "RESUME",
            "SUSPEND",
            "DISABLE",
            "ENABLE",
            "RECONNECT",
            "WAIT_CLOSE",
            "KILL",
            "KILL_CLIENT",
            "SHUTDOWN",
        ];
        if !ACTING.contains(&self.verb.as_str()) {
            return;
        }
        match self.arg() {
            Some(arg) if self.verb == "SHUTDOWN" => {
                tracing::info!("SHUTDOWN {} command issued", arg.to_ascii_uppercase());
            }
            Some(arg) => tracing::info!("{} '{arg}' command issued", self.verb),
            None => tracing::info!("{} command issued", self.verb),
        }
    }
}

/// Why a command refuses the database it names.
struct Refused {
    code: &'static str,
    message: String,
}

impl Refused {
    fn send(&self, out: &mut BytesMut) {
        error(out, self.code, &self.message);
    }
}

/// Whether `db` names a database: its own entry, the `*` entry (which
/// stands for any name), a pool of it, or the console.
fn known_database(app: &App, db: &str) -> bool {
    let config = app.config();
    super::CONSOLE_DATABASES.contains(&db)
        || config.database(db).is_some()
        || config.fallback_database.is_some()
        || app.pools().iter().any(|p| p.database == db)
}

/// The database a command acts on, checked as PgBouncer checks it: a
/// database sluice knows, and not the console (`doing` completes "cannot
/// … admin db": "pause", "kill", "wait in"…).
fn target<'a>(app: &App, db: &'a str, doing: &str) -> Result<&'a str, Refused> {
    if super::CONSOLE_DATABASES.contains(&db) {
        return Err(Refused {
            code: "0A000",
            message: format!("cannot {doing} admin db: {db}"),
        });
    }
    if !known_database(app, db) {
        return Err(no_such_database(db));
    }
    Ok(db)
}

fn no_such_database(db: &str) -> Refused {
    Refused {
        code: "3D000",
        message: format!("no such database: {db}"),
    }
}

/// PAUSE, KILL and SUSPEND while everything is paused: PgBouncer's text
/// and code (08P01), which scripts that pause match on.
fn already_paused() -> Refused {
    Refused {
        code: "08P01",
        message: "already suspended/paused".to_owned(),
    }
}

/// Session parameters the console pretends to have, as PgBouncer's does
/// (`fake_param_list`), for drivers that SET or SHOW them on connecting:
/// a SET of one is ignored with a notice, a SHOW answers this value.
const FAKE_PARAMS: [(&str, &str); 5] = [
    ("client_encoding", "UTF-8"),
    ("default_transaction_isolation", "read committed"),
    ("standard_conforming_strings", "on"),
    ("datestyle", "ISO"),
    ("timezone", "GMT"),
];

/// The pretended parameter named `name` (any letter case).
fn fake_param(name: &str) -> Option<(&'static str, &'static str)> {
    FAKE_PARAMS
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .copied()
}

/// Runs one command line and appends its answer to `out`.
pub async fn run(app: &Arc<App>, role: Role, sql: &str, out: &mut BytesMut) {
    let text = sql.trim().trim_end_matches(';').trim();
    if text.is_empty() {
        sluice_wire::empty_query_response(out);
        return;
    }
    let (verb, rest) = text.split_once(char::is_whitespace).unwrap_or((text, ""));
    let verb = verb.to_ascii_uppercase();
    // SET has its own syntax; every other command takes one word or one
    // double-quoted name at most, as PgBouncer's (`PAUSE db1 db2` is not
    // half done: it is refused).
    let arg = if verb == "SET" {
        None
    } else {
        match one_arg(rest) {
            Ok(arg) if arg.is_none() || !matches!(verb.as_str(), "RELOAD" | "SUSPEND") => arg,
            _ => return error(out, "42601", &invalid_command(sql)),
        }
    };
    let line = Line {
        sql,
        text,
        verb,
        arg,
    };
    if line.verb != "SHOW" && role != Role::Admin {
        error(out, "42501", "admin access needed");
        return;
    }
    line.log_issued();
    match line.verb.as_str() {
        "SHOW" => {
            // A listing of every client or server (thousands of rows) is
            // built on the blocking pool, not on the event loop of the
            // worker whose clients it would stall (a review saw 11,380 tps
            // fall to 348 under a stats user's SHOW CLIENTS loop).
            let (app, sql, arg) = (app.clone(), sql.to_owned(), line.arg.map(str::to_owned));
            let built = tokio::task::spawn_blocking(move || {
                let mut out = BytesMut::new();
                let line = Line {
                    sql: &sql,
                    text: &sql,
                    verb: "SHOW".to_owned(),
                    arg: arg.as_deref(),
                };
                show::run(&app, &line, &mut out);
                out
            })
            .await;
            match built {
                Ok(built) => out.extend_from_slice(&built),
                Err(_) => error(out, "XX000", "SHOW failed"),
            }
        }
        "RELOAD" => reload::run(app, out),
        "PAUSE" => pause::pause(app, &line, out).await,
        "RESUME" => pause::resume(app, &line, out),
        "SUSPEND" => pause::suspend(app, out),
        "DISABLE" | "ENABLE" => switches::run(app, &line, out),
        "RECONNECT" => reconnect::reconnect(app, &line, out),
        "WAIT_CLOSE" => reconnect::wait_close(app, &line, out).await,
        "SET" => set::run(app, &line, out),
        "KILL" => kill::kill(app, &line, out),
        "KILL_CLIENT" => kill::kill_client(app, &line, out),
        "SHUTDOWN" => shutdown::run(app, &line, out),
        _ => error(out, "42601", &invalid_command(sql)),
    }
}

/// The one argument after a command's verb: a word, or a name in double
/// quotes (which may hold spaces); `Err` for anything more.
fn one_arg(rest: &str) -> Result<Option<&str>, ()> {
    let rest = rest.trim();
    if rest.is_empty() {
        return Ok(None);
    }
    if let Some(quoted) = rest.strip_prefix('"') {
        return match quoted.split_once('"') {
            Some((name, "")) if !name.is_empty() => Ok(Some(name)),
            _ => Err(()),
        };
    }
    if rest.contains(char::is_whitespace) {
        return Err(());
    }
    Ok(Some(rest))
}

/// PgBouncer's reply to a command it does not know.
fn invalid_command(sql: &str) -> String {
    format!("invalid command '{sql}', use SHOW HELP;")
}

#[cfg(test)]
mod tests {
    use super::one_arg;

    #[test]
    fn one_word_or_one_quoted_name() {
        assert_eq!(one_arg(""), Ok(None));
        assert_eq!(one_arg("  appdb "), Ok(Some("appdb")));
        assert_eq!(one_arg("\"my db\""), Ok(Some("my db")));
        assert_eq!(one_arg("db1 db2"), Err(()));
        assert_eq!(one_arg("\"db1\" db2"), Err(()));
        assert_eq!(one_arg("\"unclosed"), Err(()));
        assert_eq!(one_arg("\"\""), Err(()));
    }
}
