//! One id per distinct statement (query text plus parameter types), shared
//! by every client, so that a server prepares each statement once however
//! many clients use it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use bytes::Bytes;

/// A statement as the server sees it.
#[derive(Debug)]
pub struct Statement {
    pub id: u64,
    /// `sluice_<id>`.
    pub name: Box<str>,
    /// The Parse body after the statement name: query, NUL, parameter count
    /// and type OIDs, exactly as the client sent them.
    pub text: Bytes,
    /// What the text's meaning depends on beside itself, as the clients
    /// that share it have it (`ParseContext::key`; None in unit tests): the
    /// same text under another search_path may name other tables (sharing
    /// one server-side statement between the two made PostgreSQL re-plan
    /// it and fail, "cached plan must not change result type"), and
    /// PostgreSQL reads date, time and string literals as the settings are
    /// when it parses (one client's DateStyle decided another's dates; a
    /// review).
    pub context: Option<Box<str>>,
    /// Its query is all ASCII (a text with other bytes is unreadable to
    /// sluice in some client encodings: `params::ascii_in_multibyte`).
    pub ascii: bool,
    /// What running it may leave on a server (see `sql::effects`): a Bind
    /// of it counts as sending its text again.
    pub effects: super::sql::Effects,
    /// Whether a transaction of only this statement may run on a replica
    /// (classified on first use, then free).
    pub read_only: std::sync::OnceLock<bool>,
    /// Scopes (`Pool::scope`: database and user) in which a server has
    /// accepted its Parse, one slot per `scope % PROOF_SLOTS` (0: none): a
    /// Parse of the same text by a client of such a scope may be answered
    /// without a server (see `idle_batch`), the server getting it when a
    /// Bind needs it. A server refusing it clears that scope's proof.
    pub proven: [AtomicU64; PROOF_SLOTS],
    /// Its text's share of `max_held_memory_mb`, for as long as it lives.
    _held: crate::held_memory::Grant,
}

/// One statement per id.
impl PartialEq for Statement {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

impl Eq for Statement {}

/// Scopes a statement remembers as proven at once (databases with the
/// same schema share texts; a collision only forgets one proof).
pub const PROOF_SLOTS: usize = 4;

impl Statement {
    fn slot(&self, scope: u64) -> &AtomicU64 {
        &self.proven[(scope % PROOF_SLOTS as u64) as usize]
    }

    /// Whether a server of `scope` accepted its Parse.
    pub fn proven_in(&self, scope: u64) -> bool {
        scope != 0 && self.slot(scope).load(Ordering::Relaxed) == scope
    }

    /// A server of `scope` accepted its Parse.
    pub fn prove(&self, scope: u64) {
        if scope != 0 {
            self.slot(scope).store(scope, Ordering::Relaxed);
        }
    }

    /// A server of `scope` refused its Parse: its text is no longer
    /// trusted there (a table dropped since, say).
    pub fn refute(&self, scope: u64) {
        if scope != 0 {
            let _ =
                self.slot(scope)
                    .compare_exchange(scope, 0, Ordering::Relaxed, Ordering::Relaxed);
        }
    }

    /// The query text, without the parameter types.
    pub fn query(&self) -> &[u8] {
        self.text.split(|&b| b == 0).next().unwrap_or(&[])
    }
}

/// Statements in use by at least one client.
#[derive(Debug, Default)]
pub struct Registry {
    map: Mutex<Interned>,
    next_id: AtomicU64,
    /// Keys the texts' hashes (seeded per process: texts come from
    /// clients, who must not aim collisions at one bucket).
    hasher: std::hash::RandomState,
}

/// Statements by a hash of their text. Only weak references are kept, and
/// no copy of the text: a statement no client uses any more frees its
/// text at once (a key holding the text kept up to a thousand dead texts,
/// each up to 64 MiB, until a sweep; found by a review), leaving an empty
/// entry until the next sweep.
#[derive(Debug, Default)]
struct Interned {
    by_text: HashMap<u64, Vec<Weak<Statement>>>,
    /// Size at which dead entries are swept next.
    sweep_at: usize,
}

impl Interned {
    /// Forgets the entries of statements no client uses (each keeps a
    /// dead statement's allocation until then).
    fn sweep(&mut self) {
        self.by_text.retain(|_, weaks| {
            weaks.retain(|w| w.strong_count() > 0);
            !weaks.is_empty()
        });
        self.sweep_at = self.by_text.len() * 2;
        DEAD.store(0, Ordering::Relaxed);
    }

    fn find(&self, hash: u64, text: &[u8], context: Option<&str>) -> Option<Arc<Statement>> {
        self.by_text
            .get(&hash)?
            .iter()
            .filter_map(Weak::upgrade)
            .find(|s| s.text == text && s.context.as_deref() == context)
    }
}

/// Entries kept before the first sweep of statements no client uses.
const FIRST_SWEEP: usize = 1024;

/// What a statement costs besides its text and context, as counted in
/// `max_held_memory_mb`: the struct in its `Arc`, its server-side name,
/// its entry here (review 34 measured about 350 bytes a statement; a
/// budget that counted texts alone let short ones grow sluice 20 times
/// past it).
const STATEMENT_ENTRY: usize = 384;

/// Statements dropped since the last sweep (`Registry::prune`).
static DEAD: AtomicUsize = AtomicUsize::new(0);

impl Drop for Statement {
    fn drop(&mut self) {
        DEAD.fetch_add(1, Ordering::Relaxed);
    }
}

impl Registry {
    /// `try_intern` for tests, within the budget.
    #[cfg(test)]
    pub fn intern(&self, text: &[u8], context: Option<&str>) -> Arc<Statement> {
        self.try_intern(text, context)
            .expect("tests stay within the budget")
    }

    /// The statement for `text` (a Parse body after the name), shared with
    /// every client that parsed the same text in the same `context`
    /// ([`ParseContext::key`]). A new one takes its text's share of
    /// `max_held_memory_mb`, and is refused past it (a client's Parse or a
    /// copy for its settings: 53200, and the client goes on).
    pub fn try_intern(
        &self,
        text: &[u8],
        context: Option<&str>,
    ) -> Result<Arc<Statement>, crate::held_memory::Refused> {
        let hash = self.hash(text, context);
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(found) = map.find(hash, text, context) {
            return Ok(found);
        }
        let cost = STATEMENT_ENTRY + text.len() + context.map_or(0, str::len);
        let held = crate::held_memory::Grant::of(&crate::held_memory::BUDGET, cost)?;
        if map.by_text.len() >= map.sweep_at.max(FIRST_SWEEP) {
            map.sweep();
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let text = Bytes::copy_from_slice(text);
        let query = text.split(|&b| b == 0).next().unwrap_or(&[]);
        let effects = if super::sql::may_matter(query) {
            super::sql::effects(query)
        } else {
            super::sql::Effects::default()
        };
        let statement = Arc::new(Statement {
            id,
            name: super::server_name(id).into_boxed_str(),
            text: text.clone(),
            context: context.map(Box::from),
            ascii: query.is_ascii(),
            effects,
            read_only: std::sync::OnceLock::new(),
            proven: Default::default(),
            _held: held,
        });
        map.by_text
            .entry(hash)
            .or_default()
            .push(Arc::downgrade(&statement));
        Ok(statement)
    }

    fn hash(&self, text: &[u8], context: Option<&str>) -> u64 {
        use std::hash::BuildHasher;
        self.hasher.hash_one((text, context))
    }
}

impl Registry {
    /// Sweeps when many statements died since the last sweep (janitor,
    /// each second): after a wave of statements, nothing else may come to
    /// sweep, and each dead entry kept its allocation (review 34: 700 MB
    /// stayed with no client left).
    pub fn prune(&self) {
        let dead = DEAD.load(Ordering::Relaxed);
        if dead == 0 {
            return;
        }
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if dead >= FIRST_SWEEP.max(map.by_text.len() / 4) {
            map.sweep();
        }
    }

    /// The statement for `text` if a client uses it and a server of
    /// `scope` has accepted its Parse; nothing is interned.
    pub fn proven(&self, text: &[u8], scope: u64, context: Option<&str>) -> Option<Arc<Statement>> {
        let hash = self.hash(text, context);
        let map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        map.find(hash, text, context).filter(|s| s.proven_in(scope))
    }
}

/// The context a client's Parse is shared in: the settings it set in its
/// session (search_path names the tables; transform_null_equals,
/// array_nulls, timezone_abbreviations, lc_monetary and others change how
/// PostgreSQL reads a text: all of them, so that none is missed) and the
/// tracked parameters PostgreSQL reads while parsing (client_encoding
/// decodes the text; DateStyle, TimeZone and IntervalStyle read date and
/// time literals; standard_conforming_strings, backslashes in strings).
/// Clients that agree share; most do, with their drivers' defaults.
#[derive(Clone, Copy)]
pub struct ParseContext<'a> {
    pub session: Option<&'a crate::session_vars::SessionVars>,
    pub params: &'a crate::params::ParamSet,
}

/// Keys made by [`ParseContext::private_key`].
static PRIVATE_KEYS: AtomicU64 = AtomicU64::new(0);

impl ParseContext<'_> {
    /// A key no other Parse gets: for a Parse sent after the client may
    /// have changed its settings in the same transaction (SET, SET LOCAL,
    /// set_config, opaque code), which sluice reads back only when the
    /// transaction ends: the server parses it under settings sluice does
    /// not know yet, so nobody may share it (a review: a statement
    /// prepared right after `SET transform_null_equals = on` was shared
    /// with clients that never set it).
    pub fn private_key(&self) -> String {
        let n = PRIVATE_KEYS.fetch_add(1, Ordering::Relaxed);
        let mut key = self.key();
        key.push_str(&format!("\u{1}private {n}"));
        key
    }

    /// The registry's key for it (made only where a named Parse needs it):
    /// the tracked parameters' values, each ended by a NUL (their SHA-256
    /// when longer than `PLAIN_KEY_MAX`), then the session settings'
    /// SHA-256 (`SessionVars::digest`, made once a set), so that a key is
    /// small and quick to make whatever the client set (a review: a
    /// `SET app.big` of 200 KB was copied into the key of every statement
    /// the client prepared after it).
    pub fn key(&self) -> String {
        let mut key = String::with_capacity(PLAIN_KEY_MAX + 72);
        for name in crate::params::TRACKED {
            if *name != "application_name" {
                key.push_str(self.params.get(name).unwrap_or_default());
                key.push('\0');
            }
        }
        if key.len() > PLAIN_KEY_MAX {
            // (no NUL in it: it cannot equal a plain one)
            let digest = {
                use sha2::{Digest, Sha256};
                Sha256::digest(key.as_bytes())
            };
            key.clear();
            key.push('#');
            push_hex(&mut key, &digest);
        }
        if let Some(session) = self.session.filter(|s| !s.is_empty()) {
            key.push('\u{2}');
            push_hex(&mut key, session.digest());
        }
        key
    }
}

/// The longest tracked parameters' part of a key kept as it is.
const PLAIN_KEY_MAX: usize = 256;

fn push_hex(out: &mut String, bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for b in bytes {
        out.push(char::from(HEX[usize::from(b >> 4)]));
        out.push(char::from(HEX[usize::from(b & 15)]));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_small_whatever_the_client_set() {
        let params = crate::params::ParamSet::default();
        let big = "x".repeat(200_000);
        let vars = |value: &str| {
            crate::session_vars::SessionVars::from_pairs([("app.big", value), ("search_path", "a")])
        };
        let key = |session: Option<&crate::session_vars::SessionVars>| {
            ParseContext {
                session,
                params: &params,
            }
            .key()
        };
        let (one, same, other) = (vars(&big), vars(&big), vars(&big[1..]));
        assert!(key(Some(&one)).len() < 400, "{}", key(Some(&one)).len());
        assert_eq!(key(Some(&one)), key(Some(&same)));
        assert_ne!(key(Some(&one)), key(Some(&other)));
        assert_ne!(key(Some(&one)), key(None));
        let empty = crate::session_vars::SessionVars::default();
        assert_eq!(key(Some(&empty)), key(None), "nothing set is nothing set");
        let mut long = crate::params::ParamSet::default();
        long.set("TimeZone", &"y".repeat(5000));
        let long_key = ParseContext {
            session: None,
            params: &long,
        }
        .key();
        assert!(long_key.len() < 100, "{}", long_key.len());
        assert_ne!(long_key, key(None));
    }

    #[test]
    fn same_text_same_statement_until_nobody_uses_it() {
        let registry = Registry::default();
        let a = registry.intern(b"select 1\0\0\0", None);
        let b = registry.intern(b"select 1\0\0\0", None);
        let c = registry.intern(b"select 2\0\0\0", None);
        assert_eq!(a.id, b.id);
        assert_ne!(a.id, c.id);
        assert_eq!(&*a.name, format!("sluice_{}", a.id));
        let old = a.id;
        drop((a, b));
        assert_ne!(registry.intern(b"select 1\0\0\0", None).id, old);
    }

    #[test]
    fn a_statement_nobody_uses_frees_its_text() {
        let registry = Registry::default();
        let big = vec![b'x'; 1 << 20];
        let statement = registry.intern(&big, None);
        let text = statement.text.clone();
        assert!(!text.is_unique(), "shared with the statement only");
        drop(statement);
        assert!(text.is_unique(), "the registry keeps no copy");
    }

    #[test]
    fn proven_only_once_a_server_accepted_it() {
        let registry = Registry::default();
        assert!(registry.proven(b"select 1\0\0\0", 7, None).is_none());
        let a = registry.intern(b"select 1\0\0\0", None);
        assert!(registry.proven(b"select 1\0\0\0", 7, None).is_none());
        a.prove(7);
        assert_eq!(
            registry.proven(b"select 1\0\0\0", 7, None).map(|s| s.id),
            Some(a.id)
        );
        // Not in another database or for another user, until proven there.
        assert!(registry.proven(b"select 1\0\0\0", 9, None).is_none());
        a.prove(9);
        assert!(registry.proven(b"select 1\0\0\0", 9, None).is_some());
        assert!(registry.proven(b"select 1\0\0\0", 7, None).is_some());
        // Refuted in one scope only.
        a.refute(7);
        assert!(registry.proven(b"select 1\0\0\0", 7, None).is_none());
        assert!(registry.proven(b"select 1\0\0\0", 9, None).is_some());
        a.prove(7);
        drop(a);
        assert!(registry.proven(b"select 1\0\0\0", 7, None).is_none());
    }
}
