//! Protocol-level prepared statements in transaction and statement pooling.
//!
//! A client's named statements live in sluice, not on a server: each Parse
//! is interned by its text and parameter types into one shared server-side
//! statement (`sluice_<id>`), and a server that lacks a statement a client
//! uses gets it prepared just before the Bind or Describe that needs it.
//! Responses the client expects but the server never sends (a Parse sluice
//! answered itself) are synthesised in order; responses to messages sluice
//! injected are dropped. See `docs/architecture.md` ("Prepared statements").

pub mod client_names;
pub mod expect;
pub mod fast_hash;
pub mod idle_batch;
pub mod registry;
pub mod rewrite;
pub mod server_cache;
pub mod sql;

/// The name of statement `id` on every server.
pub fn server_name(id: u64) -> String {
    format!("{SHARED_PREFIX}{id}")
}

/// What every name sluice gives a statement on a server begins with.
pub const SHARED_PREFIX: &str = "sluice_";
