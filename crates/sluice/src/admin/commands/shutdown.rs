//! SHUTDOWN [WAIT_FOR_SERVERS|WAIT_FOR_CLIENTS]: as SIGQUIT, SIGINT and
//! SIGTERM.

use bytes::BytesMut;
use sluice_wire::command_complete;

use super::{Line, invalid_command};
use crate::admin::error;
use crate::app::{App, Phase};

pub(super) fn run(app: &App, line: &Line<'_>, out: &mut BytesMut) {
    let phase = match line.arg().map(|w| w.to_ascii_uppercase()).as_deref() {
        None => Phase::Immediate,
        Some("WAIT_FOR_SERVERS") => Phase::WaitForServers,
        Some("WAIT_FOR_CLIENTS") => Phase::WaitForClients,
        Some(_) => {
            error(out, "42601", &invalid_command(line.sql));
            return;
        }
    };
    app.begin_shutdown(phase);
    command_complete(out, "SHUTDOWN");
}
