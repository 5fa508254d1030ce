//! A client's own statement names and what they stand for. Kept in sluice
//! so that they survive the client being given another server.

use std::collections::HashMap;
use std::sync::Arc;

use super::registry::Statement;

/// Named statements of one client (boxed in the client only once it has
/// any, so that idle clients without statements stay small).
#[derive(Debug, Default)]
pub struct ClientNames {
    names: HashMap<Arc<[u8]>, Arc<Statement>, super::fast_hash::BuildWordHasher>,
}

/// Statements one client may name at once: far above what drivers use
/// (pgjdbc, pgx and psycopg keep a few hundred at most), it bounds the
/// memory one client can make sluice hold.
pub const MAX_CLIENT_STATEMENTS: usize = 100_000;

impl ClientNames {
    pub fn get(&self, name: &[u8]) -> Option<&Arc<Statement>> {
        self.names.get(name)
    }

    /// The name as kept (shared, so that a reply owed for it can name it
    /// without a copy) and the statement it stands for.
    pub fn get_named(&self, name: &[u8]) -> Option<(&Arc<[u8]>, &Arc<Statement>)> {
        self.names.get_key_value(name)
    }

    /// Names `statement` (a name not in use); false when the client has
    /// too many already.
    pub fn insert(&mut self, name: &[u8], statement: Arc<Statement>) -> bool {
        if self.names.len() >= MAX_CLIENT_STATEMENTS {
            return false;
        }
        self.names.insert(name.into(), statement);
        true
    }

    pub fn remove(&mut self, name: &[u8]) -> Option<Arc<Statement>> {
        self.names.remove(name)
    }

    /// How many names the client has.
    pub fn count(&self) -> usize {
        self.names.len()
    }

    pub fn clear(&mut self) {
        self.names.clear();
    }
}
