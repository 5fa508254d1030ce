//! Client messages on their way to the server in transaction mode with
//! statement tracking: named statements are renamed to their shared
//! server-side names, prepared on demand, and Parse/Close of statements are
//! answered here when the server need not see them. Every message sent or
//! answered gets its entry in the owed-responses queue.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::BytesMut;
use sluice_wire::{MessageBuilder, Reader, WireError, tags};

use super::client_names::ClientNames;
use super::client_names::NotKept;
use super::expect::{Expect, Expected, Local, Reply};
use super::registry::{Registry, Statement};
use super::server_cache::ServerStatements;
use super::sql::{self, Special};

/// A client's statement: its name as the client's names keep it, and the
/// statement.
type Named = (Arc<[u8]>, Arc<Statement>);

/// A copy of a statement was refused for memory; the refusal is sent.
#[derive(Debug)]
pub struct CopyRefused;

/// Rewrites one client's messages for the server it holds now.
pub struct Rewriter<'a> {
    pub names: &'a mut ClientNames,
    /// What the client's Parse texts mean depends on.
    pub context: super::registry::ParseContext<'a>,
    /// The client may have changed its settings since the server was
    /// given them (earlier in this transaction): statements parsed now
    /// are its own (`ParseContext::private_key`).
    pub unsure: bool,
    /// Private copies made for Binds while `unsure`, by the statement they
    /// stand in for: one each until the settings may change again
    /// (`Tracking::retire_one_offs`).
    pub one_off: &'a mut HashMap<u64, Arc<Statement>>,
    pub server: &'a mut ServerStatements,
    pub registry: &'a Registry,
    /// `max_prepared_statements` per server; 0 turns tracking off (names
    /// pass unchanged, as in PgBouncer).
    pub capacity: usize,
    pub expected: &'a mut Expected,
    /// Bytes due to the server.
    pub out: &'a mut BytesMut,
}

/// What became of a simple query.
#[derive(Debug, PartialEq, Eq)]
pub enum QueryFate {
    /// Sent to the server, with the statements the pooler watches that it
    /// holds (LISTEN, UNLISTEN, DISCARD ALL…); `matters`: the text may
    /// change the session (`sql::may_matter`, looked at once).
    Sent {
        specials: Vec<Special>,
        matters: bool,
    },
    /// Answered here; the server never sees it.
    Answered,
}

/// Why a LISTEN or UNLISTEN is refused (`sql::unfollowable_listen`).
const UNFOLLOWABLE_LISTEN: &str = "sluice cannot follow this LISTEN or UNLISTEN in transaction \
     pooling mode: its notifications would never arrive. Name the channel without Unicode \
     escapes (U&\"…\"), and in ASCII when client_encoding is not UTF8";

/// A name in the namespace of sluice's shared statements on servers.
fn shared_name(name: &[u8]) -> bool {
    name.starts_with(super::SHARED_PREFIX.as_bytes())
}

fn body(message: &[u8]) -> &[u8] {
    &message[sluice_wire::HEADER_LEN..]
}

impl Rewriter<'_> {
    /// Parse: a named statement is interned; the server gets it only if it
    /// lacks it, otherwise ParseComplete is answered here.
    /// `aborted`: the server is known to be in a failed transaction block
    /// (nothing in flight), where PostgreSQL refuses every Parse (25P02):
    /// it is sent unnamed to get that error, and no name is kept.
    pub fn parse(&mut self, message: &[u8], aborted: bool) -> Result<(), WireError> {
        let mut r = Reader::new(body(message));
        let name = r.cstr_bytes()?;
        let text = r.rest();
        let query = text.split(|&b| b == 0).next().unwrap_or_default();
        if sql::starts_special(query)
            && sql::unfollowable_listen(query, crate::params::client_utf8(self.context.params))
        {
            // (as a simple query's: review 28 sent it through a Parse)
            self.refuse("0A000", UNFOLLOWABLE_LISTEN.into());
            return Ok(());
        }
        if name.is_empty() {
            // (what the server's unnamed statement may be now: the link's
            // first message made it this client's or none, see
            // `tracked::settle_unnamed`)
            self.server.unnamed = Some(self.names.owner);
        }
        // (with tracking turned off by a RELOAD, the names the client got
        // before still follow it: `lookup`)
        if name.is_empty() || (self.capacity == 0 && self.names.get(name).is_none()) {
            if shared_name(name) {
                // Untracked, it would replace a shared statement on the
                // server under its users (review 42).
                self.refuse(
                    "42939",
                    format!(
                        "prepared statement name \"{}\" is reserved: sluice names its shared \
                         statements so",
                        String::from_utf8_lossy(name)
                    ),
                );
                return Ok(());
            }
            self.out.extend_from_slice(message);
            self.parse_passes();
            return Ok(());
        }
        if aborted {
            self.parse_unnamed(text);
            return Ok(());
        }
        if self.names.get(name).is_some() {
            // PostgreSQL refuses a name in use (42P05, and the rest of the
            // pipeline is skipped): let the server say so, by parsing the
            // existing statement again under its shared name. Its own text,
            // never the client's: were the server to lack it after all,
            // the shared name would still mean what every client expects.
            if let Ok(Some((name, existing))) = self.lookup(name) {
                MessageBuilder::new(self.out, tags::frontend::PARSE)
                    .cstr(&existing.name)
                    .bytes(&existing.text)
                    .finish();
                self.expected.push(Expect::Pass {
                    reply: Reply::Parse,
                    statement: Some(existing.id),
                    name: Some(name),
                });
            }
            return Ok(());
        }
        let statement = match self.registry.try_intern(text, Some(&self.key())) {
            Ok(statement) => statement,
            Err(refused) => {
                // (as PostgreSQL refuses what it cannot hold: an error,
                // the rest of the batch skipped, the client goes on)
                self.refuse(crate::held_memory::Refused::CODE, refused.to_string());
                return Ok(());
            }
        };
        match self.names.insert(name, statement.clone()) {
            Ok(()) => {}
            // Past the client's limits: refused, as PostgreSQL refuses what
            // it cannot hold (an error, the rest of the batch skipped). A
            // Parse that fails at once goes in its place, so the server
            // skips the batch too, and nothing is made there (running it
            // unnamed replaced the client's own unnamed statement; found
            // by a review).
            Err(NotKept::TooMany) => {
                self.refuse(
                    "54000",
                    format!(
                        "prepared statement \"{}\" not kept: this connection's prepared \
                         statements are at sluice's limit ({} statements, {} MiB of names \
                         and text); close some first",
                        String::from_utf8_lossy(name),
                        super::client_names::MAX_CLIENT_STATEMENTS,
                        super::client_names::MAX_CLIENT_STATEMENT_BYTES >> 20
                    ),
                );
                return Ok(());
            }
            Err(NotKept::Memory(refused)) => {
                self.refuse(crate::held_memory::Refused::CODE, refused.to_string());
                return Ok(());
            }
        }
        if self.server.touch(statement.id) && statement.proven_in(self.server.scope) {
            self.expected.push(Expect::Local(Local::ParseComplete(Some((
                name.into(),
                statement.id,
            )))));
        } else {
            // A copy whose text a server refused since (a table dropped)
            // is parsed again, so that the client hears it at Parse.
            self.server.retire(statement.id);
            self.prepare(&statement, Some(name.into()));
        }
        Ok(())
    }

    /// Bind: a named statement is renamed, and prepared first if needed.
    /// An unknown name goes on unchanged so that PostgreSQL reports it.
    /// Returns the shared statement bound, if any.
    pub fn bind(&mut self, message: &[u8]) -> Result<Option<Arc<Statement>>, WireError> {
        let mut r = Reader::new(body(message));
        let portal = r.cstr_bytes()?;
        let name = r.cstr_bytes()?;
        let rest = r.rest();
        let (name, statement) = match self.lookup(name) {
            Ok(Some(found)) => found,
            Ok(None) => {
                self.out.extend_from_slice(message);
                self.expected.push(Expect::pass(Reply::Bind));
                return Ok(None);
            }
            Err(CopyRefused) => return Ok(None),
        };
        MessageBuilder::new(self.out, tags::frontend::BIND)
            .bytes(portal)
            .u8(0)
            .cstr(&statement.name)
            .bytes(rest)
            .finish();
        self.expected.push(Expect::Pass {
            reply: Reply::Bind,
            statement: Some(statement.id),
            name: Some(name),
        });
        Ok(Some(statement))
    }

    /// Describe: a named statement is renamed, and prepared first if needed.
    pub fn describe(&mut self, message: &[u8]) -> Result<(), WireError> {
        let mut r = Reader::new(body(message));
        let kind = r.u8()?;
        let name = r.cstr_bytes()?;
        let looked = if kind == b'S' {
            self.lookup(name)
        } else {
            Ok(None)
        };
        if let Ok(Some((name, statement))) = looked {
            MessageBuilder::new(self.out, tags::frontend::DESCRIBE)
                .u8(b'S')
                .cstr(&statement.name)
                .finish();
            self.expected.push(Expect::Pass {
                reply: Reply::DescribeStatement,
                statement: Some(statement.id),
                name: Some(name),
            });
            return Ok(());
        }
        if looked.is_err() {
            return Ok(());
        }
        self.out.extend_from_slice(message);
        let reply = if kind == b'S' {
            Reply::DescribeStatement
        } else {
            Reply::DescribePortal
        };
        self.expected.push(Expect::pass(reply));
        Ok(())
    }

    /// Close: a named statement is forgotten by the client only (the server
    /// keeps it for other clients); CloseComplete is answered here.
    pub fn close(&mut self, message: &[u8]) -> Result<(), WireError> {
        let mut r = Reader::new(body(message));
        let kind = r.u8()?;
        let name = r.cstr_bytes()?;
        // (an untracked Close of a shared name would close it under its
        // users: answered here, as PostgreSQL answers a Close of a name
        // it lacks; review 42)
        if kind == b'S'
            && !name.is_empty()
            && (self.capacity > 0 || self.names.get(name).is_some() || shared_name(name))
        {
            let closed = self.names.remove(name).map(|st| (name.into(), st));
            self.expected
                .push(Expect::Local(Local::CloseComplete(closed)));
            return Ok(());
        }
        self.out.extend_from_slice(message);
        self.expected.push(Expect::pass(Reply::Close));
        Ok(())
    }

    /// A simple query. DEALLOCATE of a protocol-level name and PREPARE
    /// outside a transaction (`idle`) are answered here; DISCARD ALL and
    /// DEALLOCATE ALL also clear the client's names and what sluice knows
    /// of the server.
    pub fn query(&mut self, message: &[u8], idle: bool, sql_prepared: bool) -> QueryFate {
        let text = body(message);
        let text = text.strip_suffix(b"\0").unwrap_or(text);
        if !sql::may_matter(text) {
            self.out.extend_from_slice(message);
            self.expected.push(Expect::pass(Reply::Query));
            return QueryFate::Sent {
                specials: Vec::new(),
                matters: false,
            };
        }
        match &sql::special(text) {
            Some(Special::Deallocate(name)) if self.names.remove(name).is_some() => {
                self.expected
                    .push(Expect::Local(Local::Command("DEALLOCATE")));
                return QueryFate::Answered;
            }
            // Drivers send it to forget their statements (psycopg after
            // every rollback): the client's names go, the server keeps the
            // shared statements. Forwarded only when SQL-level statements
            // of this transaction exist on the server.
            Some(Special::DeallocateAll) if !sql_prepared => {
                self.names.clear();
                self.expected
                    .push(Expect::Local(Local::Command("DEALLOCATE ALL")));
                return QueryFate::Answered;
            }
            Some(Special::Prepare) if idle => {
                self.expected.push(Expect::Local(Local::Refused(Box::new((
                    "0A000",
                    "PREPARE outside a transaction is not supported in transaction pooling \
                     mode: the statement would stay on a server shared with other clients. \
                     Use protocol-level prepared statements (they follow the client), or \
                     PREPARE inside a transaction block (deallocated when it ends)"
                        .into(),
                )))));
                return QueryFate::Answered;
            }
            _ => {}
        }
        if sql::unfollowable_listen(text, crate::params::client_utf8(self.context.params)) {
            self.expected.push(Expect::Local(Local::Refused(Box::new((
                "0A000",
                UNFOLLOWABLE_LISTEN.into(),
            )))));
            return QueryFate::Answered;
        }
        let specials = sql::specials(text);
        if specials
            .iter()
            .any(|s| matches!(s, Special::DeallocateAll | Special::DiscardAll))
        {
            self.names.clear();
            self.server.clear();
        }
        self.out.extend_from_slice(message);
        self.expected.push(Expect::pass(Reply::Query));
        QueryFate::Sent {
            specials,
            matters: true,
        }
    }

    /// Sends `text` (a Parse body after the name) as the unnamed
    /// statement: its reply reaches the client, nothing named stays.
    fn parse_unnamed(&mut self, text: &[u8]) {
        // (an empty text is no error even in a failed transaction: the
        // server then holds the client's unnamed statement; review 31
        // bound it from another client)
        self.server.unnamed = Some(self.names.owner);
        MessageBuilder::new(self.out, tags::frontend::PARSE)
            .u8(0)
            .bytes(text)
            .finish();
        self.parse_passes();
    }

    /// The Parse just written is answered by the server to the client.
    fn parse_passes(&mut self) {
        self.expected.push(Expect::pass(Reply::Parse));
    }

    /// The key the client's Parse is shared under now.
    fn key(&self) -> String {
        if self.unsure {
            self.context.private_key()
        } else {
            self.context.key()
        }
    }

    /// A failing Parse in place of a client message, whose error reaches
    /// the client as `code`, `message`; the server skips the rest of the
    /// batch as after any error.
    fn refuse(&mut self, code: &'static str, message: String) {
        MessageBuilder::new(self.out, tags::frontend::PARSE)
            .cstr("sluice_refused")
            .cstr("sluice refused this statement")
            .i16(0)
            .finish();
        self.expected
            .push(Expect::Refused(Box::new((code, message.into()))));
    }

    /// The shared statement the client calls `name` (with the name as the
    /// client's names keep it), prepared on the server (injected Parse) if
    /// it is not there yet. `Err`: a copy it needs would pass
    /// `max_held_memory_mb`, and a refusal (53200) went in the message's
    /// place.
    fn lookup(&mut self, name: &[u8]) -> Result<Option<Named>, CopyRefused> {
        // (also with `max_prepared_statements` now 0: a name tracked before
        // a RELOAD turned tracking off is known to the server only under
        // its shared name; review 40)
        if name.is_empty() {
            return Ok(None);
        }
        let Some((name, statement)) = self.names.get_named(name) else {
            if shared_name(name) {
                // Not the client's: a shared statement's name on the
                // server, prepared for another client (under its settings,
                // its search_path), which it must not run or describe
                // (review 39). As PostgreSQL answers an unknown name.
                self.refuse(
                    "26000",
                    format!(
                        "prepared statement \"{}\" does not exist",
                        String::from_utf8_lossy(name)
                    ),
                );
                return Err(CopyRefused);
            }
            return Ok(None);
        };
        let (name, mut statement) = (name.clone(), statement.clone());
        if self.server.touch(statement.id) {
            return Ok(Some((name, statement)));
        }
        // The server parses it under the client's settings as they are
        // now. Shared under other settings, it is re-keyed to these (the
        // client's name follows), so that the copy made here means to
        // every client sharing it what it meant to the first (a review: a
        // client that had set transform_null_equals since its Parse got
        // it prepared so under the old key, for everyone). With settings
        // changed in this transaction (not known yet), the copy is this
        // one Bind's own, and the name stays (a SET LOCAL's meaning stayed
        // with the name after the transaction; a review). The client's own
        // statement then means what its text means under its present
        // settings, not those of its Parse (PostgreSQL keeps the latter):
        // see docs/architecture.md.
        if self.unsure {
            let id = statement.id;
            statement = match self.one_off.get(&id) {
                Some(copy) => copy.clone(),
                None => {
                    let key = self.context.private_key();
                    let copy = self.copy(&statement, &key)?;
                    self.one_off.insert(id, copy.clone());
                    copy
                }
            };
        } else {
            let key = self.context.key();
            if statement.context.as_deref() != Some(key.as_str()) {
                statement = self.copy(&statement, &key)?;
                self.names.replace(&name, statement.clone());
            }
        }
        if self.server.touch(statement.id) {
            return Ok(Some((name, statement)));
        }
        self.prepare(&statement, None);
        Ok(Some((name, statement)))
    }

    /// `statement`'s text under the context `key`: a copy of its own,
    /// counted in `max_held_memory_mb` and refused past it (review 33: 30
    /// clients each re-keyed the same 4 MiB of text under their own
    /// search_path, 126 MB past an 8 MiB budget).
    fn copy(&mut self, statement: &Statement, key: &str) -> Result<Arc<Statement>, CopyRefused> {
        self.registry
            .try_intern(&statement.text, Some(key))
            .map_err(|refused| {
                self.refuse(crate::held_memory::Refused::CODE, refused.to_string());
                CopyRefused
            })
    }

    /// Sends Parse of `statement` under its shared name, closing first
    /// what the server must drop (stale plans, and the least recently used
    /// statement when the server is full).
    fn prepare(&mut self, statement: &Arc<Statement>, client_name: Option<Box<[u8]>>) {
        let evicted = self.server.insert(statement, self.capacity);
        let mut closing = std::mem::take(&mut self.server.to_close);
        closing.extend(evicted);
        if self.server.close_in_flight(statement.id) && !closing.contains(&statement.id) {
            closing.push(statement.id);
        }
        for id in closing {
            MessageBuilder::new(self.out, tags::frontend::CLOSE)
                .u8(b'S')
                .cstr(&super::server_name(id))
                .finish();
            self.expected.push(Expect::Unprepare { id });
            self.server.close_sent(id);
        }
        MessageBuilder::new(self.out, tags::frontend::PARSE)
            .cstr(&statement.name)
            .bytes(&statement.text)
            .finish();
        self.expected.push(Expect::Prepare {
            id: statement.id,
            client_name,
        });
    }
}
