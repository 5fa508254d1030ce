//! SHOW commands, each with PgBouncer 1.25's exact columns and types
//! (`../shared/PGBOUNCER-CONSOLE.md`). Counters sluice does not keep are 0.

use std::collections::BTreeMap;

use super::result::{ResultSet, v};
use crate::app::App;
use crate::backend::stats::PoolStats;
use crate::stats::Averages;

pub fn pools(app: &App) -> ResultSet {
    let mut rs = ResultSet::new(
        &[
            "database",
            "user",
            "cl_active",
            "cl_waiting",
            "cl_active_cancel_req",
            "cl_waiting_cancel_req",
            "sv_active",
            "sv_active_cancel",
            "sv_being_canceled",
            "sv_idle",
            "sv_used",
            "sv_tested",
            "sv_login",
            "maxwait",
            "maxwait_us",
            "pool_mode",
            "load_balance_hosts",
        ],
        "ssiiiiiiiiiiiiiss",
    );
    let mut pools = app.main_pools();
    pools.sort_by(|a, b| (&a.database, &a.user).cmp(&(&b.database, &b.user)));
    for p in pools {
        let c = p.counts();
        rs.row(vec![
            v(&p.database),
            v(&p.user),
            v(c.clients.saturating_sub(c.waiting)),
            v(c.waiting),
            v(0),
            v(0),
            v(c.active),
            v(0),
            v(0),
            v(c.idle),
            v(0),
            v(0),
            v(c.opening),
            v(c.max_wait.as_secs()),
            v(c.max_wait.subsec_micros()),
            v(p.settings().mode.as_str()),
            None,
        ]);
    }
    rs
}

fn totals_by_database(app: &App) -> BTreeMap<String, PoolStats> {
    app.totals_by_database()
}

const STATS_TOTAL_NAMES: [&str; 12] = [
    "server_assignment_count",
    "xact_count",
    "query_count",
    "received",
    "sent",
    "xact_time",
    "query_time",
    "wait_time",
    "client_parse_count",
    "server_parse_count",
    "bind_count",
    "client_login_count",
];

/// SHOW TOTALS's row names after their `total_` or `avg_`: PgBouncer
/// 1.25's (its `stats.c`), which name the byte and prepared-statement
/// counts otherwise than SHOW STATS's columns do.
const TOTALS_NAMES: [&str; 12] = [
    "server_assignment_count",
    "xact_count",
    "query_count",
    "client_bytes",
    "server_bytes",
    "xact_time",
    "query_time",
    "wait_time",
    "ps_client_parse_count",
    "ps_server_parse_count",
    "ps_bind_count",
    "client_login_count",
];

fn total_values(t: &PoolStats) -> [u64; 12] {
    [
        t.server_assignments,
        t.xacts,
        t.queries,
        t.received,
        t.sent,
        t.xact_time_us,
        t.query_time_us,
        t.wait_time_us,
        0,
        0,
        0,
        t.client_logins,
    ]
}

fn average_values(a: &Averages) -> [u64; 12] {
    [
        a.server_assignments,
        a.xacts,
        a.queries,
        a.received,
        a.sent,
        a.xact_time_us,
        a.query_time_us,
        a.wait_time_us,
        0,
        0,
        0,
        a.client_logins,
    ]
}

pub fn stats(app: &App) -> ResultSet {
    let mut names = vec!["database"];
    names.extend([
        "total_server_assignment_count",
        "total_xact_count",
        "total_query_count",
        "total_received",
        "total_sent",
        "total_xact_time",
        "total_query_time",
        "total_wait_time",
        "total_client_parse_count",
        "total_server_parse_count",
        "total_bind_count",
        "total_client_login_count",
        "avg_server_assignment_count",
        "avg_xact_count",
        "avg_query_count",
        "avg_recv",
        "avg_sent",
        "avg_xact_time",
        "avg_query_time",
        "avg_wait_time",
        "avg_client_parse_count",
        "avg_server_parse_count",
        "avg_bind_count",
        "avg_client_login_count",
    ]);
    let mut rs = ResultSet::new(&names, &format!("s{}", "N".repeat(24)));
    let averages = app.stats.averages();
    for (db, t) in totals_by_database(app) {
        let a = averages.get(&db).copied().unwrap_or_default();
        let mut row = vec![v(&db)];
        row.extend(total_values(&t).iter().map(v));
        row.extend(average_values(&a).iter().map(v));
        rs.row(row);
    }
    rs
}

pub fn stats_totals(app: &App) -> ResultSet {
    let mut names = vec!["database"];
    names.extend(STATS_TOTAL_NAMES.iter().map(|n| match *n {
        "received" => "bytes_received",
        "sent" => "bytes_sent",
        other => other,
    }));
    let mut rs = ResultSet::new(&names, &format!("s{}", "N".repeat(12)));
    for (db, t) in totals_by_database(app) {
        let mut row = vec![v(&db)];
        row.extend(total_values(&t).iter().map(v));
        rs.row(row);
    }
    rs
}

pub fn stats_averages(app: &App) -> ResultSet {
    let names = [
        "database",
        "server_assignment_count",
        "xact_count",
        "query_count",
        "bytes_received",
        "bytes_sent",
        "xact_time",
        "query_time",
        "wait_time",
        "avg_client_parse_count",
        "avg_server_parse_count",
        "avg_bind_count",
        "avg_client_login_count",
    ];
    let mut rs = ResultSet::new(&names, &format!("s{}", "N".repeat(12)));
    let averages = app.stats.averages();
    for db in totals_by_database(app).keys() {
        let a = averages.get(db).copied().unwrap_or_default();
        let mut row = vec![v(db)];
        row.extend(average_values(&a).iter().map(v));
        rs.row(row);
    }
    rs
}

pub fn totals(app: &App) -> ResultSet {
    let mut rs = ResultSet::new(&["name", "value"], "sN");
    let mut all = PoolStats::default();
    for t in totals_by_database(app).values() {
        all.merge(t);
    }
    let mut avg = Averages::default();
    for a in app.stats.averages().values() {
        avg.merge(a);
    }
    for (name, value) in TOTALS_NAMES.iter().zip(total_values(&all)) {
        rs.row(vec![v(format!("total_{name}")), v(value)]);
    }
    for (name, value) in TOTALS_NAMES.iter().zip(average_values(&avg)) {
        rs.row(vec![v(format!("avg_{name}")), v(value)]);
    }
    rs
}

pub fn databases(app: &App) -> ResultSet {
    let mut rs = ResultSet::new(
        &[
            "name",
            "host",
            "port",
            "database",
            "force_user",
            "pool_size",
            "min_pool_size",
            "reserve_pool_size",
            "server_lifetime",
            "pool_mode",
            "load_balance_hosts",
            "max_connections",
            "current_connections",
            "max_client_connections",
            "current_client_connections",
            "paused",
            "disabled",
        ],
        "ssissiiiissiiiiii",
    );
    let config = app.config();
    let s = &config.settings;
    let pools = app.pools();
    for db in config
        .databases
        .iter()
        .chain(config.fallback_database.iter())
    {
        let of_db = pools.iter().filter(|p| p.database == db.name);
        let (servers, clients) = of_db.fold((0, 0), |(sv, cl), p| {
            let c = p.counts();
            (sv + c.total, cl + c.clients)
        });
        rs.row(vec![
            v(&db.name),
            db.host.clone(),
            v(db.port.unwrap_or(5432)),
            v(db.dbname.as_deref().unwrap_or(&db.name)),
            db.user.clone(),
            v(db.pool_size.unwrap_or(s.default_pool_size)),
            v(db.min_pool_size.unwrap_or(s.min_pool_size)),
            v(db.reserve_pool_size.unwrap_or(s.reserve_pool_size)),
            v(db.server_lifetime.unwrap_or(s.server_lifetime).as_secs()),
            db.pool_mode.map(|m| m.as_str().to_owned()),
            None,
            v(db.max_db_connections.unwrap_or(s.max_db_connections)),
            v(servers),
            v(db.max_db_client_connections
                .unwrap_or(s.max_db_client_connections)),
            v(clients),
            v(i32::from(app.control.paused_by_name(&db.name))),
            v(i32::from(app.control.is_disabled(&db.name))),
        ]);
    }
    rs.row(vec![
        v("pgbouncer"),
        None,
        v(s.listen_port),
        v("pgbouncer"),
        v("pgbouncer"),
        v(2),
        v(0),
        v(0),
        v(0),
        v("statement"),
        None,
        v(0),
        v(0),
        v(0),
        v(0),
        v(0),
        v(0),
    ]);
    rs
}

pub fn users(app: &App) -> ResultSet {
    let mut rs = ResultSet::new(
        &[
            "name",
            "pool_size",
            "reserve_pool_size",
            "pool_mode",
            "max_user_connections",
            "current_connections",
            "max_user_client_connections",
            "current_client_connections",
        ],
        // (PgBouncer 1.25: the user's own sizes as text, `%9d`, empty
        // where the user entry sets none)
        "ssssiiii",
    );
    let config = app.config();
    let s = &config.settings;
    let pools = app.pools();
    for u in &config.users {
        let (servers, clients) =
            pools
                .iter()
                .filter(|p| p.user == u.name)
                .fold((0, 0), |(sv, cl), p| {
                    let c = p.counts();
                    (sv + c.total, cl + c.clients)
                });
        rs.row(vec![
            v(&u.name),
            Some(u.pool_size.map(|n| format!("{n:9}")).unwrap_or_default()),
            Some(
                u.reserve_pool_size
                    .map(|n| format!("{n:9}"))
                    .unwrap_or_default(),
            ),
            u.pool_mode.map(|m| m.as_str().to_owned()),
            v(u.max_user_connections.unwrap_or(s.max_user_connections)),
            v(servers),
            v(u.max_user_client_connections
                .unwrap_or(s.max_user_client_connections)),
            v(clients),
        ]);
    }
    rs
}

pub fn config(app: &App) -> ResultSet {
    let mut rs = ResultSet::new(&["key", "value", "default", "changeable"], "ssss");
    let config = app.config();
    for k in sluice_config::known_keys() {
        rs.row(vec![
            v(k.key),
            // The backend in use (auto's choice), not the word configured.
            if k.key == "io_backend" {
                v(crate::uring::in_use())
            } else {
                config.settings.value_of(k.key)
            },
            v(k.default),
            v(if k.changeable { "yes" } else { "no" }),
        ]);
    }
    rs
}

/// PgBouncer counts objects here: `used_clients` and `used_servers` are
/// every client and server connection it holds (console clients, logins and
/// idle servers included), `free_*` its caches of unused objects, which
/// sluice does not keep (0). `databases` counts the console's own
/// `pgbouncer` database, a row of SHOW DATABASES in both.
/// The `[peers]` entries other than this process's own (its `peer_id` as
/// of startup: a RELOAD does not change it).
fn peers<'a>(
    app: &App,
    config: &'a sluice_config::Config,
) -> impl Iterator<Item = &'a sluice_config::PeerEntry> {
    let own = app.cancels.peer_id();
    config.peers.iter().filter(move |p| p.id != own)
}

/// SHOW PEERS: the other members of the `[peers]` group.
pub fn peers_list(app: &App) -> ResultSet {
    let mut rs = ResultSet::new(&["peer_id", "host", "port", "pool_size"], "isii");
    let config = app.config();
    for p in peers(app, &config) {
        let size = p.pool_size.unwrap_or(config.settings.default_pool_size);
        rs.row(vec![v(p.id), v(&p.host), v(p.port), v(size)]);
    }
    rs
}

/// SHOW PEER_POOLS: cancel requests being forwarded to each peer.
pub fn peer_pools(app: &App) -> ResultSet {
    let mut rs = ResultSet::new(
        &[
            "peer_id",
            "cl_active_cancel_req",
            "cl_waiting_cancel_req",
            "sv_active_cancel",
            "sv_login",
        ],
        "iiiii",
    );
    let config = app.config();
    for p in peers(app, &config) {
        let (active, waiting) = app.peers.known(p.id).map_or((0, 0), |s| {
            use std::sync::atomic::Ordering::Relaxed;
            (s.active.load(Relaxed), s.waiting.load(Relaxed))
        });
        // A forward is one short connection: it is the client's request
        // and the server side's cancel at once.
        rs.row(vec![v(p.id), v(active), v(waiting), v(active), v(0)]);
    }
    rs
}

pub fn lists(app: &App) -> ResultSet {
    let mut rs = ResultSet::new(&["list", "items"], "si");
    let config = app.config();
    let pools = app.pools();
    let servers: u32 = pools.iter().map(|p| p.counts().total).sum();
    let clients = app.clients.load(std::sync::atomic::Ordering::Relaxed);
    let dbs = config.databases.len() + usize::from(config.fallback_database.is_some()) + 1;
    let users: std::collections::BTreeSet<&str> = pools.iter().map(|p| p.user.as_str()).collect();
    for (name, items) in [
        ("databases", dbs as u32),
        ("users", users.len() as u32),
        ("peers", peers(app, &config).count() as u32),
        ("pools", pools.len() as u32),
        ("peer_pools", peers(app, &config).count() as u32),
        ("free_clients", 0),
        ("used_clients", clients),
        ("login_clients", 0),
        ("free_servers", 0),
        ("used_servers", servers),
        ("dns_names", crate::backend::dns::cached_names() as u32),
        ("dns_zones", 0),
        ("dns_queries", 0),
        ("dns_pending", 0),
    ] {
        rs.row(vec![v(name), v(items)]);
    }
    rs
}

/// PgBouncer's SHOW STATE: `active` is "not paused" (PgBouncer's
/// `cf_pause_mode == P_NONE`), and SIGINT's shutdown counts as a pause, as
/// it does there (SHUTDOWN WAIT_FOR_SERVERS sets pause mode).
pub fn state(app: &App) -> ResultSet {
    let mut rs = ResultSet::new(&["key", "value"], "ss");
    let paused = app.control.all_paused() || app.phase() >= crate::app::Phase::WaitForServers;
    let yes_no = |b: bool| v(if b { "yes" } else { "no" });
    rs.row(vec![v("active"), yes_no(!paused)]);
    rs.row(vec![v("paused"), yes_no(paused)]);
    rs.row(vec![v("suspended"), v("no")]);
    rs
}

pub fn version() -> ResultSet {
    let mut rs = ResultSet::new(&["version"], "s");
    rs.row(vec![v(concat!(
        "PgBouncer 1.25.2 compatible (sluice ",
        env!("CARGO_PKG_VERSION"),
        ")"
    ))]);
    rs
}

/// PgBouncer's SHOW DNS_HOSTS: each name in the lookup cache, the seconds
/// until it is looked up again, and its addresses (none after a failure).
/// A name is listed once per port it was looked up for.
pub fn dns_hosts(app: &App) -> ResultSet {
    let mut rs = ResultSet::new(&["hostname", "ttl", "addrs"], "sqs");
    let ttl = crate::backend::dns::DnsTtl::from_settings(&app.config().settings);
    for name in crate::backend::dns::cached(ttl) {
        let addrs: Vec<String> = name.addrs.iter().map(ToString::to_string).collect();
        rs.row(vec![v(name.host), v(name.ttl_left), v(addrs.join(","))]);
    }
    rs
}

/// PgBouncer's SHOW DNS_ZONES: zones are watched only with c-ares and
/// `dns_zone_check_period`, which sluice refuses, so there are none.
pub fn dns_zones() -> ResultSet {
    ResultSet::new(&["zonename", "serial", "count"], "sqi")
}

pub fn mem() -> ResultSet {
    // sluice has no slab caches of its own; the allocator's state is not
    // what PgBouncer reports here, so the list is empty.
    ResultSet::new(&["name", "size", "used", "free", "memtotal"], "siiii")
}
