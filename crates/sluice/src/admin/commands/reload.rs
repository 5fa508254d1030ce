//! RELOAD: the configuration file and the auth_file read again, through
//! the one reload SIGHUP also takes (`crate::reload`). A reload that could
//! not be applied, or only in part (the hba file, a certificate), is an
//! ERROR with PgBouncer's text and code (F0000), the reasons in its
//! DETAIL; what only waits for a restart is a WARNING.

use bytes::BytesMut;
use sluice_wire::{ErrorFields, Severity, command_complete};

use crate::app::App;

pub(super) fn run(app: &App, out: &mut BytesMut) {
    let said = crate::reload::reload(app);
    for warning in &said.warnings {
        ErrorFields::new(Severity::Warning, "01000", warning).encode(out);
    }
    if said.errors.is_empty() {
        command_complete(out, "RELOAD");
        return;
    }
    let detail = said.errors.join("\n");
    ErrorFields {
        detail: Some(&detail),
        ..ErrorFields::new(
            Severity::Error,
            "F0000",
            "RELOAD failed, see logs for additional details",
        )
    }
    .encode(out);
}
