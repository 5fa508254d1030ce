//! KILL [db] and KILL_CLIENT <id>: clients disconnected at once, through
//! the cancel registry, which holds every client's socket. KILL also
//! pauses the databases it empties, as PgBouncer's does: new clients wait
//! until RESUME, which is how a database is dropped or restored under a
//! pooler. Each client is told PgBouncer's reason (FATAL 08P01 "database
//! removed", "admin forced disconnect") by its own task, where its stream
//! is at a message boundary; one that is not, or does not read to the end
//! of its socket within `KILL_GRACE`, is cut off without a word.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use sluice_wire::command_complete;

use super::{Line, already_paused, target};
use crate::admin::error;
use crate::app::App;
use crate::backend::cancel::{Kill, Killed};

/// How long a killed client's task has to say goodbye before its socket is
/// shut down for good.
const KILL_GRACE: Duration = Duration::from_millis(500);

/// Cuts off, after the grace, the killed clients still connected.
fn cut_later(app: &App, killed: Vec<Killed>) {
    if killed.is_empty() {
        return;
    }
    let cancels = Arc::clone(&app.cancels);
    tokio::spawn(async move {
        tokio::time::sleep(KILL_GRACE).await;
        let cut = cancels.cut(&killed);
        if cut > 0 {
            tracing::info!("KILL: {cut} clients cut off after {KILL_GRACE:?} without a goodbye");
        }
    });
}

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
    let killed = app.cancels.kill(Kill::DatabaseRemoved, |_, m| {
        db.is_none_or(|db| m.pool.database == db)
    });
    let count = killed.len();
    cut_later(app, killed);
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
            let killed = app.cancels.kill(Kill::AdminForced, |pid, _| pid == id);
            if killed.len() == 1 {
                cut_later(app, killed);
                command_complete(out, "KILL_CLIENT");
            } else {
                error(out, "42704", "client not found");
            }
        }
        None => error(out, "42601", "invalid client pointer supplied"),
    }
}
