//! A client between transactions that only prepares or closes statements
//! (Parse … Sync, as libpq's `PQprepare` sends it) is answered here, without
//! a server. A pooler that takes a server for it deadlocks pgbench
//! `-M prepared` past the pool size: pgbench prepares with a blocking call,
//! so one thread waits for a server held by its own clients mid-transaction,
//! which it no longer serves (issue 13). A Parse is answered only for a
//! text a server of the same database and user has accepted (so a syntax
//! error still comes back at Parse, from PostgreSQL); the statement reaches
//! a server when a Bind or Describe needs it, as it does today on every
//! server but the first. Anything else in the batch (Describe, Bind, a
//! Parse of a new text, the unnamed statement) leaves it to a server.

use bytes::BytesMut;
use sluice_wire::{HEADER_LEN, MessageBuilder, Reader, TransactionStatus, tags};

use super::client_names::{
    ClientNames, MAX_CLIENT_STATEMENT_BYTES, MAX_CLIENT_STATEMENTS, NotKept,
};
use super::registry::Registry;

/// Messages one batch answered here may hold (a longer one goes to a
/// server, which is merely slower).
const MAX_BATCH: usize = 64;

enum Step<'a> {
    Parse(&'a [u8], std::sync::Arc<super::registry::Statement>),
    Close(&'a [u8]),
}

/// What became of a batch.
#[derive(Debug, PartialEq, Eq)]
pub enum Answer {
    /// Answered: this many bytes of the buffer were taken.
    Done(usize),
    /// Everything so far may be answered here, but the batch is not whole
    /// yet (no Sync): read more, then ask again.
    Partial,
    /// A server is needed; nothing was done.
    Server,
}

/// Bytes a partial batch may hold before it goes to a server anyway.
pub const PARTIAL_LIMIT: usize = 1 << 20;

/// Answers the batch at the start of `buf` if it needs no server: applies
/// it to the client's `names`, writes the replies to `out`, and says how
/// many bytes of `buf` it took.
pub fn answer(
    buf: &[u8],
    names: &mut ClientNames,
    registry: &Registry,
    (scope, context): (u64, super::registry::ParseContext<'_>),
    out: &mut BytesMut,
) -> Answer {
    match plan(buf, names, registry, (scope, context)) {
        Plan::Whole(steps, end) => {
            apply(steps, names, out);
            Answer::Done(end)
        }
        Plan::Partial if buf.len() < PARTIAL_LIMIT => Answer::Partial,
        Plan::Partial | Plan::Server => Answer::Server,
    }
}

enum Plan<'a> {
    Whole(Vec<Step<'a>>, usize),
    Partial,
    Server,
}

fn plan<'a>(
    buf: &'a [u8],
    names: &ClientNames,
    registry: &Registry,
    (scope, context): (u64, super::registry::ParseContext<'_>),
) -> Plan<'a> {
    use tags::frontend as f;
    let mut steps: Vec<Step<'_>> = Vec::new();
    let mut pos = 0;
    let mut flushed = false;
    let end = loop {
        let Some((tag, body, next)) = message_at(buf, pos) else {
            // A client that flushed may be waiting for the replies so far.
            return if flushed || !whole_or_short(buf, pos) {
                Plan::Server
            } else {
                Plan::Partial
            };
        };
        flushed = false;
        match tag {
            f::PARSE => {
                let mut r = Reader::new(body);
                let Ok(name) = r.cstr_bytes() else {
                    return Plan::Server;
                };
                let text = r.rest();
                // A name in use gets PostgreSQL's 42P05, from a server; a
                // name reused within the batch is left to one too.
                if name.is_empty() || names.get(name).is_some() || named_in(&steps, name) {
                    return Plan::Server;
                }
                let Some(statement) = registry.proven(text, scope, Some(&context.key())) else {
                    return Plan::Server;
                };
                steps.push(Step::Parse(name, statement));
            }
            f::CLOSE => {
                let mut r = Reader::new(body);
                let (Ok(kind), Ok(name)) = (r.u8(), r.cstr_bytes()) else {
                    return Plan::Server;
                };
                if kind != b'S' || name.is_empty() || !r.rest().is_empty() || named_in(&steps, name)
                {
                    return Plan::Server;
                }
                steps.push(Step::Close(name));
            }
            // (with a body, PostgreSQL says 08P01: left to it)
            f::FLUSH if body.is_empty() => flushed = true,
            f::SYNC if body.is_empty() => break next,
            _ => return Plan::Server,
        }
        if steps.len() > MAX_BATCH {
            return Plan::Server;
        }
        pos = next;
    };
    let (parses, bytes) = steps.iter().fold((0, 0), |(n, b), s| match s {
        Step::Parse(name, statement) => (n + 1, b + name.len() + statement.text.len()),
        Step::Close(_) => (n, b),
    });
    // (past the client's limits, the server path parses it unnamed)
    if names.count() + parses > MAX_CLIENT_STATEMENTS
        || names.bytes() + bytes > MAX_CLIENT_STATEMENT_BYTES
    {
        return Plan::Server;
    }
    Plan::Whole(steps, end)
}

fn apply(steps: Vec<Step<'_>>, names: &mut ClientNames, out: &mut BytesMut) {
    for step in steps {
        match step {
            Step::Parse(name, statement) => {
                if let Err(refused) = names.insert(name, statement) {
                    // (past max_held_memory_mb since `plan`: an error, and
                    // the rest of the batch skipped, as a server would)
                    let (code, message) = match refused {
                        NotKept::Memory(r) => (crate::held_memory::Refused::CODE, r.to_string()),
                        NotKept::TooMany => ("54000", "prepared statement not kept".to_owned()),
                    };
                    sluice_wire::ErrorFields::new(sluice_wire::Severity::Error, code, &message)
                        .encode(out);
                    break;
                }
                MessageBuilder::new(out, tags::backend::PARSE_COMPLETE).finish();
            }
            Step::Close(name) => {
                names.remove(name);
                MessageBuilder::new(out, tags::backend::CLOSE_COMPLETE).finish();
            }
        }
    }
    sluice_wire::ready_for_query(out, TransactionStatus::Idle);
}

/// Whether what follows `pos` is empty or the start of a message that is
/// not announced as larger than sluice holds.
fn whole_or_short(buf: &[u8], pos: usize) -> bool {
    let Some(rest) = buf.get(pos..) else {
        return false;
    };
    match rest.get(1..HEADER_LEN) {
        None => true,
        Some(len) => {
            let len = i32::from_be_bytes([len[0], len[1], len[2], len[3]]);
            usize::try_from(len).is_ok_and(|l| (4..PARTIAL_LIMIT).contains(&l))
        }
    }
}

/// Whether an earlier message of the batch names `name`.
fn named_in(steps: &[Step<'_>], name: &[u8]) -> bool {
    steps.iter().any(|s| match s {
        Step::Parse(n, _) | Step::Close(n) => *n == name,
    })
}

/// The whole message at `pos`: tag, body, and where the next one starts.
fn message_at(buf: &[u8], pos: usize) -> Option<(u8, &[u8], usize)> {
    let header = buf.get(pos..pos + HEADER_LEN)?;
    let len = usize::try_from(i32::from_be_bytes([
        header[1], header[2], header[3], header[4],
    ]))
    .ok()
    .filter(|&l| l >= 4)?;
    let next = pos.checked_add(1 + len)?;
    let body = buf.get(pos + HEADER_LEN..next)?;
    Some((header[0], body, next))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCOPE: u64 = 3;

    fn parse(buf: &mut BytesMut, name: &str, text: &str) {
        MessageBuilder::new(buf, tags::frontend::PARSE)
            .cstr(name)
            .cstr(text)
            .bytes(&[0, 0])
            .finish();
    }

    fn close(buf: &mut BytesMut, kind: u8, name: &str) {
        MessageBuilder::new(buf, tags::frontend::CLOSE)
            .u8(kind)
            .cstr(name)
            .finish();
    }

    fn sync(buf: &mut BytesMut) {
        MessageBuilder::new(buf, tags::frontend::SYNC).finish();
    }

    static PARAMS: std::sync::LazyLock<crate::params::ParamSet> =
        std::sync::LazyLock::new(Default::default);

    /// A client that set nothing.
    fn ctx() -> super::super::registry::ParseContext<'static> {
        super::super::registry::ParseContext {
            session: None,
            params: &PARAMS,
        }
    }

    fn proven(
        registry: &Registry,
        text: &str,
    ) -> std::sync::Arc<super::super::registry::Statement> {
        let mut body = text.as_bytes().to_vec();
        body.extend_from_slice(&[0, 0, 0]);
        let s = registry.intern(&body, Some(&ctx().key()));
        s.prove(SCOPE);
        s
    }

    fn tags_of(out: &[u8]) -> Vec<u8> {
        let mut tags = Vec::new();
        let mut pos = 0;
        while let Some((tag, _, next)) = message_at(out, pos) {
            tags.push(tag);
            pos = next;
        }
        tags
    }

    #[test]
    fn parse_of_a_proven_text_then_sync_is_answered_here() {
        let registry = Registry::default();
        let held = proven(&registry, "BEGIN;");
        let mut names = ClientNames::default();
        let mut buf = BytesMut::new();
        parse(&mut buf, "P_0", "BEGIN;");
        sync(&mut buf);
        let first = buf.len();
        // A Bind after the Sync is not part of the batch.
        MessageBuilder::new(&mut buf, tags::frontend::BIND).finish();
        let mut out = BytesMut::new();
        assert_eq!(
            answer(&buf, &mut names, &registry, (SCOPE, ctx()), &mut out),
            Answer::Done(first)
        );
        assert_eq!(tags_of(&out), vec![b'1', b'Z']);
        assert_eq!(out.last(), Some(&b'I'));
        assert_eq!(names.get(b"P_0").map(|s| s.id), Some(held.id));
    }

    #[test]
    fn close_and_flush_are_answered_too() {
        let registry = Registry::default();
        let held = proven(&registry, "select 1");
        let mut names = ClientNames::default();
        assert!(names.insert(b"old", held.clone()).is_ok());
        let mut buf = BytesMut::new();
        close(&mut buf, b'S', "old");
        parse(&mut buf, "new", "select 1");
        MessageBuilder::new(&mut buf, tags::frontend::FLUSH).finish();
        sync(&mut buf);
        let mut out = BytesMut::new();
        assert_eq!(
            answer(&buf, &mut names, &registry, (SCOPE, ctx()), &mut out),
            Answer::Done(buf.len())
        );
        assert_eq!(tags_of(&out), vec![b'3', b'1', b'Z']);
        assert!(names.get(b"old").is_none());
        assert!(names.get(b"new").is_some());
    }

    type Case = dyn Fn(&mut BytesMut);

    #[test]
    fn anything_a_server_must_see_leaves_the_batch_to_one() {
        let registry = Registry::default();
        let _held = proven(&registry, "select 1");
        let unproven = registry.intern(b"select 2\0\0\0", Some(&ctx().key()));
        let cases: Vec<Box<Case>> = vec![
            // A text no server accepted yet (its error must come at Parse).
            Box::new(|b| parse(b, "a", "select 2")),
            // A text never seen.
            Box::new(|b| parse(b, "a", "select 3")),
            // The unnamed statement lives on the server.
            Box::new(|b| parse(b, "", "select 1")),
            // A name in use: 42P05 comes from PostgreSQL.
            Box::new(|b| parse(b, "taken", "select 1")),
            // The same name twice in one batch.
            Box::new(|b| {
                parse(b, "a", "select 1");
                close(b, b'S', "a");
            }),
            // Portals and the unnamed statement.
            Box::new(|b| close(b, b'P', "a")),
            Box::new(|b| close(b, b'S', "")),
            // Describe needs the server's answer.
            Box::new(|b| {
                parse(b, "a", "select 1");
                MessageBuilder::new(b, tags::frontend::DESCRIBE)
                    .u8(b'S')
                    .cstr("a")
                    .finish();
            }),
        ];
        for (i, case) in cases.iter().enumerate() {
            let mut names = ClientNames::default();
            assert!(
                names
                    .insert(
                        b"taken",
                        registry.intern(b"select 9\0\0\0", Some(&ctx().key()))
                    )
                    .is_ok()
            );
            let mut buf = BytesMut::new();
            case(&mut buf);
            sync(&mut buf);
            let mut out = BytesMut::new();
            assert_eq!(
                answer(&buf, &mut names, &registry, (SCOPE, ctx()), &mut out),
                Answer::Server,
                "case {i}"
            );
            assert!(out.is_empty(), "case {i}");
            assert!(names.get(b"a").is_none(), "case {i}");
            assert!(names.get(b"taken").is_some(), "case {i}");
        }
        drop(unproven);
    }

    #[test]
    fn another_scope_or_an_unfinished_batch_needs_a_server() {
        let registry = Registry::default();
        let _held = proven(&registry, "select 1");
        let mut names = ClientNames::default();
        let mut buf = BytesMut::new();
        parse(&mut buf, "a", "select 1");
        let mut out = BytesMut::new();
        // No Sync yet: wait for it.
        assert_eq!(
            answer(&buf, &mut names, &registry, (SCOPE, ctx()), &mut out),
            Answer::Partial
        );
        // Half of the Parse.
        assert_eq!(
            answer(&buf[..7], &mut names, &registry, (SCOPE, ctx()), &mut out),
            Answer::Partial
        );
        let mut flushed = buf.clone();
        sync(&mut buf);
        // Half of the Sync.
        assert_eq!(
            answer(
                &buf[..buf.len() - 1],
                &mut names,
                &registry,
                (SCOPE, ctx()),
                &mut out
            ),
            Answer::Partial
        );
        // A Flush and no Sync: the client may wait for ParseComplete.
        MessageBuilder::new(&mut flushed, tags::frontend::FLUSH).finish();
        assert_eq!(
            answer(&flushed, &mut names, &registry, (SCOPE, ctx()), &mut out),
            Answer::Server
        );
        // Proven for another database or user.
        assert_eq!(
            answer(&buf, &mut names, &registry, (SCOPE + 1, ctx()), &mut out),
            Answer::Server
        );
        // Proven, then refuted there by a server.
        _held.refute(SCOPE);
        assert_eq!(
            answer(&buf, &mut names, &registry, (SCOPE, ctx()), &mut out),
            Answer::Server
        );
        assert!(out.is_empty());
        assert!(names.get(b"a").is_none());
    }

    #[test]
    fn bad_lengths_and_bodies_are_not_answered() {
        let registry = Registry::default();
        let _held = proven(&registry, "select 1");
        let mut names = ClientNames::default();
        let mut out = BytesMut::new();
        let buf = [b'S', 0, 0, 0, 3];
        assert_eq!(
            answer(&buf, &mut names, &registry, (SCOPE, ctx()), &mut out),
            Answer::Server
        );
        let buf = [b'S', 0xff, 0xff, 0xff, 0xff];
        assert_eq!(
            answer(&buf, &mut names, &registry, (SCOPE, ctx()), &mut out),
            Answer::Server
        );
        // A Parse announced larger than a batch may wait for.
        let buf = [b'P', 0x10, 0, 0, 0];
        assert_eq!(
            answer(&buf, &mut names, &registry, (SCOPE, ctx()), &mut out),
            Answer::Server
        );
        // A Sync with a body.
        let mut buf = BytesMut::new();
        parse(&mut buf, "a", "select 1");
        MessageBuilder::new(&mut buf, tags::frontend::SYNC)
            .u8(1)
            .finish();
        assert_eq!(
            answer(&buf, &mut names, &registry, (SCOPE, ctx()), &mut out),
            Answer::Server
        );
        assert!(out.is_empty());
    }
}
