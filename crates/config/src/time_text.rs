//! Times as written in pgbouncer.ini: seconds, possibly fractional, or a
//! number with a unit (`ms`, `s`, `min`, `h`), converted exactly to a
//! `Duration`; and back to seconds the way PgBouncer shows them.

use std::time::Duration;

const NOT_A_TIME: &str =
    "expected a non-negative time in seconds (e.g. 30 or 2.5) or with a unit (ms, s, min, h)";

/// The longest time taken: every clock adds times to the present, and a
/// time near `u64::MAX` seconds overflowed there (a panic at every login
/// after `SET client_login_timeout = 18446744073709551615`; found by a
/// review).
const MAX_SECONDS: u64 = 100 * 365 * 24 * 3600;

/// Parses a time: seconds, possibly fractional (`5`, `5.0`, `0.25`), or a
/// number followed by one of the units `ms`, `s`, `min`, `h` (`250ms`,
/// `2 min`). Decimal digits are converted exactly, to the nanosecond.
pub(crate) fn parse_seconds(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let unit_start = text
        .find(|c: char| c.is_ascii_alphabetic())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(unit_start);
    let nanos_per_unit: u128 = match unit.to_ascii_lowercase().as_str() {
        "" | "s" => 1_000_000_000,
        "ms" => 1_000_000,
        "min" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        _ => return Err(NOT_A_TIME.to_string()),
    };
    let number = number.trim();
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    let all_digits = |part: &str| part.bytes().all(|byte| byte.is_ascii_digit());
    if whole.is_empty() && fraction.is_empty() || !all_digits(whole) || !all_digits(fraction) {
        return Err(NOT_A_TIME.to_string());
    }
    let too_long = || format!("time is too long (at most {MAX_SECONDS} s, about 100 years)");
    let whole_units: u128 = if whole.is_empty() {
        0
    } else {
        whole.parse().map_err(|_| too_long())?
    };
    // Digits past the 18th are below a nanosecond for every unit; drop them.
    let fraction = &fraction[..fraction.len().min(18)];
    let fraction_scale = 10u128.pow(u32::try_from(fraction.len()).map_err(|_| too_long())?);
    let fraction_units: u128 = if fraction.is_empty() {
        0
    } else {
        fraction.parse().map_err(|_| too_long())?
    };
    let total_nanos = whole_units
        .checked_mul(nanos_per_unit)
        .and_then(|nanos| nanos.checked_add(fraction_units * nanos_per_unit / fraction_scale))
        .ok_or_else(too_long)?;
    let seconds = u64::try_from(total_nanos / 1_000_000_000)
        .ok()
        .filter(|&s| s <= MAX_SECONDS)
        .ok_or_else(too_long)?;
    let subsec_nanos = u32::try_from(total_nanos % 1_000_000_000).map_err(|_| too_long())?;
    Ok(Duration::new(seconds, subsec_nanos))
}

/// Parses a per-entry timeout where `-1` means "not set".
pub(crate) fn parse_optional_seconds(text: &str) -> Result<Option<Duration>, String> {
    if text.trim() == "-1" {
        Ok(None)
    } else {
        parse_seconds(text).map(Some)
    }
}

/// Shows a time in seconds the way PgBouncer does: `5`, `0.5`, `2.25`.
pub(crate) fn show_seconds(duration: &Duration) -> String {
    let seconds = duration.as_secs();
    match duration.subsec_nanos() {
        0 => seconds.to_string(),
        nanos => {
            let fraction = format!("{nanos:09}");
            format!("{seconds}.{}", fraction.trim_end_matches('0'))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times() {
        assert_eq!(parse_seconds("5"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_seconds("5.0"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_seconds("0.25"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_seconds(".5"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_seconds("1500ms"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_seconds("2 min"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_seconds("1.5h"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_seconds("3s"), Ok(Duration::from_secs(3)));
        assert_eq!(parse_seconds("0.1ms"), Ok(Duration::from_micros(100)));
        for bad in ["", "-1", "abc", "1.2.3", ".", "5 days", "1e3", "inf", "NaN"] {
            assert!(parse_seconds(bad).is_err(), "{bad} should be refused");
        }
        assert!(parse_seconds("99999999999999999999999").is_err());
        // Times every clock can add to the present.
        assert!(parse_seconds("18446744073709551615").is_err());
        assert!(parse_seconds("9300000000000000000").is_err());
        assert!(parse_seconds("1000000h").is_err());
        assert_eq!(
            parse_seconds("3153600000"),
            Ok(Duration::from_secs(MAX_SECONDS))
        );
    }

    #[test]
    fn times_show_as_seconds() {
        assert_eq!(show_seconds(&Duration::from_secs(3600)), "3600");
        assert_eq!(show_seconds(&Duration::from_millis(500)), "0.5");
        assert_eq!(show_seconds(&Duration::from_millis(2250)), "2.25");
        assert_eq!(show_seconds(&Duration::ZERO), "0");
    }
}
