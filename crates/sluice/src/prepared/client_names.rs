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
    /// Bytes of the names and the texts named (shared texts counted for
    /// each client).
    bytes: usize,
    /// The names' share of `max_held_memory_mb` (the texts, shared, hold
    /// their own): a client's names are its alone (review 33 grew sluice
    /// by 175 MB with forty names of 4 MiB for `select 1`).
    held: crate::held_memory::Grant,
    /// This client, as the owner of a server's unnamed statement
    /// (`ServerStatements::unnamed`).
    pub owner: Owner,
}

/// What a name costs in `max_held_memory_mb`: its bytes and its entry
/// (the key's allocation and the map's slot: review 34 measured about 96
/// bytes a short name, which a budget of the bytes alone did not see).
fn cost(name: &[u8]) -> usize {
    name.len() + 96
}

/// Why a name was not kept.
#[derive(Debug)]
pub enum NotKept {
    /// `MAX_CLIENT_STATEMENTS` or `MAX_CLIENT_STATEMENT_BYTES`.
    TooMany,
    Memory(crate::held_memory::Refused),
}

/// A number no other client's names carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner(u64);

impl Owner {
    /// Session-mode clients, whose unnamed statements sluice does not
    /// follow: no transaction-mode client's (those start at 1).
    pub const SESSION: Owner = Owner(0);
}

impl Default for Owner {
    fn default() -> Self {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        Owner(NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
    }
}

/// Statements one client may name at once: far above what drivers use
/// (pgjdbc, pgx and psycopg keep a few hundred at most), it bounds the
/// memory one client can make sluice hold.
pub const MAX_CLIENT_STATEMENTS: usize = 100_000;

/// Bytes of statement text one client may name at once (any one statement
/// may be larger, alone): drivers' caches stay far below (pgjdbc's default
/// is 5 MiB), and the texts sit in the one process every client needs (a
/// review grew it by 600 MB in 6 s with 1 MB statements).
pub const MAX_CLIENT_STATEMENT_BYTES: usize = 16 << 20;

impl ClientNames {
    pub fn get(&self, name: &[u8]) -> Option<&Arc<Statement>> {
        self.names.get(name)
    }

    /// The name as kept (shared, so that a reply owed for it can name it
    /// without a copy) and the statement it stands for.
    pub fn get_named(&self, name: &[u8]) -> Option<(&Arc<[u8]>, &Arc<Statement>)> {
        self.names.get_key_value(name)
    }

    /// Names `statement` (a name not in use), unless the client has too
    /// many already or the name would pass `max_held_memory_mb`.
    pub fn insert(&mut self, name: &[u8], statement: Arc<Statement>) -> Result<(), NotKept> {
        let len = name.len() + statement.text.len();
        if self.names.len() >= MAX_CLIENT_STATEMENTS
            || (!self.names.is_empty() && self.bytes + len > MAX_CLIENT_STATEMENT_BYTES)
        {
            return Err(NotKept::TooMany);
        }
        self.held.add(cost(name)).map_err(NotKept::Memory)?;
        self.put(name, statement);
        Ok(())
    }

    /// Names `statement` again, whatever the limits: a Close the server
    /// refused gives back what the client had.
    pub fn restore(&mut self, name: &[u8], statement: Arc<Statement>) {
        self.held.add_anyway(cost(name));
        self.put(name, statement);
    }

    fn put(&mut self, name: &[u8], statement: Arc<Statement>) {
        self.bytes += name.len() + statement.text.len();
        if let Some(old) = self.names.insert(name.into(), statement) {
            self.bytes -= name.len() + old.text.len();
            self.held.sub(cost(name));
        }
    }

    /// Points `name` at `statement`, another statement of the same text
    /// (re-keyed for the client's present settings).
    pub fn replace(&mut self, name: &[u8], statement: Arc<Statement>) {
        if let Some(slot) = self.names.get_mut(name) {
            debug_assert_eq!(slot.text, statement.text);
            *slot = statement;
        }
    }

    pub fn remove(&mut self, name: &[u8]) -> Option<Arc<Statement>> {
        let removed = self.names.remove(name);
        if let Some(old) = &removed {
            self.bytes -= name.len() + old.text.len();
            self.held.sub(cost(name));
        }
        removed
    }

    /// How many names the client has.
    pub fn count(&self) -> usize {
        self.names.len()
    }

    /// Bytes of its names and the texts they stand for.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn clear(&mut self) {
        self.names.clear();
        self.bytes = 0;
        self.held.release();
    }
}
