//! The one JSON line the CLI prints, written by hand (no serde in the testkit).

use std::fmt::Write;

use sluice_testkit::{Cluster, SUPERUSER_PASSWORD};

/// `{"host":..,"port":..,"socket_dir":..,"data_dir":..,"superuser":..,
/// "password":..,"replica_port":N|null}`
pub fn describe(primary: &Cluster, replica: Option<&Cluster>) -> String {
    let replica_port = replica.map_or_else(|| "null".to_owned(), |r| r.port().to_string());
    format!(
        "{{\"host\":{},\"port\":{},\"socket_dir\":{},\"data_dir\":{},\"superuser\":{},\"password\":{},\"replica_port\":{}}}",
        string(primary.host()),
        primary.port(),
        string(&primary.socket_dir().to_string_lossy()),
        string(&primary.data_dir().to_string_lossy()),
        string(primary.superuser()),
        string(SUPERUSER_PASSWORD),
        replica_port,
    )
}

/// A JSON string literal.
fn string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::string;

    #[test]
    fn escapes() {
        assert_eq!(string("a\"b\\c\n\u{1}é"), "\"a\\\"b\\\\c\\n\\u0001é\"");
    }
}
