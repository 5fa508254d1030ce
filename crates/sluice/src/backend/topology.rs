//! What sluice knows of the servers behind one database entry: each host's
//! role, health and replay position, and how far each replica lags behind
//! the primary in bytes and in time. Pure state, fed by `monitor` samples
//! and read by the router when a transaction may go to a replica.
//!
//! Lag in time is measured honestly: the primary's WAL position is sampled
//! every check period and kept with its time; a replica that has replayed
//! up to position P lags by the time since the last primary sample at or
//! before P (an upper bound, within one period). An idle primary writes no
//! WAL, so a caught-up replica of an idle primary lags 0, not "time since
//! the last transaction".

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use sluice_router::Classifier;

use super::target::ServerAddr;

/// Primary samples kept for the lag-in-time estimate.
const HISTORY: usize = 2048;

/// Most hosts a topology learns from Patroni's member list: beyond it, a
/// new member takes the place of one Patroni no longer lists.
pub const MAX_HOSTS: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Unknown,
    Primary,
    Replica,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Unknown => "unknown",
            Role::Primary => "primary",
            Role::Replica => "replica",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    /// Not checked yet.
    Unknown,
    Up,
    /// Out of rotation until `threshold` checks in a row pass.
    Down,
}

impl Health {
    pub fn name(self) -> &'static str {
        match self {
            Health::Unknown => "unknown",
            Health::Up => "up",
            Health::Down => "down",
        }
    }
}

/// One check's result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    pub in_recovery: bool,
    /// Primary: current WAL insert position; replica: last replayed.
    pub lsn: Option<u64>,
    pub timeline: Option<u32>,
    /// The server's WAL page size (`wal_block_size`).
    pub wal_block: u64,
}

/// What is known of one host.
#[derive(Debug, Clone)]
pub struct HostState {
    pub addr: ServerAddr,
    pub role: Role,
    pub health: Health,
    pub timeline: Option<u32>,
    pub lsn: Option<u64>,
    pub lag_bytes: Option<u64>,
    pub lag: Option<Duration>,
    pub last_check: Option<SystemTime>,
    pub last_error: Option<String>,
    /// The host's role as Patroni reports it (`leader`, `replica`, …),
    /// where the database names its Patroni.
    pub patroni_role: Option<String>,
    /// Whether the host may serve: always for hosts the entry names; for
    /// hosts learnt from Patroni, while its member list has them.
    pub listed: bool,
    fails: u32,
    passes: u32,
}

impl HostState {
    /// Its health, or `left` for a member Patroni no longer lists.
    pub fn state_name(&self) -> &'static str {
        if self.listed {
            self.health.name()
        } else {
            "left"
        }
    }

    fn new(addr: ServerAddr) -> Self {
        Self {
            addr,
            role: Role::Unknown,
            health: Health::Unknown,
            timeline: None,
            lsn: None,
            lag_bytes: None,
            lag: None,
            last_check: None,
            last_error: None,
            patroni_role: None,
            listed: true,
            fails: 0,
            passes: 0,
        }
    }
}

/// A change worth a log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Health(Health, Health),
    Role(Role, Role),
}

/// A member of a Patroni cluster, from `GET /cluster`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub name: String,
    /// `leader`, `standby_leader`, `replica`, `sync_standby`, …
    pub role: String,
    pub state: String,
    pub host: String,
    pub port: u16,
}

/// What Patroni says of the leader.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Leader {
    /// No Patroni configured, or no answer for a while: the hosts' own
    /// checks decide alone.
    Unknown,
    /// Patroni names no leader (between two holders of the key).
    None,
    /// The member holding the leader key: (name, host, port).
    Member(String, String, u16),
}

/// Limits a replica must meet to serve reads.
#[derive(Debug, Clone, Copy)]
pub struct LagLimits {
    pub bytes: u64,
    pub time: Duration,
}

/// What a Patroni member list changed in the hosts of a topology that
/// learns them from it.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct MemberNews {
    /// Hosts added at the end (their checks must start).
    pub added: std::ops::Range<usize>,
    /// Places taken over by a new member (their pools must follow).
    pub readdressed: Vec<usize>,
    /// One line per member that joined or left, for the log.
    pub log: Vec<String>,
}

/// The hosts of one database entry.
pub struct Topology {
    pub database: String,
    /// Patroni REST API addresses (`host:port`) of the cluster, if any.
    pub patroni: Vec<String>,
    /// The hosts the entry names (the first ones); an entry that names
    /// none but names a Patroni learns its hosts from Patroni's members.
    configured: Vec<ServerAddr>,
    /// Whether reads go to replicas (`route_reads`); without it, a
    /// topology only follows the primary (an entry whose hosts are
    /// Patroni's members).
    pub reads: bool,
    state: Mutex<State>,
    /// The classifier with this database's own functions known not to
    /// write (from pg_proc), and when they were last read.
    classifier: std::sync::RwLock<(Option<Arc<Classifier>>, Option<Instant>)>,
    next: AtomicU64,
    /// The primary's WAL page size, as its last check said.
    wal_block: AtomicU64,
    /// Transactions routed to a replica, and reads that went to the
    /// primary because no replica qualified.
    pub reads_on_replicas: AtomicU64,
    pub reads_on_primary: AtomicU64,
    /// Reads a replica refused (25006) or lost, run again on the primary:
    /// misclassified statements show here.
    pub replica_retries: AtomicU64,
    /// `read_your_writes = database`: when the newest transaction that may
    /// have written ended on the primary (nanoseconds after `born`, 0:
    /// none yet), set before its last reply is passed on.
    write_end: AtomicU64,
    /// When a replica last failed to replay a read's position within the
    /// wait (nanoseconds after `born`, 0: never).
    replay_missed: AtomicU64,
    /// Reads held until a replica replays further than its last check
    /// showed (`replay_waiter`): while any is, the replicas' checks run
    /// back to back (`monitor.rs`), woken by `replay_wake`.
    replay_waiters: AtomicU64,
    replay_wake: Arc<tokio::sync::Notify>,
    born: Instant,
}

/// A read held for a replica's replay (`Topology::replay_waiter`).
pub struct ReplayWaiter(Arc<Topology>);

impl Drop for ReplayWaiter {
    fn drop(&mut self) {
        self.0.replay_waiters.fetch_sub(1, Ordering::AcqRel);
    }
}

/// How long a transaction left unanswered (its client gone after
/// COMMIT) may still commit, as far as reads are concerned: a commit
/// that takes longer (a synchronous standby that does not answer) may be
/// missed by a read on a replica.
const WRITE_DOUBT: Duration = Duration::from_secs(1);

/// How long after a replica missed a read's position reads that need
/// more than the checks show go to the primary without waiting for a
/// replica.
const REPLAY_BACKOFF: Duration = Duration::from_millis(100);

struct State {
    hosts: Vec<HostState>,
    /// (time, position) of primary samples, oldest first.
    primary_history: VecDeque<(Instant, u64)>,
    /// The primary (host, timeline) those samples are of: another one
    /// starts a new history.
    history_of: Option<(usize, Option<u32>)>,
    /// Patroni's leader, and when Patroni last answered.
    leader: Leader,
    leader_at: Option<Instant>,
    /// Members past `MAX_HOSTS` left out at the last member list.
    unfollowed: usize,
    /// The newest position a client's server read after its write
    /// (`pg_current_wal_insert_lsn()` as a commit position), and when that
    /// read was sent: it covers every commit that ended before then.
    measured: Option<(Instant, u64)>,
}

impl State {
    /// The one primary that is up, on the newest timeline.
    fn primary(&self) -> Option<usize> {
        let mut best: Option<(usize, &HostState)> = None;
        let mut tie = false;
        for (i, h) in self.hosts.iter().enumerate() {
            if h.role != Role::Primary || h.health != Health::Up || !h.listed {
                continue;
            }
            // Where Patroni speaks, only its leader may take writes.
            match &self.leader {
                Leader::Unknown => {}
                Leader::None => return None,
                Leader::Member(_, host, port) => {
                    if !matches!(&h.addr, ServerAddr::Tcp { host: a, port: p } if a == host && p == port)
                    {
                        continue;
                    }
                }
            }
            match best {
                None => best = Some((i, h)),
                Some((_, b)) if h.timeline > b.timeline => {
                    best = Some((i, h));
                    tie = false;
                }
                Some((_, b)) if h.timeline == b.timeline => tie = true,
                Some(_) => {}
            }
        }
        if tie { None } else { best.map(|(i, _)| i) }
    }
}

impl Topology {
    pub fn new(database: String, addrs: Vec<ServerAddr>, patroni: Vec<String>) -> Self {
        Self {
            database,
            patroni,
            configured: addrs.clone(),
            reads: true,
            state: Mutex::new(State {
                hosts: addrs.into_iter().map(HostState::new).collect(),
                primary_history: VecDeque::new(),
                history_of: None,
                leader: Leader::Unknown,
                leader_at: None,
                unfollowed: 0,
                measured: None,
            }),
            classifier: std::sync::RwLock::new((None, None)),
            next: AtomicU64::new(0),
            wal_block: AtomicU64::new(DEFAULT_WAL_BLOCK),
            reads_on_replicas: AtomicU64::new(0),
            reads_on_primary: AtomicU64::new(0),
            replica_retries: AtomicU64::new(0),
            write_end: AtomicU64::new(0),
            replay_missed: AtomicU64::new(0),
            replay_waiters: AtomicU64::new(0),
            replay_wake: Arc::new(tokio::sync::Notify::new()),
            born: Instant::now(),
        }
    }

    /// The same, sending reads to replicas or not.
    pub fn with_reads(mut self, reads: bool) -> Self {
        self.reads = reads;
        self
    }

    /// The classifier with this database's own functions that cannot
    /// write (`None`: it has none, the built-in list is all).
    pub fn classifier(&self) -> Option<Arc<Classifier>> {
        self.classifier
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .0
            .clone()
    }

    /// Whether the database's functions were read less than `every` ago.
    pub fn functions_fresh(&self, every: Duration) -> bool {
        let c = self.classifier.read().unwrap_or_else(|p| p.into_inner());
        c.1.is_some_and(|at| at.elapsed() < every)
    }

    /// Functions of this database that cannot write (pg_proc rows of
    /// schema, name, and whether every overload is STABLE or IMMUTABLE):
    /// a name is trusted only if no function of that name may write,
    /// qualified within its schema and unqualified across all schemas.
    pub fn set_functions(&self, rows: &[(String, String, bool)]) {
        let mut qualified = Vec::new();
        let mut unqualified: std::collections::HashMap<&str, bool> =
            std::collections::HashMap::new();
        for (schema, name, read_only) in rows {
            // A bare call of a built-in's name is the built-in: only the
            // classifier's own list speaks for it.
            let built_in = schema == "pg_catalog";
            if *read_only && !built_in {
                qualified.push(format!("{schema}.{name}"));
            }
            *unqualified.entry(name.as_str()).or_insert(true) &= *read_only && !built_in;
        }
        let names: Vec<String> = qualified
            .into_iter()
            .chain(
                unqualified
                    .into_iter()
                    .filter(|(_, ok)| *ok)
                    .map(|(n, _)| n.to_owned()),
            )
            .collect();
        let classifier = (!names.is_empty())
            .then(|| Arc::new(Classifier::default().with_read_only_functions(names)));
        *self.classifier.write().unwrap_or_else(|p| p.into_inner()) =
            (classifier, Some(Instant::now()));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn hosts(&self) -> Vec<HostState> {
        self.lock().hosts.clone()
    }

    /// Some host has been checked (passed or failed a check).
    pub fn checked(&self) -> bool {
        self.lock().hosts.iter().any(|h| h.last_check.is_some())
    }

    pub fn len(&self) -> usize {
        self.lock().hosts.len()
    }

    /// Whether `addr` is one of the hosts, in rotation (not a member
    /// Patroni has dropped).
    pub fn is_listed(&self, addr: &ServerAddr) -> bool {
        self.lock()
            .hosts
            .iter()
            .any(|h| h.addr == *addr && h.listed)
    }

    /// The hosts the entry names (RELOAD compares them).
    pub fn configured(&self) -> &[ServerAddr] {
        &self.configured
    }

    /// Whether the hosts are Patroni's members (the entry names none).
    pub fn learns_hosts(&self) -> bool {
        self.configured.is_empty() && !self.patroni.is_empty()
    }

    /// Follows Patroni's member list where the hosts are learnt from it:
    /// a new member is added (or, past `MAX_HOSTS`, takes the place of a
    /// member Patroni no longer lists); a member no longer listed leaves
    /// rotation at once and comes back when listed again.
    pub fn follow_members(&self, members: &[Member]) -> MemberNews {
        let mut news = MemberNews::default();
        if !self.learns_hosts() {
            return news;
        }
        let mut st = self.lock();
        let first_new = st.hosts.len();
        news.added = first_new..first_new;
        let addr_of = |m: &Member| {
            // Patroni's connect addresses are TCP; anything else is not
            // taken from it.
            (!m.host.is_empty() && !m.host.starts_with('/')).then(|| ServerAddr::Tcp {
                host: m.host.clone(),
                port: m.port,
            })
        };
        // Leaders first: past the cap, a leader is still followed.
        let mut wanted: Vec<(&Member, ServerAddr)> = members
            .iter()
            .filter_map(|m| Some((m, addr_of(m)?)))
            .collect();
        wanted.sort_by_key(|(m, _)| !is_leader(m));
        for h in &mut st.hosts {
            let listed = wanted.iter().any(|(_, a)| *a == h.addr);
            if h.listed && !listed {
                news.log
                    .push(format!("{} is no longer a member: out of rotation", h.addr));
            }
            h.listed = listed;
        }
        let mut unfollowed = 0;
        for (m, addr) in wanted {
            if st.hosts.iter().any(|h| h.addr == addr) {
                continue;
            }
            let line = format!("member {} ({addr}) joins the hosts", m.name);
            if st.hosts.len() < MAX_HOSTS {
                st.hosts.push(HostState::new(addr));
                news.added.end = st.hosts.len();
            } else if let Some(i) = st.hosts.iter().position(|h| !h.listed) {
                st.hosts[i] = HostState::new(addr);
                if st.history_of.is_some_and(|(p, _)| p == i) {
                    st.primary_history.clear();
                    st.history_of = None;
                    st.measured = None;
                }
                news.readdressed.push(i);
            } else {
                unfollowed += 1;
                continue;
            }
            news.log.push(line);
        }
        // (said once, not every period)
        if unfollowed != st.unfollowed {
            st.unfollowed = unfollowed;
            if unfollowed > 0 {
                news.log.push(format!(
                    "{unfollowed} member(s) not followed: {MAX_HOSTS} hosts already"
                ));
            }
        }
        news
    }

    /// Records a check of host `i` taken at `at` (`Err`: it failed, with
    /// why); returns what changed.
    #[cfg(test)]
    pub fn record(
        &self,
        i: usize,
        result: Result<Sample, String>,
        at: Instant,
        threshold: u32,
    ) -> Vec<Change> {
        self.record_for(i, None, result, at, threshold)
    }

    /// `record`, of the check of host `i` at `addr` when given: a check of
    /// a place another member has taken since (Patroni's members) is
    /// dropped.
    pub fn record_for(
        &self,
        i: usize,
        addr: Option<&ServerAddr>,
        result: Result<Sample, String>,
        at: Instant,
        threshold: u32,
    ) -> Vec<Change> {
        let block = result
            .as_ref()
            .ok()
            .filter(|s| !s.in_recovery)
            .map(|s| s.wal_block);
        let mut st = self.lock();
        if addr.is_some_and(|a| st.hosts.get(i).is_none_or(|h| h.addr != *a)) {
            return Vec::new();
        }
        let changes = record_host(&mut st, i, result, at, threshold);
        if let Some(block) = block
            && st.primary() == Some(i)
        {
            self.wal_block.store(block, Ordering::Relaxed);
        }
        // Only the settled primary's positions make the history lag is
        // measured against; a new primary (or timeline) starts it afresh.
        if let Some(p) = st.primary()
            && p == i
            && let Some(lsn) = st.hosts[i].lsn
        {
            let owner = Some((i, st.hosts[i].timeline));
            if st.history_of != owner {
                st.primary_history.clear();
                st.history_of = owner;
                // (a position of the old primary's may be one the new
                // one's replicas never reach)
                st.measured = None;
            }
            if st.primary_history.back().is_none_or(|&(_, l)| lsn >= l) {
                if st.primary_history.len() >= HISTORY {
                    st.primary_history.pop_front();
                }
                st.primary_history.push_back((at, lsn));
            }
        }
        changes
    }
}

impl Topology {
    /// Records Patroni's answer taken at `at` (`Err`: no member answered):
    /// its leader, and each host's Patroni role. A failed ask keeps the
    /// last answer for `keep_for`, then the hosts' checks decide alone.
    /// Returns what changed, for the log.
    pub fn record_patroni(
        &self,
        answer: Result<Vec<Member>, String>,
        at: Instant,
        keep_for: Duration,
    ) -> Option<String> {
        let mut st = self.lock();
        let before = st.leader.clone();
        let members = match answer {
            Ok(members) => members,
            Err(why) => {
                if st
                    .leader_at
                    .is_none_or(|t| at.saturating_duration_since(t) > keep_for)
                    && st.leader != Leader::Unknown
                {
                    st.leader = Leader::Unknown;
                    for h in &mut st.hosts {
                        h.patroni_role = None;
                    }
                    return Some(format!(
                        "no answer ({why}): roles from the hosts' checks alone"
                    ));
                }
                return None;
            }
        };
        st.leader_at = Some(at);
        let leaders: Vec<&Member> = members.iter().filter(|m| is_leader(m)).collect();
        let ours = |m: &Member| {
            st.hosts.iter().any(|h| {
                matches!(&h.addr, ServerAddr::Tcp { host, port } if *host == m.host && *port == m.port)
            })
        };
        st.leader = match leaders.as_slice() {
            [] => Leader::None,
            [m] if ours(m) => Leader::Member(m.name.clone(), m.host.clone(), m.port),
            // Hosts learnt from Patroni but a leader that is not among
            // them (an address sluice does not take): nobody.
            [_] if self.learns_hosts() => Leader::None,
            // A leader named otherwise than this database's hosts (a
            // configuration mistake): Patroni cannot be matched, so the
            // hosts' own checks decide, as without it.
            [_] => Leader::Unknown,
            // Patroni never reports two; if it does, nobody is.
            _ => Leader::None,
        };
        for h in &mut st.hosts {
            h.patroni_role = members
                .iter()
                .find(|m| matches!(&h.addr, ServerAddr::Tcp { host, port } if *host == m.host && *port == m.port))
                .map(|m| m.role.clone());
        }
        if st.leader == before {
            return None;
        }
        Some(match &st.leader {
            Leader::Member(name, host, port) => format!("leader is {name} ({host}:{port})"),
            Leader::None if leaders.len() > 1 => {
                "reports more than one leader: writes wait".to_owned()
            }
            Leader::None => "no leader: writes wait".to_owned(),
            Leader::Unknown => match leaders.first() {
                Some(m) => format!(
                    "leader is {} ({}:{}), which is not among this database's hosts (by name or \
                     address): roles from the hosts' checks alone",
                    m.name, m.host, m.port
                ),
                None => "unknown".to_owned(),
            },
        })
    }
}

/// Whether Patroni's role for `m` is the leader's.
fn is_leader(m: &Member) -> bool {
    m.role == "leader" || m.role == "master" || m.role == "primary"
}

/// Records a check of host `i` (see `Topology::record`).
fn record_host(
    st: &mut State,
    i: usize,
    result: Result<Sample, String>,
    at: Instant,
    threshold: u32,
) -> Vec<Change> {
    let State {
        hosts,
        primary_history,
        ..
    } = st;
    let Some(host) = hosts.get_mut(i) else {
        return Vec::new();
    };
    let mut changes = Vec::new();
    let before = host.health;
    host.last_check = Some(SystemTime::now());
    match result {
        Err(why) => {
            host.last_error = Some(why);
            host.passes = 0;
            host.fails = host.fails.saturating_add(1);
            if before != Health::Down && host.fails >= threshold.max(1) {
                host.health = Health::Down;
            }
        }
        Ok(sample) => {
            host.last_error = None;
            host.fails = 0;
            host.passes = host.passes.saturating_add(1);
            if before == Health::Unknown
                || (before == Health::Down && host.passes >= threshold.max(1))
            {
                host.health = Health::Up;
            }
            let role = if sample.in_recovery {
                Role::Replica
            } else {
                Role::Primary
            };
            if role != host.role {
                changes.push(Change::Role(host.role, role));
                host.role = role;
            }
            host.timeline = sample.timeline.or(host.timeline);
            host.lsn = sample.lsn;
            if role == Role::Primary {
                host.lag_bytes = Some(0);
                host.lag = Some(Duration::ZERO);
            } else {
                let (bytes, lag) = match sample.lsn {
                    Some(replayed) => lag_of(primary_history, replayed, at),
                    None => (None, None),
                };
                host.lag_bytes = bytes;
                host.lag = lag;
            }
        }
    }
    if host.health != before {
        changes.push(Change::Health(before, host.health));
    }
    changes
}

impl Topology {
    /// The one primary that is up (on the newest timeline when several
    /// claim it; none when that is still ambiguous).
    pub fn primary(&self) -> Option<(usize, ServerAddr)> {
        let st = self.lock();
        let i = st.primary()?;
        Some((i, st.hosts[i].addr.clone()))
    }

    /// The primary's position at its first check taken after `t`: every
    /// transaction committed before `t` is at or below it. `None` until
    /// such a check has come back.
    pub fn primary_lsn_after(&self, t: Instant) -> Option<u64> {
        let st = self.lock();
        let i = st.primary_history.partition_point(|&(at, _)| at <= t);
        st.primary_history.get(i).map(|&(_, lsn)| lsn)
    }

    /// Now, as nanoseconds after `born` (never 0).
    fn now_nanos(&self) -> u64 {
        u64::try_from(self.born.elapsed().as_nanos())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    /// `read_your_writes = database`: a transaction that may have written
    /// ended on the primary just now (called before its last reply goes
    /// to its client).
    pub fn note_write_end(&self) {
        self.write_end.fetch_max(self.now_nanos(), Ordering::AcqRel);
    }

    /// `read_your_writes = database`: a transaction that may write was
    /// left unanswered (its client or its server gone): it may still
    /// commit, so reads need a position read `WRITE_DOUBT` from now.
    pub fn note_write_end_in_doubt(&self) {
        let later = self
            .now_nanos()
            .saturating_add(WRITE_DOUBT.as_nanos() as u64);
        self.write_end.fetch_max(later, Ordering::AcqRel);
    }

    /// `read_your_writes = database`: a transaction that may have written
    /// ended here (a topology that replaces this one starts as after a
    /// commit in doubt).
    pub fn saw_writes(&self) -> bool {
        self.write_end.load(Ordering::Acquire) != 0
    }

    /// A replica did not replay a read's position within the wait.
    pub fn note_replay_missed(&self) {
        self.replay_missed
            .store(self.now_nanos(), Ordering::Relaxed);
    }

    /// Whether a read that needs more than the checks show a replica has
    /// should wait for one to replay it: not for `REPLAY_BACKOFF` after
    /// one missed (review 41: while a replica lagged, one writer made
    /// every reader wait the whole wait, in line for the replica's
    /// servers, before it went to the primary all the same).
    pub fn replay_wait_worthwhile(&self) -> bool {
        let missed = self.replay_missed.load(Ordering::Relaxed);
        missed == 0
            || Duration::from_nanos(self.now_nanos().saturating_sub(missed)) >= REPLAY_BACKOFF
    }

    /// `read_your_writes = database`: the primary's insert position
    /// `insert`, read on a client's server by a query sent at `sent`.
    pub fn note_measured(&self, sent: Instant, insert: u64) {
        let lsn = self.commit_position(insert);
        let mut st = self.lock();
        if st.measured.is_none_or(|(at, l)| sent >= at && lsn >= l) {
            st.measured = Some((sent, lsn));
        }
    }

    /// `read_your_writes = database`: the position a replica must have
    /// replayed for a read to see every write that ended before now on
    /// this database, whoever made it; `Some(None)` if none has, `None`
    /// if none that covers them is known yet (the read goes to the
    /// primary). A position read after the newest write's end covers it
    /// and every write that ended before it: a client's server's after
    /// its write, or the primary's check.
    pub fn database_position(&self) -> Option<Option<u64>> {
        let end = self.write_end.load(Ordering::Acquire);
        if end == 0 {
            return Some(None);
        }
        let end = self.born + Duration::from_nanos(end);
        let st = self.lock();
        let measured = st.measured.filter(|&(at, _)| at > end).map(|(_, lsn)| lsn);
        let i = st.primary_history.partition_point(|&(at, _)| at <= end);
        let checked = st.primary_history.get(i).map(|&(_, lsn)| lsn);
        match (measured, checked) {
            (Some(a), Some(b)) => Some(Some(a.min(b))),
            (one, other) => one.or(other).map(Some),
        }
    }

    /// A position the primary reported as its insert position (read after
    /// a client's commit), as the end of its last record: what a replica
    /// that has everything up to that commit has replayed.
    pub fn commit_position(&self, insert: u64) -> u64 {
        record_end(insert, self.wal_block.load(Ordering::Relaxed))
    }

    /// A read now waits for a replica to replay further than its checks
    /// show: they run back to back until the waiter is dropped.
    pub fn replay_waiter(self: &Arc<Self>) -> ReplayWaiter {
        self.replay_waiters.fetch_add(1, Ordering::AcqRel);
        self.replay_wake.notify_waiters();
        ReplayWaiter(self.clone())
    }

    /// Whether a read waits for a replica's replay (`replay_waiter`).
    pub fn replay_wanted(&self) -> bool {
        self.replay_waiters.load(Ordering::Acquire) > 0
    }

    /// Told when a read begins to wait for a replica's replay.
    pub fn replay_wake(&self) -> Arc<tokio::sync::Notify> {
        self.replay_wake.clone()
    }

    /// Host `i`'s address.
    pub fn addr_of(&self, i: usize) -> Option<ServerAddr> {
        self.lock().hosts.get(i).map(|h| h.addr.clone())
    }

    /// The index of the host at `addr`.
    pub fn index_of(&self, addr: &ServerAddr) -> Option<usize> {
        self.lock().hosts.iter().position(|h| h.addr == *addr)
    }

    /// Host `i`'s role as last checked.
    pub fn role_of(&self, i: usize) -> Option<Role> {
        self.lock().hosts.get(i).map(|h| h.role)
    }

    /// Host `i`'s last check found it had replayed up to `lsn` at least.
    pub fn replayed_past(&self, i: usize, lsn: u64) -> bool {
        self.lock()
            .hosts
            .get(i)
            .is_some_and(|h| h.lsn.is_some_and(|l| l >= lsn))
    }

    /// Host `i` is out of rotation: its checks failed `threshold` times
    /// in a row, or Patroni no longer lists it.
    pub fn out_of_rotation(&self, i: usize) -> bool {
        self.lock()
            .hosts
            .get(i)
            .is_none_or(|h| h.health == Health::Down || !h.listed)
    }

    /// A replica that may serve a read now: up, within `limits`, and
    /// replayed up to `min_lsn` if given; round robin among those that
    /// qualify.
    pub fn pick_replica(&self, limits: LagLimits, min_lsn: Option<u64>) -> Option<usize> {
        let st = self.lock();
        let qualifies = |h: &HostState| {
            h.role == Role::Replica
                && h.health == Health::Up
                && h.listed
                && h.lag_bytes.is_some_and(|b| b <= limits.bytes)
                && h.lag.is_some_and(|t| t <= limits.time)
                && min_lsn.is_none_or(|min| h.lsn.is_some_and(|l| l >= min))
        };
        // Two passes over a handful of hosts: no allocation per transaction.
        let n = st.hosts.iter().filter(|h| qualifies(h)).count();
        if n == 0 {
            return None;
        }
        let k = (self.next.fetch_add(1, Ordering::Relaxed) % n as u64) as usize;
        st.hosts
            .iter()
            .enumerate()
            .filter(|(_, h)| qualifies(h))
            .nth(k)
            .map(|(i, _)| i)
    }
}

/// Lag of a replica that replayed up to `replayed`, from the primary's
/// samples: bytes behind the newest, and the time since the last sample
/// the replica had caught up with (`None` before any primary sample).
fn lag_of(
    history: &VecDeque<(Instant, u64)>,
    replayed: u64,
    now: Instant,
) -> (Option<u64>, Option<Duration>) {
    let Some(&(_, newest)) = history.back() else {
        return (None, None);
    };
    if replayed >= newest {
        return (Some(0), Some(Duration::ZERO));
    }
    let bytes = newest - replayed;
    // The first sample beyond what was replayed: the replica has
    // everything up to the sample before it.
    let beyond = history.partition_point(|&(_, lsn)| lsn <= replayed);
    let since = match beyond.checked_sub(1).and_then(|i| history.get(i)) {
        Some(&(t, _)) => t,
        // Behind everything kept: at least as old as the oldest sample.
        None => history.front().map_or(now, |&(t, _)| t),
    };
    (Some(bytes), Some(now.saturating_duration_since(since)))
}

/// The end of the last WAL record at or before a primary's insert
/// position. `pg_current_wal_insert_lsn()` points past the header of the
/// page it would write next (24 bytes, 40 at a segment's start) when the
/// last record ended at a page boundary, while a replica's replay
/// position is a record's end: without this, an idle replica would look
/// 24 or 40 bytes behind for ever. No record ends inside a page header, so
/// no replica's position lies between the two. `block`: the server's
/// `wal_block_size`.
pub fn record_end(insert: u64, block: u64) -> u64 {
    match insert.checked_rem(block) {
        Some(off @ (24 | 40)) => insert - off,
        _ => insert,
    }
}

/// PostgreSQL's WAL page size unless built otherwise.
pub const DEFAULT_WAL_BLOCK: u64 = 8192;

/// Parses PostgreSQL's text form of an LSN (`16/B374D848`).
pub fn parse_lsn(text: &str) -> Option<u64> {
    let (hi, lo) = text.split_once('/')?;
    let hi = u64::from_str_radix(hi, 16).ok()?;
    let lo = u64::from_str_radix(lo, 16).ok()?;
    (hi <= u64::from(u32::MAX) && lo <= u64::from(u32::MAX)).then_some(hi << 32 | lo)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_router::Route;

    fn addr(port: u16) -> ServerAddr {
        ServerAddr::Tcp {
            host: "h".into(),
            port,
        }
    }

    fn sample(in_recovery: bool, lsn: u64) -> Result<Sample, String> {
        Ok(Sample {
            in_recovery,
            lsn: Some(lsn),
            timeline: Some(1),
            wal_block: DEFAULT_WAL_BLOCK,
        })
    }

    const LIMITS: LagLimits = LagLimits {
        bytes: 1000,
        time: Duration::from_secs(1),
    };

    fn member(name: &str, role: &str, port: u16) -> Member {
        Member {
            name: name.into(),
            role: role.into(),
            state: "running".into(),
            host: "h".into(),
            port,
        }
    }

    #[test]
    fn where_patroni_speaks_only_its_leader_takes_writes() {
        let t = Topology::new("db".into(), vec![addr(1), addr(2)], vec!["x:8008".into()]);
        let t0 = Instant::now();
        let keep = Duration::from_secs(2);
        // Both say they are primaries on one timeline (a demoted primary
        // back up): the checks alone would pick none.
        t.record(0, sample(false, 100), t0, 3);
        t.record(1, sample(false, 100), t0, 3);
        assert_eq!(t.primary(), None);
        // Patroni's leader decides.
        let change = t.record_patroni(
            Ok(vec![member("a", "replica", 1), member("b", "leader", 2)]),
            t0,
            keep,
        );
        assert_eq!(change.as_deref(), Some("leader is b (h:2)"));
        assert_eq!(t.primary().map(|p| p.0), Some(1));
        assert_eq!(t.hosts()[0].patroni_role.as_deref(), Some("replica"));
        // The leader's own check must agree.
        t.record(1, sample(true, 100), t0, 3);
        assert_eq!(t.primary(), None);
        t.record(1, sample(false, 100), t0, 3);
        // No leader (a switchover between holders): writes wait.
        t.record_patroni(
            Ok(vec![member("a", "replica", 1), member("b", "replica", 2)]),
            t0,
            keep,
        );
        assert_eq!(t.primary(), None);
        t.record_patroni(Ok(vec![member("b", "leader", 2)]), t0, keep);
        assert_eq!(t.primary().map(|p| p.0), Some(1));
        // Patroni silent: its last word holds a while, then the checks
        // decide alone.
        assert_eq!(
            t.record_patroni(Err("down".into()), t0 + Duration::from_secs(1), keep),
            None
        );
        assert_eq!(t.primary().map(|p| p.0), Some(1));
        assert!(
            t.record_patroni(Err("down".into()), t0 + Duration::from_secs(3), keep)
                .is_some()
        );
        assert_eq!(t.primary(), None, "two primaries on one timeline");
        t.record(0, sample(true, 100), t0, 3);
        assert_eq!(t.primary().map(|p| p.0), Some(1));
        // Two leaders reported: nobody takes writes.
        let change = t.record_patroni(
            Ok(vec![member("a", "leader", 1), member("b", "leader", 2)]),
            t0,
            keep,
        );
        assert_eq!(
            change.as_deref(),
            Some("reports more than one leader: writes wait")
        );
        assert_eq!(t.primary(), None);
        // A leader that is none of the hosts (named otherwise): Patroni
        // cannot be matched and the checks decide, as without it.
        let change = t.record_patroni(Ok(vec![member("z", "leader", 9)]), t0, keep);
        assert!(change.is_some_and(|c| c.contains("not among this database's hosts")));
        assert_eq!(t.primary().map(|p| p.0), Some(1));
    }

    #[test]
    fn hosts_learnt_from_patroni_follow_its_member_list() {
        let t = Topology::new("db".into(), Vec::new(), vec!["x:8008".into()]);
        assert!(t.learns_hosts());
        let t0 = Instant::now();
        let keep = Duration::from_secs(2);
        let news = t.follow_members(&[member("a", "leader", 1), member("b", "replica", 2)]);
        assert_eq!(news.added, 0..2);
        assert_eq!(news.log.len(), 2);
        t.record_patroni(
            Ok(vec![member("a", "leader", 1), member("b", "replica", 2)]),
            t0,
            keep,
        );
        t.record(0, sample(false, 100), t0, 1);
        t.record(1, sample(true, 100), t0, 1);
        assert_eq!(t.primary().map(|p| p.0), Some(0));
        assert_eq!(t.pick_replica(LIMITS, None), Some(1));
        // The same list again changes nothing.
        let again = t.follow_members(&[member("a", "leader", 1), member("b", "replica", 2)]);
        assert_eq!(again.added, 2..2);
        assert!(again.readdressed.is_empty() && again.log.is_empty());
        // A member Patroni drops leaves rotation at once, and comes back.
        let news = t.follow_members(&[member("a", "leader", 1)]);
        assert_eq!(news.log.len(), 1);
        assert_eq!(t.pick_replica(LIMITS, None), None);
        t.follow_members(&[member("a", "leader", 1), member("b", "replica", 2)]);
        assert_eq!(t.pick_replica(LIMITS, None), Some(1));
        // A socket path or an empty host is never taken from Patroni.
        let mut odd = member("c", "replica", 3);
        odd.host = "/tmp".into();
        assert_eq!(t.follow_members(&[odd]).added, 2..2);
        // A leader sluice cannot follow (a socket path): nobody takes writes.
        let mut odd_leader = member("c", "leader", 3);
        odd_leader.host = "/tmp".into();
        t.follow_members(&[odd_leader.clone(), member("b", "replica", 2)]);
        t.record_patroni(Ok(vec![odd_leader, member("b", "replica", 2)]), t0, keep);
        t.record(1, sample(false, 100), t0, 1);
        assert_eq!(t.primary(), None, "a host that is not Patroni's leader");
        // Hosts named in the entry are never changed by Patroni.
        let named = Topology::new("db".into(), vec![addr(1)], vec!["x:8008".into()]);
        assert!(!named.learns_hosts());
        assert_eq!(
            named.follow_members(&[member("b", "replica", 2)]),
            MemberNews::default()
        );
        assert_eq!(named.len(), 1);
    }

    #[test]
    fn past_the_cap_a_new_member_takes_the_place_of_a_departed_one() {
        let t = Topology::new("db".into(), Vec::new(), vec!["x:8008".into()]);
        let all: Vec<Member> = (0..MAX_HOSTS as u16)
            .map(|p| member(&format!("m{p}"), "replica", 1000 + p))
            .collect();
        assert_eq!(t.follow_members(&all).added, 0..MAX_HOSTS);
        // Every place taken and listed: a newcomer is not followed.
        let mut more = all.clone();
        more.push(member("new", "replica", 9));
        let news = t.follow_members(&more);
        assert!(news.added.is_empty() && news.readdressed.is_empty());
        assert!(news.log[0].contains("1 member(s) not followed"));
        assert!(t.follow_members(&more).log.is_empty(), "said once");
        // A leader past the cap is followed first.
        let mut led = vec![member("boss", "leader", 7)];
        led.extend(all.iter().cloned());
        let fresh = Topology::new("db".into(), Vec::new(), vec!["x:8008".into()]);
        fresh.follow_members(&led);
        assert_eq!(fresh.hosts()[0].addr, addr(7));
        // Member 5 departs; the newcomer takes its place, as a fresh host.
        t.record(5, sample(true, 100), Instant::now(), 1);
        more.remove(5);
        let news = t.follow_members(&more);
        assert_eq!(news.readdressed, vec![5]);
        let h = &t.hosts()[5];
        assert_eq!(h.addr, addr(9));
        assert!(h.listed && h.last_check.is_none() && h.health == Health::Unknown);
        assert_eq!(t.len(), MAX_HOSTS);
    }

    #[test]
    fn an_insert_position_past_a_page_header_is_the_page_boundary() {
        assert_eq!(
            record_end(0x3000028, DEFAULT_WAL_BLOCK),
            0x3000000,
            "long header at a segment start"
        );
        assert_eq!(record_end(0x3002018, 8192), 0x3002000, "short header");
        assert_eq!(record_end(0x3002060, 8192), 0x3002060);
        assert_eq!(record_end(0x3000000, 8192), 0x3000000);
        // 16 kB pages: 8 kB into a page is no header.
        assert_eq!(record_end(0x3002018, 16384), 0x3002018);
        assert_eq!(record_end(0x3004018, 16384), 0x3004000);
    }

    #[test]
    fn lsn_text() {
        assert_eq!(parse_lsn("0/3000060"), Some(0x3000060));
        assert_eq!(parse_lsn("16/B374D848"), Some(0x16_B374_D848));
        assert_eq!(parse_lsn("x/1"), None);
        assert_eq!(parse_lsn("1"), None);
    }

    #[test]
    fn lag_in_time_counts_from_the_last_sample_caught_up_with() {
        let t = Topology::new("db".into(), vec![addr(1), addr(2)], Vec::new());
        let t0 = Instant::now();
        t.record(0, sample(false, 100), t0, 3);
        t.record(0, sample(false, 200), t0 + Duration::from_millis(250), 3);
        t.record(0, sample(false, 300), t0 + Duration::from_millis(500), 3);
        // Replayed 200: has what existed at 250 ms, not what came by 500.
        t.record(1, sample(true, 200), t0 + Duration::from_millis(600), 3);
        let r = &t.hosts()[1];
        assert_eq!(r.role, Role::Replica);
        assert_eq!(r.lag_bytes, Some(100));
        assert_eq!(r.lag, Some(Duration::from_millis(350)));
        // Caught up: no lag, however long the primary has been idle.
        t.record(1, sample(true, 300), t0 + Duration::from_secs(60), 3);
        assert_eq!(t.hosts()[1].lag, Some(Duration::ZERO));
        assert_eq!(t.pick_replica(LIMITS, None), Some(1));
    }

    #[test]
    fn a_lagging_or_failing_replica_is_not_picked() {
        let t = Topology::new("db".into(), vec![addr(1), addr(2)], Vec::new());
        let t0 = Instant::now();
        t.record(0, sample(false, 5000), t0, 3);
        t.record(1, sample(true, 100), t0, 3);
        assert_eq!(t.pick_replica(LIMITS, None), None, "4900 bytes behind");
        t.record(1, sample(true, 5000), t0, 3);
        assert_eq!(t.pick_replica(LIMITS, None), Some(1));
        // Down only after `threshold` failures in a row, back after as
        // many passes.
        t.record(1, Err("x".into()), t0, 3);
        t.record(1, Err("x".into()), t0, 3);
        assert_eq!(t.pick_replica(LIMITS, None), Some(1));
        let changes = t.record(1, Err("x".into()), t0, 3);
        assert_eq!(changes, [Change::Health(Health::Up, Health::Down)]);
        assert_eq!(t.pick_replica(LIMITS, None), None);
        t.record(1, sample(true, 5000), t0, 3);
        t.record(1, sample(true, 5000), t0, 3);
        assert_eq!(t.pick_replica(LIMITS, None), None, "hysteresis");
        t.record(1, sample(true, 5000), t0, 3);
        assert_eq!(t.pick_replica(LIMITS, None), Some(1));
    }

    #[test]
    fn reads_after_a_write_wait_for_a_replica_past_it() {
        let t = Topology::new("db".into(), vec![addr(1), addr(2)], Vec::new());
        let t0 = Instant::now();
        t.record(0, sample(false, 100), t0, 3);
        t.record(1, sample(true, 100), t0, 3);
        let wrote = t0 + Duration::from_millis(10);
        assert_eq!(t.primary_lsn_after(wrote), None, "no check since the write");
        t.record(0, sample(false, 180), t0 + Duration::from_millis(250), 3);
        assert_eq!(t.primary_lsn_after(wrote), Some(180));
        assert_eq!(t.pick_replica(LIMITS, Some(180)), None, "replayed 100");
        t.record(1, sample(true, 180), t0 + Duration::from_millis(260), 3);
        assert_eq!(t.pick_replica(LIMITS, Some(180)), Some(1));
    }

    #[test]
    fn reads_wait_for_every_clients_writes_when_asked() {
        let t = Topology::new("db".into(), vec![addr(1), addr(2)], Vec::new());
        let t0 = Instant::now();
        t.record(0, sample(false, 100), t0, 3);
        t.record(1, sample(true, 100), t0, 3);
        assert_eq!(t.database_position(), Some(None), "nothing written yet");
        assert!(!t.saw_writes());
        std::thread::sleep(Duration::from_millis(1));
        t.note_write_end();
        assert_eq!(t.database_position(), None, "no position read since");
        assert!(t.saw_writes());
        t.note_measured(t0, 150);
        assert_eq!(t.database_position(), None, "read before the write ended");
        std::thread::sleep(Duration::from_millis(1));
        let after = Instant::now();
        t.note_measured(after, 300);
        assert_eq!(t.database_position(), Some(Some(300)));
        // A check of the primary's after the write covers it as well: the
        // lower of the two is enough.
        t.record(0, sample(false, 250), after, 3);
        assert_eq!(t.database_position(), Some(Some(250)));
        std::thread::sleep(Duration::from_millis(1));
        t.note_write_end();
        assert_eq!(t.database_position(), None, "a newer write");
        t.record(
            0,
            sample(false, 400),
            Instant::now() + Duration::from_millis(1),
            3,
        );
        assert_eq!(t.database_position(), Some(Some(400)));
        assert_eq!(t.pick_replica(LIMITS, Some(400)), None, "replayed 100");
        // A replica that missed a read's position is not waited for a
        // while.
        assert!(t.replay_wait_worthwhile());
        t.note_replay_missed();
        assert!(!t.replay_wait_worthwhile());
        std::thread::sleep(REPLAY_BACKOFF + Duration::from_millis(5));
        assert!(t.replay_wait_worthwhile());
        // Another primary forgets the old one's measurement.
        t.record(0, Err("gone".into()), Instant::now(), 1);
        t.record(1, sample(false, 120), Instant::now(), 3);
        assert!(t.lock().measured.is_none());
    }

    #[test]
    fn functions_that_cannot_write_make_reads() {
        let t = Topology::new("db".into(), vec![addr(1)], Vec::new());
        let sql = |s: &str| t.classifier().unwrap_or_default().classify(s.as_bytes());
        assert_eq!(sql("select price(1)"), Route::Primary, "unknown function");
        t.set_functions(&[
            ("public".into(), "price".into(), true),
            ("public".into(), "bump".into(), false),
            ("audit".into(), "price".into(), false),
            ("app".into(), "total".into(), true),
            ("evil".into(), "nextval".into(), true),
            ("pg_catalog".into(), "nextval".into(), false),
        ]);
        assert_eq!(
            sql("select nextval('s')"),
            Route::Primary,
            "a stable evil.nextval does not vouch for pg_catalog's"
        );
        assert_eq!(sql("select public.price(1)"), Route::Replica);
        assert_eq!(
            sql("select price(1)"),
            Route::Primary,
            "another schema's price may write"
        );
        assert_eq!(sql("select total(1), app.total(2)"), Route::Replica);
        assert_eq!(sql("select bump(1)"), Route::Primary);
    }

    #[test]
    fn two_primaries_on_one_timeline_make_none() {
        let t = Topology::new("db".into(), vec![addr(1), addr(2)], Vec::new());
        let t0 = Instant::now();
        t.record(0, sample(false, 1), t0, 3);
        assert_eq!(t.primary().map(|p| p.0), Some(0));
        t.record(1, sample(false, 1), t0, 3);
        assert_eq!(t.primary(), None, "split brain: no writes anywhere");
        t.record(
            1,
            Ok(Sample {
                in_recovery: false,
                lsn: Some(2),
                timeline: Some(2),
                wal_block: DEFAULT_WAL_BLOCK,
            }),
            t0,
            3,
        );
        assert_eq!(t.primary().map(|p| p.0), Some(1), "the newest timeline");
    }

    #[test]
    fn a_role_change_is_reported() {
        let t = Topology::new("db".into(), vec![addr(1)], Vec::new());
        let t0 = Instant::now();
        let first = t.record(0, sample(true, 1), t0, 3);
        assert!(first.contains(&Change::Role(Role::Unknown, Role::Replica)));
        let promoted = t.record(0, sample(false, 2), t0, 3);
        assert_eq!(promoted, [Change::Role(Role::Replica, Role::Primary)]);
    }
}
