//! PgBouncer's one `load_config()`: a configuration read again (SIGHUP,
//! the console's RELOAD, the web console) or changed in memory (the
//! console's SET) goes through the same checks and steps, and what went
//! wrong is logged and returned for the console to repeat. Apart from the
//! control loop (`control.rs`, which owns the workers), so that the
//! console, which the listeners serve, can reload without depending on
//! the workers that run the listeners.

use crate::app::App;
use crate::auth::Userlist;

/// Reloads the configuration file and the auth_file (SIGHUP and the
/// console's RELOAD), telling systemd around it. Returns what went wrong or
/// waits for a restart, each already logged, for the console to repeat.
pub fn reload(app: &App) -> Said {
    crate::sd_notify::reloading();
    let mut said = Said::default();
    reload_into(app, &mut said);
    crate::sd_notify::reloaded();
    said
}

/// The start of the error of a reload that applied nothing.
const REFUSED: &str = "reload failed, keeping the old configuration";

/// What a reload logged: errors (something was not applied) and warnings
/// (a value ignored, a change that waits for a restart).
#[derive(Default)]
pub struct Said {
    pub errors: Vec<String>,
    pub warnings: Vec<String>,
}

impl Said {
    fn warn(&mut self, message: String) {
        tracing::warn!("{message}");
        self.warnings.push(message);
    }

    fn error(&mut self, message: String) {
        tracing::error!("{message}");
        self.errors.push(message);
    }

    /// The error of a reload that applied nothing (the file unreadable, a
    /// value refused), if it was one.
    pub fn refused(&self) -> Option<&str> {
        self.errors
            .iter()
            .find(|e| e.starts_with(REFUSED))
            .map(String::as_str)
    }
}

/// The keys whose new value waits for a restart: every key the settings
/// table marks not changeable whose value differs.
pub fn restart_needed(
    old: &sluice_config::Settings,
    new: &sluice_config::Settings,
) -> Vec<&'static str> {
    sluice_config::known_keys()
        .iter()
        .filter(|info| !info.changeable && old.value_of(info.key) != new.value_of(info.key))
        .map(|info| info.key)
        .collect()
}

/// A set of TLS settings that did not load (`client_tls*` or
/// `server_tls*`, the TLS 1.3 ciphers too): SHOW CONFIG goes on showing
/// the files in force (a review saw the new, unreadable CA file listed
/// while the old one checked servers), and the new mode if `raised` (it is
/// in force: what needs TLS is refused until a certificate loads).
fn keep_in_force(
    new: &mut sluice_config::Settings,
    old: &sluice_config::Settings,
    prefix: &str,
    raised: bool,
) {
    for info in sluice_config::known_keys() {
        if info.key.starts_with(prefix) && !(raised && info.key.ends_with("_sslmode")) {
            new.keep(info.key, old);
        }
    }
}

fn reload_into(app: &App, said: &mut Said) {
    let config = match sluice_config::load(&app.config_path) {
        Ok(c) => c,
        Err(e) => {
            said.error(format!("{REFUSED}: {e}"));
            return;
        }
    };
    for w in &config.warnings {
        said.warn(w.to_string());
    }
    apply_into(app, config, said);
}

/// Applies a configuration changed in memory (the console's SET) through
/// the same checks and steps as a RELOAD, the auth_file read again.
pub fn apply(app: &App, config: sluice_config::Config) -> Said {
    crate::sd_notify::reloading();
    let mut said = Said::default();
    apply_into(app, config, &mut said);
    crate::sd_notify::reloaded();
    said
}

fn apply_into(app: &App, mut config: sluice_config::Config, said: &mut Said) {
    if let Err(e) = crate::daemon::check_supported(&config.settings) {
        said.error(format!("{REFUSED}: {e}"));
        return;
    }
    let userlist = match &config.settings.auth_file {
        Some(path) => match Userlist::load(path) {
            Ok(u) => u,
            Err(e) => {
                said.error(format!("{REFUSED}: {e}"));
                return;
            }
        },
        None => Userlist::default(),
    };
    let old = app.config();
    for key in restart_needed(&old.settings, &config.settings) {
        said.warn(format!(
            "{key} changed from {} to {}; it takes effect only after a restart",
            old.settings.value_of(key).unwrap_or_default(),
            config.settings.value_of(key).unwrap_or_default()
        ));
        // What is in force stays, for SHOW CONFIG and for the next RELOAD
        // (which then warns again while the file still differs).
        config.settings.keep(key, &old.settings);
    }
    // New hba rules, certificates and keys for clients that connect from
    // now on; a broken set keeps the old one (connected clients keep
    // theirs anyway).
    match crate::auth::rules::AuthRules::load(&config.settings) {
        Ok(rules) => app.set_auth_rules(rules),
        Err(e) => said.error(format!(
            "auth_hba_file not reloaded, keeping the old rules: {e}"
        )),
    }
    let certs = app
        .auth_rules()
        .wants_client_certificates(config.settings.auth_type);
    match crate::tls::ClientTls::from_settings(&config.settings, certs) {
        Ok(tls) => app.set_client_tls(tls),
        Err(e) => {
            said.error(format!("client TLS not reloaded, keeping the old one: {e}"));
            let wanted =
                crate::tls::Mode::parse("client_tls_sslmode", &config.settings.client_tls_sslmode);
            let old_tls = app.client_tls();
            let raised = wanted.as_ref().is_ok_and(|w| *w > old_tls.mode);
            keep_in_force(&mut config.settings, &old.settings, "client_tls", raised);
            let old = old_tls;
            if let Ok(wanted) = wanted
                && wanted > old.mode
            {
                said.error(if old.offers() {
                    format!(
                        "client_tls_sslmode {wanted:?} is in force with the old certificate \
                         (TCP logins without TLS are refused)"
                    )
                } else {
                    format!(
                        "client_tls_sslmode {wanted:?} is in force with no certificate: every \
                         TCP login is refused until one loads"
                    )
                });
                app.set_client_tls(old.at_least(wanted));
            }
        }
    }
    match crate::tls::ServerTls::from_settings(&config.settings) {
        Ok(tls) => app.set_server_tls(tls),
        Err(e) => {
            let wanted =
                crate::tls::Mode::parse("server_tls_sslmode", &config.settings.server_tls_sslmode);
            let in_force = app.server_tls().mode.unwrap_or(crate::tls::Mode::Disable);
            let raised = wanted.as_ref().is_ok_and(|w| *w > in_force);
            keep_in_force(&mut config.settings, &old.settings, "server_tls", raised);
            let old = in_force;
            match wanted {
                Ok(wanted) if wanted > old => {
                    said.error(format!(
                        "server TLS not reloaded: {e}; server_tls_sslmode {wanted:?} cannot be \
                         honoured, so no new server connection is opened until it can"
                    ));
                    app.set_server_tls(crate::tls::ServerTls::refusing(wanted, e.to_string()));
                }
                _ => said.error(format!("server TLS not reloaded, keeping the old one: {e}")),
            }
        }
    }
    crate::logging::configure_syslog(&config.settings);
    // (a rotated log goes on in a new file: PgBouncer's SIGHUP after
    // rotation)
    if let Err(e) = crate::logging::reopen(&config.settings.logfile) {
        said.error(format!(
            "logfile {} could not be opened, logging goes on where it went: {e}",
            config.settings.logfile
        ));
        config.settings.logfile = old.settings.logfile.clone();
    }
    crate::daemon::warn_without_effect(&config.settings);
    crate::auth::scram::set_iterations(config.settings.scram_iterations);
    app.reload(config, Some(userlist));
    crate::frontend::forget_login_failures();
    tracing::info!("configuration reloaded");
}
