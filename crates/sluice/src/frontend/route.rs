//! Where the transaction a client is starting may run, decided from the
//! bytes it has sent before sluice takes a server: a replica only when the
//! whole request is visible and provably reads (a simple Query, or an
//! extended-protocol batch up to its Sync whose every statement reads),
//! or when it starts a READ ONLY transaction, which PostgreSQL itself keeps
//! from writing. Anything else, incomplete or unknown goes to the primary.

use std::sync::{Arc, LazyLock};

use sluice_router::{Classifier, Route};
use sluice_wire::tags::frontend as f;

use crate::prepared::registry::Statement;

/// Messages of one batch looked at before giving up (to the primary).
const BATCH_LIMIT: usize = 64;

/// PostgreSQL's built-in functions only.
static BUILT_IN: LazyLock<Classifier> = LazyLock::new(Classifier::default);

/// Route of one statement text: a hint in it wins.
fn of_text(text: &[u8], classifier: &Classifier) -> Route {
    sluice_router::hint(text).unwrap_or_else(|| classifier.classify(text))
}

/// Route of a prepared statement. The verdict with the built-in functions
/// is cached on the statement (shared by every database); one it sends to
/// the primary is classified again with the database's own functions, if
/// it has any that cannot write.
fn of_statement(statement: &Statement, own: Option<&Classifier>) -> Route {
    let read = *statement
        .read_only
        .get_or_init(|| of_text(statement.query(), &BUILT_IN) == Route::Replica);
    match (read, own) {
        (true, _) => Route::Replica,
        (false, Some(own)) => of_text(statement.query(), own),
        (false, None) => Route::Primary,
    }
}

/// The route of the request at the start of `buf`; `named` finds a
/// client's prepared statement by name.
/// `own`: the classifier with the database's own read-only functions, if
/// it has any.
pub fn request(
    buf: &[u8],
    own: Option<&Classifier>,
    named: impl Fn(&[u8]) -> Option<Arc<Statement>>,
) -> Route {
    let classifier = own.unwrap_or(&BUILT_IN);
    let mut pos = 0;
    // Statements parsed earlier in this batch: (name, route).
    let mut parsed: Vec<(&[u8], Route)> = Vec::new();
    for _ in 0..BATCH_LIMIT {
        let Some((tag, body)) = message(buf.get(pos..).unwrap_or(&[])) else {
            return Route::Primary; // incomplete: not all of it is known
        };
        pos += 5 + body.len();
        match tag {
            f::QUERY if pos == 5 + body.len() => {
                return of_text(body.strip_suffix(b"\0").unwrap_or(body), classifier);
            }
            f::PARSE => {
                let Some((name, rest)) = cstr(body) else {
                    return Route::Primary;
                };
                let text = rest.split(|&b| b == 0).next().unwrap_or(&[]);
                let route = of_text(text, classifier);
                if route == Route::Primary {
                    return Route::Primary;
                }
                parsed.retain(|(n, _)| *n != name);
                parsed.push((name, route));
            }
            f::BIND => {
                let Some((_, rest)) = cstr(body) else {
                    return Route::Primary;
                };
                let Some((statement, _)) = cstr(rest) else {
                    return Route::Primary;
                };
                let route = match parsed.iter().rev().find(|(n, _)| *n == statement) {
                    Some((_, r)) => *r,
                    None if statement.is_empty() => Route::Primary,
                    None => named(statement).map_or(Route::Primary, |s| of_statement(&s, own)),
                };
                if route == Route::Primary {
                    return Route::Primary;
                }
            }
            f::DESCRIBE | f::EXECUTE | f::FLUSH | f::CLOSE => {}
            f::SYNC if !parsed.is_empty() || pos > 5 => return Route::Replica,
            _ => return Route::Primary,
        }
    }
    Route::Primary
}

/// Whether the word `transaction` appears anywhere in `buf` (any case,
/// even in a string or a comment): the first request of a READ ONLY block
/// that may change the block (`SET TRANSACTION …`, `transaction_read_only`,
/// `transaction_isolation`) goes to the primary. Read only for such a
/// request, whose bytes are few.
pub fn mentions_transaction(buf: &[u8]) -> bool {
    const WORD: &[u8] = b"transaction";
    buf.windows(WORD.len())
        .any(|w| w.eq_ignore_ascii_case(WORD))
}

/// Largest simple Query kept to run again on the primary.
const RETRY_LIMIT: usize = 64 * 1024;

/// The length of the simple Query at the start of `buf` if it may run
/// again on the primary after a replica refused it: its error leaves no
/// transaction open (nothing in it could open one: no BEGIN or START
/// anywhere, even in a string).
pub fn retry_safe(buf: &[u8]) -> Option<usize> {
    let (tag, body) = message(buf)?;
    let len = 5 + body.len();
    if tag != f::QUERY || len > RETRY_LIMIT {
        return None;
    }
    (!may_start_transaction(body)).then_some(len)
}

/// Whether `text` mentions BEGIN or START anywhere (even in a string):
/// it might open a transaction block, which an error would leave aborted.
fn may_start_transaction(text: &[u8]) -> bool {
    let ident = |b: Option<&u8>| b.is_some_and(|c| c.is_ascii_alphanumeric() || *c == b'_');
    let mentions = |word: &[u8]| {
        text.windows(word.len()).enumerate().any(|(i, w)| {
            w.eq_ignore_ascii_case(word)
                && !ident(i.checked_sub(1).and_then(|j| text.get(j)))
                && !ident(text.get(i + word.len()))
        })
    };
    mentions(b"begin") || mentions(b"start")
}

/// The length of the extended-protocol batch at the start of `buf`, up to
/// and including its Sync, if it may run again on the primary after a
/// replica refused it (or froze, or was lost) before answering: Parses of
/// the unnamed statement (what most drivers send for a one-off query),
/// Binds of it or of the client's named statements, Describes of portals
/// or of the unnamed statement, Executes and Flushes; no statement may
/// open a transaction block. A named Parse or a Close would change the
/// client's statements twice; an unnamed statement not parsed in the
/// batch lived on the replica's server and is not on the primary's.
/// `proven`: every text must also be a read by the built-in classifier
/// alone (see [`lost_retry_safe`]), for a batch on the primary, whose
/// server may die after a write committed; it runs again on another
/// server of the primary (the client's named statements are parsed there
/// as on any server that lacks them).
pub fn retry_safe_batch(
    buf: &[u8],
    named: impl Fn(&[u8]) -> Option<Arc<Statement>>,
    proven: bool,
) -> Option<usize> {
    let safe = |text: &[u8]| !may_start_transaction(text) && (!proven || proven_read(text));
    let mut pos = 0;
    let mut binds = 0;
    let mut unnamed = false;
    for _ in 0..BATCH_LIMIT {
        let (tag, body) = message(buf.get(pos..)?)?;
        pos += 5 + body.len();
        if pos > RETRY_LIMIT {
            return None;
        }
        match tag {
            f::PARSE => {
                let (name, rest) = cstr(body)?;
                let (text, _) = cstr(rest)?;
                if !name.is_empty() || !safe(text) {
                    return None;
                }
                unnamed = true;
            }
            f::BIND => {
                let (_, rest) = cstr(body)?;
                let (statement, _) = cstr(rest)?;
                if statement.is_empty() {
                    if !unnamed {
                        return None;
                    }
                } else if !safe(named(statement)?.query()) {
                    return None;
                }
                binds += 1;
            }
            f::DESCRIBE if body.first() == Some(&b'P') => {}
            f::DESCRIBE if unnamed && body == b"S\0" => {}
            f::EXECUTE | f::FLUSH => {}
            f::SYNC if binds > 0 || unnamed => return Some(pos),
            _ => return None,
        }
    }
    None
}

/// The length of the simple Query at the start of `buf` if it may run
/// again on another server after its own died before answering (a stale
/// pooled server after a restart or a switchover): it cannot have done
/// anything. `read`: the router found it reads only, and the built-in
/// classifier alone agrees (a hint or a database's own function is a
/// claim, not a proof: a write could have committed before the server
/// died); otherwise it must be a lone transaction start (`BEGIN`,
/// `START TRANSACTION`, with modes).
pub fn lost_retry_safe(buf: &[u8], read: bool) -> Option<usize> {
    let (tag, body) = message(buf)?;
    let len = 5 + body.len();
    if tag != f::QUERY || len > RETRY_LIMIT {
        return None;
    }
    let text = body.strip_suffix(b"\0").unwrap_or(body);
    if read {
        return proven_read(text).then_some(len);
    }
    let text = text.trim_ascii_start();
    // The first word first: most queries are not a BEGIN, and this runs
    // on every transaction. Five bytes, each `| 0x20`, equal a lower-case
    // word exactly when they spell it in any case (its bytes are letters).
    let first: [u8; 5] = text.get(..5)?.try_into().ok()?;
    let [a, b, c, d, e] = first;
    let folded = u64::from_le_bytes([a, b, c, d, e, 0, 0, 0]) | 0x20_2020_2020;
    const BEGIN: u64 = u64::from_le_bytes(*b"begin\0\0\0");
    const START: u64 = u64::from_le_bytes(*b"start\0\0\0");
    if folded != BEGIN && folded != START {
        return None;
    }
    let text = text.trim_ascii_end();
    let text = text.strip_suffix(b";").unwrap_or(text).trim_ascii_end();
    // Plain words only: no second statement, string, comment or quote
    // that could hide one.
    let plain = text
        .iter()
        .all(|&b| b.is_ascii_alphanumeric() || b == b'_' || b == b',' || b.is_ascii_whitespace());
    let mut words = text
        .split(|b| b.is_ascii_whitespace() || *b == b',')
        .filter(|w| !w.is_empty());
    let first = words.next().unwrap_or(&[]);
    let starts = first.eq_ignore_ascii_case(b"begin")
        || (first.eq_ignore_ascii_case(b"start")
            && words
                .next()
                .is_some_and(|w| w.eq_ignore_ascii_case(b"transaction")));
    (plain && starts).then_some(len)
}

/// The built-in classifier alone finds `text` a read, with no hint: a
/// hint or a database's own function is a claim, not a proof.
fn proven_read(text: &[u8]) -> bool {
    sluice_router::hint(text).is_none() && BUILT_IN.classify(text) == Route::Replica
}

/// One whole message at the start of `buf`: (type, body).
fn message(buf: &[u8]) -> Option<(u8, &[u8])> {
    let tag = *buf.first()?;
    let len = i32::from_be_bytes(buf.get(1..5)?.try_into().ok()?);
    let len = usize::try_from(len).ok()?.checked_sub(4)?;
    Some((tag, buf.get(5..5 + len)?))
}

/// A NUL-terminated string and what follows it.
fn cstr(body: &[u8]) -> Option<(&[u8], &[u8])> {
    let end = body.iter().position(|&b| b == 0)?;
    Some((&body[..end], &body[end + 1..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(tag: u8, body: &[u8]) -> Vec<u8> {
        let mut out = vec![tag];
        out.extend_from_slice(&(body.len() as i32 + 4).to_be_bytes());
        out.extend_from_slice(body);
        out
    }

    fn query(sql: &str) -> Vec<u8> {
        msg(f::QUERY, format!("{sql}\0").as_bytes())
    }

    fn parse(name: &str, sql: &str) -> Vec<u8> {
        msg(f::PARSE, format!("{name}\0{sql}\0\0\0").as_bytes())
    }

    #[test]
    fn a_block_change_is_seen_in_any_case() {
        assert!(mentions_transaction(&query("SET TRANSACTION READ WRITE")));
        assert!(mentions_transaction(&parse(
            "s",
            "set transaction_isolation = 'serializable'"
        )));
        assert!(mentions_transaction(
            b"select set_config('Transaction_Read_Only', 'off', true)"
        ));
        assert!(!mentions_transaction(&query("select 1")));
    }

    fn bind(statement: &str) -> Vec<u8> {
        msg(f::BIND, format!("\0{statement}\0\0\0\0\0\0\0").as_bytes())
    }

    fn batch(parts: &[Vec<u8>]) -> Vec<u8> {
        parts.concat()
    }

    fn none(_: &[u8]) -> Option<Arc<Statement>> {
        None
    }

    fn request_with(buf: &[u8], named: impl Fn(&[u8]) -> Option<Arc<Statement>>) -> Route {
        request(buf, None, named)
    }

    #[test]
    fn simple_queries() {
        assert_eq!(request_with(&query("select 1"), none), Route::Replica);
        assert_eq!(request_with(&query("delete from t"), none), Route::Primary);
        assert_eq!(
            request_with(&query("/* sluice: primary */ select 1"), none),
            Route::Primary
        );
        // Incomplete: primary.
        let q = query("select 1");
        assert_eq!(request_with(&q[..q.len() - 1], none), Route::Primary);
    }

    #[test]
    fn an_extended_batch_reads_only_if_every_statement_reads() {
        let exec = msg(f::EXECUTE, b"\0\0\0\0\0");
        let sync = msg(f::SYNC, b"");
        let reads = batch(&[parse("", "select 1"), bind(""), exec.clone(), sync.clone()]);
        assert_eq!(request_with(&reads, none), Route::Replica);
        let mixed = batch(&[
            parse("", "select 1"),
            bind(""),
            exec.clone(),
            parse("", "insert into t values (1)"),
            bind(""),
            exec.clone(),
            sync.clone(),
        ]);
        assert_eq!(request_with(&mixed, none), Route::Primary);
        // No Sync yet: more may follow.
        let open = batch(&[parse("", "select 1"), bind(""), exec.clone()]);
        assert_eq!(request_with(&open, none), Route::Primary);
        // A Bind of an unknown name, or of the unnamed statement not
        // parsed here: primary.
        let unknown = batch(&[bind("s1"), exec.clone(), sync.clone()]);
        assert_eq!(request_with(&unknown, none), Route::Primary);
        let unnamed = batch(&[bind(""), exec, sync]);
        assert_eq!(request_with(&unnamed, none), Route::Primary);
    }

    #[test]
    fn only_queries_that_leave_no_transaction_are_retried() {
        assert!(retry_safe(&query("select f(1)")).is_some());
        assert!(retry_safe(&query("begin read only; select 1")).is_none());
        assert!(retry_safe(&query("start transaction; select 1")).is_none());
        assert!(retry_safe(&query("select started_at, begin_date from t")).is_some());
        assert!(retry_safe(&parse("", "select 1")).is_none());
    }

    #[test]
    fn only_batches_that_open_no_transaction_nor_change_named_statements_are_retried() {
        let registry = crate::prepared::registry::Registry::default();
        let read = registry.intern(b"select 1\0\0\0", None);
        let begin = registry.intern(b"begin read only\0\0\0", None);
        let named = |name: &[u8]| match name {
            b"r" => Some(read.clone()),
            b"b" => Some(begin.clone()),
            _ => None,
        };
        let exec = msg(f::EXECUTE, b"\0\0\0\0\0");
        let sync = msg(f::SYNC, b"");
        let describe = msg(f::DESCRIBE, b"P\0");
        let ok = batch(&[bind("r"), describe.clone(), exec.clone(), sync.clone()]);
        assert_eq!(retry_safe_batch(&ok, named, false), Some(ok.len()));
        // Only up to the first Sync.
        let two = batch(&[ok.clone(), bind("r"), exec.clone(), sync.clone()]);
        assert_eq!(retry_safe_batch(&two, named, false), Some(ok.len()));
        // A one-off query as drivers send it: the unnamed statement,
        // parsed in the batch.
        let one_off = batch(&[
            parse("", "select 1"),
            bind(""),
            describe.clone(),
            exec.clone(),
            sync.clone(),
        ]);
        assert_eq!(
            retry_safe_batch(&one_off, named, false),
            Some(one_off.len())
        );
        let described = batch(&[
            parse("", "select 1"),
            msg(f::DESCRIBE, b"S\0"),
            sync.clone(),
        ]);
        assert_eq!(
            retry_safe_batch(&described, named, false),
            Some(described.len())
        );
        for bad in [
            batch(&[bind("b"), exec.clone(), sync.clone()]),
            batch(&[bind("x"), exec.clone(), sync.clone()]),
            batch(&[bind(""), exec.clone(), sync.clone()]),
            batch(&[
                parse("", "begin read only"),
                bind(""),
                exec.clone(),
                sync.clone(),
            ]),
            batch(&[parse("", "select 1"), msg(f::CLOSE, b"S\0"), sync.clone()]),
            batch(&[
                parse("r2", "select 1"),
                bind("r2"),
                exec.clone(),
                sync.clone(),
            ]),
            batch(&[
                msg(f::DESCRIBE, b"Sr\0"),
                bind("r"),
                exec.clone(),
                sync.clone(),
            ]),
            batch(&[bind("r"), exec.clone()]),
            sync.clone(),
        ] {
            assert_eq!(retry_safe_batch(&bad, named, false), None);
        }
        // On the primary, every text must be a read by the built-in
        // classifier alone.
        assert_eq!(retry_safe_batch(&ok, named, true), Some(ok.len()));
        assert_eq!(retry_safe_batch(&one_off, named, true), Some(one_off.len()));
        for claimed in [
            "insert into t values (1)",
            "select my_stable_fn()",
            "/* sluice: replica */ delete from t",
        ] {
            let batch = batch(&[parse("", claimed), bind(""), exec.clone(), sync.clone()]);
            assert!(
                retry_safe_batch(&batch, named, false).is_some(),
                "{claimed}"
            );
            assert_eq!(retry_safe_batch(&batch, named, true), None, "{claimed}");
        }
    }

    #[test]
    fn only_reads_and_lone_transaction_starts_run_again_after_a_lost_server() {
        assert!(lost_retry_safe(&query("begin"), false).is_some());
        assert!(lost_retry_safe(&query(" BEGIN ; "), false).is_some());
        assert!(
            lost_retry_safe(
                &query("begin isolation level serializable, read only"),
                false
            )
            .is_some()
        );
        assert!(lost_retry_safe(&query("start transaction read write"), false).is_some());
        assert!(lost_retry_safe(&query("begin; delete from t"), false).is_none());
        assert!(lost_retry_safe(&query("begin /* x */"), false).is_none());
        assert!(lost_retry_safe(&query("start"), false).is_none());
        assert!(lost_retry_safe(&query("delete from t"), false).is_none());
        assert!(lost_retry_safe(&query("select 1"), false).is_none());
        assert!(lost_retry_safe(&query("BeGiN"), false).is_some());
        assert!(lost_retry_safe(&query("StArT TrAnSaCtIoN"), false).is_some());
        assert!(lost_retry_safe(&query("begi\u{6e}x"), false).is_none());
        assert!(lost_retry_safe(&query("BEGI\u{e}"), false).is_none());
        assert!(lost_retry_safe(&query("select 1"), true).is_some());
        // Hints and a database's own functions are not proof.
        assert!(lost_retry_safe(&query("/* sluice: replica */ delete from t"), true).is_none());
        assert!(lost_retry_safe(&query("select my_stable_fn()"), true).is_none());
        assert!(lost_retry_safe(&parse("", "begin"), false).is_none());
    }

    #[test]
    fn garbage_goes_to_the_primary() {
        assert_eq!(request_with(b"", none), Route::Primary);
        assert_eq!(request_with(&[b'Q', 0, 0, 0, 1], none), Route::Primary);
        assert_eq!(request_with(&msg(b'P', b"no-nul"), none), Route::Primary);
        assert_eq!(request_with(&msg(f::SYNC, b""), none), Route::Primary);
    }
}
