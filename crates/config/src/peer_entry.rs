//! One `[peers]` entry (PgBouncer 1.19+): `peer_id = host=… port=…
//! pool_size=…`, where a cancel request whose key names that peer is
//! forwarded. An entry for this process's own `peer_id` is allowed and
//! ignored by the daemon, so every peer can share one `[peers]` section.

use crate::codecs::parse_count;
use crate::connstring::ConnParam;
use crate::entry_source::{EntrySource, ParamProblem};
use crate::error::ConfigError;

/// Largest `peer_id` (14 bits of the cancel key).
pub const MAX_PEER_ID: u32 = 16_383;

/// A `[peers]` entry.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PeerEntry {
    pub id: u32,
    /// Host name, IP address, or a Unix socket directory (`/…`; `@…` for
    /// the abstract namespace).
    pub host: String,
    /// Default 6432, as in PgBouncer.
    pub port: u16,
    /// Cancel requests in flight to this peer at once; `None`:
    /// `default_pool_size`.
    pub pool_size: Option<u32>,
    pub line: usize,
}

/// The parameters a `[peers]` entry may use, for the docs.
pub(crate) const PEER_PARAMETERS: &[(&str, &str)] = &[
    (
        "host",
        "Host name, IP address, or Unix socket directory (/… or @… abstract) of the peer.",
    ),
    ("port", "Port of the peer (default 6432)."),
    (
        "pool_size",
        "Cancel requests in flight to the peer at once (default: default_pool_size).",
    ),
];

impl PeerEntry {
    /// Builds the entry `source.name = settings`; the name is the peer id.
    pub(crate) fn from_connstring(
        source: &EntrySource<'_>,
        settings: &str,
    ) -> Result<PeerEntry, ConfigError> {
        let invalid = |reason: String| ConfigError::InvalidParameter {
            file: source.file.to_path_buf(),
            line: source.line,
            entry: format!("peer {:?}", source.name),
            parameter: "peer_id".into(),
            value: source.name.to_string(),
            reason,
        };
        let id: u32 = source
            .name
            .trim()
            .parse()
            .map_err(|_| invalid("a peer's key is its peer_id, a number".into()))?;
        if id == 0 || id > MAX_PEER_ID {
            return Err(invalid(format!("peer_id must be 1..={MAX_PEER_ID}")));
        }
        let mut peer = PeerEntry {
            id,
            port: 6432,
            line: source.line,
            ..PeerEntry::default()
        };
        source.apply_params(settings, |param| peer.apply(param))?;
        if peer.host.is_empty() {
            return Err(ConfigError::InvalidParameter {
                file: source.file.to_path_buf(),
                line: source.line,
                entry: format!("peer {id}"),
                parameter: "host".into(),
                value: String::new(),
                reason: "a peer needs a host".into(),
            });
        }
        Ok(peer)
    }

    fn apply(&mut self, param: &ConnParam) -> Result<(), ParamProblem> {
        let text = param.value.as_str();
        match param.key.as_str() {
            "host" => self.host = text.to_string(),
            "port" => {
                self.port = text
                    .parse()
                    .ok()
                    .filter(|&p| p > 0)
                    .ok_or_else(|| ParamProblem::Invalid("a port number 1-65535".into()))?;
            }
            "pool_size" => self.pool_size = Some(parse_count(text)?),
            _ => return Err(ParamProblem::Unknown),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn source(name: &str) -> EntrySource<'_> {
        EntrySource {
            kind: "peer",
            file: Path::new("test.ini"),
            line: 3,
            name,
        }
    }

    #[test]
    fn entries_parse_with_pgbouncers_defaults() {
        let p = PeerEntry::from_connstring(&source("2"), "host=/tmp/sluice-2 port=5555").unwrap();
        assert_eq!(
            (p.id, p.host.as_str(), p.port, p.pool_size),
            (2, "/tmp/sluice-2", 5555, None)
        );
        let p = PeerEntry::from_connstring(&source("7"), "host=10.0.0.7 pool_size=3").unwrap();
        assert_eq!((p.port, p.pool_size), (6432, Some(3)));
    }

    #[test]
    fn bad_entries_are_refused() {
        for (name, value) in [
            ("0", "host=a"),
            ("16384", "host=a"),
            ("two", "host=a"),
            ("2", "port=5"),
            ("2", "host=a port=0"),
            ("2", "host=a dbname=x"),
        ] {
            assert!(
                PeerEntry::from_connstring(&source(name), value).is_err(),
                "{name} = {value}"
            );
        }
    }
}
