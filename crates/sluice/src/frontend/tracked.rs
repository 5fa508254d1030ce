//! The relay's two scans in transaction and statement mode, where client
//! messages are rewritten for statement tracking (see `prepared`) and the
//! server's replies are filtered against what is owed: the client side
//! copies into an output buffer instead of forwarding in place, the server
//! side forwards in place except where a reply is dropped or one of
//! sluice's own is due first.

use bytes::{Buf, BytesMut};
use sluice_wire::{TransactionStatus, WireError, split_frame, tags};

use super::client::CLEANUP_TIMEOUT;
use super::cycle::{
    Cycle, CycleView, Retry, SERVER_MESSAGE_LIMIT, ServerSeen, cycle_view, on_server_message,
    server_needs_body,
};
use super::listens::ListenLedger;
use super::relay_io::BUFFER_LIMIT;
use super::requests::{Counted, Requests};
use crate::prepared::client_names::ClientNames;
use crate::prepared::expect::{Expect, Expected, NameUndo, Reply, Verdict};
use crate::prepared::registry::Registry;
use crate::prepared::rewrite::{QueryFate, Rewriter};
use crate::prepared::server_cache::ServerStatements;
use crate::prepared::sql::{self, Effects, Special};
use crate::scan::Visit;

/// Per-link state of a tracked relay.
pub(super) struct Tracking {
    pub(super) expected: Expected,
    /// Rewritten bytes due to the server.
    pub(super) out: BytesMut,
    /// sluice's own replies due to the client.
    pub(super) extra: BytesMut,
    /// What the statements sent since the last transaction end may have
    /// left on the server.
    pub(super) effects: Effects,
    /// LISTEN statements sent this turn: the pool's hub listens before
    /// their replies reach the client.
    pub(super) listens: Vec<Special>,
    /// LISTEN and UNLISTEN statements sent, until their transaction ends.
    pub(super) listen_txn: ListenLedger,
    /// Custom settings the link may have set (read back by name).
    pub(super) custom_names: Vec<String>,
    /// More than `MAX_CUSTOM_NAMES` were named: the others cannot be read
    /// back, so the client cannot have them on its next server.
    pub(super) custom_overflow: bool,
    /// Why the client keeps this server past its transaction, if it does.
    pub(super) pinned: Option<PinReason>,
    /// How many bytes had been queued for the server (written and in
    /// `out`) after sluice's last Flush (see `rewrite_client`); none: MAX.
    pub(super) flush_mark: u64,
    /// The server's sequence state (currval, lastval) may hold the
    /// client's own draws: the link has sent a request that may draw (see
    /// `discard_sequences`).
    pub(super) sequences_mine: bool,
    /// An extended-protocol batch is open on the server (a message sent
    /// since the last Sync): no simple query of sluice's may go in.
    pub(super) in_batch: bool,
    /// The server's unnamed statement was made safe for this link
    /// (`settle_unnamed`), at its first message.
    pub(super) unnamed_settled: bool,
    /// sluice's DISCARD SEQUENCES went to the server in this link (its
    /// replies may be owed: `Expected::discarding` is looked at only then).
    pub(super) discard_sent: bool,
    /// Where in the stream to the server (bytes queued before it) a simple
    /// query of sluice's may go, ahead of everything of the client's that
    /// may draw: the start of the link's first request, with nothing owed
    /// and no batch open. Good while nothing from there has been written
    /// (see `discard_sequences`).
    pub(super) discard_at: Option<u64>,
    /// Private copies made for Binds in this transaction, by the shared
    /// statement they stand in for (see `Rewriter::lookup`), until the
    /// settings may change again (`retire_one_offs`).
    pub(super) one_off:
        std::collections::HashMap<u64, std::sync::Arc<crate::prepared::registry::Statement>>,
}

impl Default for Tracking {
    fn default() -> Self {
        Self {
            expected: Expected::default(),
            out: BytesMut::new(),
            extra: BytesMut::new(),
            effects: Effects::default(),
            listens: Vec::new(),
            listen_txn: ListenLedger::default(),
            custom_names: Vec::new(),
            custom_overflow: false,
            pinned: None,
            flush_mark: u64::MAX,
            sequences_mine: false,
            in_batch: false,
            unnamed_settled: false,
            discard_sent: false,
            discard_at: None,
            one_off: Default::default(),
        }
    }
}

impl Tracking {
    /// A private copy is parsed under the settings of its place in the
    /// stream and serves the client's Binds only while they hold: up to
    /// the next message that may change them (any Execute: of a portal or
    /// an unnamed statement sluice does not follow, too; a simple query; a
    /// FunctionCall) or end the transaction (a Sync: a `SET LOCAL` or
    /// `set_config(…, true)` ends with it). Retired there (closed before
    /// the server's next Parse), so that a later Bind gets a copy of its
    /// own (reviews: Binds pipelined after the COMMIT of a `SET LOCAL` used
    /// the copy made under it; so did Binds after the Execute of a `SET`
    /// bound in an earlier batch).
    pub(super) fn retire_one_offs(&mut self, server: &mut ServerStatements) {
        for (_, copy) in self.one_off.drain() {
            server.retire(copy.id);
        }
    }
}

/// A Flush message: the server sends what it holds back, and nothing else.
const FLUSH: [u8; 5] = [tags::frontend::FLUSH, 0, 0, 0, 4];

/// Session objects that keep a client on its server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PinReason {
    pub temp_tables: bool,
    pub cursors: bool,
    pub advisory_locks: bool,
}

impl PinReason {
    /// For SHOW CLIENTS and the log: "temp_tables,cursors".
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if self.temp_tables {
            parts.push("temp_tables");
        }
        if self.cursors {
            parts.push("cursors");
        }
        if self.advisory_locks {
            parts.push("advisory_locks");
        }
        parts.join(",")
    }

    fn any(&self) -> bool {
        self.temp_tables || self.cursors || self.advisory_locks
    }
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
        self.out.clear();
        self.extra.clear();
        // (`capacity()` counts only the room after what was written out:
        // reclaiming judges the whole allocation)
        if self.out.try_reclaim(SPARE_BUFFER_LIMIT + 1)
            || self.extra.try_reclaim(SPARE_BUFFER_LIMIT + 1)
        {
            return;
        }
        self.expected.clear();
        self.effects = Effects::default();
        self.listens.clear();
        self.listen_txn.clear();
        self.custom_names.clear();
        self.custom_overflow = false;
        self.pinned = None;
        self.flush_mark = u64::MAX;
        self.sequences_mine = false;
        self.in_batch = false;
        self.unnamed_settled = false;
        self.discard_sent = false;
        self.discard_at = None;
        SPARE.with(|s| {
            let mut spare = s.borrow_mut();
            if spare.len() < SPARES {
                spare.push(self);
            }
        });
    }

    /// At a transaction end: whether `after_transaction` has work to do
    /// (something may have been left, or a pinned client may have removed
    /// what pinned it).
    pub(super) fn needs_after(&self) -> bool {
        self.effects.any() || (self.pinned.is_some() && self.effects.removes)
    }

    /// Nothing owed either way.
    pub(super) fn settled(&self) -> bool {
        self.expected.is_empty() && self.out.is_empty() && self.extra.is_empty()
    }
}

/// Most replies owed at once per link (about 40 bytes each).
const EXPECTED_LIMIT: usize = 100_000;

/// Client messages the rewriter handles whole.
fn rewritten(tag: u8) -> bool {
    use tags::frontend as f;
    matches!(tag, f::PARSE | f::BIND | f::DESCRIBE | f::CLOSE | f::QUERY)
}

/// Messages the client scan needs whole: those it rewrites, those whose
/// body must be empty (five bytes, so at once), and FunctionCall, so that
/// one trickled behind a Flush or Sync waits in sluice, not on a server
/// (a review held the only server so), and Execute (a few bytes), so
/// that a request held for a replica's replay is held whole (review 53:
/// an Execute split around another client's commit ran unheld).
fn needs_body(tag: u8) -> bool {
    rewritten(tag)
        || tag == tags::frontend::FUNCTION_CALL
        || tag == tags::frontend::EXECUTE
        || tags::frontend::after_login(tag) == Some(true)
}

/// Why PostgreSQL would refuse this client message in a way that leaves
/// its server out of step with the pool (its error, unasked, would reach
/// the next client, or it ends the server): an unknown type, or a Sync,
/// Flush or CopyDone with a body (`body` is whole for those).
fn bad_message(tag: u8, body: &[u8]) -> Option<String> {
    match tags::frontend::after_login(tag) {
        None => Some(format!("invalid frontend message type {tag}")),
        Some(true) if !body.is_empty() => Some("invalid message format".to_owned()),
        Some(_) => None,
    }
}

/// Where the rewriter's shared state lives.
pub(super) struct Statements<'a> {
    pub(super) names: &'a mut ClientNames,
    /// The client's session settings and tracked parameters: what its
    /// Parse texts mean depends on some (`ParseContext`), which keep its
    /// statements apart from those of clients with others.
    pub(super) session: Option<&'a crate::session_vars::SessionVars>,
    pub(super) params: &'a crate::params::ParamSet,
    pub(super) server: &'a mut ServerStatements,
    pub(super) registry: &'a Registry,
    pub(super) capacity: usize,
}

/// At a link's first message: a server whose unnamed statement may be
/// another client's (PostgreSQL keeps one past its transaction) has it
/// closed first, unless that message replaces it and cannot be skipped:
/// the client's own Parse of it, first of its batch, and sent as it is
/// (not refused by sluice), or a simple query that goes to the server. After that, nothing the client sends on this
/// link can reach another client's unnamed statement: review 26 ran
/// another client's DELETE with a Bind of `""`; reviews 28 to 30 found
/// Parses and queries the server skips, or sluice answers itself, that
/// earlier versions took for a change of owner. The record
/// (`ServerStatements::unnamed`) is set by every Parse of `""` sluice
/// sends and cleared only here: a Close first of the link runs. Links
/// of clients that use no unnamed statement, on servers where none was
/// parsed, never pay the Close; in a pool mixing both, a link that does
/// not start with its own Parse pays one message (no round trip).
fn settle_unnamed(cycle: &Cycle, cbuf: &[u8], t: &mut Tracking, st: &mut Statements<'_>) {
    use tags::frontend as f;
    if cbuf.is_empty() {
        return;
    }
    t.unnamed_settled = true;
    let me = st.names.owner;
    if !st.server.unnamed.is_some_and(|o| o != me)
        || own_unnamed_parse(cbuf, st.params)
        || sent_query(cbuf, st.params)
    {
        return;
    }
    // DISCARD SEQUENCES, if a text reads currval later, may still go
    // first of the link: ahead of this Close (see `handle_message`).
    if t.discard_at.is_none()
        && cycle.req.outstanding == 0
        && cycle.status != TransactionStatus::Failed
        && !t.sequences_mine
        && !t.discard_sent
        && t.out.is_empty()
        && t.expected.is_empty()
    {
        t.discard_at = Some(cycle.written.0);
    }
    // (a Flush after it: its reply must come even when nothing the client
    // sends makes the server flush, a request answered by sluice itself)
    sluice_wire::MessageBuilder::new(&mut t.out, f::CLOSE)
        .u8(b'S')
        .u8(0)
        .finish();
    sluice_wire::MessageBuilder::new(&mut t.out, f::FLUSH).finish();
    t.expected
        .push(crate::prepared::expect::Expect::CloseUnnamed);
    st.server.unnamed = None;
}

/// The message at the start of `buf` is a whole simple query that goes to
/// the server (which drops its unnamed statement before it runs it): not
/// one `Rewriter::query` may answer itself (DEALLOCATE, PREPARE, a LISTEN
/// it refuses; review 30 bound another client's statement after a
/// DEALLOCATE ALL sluice answered).
fn sent_query(buf: &[u8], params: &crate::params::ParamSet) -> bool {
    let Some((tag, body)) = sluice_wire::whole_message(buf) else {
        return false;
    };
    if tag != tags::frontend::QUERY {
        return false;
    }
    let text = body.strip_suffix(b"\0").unwrap_or(body);
    if !sql::may_matter(text) {
        return true;
    }
    !matches!(
        sql::special(text),
        Some(Special::Deallocate(_) | Special::DeallocateAll | Special::Prepare)
    ) && !sql::unfollowable_listen(text, crate::params::client_utf8(params))
}

/// The message at the start of `buf` is a whole Parse of the unnamed
/// statement that sluice will send as it is (`Rewriter::parse` refuses
/// some LISTENs with a Parse of its own).
fn own_unnamed_parse(buf: &[u8], params: &crate::params::ParamSet) -> bool {
    let Some((tag, body)) = sluice_wire::whole_message(buf) else {
        return false;
    };
    if tag != tags::frontend::PARSE || body.first() != Some(&0) {
        return false;
    }
    let query = body[1..].split(|&b| b == 0).next().unwrap_or_default();
    !(sql::starts_special(query)
        && sql::unfollowable_listen(query, crate::params::client_utf8(params)))
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
        if !t.unnamed_settled {
            settle_unnamed(cycle, cbuf, t, st);
        }
        let mut terminated = false;
        let mut function_called = false;
        let in_batch = &mut t.in_batch;
        let mut executed = false;
        // (a place past which a private copy no longer serves)
        let mut copies_end = false;
        // (where the period may end at rest: not for a pinned client)
        let may_end = cycle.status == TransactionStatus::Idle && t.pinned.is_none();
        let cap = cycle.cap;
        let expected = &mut t.expected;
        let end = cycle
            .client_scan
            .scan(cbuf, 0, limit, needs_body, |tag, body| {
                if cap.is_some_and(|c| cycle.req.sent() >= c) || cycle.req.holding_client(may_end) {
                    return Visit::StopBefore;
                }
                if let Some(why) = bad_message(tag, body) {
                    cycle.bad_message = Some(why);
                    return Visit::StopBefore;
                }
                if tag == tags::frontend::QUERY && cycle.no_pqexec {
                    cycle.pqexec_seen = true;
                    return Visit::StopBefore;
                }
                // Replies owed are bounded too (Syncs during a COPY get
                // none until it ends): past this, the client waits.
                if rewritten(tag) || expected.len() >= EXPECTED_LIMIT {
                    return Visit::StopBefore;
                }
                match cycle.req.client(tag) {
                    Counted::Sync => {
                        *in_batch = false;
                        copies_end = true;
                        expected.push(pass(Reply::Sync))
                    }
                    // FunctionCall (Query is rewritten, so never here):
                    // code sluice cannot read, as a call in a query.
                    Counted::Request => {
                        function_called = true;
                        copies_end = true;
                        expected.push(pass(Reply::Query))
                    }
                    Counted::Execute => {
                        (*in_batch, executed) = (true, true);
                        copies_end = true;
                        expected.push(pass(Reply::Execute))
                    }
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
        if executed || function_called {
            t.sequences_mine = true;
        }
        if function_called {
            t.effects.merge(Effects::unreadable());
        }
        if copies_end && !t.one_off.is_empty() {
            t.retire_one_offs(st.server);
        }
        t.out.extend_from_slice(&cbuf[..end.forward_to]);
        cbuf.advance(end.forward_to);
        cycle.client_taken += end.forward_to as u64;
        // (a message the scan waits for is measured from the new start:
        // else one near the size limit behind forwarded bytes is refused)
        cycle.client_scan.consumed(end.forward_to);
        if terminated {
            cycle.client_terminated = true;
        }
        if !end.stopped
            || terminated
            || cycle.pqexec_seen
            || cycle.bad_message.is_some()
            || cycle.req.holding_client(may_end)
        {
            break;
        }
        // What the server or the client has not taken yet bounds what is
        // rewritten now; the rest stays in `cbuf` (not read further).
        if t.out.len() >= BUFFER_LIMIT
            || t.extra.len() >= BUFFER_LIMIT
            || t.expected.len() >= EXPECTED_LIMIT
            || cycle.capped()
        {
            // sluice's own replies (a Parse or Close it answers) may wait
            // behind the server's, which PostgreSQL keeps until a Sync or
            // Flush the client has not sent yet: a client that writes its
            // whole batch before it reads would wait on sluice, and sluice
            // on the server. A Flush makes the server send them, and the
            // queue drains (once per stop, unless more went to the server
            // since: its reply is nothing). Not when only the request cap
            // stopped it: what a capped request sent decides whether it
            // may run again elsewhere.
            let replies_stuck = t.extra.len() >= BUFFER_LIMIT || t.expected.len() >= EXPECTED_LIMIT;
            let queued = cycle.written.0 + t.out.len() as u64;
            if replies_stuck
                && !cycle.capped()
                && t.flush_mark != queued
                && cycle.client_scan.at_boundary()
            {
                t.out.extend_from_slice(&FLUSH);
                t.flush_mark = queued + FLUSH.len() as u64;
            }
            break;
        }
        let Some(header) = split_frame(cbuf, limit)? else {
            break;
        };
        let handled = handle_message(cycle, &cbuf[..header.total_len], header.tag, t, st);
        cbuf.advance(header.total_len);
        cycle.client_taken += header.total_len as u64;
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
    // (as before this message: see `discard_sequences`)
    let (out_at, expected_at) = (t.out.len(), t.expected.len());
    let (batch_open, outstanding) = (t.in_batch, cycle.req.outstanding);
    t.in_batch |= tag != f::QUERY;
    let capacity = st.capacity;
    let params = st.params;
    let names = &mut *st.names;
    // (SET, set_config or opaque code earlier in the transaction: the
    // settings the server parses under are not known until it ends)
    let unsure = t.effects.parsing;
    let mut rewriter = Rewriter {
        names,
        context: crate::prepared::registry::ParseContext {
            session: st.session,
            params: st.params,
        },
        unsure,
        one_off: &mut t.one_off,
        server: st.server,
        registry: st.registry,
        capacity: st.capacity,
        expected: &mut t.expected,
        out: &mut t.out,
    };
    let mut reads_sequences = false;
    match tag {
        f::PARSE => {
            // PostgreSQL refuses a Parse in a failed transaction block,
            // except of the statements that end one (ROLLBACK, COMMIT…).
            let aborted = cycle.status == TransactionStatus::Failed
                && cycle.req.status_current()
                && !parse_query(message).is_some_and(sql::ends_transaction);
            rewriter.parse(message, aborted)?;
            cycle.req.other_sent();
            let text = parse_query(message);
            if let Some(text) = text.filter(|text| sql::may_matter(text)) {
                // A LISTEN takes effect when it runs: an unnamed statement
                // (or one sluice does not track) at the Bind to come, in
                // the transaction of the Sync to come; a named one at each
                // Bind (below).
                let tracked_name =
                    capacity != 0 && parse_name(message).is_some_and(|n| !n.is_empty());
                if !tracked_name {
                    follow_listens(t, sql::specials(text), cycle.req.sent() + 1);
                }
                let effects = sql::effects(text);
                reads_sequences = effects.sequences;
                note_effects(t, effects, text);
            }
            if let Some(text) = text
                && !text.is_ascii()
                && crate::params::ascii_in_multibyte(params)
            {
                note_effects(t, Effects::unreadable(), text);
            }
        }
        f::BIND => {
            let bound = rewriter.bind(message)?;
            cycle.req.other_sent();
            // Running a statement whose text may leave something counts
            // like sending that text again.
            if let Some(statement) = &bound
                && statement.effects != Effects::default()
            {
                if statement.effects.listen || statement.effects.settings {
                    let specials = sql::specials(statement.query());
                    follow_listens(t, specials, cycle.req.sent() + 1);
                }
                reads_sequences = statement.effects.sequences;
                note_effects(t, statement.effects, statement.query());
            }
            if let Some(statement) = &bound
                && !statement.ascii
                && crate::params::ascii_in_multibyte(params)
            {
                note_effects(t, Effects::unreadable(), statement.query());
            }
        }
        f::DESCRIBE => {
            rewriter.describe(message)?;
            cycle.req.other_sent();
        }
        f::CLOSE => {
            rewriter.close(message)?;
            cycle.req.other_sent();
        }
        _ => {
            let idle = cycle.status == TransactionStatus::Idle && cycle.req.outstanding == 0;
            if let QueryFate::Sent { specials, matters } =
                rewriter.query(message, idle, t.effects.statements)
            {
                cycle.req.request_sent();
                follow_listens(t, specials, cycle.req.sent());
                let text = &message[sluice_wire::HEADER_LEN..];
                if matters {
                    let effects = sql::effects(text);
                    reads_sequences = effects.sequences;
                    note_effects(t, effects, text);
                }
                if !text.is_ascii() && crate::params::ascii_in_multibyte(params) {
                    note_effects(t, Effects::unreadable(), text);
                }
            }
            // (it may set, or end the transaction: see `retire_one_offs`)
            if !t.one_off.is_empty() {
                t.retire_one_offs(st.server);
            }
        }
    }
    // Where a simple query of sluice's may go first: before this message
    // if nothing of the client's that may draw was sent in the link,
    // nothing is owed, no batch is open and no block failed. The first
    // such place is kept (once a link, usually at its first request).
    let status = cycle.status;
    let may_go_here = |t: &Tracking| {
        !batch_open
            && expected_at == 0
            && outstanding == 0
            && !t.sequences_mine
            && !t.discard_sent
            && !t.expected.skipping()
            && status != TransactionStatus::Failed
    };
    if t.discard_at.is_none() && may_go_here(t) {
        t.discard_at = Some(cycle.written.0 + out_at as u64);
    }
    // A text that calls currval or lastval (rare): the state is cleared
    // at that place if nothing from there has gone to the server yet (a
    // batch that opened a transaction first, JDBC's BEGIN, or requests
    // pipelined behind the first, all written at once), else before this
    // message if it may go here (after a lone BEGIN that was answered).
    if reads_sequences
        && let Some(from) = t
            .discard_at
            .and_then(|at| at.checked_sub(cycle.written.0))
            .map(|from| from as usize)
            .or_else(|| may_go_here(t).then_some(out_at))
    {
        discard_sequences(t, from);
    }
    // (what the client runs from now on may draw: its own values; a lone
    // BEGIN draws nothing)
    if tag == f::QUERY && !t.sequences_mine {
        t.sequences_mine = !sql::starts_transaction(&message[sluice_wire::HEADER_LEN..]);
    }
    Ok(())
}

/// The sequence state a server's previous client left (`currval`,
/// `lastval` answer from it: another client's order number, or, where an
/// application inserts and then asks `currval` in two transactions, a
/// wrong key) is cleared with `DISCARD SEQUENCES` before a request that
/// reads it, answered to nobody. The client then gets PostgreSQL's "not
/// yet defined in this session", as it does from a fresh server, whoever
/// had the server before: a draw in an earlier transaction may have been
/// on another server, and its value here would be stale. The query goes
/// in at `out_at` in `t.out`, where it runs alone, before anything of the
/// client's in the link that may draw (a lone BEGIN draws nothing), with
/// nothing owed and no batch open: everything after it is still in
/// `t.out` (no reply to it can have come; sluice's own replies answered
/// since are the client's already), so its replies are owed first. A
/// request sent after others of the link reached the server keeps what
/// the server has (see docs/architecture.md).
fn discard_sequences(t: &mut Tracking, out_at: usize) {
    let request = t.out.split_off(out_at);
    t.out.extend_from_slice(&DISCARD_SEQUENCES);
    t.out.unsplit(request);
    t.expected.insert(0, Expect::Discard);
    t.discard_sent = true;
    // (once a link: what reads the state later reads the client's own)
    t.discard_at = None;
}

/// Query "DISCARD SEQUENCES".
const DISCARD_SEQUENCES: [u8; 23] = *b"Q\0\0\0\x16DISCARD SEQUENCES\0";

/// Queues the LISTEN changes among `specials`, sent in the request at
/// `position` (DISCARD ALL unlistens all): each takes effect if its
/// transaction commits (see `listens`); a LISTEN is also listened to by
/// the hub at once.
fn follow_listens(t: &mut Tracking, specials: Vec<Special>, position: u64) {
    for s in specials {
        match s {
            Special::Listen(_) => {
                t.listens.push(s.clone());
                t.listen_txn.sent(position, s);
            }
            Special::Unlisten(_) => t.listen_txn.sent(position, s),
            Special::DiscardAll => t.listen_txn.sent(position, Special::Unlisten(None)),
            _ => {}
        }
    }
}

/// What a server message passed to the client means for its LISTENs and
/// UNLISTENs still waiting for their transaction's end (after
/// `on_server_message`).
fn follow_outcome(
    ledger: &mut ListenLedger,
    req: &Requests,
    status: TransactionStatus,
    tag: u8,
    body: &[u8],
) {
    use tags::backend as b;
    match tag {
        b::ERROR_RESPONSE => ledger.on_error(),
        b::COMMAND_COMPLETE => {
            let command = body.strip_suffix(b"\0").unwrap_or(body);
            ledger.on_command_complete(command, req.seen() + 1);
        }
        b::READY_FOR_QUERY => ledger.on_ready(status, req.seen()),
        _ => {}
    }
}

fn pass(reply: Reply) -> Expect {
    Expect::pass(reply)
}

/// The statement name of a Parse message.
fn parse_name(message: &[u8]) -> Option<&[u8]> {
    sluice_wire::Reader::new(&message[sluice_wire::HEADER_LEN..])
        .cstr_bytes()
        .ok()
}

/// The query text of a Parse message.
fn parse_query(message: &[u8]) -> Option<&[u8]> {
    let mut r = sluice_wire::Reader::new(&message[sluice_wire::HEADER_LEN..]);
    r.cstr_bytes().ok()?;
    r.cstr_bytes().ok()
}

/// Notes `effects`, already known, of `text`.
fn note_effects(t: &mut Tracking, effects: Effects, text: &[u8]) {
    if effects.settings {
        for name in sql::custom_names(text) {
            if t.custom_names.contains(&name) {
                continue;
            }
            if t.custom_names.len() >= MAX_CUSTOM_NAMES {
                t.custom_overflow = true;
                break;
            }
            t.custom_names.push(name);
        }
    }
    t.effects.merge(effects);
}

/// Custom setting names read back by name after one transaction.
const MAX_CUSTOM_NAMES: usize = 1000;

/// A server message that cannot be forwarded in place yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Held {
    /// Drop this message (`len` bytes) once everything before it is written.
    Drop { tag: u8, len: usize },
    /// Write sluice's own replies first.
    LocalFirst,
    /// A step of the read-on-a-replica safety net (`cycle::Retry`) for this
    /// message (type, body), taken once everything before it is written.
    Retry(RetryStep, u8, Vec<u8>),
    /// An ErrorResponse that names a shared statement: written to the
    /// client as this message (`Expected::renamed_error`) in its place.
    Renamed(BytesMut),
}

/// An ErrorResponse body of a standby's refusal of a serializable
/// transaction (a role or database whose default isolation is
/// serializable): SQLSTATE 0A000 from PostgreSQL's
/// `GetSerializableTransactionSnapshot` (the routine field, which no
/// lc_messages translates; other 0A000 errors the primary would give too).
fn is_isolation_refusal(body: &[u8]) -> bool {
    const ROUTINE: &[u8] = b"RGetSerializableTransactionSnapshot\0";
    sluice_wire::ErrorFields::decode(body).is_ok_and(|f| f.code == "0A000")
        && body.windows(ROUTINE.len()).any(|w| w == ROUTINE)
}

/// An ErrorResponse body with SQLSTATE 25006 (read_only_sql_transaction),
/// or a standby's isolation refusal (`is_isolation_refusal`).
fn is_read_only_refusal(body: &[u8]) -> bool {
    sluice_wire::ErrorFields::decode(body).is_ok_and(|f| f.code == "25006")
        || is_isolation_refusal(body)
}

/// Nothing owed, no transaction open, no safety net on, and nothing the
/// client keeps on its server (`plain`: not pinned, no after-transaction
/// check due): a FATAL error the server sends now answers nothing the
/// client asked, and the client loses nothing if the server closes and it
/// goes on with another. (A pinned client, or one whose settings are still
/// to be captured, gets the error as before; so does a routed read whose
/// retry is decided.)
fn between_transactions(
    req: &Requests,
    status: TransactionStatus,
    retry: Retry,
    plain: bool,
) -> bool {
    plain
        && retry == Retry::Off
        && req.at_rest()
        && !req.unsure()
        && status == TransactionStatus::Idle
}

impl Tracking {
    /// Nothing of the client's stays on its server or is due after its
    /// transaction (see `between_transactions`).
    pub(super) fn plain(&self) -> bool {
        self.pinned.is_none() && !self.needs_after()
    }
}

/// Tells the request count of the Queries the expected replies skipped
/// with a failed extended batch (see `Expected::take_ignored_requests`).
fn forget_ignored_requests(expected: &mut Expected, req: &mut Requests) {
    if let Some((n, open)) = expected.take_ignored_requests() {
        req.requests_ignored(n, open);
    }
}

/// `buf` holds one whole ErrorResponse of severity FATAL (or PANIC) and
/// nothing else.
pub(super) fn is_lone_fatal(buf: &[u8]) -> bool {
    matches!(split_frame(buf, SERVER_MESSAGE_LIMIT), Ok(Some(h))
        if h.tag == tags::backend::ERROR_RESPONSE
            && h.total_len == buf.len()
            && is_fatal(&buf[sluice_wire::HEADER_LEN..]))
}

/// An ErrorResponse body of severity FATAL or PANIC: the server closes
/// the connection after it.
fn is_fatal(body: &[u8]) -> bool {
    sluice_wire::ErrorFields::decode(body).is_ok_and(|f| matches!(f.severity, "FATAL" | "PANIC"))
}

/// What a server sends when it goes away on its own, before it closes the
/// connection: a FATAL error (shutdown, crash recovery, still starting,
/// idle session timeout), or the WARNING notice of an immediate shutdown or
/// of another backend's crash (PostgreSQL's `quickdie`). Whatever the
/// client's request was doing did not complete.
fn is_farewell(tag: u8, body: &[u8]) -> bool {
    let fields = || sluice_wire::ErrorFields::decode(body);
    match tag {
        tags::backend::ERROR_RESPONSE => fields().is_ok_and(|f| {
            f.severity == "FATAL" && matches!(f.code, "57P01" | "57P02" | "57P03" | "57P05")
        }),
        tags::backend::NOTICE_RESPONSE => {
            fields().is_ok_and(|f| f.severity == "WARNING" && matches!(f.code, "57P01" | "57P02"))
        }
        _ => false,
    }
}

/// Notices kept from the client while a read may still run elsewhere.
const RETRY_KEPT_NOTICES: usize = 64 * 1024;

/// What a server sends for a batch before the first answer that tells
/// whether the statement ran: ParseComplete (of the unnamed statement, in
/// a one-off query), BindComplete, and the descriptions of the statement
/// and of its result (ParameterDescription, RowDescription, NoData).
fn preamble(tag: u8) -> bool {
    use tags::backend as b;
    matches!(
        tag,
        b::PARSE_COMPLETE
            | b::BIND_COMPLETE
            | b::PARAMETER_DESCRIPTION
            | b::ROW_DESCRIPTION
            | b::NO_DATA
    )
}

/// The first message after the one whose body is `body` (a slice of
/// `buf`) that is neither a notice nor part of the preamble nor a
/// CloseComplete (sluice's own, for a statement it evicted: a batch that
/// may run again closes nothing of the client's), if it is already whole
/// in `buf`: (type, body).
fn next_answer<'a>(buf: &'a [u8], body: &[u8]) -> Option<(u8, &'a [u8])> {
    let mut start = (body.as_ptr() as usize)
        .checked_sub(buf.as_ptr() as usize)?
        .checked_add(body.len())?;
    loop {
        let rest = buf.get(start..)?;
        let tag = *rest.first()?;
        let len = i32::from_be_bytes(rest.get(1..5)?.try_into().ok()?);
        let len = usize::try_from(len).ok()?.checked_sub(4)?;
        let next = rest.get(5..5 + len)?;
        if !matches!(
            tag,
            tags::backend::NOTICE_RESPONSE | tags::backend::CLOSE_COMPLETE
        ) && !preamble(tag)
        {
            return Some((tag, next));
        }
        start = start.checked_add(5 + len)?;
    }
}

/// What the safety net does with a held message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RetryStep {
    /// A RowDescription: kept from the client until the replica's first
    /// answer.
    Keep,
    /// The kept RowDescription goes to the client before this message
    /// (the read was not refused).
    Emit,
    /// The replica refused the read, or this is the rest of that reply:
    /// accounted for, not forwarded.
    Swallow,
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
    let plain = t.plain();
    // (sluice's own query's replies are dropped whole: their bodies are
    // measured; it goes first only with nothing owed, so it is the head
    // from the scan's start or not at all in this scan)
    let discarding = t.discard_sent && t.expected.discarding();
    let listens = t.listen_txn.is_pending();
    let expected = &mut t.expected;
    let ledger = &mut t.listen_txn;
    let swallowing = cycle.retry == Retry::Swallowing;
    let armed = cycle.retry == Retry::Armed;
    let lost = cycle.retry == Retry::Lost;
    let commits = cycle.watch_commits;
    let end = cycle.server_scan.scan(
        sbuf,
        cycle.to_client,
        SERVER_MESSAGE_LIMIT,
        |tag| {
            // (the safety net looks at the description, the notices and
            // the errors while it waits, at everything while it swallows)
            swallowing
                || (lost && matches!(tag, b::ERROR_RESPONSE | b::NOTICE_RESPONSE))
                || (armed
                    && (preamble(tag) || matches!(tag, b::ERROR_RESPONSE | b::NOTICE_RESPONSE)))
                || discarding
                || server_needs_body(tag)
                || ((listens || commits) && tag == b::COMMAND_COMPLETE)
                || matches!(
                    tag,
                    b::PARSE_COMPLETE | b::CLOSE_COMPLETE | b::NOTIFICATION_RESPONSE
                )
        },
        |tag, body| {
            // A row, with no safety net on: forwarded, nothing to account
            // (the general path below would decide the same, at about 130
            // instructions a row).
            if tag == b::DATA_ROW && cycle.retry == Retry::Off && expected.passes_rows() {
                return Visit::Forward;
            }
            let asynchronous = matches!(
                tag,
                b::NOTICE_RESPONSE | b::PARAMETER_STATUS | b::NOTIFICATION_RESPONSE
            );
            // sluice's own query answered (a farewell, the server's end,
            // is looked at as always).
            if discarding && expected.discarding() && !asynchronous {
                if tag == b::ERROR_RESPONSE && is_fatal(body) {
                    // (the server ends: its farewell is the client's)
                    expected.abandon_discard();
                } else {
                    held = Some(Held::Drop {
                        tag,
                        len: body.len() + sluice_wire::HEADER_LEN,
                    });
                    return Visit::StopBefore;
                }
            }
            // The safety net decides here, and acts in `release_held` (a
            // held message is looked at again until it is released).
            let keeping = !cycle.retry_kept.is_empty();
            let step = match cycle.retry {
                // A dead server's farewell before any answer (a FATAL
                // error, or the WARNING an immediate shutdown or a crash
                // sends): nothing ran; the end of the connection follows
                // and the request goes elsewhere.
                Retry::Lost | Retry::Armed if is_farewell(tag, body) => Some(RetryStep::Swallow),
                // A notice is kept too, with what is kept (if the read is
                // refused, the primary's run sends it again; found by a
                // review: the client got it twice), up to a bound: past it
                // what was kept goes out and the read stays here.
                Retry::Armed if tag == b::NOTICE_RESPONSE => Some(
                    if cycle.retry_kept.len() + body.len() < RETRY_KEPT_NOTICES {
                        RetryStep::Keep
                    } else {
                        RetryStep::Emit
                    },
                ),
                _ if asynchronous => None,
                // A primary's farewell: kept (see `Cycle::keep_farewell`).
                _ if cycle.keep_farewell && tag == b::ERROR_RESPONSE && is_fatal(body) => {
                    Some(RetryStep::Swallow)
                }
                // A FATAL error with nothing owed, between transactions (the
                // server was terminated just after its last reply): not an
                // answer to the client, who lost nothing; the server
                // closes instead of going back (`Cycle::after_farewell`).
                _ if tag == b::ERROR_RESPONSE
                    && between_transactions(&cycle.req, cycle.status, cycle.retry, plain)
                    && is_fatal(body) =>
                {
                    Some(RetryStep::Swallow)
                }
                // The rewriter's own Parse (the statement was not on this
                // server yet) or Close: its reply is the rewriter's, not an
                // answer, and never the client's.
                Retry::Armed
                    if matches!(tag, b::PARSE_COMPLETE | b::CLOSE_COMPLETE)
                        && expected.owns_next(tag) =>
                {
                    None
                }
                // The replica binds and describes before it runs the
                // query. Usually its first answer is already here (one
                // flush): decide now and forward in one piece; else keep
                // what came before it until it comes.
                Retry::Armed if keeping && preamble(tag) => Some(RetryStep::Keep),
                Retry::Armed if preamble(tag) => match next_answer(sbuf, body) {
                    Some((b::ERROR_RESPONSE, next)) if is_read_only_refusal(next) => {
                        cycle.isolation_refused |= is_isolation_refusal(next);
                        Some(RetryStep::Keep)
                    }
                    Some(_) => {
                        cycle.retry = Retry::Off;
                        None
                    }
                    None => Some(RetryStep::Keep),
                },
                Retry::Armed if tag == b::ERROR_RESPONSE && is_read_only_refusal(body) => {
                    cycle.isolation_refused |= is_isolation_refusal(body);
                    Some(RetryStep::Swallow)
                }
                Retry::Armed if keeping => Some(RetryStep::Emit),
                Retry::Armed => {
                    cycle.retry = Retry::Off;
                    None
                }
                Retry::Swallowing => Some(RetryStep::Swallow),
                // Answered: the request ran here; the client's next
                // messages may follow (see `Cycle::cap`), unless routing
                // wants them routed afresh (a read on the primary: a write
                // pipelined behind it must count as one).
                Retry::Lost => {
                    cycle.retry = Retry::Off;
                    if !cycle.routed_cap {
                        cycle.cap = None;
                    }
                    None
                }
                _ => None,
            };
            if let Some(step) = step {
                // Emit needs no body (the message itself is forwarded next).
                let body = if step == RetryStep::Emit {
                    Vec::new()
                } else {
                    body.to_vec()
                };
                held = Some(Held::Retry(step, tag, body));
                return Visit::StopBefore;
            }
            // Notifications reach transaction-mode clients through the
            // pool's LISTEN hub; a pooled server that briefly listened for
            // the client must not deliver them twice.
            let verdict = if tag == b::NOTIFICATION_RESPONSE {
                Verdict::Drop
            } else {
                expected.verdict(tag, server)
            };
            forget_ignored_requests(expected, &mut cycle.req);
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
            if tag == b::ERROR_RESPONSE
                && let Some(renamed) = expected.renamed_error(body)
            {
                held = Some(Held::Renamed(renamed));
                return Visit::StopBefore;
            }
            on_server_message(
                &mut seen,
                cycle_view!(cycle),
                tag,
                body,
                client_params,
                refuse_transactions,
            );
            if listens {
                follow_outcome(ledger, &cycle.req, cycle.status, tag, body);
            }
            if seen.ignored_syncs > 0 {
                expected.forget_ignored_syncs(std::mem::take(&mut seen.ignored_syncs));
            }
            expected.consume(tag, body, server);
            // (an error skips the rest of its batch at once)
            forget_ignored_requests(expected, &mut cycle.req);
            Visit::Forward
        },
    )?;
    if let Some(e) = seen.bad {
        return Err(e);
    }
    if seen.role_changed {
        t.effects.settings = true;
    }
    cycle.to_client = end.forward_to;
    Ok((seen.params_changed, held))
}

/// Acts on a held message once the bytes before it are written; returns
/// whether anything changed (scan again).
pub(super) fn release_held(
    cycle: &mut Cycle,
    held: Held,
    sbuf: &mut BytesMut,
    t: &mut Tracking,
    server: &mut ServerStatements,
    client_params: &mut std::sync::Arc<crate::params::ParamSet>,
    refuse_transactions: bool,
) -> bool {
    if cycle.to_client != 0 {
        return false;
    }
    match held {
        Held::Drop { tag, len } => {
            t.expected.consume(tag, &[], server);
            sbuf.advance(len);
        }
        Held::LocalFirst => {
            t.expected.settle(&mut t.extra, cycle.status, server);
            forget_ignored_requests(&mut t.expected, &mut cycle.req);
        }
        Held::Retry(RetryStep::Emit, _, _) => {
            t.extra
                .extend_from_slice(&std::mem::take(&mut cycle.retry_kept));
            cycle.retry = Retry::Off;
        }
        Held::Renamed(renamed) => {
            let len = sbuf
                .get(1..sluice_wire::HEADER_LEN)
                .and_then(|l| <[u8; 4]>::try_from(l).ok())
                .map_or(0, |l| u32::from_be_bytes(l) as usize + 1);
            let Some(body) = sbuf.get(sluice_wire::HEADER_LEN..len).map(<[u8]>::to_vec) else {
                return false;
            };
            let tag = tags::backend::ERROR_RESPONSE;
            account(
                cycle,
                t,
                server,
                client_params,
                refuse_transactions,
                tag,
                &body,
            );
            forget_ignored_requests(&mut t.expected, &mut cycle.req);
            t.extra.extend_from_slice(&renamed);
            sbuf.advance(len);
        }
        Held::Retry(step, tag, body) => {
            // (decided before the message is accounted, as the scan did)
            let between = between_transactions(&cycle.req, cycle.status, cycle.retry, t.plain());
            account(
                cycle,
                t,
                server,
                client_params,
                refuse_transactions,
                tag,
                &body,
            );
            let fatal = tag == tags::backend::ERROR_RESPONSE && is_fatal(&body);
            let between = fatal && between;
            if cycle.keep_farewell && fatal {
                cycle.farewell = Some(body.clone());
            }
            let retrying = matches!(cycle.retry, Retry::Lost | Retry::Armed);
            let farewell = is_farewell(tag, &body);
            if (fatal && (cycle.keep_farewell || between)) || (farewell && retrying) {
                // A farewell: only the end of the connection may follow;
                // a shutdown's keeps the request's chance to run elsewhere.
                cycle.after_farewell = true;
                cycle.retry_kept.clear();
                if !(retrying && farewell) {
                    cycle.retry = Retry::Off;
                }
            } else if step == RetryStep::Keep {
                let len = i32::try_from(body.len() + 4).unwrap_or(i32::MAX);
                cycle.retry_kept.push(tag);
                cycle.retry_kept.extend_from_slice(&len.to_be_bytes());
                cycle.retry_kept.extend_from_slice(&body);
            } else {
                cycle.retry_kept.clear();
                cycle.retry = if tag == tags::backend::READY_FOR_QUERY {
                    Retry::Done
                } else {
                    Retry::Swallowing
                };
            }
            sbuf.advance(body.len() + sluice_wire::HEADER_LEN);
        }
    }
    true
}

/// Accounts for a held server message as the scan does for one it
/// forwards: the cycle's view of it, then the owed replies.
fn account(
    cycle: &mut Cycle,
    t: &mut Tracking,
    server: &mut ServerStatements,
    client_params: &mut std::sync::Arc<crate::params::ParamSet>,
    refuse_transactions: bool,
    tag: u8,
    body: &[u8],
) {
    let mut seen = ServerSeen::default();
    on_server_message(
        &mut seen,
        cycle_view!(cycle),
        tag,
        body,
        client_params,
        refuse_transactions,
    );
    if t.listen_txn.is_pending() {
        follow_outcome(&mut t.listen_txn, &cycle.req, cycle.status, tag, body);
    }
    if seen.ignored_syncs > 0 {
        t.expected.forget_ignored_syncs(seen.ignored_syncs);
    }
    t.expected.consume(tag, body, server);
}

/// Forgets the client's names whose Parse failed or was skipped by the
/// server: on PostgreSQL those statements do not exist.
/// (The check is inlined into the relay's loop; the work is not.)
#[inline]
pub(super) fn forget_failed_parses(t: &mut Tracking, names: Option<&mut ClientNames>) {
    if t.expected.has_failed_parses() {
        undo_failed_parses(t, names);
    }
}

#[inline(never)]
fn undo_failed_parses(t: &mut Tracking, names: Option<&mut ClientNames>) {
    let undo = t.expected.take_failed_parses();
    if let Some(names) = names {
        // Latest first: each undo finds the names as its change left them.
        for change in undo.into_iter().rev() {
            match change {
                NameUndo::Parsed(name, id) => {
                    if names.get(&name).is_some_and(|s| s.id == id) {
                        names.remove(&name);
                    }
                }
                NameUndo::Closed(name, statement) => {
                    if names.get(&name).is_none() {
                        names.restore(&name, statement);
                    }
                }
            }
        }
    }
}

/// Writes sluice's own replies that are due now that the server's are out.
#[inline]
pub(super) fn settle(cycle: &mut Cycle, t: &mut Tracking, server: &mut ServerStatements) {
    if cycle.to_client == 0 && cycle.server_scan.at_boundary() {
        t.expected.settle(&mut t.extra, cycle.status, server);
        forget_ignored_requests(&mut t.expected, &mut cycle.req);
    }
}

impl Tracking {
    /// SQL that removes what the transaction left on the server that must
    /// not reach another client and cannot pin: LISTENs (notifications go
    /// through the pool's hub) and SQL-level prepared statements (sluice's
    /// shared statements go with them, so its view of the server is reset
    /// too: a DEALLOCATE of a shared name, even inside a function, cannot
    /// leave sluice believing a statement is there). With `discard`, or
    /// when `pin` is off, session objects go too.
    fn cleanup_sql(&self, discard_objects: bool) -> String {
        let e = &self.effects;
        let mut sql = String::new();
        if e.listen {
            sql.push_str("UNLISTEN *;");
        }
        if e.statements {
            sql.push_str("DEALLOCATE ALL;");
        }
        if discard_objects && e.objects() {
            sql.push_str("CLOSE ALL;DISCARD TEMP;SELECT pg_catalog.pg_advisory_unlock_all();");
        }
        sql
    }

    /// Cleanup for a server whose client left or was thrown out: when the
    /// link may have left anything, or the client was pinned, everything
    /// goes (DISCARD ALL also resets the role and session authorization,
    /// which RESET ALL keeps).
    pub(super) fn abandon_sql(&self) -> Option<&'static str> {
        (self.effects.any() || self.pinned.is_some()).then_some("DISCARD ALL")
    }
}

/// What became of the server at a transaction end.
pub(super) enum AfterTx {
    /// Clean: it may go back to the pool.
    Release,
    /// The client owns session objects on it and keeps it.
    Pinned,
    /// It cannot be trusted: close it.
    Close,
    /// The client's session settings pass `max_held_memory_mb`, or cannot
    /// be read back: it is told and let go, and the server is cleaned
    /// (`abandon_sql`) or closed.
    Refused(super::error::ClientError),
}

/// Counts what the server's own session holds that would reach another
/// client: temporary objects (relations, and functions, types, operators
/// and the like, which would shadow the next client's built-ins), WITH
/// HOLD cursors, session advisory locks
/// (transaction-level ones end with the transaction), SQL-level prepared
/// statements, statements prepared by the protocol (sluice's shared ones),
/// and channels listened to. Every function, operator and type is named
/// with its schema: the client's search_path may put its own `count` or
/// `=` before pg_catalog's (a review made an aggregate `count(*)` that
/// answered 0, and its temporary table reached the next client).
const CHECK_SQL: &str = "SELECT \
    (SELECT pg_catalog.count(*) FROM pg_catalog.pg_class \
      WHERE relnamespace OPERATOR(pg_catalog.=) pg_catalog.pg_my_temp_schema()) \
    OPERATOR(pg_catalog.+) (SELECT pg_catalog.count(*) FROM pg_catalog.pg_proc \
      WHERE pronamespace OPERATOR(pg_catalog.=) pg_catalog.pg_my_temp_schema()) \
    OPERATOR(pg_catalog.+) (SELECT pg_catalog.count(*) FROM pg_catalog.pg_type \
      WHERE typnamespace OPERATOR(pg_catalog.=) pg_catalog.pg_my_temp_schema()) \
    OPERATOR(pg_catalog.+) (SELECT pg_catalog.count(*) FROM pg_catalog.pg_operator \
      WHERE oprnamespace OPERATOR(pg_catalog.=) pg_catalog.pg_my_temp_schema()) \
    OPERATOR(pg_catalog.+) (SELECT pg_catalog.count(*) FROM pg_catalog.pg_collation \
      WHERE collnamespace OPERATOR(pg_catalog.=) pg_catalog.pg_my_temp_schema()) \
    OPERATOR(pg_catalog.+) (SELECT pg_catalog.count(*) FROM pg_catalog.pg_conversion \
      WHERE connamespace OPERATOR(pg_catalog.=) pg_catalog.pg_my_temp_schema()) \
    OPERATOR(pg_catalog.+) (SELECT pg_catalog.count(*) FROM pg_catalog.pg_ts_config \
      WHERE cfgnamespace OPERATOR(pg_catalog.=) pg_catalog.pg_my_temp_schema()) \
    OPERATOR(pg_catalog.+) (SELECT pg_catalog.count(*) FROM pg_catalog.pg_ts_dict \
      WHERE dictnamespace OPERATOR(pg_catalog.=) pg_catalog.pg_my_temp_schema()) \
    OPERATOR(pg_catalog.+) (SELECT pg_catalog.count(*) FROM pg_catalog.pg_opfamily \
      WHERE opfnamespace OPERATOR(pg_catalog.=) pg_catalog.pg_my_temp_schema()), \
    (SELECT pg_catalog.count(*) FROM pg_catalog.pg_cursors WHERE is_holdable), \
    (SELECT pg_catalog.count(*) FROM pg_catalog.pg_locks \
      WHERE locktype OPERATOR(pg_catalog.=) 'advisory' \
      AND pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid()), \
    (SELECT pg_catalog.count(*) FILTER (WHERE from_sql) FROM pg_catalog.pg_prepared_statements), \
    (SELECT pg_catalog.count(*) FILTER (WHERE NOT from_sql) \
      FROM pg_catalog.pg_prepared_statements), \
    (SELECT pg_catalog.count(*) FROM pg_catalog.pg_listening_channels())";

/// What `CHECK_SQL` found.
struct Found {
    temp: u64,
    cursors: u64,
    locks: u64,
    sql_statements: u64,
    shared_statements: u64,
    listening: u64,
}

async fn check_server(lease: &mut crate::backend::pool::Lease) -> Option<Found> {
    let read = tokio::time::timeout(
        super::client::CLEANUP_TIMEOUT,
        crate::backend::login::run_query_rows(lease.server(), CHECK_SQL),
    )
    .await;
    let Ok(Ok(rows)) = read else {
        return None;
    };
    let count = |i: usize| {
        rows.first()
            .and_then(|r| r.get(i).cloned().flatten())
            .and_then(|v| v.parse::<u64>().ok())
    };
    Some(Found {
        temp: count(0)?,
        cursors: count(1)?,
        locks: count(2)?,
        sql_statements: count(3)?,
        shared_statements: count(4)?,
        listening: count(5)?,
    })
}

/// After a transaction: clean what must not reach another client, read
/// back the client's session settings if it may have changed them, and
/// decide whether session objects pin the client to this server.
pub(super) async fn after_transaction(
    lease: &mut crate::backend::pool::Lease,
    client: &mut super::client::Client,
    t: &mut Tracking,
) -> AfterTx {
    let pin = lease.settings.session_objects == sluice_config::SessionObjects::Pin;
    let effects = std::mem::take(&mut t.effects);
    // (a one-off copy serves nobody after its transaction: closed before
    // the server's next Parse, it does not push shared ones out)
    t.retire_one_offs(&mut lease.server().statements);
    let known = Tracking {
        effects,
        ..Default::default()
    };
    // What the text says was left: removed without looking (session
    // objects only with `discard`, and not for opaque code, which is
    // checked below instead).
    let mut cleanup = known.cleanup_sql(!pin && !effects.opaque);
    let mut statements_gone = effects.statements;
    let check =
        effects.opaque || (pin && effects.objects()) || (t.pinned.is_some() && effects.removes);
    let mut reason = t.pinned.unwrap_or_default();
    if check {
        let Some(found) = check_server(lease).await else {
            return AfterTx::Close;
        };
        let on_server = lease.server().statements.len() + lease.server().statements.to_close.len();
        if found.sql_statements > 0 || found.shared_statements != on_server as u64 {
            // Something prepared or deallocated behind sluice's back.
            if !cleanup.contains("DEALLOCATE ALL") {
                cleanup.push_str("DEALLOCATE ALL;");
            }
            statements_gone = true;
        }
        // (A LISTEN inside a function or DO block is not followed: the
        // server's channels may be another client's, left by a trigger or
        // a column default, which no check follows; review 29.)
        if found.listening > 0 && !cleanup.contains("UNLISTEN") {
            cleanup.push_str("UNLISTEN *;");
        }
        reason = PinReason {
            temp_tables: found.temp > 0,
            cursors: found.cursors > 0,
            advisory_locks: found.locks > 0,
        };
        if !pin && reason.any() {
            cleanup.push_str("CLOSE ALL;DISCARD TEMP;SELECT pg_catalog.pg_advisory_unlock_all();");
            reason = PinReason::default();
        }
    }
    if effects.opaque {
        cleanup.push_str(&reseed_sql());
    }
    if !cleanup.is_empty() && !reset(lease, &cleanup).await {
        return AfterTx::Close;
    }
    if statements_gone {
        lease.server().statements.clear();
    }
    // Opaque code may have set custom settings (`app.tenant`, by a
    // function: the name is in no text sluice saw), which PostgreSQL lists
    // nowhere: before the server can go to another client (not pinned, or
    // no longer), its settings are reset whole and put back as the client
    // is known to have them (see `capture_settings`).
    let reset_all = (effects.opaque || t.pinned.is_some()) && !reason.any();
    if effects.settings || reset_all {
        match capture_settings(lease, client, t, reset_all).await {
            Ok(true) => {}
            Ok(false) => return AfterTx::Close,
            Err(refused) => {
                // (the server forgets the settings before anyone else gets
                // it: DISCARD ALL as the client is let go, or it is closed;
                // review 36: a DISCARD ALL that timed out here left the
                // server a reply behind, and it went back)
                t.effects.settings = true;
                return AfterTx::Refused(refused);
            }
        }
    }
    t.custom_names.clear();
    t.custom_overflow = false;
    let was = t.pinned;
    t.pinned = reason.any().then_some(reason);
    if t.pinned != was {
        client.set_pinned(t.pinned.map(|r| r.describe()));
    }
    match t.pinned {
        Some(_) => AfterTx::Pinned,
        None if !idle_timeout_reset(lease).await => AfterTx::Close,
        None => AfterTx::Release,
    }
}

/// setseed (called, or by opaque code) makes random()'s next values the
/// caller's to predict, and RESET and DISCARD ALL leave them (a review
/// predicted the next client's, in transaction mode, then in session
/// mode): the server draws from a new seed before another client gets it.
pub(super) fn reseed_sql() -> String {
    let mut bytes = [0u8; 4];
    crate::auth::scram::fill_random(&mut bytes);
    let seed = f64::from(u32::from_le_bytes(bytes)) / f64::from(u32::MAX) * 2.0 - 1.0;
    format!("SELECT pg_catalog.setseed({seed:.9});")
}

/// Reads the session's settings back into the client's view. With
/// `reset_all`, the same query then resets every setting of the server
/// (custom ones too, which no view lists; role and session authorization,
/// which RESET ALL leaves, explicitly) and applies what sluice knew of the
/// client's settings before the transaction, and its tracked parameters:
/// the server then holds nothing sluice does not know of, and the client
/// keeps what it can be known to have. False: the server cannot be
/// trusted; `Err`: the settings pass `max_held_memory_mb`.
async fn capture_settings(
    lease: &mut crate::backend::pool::Lease,
    client: &mut super::client::Client,
    t: &Tracking,
    reset_all: bool,
) -> Result<bool, super::error::ClientError> {
    let mut custom = t.custom_names.clone();
    if let Some(vars) = client.session() {
        for name in vars.custom_names() {
            if !custom.iter().any(|c| c.eq_ignore_ascii_case(name)) {
                custom.push(name.to_owned());
            }
        }
    }
    // (the server's client_encoding is the client's for its transaction)
    let mode = crate::params::text_mode(&client.params, lease.server().sql_ascii);
    let mut capture = crate::session_vars::capture_sql(&custom, mode);
    let before = client.session().clone();
    if reset_all {
        capture.push_str(";RESET ALL;RESET SESSION AUTHORIZATION;RESET ROLE;");
        if let Some(sql) = crate::session_vars::apply_sql(None, before.as_deref(), mode) {
            capture.push_str(&sql);
            capture.push(';');
        }
        if let Some(sql) = client.params.diff_sql(&crate::params::ParamSet::default()) {
            capture.push_str(&sql);
        }
    }
    let read = tokio::time::timeout(
        super::client::CLEANUP_TIMEOUT,
        crate::backend::login::run_query_first_rows(lease.server(), &capture),
    )
    .await;
    let Ok(Ok(rows)) = read else {
        return Ok(false);
    };
    let too_large = rows.iter().find_map(|row| match row.as_slice() {
        [Some(name), _, why] => crate::session_vars::TooLarge::of_row(name, why.as_deref()),
        _ => None,
    });
    let too_large = too_large.or(t
        .custom_overflow
        .then_some(crate::session_vars::TooLarge::Names(MAX_CUSTOM_NAMES)));
    if let Some(too_large) = too_large {
        return Err(super::error::ClientError::new("54000", too_large.message()));
    }
    let vars = crate::session_vars::SessionVars::from_pairs(rows.into_iter().filter_map(|row| {
        match row.as_slice() {
            [Some(name), Some(value), None] => Some((
                name.clone(),
                crate::session_vars::decode_value(value.clone(), mode),
            )),
            _ => None,
        }
    }));
    let mut vars = (!vars.is_empty()).then(|| std::sync::Arc::new(vars));
    let startup = client.carried.as_ref().and_then(|c| c.startup.clone());
    if let Some(restored) = startup.and_then(|s| crate::session_vars::restored(&vars, &s)) {
        // (with `reset_all`, put back with the rest below)
        if !reset_all
            && let Some(sql) =
                crate::session_vars::apply_sql(vars.as_deref(), restored.as_deref(), mode)
            && !reset(lease, &sql).await
        {
            return Ok(false);
        }
        vars = restored;
    }
    if reset_all {
        lease.server().params = client.params.clone();
        // What the transaction itself changed is put back too (rare: a
        // second query), so that the server is as the client now is.
        if !crate::session_vars::same(&before, &vars)
            && let Some(sql) =
                crate::session_vars::apply_sql(before.as_deref(), vars.as_deref(), mode)
            && !reset(lease, &sql).await
        {
            return Ok(false);
        }
    }
    let cost = vars
        .as_deref()
        .map_or(0, crate::session_vars::SessionVars::cost);
    if let Err(refused) = client.carried().session_held.resize(cost) {
        // (PostgreSQL would keep them; sluice cannot, for everyone's sake.)
        return Err(super::error::ClientError::new(
            crate::held_memory::Refused::CODE,
            format!("session settings of {cost} bytes cannot follow this connection: {refused}"),
        ));
    }
    lease.server().session = vars.clone();
    client.set_session(vars);
    client.settings_proven = true;
    Ok(true)
}

/// A client's `idle_session_timeout` stays its own: on a server idle in
/// the pool, PostgreSQL would end the session under the next client (a
/// review saw requests fail). It is reset before the server goes back,
/// and applied again when the client next needs a server (one query more,
/// only for clients that set it).
pub(super) async fn idle_timeout_reset(lease: &mut crate::backend::pool::Lease) -> bool {
    let Some(applied) = lease.server().session.clone() else {
        return true;
    };
    if applied.get(IDLE_TIMEOUT).is_none() {
        return true;
    }
    if !reset(lease, "RESET idle_session_timeout").await {
        return false;
    }
    lease.server().session = applied.without(IDLE_TIMEOUT);
    true
}

const IDLE_TIMEOUT: &str = "idle_session_timeout";

/// Whether the server holds a client's `idle_session_timeout`
/// (`idle_timeout_reset` is due before it goes back).
#[inline]
pub(super) fn holds_idle_timeout(server: &crate::backend::server::ServerConn) -> bool {
    server
        .session
        .as_deref()
        .is_some_and(|v| v.get(IDLE_TIMEOUT).is_some())
}

/// Runs the reset query; false when the server is not clean after it.
pub(super) async fn reset(lease: &mut crate::backend::pool::Lease, sql: &str) -> bool {
    matches!(
        tokio::time::timeout(
            CLEANUP_TIMEOUT,
            crate::backend::login::run_query(lease.server(), sql),
        )
        .await,
        Ok(Ok(()))
    )
}
