//! What is known about one setting (`KeyInfo`): a leaf, so that the
//! settings table (`settings.rs`, through `settings_macro`) and the
//! reference list built from it (`key_reference.rs`) both use it without
//! depending on each other both ways.

/// What is known about one `[pgbouncer]` or `[sluice]` key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyInfo {
    /// The key, lower case, as written in the ini file.
    pub key: &'static str,
    /// The default, formatted as SHOW CONFIG shows it.
    pub default: &'static str,
    /// Whether RELOAD or SET may change it while running (PgBouncer's
    /// SHOW CONFIG `changeable` column); otherwise a restart is needed.
    pub changeable: bool,
    /// `"pgbouncer"` or `"sluice"`: the ini section it belongs in.
    pub section: &'static str,
    /// One-line description; `(seconds)` marks time values.
    pub doc: &'static str,
}
