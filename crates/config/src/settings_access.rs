//! Reading and changing one setting by key at run time: SHOW CONFIG's
//! `value_of` and the admin console's `SET key = value`.

use crate::error::ConfigError;
use crate::key_reference::{field_name, key_info};
use crate::settings::Settings;

impl Settings {
    /// The current value of `key` (any letter case), formatted as
    /// PgBouncer's SHOW CONFIG shows it: times in seconds (`0.5`, `30`),
    /// booleans as `0`/`1`, lists comma-separated, unset values empty.
    /// `None` if the key is not known.
    pub fn value_of(&self, key: &str) -> Option<String> {
        self.show_field(&field_name(key))
    }

    /// Keeps `old`'s value of `key`: a RELOAD of a key that takes effect
    /// only after a restart leaves the value in force, so that SHOW CONFIG
    /// shows what is in force. False if the key is not known.
    pub fn keep(&mut self, key: &str, old: &Settings) -> bool {
        self.copy_field(&field_name(key), old)
    }

    /// Changes `key` to `value`, checked as strictly as the file reader
    /// checks it. Keys that are not `changeable` (see `known_keys`) are
    /// refused with `NotChangeable`, as PgBouncer refuses them.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), ConfigError> {
        let info = key_info(key).ok_or_else(|| ConfigError::UnknownKey {
            key: key.to_string(),
        })?;
        if !info.changeable {
            return Err(ConfigError::NotChangeable {
                key: info.key.to_string(),
            });
        }
        let value = value.trim();
        match self.apply_field(&field_name(info.key), value) {
            Some(Ok(())) => Ok(()),
            Some(Err(reason)) => Err(ConfigError::InvalidSetting {
                key: info.key.to_string(),
                value: value.to_string(),
                reason,
            }),
            None => Err(ConfigError::UnknownKey {
                key: key.to_string(),
            }),
        }
    }
}
