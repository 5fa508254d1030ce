//! Helpers shared by the sluice-config integration tests.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use sluice_config::{Config, ConfigError, parse_str};

/// Parses `text` as if it were `pgbouncer.ini`, expecting success.
pub fn parse_ok(text: &str) -> Config {
    match parse_str(text, Path::new("pgbouncer.ini")) {
        Ok(config) => config,
        Err(err) => panic!("expected the config to parse, got: {err}"),
    }
}

/// Parses `text` as if it were `pgbouncer.ini`, expecting an error, and
/// returns its message.
pub fn parse_err(text: &str) -> String {
    match parse_str(text, Path::new("pgbouncer.ini")) {
        Ok(config) => panic!("expected an error, got {config:?}"),
        Err(err) => err.to_string(),
    }
}

/// Parses `text` expecting an error, and returns it.
pub fn parse_error(text: &str) -> ConfigError {
    parse_str(text, Path::new("pgbouncer.ini")).unwrap_err()
}

/// A file under tests/fixtures.
pub fn fixture(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(relative)
}

/// A fresh, empty directory for one test's generated files.
pub fn scratch_dir(test_name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(test_name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
