//! The reference list of every known setting, as SHOW CONFIG, RELOAD and the
//! generated docs need it: key, default as text, whether it may change while
//! running, its section, and a description.

use std::sync::OnceLock;

use crate::key_info::KeyInfo;
use crate::settings::Settings;

/// Keys that are other names for a field, with the field they mean.
const ALIASES: &[(&str, KeyInfo)] = &[(
    "job_name",
    KeyInfo {
        key: "service_name",
        default: "pgbouncer",
        changeable: false,
        section: "pgbouncer",
        doc: "Alias of job_name.",
    },
)];

/// Every known key, sorted by key.
pub fn known_keys() -> &'static [KeyInfo] {
    static SORTED: OnceLock<Vec<KeyInfo>> = OnceLock::new();
    SORTED.get_or_init(|| {
        let mut keys: Vec<KeyInfo> = Settings::FIELD_INFO.to_vec();
        keys.extend(ALIASES.iter().map(|(_, alias)| *alias));
        keys.sort_by_key(|info| info.key);
        keys
    })
}

/// The reference entry for `key` (any letter case, aliases included).
pub fn key_info(key: &str) -> Option<&'static KeyInfo> {
    let key = key.trim().to_ascii_lowercase();
    known_keys().iter().find(|info| info.key == key)
}

/// The field name `key` is stored under: lower case, aliases resolved.
/// Unknown keys come back lower-cased, unchanged otherwise.
pub(crate) fn field_name(key: &str) -> String {
    let key = key.trim().to_ascii_lowercase();
    ALIASES
        .iter()
        .find(|(_, alias)| alias.key == key)
        .map_or(key, |(field, _)| (*field).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sorted_and_unique() {
        let keys: Vec<&str> = known_keys().iter().map(|info| info.key).collect();
        let mut sorted = keys.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(keys, sorted);
    }

    #[test]
    fn lookup_ignores_case() {
        assert_eq!(
            key_info("Listen_Port").map(|info| info.key),
            Some("listen_port")
        );
        assert!(key_info("no_such_key").is_none());
        assert_eq!(field_name("SERVICE_NAME"), "job_name");
    }
}
