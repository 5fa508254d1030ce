//! The run-time parameters a client may set and expects to keep in
//! transaction mode (DESIGN.md §3). A client's wanted values and a server's
//! current values are both a `ParamSet`; when a client is given a server, the
//! difference is applied with SET. Sets are shared behind `Arc` so that the
//! common case — nothing changed — is a pointer comparison.

use std::sync::Arc;

/// Parameters PostgreSQL reports with ParameterStatus that sluice keeps per
/// client, in the server's spelling.
pub const TRACKED: &[&str] = &[
    "client_encoding",
    "DateStyle",
    "TimeZone",
    "IntervalStyle",
    "standard_conforming_strings",
    "application_name",
];

/// The tracked spelling of `name`, if sluice tracks it.
pub fn tracked_name(name: &str) -> Option<&'static str> {
    TRACKED
        .iter()
        .copied()
        .find(|t| t.eq_ignore_ascii_case(name))
}

/// Values of tracked parameters, one slot per entry of `TRACKED`; values
/// are shared strings, so a copy-on-write copies pointers, not text.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParamSet {
    values: [Option<Arc<str>>; TRACKED.len()],
}

fn slot(name: &str) -> Option<usize> {
    TRACKED.iter().position(|t| *t == name)
}

impl ParamSet {
    pub fn get(&self, name: &'static str) -> Option<&str> {
        slot(name).and_then(|i| self.values[i].as_deref())
    }

    /// Sets `name`; returns whether the value changed.
    pub fn set(&mut self, name: &'static str, value: &str) -> bool {
        let Some(i) = slot(name) else {
            return false;
        };
        if self.values[i].as_deref() == Some(value) {
            return false;
        }
        self.values[i] = Some(value.into());
        true
    }

    pub fn iter(&self) -> impl Iterator<Item = (&'static str, &str)> {
        TRACKED
            .iter()
            .zip(self.values.iter())
            .filter_map(|(k, v)| v.as_deref().map(|v| (*k, v)))
    }

    /// The SET statements that make a server with `current` values match
    /// `self`, as one simple-protocol query; `None` when nothing differs.
    pub fn diff_sql(&self, current: &ParamSet) -> Option<String> {
        let mut sql = String::new();
        for (k, v) in self.iter() {
            if current.get(k) != Some(v) {
                sql.push_str("SET ");
                sql.push_str(k);
                sql.push_str(" TO ");
                push_literal(&mut sql, v);
                sql.push(';');
            }
        }
        (!sql.is_empty()).then_some(sql)
    }
}

/// Appends `v` as a standard-conforming SQL string literal.
pub fn push_literal(sql: &mut String, v: &str) {
    sql.push('\'');
    for c in v.chars() {
        if c == '\'' {
            sql.push('\'');
        }
        sql.push(c);
    }
    sql.push('\'');
}

/// Updates a shared set copy-on-write; returns whether anything changed.
pub fn update_shared(set: &mut Arc<ParamSet>, name: &'static str, value: &str) -> bool {
    if set.get(name) == Some(value) {
        return false;
    }
    Arc::make_mut(set).set(name, value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diff_quotes_and_skips_equal() {
        let mut want = ParamSet::default();
        want.set("application_name", "o'hara");
        want.set("TimeZone", "UTC");
        let mut have = ParamSet::default();
        have.set("TimeZone", "UTC");
        assert_eq!(
            want.diff_sql(&have).as_deref(),
            Some("SET application_name TO 'o''hara';")
        );
        assert_eq!(want.diff_sql(&want), None);
        assert_eq!(tracked_name("datestyle"), Some("DateStyle"));
    }
}
