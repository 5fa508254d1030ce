//! The responses a server owes, in order, for the messages sent to it in
//! transaction mode with statement tracking, and what to do with each: pass
//! it to the client, drop it (sluice injected the message), or answer the
//! client here (sluice did not send the message at all).
//!
//! PostgreSQL answers each extended-protocol message in order. After an
//! ErrorResponse it skips every message up to the next Sync, so entries
//! behind a failed one are dropped unanswered, and what sluice assumed
//! about them (a statement now prepared, one now closed) is undone.

use std::collections::VecDeque;

use bytes::BytesMut;
use sluice_wire::{ErrorFields, Severity, TransactionStatus, tags};

use super::server_cache::ServerStatements;

/// What kind of response ends an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    /// ParseComplete, BindComplete, CloseComplete: one message.
    Parse,
    Bind,
    Close,
    /// ParameterDescription then RowDescription or NoData.
    DescribeStatement,
    /// RowDescription or NoData.
    DescribePortal,
    /// Rows, then CommandComplete, EmptyQueryResponse or PortalSuspended.
    Execute,
    /// ReadyForQuery.
    Sync,
    /// Simple query or function call: everything up to ReadyForQuery.
    Query,
}

/// A reply sluice writes itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Local {
    /// For a client Parse of a statement the server has: the client's name
    /// and the statement (if the server skips the Parse after an error, the
    /// name does not exist, as on PostgreSQL).
    ParseComplete(Option<(Box<[u8]>, u64)>),
    /// For a client Close of its statement: the name and what it stood for
    /// (if the server skips the Close after an error, the name still
    /// exists, as on PostgreSQL).
    CloseComplete(Option<(Box<[u8]>, std::sync::Arc<super::registry::Statement>)>),
    /// A simple query answered here: CommandComplete with this tag, then
    /// ReadyForQuery.
    Command(&'static str),
    /// A simple query refused here: ErrorResponse, then ReadyForQuery.
    Refused(Box<(&'static str, String)>),
}

/// One owed response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expect {
    /// A client message sent on; `statement` is the shared statement a
    /// Bind or Describe used, `name` what the client calls the statement
    /// the message names (a Bind, a Describe, a Parse of a name in use):
    /// PostgreSQL's error about it names the shared statement, which the
    /// client must not see.
    Pass {
        reply: Reply,
        statement: Option<u64>,
        name: Option<std::sync::Arc<[u8]>>,
    },
    /// A Parse of shared statement `id`; the client sent it under
    /// `client_name` (its ParseComplete passes) or sluice did (`None`:
    /// dropped).
    Prepare {
        id: u64,
        client_name: Option<Box<[u8]>>,
    },
    /// A Close of shared statement `id` injected by sluice (dropped).
    Unprepare { id: u64 },
    /// sluice's Close of another client's unnamed statement at a link's
    /// start (`tracked::settle_unnamed`): its CloseComplete is dropped.
    CloseUnnamed,
    /// A simple query sluice sent ahead of the client's (`DISCARD
    /// SEQUENCES`): every reply up to its ReadyForQuery is dropped.
    Discard,
    /// Answered by sluice when its turn comes.
    Local(Local),
    /// A client message sluice does not send (a Parse past the client's
    /// limits, a Bind of an unnamed statement that is not the client's): a
    /// Parse sent in its place fails on the server, which then skips the
    /// rest of the batch as PostgreSQL would, and its error is told to the
    /// client as this one (SQLSTATE, message).
    Refused(Box<(&'static str, Box<str>)>),
}

impl Expect {
    /// A client message sent on unchanged (no statement of sluice's).
    pub fn pass(reply: Reply) -> Expect {
        Expect::Pass {
            reply,
            statement: None,
            name: None,
        }
    }
}

/// What to do with one server message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Forward,
    Drop,
    /// A local reply is due before this message.
    LocalFirst,
}

/// The queue of owed responses of one linked period.
#[derive(Debug, Default)]
pub struct Expected {
    queue: VecDeque<Expect>,
    /// An extended-protocol message failed: the server ignores what
    /// follows up to the next Sync.
    skipping: bool,
    /// Client statement names whose Parse failed or was skipped: they do
    /// not exist, as on PostgreSQL (name, shared statement id).
    failed_parses: Vec<NameUndo>,
    /// Queries and function calls skipped with the rest of a failed
    /// extended-protocol batch (PostgreSQL ignores everything up to the
    /// Sync, a Query too), not yet told to the request count.
    ignored_requests: u32,
    /// Executes answered (query_timeout times each).
    executes_done: u64,
}

/// A change to a client's names that PostgreSQL did not make (its Parse
/// failed or was skipped, its Close was skipped), in stream order: undone
/// in reverse order, they leave the names as PostgreSQL has them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NameUndo {
    /// The Parse of `name` as statement `id` did not happen.
    Parsed(Box<[u8]>, u64),
    /// The Close of `name` (which stood for this statement) did not happen.
    Closed(Box<[u8]>, std::sync::Arc<super::registry::Statement>),
}

/// SQLSTATE of "cached plan must not change result type".
const STALE_PLAN: &str = "0A000";
/// SQLSTATE of "prepared statement … does not exist".
const NO_STATEMENT: &str = "26000";

impl Expected {
    /// Empties the queue for reuse (keeps its memory).
    pub fn clear(&mut self) {
        self.queue.clear();
        self.skipping = false;
        self.failed_parses.clear();
    }

    /// Takes the client names whose Parse failed or was skipped.
    pub fn take_failed_parses(&mut self) -> Vec<NameUndo> {
        std::mem::take(&mut self.failed_parses)
    }

    /// Whether a Parse failed or was skipped, or a Close was skipped, since
    /// the last take.
    pub fn has_failed_parses(&self) -> bool {
        !self.failed_parses.is_empty()
    }

    pub fn push(&mut self, expect: Expect) {
        self.queue.push_back(expect);
    }

    /// Puts `expect` at `at` (entries from there on owe their replies
    /// after it).
    pub fn insert(&mut self, at: usize, expect: Expect) {
        self.queue.insert(at, expect);
    }

    /// A failed extended-protocol batch is being skipped up to its Sync.
    pub fn skipping(&self) -> bool {
        self.skipping
    }

    /// Gives up sluice's own query at the head (the server is ending).
    pub fn abandon_discard(&mut self) {
        if self.discarding() {
            self.queue.pop_front();
        }
    }

    /// The replies now due are those of sluice's own simple query.
    pub fn discarding(&self) -> bool {
        matches!(self.queue.front(), Some(Expect::Discard))
    }

    /// The next reply of type `tag` (ParseComplete, CloseComplete)
    /// answers a Parse or Close sluice sent of its own: it is dropped,
    /// the client never sees it.
    pub fn owns_next(&self, tag: u8) -> bool {
        use tags::backend as b;
        match self.queue.front() {
            Some(Expect::Prepare {
                client_name: None, ..
            }) => tag == b::PARSE_COMPLETE,
            Some(Expect::Unprepare { .. } | Expect::CloseUnnamed) => tag == b::CLOSE_COMPLETE,
            _ => false,
        }
    }

    /// Executes answered so far.
    pub fn executes_done(&self) -> u64 {
        self.executes_done
    }

    /// An Execute's answer is owed.
    pub fn awaits_execute(&self) -> bool {
        self.queue.iter().any(|e| {
            matches!(
                e,
                Expect::Pass {
                    reply: Reply::Execute,
                    ..
                }
            )
        })
    }

    /// Entries owed.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// Nothing owed: the link may end.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// `syncs` Syncs sent after the request at the head of the queue (a
    /// COPY FROM STDIN, confirmed by the server) were ignored by
    /// PostgreSQL and get no ReadyForQuery. They follow the head directly:
    /// anything else in between would have ended the COPY.
    pub fn forget_ignored_syncs(&mut self, syncs: u32) {
        for _ in 0..syncs {
            match self.queue.get(1) {
                Some(Expect::Pass {
                    reply: Reply::Sync, ..
                }) => {
                    self.queue.remove(1);
                }
                _ => break,
            }
        }
    }

    /// Decides about a server message with tag `tag`, without consuming it.
    #[inline]
    pub fn verdict(&mut self, tag: u8, server: &mut ServerStatements) -> Verdict {
        use tags::backend as b;
        if is_async(tag) {
            return Verdict::Forward;
        }
        self.skip_ignored(server);
        match self.queue.front() {
            Some(Expect::Local(_)) => Verdict::LocalFirst,
            Some(Expect::Prepare {
                client_name: None, ..
            }) if tag == b::PARSE_COMPLETE => Verdict::Drop,
            Some(Expect::Unprepare { .. } | Expect::CloseUnnamed) if tag == b::CLOSE_COMPLETE => {
                Verdict::Drop
            }
            Some(Expect::Discard) => Verdict::Drop,
            _ => Verdict::Forward,
        }
    }

    /// A DataRow now would be forwarded with nothing to account: the
    /// `verdict` is Forward and `consume` leaves the queue as it is (no
    /// reply ends with a row). False while an error's ignored entries wait
    /// to be skipped, or sluice's own reply goes first: the caller then
    /// takes the general path. Rows are most of a result's messages.
    pub fn passes_rows(&self) -> bool {
        !self.skipping && !matches!(self.queue.front(), Some(Expect::Local(_)))
    }

    /// Accounts for a server message that was forwarded or dropped; `body`
    /// is needed for ErrorResponse only.
    #[inline]
    pub fn consume(&mut self, tag: u8, body: &[u8], server: &mut ServerStatements) {
        use tags::backend as b;
        if is_async(tag) {
            return;
        }
        let done = match self.queue.front() {
            None => return,
            Some(head) if tag == b::ERROR_RESPONSE => {
                let head = head.clone();
                self.on_error(head, body, server);
                return;
            }
            Some(Expect::Prepare { id, .. }) => {
                let done = tag == b::PARSE_COMPLETE;
                if done {
                    server.confirm(*id);
                }
                done
            }
            Some(Expect::Unprepare { id }) => {
                let done = tag == b::CLOSE_COMPLETE;
                if done {
                    server.close_done(*id, false);
                }
                done
            }
            Some(Expect::CloseUnnamed) => tag == b::CLOSE_COMPLETE,
            Some(Expect::Local(_)) => false,
            Some(Expect::Discard) => tag == b::READY_FOR_QUERY,
            Some(Expect::Refused(_)) => tag == b::PARSE_COMPLETE,
            Some(Expect::Pass { reply, .. }) => {
                let done = ends(*reply, tag);
                if done && *reply == Reply::Execute {
                    self.executes_done += 1;
                }
                done
            }
        };
        if done {
            self.queue.pop_front();
        }
    }

    fn on_error(&mut self, head: Expect, body: &[u8], server: &mut ServerStatements) {
        let code = ErrorFields::decode(body).map(|f| f.code).unwrap_or("");
        match head {
            // A simple query's error is followed by its ReadyForQuery.
            Expect::Pass {
                reply: Reply::Query | Reply::Sync,
                ..
            }
            | Expect::Local(_)
            | Expect::Discard => return,
            Expect::Refused(_) | Expect::CloseUnnamed => {}
            Expect::Prepare { id, client_name } => {
                // Class 42 (syntax, undefined objects, privileges) is about
                // the text; others (a failed block, cancel) are not.
                if code.starts_with("42") {
                    server.refuted(id);
                } else {
                    server.forget(id);
                }
                self.failed_parses
                    .extend(client_name.map(|name| NameUndo::Parsed(name, id)));
            }
            Expect::Unprepare { id } => {
                server.forget(id);
                server.close_done(id, false);
            }
            // A Parse sent on: unnamed, or of a name in use (42P05).
            Expect::Pass {
                reply: Reply::Parse,
                ..
            } => {}
            Expect::Pass {
                statement: Some(id),
                ..
            } => {
                if code == STALE_PLAN {
                    server.retire(id);
                } else if code == NO_STATEMENT {
                    server.forget(id);
                } else if code.starts_with("42") {
                    server.distrust(id);
                }
            }
            Expect::Pass { .. } => {}
        }
        self.queue.pop_front();
        self.skipping = true;
        self.skip_ignored(server);
    }

    /// An ErrorResponse (`body`) that answers the message at the head of
    /// the queue and names the shared statement it used (`"sluice_7"`),
    /// rewritten whole to name the client's statement instead, as
    /// PostgreSQL would have: "bind message supplies 0 parameters, but
    /// prepared statement "s1" requires 1". None when it names none (the
    /// message then passes as it is). Errors are rare: the search costs
    /// nothing on the path of rows.
    pub fn renamed_error(&self, body: &[u8]) -> Option<BytesMut> {
        if let Some(Expect::Refused(refusal)) = self.queue.front() {
            let (code, why) = &**refusal;
            let mut out = BytesMut::new();
            ErrorFields::new(Severity::Error, code, why).encode(&mut out);
            return Some(out);
        }
        let Some(Expect::Pass {
            statement: Some(id),
            name: Some(client),
            ..
        }) = self.queue.front()
        else {
            return None;
        };
        rename_statement(body, &super::server_name(*id), client)
    }

    /// Drops entries the server skips, and takes the local replies now due
    /// (everything before them answered), writing them to `out`.
    #[inline]
    pub fn settle(
        &mut self,
        out: &mut BytesMut,
        status: TransactionStatus,
        server: &mut ServerStatements,
    ) {
        self.skip_ignored(server);
        while let Some(Expect::Local(local)) = self.queue.front() {
            write_local(out, local, status);
            self.queue.pop_front();
        }
    }

    /// While skipping after an error, drops the entries the server ignores
    /// (all up to the next Sync), undoing what sluice assumed of them.
    #[inline]
    fn skip_ignored(&mut self, server: &mut ServerStatements) {
        if self.skipping {
            self.skip_ignored_slow(server);
        }
    }

    fn skip_ignored_slow(&mut self, server: &mut ServerStatements) {
        while self.skipping {
            match self.queue.front() {
                None => return,
                Some(Expect::Pass {
                    reply: Reply::Sync, ..
                }) => self.skipping = false,
                Some(Expect::Prepare { id, .. }) => {
                    server.forget(*id);
                    if let Some(Expect::Prepare {
                        id,
                        client_name: Some(name),
                    }) = self.queue.pop_front()
                    {
                        self.failed_parses.push(NameUndo::Parsed(name, id));
                    }
                }
                Some(Expect::Unprepare { id }) => {
                    server.close_done(*id, true);
                    self.queue.pop_front();
                }
                Some(Expect::Local(Local::CloseComplete(Some(_)))) => {
                    if let Some(Expect::Local(Local::CloseComplete(Some(kept)))) =
                        self.queue.pop_front()
                    {
                        self.failed_parses.push(NameUndo::Closed(kept.0, kept.1));
                    }
                }
                Some(Expect::Local(Local::ParseComplete(Some(_)))) => {
                    if let Some(Expect::Local(Local::ParseComplete(Some(named)))) =
                        self.queue.pop_front()
                    {
                        self.failed_parses.push(NameUndo::Parsed(named.0, named.1));
                    }
                }
                Some(Expect::Pass {
                    reply: Reply::Query,
                    ..
                }) => {
                    self.ignored_requests = self.ignored_requests.saturating_add(1);
                    self.queue.pop_front();
                }
                // (sluice's own query, ignored too: no request of the
                // client's)
                Some(
                    Expect::Pass { .. }
                    | Expect::Local(_)
                    | Expect::Refused(_)
                    | Expect::Discard
                    | Expect::CloseUnnamed,
                ) => {
                    self.queue.pop_front();
                }
            }
        }
    }

    /// Queries and function calls PostgreSQL ignored since last asked
    /// (they came after an error in an extended-protocol batch, before its
    /// Sync): no ReadyForQuery answers them. With it, whether the server
    /// still ignores what comes (no Sync sent yet to end the batch).
    pub fn take_ignored_requests(&mut self) -> Option<(u32, bool)> {
        if self.ignored_requests == 0 {
            return None;
        }
        Some((std::mem::take(&mut self.ignored_requests), self.skipping))
    }
}

/// `body` (an ErrorResponse's fields) with every `"shared"` replaced by
/// `"client"`, framed as a whole message; None if `shared` is not in it.
/// Fields end in NUL and a statement name has none, so the fields stay
/// whole.
fn rename_statement(body: &[u8], shared: &str, client: &[u8]) -> Option<BytesMut> {
    let mut quoted = Vec::with_capacity(shared.len() + 2);
    quoted.push(b'"');
    quoted.extend_from_slice(shared.as_bytes());
    quoted.push(b'"');
    let found = |from: usize| {
        body[from..]
            .windows(quoted.len())
            .position(|w| w == quoted.as_slice())
            .map(|at| from + at)
    };
    let mut at = found(0)?;
    let mut renamed = Vec::with_capacity(body.len() + client.len());
    let mut from = 0;
    loop {
        renamed.extend_from_slice(&body[from..at]);
        renamed.push(b'"');
        renamed.extend_from_slice(client);
        renamed.push(b'"');
        from = at + quoted.len();
        match found(from) {
            Some(next) => at = next,
            None => break,
        }
    }
    renamed.extend_from_slice(&body[from..]);
    let mut out = BytesMut::with_capacity(renamed.len() + sluice_wire::HEADER_LEN);
    sluice_wire::MessageBuilder::new(&mut out, tags::backend::ERROR_RESPONSE)
        .bytes(&renamed)
        .finish();
    Some(out)
}

/// Messages a server may send at any time.
fn is_async(tag: u8) -> bool {
    use tags::backend as b;
    matches!(
        tag,
        b::NOTICE_RESPONSE | b::PARAMETER_STATUS | b::NOTIFICATION_RESPONSE
    )
}

fn ends(reply: Reply, tag: u8) -> bool {
    use tags::backend as b;
    match reply {
        Reply::Parse => tag == b::PARSE_COMPLETE,
        Reply::Bind => tag == b::BIND_COMPLETE,
        Reply::Close => tag == b::CLOSE_COMPLETE,
        Reply::DescribeStatement | Reply::DescribePortal => {
            tag == b::ROW_DESCRIPTION || tag == b::NO_DATA
        }
        Reply::Execute => matches!(
            tag,
            b::COMMAND_COMPLETE | b::EMPTY_QUERY_RESPONSE | b::PORTAL_SUSPENDED
        ),
        Reply::Sync | Reply::Query => tag == b::READY_FOR_QUERY,
    }
}

fn write_local(out: &mut BytesMut, local: &Local, status: TransactionStatus) {
    use sluice_wire::MessageBuilder;
    match local {
        Local::ParseComplete(_) => MessageBuilder::new(out, tags::backend::PARSE_COMPLETE).finish(),
        Local::CloseComplete(_) => MessageBuilder::new(out, tags::backend::CLOSE_COMPLETE).finish(),
        Local::Command(tag) => {
            sluice_wire::command_complete(out, tag);
            sluice_wire::ready_for_query(out, status);
        }
        Local::Refused(refusal) => {
            let (code, message) = &**refusal;
            ErrorFields::new(Severity::Error, code, message).encode(out);
            sluice_wire::ready_for_query(out, status);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tags::backend as b;

    impl Expected {
        fn verdict_for_test(&mut self, tag: u8) -> Verdict {
            self.verdict(tag, &mut ServerStatements::default())
        }
    }

    fn error_body(code: &str) -> Vec<u8> {
        let mut buf = BytesMut::new();
        ErrorFields::new(Severity::Error, code, "boom").encode(&mut buf);
        buf[5..].to_vec()
    }

    /// Wherever `passes_rows` says so, the general path would forward a
    /// DataRow and change nothing.
    #[test]
    fn passes_rows_agrees_with_verdict_and_consume() {
        let heads = [
            None,
            Some(Expect::pass(Reply::Execute)),
            Some(Expect::Pass {
                reply: Reply::Query,
                statement: Some(3),
                name: None,
            }),
            Some(Expect::pass(Reply::DescribePortal)),
            Some(Expect::Prepare {
                id: 7,
                client_name: None,
            }),
            Some(Expect::Unprepare { id: 7 }),
            Some(Expect::Local(Local::ParseComplete(None))),
        ];
        for head in heads {
            for skipping in [false, true] {
                let mut server = ServerStatements::default();
                let mut e = Expected::default();
                if let Some(h) = head.clone() {
                    e.push(h);
                }
                e.skipping = skipping;
                if !e.passes_rows() {
                    continue;
                }
                let before = format!("{:?}", e.queue);
                assert_eq!(
                    e.verdict(tags::backend::DATA_ROW, &mut server),
                    Verdict::Forward
                );
                e.consume(tags::backend::DATA_ROW, &[], &mut server);
                assert_eq!(format!("{:?}", e.queue), before, "{head:?}");
                assert!(!e.skipping);
            }
        }
        assert!(Expected::default().passes_rows());
        let mut e = Expected::default();
        e.push(Expect::Local(Local::ParseComplete(None)));
        assert!(!e.passes_rows());
        let e = Expected {
            skipping: true,
            ..Expected::default()
        };
        assert!(!e.passes_rows());
    }

    #[test]
    fn sluices_own_query_is_dropped_up_to_its_ready_for_query() {
        let mut server = ServerStatements::default();
        let mut e = Expected::default();
        assert!(e.is_empty() && !e.skipping());
        e.push(Expect::pass(Reply::Query));
        e.insert(0, Expect::Discard);
        assert!(e.discarding() && !e.is_empty());
        for tag in [b::COMMAND_COMPLETE, b::ERROR_RESPONSE] {
            assert_eq!(e.verdict_for_test(tag), Verdict::Drop);
            e.consume(tag, &[], &mut server);
            assert!(e.discarding(), "still owed its ReadyForQuery");
        }
        assert_eq!(e.verdict_for_test(b::READY_FOR_QUERY), Verdict::Drop);
        e.consume(b::READY_FOR_QUERY, &[], &mut server);
        assert!(!e.discarding());
        assert_eq!(e.verdict_for_test(b::COMMAND_COMPLETE), Verdict::Forward);
        e.consume(b::READY_FOR_QUERY, &[], &mut server);
        assert!(e.is_empty() && !e.skipping());
    }

    #[test]
    fn injected_parse_is_dropped_and_local_reply_waits_its_turn() {
        let mut server = ServerStatements::default();
        let mut e = Expected::default();
        e.push(Expect::pass(Reply::Bind));
        e.push(Expect::Local(Local::ParseComplete(None)));
        e.push(Expect::Prepare {
            id: 7,
            client_name: None,
        });
        let mut out = BytesMut::new();
        e.settle(&mut out, TransactionStatus::Idle, &mut server);
        assert!(out.is_empty(), "the Bind is answered first");
        assert_eq!(e.verdict_for_test(b::BIND_COMPLETE), Verdict::Forward);
        e.consume(b::BIND_COMPLETE, &[], &mut server);
        assert_eq!(e.verdict_for_test(b::PARSE_COMPLETE), Verdict::LocalFirst);
        e.settle(&mut out, TransactionStatus::Idle, &mut server);
        assert_eq!(&out[..], b"1\0\0\0\x04");
        assert_eq!(e.verdict_for_test(b::PARSE_COMPLETE), Verdict::Drop);
        e.consume(b::PARSE_COMPLETE, &[], &mut server);
        assert!(e.is_empty());
    }

    #[test]
    fn error_skips_to_sync_and_undoes_assumptions() {
        let registry = super::super::registry::Registry::default();
        let one = registry.intern(b"select 1\0\0\0", None);
        let two = registry.intern(b"select 2\0\0\0", None);
        let mut server = ServerStatements::default();
        server.insert(&one, 0);
        server.insert(&two, 0);
        let mut e = Expected::default();
        e.push(Expect::Pass {
            reply: Reply::Bind,
            statement: Some(one.id),
            name: None,
        });
        e.push(Expect::Prepare {
            id: two.id,
            client_name: None,
        });
        e.push(Expect::Local(Local::ParseComplete(None)));
        e.push(Expect::pass(Reply::Sync));
        e.consume(b::ERROR_RESPONSE, &error_body(STALE_PLAN), &mut server);
        let mut out = BytesMut::new();
        e.settle(&mut out, TransactionStatus::Idle, &mut server);
        assert!(out.is_empty(), "skipped local replies are not sent");
        assert_eq!(
            server.to_close,
            vec![one.id],
            "stale statement closed later"
        );
        assert!(!server.touch(two.id), "skipped Parse did not prepare");
        assert_eq!(e.verdict_for_test(b::READY_FOR_QUERY), Verdict::Forward);
        e.consume(b::READY_FOR_QUERY, &[], &mut server);
        assert!(e.is_empty());
    }

    #[test]
    fn an_error_about_a_shared_statement_names_the_clients() {
        let mut fields = BytesMut::new();
        let text = "prepared statement \"sluice_7\" requires 1; \"sluice_7\" and \"sluice_70\"";
        ErrorFields::new(Severity::Error, "08P01", text).encode(&mut fields);
        let body = &fields[sluice_wire::HEADER_LEN..];
        let mut e = Expected::default();
        e.push(Expect::Pass {
            reply: Reply::Bind,
            statement: Some(7),
            name: Some(b"my stmt".as_slice().into()),
        });
        let renamed = e.renamed_error(body).expect("renamed");
        let decoded = ErrorFields::decode(&renamed[sluice_wire::HEADER_LEN..]).expect("whole");
        assert_eq!(decoded.code, "08P01");
        assert_eq!(
            decoded.message,
            "prepared statement \"my stmt\" requires 1; \"my stmt\" and \"sluice_70\""
        );
        // An error that names no shared statement, or an entry without a
        // client name, passes unchanged.
        let mut other = BytesMut::new();
        ErrorFields::new(Severity::Error, "22012", "division by zero").encode(&mut other);
        assert!(e.renamed_error(&other[sluice_wire::HEADER_LEN..]).is_none());
        let mut unnamed = Expected::default();
        unnamed.push(Expect::pass(Reply::Bind));
        assert!(unnamed.renamed_error(body).is_none());
    }
}
