//! Conversions between the text of one setting and its typed value, in both
//! directions: reading pgbouncer.ini or `SET key = value`, and showing the
//! value the way PgBouncer's SHOW CONFIG does (times in seconds, booleans as
//! 0/1). A failed parse yields the reason, for the caller to place in an
//! error that also names the file, line and key.

use std::marker::PhantomData;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use crate::choices::UnknownChoice;
use crate::time_text::{parse_seconds, show_seconds};

/// How one kind of setting value is read from text and shown as text.
pub(crate) trait Codec {
    type Value;
    /// Parses `text` (already trimmed by the reader); `Err` is the reason.
    fn parse(text: &str) -> Result<Self::Value, String>;
    /// Formats `value` for SHOW CONFIG.
    fn show(value: &Self::Value) -> String;
}

const NOT_A_COUNT: &str = "expected a non-negative integer";

/// Parses a non-negative decimal integer that fits in `u32`.
pub(crate) fn parse_count(text: &str) -> Result<u32, String> {
    let digits = text.trim();
    if digits.starts_with('-') && digits.len() > 1 {
        return Err(format!("{NOT_A_COUNT}, not a negative number"));
    }
    if digits.is_empty() || !digits.bytes().all(|byte| byte.is_ascii_digit()) {
        return Err(NOT_A_COUNT.to_string());
    }
    digits
        .parse::<u32>()
        .map_err(|_| format!("{NOT_A_COUNT} no larger than {}", u32::MAX))
}

/// Parses a TCP port, 1 to 65535.
pub(crate) fn parse_port(text: &str) -> Result<u16, String> {
    const RANGE: &str = "expected a port number between 1 and 65535";
    match parse_count(text) {
        Ok(port @ 1..=65535) => u16::try_from(port).map_err(|_| RANGE.to_string()),
        _ => Err(RANGE.to_string()),
    }
}

/// Parses a boolean: 0/1, yes/no, true/false, on/off (any letter case).
pub(crate) fn parse_flag(text: &str) -> Result<bool, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "1" | "yes" | "true" | "on" => Ok(true),
        "0" | "no" | "false" | "off" => Ok(false),
        _ => Err("expected a boolean (0/1, yes/no, true/false, on/off)".to_string()),
    }
}

/// Splits a comma-separated list, trimming items and dropping empty ones.
pub(crate) fn parse_list(text: &str) -> Vec<String> {
    text.split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
        .map(str::to_string)
        .collect()
}

/// Any non-negative integer (`u32`).
pub(crate) struct Count;
impl Codec for Count {
    type Value = u32;
    fn parse(text: &str) -> Result<u32, String> {
        parse_count(text)
    }
    fn show(value: &u32) -> String {
        value.to_string()
    }
}

/// A positive integer: 0 is refused (`max_client_conn`).
pub(crate) struct PositiveCount;
impl Codec for PositiveCount {
    type Value = u32;
    fn parse(text: &str) -> Result<u32, String> {
        match parse_count(text)? {
            0 => Err("must be at least 1".to_string()),
            count => Ok(count),
        }
    }
    fn show(value: &u32) -> String {
        value.to_string()
    }
}

/// `peer_id`: 0 (peering off) to 16383.
pub(crate) struct PeerId;
impl Codec for PeerId {
    type Value = u32;
    fn parse(text: &str) -> Result<u32, String> {
        match parse_count(text)? {
            id @ 0..=16383 => Ok(id),
            _ => Err("expected a peer id between 0 and 16383".to_string()),
        }
    }
    fn show(value: &u32) -> String {
        value.to_string()
    }
}

/// A count of threads (`usize`); 0 means one per CPU.
pub(crate) struct ThreadCount;
impl Codec for ThreadCount {
    type Value = usize;
    fn parse(text: &str) -> Result<usize, String> {
        parse_count(text).map(|count| count as usize)
    }
    fn show(value: &usize) -> String {
        value.to_string()
    }
}

/// A TCP port, 1 to 65535.
pub(crate) struct Port;
impl Codec for Port {
    type Value = u16;
    fn parse(text: &str) -> Result<u16, String> {
        parse_port(text)
    }
    fn show(value: &u16) -> String {
        value.to_string()
    }
}

/// A boolean, shown as 0/1.
pub(crate) struct Flag;
impl Codec for Flag {
    type Value = bool;
    fn parse(text: &str) -> Result<bool, String> {
        parse_flag(text)
    }
    fn show(value: &bool) -> String {
        u8::from(*value).to_string()
    }
}

/// A time, stored as a `Duration`, shown in seconds.
pub(crate) struct Seconds;
impl Codec for Seconds {
    type Value = Duration;
    fn parse(text: &str) -> Result<Duration, String> {
        parse_seconds(text)
    }
    fn show(value: &Duration) -> String {
        show_seconds(value)
    }
}

/// Free text, kept as written (empty allowed).
pub(crate) struct Text;
impl Codec for Text {
    type Value = String;
    fn parse(text: &str) -> Result<String, String> {
        Ok(text.to_string())
    }
    fn show(value: &String) -> String {
        value.clone()
    }
}

/// Text where empty means "not set".
pub(crate) struct OptionalText;
impl Codec for OptionalText {
    type Value = Option<String>;
    fn parse(text: &str) -> Result<Option<String>, String> {
        Ok((!text.is_empty()).then(|| text.to_string()))
    }
    fn show(value: &Option<String>) -> String {
        value.clone().unwrap_or_default()
    }
}

/// A file path where empty means "not set". The file reader resolves
/// relative paths afterwards, since only it knows the including file.
pub(crate) struct OptionalPath;
impl Codec for OptionalPath {
    type Value = Option<PathBuf>;
    fn parse(text: &str) -> Result<Option<PathBuf>, String> {
        Ok((!text.is_empty()).then(|| PathBuf::from(text)))
    }
    fn show(value: &Option<PathBuf>) -> String {
        value
            .as_ref()
            .map(|path| path.display().to_string())
            .unwrap_or_default()
    }
}

/// A comma-separated list of names.
pub(crate) struct List;
impl Codec for List {
    type Value = Vec<String>;
    fn parse(text: &str) -> Result<Vec<String>, String> {
        Ok(parse_list(text))
    }
    fn show(value: &Vec<String>) -> String {
        value.join(",")
    }
}

/// A file mode in octal (`0777`, `0o660`), at most `07777`.
pub(crate) struct OctalMode;
impl Codec for OctalMode {
    type Value = u32;
    fn parse(text: &str) -> Result<u32, String> {
        const EXPECTED: &str = "expected an octal file mode such as 0777";
        let digits = text.strip_prefix("0o").unwrap_or(text);
        if digits.is_empty() || !digits.bytes().all(|byte| (b'0'..=b'7').contains(&byte)) {
            return Err(EXPECTED.to_string());
        }
        match u32::from_str_radix(digits, 8) {
            Ok(mode @ 0..=0o7777) => Ok(mode),
            _ => Err(EXPECTED.to_string()),
        }
    }
    fn show(value: &u32) -> String {
        format!("{value:04o}")
    }
}

/// One word from a closed set, such as a pool mode.
pub(crate) struct Choice<T>(PhantomData<T>);
impl<T> Codec for Choice<T>
where
    T: FromStr<Err = UnknownChoice> + std::fmt::Display,
{
    type Value = T;
    fn parse(text: &str) -> Result<T, String> {
        text.parse().map_err(|err: UnknownChoice| err.to_string())
    }
    fn show(value: &T) -> String {
        value.to_string()
    }
}

/// A TLS mode word, kept as text (sluice does not do TLS yet) but checked
/// against the modes PgBouncer knows.
pub(crate) struct SslMode;
impl Codec for SslMode {
    type Value = String;
    fn parse(text: &str) -> Result<String, String> {
        const MODES: [&str; 6] = [
            "disable",
            "allow",
            "prefer",
            "require",
            "verify-ca",
            "verify-full",
        ];
        let word = text.to_ascii_lowercase();
        if MODES.contains(&word.as_str()) {
            Ok(word)
        } else {
            Err(format!("expected one of {}", MODES.join(", ")))
        }
    }
    fn show(value: &String) -> String {
        value.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts() {
        assert_eq!(parse_count("20"), Ok(20));
        assert_eq!(parse_count(" 7 "), Ok(7));
        assert!(parse_count("-1").unwrap_err().contains("negative"));
        assert!(parse_count("abc").is_err());
        assert!(parse_count("").is_err());
        assert!(parse_count("1.5").is_err());
        assert!(parse_count("4294967296").unwrap_err().contains("no larger"));
    }

    #[test]
    fn ports() {
        assert_eq!(parse_port("6432"), Ok(6432));
        assert!(parse_port("0").is_err());
        assert!(parse_port("65536").is_err());
    }

    #[test]
    fn flags() {
        for yes in ["1", "yes", "TRUE", "on"] {
            assert_eq!(parse_flag(yes), Ok(true));
        }
        for no in ["0", "No", "false", "OFF"] {
            assert_eq!(parse_flag(no), Ok(false));
        }
        assert!(parse_flag("2").is_err());
    }

    #[test]
    fn octal_modes() {
        assert_eq!(OctalMode::parse("0777"), Ok(0o777));
        assert_eq!(OctalMode::parse("0o660"), Ok(0o660));
        assert_eq!(OctalMode::show(&0o777), "0777");
        assert!(OctalMode::parse("0888").is_err());
        assert!(OctalMode::parse("77777").is_err());
    }

    #[test]
    fn lists() {
        assert_eq!(parse_list("a, b,,c "), vec!["a", "b", "c"]);
        assert!(parse_list(" ").is_empty());
    }
}
