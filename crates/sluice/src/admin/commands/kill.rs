//! KILL [db] and KILL_CLIENT <id>: clients disconnected at once, through
//! the cancel registry, which holds every client's socket. KILL also
//! pauses the databases it empties, as PgBouncer's does: new clients wait
//! until RESUME, which is how a database is dropped or restored under a
//! pooler. Each client is told PgBouncer's reason (FATAL 08P01 "database
//! removed", "admin forced disconnect") by its own task, where its stream
//! is at a message boundary; one that is not, or does not read to the end
//! of its socket within `cancel::KILL_GRACE`, is cut off without a word.

use std::collections::BTreeSet;

use bytes::BytesMut;
use sluice_wire::command_complete;

use super::{Line, already_paused, target};
use crate::admin::error;
use crate::app::App;
use crate::backend::cancel::Kill;

pub(super) fn kill(app: &App, line: &Line<'_>, out: &mut BytesMut) {
    if app.control.all_paused() {
        return already_paused().send(out);
    }
    let db = match line.arg().map(|db| target(app, db, "kill")).transpose() {
        Ok(db) => db,
        Err(refused) => return refused.send(out),
    };
    let paused: BTreeSet<String> = match db {
        Some(db) => BTreeSet::from([db.to_owned()]),
        None => app
            .main_pools()
            .iter()
            .map(|p| p.database.clone())
            .collect(),
    };
    // Paused first: a client logging in meanwhile waits instead of
    // slipping in between the kill and the pause.
    for name in &paused {
        app.control.pause(Some(name));
    }
    let count = app.cancels.kill_and_cut(Kill::DatabaseRemoved, |_, m| {
        db.is_none_or(|db| m.pool.database == db)
    });
    for p in app.pools() {
        if db.is_none_or(|db| db == p.database) {
            p.reconnect();
        }
    }
    tracing::info!(
        "KILL {}: {count} clients disconnected; paused until RESUME",
        db.unwrap_or("(all databases)")
    );
    command_complete(out, "KILL");
}

pub(super) fn kill_client(app: &App, line: &Line<'_>, out: &mut BytesMut) {
    match line.arg().and_then(|id| id.parse::<i32>().ok()) {
        Some(id) => {
            if app
                .cancels
                .kill_and_cut(Kill::AdminForced, |pid, _| pid == id)
                == 1
            {
                command_complete(out, "KILL_CLIENT");
            } else {
                error(out, "42704", "client not found");
            }
        }
        None => error(out, "42601", "invalid client pointer supplied"),
    }
}
