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

use super::client_names::{ClientNames, MAX_CLIENT_STATEMENTS};
use super::registry::Registry;

/// Messages one batch answered here may hold (a longer one goes to a
/// server, which is merely slower).
const MAX_BATCH: usize = 64;

enum Step<'a> {
    Parse(&'a [u8], std::sync::Arc<super::registry::Statement>),
    Close(&'a [u8]),
}

/// Answers the batch at the start of `buf` if it needs no server: applies
/// it to the client's `names`, writes the replies to `out`, and returns how
/// many bytes of `buf` it took. `None`: a server is needed (nothing done).
pub fn answer(
    buf: &[u8],
    names: &mut ClientNames,
    registry: &Registry,
    scope: u64,
    out: &mut BytesMut,
) -> Option<usize> {
    use tags::frontend as f;
    let mut steps: Vec<Step<'_>> = Vec::new();
    let mut pos = 0;
    let end = loop {
        let (tag, body, next) = message_at(buf, pos)?;
        match tag {
            f::PARSE => {
                let mut r = Reader::new(body);
                let name = r.cstr_bytes().ok()?;
                let text = r.rest();
                // A name in use gets PostgreSQL's 42P05, from a server; a
                // name reused within the batch is left to one too.
                if name.is_empty() || names.get(name).is_some() || named_in(&steps, name) {
                    return None;
                }
                let statement = registry.proven(text, scope)?;
                steps.push(Step::Parse(name, statement));
            }
            f::CLOSE => {
                let mut r = Reader::new(body);
                let kind = r.u8().ok()?;
                let name = r.cstr_bytes().ok()?;
                if kind != b'S' || name.is_empty() || named_in(&steps, name) {
                    return None;
                }
                steps.push(Step::Close(name));
            }
            f::FLUSH => {}
            f::SYNC => break next,
            _ => return None,
        }
        if steps.len() > MAX_BATCH {
            return None;
        }
        pos = next;
    };
    let parses = steps
        .iter()
        .filter(|s| matches!(s, Step::Parse(..)))
        .count();
    if names.count() + parses > MAX_CLIENT_STATEMENTS {
        return None;
    }
    for step in steps {
        match step {
            Step::Parse(name, statement) => {
                names.insert(name, statement);
                MessageBuilder::new(out, tags::backend::PARSE_COMPLETE).finish();
            }
            Step::Close(name) => {
                names.remove(name);
                MessageBuilder::new(out, tags::backend::CLOSE_COMPLETE).finish();
            }
        }
    }
    sluice_wire::ready_for_query(out, TransactionStatus::Idle);
    Some(end)
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
    use std::sync::atomic::Ordering;

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

    fn proven(
        registry: &Registry,
        text: &str,
    ) -> std::sync::Arc<super::super::registry::Statement> {
        let mut body = text.as_bytes().to_vec();
        body.extend_from_slice(&[0, 0, 0]);
        let s = registry.intern(&body);
        s.proven.store(SCOPE, Ordering::Relaxed);
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
            answer(&buf, &mut names, &registry, SCOPE, &mut out),
            Some(first)
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
        assert!(names.insert(b"old", held.clone()));
        let mut buf = BytesMut::new();
        close(&mut buf, b'S', "old");
        parse(&mut buf, "new", "select 1");
        MessageBuilder::new(&mut buf, tags::frontend::FLUSH).finish();
        sync(&mut buf);
        let mut out = BytesMut::new();
        assert_eq!(
            answer(&buf, &mut names, &registry, SCOPE, &mut out),
            Some(buf.len())
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
        let unproven = registry.intern(b"select 2\0\0\0");
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
            assert!(names.insert(b"taken", registry.intern(b"select 9\0\0\0")));
            let mut buf = BytesMut::new();
            case(&mut buf);
            sync(&mut buf);
            let mut out = BytesMut::new();
            assert_eq!(
                answer(&buf, &mut names, &registry, SCOPE, &mut out),
                None,
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
        // No Sync yet.
        assert_eq!(answer(&buf, &mut names, &registry, SCOPE, &mut out), None);
        sync(&mut buf);
        // Half of the Sync.
        assert_eq!(
            answer(
                &buf[..buf.len() - 1],
                &mut names,
                &registry,
                SCOPE,
                &mut out
            ),
            None
        );
        // Proven for another database or user.
        assert_eq!(
            answer(&buf, &mut names, &registry, SCOPE + 1, &mut out),
            None
        );
        assert!(out.is_empty());
        assert!(names.get(b"a").is_none());
    }

    #[test]
    fn a_bad_length_is_not_answered() {
        let registry = Registry::default();
        let mut names = ClientNames::default();
        let mut out = BytesMut::new();
        let buf = [b'S', 0, 0, 0, 3];
        assert_eq!(answer(&buf, &mut names, &registry, SCOPE, &mut out), None);
        let buf = [b'S', 0xff, 0xff, 0xff, 0xff];
        assert_eq!(answer(&buf, &mut names, &registry, SCOPE, &mut out), None);
    }
}
