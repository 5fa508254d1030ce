//! Harmless oddities become warnings with file and line, not errors.

mod common;

use std::path::PathBuf;

use common::parse_ok;
use sluice_config::Warning;

#[test]
fn unknown_key_is_a_warning_with_its_line() {
    let config = parse_ok("[pgbouncer]\nlisten_port = 6000\n\nno_such_setting = 1\n");
    assert_eq!(config.settings.listen_port, 6000);
    assert_eq!(
        config.warnings,
        [Warning {
            file: PathBuf::from("pgbouncer.ini"),
            line: 4,
            message: "unknown key \"no_such_setting\" in [pgbouncer]; ignored".to_string(),
        }]
    );
    assert_eq!(
        config.warnings[0].to_string(),
        "pgbouncer.ini:4: unknown key \"no_such_setting\" in [pgbouncer]; ignored"
    );
}

#[test]
fn unknown_key_in_sluice_section() {
    let config = parse_ok("[sluice]\nturbo = on\n");
    assert_eq!(config.warnings.len(), 1);
    assert_eq!(config.warnings[0].line, 2);
    assert!(config.warnings[0].message.contains("\"turbo\" in [sluice]"));
}

#[test]
fn unknown_section_is_a_warning() {
    let config = parse_ok("[extras]\nfoo = bar\n[pgbouncer]\nlisten_port = 6001\n");
    assert_eq!(config.warnings.len(), 1);
    assert_eq!(config.warnings[0].line, 1);
    assert!(config.warnings[0].message.contains("[extras]"));
    assert_eq!(config.settings.listen_port, 6001);
}

#[test]
fn key_in_the_other_section_is_accepted_with_a_warning() {
    let config = parse_ok("[pgbouncer]\nworkers = 2\n");
    assert_eq!(config.settings.workers, 2);
    assert_eq!(config.warnings.len(), 1);
    assert!(config.warnings[0].message.contains("belongs in [sluice]"));
}

#[test]
fn key_before_any_section_is_a_warning() {
    let config = parse_ok("listen_port = 1\n[pgbouncer]\n");
    assert_eq!(config.settings.listen_port, 6432);
    assert_eq!(config.warnings.len(), 1);
    assert_eq!(config.warnings[0].line, 1);
}
