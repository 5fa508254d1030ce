//! Differential protocol fuzzer for transaction pooling (issue 9): sharing a
//! server must be invisible. Several raw-protocol clients share a
//! transaction-mode pool smaller than their number and send seeded random
//! sequences of valid and invalid protocol (simple and extended queries,
//! named and unnamed statements, pipelines, Flush, extra Syncs, CopyDone and
//! CopyFail out of place, COPY in and out, errors mid-pipeline, SQL
//! PREPARE/EXECUTE/DEALLOCATE, SET/RESET/SET ROLE, settings changed inside
//! functions, LISTEN/NOTIFY, cursors with and without hold, temp tables,
//! advisory locks, BEGIN/COMMIT/ROLLBACK, disconnects mid-anything).
//!
//! Each client models what PostgreSQL would answer to its own requests (a
//! small interpreter that follows the answers where sluice may legitimately
//! differ, e.g. SQL PREPARE outside a transaction). The oracle:
//! 1. every answer a client gets is the one owed to its own request, in
//!    order: rows carry a token unique to the client and the request
//!    (`select 'c3-r7'`), and an answer with another client's token, a
//!    missing or extra message (ReadyForQuery included), or an error where
//!    none was due is a failure;
//! 2. after each case, fresh clients holding every server of the pool see
//!    what a fresh session sees (role, session settings, cursors, temp
//!    objects, prepared statements, LISTEN, advisory locks, no open
//!    transaction);
//! 3. nothing waits forever: every read has a timeout, and a timeout where an
//!    answer was owed is a failure. Every client ends with its transaction
//!    closed or its connection gone, so waits for a server are bounded.
//!
//! A failing case is shrunk (clients, then chunks of steps, then parts of
//! steps are removed while it still fails by the same rule) and printed with
//! its seed.
//!
//! Default: 40 cases from a fixed seed (about 15 s when they pass). Longer:
//! `FUZZ_CASES=2000 FUZZ_SEED=12345 cargo test -p sluice-tests --test fuzz -- --nocapture --test-threads=1`.
//! Replay one case: `FUZZ_SEED=<case seed> FUZZ_CASES=1`. Other knobs:
//! `FUZZ_KEEP_GOING=1` (shrink and report every failing case instead of
//! stopping at the first), `FUZZ_SHRINK_SECS` (shrinking budget, default
//! 120), `FUZZ_READ_TIMEOUT_MS` (default 8000), `FUZZ_VERBOSE=1` (sluice's
//! log and pg_stat_activity on a failure), `FUZZ_DIRECT=1` (clients talk to
//! PostgreSQL itself: checks the model, which must pass), `SLUICE_BIN` (the
//! binary under test).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use sluice_tests::*;

/// Longest wait for one owed message (`FUZZ_READ_TIMEOUT_MS`, default 8 s).
fn read_timeout() -> Duration {
    static TIMEOUT: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *TIMEOUT.get_or_init(|| Duration::from_millis(env_u64("FUZZ_READ_TIMEOUT_MS").unwrap_or(8000)))
}
/// Longest a whole case may take.
const CASE_DEADLINE: Duration = Duration::from_secs(90);
const DEFAULT_SEED: u64 = 0x0009_f022;
const DEFAULT_CASES: u64 = 40;
const DEFAULT_SHRINK_SECS: u64 = 120;
/// Servers in the fuzzed pool; cases run more clients than this.
const POOL_SIZE: usize = 2;
/// A role the clients may SET ROLE to.
const OTHER_ROLE: &str = "fuzz_other";
/// Named statement templates: the first column is always the bound token.
const TEMPLATES: [&str; 4] = [
    "select $1::text",
    "select $1::text as tok, 2 as two",
    "select $1::text, current_user::text",
    "select $1::text, current_setting('work_mem')",
];
/// Harmless session settings the model does not track (the fresh-session
/// check sees them if they leak).
const OTHER_SETTINGS: [&str; 6] = [
    "set statement_timeout = '20s'",
    "set local lock_timeout = '15s'",
    "set application_name = 'fuzz'",
    "set extra_float_digits = 2",
    "set local statement_timeout = '30s'",
    "set datestyle = 'ISO, DMY'",
];
const SETUP_SQL: [&str; 6] = [
    "create role fuzz_other",
    "grant fuzz_other to app",
    "create table fuzz_copy (tok text); grant all on fuzz_copy to public",
    "create function fuzz_set(name text, value text) returns text language plpgsql \
     as $$begin return set_config(name, value, false); end$$",
    "create function fuzz_mktemp() returns int language plpgsql \
     as $$begin create temp table if not exists fuzz_fn_tmp (x int); return 1; end$$",
    "create function fuzz_lock(k bigint) returns boolean language plpgsql \
     as $$begin return pg_try_advisory_lock(k); end$$",
];

// ---------------------------------------------------------------------------
// Seeded PRNG (splitmix64).

#[derive(Clone, Debug)]
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn pct(&mut self, p: u64) -> bool {
        self.below(100) < p
    }
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }
    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize]
    }
}

// ---------------------------------------------------------------------------
// What clients send.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FailKind {
    DivZero,
    Syntax,
    NoTable,
}

impl FailKind {
    fn code(self) -> &'static str {
        match self {
            FailKind::DivZero => "22012",
            FailKind::Syntax => "42601",
            FailKind::NoTable => "42P01",
        }
    }
}

/// State changed where sluice cannot see it by the statement's words.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sneak {
    WorkMem(u32),
    Role,
    DoBlock,
    Temp,
    Lock(u32),
}

/// One SQL statement.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Stmt {
    Select(String),
    /// Token, work_mem and current_user: settings follow their client.
    Probe(String),
    Fail(FailKind),
    Begin,
    Commit,
    Rollback,
    WorkMem {
        kb: u32,
        local: bool,
    },
    WorkMemCfg {
        tok: String,
        kb: u32,
        local: bool,
    },
    ResetWorkMem,
    ResetAll,
    Role(bool),
    Other(&'static str),
    Sneaky(String, Sneak),
    Prepare(u8),
    ExecPrep(u8, String),
    Dealloc(u8),
    Declare {
        k: u8,
        hold: bool,
        tok: String,
    },
    Fetch {
        k: u8,
        n: u8,
    },
    CloseCursor(u8),
    TempCreate,
    TempInsert(String),
    TempSelect(String),
    TempAs(String),
    Lock(String, u32),
    Unlock(String),
    Listen(usize),
    Unlisten,
    Notify(usize, String),
    CopyOut(String),
}

impl Stmt {
    fn sql(&self) -> String {
        match self {
            Stmt::Select(t) => format!("select '{t}'"),
            Stmt::Probe(t) => {
                format!("select '{t}', current_setting('work_mem'), current_user::text")
            }
            Stmt::Fail(FailKind::DivZero) => "select 1/0".into(),
            Stmt::Fail(FailKind::Syntax) => "selec 1".into(),
            Stmt::Fail(FailKind::NoTable) => "select * from fuzz_missing".into(),
            Stmt::Begin => "begin".into(),
            Stmt::Commit => "commit".into(),
            Stmt::Rollback => "rollback".into(),
            Stmt::WorkMem { kb, local } => {
                let local = if *local { "local " } else { "" };
                format!("set {local}work_mem = '{kb}kB'")
            }
            Stmt::WorkMemCfg { tok, kb, local } => {
                format!("select '{tok}', set_config('work_mem', '{kb}kB', {local})")
            }
            Stmt::ResetWorkMem => "reset work_mem".into(),
            Stmt::ResetAll => "reset all".into(),
            Stmt::Role(true) => format!("set role {OTHER_ROLE}"),
            Stmt::Role(false) => "reset role".into(),
            Stmt::Other(sql) => (*sql).into(),
            Stmt::Sneaky(t, Sneak::WorkMem(kb)) => {
                format!("select '{t}', fuzz_set('work_mem', '{kb}kB')")
            }
            Stmt::Sneaky(t, Sneak::Role) => {
                format!("select '{t}', fuzz_set('role', '{OTHER_ROLE}')")
            }
            Stmt::Sneaky(_, Sneak::DoBlock) => {
                "do $$begin perform set_config('lock_timeout', '25s', false); end$$".into()
            }
            Stmt::Sneaky(t, Sneak::Temp) => format!("select '{t}', fuzz_mktemp()"),
            Stmt::Sneaky(t, Sneak::Lock(k)) => format!("select '{t}', fuzz_lock({k})"),
            Stmt::Prepare(q) => format!("prepare fzq{q} as select $1::text"),
            Stmt::ExecPrep(q, t) => format!("execute fzq{q}('{t}')"),
            Stmt::Dealloc(q) => format!("deallocate fzq{q}"),
            Stmt::Declare { k, hold, tok } => {
                let hold = if *hold { "with hold " } else { "" };
                format!("declare fzk{k} cursor {hold}for select '{tok}' from generate_series(1, 3)")
            }
            Stmt::Fetch { k, n } => format!("fetch {n} from fzk{k}"),
            Stmt::CloseCursor(k) => format!("close fzk{k}"),
            Stmt::TempCreate => "create temp table if not exists fzt (x text)".into(),
            Stmt::TempInsert(t) => format!("insert into fzt values ('{t}')"),
            Stmt::TempSelect(t) => format!("select '{t}', count(*) from fzt"),
            Stmt::TempAs(t) => format!("create temp table fzt2 as select '{t}' as x"),
            Stmt::Lock(t, k) => format!("select '{t}', pg_try_advisory_lock({k})"),
            Stmt::Unlock(t) => format!("select '{t}', pg_advisory_unlock_all()"),
            Stmt::Listen(c) => format!("listen fz_c{c}"),
            Stmt::Unlisten => "unlisten *".into(),
            Stmt::Notify(c, t) => format!("notify fz_c{c}, '{t}'"),
            Stmt::CopyOut(t) => format!("copy (select '{t}') to stdout"),
        }
    }

    fn is_exit(&self) -> bool {
        matches!(self, Stmt::Commit | Stmt::Rollback)
    }
}

/// Text of a Parse: a template with one parameter (the token) or a
/// statement without parameters.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Text {
    Tpl(u8),
    Sql(Stmt),
}

impl Text {
    fn sql(&self) -> String {
        match self {
            Text::Tpl(i) => TEMPLATES[usize::from(*i)].into(),
            Text::Sql(s) => s.sql(),
        }
    }
}

/// One extended-protocol message (always on the unnamed portal).
#[derive(Clone, Debug, PartialEq, Eq)]
enum Part {
    Parse(String, Text),
    Bind(String, Option<String>),
    DescribeStmt(String),
    DescribePortal,
    Execute,
    Close(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stray {
    Sync,
    Flush,
    CopyDone,
    CopyFail,
    CopyData,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Leave {
    Terminate,
    Abrupt,
}

/// One step of a client's sequence (the unit the shrinker removes).
#[derive(Clone, Debug, PartialEq, Eq)]
enum Op {
    /// One Query message with one or more statements.
    Simple(Vec<Stmt>),
    /// Extended messages then Sync; with `flush_at`, a Flush before part
    /// `flush_at`, whose answers are read before the rest is sent.
    Ext {
        parts: Vec<Part>,
        flush_at: Option<usize>,
    },
    /// COPY fuzz_copy FROM STDIN; `wait`: data only after CopyInResponse.
    CopyIn {
        tok: String,
        rows: u8,
        fail: bool,
        wait: bool,
    },
    /// A message on its own, where it has no business (or an extra Sync).
    Stray(Stray),
    /// Several steps in one write, answers read afterwards.
    Pipeline(Vec<Op>),
    Sleep(u16),
    /// Leave, maybe right after sending a step (or half of it) unread.
    /// A later step logs in again as a new connection.
    Disconnect {
        leave: Leave,
        unread: Option<Box<Op>>,
        partial: bool,
    },
}

/// One protocol message as sent.
#[derive(Clone, Debug)]
enum Item {
    Query(Vec<Stmt>),
    CopyQuery,
    CopyData(String),
    CopyDone,
    CopyFail,
    Part(Part),
    Sync,
    Flush,
}

fn message(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut m = vec![tag];
    m.extend_from_slice(&i32::try_from(body.len() + 4).unwrap().to_be_bytes());
    m.extend_from_slice(body);
    m
}

fn cstr(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(s.as_bytes());
    out.push(0);
}

impl Item {
    fn bytes(&self, out: &mut Vec<u8>) {
        let mut b = Vec::new();
        let (tag, body) = match self {
            Item::Query(stmts) => {
                let sql: Vec<String> = stmts.iter().map(Stmt::sql).collect();
                cstr(&mut b, &sql.join("; "));
                (b'Q', b)
            }
            Item::CopyQuery => {
                cstr(&mut b, "copy fuzz_copy (tok) from stdin");
                (b'Q', b)
            }
            Item::CopyData(line) => (b'd', line.as_bytes().to_vec()),
            Item::CopyDone => (b'c', b),
            Item::CopyFail => {
                cstr(&mut b, "fuzz copy fail");
                (b'f', b)
            }
            Item::Sync => (b'S', b),
            Item::Flush => (b'H', b),
            Item::Part(Part::Parse(name, text)) => {
                cstr(&mut b, name);
                cstr(&mut b, &text.sql());
                b.extend_from_slice(&0i16.to_be_bytes());
                (b'P', b)
            }
            Item::Part(Part::Bind(name, tok)) => {
                cstr(&mut b, "");
                cstr(&mut b, name);
                b.extend_from_slice(&0i16.to_be_bytes());
                match tok {
                    Some(t) => {
                        b.extend_from_slice(&1i16.to_be_bytes());
                        b.extend_from_slice(&i32::try_from(t.len()).unwrap().to_be_bytes());
                        b.extend_from_slice(t.as_bytes());
                    }
                    None => b.extend_from_slice(&0i16.to_be_bytes()),
                }
                b.extend_from_slice(&0i16.to_be_bytes());
                (b'B', b)
            }
            Item::Part(Part::DescribeStmt(name)) => {
                b.push(b'S');
                cstr(&mut b, name);
                (b'D', b)
            }
            Item::Part(Part::DescribePortal) => {
                b.push(b'P');
                cstr(&mut b, "");
                (b'D', b)
            }
            Item::Part(Part::Execute) => {
                cstr(&mut b, "");
                b.extend_from_slice(&0i32.to_be_bytes());
                (b'E', b)
            }
            Item::Part(Part::Close(name)) => {
                b.push(b'S');
                cstr(&mut b, name);
                (b'C', b)
            }
        };
        out.extend_from_slice(&message(tag, &body));
    }
}

fn bytes_of(items: &[Item]) -> Vec<u8> {
    let mut out = Vec::new();
    for item in items {
        item.bytes(&mut out);
    }
    out
}

impl Op {
    fn items(&self, out: &mut Vec<Item>) {
        match self {
            Op::Simple(stmts) => out.push(Item::Query(stmts.clone())),
            Op::Ext { parts, flush_at } => {
                for (i, part) in parts.iter().enumerate() {
                    if *flush_at == Some(i) {
                        out.push(Item::Flush);
                    }
                    out.push(Item::Part(part.clone()));
                }
                if *flush_at == Some(parts.len()) {
                    out.push(Item::Flush);
                }
                out.push(Item::Sync);
            }
            Op::CopyIn {
                tok, rows, fail, ..
            } => {
                out.push(Item::CopyQuery);
                for _ in 0..*rows {
                    out.push(Item::CopyData(format!("{tok}\n")));
                }
                out.push(if *fail {
                    Item::CopyFail
                } else {
                    Item::CopyDone
                });
            }
            Op::Stray(s) => out.push(match s {
                Stray::Sync => Item::Sync,
                Stray::Flush => Item::Flush,
                Stray::CopyDone => Item::CopyDone,
                Stray::CopyFail => Item::CopyFail,
                Stray::CopyData => Item::CopyData("stray\n".into()),
            }),
            Op::Pipeline(ops) => ops.iter().for_each(|op| op.items(out)),
            Op::Sleep(_) | Op::Disconnect { .. } => {}
        }
    }

    fn describe(&self) -> String {
        match self {
            Op::Simple(stmts) => {
                let sql: Vec<String> = stmts.iter().map(Stmt::sql).collect();
                format!("Query {:?}", sql.join("; "))
            }
            Op::Ext { .. } => {
                let mut items = Vec::new();
                self.items(&mut items);
                let parts: Vec<String> = items.iter().map(describe_item).collect();
                parts.join(" | ")
            }
            Op::CopyIn {
                tok,
                rows,
                fail,
                wait,
            } => format!(
                "Query \"copy fuzz_copy (tok) from stdin\"{} | {rows} x CopyData '{tok}' | {}",
                if *wait {
                    " (wait for CopyInResponse)"
                } else {
                    ""
                },
                if *fail { "CopyFail" } else { "CopyDone" }
            ),
            Op::Stray(s) => format!("stray {s:?}"),
            Op::Pipeline(ops) => {
                let parts: Vec<String> = ops
                    .iter()
                    .map(|op| format!("[{}]", op.describe()))
                    .collect();
                format!("one packet: {}", parts.join(" + "))
            }
            Op::Sleep(ms) => format!("sleep {ms} ms"),
            Op::Disconnect {
                leave,
                unread,
                partial,
            } => {
                let mut s = String::from("disconnect");
                if let Some(op) = unread {
                    s.push_str(&format!(
                        " right after sending{} [{}] unread",
                        if *partial { " the first half of" } else { "" },
                        op.describe()
                    ));
                } else if *partial {
                    s.push_str(" after half a Query message");
                }
                s.push_str(match leave {
                    Leave::Terminate => " (Terminate)",
                    Leave::Abrupt => " (close)",
                });
                s
            }
        }
    }
}

fn describe_item(item: &Item) -> String {
    match item {
        Item::Query(stmts) => {
            let sql: Vec<String> = stmts.iter().map(Stmt::sql).collect();
            format!("Query {:?}", sql.join("; "))
        }
        Item::CopyQuery => "Query copy-in".into(),
        Item::CopyData(_) => "CopyData".into(),
        Item::CopyDone => "CopyDone".into(),
        Item::CopyFail => "CopyFail".into(),
        Item::Sync => "Sync".into(),
        Item::Flush => "Flush".into(),
        Item::Part(Part::Parse(name, text)) => format!("Parse {name:?} {:?}", text.sql()),
        Item::Part(Part::Bind(name, Some(tok))) => format!("Bind {name:?} ('{tok}')"),
        Item::Part(Part::Bind(name, None)) => format!("Bind {name:?}"),
        Item::Part(Part::DescribeStmt(name)) => format!("Describe statement {name:?}"),
        Item::Part(Part::DescribePortal) => "Describe portal".into(),
        Item::Part(Part::Execute) => "Execute".into(),
        Item::Part(Part::Close(name)) => format!("Close statement {name:?}"),
    }
}

// ---------------------------------------------------------------------------
// The model: what PostgreSQL owes one client, followed through the answers
// where the outcome may legitimately go either way.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Txn {
    Idle,
    Block,
    Failed,
}

/// Whether a session object exists: surely, surely not, or either.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Obj {
    Yes,
    No,
    Maybe,
}

/// A tracked setting; `None` values are unknown.
#[derive(Clone, Debug)]
struct Guc {
    committed: Option<String>,
    pending: Option<Option<String>>,
    local: Option<Option<String>>,
}

impl Guc {
    fn new(value: &str) -> Guc {
        Guc {
            committed: Some(value.to_owned()),
            pending: None,
            local: None,
        }
    }
    fn now(&self) -> Option<String> {
        if let Some(v) = &self.local {
            return v.clone();
        }
        if let Some(v) = &self.pending {
            return v.clone();
        }
        self.committed.clone()
    }
    fn set(&mut self, v: Option<String>) {
        self.pending = Some(v);
        self.local = None;
    }
    fn commit(&mut self) {
        if let Some(v) = self.pending.take() {
            self.committed = v;
        }
        self.local = None;
    }
    fn abort(&mut self) {
        self.pending = None;
        self.local = None;
    }
}

#[derive(Clone, Debug)]
struct Cursor {
    state: Obj,
    tok: String,
    left: Option<u8>,
    hold: bool,
}

#[derive(Clone, Debug)]
struct Portal {
    text: Option<Text>,
    tok: Option<String>,
    /// Executed already (it stays until its transaction ends).
    ran: bool,
}

enum Want {
    Ok,
    Err(Option<&'static str>),
    Maybe,
}

#[derive(Clone, Debug)]
struct Defaults {
    work_mem: String,
    login: String,
}

#[derive(Clone, Debug)]
struct Model {
    txn: Txn,
    skip: bool,
    copying: Option<u32>,
    work_mem: Guc,
    role: Guc,
    named: HashMap<String, (Obj, Option<Text>)>,
    unnamed: (Obj, Option<Text>),
    portal: Option<Portal>,
    prep: [Obj; 3],
    cursors: [Cursor; 3],
    temp: Obj,
    temp2: Obj,
    defaults: Defaults,
}

impl Model {
    fn new(defaults: &Defaults) -> Model {
        let cursor = Cursor {
            state: Obj::No,
            tok: String::new(),
            left: None,
            hold: false,
        };
        Model {
            txn: Txn::Idle,
            skip: false,
            copying: None,
            work_mem: Guc::new(&defaults.work_mem),
            role: Guc::new(&defaults.login),
            named: HashMap::new(),
            unnamed: (Obj::No, None),
            portal: None,
            prep: [Obj::No; 3],
            cursors: [cursor.clone(), cursor.clone(), cursor],
            temp: Obj::No,
            temp2: Obj::No,
            defaults: defaults.clone(),
        }
    }

    fn status(&self) -> u8 {
        match self.txn {
            Txn::Idle => b'I',
            Txn::Block => b'T',
            Txn::Failed => b'E',
        }
    }

    /// A transaction ended: what lives only in it is gone, and what sluice
    /// may either drop or keep (pin) is no longer certain.
    fn txn_end(&mut self) {
        for p in &mut self.prep {
            if *p == Obj::Yes {
                *p = Obj::Maybe;
            }
        }
        for c in &mut self.cursors {
            if c.state == Obj::Yes {
                if c.hold {
                    c.state = Obj::Maybe;
                    c.left = None;
                } else {
                    c.state = Obj::No;
                }
            }
        }
        if self.temp == Obj::Yes {
            self.temp = Obj::Maybe;
        }
        if self.temp2 == Obj::Yes {
            self.temp2 = Obj::Maybe;
        }
    }

    fn scope_commit(&mut self) {
        self.work_mem.commit();
        self.role.commit();
        self.txn_end();
    }

    fn scope_abort(&mut self) {
        self.work_mem.abort();
        self.role.abort();
        self.txn_end();
    }

    fn on_error(&mut self, extended: bool) {
        match self.txn {
            Txn::Block => {
                self.work_mem.abort();
                self.role.abort();
                self.txn = Txn::Failed;
            }
            Txn::Idle => self.scope_abort(),
            Txn::Failed => {}
        }
        self.copying = None;
        if extended {
            self.skip = true;
        }
    }

    /// At ReadyForQuery.
    fn at_ready(&mut self) {
        if self.txn == Txn::Idle {
            self.scope_commit();
        }
        if self.txn == Txn::Idle {
            self.portal = None;
        }
        if self.unnamed.0 == Obj::Yes {
            self.unnamed.0 = Obj::Maybe;
        }
    }

    fn want(&self, s: &Stmt) -> Want {
        if self.txn == Txn::Failed {
            return if s.is_exit() {
                Want::Ok
            } else {
                Want::Err(Some("25P02"))
            };
        }
        let by = |o: Obj, absent: &'static str| match o {
            Obj::Yes => Want::Ok,
            Obj::No => Want::Err(Some(absent)),
            Obj::Maybe => Want::Maybe,
        };
        match s {
            Stmt::Fail(k) => Want::Err(Some(k.code())),
            Stmt::Prepare(q) => match (self.txn, self.prep[usize::from(*q)]) {
                (_, Obj::Yes) => Want::Err(Some("42P05")),
                (Txn::Block, Obj::No) => Want::Ok,
                _ => Want::Maybe,
            },
            Stmt::ExecPrep(q, _) | Stmt::Dealloc(q) => by(self.prep[usize::from(*q)], "26000"),
            Stmt::Declare { k, hold, .. } => {
                let state = self.cursors[usize::from(*k)].state;
                if state == Obj::Yes {
                    Want::Err(Some("42P03"))
                } else if self.txn != Txn::Block && !hold {
                    Want::Err(Some("25P01"))
                } else if self.txn != Txn::Block || state == Obj::Maybe {
                    Want::Maybe
                } else {
                    Want::Ok
                }
            }
            Stmt::Fetch { k, .. } | Stmt::CloseCursor(k) => {
                by(self.cursors[usize::from(*k)].state, "34000")
            }
            // Owned by the login role: another role may be refused.
            Stmt::TempInsert(_) | Stmt::TempSelect(_)
                if self.role.now().as_deref() != Some(&self.defaults.login) =>
            {
                Want::Maybe
            }
            Stmt::TempInsert(_) | Stmt::TempSelect(_) => by(self.temp, "42P01"),
            Stmt::TempAs(_) => match self.temp2 {
                Obj::Yes => Want::Err(Some("42P07")),
                Obj::No => Want::Ok,
                Obj::Maybe => Want::Maybe,
            },
            _ => Want::Ok,
        }
    }

    fn tag(&self, s: &Stmt) -> String {
        match s {
            Stmt::Begin => "BEGIN",
            Stmt::Commit if self.txn == Txn::Failed => "ROLLBACK",
            Stmt::Commit => "COMMIT",
            Stmt::Rollback => "ROLLBACK",
            Stmt::WorkMem { .. } | Stmt::Role(true) | Stmt::Other(_) => "SET",
            Stmt::ResetWorkMem | Stmt::ResetAll | Stmt::Role(false) => "RESET",
            Stmt::Sneaky(_, Sneak::DoBlock) => "DO",
            Stmt::Prepare(_) => "PREPARE",
            Stmt::Dealloc(_) => "DEALLOCATE",
            Stmt::Declare { .. } => "DECLARE CURSOR",
            Stmt::CloseCursor(_) => "CLOSE CURSOR",
            Stmt::TempCreate => "CREATE TABLE",
            Stmt::TempInsert(_) => "INSERT 0 1",
            Stmt::Listen(_) => "LISTEN",
            Stmt::Unlisten => "UNLISTEN",
            Stmt::Notify(..) => "NOTIFY",
            Stmt::CopyOut(_) => "COPY 1",
            _ => "SELECT 1",
        }
        .to_owned()
    }

    fn apply(&mut self, s: &Stmt) {
        let kb = |kb: &u32| Some(format!("{kb}kB"));
        match s {
            Stmt::Begin if self.txn == Txn::Idle => self.txn = Txn::Block,
            Stmt::Commit => {
                match self.txn {
                    Txn::Failed => self.scope_abort(),
                    _ => self.scope_commit(),
                }
                self.txn = Txn::Idle;
            }
            Stmt::Rollback => {
                self.scope_abort();
                self.txn = Txn::Idle;
            }
            Stmt::WorkMem { kb: v, local } | Stmt::WorkMemCfg { kb: v, local, .. } => {
                if !*local {
                    self.work_mem.set(kb(v));
                } else if self.txn == Txn::Block {
                    self.work_mem.local = Some(kb(v));
                } else {
                    self.work_mem.local = Some(None);
                }
            }
            Stmt::ResetWorkMem | Stmt::ResetAll => {
                let default = self.defaults.work_mem.clone();
                self.work_mem.set(Some(default));
            }
            Stmt::Role(other) => {
                let role = if *other {
                    OTHER_ROLE.to_owned()
                } else {
                    self.defaults.login.clone()
                };
                self.role.set(Some(role));
            }
            Stmt::Sneaky(_, Sneak::WorkMem(_)) => self.work_mem.set(None),
            Stmt::Sneaky(_, Sneak::Role) => self.role.set(None),
            Stmt::Prepare(q) => self.prep[usize::from(*q)] = Obj::Yes,
            Stmt::Dealloc(q) => self.prep[usize::from(*q)] = Obj::No,
            Stmt::Declare { k, hold, tok } => {
                self.cursors[usize::from(*k)] = Cursor {
                    state: Obj::Yes,
                    tok: tok.clone(),
                    left: Some(3),
                    hold: *hold,
                }
            }
            Stmt::CloseCursor(k) => self.cursors[usize::from(*k)].state = Obj::No,
            Stmt::TempCreate => self.temp = Obj::Yes,
            Stmt::TempAs(_) => self.temp2 = Obj::Yes,
            _ => {}
        }
    }

    fn named(&self, name: &str) -> (Obj, Option<Text>) {
        if name.is_empty() {
            return self.unnamed.clone();
        }
        self.named.get(name).cloned().unwrap_or((Obj::No, None))
    }

    fn set_named(&mut self, name: &str, value: (Obj, Option<Text>)) {
        if name.is_empty() {
            self.unnamed = value;
        } else {
            self.named.insert(name.to_owned(), value);
        }
    }
}

// ---------------------------------------------------------------------------
// Failures.

#[derive(Clone, Debug)]
struct Failure {
    /// Which oracle rule: 1 answers, 2 fresh session, 3 waits.
    rule: u8,
    what: String,
}

type Res<T> = Result<T, Failure>;

fn rule1(what: impl Into<String>) -> Failure {
    Failure {
        rule: 1,
        what: what.into(),
    }
}

impl Failure {
    fn at(mut self, cid: usize, step: usize, op: &Op) -> Failure {
        self.what = format!(
            "client c{cid}, step {} [{}]: {}",
            step + 1,
            op.describe(),
            self.what
        );
        self
    }
}

fn data_row(body: &[u8]) -> Vec<Option<String>> {
    let mut cols = Vec::new();
    let Some(n) = body.get(..2).map(|b| i16::from_be_bytes([b[0], b[1]])) else {
        return cols;
    };
    let mut pos = 2;
    for _ in 0..n {
        let Some(len) = body
            .get(pos..pos + 4)
            .map(|b| i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
        else {
            break;
        };
        pos += 4;
        if len < 0 {
            cols.push(None);
            continue;
        }
        let end = pos + usize::try_from(len).unwrap_or(0);
        cols.push(
            body.get(pos..end)
                .map(|b| String::from_utf8_lossy(b).into_owned()),
        );
        pos = end;
    }
    cols
}

fn cstring(body: &[u8]) -> String {
    let end = body.iter().position(|b| *b == 0).unwrap_or(body.len());
    String::from_utf8_lossy(&body[..end]).into_owned()
}

fn show(tag: u8, body: &[u8]) -> String {
    match tag {
        b'D' => format!("DataRow {:?}", data_row(body)),
        b'E' => {
            let f = error_fields(body);
            format!(
                "ErrorResponse {} {:?}",
                error_field(&f, b'C').unwrap_or("?"),
                error_field(&f, b'M').unwrap_or("?")
            )
        }
        b'C' => format!("CommandComplete {:?}", cstring(body)),
        b'Z' => format!("ReadyForQuery {:?}", body.first().map(|b| *b as char)),
        b'T' => "RowDescription".into(),
        b't' => "ParameterDescription".into(),
        b'n' => "NoData".into(),
        b'1' => "ParseComplete".into(),
        b'2' => "BindComplete".into(),
        b'3' => "CloseComplete".into(),
        b'G' => "CopyInResponse".into(),
        b'H' => "CopyOutResponse".into(),
        b'd' => format!("CopyData {:?}", String::from_utf8_lossy(body)),
        b'c' => "CopyDone".into(),
        b's' => "PortalSuspended".into(),
        b'I' => "EmptyQueryResponse".into(),
        other => format!("message {:?}", other as char),
    }
}

fn expected_name(tag: u8) -> &'static str {
    match tag {
        b'D' => "DataRow",
        b'E' => "ErrorResponse",
        b'C' => "CommandComplete",
        b'Z' => "ReadyForQuery",
        b'T' => "RowDescription",
        b't' => "ParameterDescription",
        b'1' => "ParseComplete",
        b'2' => "BindComplete",
        b'3' => "CloseComplete",
        b'G' => "CopyInResponse",
        b'H' => "CopyOutResponse",
        b'd' => "CopyData",
        b'c' => "CopyDone",
        _ => "?",
    }
}

/// "c3-r7" → 3, for telling whose answer arrived.
fn token_owner(text: &str) -> Option<usize> {
    let rest = text.strip_prefix('c')?;
    let (num, tail) = rest.split_once('-')?;
    tail.starts_with('r').then(|| num.parse().ok())?
}

// ---------------------------------------------------------------------------
// One connection, reading with the model.

struct Conn {
    raw: RawClient,
    cid: usize,
    peeked: Option<(u8, Vec<u8>)>,
    /// Last messages received, for the failure report.
    recent: Vec<String>,
}

impl Conn {
    async fn open(port: u16, cid: usize) -> Res<Conn> {
        let mut raw = RawClient::connect(port).await;
        raw.startup(APP_USER, "postgres").await;
        let mut conn = Conn {
            raw,
            cid,
            peeked: None,
            recent: Vec::new(),
        };
        loop {
            let (tag, body) = conn.next().await.map_err(|f| Failure {
                what: format!("login: {}", f.what),
                ..f
            })?;
            match tag {
                b'Z' => return Ok(conn),
                b'E' => return Err(rule1(format!("login failed: {}", show(tag, &body)))),
                _ => {}
            }
        }
    }

    async fn send(&mut self, bytes: &[u8]) -> Res<()> {
        self.raw
            .send(bytes)
            .await
            .map_err(|e| rule1(format!("sluice closed the connection (send: {e})")))
    }

    fn context(&self) -> String {
        let n = self.recent.len();
        format!(
            " (last received: {})",
            self.recent[n.saturating_sub(6)..].join(", ")
        )
    }

    async fn next(&mut self) -> Res<(u8, Vec<u8>)> {
        if let Some(m) = self.peeked.take() {
            return Ok(m);
        }
        loop {
            match self.raw.read_message(read_timeout()).await {
                RawReply::Message(b'N' | b'S' | b'K', _) => continue,
                RawReply::Message(b'A', body) => {
                    let channel = cstring(body.get(4..).unwrap_or_default());
                    if channel != format!("fz_c{}", self.cid) {
                        return Err(rule1(format!(
                            "notification for channel {channel:?}, which this client never listened to"
                        )));
                    }
                }
                RawReply::Message(tag, body) => {
                    if tag != b'R' {
                        self.recent.push(show(tag, &body));
                    }
                    return Ok((tag, body));
                }
                RawReply::Closed => {
                    return Err(rule1(format!(
                        "sluice closed the connection{}",
                        self.context()
                    )));
                }
                RawReply::TimedOut => {
                    return Err(Failure {
                        rule: 3,
                        what: format!(
                            "no answer within {:?} where one was owed{}",
                            read_timeout(),
                            self.context()
                        ),
                    });
                }
            }
        }
    }

    async fn peek(&mut self) -> Res<u8> {
        let m = self.next().await?;
        let tag = m.0;
        self.peeked = Some(m);
        Ok(tag)
    }

    async fn expect(&mut self, tag: u8, why: &str) -> Res<Vec<u8>> {
        let (got, body) = self.next().await?;
        if got != tag {
            return Err(self.unexpected(expected_name(tag), why, got, &body));
        }
        Ok(body)
    }

    fn unexpected(&self, wanted: &str, why: &str, got: u8, body: &[u8]) -> Failure {
        let mut what = format!("expected {wanted} for {why}, got {}", show(got, body));
        if got == b'D'
            && let Some(Some(first)) = data_row(body).first()
            && let Some(owner) = token_owner(first)
            && owner != self.cid
        {
            what.push_str(&format!(" — an answer owed to client c{owner}"));
        }
        what.push_str(&self.context());
        rule1(what)
    }

    async fn expect_error(&mut self, code: Option<&str>, why: &str) -> Res<()> {
        let body = self.expect(b'E', why).await?;
        if let Some(code) = code {
            let fields = error_fields(&body);
            let got = error_field(&fields, b'C').unwrap_or("?");
            if got != code {
                return Err(rule1(format!(
                    "expected SQLSTATE {code} for {why}, got {}{}",
                    show(b'E', &body),
                    self.context()
                )));
            }
        }
        Ok(())
    }

    async fn expect_complete(&mut self, tag: &str, why: &str) -> Res<()> {
        let body = self.expect(b'C', why).await?;
        if cstring(&body) != tag {
            return Err(rule1(format!(
                "expected CommandComplete {tag:?} for {why}, got {:?}{}",
                cstring(&body),
                self.context()
            )));
        }
        Ok(())
    }

    /// One DataRow; `want[i] = None` leaves column i unchecked.
    async fn expect_row(&mut self, want: &[Option<String>], why: &str) -> Res<()> {
        let (tag, body) = self.next().await?;
        if tag != b'D' {
            return Err(self.unexpected("DataRow", why, tag, &body));
        }
        let cols = data_row(&body);
        for (i, w) in want.iter().enumerate() {
            if let Some(w) = w
                && cols.get(i).cloned().flatten().as_deref() != Some(w.as_str())
            {
                let mut what = format!(
                    "column {} of the row for {why} should be {w:?}, got {:?}",
                    i + 1,
                    cols
                );
                if let Some(Some(first)) = cols.first()
                    && let Some(owner) = token_owner(first)
                    && owner != self.cid
                {
                    what.push_str(&format!(" — an answer owed to client c{owner}"));
                }
                what.push_str(&self.context());
                return Err(rule1(what));
            }
        }
        Ok(())
    }

    async fn ready(&mut self, m: &mut Model, why: &str) -> Res<()> {
        let body = self.expect(b'Z', why).await?;
        let want = m.status();
        if body.first() != Some(&want) {
            return Err(rule1(format!(
                "ReadyForQuery for {why} says {:?}, the transaction state is {:?}{}",
                body.first().map(|b| *b as char),
                want as char,
                self.context()
            )));
        }
        m.at_ready();
        Ok(())
    }

    /// Decides between success and error; true when an error was consumed.
    async fn outcome(&mut self, m: &mut Model, want: Want, why: &str, ext: bool) -> Res<bool> {
        match want {
            Want::Ok => Ok(false),
            Want::Err(code) => {
                self.expect_error(code, why).await?;
                m.on_error(ext);
                Ok(true)
            }
            Want::Maybe => {
                if self.peek().await? == b'E' {
                    self.next().await?;
                    m.on_error(ext);
                    Ok(true)
                } else {
                    Ok(false)
                }
            }
        }
    }

    /// Runs one statement (simple Query or Execute); false if it failed.
    async fn stmt(&mut self, m: &mut Model, s: &Stmt, simple: bool) -> Res<bool> {
        let why = format!("{:?}", s.sql());
        let want = m.want(s);
        if self.outcome(m, want, &why, !simple).await? {
            return Ok(false);
        }
        let tag = m.tag(s);
        let row = |tok: &String| vec![Some(tok.clone())];
        let rows: Option<Vec<Vec<Option<String>>>> = match s {
            Stmt::Select(t)
            | Stmt::WorkMemCfg { tok: t, .. }
            | Stmt::Lock(t, _)
            | Stmt::Unlock(t)
            | Stmt::TempSelect(t)
            | Stmt::ExecPrep(_, t) => Some(vec![row(t)]),
            Stmt::Sneaky(t, sneak) if *sneak != Sneak::DoBlock => Some(vec![row(t)]),
            Stmt::Probe(t) => Some(vec![vec![Some(t.clone()), m.work_mem.now(), m.role.now()]]),
            _ => None,
        };
        match (s, rows) {
            (_, Some(rows)) => {
                if simple {
                    self.expect(b'T', &why).await?;
                }
                for r in &rows {
                    self.expect_row(r, &why).await?;
                }
                self.expect_complete(&tag, &why).await?;
            }
            (Stmt::Fetch { k, n }, None) => {
                if simple {
                    self.expect(b'T', &why).await?;
                }
                let cursor = m.cursors[usize::from(*k)].clone();
                let mut got = 0u8;
                loop {
                    let tag = self.peek().await?;
                    if tag != b'D' {
                        break;
                    }
                    self.expect_row(&[Some(cursor.tok.clone())], &why).await?;
                    got += 1;
                }
                let owed = cursor.left.map(|left| left.min(*n));
                if owed.is_some_and(|o| o != got) || got > *n {
                    return Err(rule1(format!(
                        "{why} returned {got} rows, {owed:?} owed{}",
                        self.context()
                    )));
                }
                self.expect_complete(&format!("FETCH {got}"), &why).await?;
                let c = &mut m.cursors[usize::from(*k)];
                c.state = Obj::Yes;
                c.left = c.left.map(|l| l - got);
            }
            (Stmt::CopyOut(t), None) => {
                self.expect(b'H', &why).await?;
                let body = self.expect(b'd', &why).await?;
                if body != format!("{t}\n").as_bytes() {
                    return Err(rule1(format!(
                        "{why} sent CopyData {:?}{}",
                        String::from_utf8_lossy(&body),
                        self.context()
                    )));
                }
                self.expect(b'c', &why).await?;
                self.expect_complete(&tag, &why).await?;
            }
            _ => self.expect_complete(&tag, &why).await?,
        }
        m.apply(s);
        Ok(true)
    }

    async fn part(&mut self, m: &mut Model, p: &Part) -> Res<()> {
        let why = describe_item(&Item::Part(p.clone()));
        let failed = m.txn == Txn::Failed;
        match p {
            Part::Parse(name, text) => {
                let exit = matches!(text, Text::Sql(s) if s.is_exit());
                let (state, _) = m.named(name);
                let want = if *text == Text::Sql(Stmt::Fail(FailKind::Syntax)) {
                    Want::Err(Some("42601"))
                } else if failed && !exit {
                    Want::Err(Some("25P02"))
                } else if !name.is_empty() && state == Obj::Yes {
                    Want::Err(Some("42P05"))
                } else if *text == Text::Sql(Stmt::Fail(FailKind::NoTable)) {
                    Want::Err(Some("42P01"))
                } else if !name.is_empty() && state == Obj::Maybe {
                    Want::Maybe
                } else {
                    Want::Ok
                };
                if self.outcome(m, want, &why, true).await? {
                    return Ok(());
                }
                self.expect(b'1', &why).await?;
                m.set_named(name, (Obj::Yes, Some(text.clone())));
            }
            Part::Bind(name, tok) => {
                let (state, text) = m.named(name);
                let exit = matches!(&text, Some(Text::Sql(s)) if s.is_exit());
                let params_ok = match &text {
                    Some(Text::Tpl(_)) => tok.is_some(),
                    Some(Text::Sql(_)) => tok.is_none(),
                    None => true,
                };
                let want = if state == Obj::No {
                    Want::Err(Some("26000"))
                } else if failed && !exit {
                    if state == Obj::Yes {
                        Want::Err(Some("25P02"))
                    } else {
                        Want::Err(None)
                    }
                } else if !params_ok && state == Obj::Yes {
                    Want::Err(Some("08P01"))
                } else if state == Obj::Maybe
                    || matches!(&text, Some(Text::Sql(Stmt::Fail(_))))
                    || !params_ok
                {
                    Want::Maybe
                } else {
                    Want::Ok
                };
                if self.outcome(m, want, &why, true).await? {
                    return Ok(());
                }
                self.expect(b'2', &why).await?;
                m.portal = Some(Portal {
                    text: if state == Obj::Yes { text } else { None },
                    tok: tok.clone(),
                    ran: false,
                });
            }
            Part::DescribeStmt(name) => {
                let (state, _) = m.named(name);
                let want = match state {
                    Obj::No => Want::Err(Some("26000")),
                    _ if failed => Want::Maybe,
                    Obj::Maybe => Want::Maybe,
                    Obj::Yes => Want::Ok,
                };
                if self.outcome(m, want, &why, true).await? {
                    return Ok(());
                }
                self.expect(b't', &why).await?;
                let (tag, body) = self.next().await?;
                if tag != b'T' && tag != b'n' {
                    return Err(self.unexpected("RowDescription or NoData", &why, tag, &body));
                }
            }
            Part::DescribePortal => {
                let want = if m.portal.is_none() {
                    Want::Err(Some("34000"))
                } else if failed {
                    Want::Maybe
                } else {
                    Want::Ok
                };
                if self.outcome(m, want, &why, true).await? {
                    return Ok(());
                }
                let (tag, body) = self.next().await?;
                if tag != b'T' && tag != b'n' {
                    return Err(self.unexpected("RowDescription or NoData", &why, tag, &body));
                }
            }
            Part::Execute => {
                let Some(portal) = m.portal.take() else {
                    self.outcome(m, Want::Err(Some("34000")), &why, true)
                        .await?;
                    return Ok(());
                };
                m.portal = Some(Portal {
                    ran: true,
                    ..portal.clone()
                });
                if portal.ran {
                    // Run again: an error, or what is left (nothing).
                    if self.outcome(m, Want::Maybe, &why, true).await? {
                        return Ok(());
                    }
                    self.expect(b'C', &why).await?;
                    return Ok(());
                }
                match portal.text {
                    Some(Text::Sql(s)) => {
                        self.stmt(m, &s, false).await?;
                    }
                    text => {
                        let want = if failed {
                            Want::Err(Some("25P02"))
                        } else {
                            Want::Ok
                        };
                        if self.outcome(m, want, &why, true).await? {
                            return Ok(());
                        }
                        let mut row = vec![portal.tok.clone()];
                        match text {
                            Some(Text::Tpl(1)) => row.push(Some("2".into())),
                            Some(Text::Tpl(2)) => row.push(m.role.now()),
                            Some(Text::Tpl(3)) => row.push(m.work_mem.now()),
                            _ => {}
                        }
                        self.expect_row(&row, &why).await?;
                        self.expect_complete("SELECT 1", &why).await?;
                    }
                }
            }
            Part::Close(name) => {
                self.expect(b'3', &why).await?;
                m.set_named(name, (Obj::No, None));
            }
        }
        Ok(())
    }

    /// Reads whatever `item` is owed, in the model's state.
    async fn process(&mut self, m: &mut Model, item: &Item) -> Res<()> {
        if let Some(n) = m.copying {
            match item {
                Item::CopyData(_) => m.copying = Some(n + 1),
                Item::CopyDone => {
                    m.copying = None;
                    self.expect_complete(&format!("COPY {n}"), "CopyDone")
                        .await?;
                    self.ready(m, "the COPY").await?;
                }
                Item::CopyFail => {
                    self.expect_error(Some("57014"), "CopyFail").await?;
                    m.on_error(false);
                    self.ready(m, "the COPY").await?;
                }
                Item::Sync | Item::Flush => {}
                other => {
                    return Err(rule1(format!(
                        "test bug: {} sent during COPY",
                        describe_item(other)
                    )));
                }
            }
            return Ok(());
        }
        if m.skip {
            if matches!(item, Item::Sync) {
                m.skip = false;
                self.ready(m, "Sync after an error").await?;
            }
            return Ok(());
        }
        match item {
            Item::Query(stmts) => {
                m.portal = None;
                m.unnamed = (Obj::No, None);
                let why = describe_item(item);
                // The whole string is parsed before any of it runs.
                if stmts.contains(&Stmt::Fail(FailKind::Syntax)) {
                    self.expect_error(Some("42601"), &why).await?;
                    m.on_error(false);
                    return self.ready(m, &why).await;
                }
                for s in stmts {
                    if !self.stmt(m, s, true).await? {
                        break;
                    }
                }
                self.ready(m, &why).await?;
            }
            Item::CopyQuery => {
                if m.txn == Txn::Failed {
                    self.expect_error(Some("25P02"), "COPY in a failed transaction")
                        .await?;
                    self.ready(m, "COPY in a failed transaction").await?;
                } else {
                    self.expect(b'G', "COPY FROM STDIN").await?;
                    m.copying = Some(0);
                }
            }
            Item::CopyData(_) | Item::CopyDone | Item::CopyFail | Item::Flush => {}
            Item::Part(p) => self.part(m, p).await?,
            Item::Sync => self.ready(m, "Sync").await?,
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// Running a case.

#[derive(Clone, Debug)]
struct Case {
    pool: usize,
    /// (client id, steps)
    clients: Vec<(usize, Vec<Op>)>,
}

impl Case {
    fn describe(&self) -> String {
        let mut out = format!(
            "pool_mode=transaction, default_pool_size={}, {} clients\n",
            self.pool,
            self.clients.len()
        );
        for (cid, ops) in &self.clients {
            out.push_str(&format!("  client c{cid}:\n"));
            for (i, op) in ops.iter().enumerate() {
                out.push_str(&format!("    {:>2}. {}\n", i + 1, op.describe()));
            }
        }
        out
    }
}

async fn run_client(port: u16, cid: usize, ops: &[Op], defaults: &Defaults) -> Res<()> {
    let mut conn = Some(Conn::open(port, cid).await?);
    let mut m = Model::new(defaults);
    for (i, op) in ops.iter().enumerate() {
        let at = |f: Failure| f.at(cid, i, op);
        if conn.is_none() {
            conn = Some(Conn::open(port, cid).await.map_err(at)?);
            m = Model::new(defaults);
        }
        let c = conn.as_mut().unwrap();
        match op {
            Op::Sleep(ms) => tokio::time::sleep(Duration::from_millis(u64::from(*ms))).await,
            Op::Disconnect {
                leave,
                unread,
                partial,
            } => {
                let mut bytes = Vec::new();
                if let Some(unread) = unread {
                    let mut items = Vec::new();
                    unread.items(&mut items);
                    bytes = bytes_of(&items);
                } else if *partial {
                    bytes = bytes_of(&[Item::Query(vec![Stmt::Select("cut".into())])]);
                }
                if *partial {
                    bytes.truncate(bytes.len() / 2);
                }
                if *leave == Leave::Terminate && !*partial {
                    bytes.extend_from_slice(&message(b'X', &[]));
                }
                let _ = c.raw.send(&bytes).await;
                if *leave == Leave::Terminate {
                    c.raw.shutdown_write().await;
                }
                conn = None;
            }
            _ => {
                let mut items = Vec::new();
                op.items(&mut items);
                // Answers owed so far are read before the rest is sent.
                let split = |item: &Item| {
                    matches!(
                        (op, item),
                        (Op::Ext { .. }, Item::Flush)
                            | (Op::CopyIn { wait: true, .. }, Item::CopyQuery)
                    )
                };
                let mut start = 0;
                for j in 0..items.len() {
                    if j + 1 == items.len() || split(&items[j]) {
                        let segment = &items[start..=j];
                        c.send(&bytes_of(segment)).await.map_err(at)?;
                        for item in segment {
                            c.process(&mut m, item).await.map_err(at)?;
                        }
                        start = j + 1;
                    }
                }
            }
        }
    }
    if let Some(mut c) = conn {
        let _ = c.raw.send(&message(b'X', &[])).await;
        c.raw.shutdown_write().await;
    }
    Ok(())
}

/// Reads one simple query's rows; an ErrorResponse or a warning that a
/// transaction was already open is returned as the error text.
async fn fresh_query(c: &mut RawClient, sql: &str) -> Result<Vec<Vec<Option<String>>>, String> {
    let mut q = Vec::new();
    cstr(&mut q, sql);
    c.send(&message(b'Q', &q))
        .await
        .map_err(|e| format!("send: {e}"))?;
    let mut rows = Vec::new();
    let mut problem = None;
    loop {
        match c.read_message(read_timeout()).await {
            RawReply::Message(b'D', body) => rows.push(data_row(&body)),
            RawReply::Message(b'E', body) => problem = Some(show(b'E', &body)),
            RawReply::Message(b'N', body) => {
                let f = error_fields(&body);
                if error_field(&f, b'C') == Some("25001") {
                    problem = Some(format!(
                        "a transaction was already open: {:?}",
                        error_field(&f, b'M')
                    ));
                }
            }
            RawReply::Message(b'Z', body) => {
                if sql == "begin" && body.first() != Some(&b'T') {
                    problem.get_or_insert_with(|| "BEGIN did not open a transaction".into());
                }
                return problem.map_or(Ok(rows), Err);
            }
            RawReply::Message(..) => {}
            other => return Err(format!("{sql:?}: {other:?}")),
        }
    }
}

const CHECK_SQL: &str = "select current_user::text, session_user::text, \
    (select coalesce(string_agg(name || '=' || setting, ', ' order by name), '') \
       from pg_settings where source = 'session' and setting is distinct from reset_val), \
    (select count(*) from pg_cursors)::text, \
    (select count(*) from pg_class where relnamespace = pg_my_temp_schema())::text, \
    (select coalesce(string_agg(name, ', ' order by name), '') \
       from pg_prepared_statements where name not like 'sluice\\_%'), \
    (select count(*) from pg_listening_channels())::text, \
    (select count(*) from pg_locks where locktype = 'advisory' and pid = pg_backend_pid())::text, \
    current_setting('work_mem'), pg_backend_pid()::text";
const CHECK_FIELDS: [&str; 9] = [
    "current_user",
    "session_user",
    "settings changed in the session",
    "cursors (pg_cursors)",
    "temp objects",
    "prepared statements not sluice's own",
    "listening channels",
    "advisory locks held",
    "work_mem",
];

/// What fresh clients see on each server of the pool: `pool` clients open
/// a transaction each, so each holds a different server.
async fn fresh_servers(port: u16, pool: usize) -> Res<Vec<Vec<Option<String>>>> {
    let rule2 = |what: String| Failure { rule: 2, what };
    let mut clients = Vec::new();
    for _ in 0..pool {
        let mut c = RawClient::connect(port).await;
        c.startup(APP_USER, "postgres").await;
        loop {
            match c.read_message(read_timeout()).await {
                RawReply::Message(b'Z', _) => break,
                RawReply::Message(b'E', body) => {
                    return Err(rule2(format!("fresh login failed: {}", show(b'E', &body))));
                }
                RawReply::Message(..) => {}
                other => {
                    let rule = if other == RawReply::TimedOut { 3 } else { 2 };
                    return Err(Failure {
                        rule,
                        what: format!("fresh login: {other:?}"),
                    });
                }
            }
        }
        clients.push(c);
    }
    for c in &mut clients {
        fresh_query(c, "begin")
            .await
            .map_err(|e| rule2(format!("fresh client's BEGIN: {e}")))?;
    }
    let mut rows = Vec::new();
    for c in &mut clients {
        let got = fresh_query(c, CHECK_SQL)
            .await
            .map_err(|e| rule2(format!("fresh client's check: {e}")))?;
        let row = got
            .into_iter()
            .next()
            .ok_or_else(|| rule2("fresh client's check returned no row".into()))?;
        rows.push(row);
    }
    for c in &mut clients {
        let _ = fresh_query(c, "rollback").await;
        let _ = c.send(&message(b'X', &[])).await;
    }
    let mut pids: Vec<_> = rows.iter().map(|r| r.get(9).cloned().flatten()).collect();
    pids.sort();
    pids.dedup();
    if pids.len() != pool {
        return Err(rule2(format!(
            "{pool} fresh clients in open transactions share servers {pids:?}"
        )));
    }
    Ok(rows)
}

fn compare_fresh(baseline: &[Option<String>], rows: &[Vec<Option<String>>]) -> Res<()> {
    let mut diffs = Vec::new();
    for row in rows {
        for (i, field) in CHECK_FIELDS.iter().enumerate() {
            if row.get(i) != baseline.get(i) {
                diffs.push(format!(
                    "server pid {}: {field} = {:?} (fresh session: {:?})",
                    row.get(9).cloned().flatten().unwrap_or_default(),
                    row.get(i).cloned().flatten().unwrap_or_default(),
                    baseline.get(i).cloned().flatten().unwrap_or_default()
                ));
            }
        }
    }
    if diffs.is_empty() {
        Ok(())
    } else {
        Err(Failure {
            rule: 2,
            what: format!(
                "a fresh client does not see a fresh session: {}",
                diffs.join("; ")
            ),
        })
    }
}

fn start_sluice(cluster: &Cluster, pool: usize) -> SluiceProcess {
    ConfigBuilder::for_cluster(cluster)
        .set("pool_mode", "transaction")
        .set("default_pool_size", &pool.to_string())
        .start()
}

/// Runs `case` against a new sluice; `Err` carries the failure that counts
/// most (wrong answers before timeouts), the others appended.
async fn run_case(cluster: &Cluster, case: &Case) -> Res<()> {
    // FUZZ_DIRECT=1 runs the clients against PostgreSQL itself: a check of
    // the model (it must pass), not of sluice.
    let direct = std::env::var_os("FUZZ_DIRECT").is_some();
    let sluice = (!direct).then(|| start_sluice(cluster, case.pool));
    let port = sluice.as_ref().map_or(cluster.port(), SluiceProcess::port);
    let baseline = fresh_servers(port, case.pool).await.map_err(|f| Failure {
        what: format!("before the case: {}", f.what),
        ..f
    })?;
    compare_fresh(&baseline[0], &baseline[1..]).map_err(|f| Failure {
        what: format!("fresh servers differ before the case: {}", f.what),
        ..f
    })?;
    let defaults = Defaults {
        work_mem: baseline[0][8].clone().unwrap_or_default(),
        login: APP_USER.to_owned(),
    };
    let runs = case
        .clients
        .iter()
        .map(|(cid, ops)| run_client(port, *cid, ops, &defaults));
    let all = join_all(runs);
    let watched = async {
        let mut all = std::pin::pin!(all);
        if std::env::var_os("FUZZ_VERBOSE").is_none() {
            return all.await;
        }
        tokio::select! {
            r = &mut all => return r,
            () = tokio::time::sleep(read_timeout() / 2) => {}
        }
        let su = superuser_connect(cluster, "postgres").await;
        let rows = su
            .simple_query(
                "select pid, state, wait_event_type, wait_event, backend_xid, query \
                 from pg_stat_activity where datname = 'postgres' and pid <> pg_backend_pid()",
            )
            .await
            .unwrap();
        for row in rows {
            if let tokio_postgres::SimpleQueryMessage::Row(r) = row {
                let cols: Vec<_> = (0..6).map(|i| r.get(i).unwrap_or("").to_owned()).collect();
                eprintln!("activity: {cols:?}");
            }
        }
        all.await
    };
    let results = tokio::time::timeout(CASE_DEADLINE, watched)
        .await
        .map_err(|_| Failure {
            rule: 3,
            what: format!("the case did not finish within {CASE_DEADLINE:?}"),
        })?;
    let mut failures: Vec<Failure> = results.into_iter().filter_map(Result::err).collect();
    if let Some(sluice) = &sluice
        && !failures.is_empty()
        && std::env::var_os("FUZZ_VERBOSE").is_some()
    {
        eprintln!("--- sluice log ---\n{}\n---", sluice.log_tail(60));
    }
    if !failures.is_empty() {
        failures.sort_by_key(|f| f.rule == 3);
        let mut first = failures[0].clone();
        for other in &failures[1..] {
            first
                .what
                .push_str(&format!("\n    also (rule {}): {}", other.rule, other.what));
        }
        return Err(first);
    }
    let after = fresh_servers(port, case.pool).await?;
    compare_fresh(&baseline[0], &after)?;
    drop(sluice);
    Ok(())
}

// ---------------------------------------------------------------------------
// Generating cases.

struct Gen<'a> {
    rng: &'a mut Rng,
    cid: usize,
    req: u32,
    txn: Txn,
    named: [bool; 3],
    prep: [bool; 3],
    cursors: [bool; 3],
    temp: bool,
}

impl Gen<'_> {
    fn tok(&mut self) -> String {
        self.req += 1;
        format!("c{}-r{}", self.cid, self.req)
    }

    fn kb(&mut self) -> u32 {
        // Never a multiple of 1024, so PostgreSQL shows it as written.
        1100 + 10 * u32::try_from(self.cid).unwrap() + u32::try_from(self.rng.below(10)).unwrap()
    }

    fn reset(&mut self) {
        self.txn = Txn::Idle;
        self.named = [false; 3];
        self.end_txn();
    }

    fn end_txn(&mut self) {
        self.txn = Txn::Idle;
        self.prep = [false; 3];
        self.cursors = [false; 3];
        self.temp = false;
    }

    fn failed(&mut self) {
        if self.txn == Txn::Block {
            self.txn = Txn::Failed;
        }
    }

    fn stmt(&mut self) -> Stmt {
        let block = self.txn == Txn::Block;
        loop {
            let s = match self.rng.below(24) {
                0..=2 => Stmt::Select(self.tok()),
                3 | 4 => Stmt::Probe(self.tok()),
                5 => {
                    self.failed();
                    Stmt::Fail(self.rng.pick(&[
                        FailKind::DivZero,
                        FailKind::Syntax,
                        FailKind::NoTable,
                    ]))
                }
                6 => Stmt::WorkMem {
                    kb: self.kb(),
                    local: block && self.rng.pct(40),
                },
                7 => Stmt::WorkMemCfg {
                    tok: self.tok(),
                    kb: self.kb(),
                    local: block && self.rng.pct(40),
                },
                8 if self.rng.pct(50) => Stmt::ResetWorkMem,
                8 => Stmt::ResetAll,
                9 => Stmt::Role(self.rng.pct(60)),
                10 => Stmt::Other(self.rng.pick(&OTHER_SETTINGS)),
                11 => {
                    let sneak = match self.rng.below(5) {
                        0 => Sneak::WorkMem(self.kb()),
                        1 => Sneak::Role,
                        2 => Sneak::DoBlock,
                        3 => Sneak::Temp,
                        _ => Sneak::Lock(7 + u32::try_from(self.rng.below(2)).unwrap()),
                    };
                    Stmt::Sneaky(self.tok(), sneak)
                }
                12 if block => {
                    let q = 1 + self.rng.below(2) as usize;
                    self.prep[q] = true;
                    Stmt::Prepare(q as u8)
                }
                13 if block => {
                    let q = 1 + self.rng.below(2) as usize;
                    if !self.prep[q] {
                        continue;
                    }
                    if self.rng.pct(25) {
                        self.prep[q] = false;
                        Stmt::Dealloc(q as u8)
                    } else {
                        Stmt::ExecPrep(q as u8, self.tok())
                    }
                }
                14 if block => {
                    let k = 1 + self.rng.below(2) as usize;
                    if self.cursors[k] {
                        continue;
                    }
                    self.cursors[k] = true;
                    Stmt::Declare {
                        k: k as u8,
                        hold: self.rng.pct(40),
                        tok: self.tok(),
                    }
                }
                15 if block => {
                    let k = 1 + self.rng.below(2) as usize;
                    if !self.cursors[k] {
                        continue;
                    }
                    if self.rng.pct(25) {
                        self.cursors[k] = false;
                        Stmt::CloseCursor(k as u8)
                    } else {
                        Stmt::Fetch {
                            k: k as u8,
                            n: 1 + self.rng.below(2) as u8,
                        }
                    }
                }
                16 if block => {
                    self.temp = true;
                    Stmt::TempCreate
                }
                17 if self.temp && self.rng.pct(50) => Stmt::TempInsert(self.tok()),
                17 if self.temp => Stmt::TempSelect(self.tok()),
                18 if block && self.rng.pct(30) => Stmt::TempAs(self.tok()),
                19 => Stmt::Lock(self.tok(), 7 + u32::try_from(self.rng.below(2)).unwrap()),
                20 => Stmt::Unlock(self.tok()),
                21 if self.rng.pct(70) => Stmt::Listen(self.cid),
                21 => Stmt::Unlisten,
                22 => Stmt::Notify(self.cid, self.tok()),
                23 => Stmt::CopyOut(self.tok()),
                _ => continue,
            };
            return s;
        }
    }

    fn txn_stmt(&mut self) -> Stmt {
        match self.txn {
            Txn::Idle => {
                self.txn = Txn::Block;
                Stmt::Begin
            }
            _ => {
                let commit = self.rng.pct(60);
                self.end_txn();
                if commit { Stmt::Commit } else { Stmt::Rollback }
            }
        }
    }

    fn ext(&mut self) -> Op {
        let mut parts = Vec::new();
        for _ in 0..self.rng.range(1, 3) {
            match self.rng.below(7) {
                0..=2 => {
                    let i = 1 + self.rng.below(2) as usize;
                    let name = format!("s{i}");
                    if !self.named[i] || self.rng.pct(15) {
                        if self.named[i] {
                            self.failed();
                        }
                        let tpl = self.rng.below(4) as u8;
                        parts.push(Part::Parse(name.clone(), Text::Tpl(tpl)));
                        self.named[i] = true;
                    }
                    let tok = self.tok();
                    parts.push(Part::Bind(name, Some(tok)));
                    if self.rng.pct(30) {
                        parts.push(Part::DescribePortal);
                    }
                    parts.push(Part::Execute);
                }
                3 => {
                    let tpl = self.rng.below(4) as u8;
                    parts.push(Part::Parse(String::new(), Text::Tpl(tpl)));
                    if self.rng.pct(20) {
                        parts.push(Part::DescribeStmt(String::new()));
                    }
                    let tok = self.tok();
                    parts.push(Part::Bind(String::new(), Some(tok)));
                    parts.push(Part::Execute);
                }
                4 => {
                    let s = match self.rng.below(10) {
                        0 | 1 => Stmt::Select(self.tok()),
                        2 => Stmt::Probe(self.tok()),
                        3 => {
                            self.failed();
                            Stmt::Fail(self.rng.pick(&[FailKind::DivZero, FailKind::NoTable]))
                        }
                        4 => self.txn_stmt(),
                        5 => Stmt::WorkMem {
                            kb: self.kb(),
                            local: false,
                        },
                        6 => Stmt::Role(self.rng.pct(50)),
                        7 => Stmt::CopyOut(self.tok()),
                        8 => Stmt::Lock(self.tok(), 7),
                        _ => Stmt::Other(self.rng.pick(&OTHER_SETTINGS)),
                    };
                    parts.push(Part::Parse(String::new(), Text::Sql(s)));
                    parts.push(Part::Bind(String::new(), None));
                    if self.rng.pct(20) {
                        parts.push(Part::DescribePortal);
                    }
                    parts.push(Part::Execute);
                }
                5 => {
                    let i = 1 + self.rng.below(2) as usize;
                    parts.push(Part::DescribeStmt(format!("s{i}")));
                }
                _ => {
                    let i = 1 + self.rng.below(2) as usize;
                    self.named[i] = false;
                    parts.push(Part::Close(format!("s{i}")));
                }
            }
        }
        let flush_at = self
            .rng
            .pct(25)
            .then(|| self.rng.below(parts.len() as u64 + 1) as usize);
        Op::Ext { parts, flush_at }
    }

    fn copy_in(&mut self, wait: bool) -> Op {
        let fail = self.rng.pct(20);
        if fail {
            self.failed();
        }
        Op::CopyIn {
            tok: self.tok(),
            rows: self.rng.below(4) as u8,
            fail,
            wait,
        }
    }

    fn stray(&mut self) -> Stray {
        match self.rng.below(20) {
            0..=6 => Stray::Sync,
            7..=9 => Stray::Flush,
            10..=14 => Stray::CopyDone,
            15..=17 => Stray::CopyFail,
            _ => Stray::CopyData,
        }
    }

    /// A step that can be sent without waiting for anything in between.
    fn packable(&mut self) -> Op {
        match self.rng.below(10) {
            0..=3 => Op::Simple(vec![self.stmt()]),
            4 | 5 => self.ext(),
            6 => self.copy_in(false),
            7 => Op::Simple(vec![self.txn_stmt()]),
            _ => Op::Stray(self.stray()),
        }
    }

    fn op(&mut self, last: bool) -> Op {
        if self.txn == Txn::Failed {
            return match self.rng.below(10) {
                0..=6 => Op::Simple(vec![self.txn_stmt()]),
                7 => Op::Simple(vec![self.stmt()]),
                _ => {
                    let end = self.txn_stmt();
                    Op::Ext {
                        parts: vec![
                            Part::Parse(String::new(), Text::Sql(end)),
                            Part::Bind(String::new(), None),
                            Part::Execute,
                        ],
                        flush_at: None,
                    }
                }
            };
        }
        match self.rng.below(100) {
            0..=17 => Op::Simple(vec![self.stmt()]),
            18..=24 => {
                let n = self.rng.range(2, 3);
                Op::Simple((0..n).map(|_| self.stmt()).collect())
            }
            25..=39 => self.ext(),
            40..=44 => {
                let wait = self.rng.pct(60);
                self.copy_in(wait)
            }
            45..=50 => Op::Stray(self.stray()),
            51..=60 => {
                let n = self.rng.range(2, 4);
                Op::Pipeline((0..n).map(|_| self.packable()).collect())
            }
            61..=74 => {
                let in_block = self.txn == Txn::Block;
                let end = Op::Simple(vec![self.txn_stmt()]);
                if in_block && self.rng.pct(35) {
                    // Defect 1's shape: the transaction's end, then stray
                    // messages in the same packet.
                    let mut ops = vec![end];
                    for _ in 0..self.rng.range(1, 3) {
                        ops.push(Op::Stray(self.stray()));
                    }
                    Op::Pipeline(ops)
                } else {
                    end
                }
            }
            75..=80 => Op::Sleep(self.rng.range(1, 30) as u16),
            81..=85 if !last => {
                let unread = self.rng.pct(50).then(|| Box::new(self.packable()));
                let partial = self.rng.pct(30);
                let leave = if self.rng.pct(50) {
                    Leave::Terminate
                } else {
                    Leave::Abrupt
                };
                self.reset();
                Op::Disconnect {
                    leave,
                    unread,
                    partial,
                }
            }
            _ => Op::Simple(vec![self.stmt()]),
        }
    }
}

fn generate(seed: u64) -> Case {
    let mut rng = Rng::new(seed);
    let n = rng.range(POOL_SIZE as u64 + 1, POOL_SIZE as u64 + 3) as usize;
    let mut clients = Vec::new();
    for cid in 1..=n {
        let len = rng.range(5, 18) as usize;
        let mut g = Gen {
            rng: &mut rng,
            cid,
            req: 0,
            txn: Txn::Idle,
            named: [false; 3],
            prep: [false; 3],
            cursors: [false; 3],
            temp: false,
        };
        let mut ops = Vec::new();
        for i in 0..len {
            ops.push(g.op(i + 1 == len));
        }
        if g.txn != Txn::Idle {
            if g.rng.pct(20) {
                ops.push(Op::Disconnect {
                    leave: Leave::Abrupt,
                    unread: None,
                    partial: false,
                });
            } else {
                ops.push(Op::Simple(vec![g.txn_stmt()]));
            }
        }
        clients.push((cid, ops));
    }
    Case {
        pool: POOL_SIZE,
        clients,
    }
}

// ---------------------------------------------------------------------------
// Shrinking.

/// Candidates one step smaller inside `op` (parts of pipelines, statements
/// of a Query, messages of an extended batch, the unread step of a
/// disconnect).
fn smaller_ops(op: &Op) -> Vec<Op> {
    let mut out = Vec::new();
    match op {
        Op::Pipeline(ops) => {
            for i in 0..ops.len() {
                let mut o = ops.clone();
                o.remove(i);
                out.push(if o.len() == 1 {
                    o.pop().unwrap()
                } else {
                    Op::Pipeline(o)
                });
            }
            for (i, inner) in ops.iter().enumerate() {
                for smaller in smaller_ops(inner) {
                    let mut o = ops.clone();
                    o[i] = smaller;
                    out.push(Op::Pipeline(o));
                }
            }
        }
        Op::Simple(stmts) if stmts.len() > 1 => {
            for i in 0..stmts.len() {
                let mut s = stmts.clone();
                s.remove(i);
                out.push(Op::Simple(s));
            }
        }
        Op::Ext { parts, flush_at } => {
            if flush_at.is_some() {
                out.push(Op::Ext {
                    parts: parts.clone(),
                    flush_at: None,
                });
            }
            for i in 0..parts.len() {
                let mut p = parts.clone();
                p.remove(i);
                out.push(Op::Ext {
                    parts: p,
                    flush_at: flush_at.map(|f| if f > i { f - 1 } else { f }),
                });
            }
        }
        Op::Disconnect {
            leave,
            unread: Some(inner),
            partial,
        } => {
            out.push(Op::Disconnect {
                leave: *leave,
                unread: None,
                partial: false,
            });
            for smaller in smaller_ops(inner) {
                out.push(Op::Disconnect {
                    leave: *leave,
                    unread: Some(Box::new(smaller)),
                    partial: *partial,
                });
            }
        }
        Op::CopyIn {
            tok,
            rows,
            fail,
            wait,
        } if *rows > 0 => out.push(Op::CopyIn {
            tok: tok.clone(),
            rows: 0,
            fail: *fail,
            wait: *wait,
        }),
        _ => {}
    }
    out
}

struct Shrinker<'a> {
    cluster: &'a Cluster,
    rule: u8,
    deadline: Instant,
    runs: usize,
}

impl Shrinker<'_> {
    /// Whether `case` still fails by the same rule (two tries: interleavings
    /// vary between runs).
    async fn fails(&mut self, case: &Case) -> Option<Failure> {
        for _ in 0..2 {
            if Instant::now() >= self.deadline {
                return None;
            }
            self.runs += 1;
            if let Err(f) = run_case(self.cluster, case).await
                && f.rule == self.rule
            {
                return Some(f);
            }
        }
        None
    }

    async fn shrink(&mut self, mut best: Case, mut failure: Failure) -> (Case, Failure) {
        loop {
            let mut progress = false;
            // Whole clients.
            let mut c = best.clients.len();
            while c > 0 && best.clients.len() > 1 {
                c -= 1;
                let mut cand = best.clone();
                cand.clients.remove(c);
                if let Some(f) = self.fails(&cand).await {
                    (best, failure, progress) = (cand, f, true);
                }
            }
            // Chunks of steps, halves first.
            for c in 0..best.clients.len() {
                let mut chunk = best.clients[c].1.len().div_ceil(2);
                while chunk >= 1 {
                    let mut start = 0;
                    while start < best.clients[c].1.len() {
                        let mut cand = best.clone();
                        let ops = &mut cand.clients[c].1;
                        let end = (start + chunk).min(ops.len());
                        ops.drain(start..end);
                        if let Some(f) = self.fails(&cand).await {
                            (best, failure, progress) = (cand, f, true);
                        } else {
                            start += chunk;
                        }
                    }
                    chunk /= 2;
                }
            }
            // Inside steps.
            for c in 0..best.clients.len() {
                let mut i = 0;
                while i < best.clients[c].1.len() {
                    let mut improved = false;
                    for smaller in smaller_ops(&best.clients[c].1[i]) {
                        let mut cand = best.clone();
                        cand.clients[c].1[i] = smaller;
                        if let Some(f) = self.fails(&cand).await {
                            (best, failure, progress, improved) = (cand, f, true, true);
                            break;
                        }
                    }
                    if !improved {
                        i += 1;
                    }
                }
            }
            if !progress || Instant::now() >= self.deadline {
                return (best, failure);
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Tests.

fn fuzz_cluster() -> Cluster {
    let cluster = app_cluster(ServerAuth::Trust);
    for sql in SETUP_SQL {
        cluster
            .psql("postgres", sql)
            .unwrap_or_else(|e| panic!("setup {sql:?}: {e}"));
    }
    cluster
}

fn env_u64(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    let value = value.trim();
    let parsed = match value.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => value.parse(),
    };
    Some(parsed.unwrap_or_else(|_| panic!("{name}={value:?} is not a number")))
}

fn rule_name(rule: u8) -> &'static str {
    match rule {
        1 => "rule 1: every answer is the client's own, in order",
        2 => "rule 2: a fresh client sees a fresh session",
        _ => "rule 3: no client waits forever",
    }
}

#[tokio::test]
async fn differential_protocol_fuzz() {
    let seed = env_u64("FUZZ_SEED").unwrap_or(DEFAULT_SEED);
    let cases = env_u64("FUZZ_CASES").unwrap_or(DEFAULT_CASES);
    let shrink_secs = env_u64("FUZZ_SHRINK_SECS").unwrap_or(DEFAULT_SHRINK_SECS);
    let keep_going = std::env::var_os("FUZZ_KEEP_GOING").is_some_and(|v| v != "0");
    let cluster = fuzz_cluster();
    let started = Instant::now();
    let mut reports = Vec::new();
    for i in 0..cases {
        let case_seed = seed.wrapping_add(i);
        let case = generate(case_seed);
        let Err(failure) = run_case(&cluster, &case).await else {
            continue;
        };
        eprintln!(
            "fuzz: case {i} (seed {case_seed}) failed, {}: {}\nshrinking (up to {shrink_secs} s)…",
            rule_name(failure.rule),
            failure.what
        );
        let mut shrinker = Shrinker {
            cluster: &cluster,
            rule: failure.rule,
            deadline: Instant::now() + Duration::from_secs(shrink_secs),
            runs: 0,
        };
        let (shrunk, failure) = shrinker.shrink(case, failure).await;
        let report = format!(
            "case seed {case_seed} (replay: FUZZ_SEED={case_seed} FUZZ_CASES=1), {}\n  {}\nshrunk sequence ({} runs while shrinking):\n{}",
            rule_name(failure.rule),
            failure.what,
            shrinker.runs,
            shrunk.describe()
        );
        eprintln!("fuzz: FAILURE {report}");
        reports.push(report);
        if !keep_going {
            break;
        }
    }
    eprintln!(
        "fuzz: {cases} cases from seed {seed} in {:.1?}, {} failing",
        started.elapsed(),
        reports.len()
    );
    assert!(
        reports.is_empty(),
        "the protocol fuzzer found {} failing case(s) (FUZZ_SEED={seed}, FUZZ_CASES={cases}):\n\n{}",
        reports.len(),
        reports.join("\n\n")
    );
}

// Fixed regression cases for known defects, on a pool of one server so the
// clients take turns on the same PostgreSQL backend.

fn q(stmts: Vec<Stmt>) -> Op {
    Op::Simple(stmts)
}

fn sel(cid: usize, r: u32) -> Stmt {
    Stmt::Select(format!("c{cid}-r{r}"))
}

const CLOSE: Op = Op::Disconnect {
    leave: Leave::Abrupt,
    unread: None,
    partial: false,
};

async fn run_fixed(clients: Vec<(usize, Vec<Op>)>) {
    let cluster = fuzz_cluster();
    let case = Case { pool: 1, clients };
    if let Err(f) = run_case(&cluster, &case).await {
        panic!(
            "{}\n  {}\nsequence:\n{}",
            rule_name(f.rule),
            f.what,
            case.describe()
        );
    }
}

/// Defect 1: after its transaction a client sends Sync then CopyDone in one
/// packet while another client waits for the server: the Sync's
/// ReadyForQuery must not reach the waiting client.
#[tokio::test]
async fn regression_sync_and_copydone_after_commit_do_not_shift_replies() {
    run_fixed(vec![
        (
            1,
            vec![
                q(vec![Stmt::Begin]),
                q(vec![sel(1, 1)]),
                Op::Sleep(300),
                q(vec![Stmt::Commit]),
                // After the transaction, one packet: Sync, then CopyDone
                // with no COPY running (PostgreSQL answers the Sync only).
                Op::Pipeline(vec![Op::Stray(Stray::Sync), Op::Stray(Stray::CopyDone)]),
                q(vec![sel(1, 2)]),
            ],
        ),
        (
            2,
            vec![
                Op::Sleep(100),
                q(vec![sel(2, 1)]),
                q(vec![sel(2, 2)]),
                q(vec![sel(2, 3)]),
            ],
        ),
    ])
    .await;
}

/// Defect 4: `BEGIN; PREPARE p AS select 1;` then disconnect: the server
/// gets DEALLOCATE ALL, and others' protocol statements must still work.
#[tokio::test]
async fn regression_prepare_in_abandoned_transaction_keeps_others_statements() {
    let bind = |r: u32| {
        vec![
            Part::Bind("s1".into(), Some(format!("c1-r{r}"))),
            Part::Execute,
        ]
    };
    let mut first = vec![Part::Parse("s1".into(), Text::Tpl(0))];
    first.extend(bind(1));
    run_fixed(vec![
        (
            1,
            vec![
                Op::Ext {
                    parts: first,
                    flush_at: None,
                },
                Op::Sleep(500),
                Op::Ext {
                    parts: bind(2),
                    flush_at: None,
                },
                Op::Ext {
                    parts: vec![
                        Part::Parse("s2".into(), Text::Tpl(0)),
                        Part::Bind("s2".into(), Some("c1-r3".into())),
                        Part::Execute,
                    ],
                    flush_at: None,
                },
            ],
        ),
        (
            2,
            vec![
                Op::Sleep(150),
                q(vec![Stmt::Begin]),
                q(vec![Stmt::Prepare(1)]),
                CLOSE,
            ],
        ),
    ])
    .await;
}

/// Defect 3: `SET ROLE other; BEGIN; SET LOCAL statement_timeout = 1000;`
/// then disconnect: the next client must run as itself.
#[tokio::test]
async fn regression_role_does_not_survive_an_abandoned_transaction() {
    run_fixed(vec![
        (
            1,
            vec![
                q(vec![Stmt::Role(true)]),
                q(vec![Stmt::Begin]),
                q(vec![Stmt::Other("set local statement_timeout = 1000")]),
                CLOSE,
            ],
        ),
        (
            2,
            vec![Op::Sleep(300), q(vec![Stmt::Probe("c2-r1".into())])],
        ),
    ])
    .await;
}

/// Defect 4: a committed WITH HOLD cursor must not outlive its client.
#[tokio::test]
async fn regression_cursor_with_hold_does_not_outlive_its_client() {
    run_fixed(vec![(
        1,
        vec![
            q(vec![Stmt::Begin]),
            q(vec![Stmt::Declare {
                k: 1,
                hold: true,
                tok: "c1-r1".into(),
            }]),
            q(vec![Stmt::Commit]),
            CLOSE,
        ],
    )])
    .await;
}
