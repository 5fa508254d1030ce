//! PAUSE, RESUME and SUSPEND: new transactions wait (of one database, or
//! of all) until RESUME; PAUSE returns once no server is lent.

use bytes::BytesMut;
use sluice_wire::command_complete;

use super::{Line, WAIT_LIMIT, already_paused, known_database, no_such_database, target};
use crate::admin::error;
use crate::app::{App, Phase};

pub(super) async fn pause(app: &App, line: &Line<'_>, out: &mut BytesMut) {
    if app.control.all_paused() {
        return already_paused().send(out);
    }
    // A pause begun now could not be ended (RESUME is refused while
    // shutting down): the clients would wait for nothing.
    if app.phase() != Phase::Running {
        return error(out, "08P01", "pooler is shutting down");
    }
    let db = match line.arg().map(|db| target(app, db, "pause")).transpose() {
        Ok(db) => db,
        Err(refused) => return refused.send(out),
    };
    app.control.pause(db);
    if wait_released(app, db).await {
        command_complete(out, "PAUSE");
    } else if !paused(app, db) {
        // Ended while it waited: a cancel from the console, or a RESUME.
        error(out, "57014", "canceling statement due to user request");
    } else {
        error(
            out,
            "57014",
            "PAUSE timed out waiting for servers to be released, or for clients in a READ \
             ONLY block that holds no server yet (before its first query); the pause stays \
             in force (RESUME ends it)",
        );
    }
}

/// RESUME without a database ends every pause, the global one and those
/// by name (PgBouncer's ends only the global one); with a database, that
/// database's pause. Refused, with PgBouncer's texts, when there is no
/// such pause or the pooler is shutting down.
pub(super) fn resume(app: &App, line: &Line<'_>, out: &mut BytesMut) {
    match line.arg() {
        None if app.phase() != Phase::Running => {
            return error(out, "08P01", "pooler is shutting down");
        }
        None if !app.control.anything_paused() => {
            return error(out, "08P01", "pooler is not paused/suspended");
        }
        Some(db) if !known_database(app, db) => return no_such_database(db).send(out),
        Some(db) if !app.control.paused_by_name(db) => {
            return error(out, "08P01", &format!("database {db} is not paused"));
        }
        _ => {}
    }
    app.control.resume(line.arg());
    command_complete(out, "RESUME");
}

pub(super) fn suspend(app: &App, out: &mut BytesMut) {
    if app.control.all_paused() {
        return already_paused().send(out);
    }
    error(
        out,
        "0A000",
        "SUSPEND exists for PgBouncer's online restart (-R), which sluice replaces: \
         start a second sluice with so_reuseport = 1 and send this one SIGTERM",
    );
}

/// Whether the pause a PAUSE began is still in force.
fn paused(app: &App, db: Option<&str>) -> bool {
    app.pause_in_force(db)
}

/// Waits until no server of `db` (or of any database) is lent to a client,
/// then closes the idle ones; false if it gave up (the time limit, or the
/// pause ended meanwhile).
async fn wait_released(app: &App, db: Option<&str>) -> bool {
    app.wait_paused_released(db, Some(WAIT_LIMIT)).await
}
