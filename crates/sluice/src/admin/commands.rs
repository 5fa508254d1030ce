//! Console commands: parsing, permission, dispatch. SHOW answers come from
//! `show`; the others act on the running process (RELOAD, PAUSE, RESUME,
//! DISABLE, ENABLE, RECONNECT, SET, SHUTDOWN) and answer like PgBouncer.

use std::time::Duration;

use bytes::BytesMut;
use sluice_wire::{ErrorFields, Severity, command_complete};

use super::{Role, error, show};
use crate::app::{App, Phase};

/// How long PAUSE waits for servers to be released before it gives up.
const PAUSE_WAIT: Duration = Duration::from_secs(60);

const HELP: &str = "Console usage\n\
\tSHOW HELP|CONFIG|DATABASES|POOLS|CLIENTS|SERVERS|USERS|STATS|STATS_TOTALS|STATS_AVERAGES|TOTALS|LISTS|STATE|VERSION|MEM|HOSTS|PEERS|PEER_POOLS|SOCKETS|ACTIVE_SOCKETS\n\
\tSET key = arg\n\
\tRELOAD\n\
\tPAUSE [<db>]\n\
\tRESUME [<db>]\n\
\tDISABLE <db>\n\
\tENABLE <db>\n\
\tRECONNECT [<db>]\n\
\tWAIT_CLOSE [<db>]\n\
\tKILL <db>\n\
\tKILL_CLIENT <id>\n\
\tSHUTDOWN\n\
\tSHUTDOWN WAIT_FOR_SERVERS|WAIT_FOR_CLIENTS";

/// Runs one command line and appends its answer to `out`.
pub async fn run(app: &App, role: Role, sql: &str, out: &mut BytesMut) {
    let text = sql.trim().trim_end_matches(';').trim();
    if text.is_empty() {
        sluice_wire::empty_query_response(out);
        return;
    }
    let mut words = text.split_whitespace();
    let verb = words.next().unwrap_or_default().to_ascii_uppercase();
    let rest: Vec<&str> = words.collect();
    if verb != "SHOW" && role != Role::Admin {
        error(out, "42501", "admin access needed");
        return;
    }
    match verb.as_str() {
        "SHOW" => show_command(app, &rest, sql, out),
        "RELOAD" => {
            for said in crate::reload::reload(app) {
                sluice_wire::ErrorFields::new(sluice_wire::Severity::Warning, "01000", &said)
                    .encode(out);
            }
            command_complete(out, "RELOAD");
        }
        "PAUSE" => {
            let db = rest.first().copied();
            app.control.pause(db);
            if wait_released(app, db).await {
                command_complete(out, "PAUSE");
            } else {
                error(
                    out,
                    "57014",
                    "PAUSE timed out waiting for servers to be released",
                );
            }
        }
        "RESUME" => {
            app.control.resume(rest.first().copied());
            command_complete(out, "RESUME");
        }
        "DISABLE" | "ENABLE" => match rest.first() {
            Some(db) => {
                app.control.set_disabled(db, verb == "DISABLE");
                command_complete(out, &verb);
            }
            None => error(out, "42601", "a database is required"),
        },
        "RECONNECT" => {
            for p in app.pools() {
                if rest.first().is_none_or(|db| *db == p.database) {
                    p.reconnect();
                }
            }
            command_complete(out, "RECONNECT");
        }
        "SET" => set(app, &text[3..], sql, out),
        "KILL" => match rest.first() {
            Some(db) => {
                let killed = app.cancels.kill(|_, m| m.pool.database == *db);
                for p in app.pools().iter().filter(|p| p.database == *db) {
                    p.reconnect();
                }
                tracing::info!("KILL {db}: {killed} clients disconnected");
                command_complete(out, "KILL");
            }
            None => error(out, "42601", "a database is required"),
        },
        "KILL_CLIENT" => match rest.first().and_then(|id| id.parse::<i32>().ok()) {
            Some(id) => {
                if app.cancels.kill(|pid, _| pid == id) == 1 {
                    command_complete(out, "KILL_CLIENT");
                } else {
                    error(out, "42704", "client not found");
                }
            }
            None => error(out, "42601", "invalid client pointer supplied"),
        },
        "WAIT_CLOSE" => {
            let db = rest.first().copied();
            if wait_closed(app, db).await {
                command_complete(out, "WAIT_CLOSE");
            } else {
                error(
                    out,
                    "57014",
                    "WAIT_CLOSE timed out: servers are still lent to clients",
                );
            }
        }
        "SUSPEND" => error(
            out,
            "0A000",
            "SUSPEND exists for PgBouncer's online restart (-R), which sluice replaces: \
             start a second sluice with so_reuseport = 1 and send this one SIGTERM",
        ),
        "SHUTDOWN" => {
            let phase = match rest.first().map(|w| w.to_ascii_uppercase()).as_deref() {
                None => Phase::Immediate,
                Some("WAIT_FOR_SERVERS") => Phase::WaitForServers,
                Some("WAIT_FOR_CLIENTS") => Phase::WaitForClients,
                Some(_) => {
                    error(out, "42601", &invalid_command(sql));
                    return;
                }
            };
            app.begin_shutdown(phase);
            command_complete(out, "SHUTDOWN");
        }
        _ => error(out, "42601", &invalid_command(sql)),
    }
}

fn show_command(app: &App, rest: &[&str], sql: &str, out: &mut BytesMut) {
    let what = rest
        .first()
        .map(|w| w.to_ascii_uppercase())
        .unwrap_or_default();
    let rs = match what.as_str() {
        "POOLS" => show::pools(app),
        "STATS" => show::stats(app),
        "STATS_TOTALS" => show::stats_totals(app),
        "STATS_AVERAGES" => show::stats_averages(app),
        "TOTALS" => show::totals(app),
        "DATABASES" => show::databases(app),
        "USERS" => show::users(app),
        "CONFIG" => show::config(app),
        "LISTS" => show::lists(app),
        "STATE" => show::state(app),
        "VERSION" => show::version(),
        "MEM" => show::mem(),
        "CLIENTS" => super::sockets::clients(app),
        "SERVERS" => super::sockets::servers(app),
        "HOSTS" => super::hosts::hosts(app),
        "PEERS" => show::peers_list(app),
        "SOCKETS" => super::sockets::sockets(app, false),
        "ACTIVE_SOCKETS" => super::sockets::sockets(app, true),
        "PEER_POOLS" => show::peer_pools(app),
        "HELP" | "" => {
            ErrorFields::new(Severity::Notice, "00000", HELP).encode(out);
            command_complete(out, "SHOW");
            return;
        }
        "FDS" => {
            error(
                out,
                "0A000",
                "SHOW FDS lists sockets handed over in PgBouncer's online restart, \
                 which sluice replaces with so_reuseport: there are none",
            );
            return;
        }
        _ => {
            error(out, "42601", &invalid_command(sql));
            return;
        }
    };
    rs.encode(out);
}

/// PgBouncer's reply to a command it does not know.
fn invalid_command(sql: &str) -> String {
    format!("invalid command '{sql}', use SHOW HELP;")
}

/// SET key = value (or key TO value), validated like the file.
fn set(app: &App, args: &str, sql: &str, out: &mut BytesMut) {
    let parsed = args
        .split_once('=')
        .or_else(|| {
            let lower = args.to_ascii_lowercase();
            lower.find(" to ").map(|i| (&args[..i], &args[i + 4..]))
        })
        .map(|(k, v)| (k.trim(), v.trim().trim_matches('\'')));
    let Some((key, value)) = parsed else {
        error(out, "42601", &invalid_command(sql));
        return;
    };
    let mut config = (*app.config()).clone();
    if let Err(e) = config.settings.set(key, value) {
        error(out, "22023", &e.to_string());
        return;
    }
    // The same checks and steps as RELOAD (a value refused at startup is
    // refused here; TLS, hba, syslog… follow).
    let said = crate::reload::apply(app, config);
    if let Some(failed) = said.iter().find(|s| s.starts_with("reload failed")) {
        error(out, "22023", failed);
        return;
    }
    for s in &said {
        sluice_wire::ErrorFields::new(sluice_wire::Severity::Warning, "01000", s).encode(out);
    }
    command_complete(out, "SET");
}

/// Waits until the servers RECONNECT marked (of `db`, or of all) are closed.
async fn wait_closed(app: &App, db: Option<&str>) -> bool {
    let deadline = tokio::time::Instant::now() + PAUSE_WAIT;
    loop {
        let pending: usize = app
            .pools()
            .iter()
            .filter(|p| db.is_none_or(|d| d == p.database))
            .map(|p| p.close_pending())
            .sum();
        if pending == 0 {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until no server of `db` (or of any database) is lent to a client,
/// then closes the idle ones.
async fn wait_released(app: &App, db: Option<&str>) -> bool {
    let deadline = tokio::time::Instant::now() + PAUSE_WAIT;
    loop {
        let pools: Vec<_> = app
            .pools()
            .into_iter()
            .filter(|p| db.is_none_or(|d| d == p.database))
            .collect();
        if pools.iter().all(|p| p.counts().active == 0) {
            for p in pools {
                p.close_idle();
            }
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
