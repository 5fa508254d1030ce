//! RECONNECT [db]: every server (of the database) is closed once it is
//! next idle; WAIT_CLOSE [db] returns when those servers are gone.

use std::time::Duration;

use bytes::BytesMut;
use sluice_wire::command_complete;

use super::{Line, WAIT_LIMIT, target};
use crate::admin::error;
use crate::app::App;

pub(super) fn reconnect(app: &App, line: &Line<'_>, out: &mut BytesMut) {
    let db = match line
        .arg()
        .map(|db| target(app, db, "reconnect"))
        .transpose()
    {
        Ok(db) => db,
        Err(refused) => return refused.send(out),
    };
    for p in app.pools() {
        if db.is_none_or(|db| db == p.database) {
            p.reconnect();
        }
    }
    command_complete(out, "RECONNECT");
}

pub(super) async fn wait_close(app: &App, line: &Line<'_>, out: &mut BytesMut) {
    let db = match line.arg().map(|db| target(app, db, "wait in")).transpose() {
        Ok(db) => db,
        Err(refused) => return refused.send(out),
    };
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

/// Waits until the servers RECONNECT marked (of `db`, or of all) are closed.
async fn wait_closed(app: &App, db: Option<&str>) -> bool {
    let deadline = tokio::time::Instant::now() + WAIT_LIMIT;
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
