//! `read_your_writes = database` inside a block on a replica. Routing
//! checks the replica's replay when a period's first request goes there;
//! a READ COMMITTED block left open on it then takes a new snapshot at
//! each statement, and each must see every write that ended on the
//! primary before it was sent, as it would on the primary (review 46).
//! So a later request of the block, held before any of it is sent, waits
//! until the replica has replayed the database's newest write position,
//! for at most `replica_max_lag`: the lag past which the router stops
//! sending the replica reads at all. A replica slower than that serves
//! the request as it stands, and the log says so; the block cannot move
//! to another server.
//!
//! Nothing runs on the block's own server meanwhile: a query there would
//! drop the client's unnamed statement and portal, and take the block's
//! snapshot before its first query does (review 48). The replica's
//! position comes from its checks (`monitor.rs`), which run back to back
//! while a read waits (`Topology::replay_waiter`). A REPEATABLE READ
//! block waits as well: sluice does not know whether its snapshot was
//! taken (a SHOW takes none).

use std::time::Duration;

use bytes::BytesMut;
use sluice_wire::TransactionStatus;

use crate::frontend::client::{Client, ReplicaWatch};
use crate::frontend::cycle::Cycle;
use crate::frontend::tracked::Tracking;

/// How often a held request looks at the replica's checks again.
const POLL: Duration = Duration::from_millis(1);

/// A request of a block open on a replica has arrived and nothing of it
/// has been sent: the moment to wait (cheap; the caller first checks that
/// the client has a watch at all). The first request's position was
/// checked by routing. Whatever the server is doing (answering an earlier
/// request, or at a Flush: review 49 read stale after Parse/Bind/Execute/
/// Flush), nothing is sent to it meanwhile.
pub(super) fn request_waiting(cycle: &Cycle, cbuf: &BytesMut, tracking: Option<&Tracking>) -> bool {
    cycle.status == TransactionStatus::InTransaction
        && cycle.cycles_done >= 1
        && !cbuf.is_empty()
        && cycle.to_server == 0
        && cycle.client_scan.at_boundary()
        && !cycle.client_terminated
        && tracking.is_none_or(|t| t.out.is_empty())
        && !ends_the_block_alone(cbuf)
}

/// The request is a simple Query or a Parse of one statement that ends
/// the block (or rolls back to a savepoint) and reads nothing: it needs
/// no wait (review 51 found a COMMIT held for the whole wait). Anything
/// after it (`commit; select …`, another message in the buffer but the
/// Bind of that unnamed statement to the unnamed portal, Execute of that
/// portal, Describe, Flush, Sync or Close) may read, and waits.
fn ends_the_block_alone(cbuf: &[u8]) -> bool {
    use sluice_wire::tags::frontend as f;
    let mut messages = std::iter::from_fn({
        let mut rest = cbuf;
        move || {
            let (&tag, after) = rest.split_first()?;
            let len = after.get(..4)?;
            let len = i32::from_be_bytes([len[0], len[1], len[2], len[3]]);
            let len = usize::try_from(len).ok().filter(|l| *l >= 4)?;
            let body = after.get(4..len)?;
            rest = &after[len..];
            Some((tag, body, rest.is_empty()))
        }
    });
    let Some((tag, body, last)) = messages.next() else {
        return false;
    };
    let text = match tag {
        f::QUERY if last => body,
        // (the unnamed statement only: its Bind, and nothing else, may
        // follow)
        f::PARSE if body.first() == Some(&0) => &body[1..],
        _ => return false,
    };
    if !lone_end(text) {
        return false;
    }
    if tag == f::QUERY {
        return true;
    }
    let mut ended = false;
    for (tag, body, last) in messages {
        let fine = match tag {
            // (Bind of the unnamed statement to the unnamed portal, and
            // Execute of that portal only: review 53 ran a portal the
            // client had bound before, behind a ROLLBACK TO SAVEPOINT)
            f::BIND => body.starts_with(&[0, 0]),
            f::EXECUTE => body.first() == Some(&0),
            f::DESCRIBE | f::FLUSH | f::SYNC | f::CLOSE => true,
            _ => false,
        };
        if !fine {
            return false;
        }
        ended = last;
    }
    // (every byte was a whole message of the request)
    ended || cbuf.len() == 5 + body.len()
}

/// `text` (up to its NUL) is one COMMIT, END, ROLLBACK or ABORT, with
/// only words after it (`and chain`, `to savepoint a`).
fn lone_end(text: &[u8]) -> bool {
    let text = match text.iter().position(|&b| b == 0) {
        Some(end) => &text[..end],
        None => return false,
    };
    let text = text.trim_ascii();
    let text = text.strip_suffix(b";").unwrap_or(text).trim_ascii_end();
    let word_end = text
        .iter()
        .position(|b| !b.is_ascii_alphabetic())
        .unwrap_or(text.len());
    let (word, tail) = text.split_at(word_end);
    ["commit", "end", "rollback", "abort"]
        .iter()
        .any(|w| word.eq_ignore_ascii_case(w.as_bytes()))
        && tail
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || *b == b'_' || b.is_ascii_whitespace())
}

/// How a held request's wait ended.
pub(super) enum Held {
    /// Send it (the replica has replayed what it needs, or the wait is
    /// over anyway).
    Go,
    /// The client closed its end meanwhile: nothing of its request is
    /// sent (review 51: its server stayed idle in transaction for the
    /// whole wait, and the statement then ran for nobody).
    ClientLeft,
}

/// What ended one look at the wait.
enum Look {
    Replayed,
    Missed,
    Waiting,
    /// The watch cannot go on (a RELOAD took the replica out or turned
    /// routing off): said why, once.
    Over(&'static str),
}

/// Waits until the replica's checks show it has replayed every write
/// that ended before now, or `replica_max_lag` has passed. Each look
/// follows a RELOAD that replaced the database's topology (writes are
/// counted in the new one: review 49; review 51 waited out the whole
/// wait on a retired one after a second RELOAD), and ends the wait when
/// the client closes its end. A cancel does not end it: the statement,
/// sent once the replica has caught up (or the wait is over), would
/// otherwise read stale data with no error (review 52); the cancel reached
/// the idle server, which ignored it, as PostgreSQL ignores a cancel that
/// comes before a statement starts.
pub(super) async fn wait_in_block(client: &mut Client) -> Held {
    let Some(mut watch) = client.replica_watch.take() else {
        return Held::Go;
    };
    let deadline = tokio::time::Instant::now() + watch.wait;
    let mut waiter = None;
    let mut keep = true;
    let held = loop {
        let current = client.app.topology(&client.pool.database);
        let look = look(&mut watch, current, tokio::time::Instant::now() >= deadline);
        match look {
            Look::Replayed => break Held::Go,
            Look::Missed => {
                tracing::warn!(
                    db = %client.pool.database, user = %client.pool.user,
                    "read_your_writes: a replica did not replay within replica_max_lag a \
                     write that ended before a statement of a block open on it; the \
                     statement runs without it"
                );
                break Held::Go;
            }
            Look::Over(why) => {
                tracing::warn!(
                    db = %client.pool.database, user = %client.pool.user,
                    "read_your_writes: {why}; the statements of a block open on a replica \
                     no longer wait for writes"
                );
                keep = false;
                break Held::Go;
            }
            Look::Waiting => {}
        }
        if client.stream.peer_hung_up() {
            break Held::ClientLeft;
        }
        if waiter.is_none() {
            waiter = Some(watch.topology.replay_waiter());
        }
        tokio::time::sleep(POLL).await;
    };
    if keep {
        client.replica_watch = Some(watch);
    }
    held
}

/// One look: the watch moved to the database's current topology if a
/// RELOAD replaced it, then its replica's replay against the database's
/// newest write position.
fn look(
    watch: &mut ReplicaWatch,
    current: Option<std::sync::Arc<crate::backend::topology::Topology>>,
    late: bool,
) -> Look {
    let Some(current) = current else {
        return Look::Over("a RELOAD turned routing off");
    };
    if !std::sync::Arc::ptr_eq(&current, &watch.topology) {
        let place = (watch.topology.addr_of(watch.host)).and_then(|a| current.index_of(&a));
        let Some(i) = place else {
            return Look::Over("a RELOAD took out the replica");
        };
        watch.topology = current;
        watch.host = i;
    }
    let topology = &watch.topology;
    // (`None`: a write ended whose position is not known yet; the
    // writer's own read of it is a round trip away)
    let need = match topology.database_position() {
        Some(None) => return Look::Replayed,
        Some(Some(lsn)) if lsn <= watch.seen => return Look::Replayed,
        Some(Some(lsn)) if topology.replayed_past(watch.host, lsn) => {
            watch.seen = lsn;
            return Look::Replayed;
        }
        Some(Some(lsn)) => Some(lsn),
        None => None,
    };
    if !late {
        return Look::Waiting;
    }
    topology.note_replay_missed();
    if let Some(lsn) = need {
        // (the block's next request waits only for newer writes)
        watch.seen = lsn;
    }
    Look::Missed
}

#[cfg(test)]
mod tests {
    use super::ends_the_block_alone;

    fn query(sql: &str) -> Vec<u8> {
        let mut m = vec![b'Q'];
        m.extend_from_slice(&((sql.len() + 5) as i32).to_be_bytes());
        m.extend_from_slice(sql.as_bytes());
        m.push(0);
        m
    }

    fn message(tag: u8, body: &[u8]) -> Vec<u8> {
        let mut m = vec![tag];
        m.extend_from_slice(&((body.len() + 4) as i32).to_be_bytes());
        m.extend_from_slice(body);
        m
    }

    #[test]
    fn a_batch_goes_unheld_only_with_nothing_but_its_commit() {
        let parse = |name: &str, sql: &str| {
            message(
                b'P',
                &[name.as_bytes(), &[0], sql.as_bytes(), &[0, 0, 0]].concat(),
            )
        };
        let bind = |statement: &str| {
            message(
                b'B',
                &[&[0], statement.as_bytes(), &[0, 0, 0, 0, 0, 0, 0]].concat(),
            )
        };
        let execute = message(b'E', &[0, 0, 0, 0, 0]);
        let sync = message(b'S', &[]);
        let commit = [parse("", "commit"), bind(""), execute.clone(), sync.clone()].concat();
        assert!(ends_the_block_alone(&commit));
        let then_read = [
            parse("", "commit"),
            bind(""),
            execute.clone(),
            parse("", "select 1"),
            bind(""),
            execute.clone(),
            sync.clone(),
        ]
        .concat();
        assert!(!ends_the_block_alone(&then_read), "a second Parse");
        let named = [
            parse("", "commit"),
            bind(""),
            execute.clone(),
            bind("s1"),
            execute.clone(),
            sync.clone(),
        ]
        .concat();
        assert!(!ends_the_block_alone(&named), "a named statement's Bind");
        let portal = {
            let mut e = vec![b'q', 0];
            e.extend_from_slice(&0i32.to_be_bytes());
            message(b'E', &e)
        };
        let old_portal = [
            parse("", "rollback to savepoint a"),
            bind(""),
            execute.clone(),
            portal,
            sync.clone(),
        ]
        .concat();
        assert!(
            !ends_the_block_alone(&old_portal),
            "another portal's Execute"
        );
        let named_commit = [parse("s2", "commit"), bind("s2"), execute, sync].concat();
        assert!(!ends_the_block_alone(&named_commit), "a named Parse");
        let mut two = query("commit");
        two.extend(query("select 1"));
        assert!(!ends_the_block_alone(&two), "a second Query");
    }

    #[test]
    fn only_a_lone_end_of_the_block_goes_unheld() {
        for sql in [
            "commit",
            " COMMIT; ",
            "rollback to savepoint a",
            "end",
            "abort",
        ] {
            assert!(ends_the_block_alone(&query(sql)), "{sql}");
        }
        for sql in [
            "commit; select 1",
            "select 1",
            "commit -- then\nselect 1",
            "rollback; select * from t",
            "committed",
            "",
        ] {
            assert!(!ends_the_block_alone(&query(sql)), "{sql}");
        }
    }
}
