//! The health, role and replay-position check of each host of a database
//! that routes reads: one task per host on a worker, one connection kept
//! open, one query every `health_check_period` (a replica's back to back
//! while a read waits for its replay), each bounded by
//! `health_check_timeout`. Results go to the database's `Topology`; role
//! and health changes are logged, and the database's pools follow the
//! primary.

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::login::{self, LoginError};
use super::pool::Pool;
use super::server::ServerConn;
use super::topology::{
    Change, DEFAULT_WAL_BLOCK, MemberNews, Role, Sample, Topology, parse_lsn, record_end,
};

/// Role, replay (or insert) position and timeline in one round trip. The
/// timeline of a replica is only visible to pg_read_all_stats members.
const CHECK_SQL: &str = "select pg_is_in_recovery(), \
     case when pg_is_in_recovery() then pg_last_wal_replay_lsn() \
     else pg_current_wal_insert_lsn() end, \
     case when pg_is_in_recovery() then (select received_tli from pg_stat_wal_receiver) \
     else ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int end, \
     current_setting('wal_block_size')";

/// Every function, by schema and name, with whether all its overloads are
/// STABLE or IMMUTABLE (PostgreSQL runs those with a read-only snapshot:
/// they cannot write). pg_catalog's names come too, so that a function of
/// another schema named like a built-in never vouches for the built-in.
const FUNCTIONS_SQL: &str = "select n.nspname, p.proname, bool_and(p.provolatile <> 'v') \
     from pg_catalog.pg_proc p join pg_catalog.pg_namespace n on n.oid = p.pronamespace \
     where n.nspname <> 'information_schema' \
     group by 1, 2 limit 200000";

/// How often the primary's functions are read again.
const FUNCTIONS_EVERY: Duration = Duration::from_secs(60);

/// What a check task needs from the daemon, without importing it.
pub trait MonitorHost: Send + Sync + 'static {
    /// (period, timeout, threshold) as configured now.
    fn check_settings(&self) -> (Duration, Duration, u32);
    /// How long host name lookups are kept, as configured now.
    fn dns_ttl(&self) -> super::dns::DnsTtl;
    /// Whether the daemon is shutting down.
    fn stopping(&self) -> bool;
    /// Whether `topology` is still its database's (a RELOAD may have
    /// replaced it): the checks of a replaced one stop.
    fn is_current(&self, topology: &Arc<Topology>) -> bool;
    /// The checks changed something (role or health): pools may need to
    /// follow the primary.
    fn topology_changed(&self, topology: &Arc<Topology>);
    /// Patroni's member list added hosts (their checks must start) or
    /// gave a place to another member (its pools must follow).
    fn hosts_changed(&self, topology: &Arc<Topology>, news: &MemberNews);
    /// Host `i` took a check's login as `user`: a login failure the host's
    /// pool of that user keeps (`server_login_retry`) is over, and its
    /// reads need not wait it out (other users' logins may still fail).
    fn host_answered(&self, topology: &Arc<Topology>, i: usize, user: &str);
}

/// Starts one check task per host of `topology`, logging in as `pool`
/// does. Each ends when the topology or the pool is dropped.
pub fn start(
    host: Arc<dyn MonitorHost>,
    topology: &Arc<Topology>,
    pool: &Arc<Pool>,
    spawn: impl Fn(std::pin::Pin<Box<dyn Future<Output = ()> + Send>>),
) {
    start_hosts(host, topology, pool, 0..topology.len(), spawn);
}

/// Starts the check tasks of hosts `which` of `topology` (hosts learnt
/// later from Patroni).
pub fn start_hosts(
    host: Arc<dyn MonitorHost>,
    topology: &Arc<Topology>,
    pool: &Arc<Pool>,
    which: std::ops::Range<usize>,
    spawn: impl Fn(std::pin::Pin<Box<dyn Future<Output = ()> + Send>>),
) {
    for i in which {
        spawn(Box::pin(watch(
            host.clone(),
            Arc::downgrade(topology),
            Arc::downgrade(pool),
            i,
        )));
    }
}

async fn watch(host: Arc<dyn MonitorHost>, topology: Weak<Topology>, pool: Weak<Pool>, i: usize) {
    let mut conn: Option<Box<ServerConn>> = None;
    let mut checked = None;
    loop {
        let (period, timeout, threshold) = host.check_settings();
        let (Some(topo), Some(p)) = (topology.upgrade(), pool.upgrade()) else {
            return;
        };
        if host.stopping() || !host.is_current(&topo) {
            return;
        }
        let Some(addr) = topo.hosts().get(i).map(|h| h.addr.clone()) else {
            return;
        };
        // The place went to another member: the kept connection is the
        // old one's.
        if checked.as_ref().is_some_and(|a| *a != addr) {
            conn = None;
        }
        checked = Some(addr.clone());
        let (target, credential) = p.target_and_credential();
        let user = p.user.clone();
        drop(p);
        let mut target = (*target).clone();
        target.addr = addr.clone();
        // This host and no other: a pool still set for a host list without
        // routing (a RELOAD turning routing on reconfigures the pool after
        // the checks start) would send the check to the list's first host,
        // and two hosts would both look primary.
        target.alternates = Default::default();
        target.connect_timeout = timeout;
        target.connect_query = None;
        let at = Instant::now();
        let result = tokio::time::timeout(timeout, check(&mut conn, &target, &credential))
            .await
            .unwrap_or_else(|_| Err("check timed out".to_owned()));
        if result.is_err() {
            conn = None;
        }
        if result.as_ref().is_ok_and(|s| !s.in_recovery)
            && !topo.functions_fresh(FUNCTIONS_EVERY)
            && let Some(server) = conn.as_mut()
        {
            match tokio::time::timeout(timeout, login::run_query_rows(server, FUNCTIONS_SQL)).await
            {
                Ok(Ok(rows)) => {
                    let rows: Vec<(String, String, bool)> = rows
                        .into_iter()
                        .filter_map(|r| match r.as_slice() {
                            [Some(schema), Some(name), Some(ok)] => {
                                Some((schema.clone(), name.clone(), ok == "t"))
                            }
                            _ => None,
                        })
                        .collect();
                    topo.set_functions(&rows);
                }
                _ => conn = None,
            }
        }
        if result.is_ok() {
            host.host_answered(&topo, i, &user);
        }
        let changes = topo.record_for(i, Some(&addr), result, at, threshold);
        if !changes.is_empty() {
            let h = topo.hosts().into_iter().nth(i);
            for change in &changes {
                let (addr, why) = h
                    .as_ref()
                    .map(|h| (h.addr.to_string(), h.last_error.clone().unwrap_or_default()))
                    .unwrap_or_default();
                match change {
                    Change::Role(from, to) => tracing::warn!(
                        db = %topo.database, host = %addr,
                        "host role: {} -> {}", from.name(), to.name()
                    ),
                    Change::Health(from, to) => tracing::warn!(
                        db = %topo.database, host = %addr,
                        "host state: {} -> {} {why}", from.name(), to.name()
                    ),
                }
            }
        }
        host.topology_changed(&topo);
        // A read held for a replica's replay (`read_your_writes =
        // database`, a block open on it): a replica is checked again at
        // once, and one that sleeps is woken.
        let wake = topo.replay_wake();
        let woken = wake.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        let replica = topo.role_of(i) == Some(Role::Replica);
        let pause = match replica && topo.replay_wanted() {
            true => REPLAY_POLL,
            false => period
                .saturating_sub(at.elapsed())
                .max(Duration::from_millis(10)),
        };
        drop(topo);
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            () = woken, if replica => {}
        }
    }
}

/// The pause between checks of a replica while a read waits for its
/// replay.
/// (1 ms made 430 checks a second on the replica, review 49)
const REPLAY_POLL: Duration = Duration::from_millis(5);

/// One check on the kept connection (opened first if there is none).
async fn check(
    conn: &mut Option<Box<ServerConn>>,
    target: &super::target::ServerTarget,
    credential: &super::target::ServerCredential,
) -> Result<Sample, String> {
    if conn.is_none() {
        let (server, _) = login::open(target, credential)
            .await
            .map_err(|e: LoginError| e.to_string())?;
        *conn = Some(server);
    }
    let Some(server) = conn.as_mut() else {
        return Err("no connection".to_owned());
    };
    let rows = login::run_query_rows(server, CHECK_SQL)
        .await
        .map_err(|e| e.to_string())?;
    let row = rows.first().ok_or("the check returned no row")?;
    let text = |k: usize| row.get(k).and_then(|v| v.as_deref());
    let in_recovery = match text(0) {
        Some("t") => true,
        Some("f") => false,
        other => return Err(format!("unexpected pg_is_in_recovery(): {other:?}")),
    };
    let wal_block = text(3)
        .and_then(|b| b.parse().ok())
        .unwrap_or(DEFAULT_WAL_BLOCK);
    Ok(Sample {
        in_recovery,
        // (a primary's insert position, as a record's end: comparable
        // with a replica's replay position)
        lsn: text(1).and_then(parse_lsn).map(|l| {
            if in_recovery {
                l
            } else {
                record_end(l, wal_block)
            }
        }),
        wal_block,
        timeline: text(2).and_then(|t| t.parse().ok()),
    })
}
