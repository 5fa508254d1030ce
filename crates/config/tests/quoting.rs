//! Quoting in connection strings and database names.

mod common;

use common::{parse_err, parse_ok};

#[test]
fn quoted_values_with_escapes() {
    let config = parse_ok(
        "[databases]\n\
         app = password='it\\'s a \\\\ secret' connect_query='SELECT ''x''' host=h\n",
    );
    let app = config.database("app").unwrap();
    assert_eq!(app.password.as_deref(), Some("it's a \\ secret"));
    assert_eq!(app.connect_query.as_deref(), Some("SELECT 'x'"));
    assert_eq!(app.host.as_deref(), Some("h"));
}

#[test]
fn quoted_value_keeps_spaces_and_equals() {
    let config = parse_ok("[databases]\napp = connect_query='SET a = 1; SET b = 2'\n");
    assert_eq!(
        config.database("app").unwrap().connect_query.as_deref(),
        Some("SET a = 1; SET b = 2")
    );
}

#[test]
fn backslash_before_other_characters_is_kept() {
    let config = parse_ok("[databases]\napp = password='a\\nb'\n");
    assert_eq!(
        config.database("app").unwrap().password.as_deref(),
        Some("a\\nb")
    );
}

#[test]
fn quoted_database_name() {
    let config = parse_ok("[databases]\n\"my-db \"\"x\"\"\" = host=h\n");
    assert_eq!(config.databases[0].name, "my-db \"x\"");
}

#[test]
fn comment_characters_inside_values_are_kept() {
    let config = parse_ok("[databases]\napp = password=a;b#c\n[pgbouncer]\nlogfile = /x#y.log\n");
    assert_eq!(
        config.database("app").unwrap().password.as_deref(),
        Some("a;b#c")
    );
    assert_eq!(config.settings.logfile, "/x#y.log");
}

#[test]
fn unterminated_quote_is_an_error_with_line() {
    let message = parse_err("[databases]\n\napp = password='abc\n");
    assert!(
        message.starts_with("pgbouncer.ini:3: syntax error") && message.contains("unterminated"),
        "{message}"
    );
}
