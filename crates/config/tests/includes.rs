//! `%include`: relative paths, textual sections, loops and depth.

mod common;

use std::path::Path;

use common::{fixture, scratch_dir};
use sluice_config::{AuthType, ConfigError, load, parse_str};

#[test]
fn relative_include_is_read_in_place() {
    let main = fixture("include/main.ini");
    let config = load(&main).unwrap();
    assert_eq!(config.settings.listen_port, 7432);
    assert_eq!(config.settings.auth_type, AuthType::Trust);
    // A key after the %include line is back in main.ini's [pgbouncer].
    assert_eq!(config.settings.max_client_conn, 500);
    // auth_file is relative to the file that set it.
    assert_eq!(
        config.settings.auth_file,
        Some(fixture("include/settings.d/users.txt"))
    );
    let included = config.database("included_db").unwrap();
    assert_eq!(included.dbname.as_deref(), Some("inc"));
    assert_eq!(included.line, 1);
    assert!(config.warnings.is_empty(), "{:?}", config.warnings);
}

#[test]
fn parse_str_resolves_includes_from_origin() {
    let origin = fixture("include/virtual.ini");
    let config = parse_str("[databases]\n%include settings.d/databases.ini\n", &origin).unwrap();
    assert!(config.database("included_db").is_some());
}

#[test]
fn include_loop_is_an_error() {
    let err = load(&fixture("include_loop/first.ini")).unwrap_err();
    assert!(
        matches!(err, ConfigError::IncludeLoop { line: 2, .. }),
        "{err:?}"
    );
    let message = err.to_string();
    assert!(message.contains("second.ini:2: %include loop"), "{message}");
    assert!(
        message.contains("first.ini is already being read"),
        "{message}"
    );
}

#[test]
fn self_include_is_a_loop() {
    let dir = scratch_dir("self_include");
    let path = dir.join("self.ini");
    std::fs::write(&path, "[pgbouncer]\n%include self.ini\n").unwrap();
    let err = load(&path).unwrap_err();
    assert!(
        matches!(err, ConfigError::IncludeLoop { line: 2, .. }),
        "{err:?}"
    );
}

#[test]
fn ten_nested_includes_are_fine_eleven_are_not() {
    let dir = scratch_dir("include_depth");
    // level_N.ini includes level_{N+1}.ini; the last one sets a key.
    let write_chain = |levels: usize| {
        for level in 0..levels {
            std::fs::write(
                dir.join(format!("level_{level}.ini")),
                format!("%include level_{}.ini\n", level + 1),
            )
            .unwrap();
        }
        std::fs::write(
            dir.join(format!("level_{levels}.ini")),
            "[pgbouncer]\nlisten_port = 7777\n",
        )
        .unwrap();
    };
    write_chain(10);
    let config = load(&dir.join("level_0.ini")).unwrap();
    assert_eq!(config.settings.listen_port, 7777);

    write_chain(11);
    let err = load(&dir.join("level_0.ini")).unwrap_err();
    assert!(
        matches!(err, ConfigError::IncludeTooDeep { line: 1, .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("level_10.ini:1:"), "{err}");
}

#[test]
fn missing_include_names_the_including_line() {
    let err = parse_str(
        "[pgbouncer]\n\n%include does-not-exist.ini\n",
        Path::new("/nonexistent-dir/pgbouncer.ini"),
    )
    .unwrap_err();
    let message = err.to_string();
    assert!(
        message.starts_with("/nonexistent-dir/pgbouncer.ini:3: cannot read included file"),
        "{message}"
    );
}

#[test]
fn missing_top_level_file() {
    let err = load(Path::new("/nonexistent-dir/pgbouncer.ini")).unwrap_err();
    assert!(matches!(err, ConfigError::Read { .. }));
    assert!(
        err.to_string()
            .starts_with("/nonexistent-dir/pgbouncer.ini: cannot read")
    );
}
