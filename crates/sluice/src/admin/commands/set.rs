//! SET key = value (or key TO value): one setting changed in memory,
//! validated like the file and applied through the reload's steps.

use bytes::BytesMut;
use sluice_wire::{ErrorFields, Severity, command_complete};

use super::{Line, invalid_command};
use crate::admin::error;
use crate::app::App;

pub(super) fn run(app: &App, line: &Line<'_>, out: &mut BytesMut) {
    // After the verb (`SET`, three bytes of ASCII).
    let args = line.text.get(3..).unwrap_or_default();
    let parsed = args
        .split_once('=')
        .or_else(|| {
            let lower = args.to_ascii_lowercase();
            lower.find(" to ").map(|i| (&args[..i], &args[i + 4..]))
        })
        .map(|(k, v)| (k.trim(), v.trim().trim_matches('\'')));
    let Some((key, value)) = parsed else {
        error(out, "42601", &invalid_command(line.sql));
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
    if let Some(failed) = said.refused() {
        error(out, "22023", failed);
        return;
    }
    for s in said.errors.iter().chain(&said.warnings) {
        ErrorFields::new(Severity::Warning, "01000", s).encode(out);
    }
    command_complete(out, "SET");
}
