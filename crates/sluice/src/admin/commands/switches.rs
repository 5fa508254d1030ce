//! DISABLE and ENABLE <db>: new logins to the database are refused, or
//! allowed again; clients already in stay.

use bytes::BytesMut;
use sluice_wire::command_complete;

use super::{Line, target};
use crate::admin::error;
use crate::app::App;

pub(super) fn run(app: &App, line: &Line<'_>, out: &mut BytesMut) {
    let Some(db) = line.arg() else {
        return error(out, "42601", "a database is required");
    };
    let disable = line.verb == "DISABLE";
    match target(app, db, if disable { "disable" } else { "enable" }) {
        Ok(db) => {
            app.control.set_disabled(db, disable);
            command_complete(out, &line.verb);
        }
        Err(refused) => refused.send(out),
    }
}
