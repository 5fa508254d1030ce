//! The relay's two scans in transaction and statement mode, where client
//! messages are rewritten for statement tracking (see `prepared`) and the
//! server's replies are filtered against what is owed: the client side
//! copies into an output buffer instead of forwarding in place, the server
//! side forwards in place except where a reply is dropped or one of
//! sluice's own is due first.

use bytes::{Buf, BytesMut};
use sluice_wire::{TransactionStatus, WireError, split_frame, tags};

use super::relay::{
    Counted, Cycle, CycleView, SERVER_MESSAGE_LIMIT, ServerSeen, count_client_message, cycle_view,
    on_server_message, server_needs_body,
};
use crate::prepared::client_names::ClientNames;
use crate::prepared::expect::{Expect, Expected, Reply, Verdict};
use crate::prepared::registry::Registry;
use crate::prepared::rewrite::{QueryFate, Rewriter};
use crate::prepared::server_cache::ServerStatements;
use crate::prepared::sql::{self, Special};
use crate::scan::Visit;

/// Per-link state of a tracked relay.
#[derive(Default)]
pub(super) struct Tracking {
    pub(super) expected: Expected,
    /// Rewritten bytes due to the server.
    pub(super) out: BytesMut,
    /// sluice's own replies due to the client.
    pub(super) extra: BytesMut,
    /// A statement that may change session state went to the server.
    pub(super) session_touched: bool,
    /// A PREPARE went to the server inside a transaction: its statement
    /// must not outlive the link.
    pub(super) sql_prepared: bool,
    /// LISTEN / UNLISTEN statements sent, in order.
    pub(super) listens: Vec<Special>,
    /// A LISTEN went to the server: it must not keep listening.
    pub(super) listen_sent: bool,
    /// Custom settings the link may have set (read back by name).
    pub(super) custom_names: Vec<String>,
    /// A CREATE TEMP… went to the server.
    pub(super) temp_tables: bool,
    /// A session-level advisory lock may have been taken.
    pub(super) advisory_locks: bool,
}

thread_local! {
    /// Tracking state of finished links, kept for the next link on this
    /// worker: a transaction then allocates nothing for it. Boxed, because
    /// the relay holds a `Box<Tracking>` and hands it over as a pointer.
    #[allow(clippy::vec_box)]
    static SPARE: std::cell::RefCell<Vec<Box<Tracking>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Spare states kept per worker, and the largest buffer worth keeping.
const SPARES: usize = 256;
const SPARE_BUFFER_LIMIT: usize = 64 * 1024;

impl Tracking {
    /// A clean state, reused when the worker has one.
    pub(super) fn take() -> Box<Tracking> {
        SPARE.with(|s| s.borrow_mut().pop()).unwrap_or_default()
    }

    /// Hands the state back for reuse, emptied.
    pub(super) fn give_back(mut self: Box<Self>) {
        if self.out.capacity() > SPARE_BUFFER_LIMIT || self.extra.capacity() > SPARE_BUFFER_LIMIT {
            return;
        }
        self.expected.clear();
        self.out.clear();
        self.extra.clear();
        self.session_touched = false;
        self.sql_prepared = false;
        self.listens.clear();
        self.listen_sent = false;
        self.custom_names.clear();
        self.temp_tables = false;
        self.advisory_locks = false;
        SPARE.with(|s| {
            let mut spare = s.borrow_mut();
            if spare.len() < SPARES {
                spare.push(self);
            }
        });
    }

    /// Whether the link may have left something on the server to clean or
    /// read back (see `after_transaction`).
    pub(super) fn leaves_state(&self) -> bool {
        self.session_touched
            || self.sql_prepared
            || self.listen_sent
            || self.temp_tables
            || self.advisory_locks
    }

    /// Nothing owed either way.
    pub(super) fn settled(&self) -> bool {
        self.expected.is_empty() && self.out.is_empty() && self.extra.is_empty()
    }
}

/// Client messages the rewriter handles whole.
fn rewritten(tag: u8) -> bool {
    use tags::frontend as f;
    matches!(tag, f::PARSE | f::BIND | f::DESCRIBE | f::CLOSE | f::QUERY)
}

/// Where the rewriter's shared state lives.
pub(super) struct Statements<'a> {
    pub(super) names: &'a mut ClientNames,
    pub(super) server: &'a mut ServerStatements,
    pub(super) registry: &'a Registry,
    pub(super) capacity: usize,
}

/// Moves whole client messages from `cbuf` to `t.out`, rewriting those
/// that name statements, and accounts for what each owes.
pub(super) fn rewrite_client(
    cycle: &mut Cycle,
    cbuf: &mut BytesMut,
    t: &mut Tracking,
    st: &mut Statements<'_>,
    limit: usize,
) -> Result<(), WireError> {
    loop {
        let mut terminated = false;
        let expected = &mut t.expected;
        let end = cycle
            .client_scan
            .scan(cbuf, 0, limit, rewritten, |tag, _| {
                if rewritten(tag) {
                    return Visit::StopBefore;
                }
                let counted = count_client_message(
                    &mut cycle.outstanding,
                    &mut cycle.unsynced,
                    &mut cycle.syncs_since_start,
                    tag,
                );
                match counted {
                    Counted::Sync => expected.push(pass(Reply::Sync)),
                    // FunctionCall (Query is rewritten, so never here).
                    Counted::Request => expected.push(pass(Reply::Query)),
                    Counted::Execute => expected.push(pass(Reply::Execute)),
                    Counted::CopyEnded { ignored_syncs } => {
                        expected.forget_ignored_syncs(ignored_syncs)
                    }
                    Counted::Terminate => {
                        terminated = true;
                        return Visit::StopBefore;
                    }
                    // Flush, CopyData and the like: no reply of their own.
                    Counted::Other => {}
                }
                Visit::Forward
            })?;
        t.out.extend_from_slice(&cbuf[..end.forward_to]);
        cbuf.advance(end.forward_to);
        if terminated {
            cycle.client_terminated = true;
        }
        if !end.stopped || terminated {
            break;
        }
        let Some(header) = split_frame(cbuf, limit)? else {
            break;
        };
        let handled = handle_message(cycle, &cbuf[..header.total_len], header.tag, t, st);
        cbuf.advance(header.total_len);
        handled?;
    }
    cycle.to_server = t.out.len();
    Ok(())
}

/// Rewrites one whole P, B, D, C or Q message into `t.out`.
fn handle_message(
    cycle: &mut Cycle,
    message: &[u8],
    tag: u8,
    t: &mut Tracking,
    st: &mut Statements<'_>,
) -> Result<(), WireError> {
    use tags::frontend as f;
    let names = &mut *st.names;
    let mut rewriter = Rewriter {
        names,
        server: st.server,
        registry: st.registry,
        capacity: st.capacity,
        expected: &mut t.expected,
        out: &mut t.out,
    };
    match tag {
        f::PARSE => {
            rewriter.parse(message)?;
            cycle.unsynced = true;
            let text = parse_query(message);
            if let Some(text) = text.filter(|text| sql::may_matter(text)) {
                follow_listens(t, sql::specials(text));
                note_text(t, text);
            }
        }
        f::BIND => {
            rewriter.bind(message)?;
            cycle.unsynced = true;
        }
        f::DESCRIBE => {
            rewriter.describe(message)?;
            cycle.unsynced = true;
        }
        f::CLOSE => {
            rewriter.close(message)?;
            cycle.unsynced = true;
        }
        _ => {
            let idle = cycle.status == TransactionStatus::Idle && cycle.outstanding == 0;
            if let QueryFate::Sent { specials } = rewriter.query(message, idle, t.sql_prepared) {
                cycle.outstanding += 1;
                cycle.unsynced = false;
                cycle.syncs_since_start = 0;
                follow_listens(t, specials);
                let text = &message[sluice_wire::HEADER_LEN..];
                if sql::may_matter(text) {
                    note_text(t, text);
                }
            }
        }
    }
    Ok(())
}

/// Queues the LISTEN changes among `specials` (DISCARD ALL unlistens all).
fn follow_listens(t: &mut Tracking, specials: Vec<Special>) {
    for s in specials {
        match s {
            Special::Listen(_) | Special::Unlisten(_) => t.listens.push(s),
            Special::DiscardAll => t.listens.push(Special::Unlisten(None)),
            _ => {}
        }
    }
}

fn pass(reply: Reply) -> Expect {
    Expect::Pass {
        reply,
        statement: None,
    }
}

/// The query text of a Parse message.
fn parse_query(message: &[u8]) -> Option<&[u8]> {
    let mut r = sluice_wire::Reader::new(&message[sluice_wire::HEADER_LEN..]);
    r.cstr_bytes().ok()?;
    r.cstr_bytes().ok()
}

/// Notes what a statement sent to the server may leave behind.
fn note_text(t: &mut Tracking, text: &[u8]) {
    if sql::touches_session(text) {
        t.session_touched = true;
        for name in sql::custom_names(text) {
            if !t.custom_names.contains(&name) {
                t.custom_names.push(name);
            }
        }
    }
    if sql::starts_statement(text, b"prepare") {
        t.sql_prepared = true;
    }
    if sql::starts_statement(text, b"listen") {
        t.listen_sent = true;
    }
    if sql::starts_statement(text, b"create") && sql::mentions(text, b"temp") {
        t.temp_tables = true;
    }
    if sql::mentions(text, b"pg_advisory_lock") || sql::mentions(text, b"pg_try_advisory_lock") {
        t.advisory_locks = true;
    }
}

/// A server message that cannot be forwarded in place yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Held {
    /// Drop this message (`len` bytes) once everything before it is written.
    Drop { tag: u8, len: usize },
    /// Write sluice's own replies first.
    LocalFirst,
}

/// Scans server bytes after `cycle.to_client`, forwarding in place until a
/// message must be held.
pub(super) fn scan_server(
    cycle: &mut Cycle,
    sbuf: &BytesMut,
    t: &mut Tracking,
    server: &mut ServerStatements,
    client_params: &mut std::sync::Arc<crate::params::ParamSet>,
    refuse_transactions: bool,
) -> Result<(bool, Option<Held>), WireError> {
    use tags::backend as b;
    let mut seen = ServerSeen::default();
    let mut held = None;
    let expected = &mut t.expected;
    let end = cycle.server_scan.scan(
        sbuf,
        cycle.to_client,
        SERVER_MESSAGE_LIMIT,
        |tag| {
            server_needs_body(tag)
                || matches!(
                    tag,
                    b::PARSE_COMPLETE | b::CLOSE_COMPLETE | b::NOTIFICATION_RESPONSE
                )
        },
        |tag, body| {
            // Notifications reach transaction-mode clients through the
            // pool's LISTEN hub; a pooled server that briefly listened for
            // the client must not deliver them twice.
            let verdict = if tag == b::NOTIFICATION_RESPONSE {
                Verdict::Drop
            } else {
                expected.verdict(tag, server)
            };
            match verdict {
                Verdict::Forward => {}
                Verdict::Drop => {
                    held = Some(Held::Drop {
                        tag,
                        len: body.len() + sluice_wire::HEADER_LEN,
                    });
                    return Visit::StopBefore;
                }
                Verdict::LocalFirst => {
                    held = Some(Held::LocalFirst);
                    return Visit::StopBefore;
                }
            }
            on_server_message(
                &mut seen,
                cycle_view!(cycle),
                tag,
                body,
                client_params,
                refuse_transactions,
            );
            expected.consume(tag, body, server);
            Visit::Forward
        },
    )?;
    if let Some(e) = seen.bad {
        return Err(e);
    }
    cycle.to_client = end.forward_to;
    Ok((seen.params_changed, held))
}

/// Acts on a held message once the bytes before it are written; returns
/// whether anything changed (scan again).
pub(super) fn release_held(
    cycle: &Cycle,
    held: Held,
    sbuf: &mut BytesMut,
    t: &mut Tracking,
    server: &mut ServerStatements,
) -> bool {
    if cycle.to_client != 0 {
        return false;
    }
    match held {
        Held::Drop { tag, len } => {
            t.expected.consume(tag, &[], server);
            sbuf.advance(len);
        }
        Held::LocalFirst => t.expected.settle(&mut t.extra, cycle.status, server),
    }
    true
}

/// Forgets the client's names whose Parse failed or was skipped by the
/// server: on PostgreSQL those statements do not exist.
pub(super) fn forget_failed_parses(t: &mut Tracking, names: Option<&mut ClientNames>) {
    if !t.expected.has_failed_parses() {
        return;
    }
    let failed = t.expected.take_failed_parses();
    if let Some(names) = names {
        for (name, id) in failed {
            if names.get(&name).is_some_and(|s| s.id == id) {
                names.remove(&name);
            }
        }
    }
}

/// Writes sluice's own replies that are due now that the server's are out.
pub(super) fn settle(cycle: &Cycle, t: &mut Tracking, server: &mut ServerStatements) {
    if cycle.to_client == 0 && cycle.server_scan.at_boundary() {
        t.expected.settle(&mut t.extra, cycle.status, server);
    }
}

impl Tracking {
    /// SQL that removes what the link left on the server that must not
    /// reach another client: LISTENs, SQL-level prepared statements,
    /// temporary tables, session advisory locks.
    fn cleanup_sql(&self) -> String {
        let mut sql = String::new();
        if self.listen_sent {
            sql.push_str("UNLISTEN *;");
        }
        if self.sql_prepared {
            sql.push_str("DEALLOCATE ALL;");
        }
        if self.temp_tables {
            sql.push_str("DISCARD TEMP;");
        }
        if self.advisory_locks {
            sql.push_str("SELECT pg_catalog.pg_advisory_unlock_all();");
        }
        sql
    }

    /// Cleanup for a server whose client left or was thrown out: also
    /// RESET ALL when its settings may have changed (nobody to follow).
    pub(super) fn abandon_sql(&self) -> Option<String> {
        let mut sql = self.cleanup_sql();
        if self.session_touched {
            sql.push_str("RESET ALL;");
        }
        (!sql.is_empty()).then_some(sql)
    }
}

/// After a transaction, before the server goes back: clean what must not
/// reach another client, and read back the client's session settings if
/// it may have changed them. False: the server cannot be trusted (close it).
pub(super) async fn after_transaction(
    lease: &mut crate::backend::pool::Lease,
    client: &mut super::session::Client,
    t: &Tracking,
) -> bool {
    let cleanup = t.cleanup_sql();
    if !cleanup.is_empty() {
        if !super::relay::reset(lease, &cleanup).await {
            return false;
        }
        if t.sql_prepared {
            lease.server().statements.clear();
        }
    }
    if t.session_touched {
        let mut custom = t.custom_names.clone();
        if let Some(vars) = client.session() {
            for name in vars.custom_names() {
                if !custom.iter().any(|c| c.eq_ignore_ascii_case(name)) {
                    custom.push(name.to_owned());
                }
            }
        }
        let capture = crate::session_vars::capture_sql(&custom);
        let read = tokio::time::timeout(
            super::session::CLEANUP_TIMEOUT,
            crate::backend::login::run_query_rows(lease.server(), &capture),
        )
        .await;
        let Ok(Ok(rows)) = read else {
            return false;
        };
        let vars =
            crate::session_vars::SessionVars::from_pairs(rows.into_iter().filter_map(|row| {
                match row.as_slice() {
                    [Some(name), Some(value)] => Some((name.clone(), value.clone())),
                    _ => None,
                }
            }));
        let vars = (!vars.is_empty()).then(|| std::sync::Arc::new(vars));
        lease.server().session = vars.clone();
        client.set_session(vars);
    }
    true
}
