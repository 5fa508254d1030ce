//! Prometheus exposition of sluice's state, encoded by `prometheus-client`
//! from the pools' own counters at scrape time (a `Collector`), so that
//! metrics add nothing to the per-transaction path: the pools count under
//! the lock they take anyway, and a scrape reads the totals.

use std::sync::Arc;

use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use crate::app::App;
use crate::backend::stats::{LATENCY_BOUNDS_US, LatencyHistogram};

/// The collector registered once; it holds the app.
#[derive(Clone)]
pub struct SluiceCollector(pub Arc<App>);

impl std::fmt::Debug for SluiceCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SluiceCollector")
    }
}

type Labels<'a> = Vec<(&'static str, &'a str)>;
/// A state label and how to read its count from a pool.
type StateCount = (&'static str, fn(&crate::backend::pool::PoolCounts) -> u32);

fn gauge(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    series: &[(Labels, f64)],
) -> std::fmt::Result {
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, v) in series {
        family.encode_family(labels)?.encode_gauge(v)?;
    }
    Ok(())
}

fn counter(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    series: &[(Labels, f64)],
) -> std::fmt::Result {
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (labels, v) in series {
        family
            .encode_family(labels)?
            .encode_counter::<Labels, _, f64>(v, None)?;
    }
    Ok(())
}

fn histogram(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    series: &[(Labels, LatencyHistogram)],
) -> std::fmt::Result {
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Histogram)?;
    for (labels, h) in series {
        // Per-bucket counts: the encoder makes them cumulative.
        let buckets: Vec<(f64, u64)> = h
            .counts
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let bound = LATENCY_BOUNDS_US
                    .get(i)
                    .map_or(f64::INFINITY, |us| *us as f64 / 1e6);
                (bound, *n)
            })
            .collect();
        family.encode_family(labels)?.encode_histogram::<Labels>(
            h.sum_us as f64 / 1e6,
            h.counts.iter().sum(),
            &buckets,
            None,
        )?;
    }
    Ok(())
}

impl prometheus_client::collector::Collector for SluiceCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let app = &self.0;
        let mut pools = app.main_pools();
        pools.sort_by(|a, b| (&a.database, &a.user).cmp(&(&b.database, &b.user)));
        let snapshots: Vec<_> = pools
            .iter()
            .map(|p| (p.database.clone(), p.user.clone(), p.counts(), p.stats()))
            .collect();
        let by_pool = |f: &dyn Fn(
            &crate::backend::pool::PoolCounts,
            &crate::backend::stats::PoolStats,
        ) -> f64| {
            snapshots
                .iter()
                .map(|(db, user, c, s)| {
                    (
                        vec![("database", db.as_str()), ("user", user.as_str())],
                        f(c, s),
                    )
                })
                .collect::<Vec<_>>()
        };
        let with_state = |pairs: &[StateCount]| {
            let mut out = Vec::new();
            for (db, user, c, _) in &snapshots {
                for (state, f) in pairs {
                    out.push((
                        vec![
                            ("database", db.as_str()),
                            ("user", user.as_str()),
                            ("state", *state),
                        ],
                        f64::from(f(c)),
                    ));
                }
            }
            out
        };
        gauge(
            &mut encoder,
            "sluice_pool_clients",
            "Clients logged in to a pool, by state",
            &with_state(&[
                ("active", |c| c.clients.saturating_sub(c.waiting)),
                ("waiting", |c| c.waiting),
            ]),
        )?;
        gauge(
            &mut encoder,
            "sluice_pool_servers",
            "Server connections of a pool, by state",
            &with_state(&[
                ("active", |c| c.active),
                ("idle", |c| c.idle),
                ("login", |c| c.opening),
            ]),
        )?;
        gauge(
            &mut encoder,
            "sluice_pool_max_wait_seconds",
            "How long the first client in line has waited for a server",
            &by_pool(&|c, _| c.max_wait.as_secs_f64()),
        )?;
        counter(
            &mut encoder,
            "sluice_transactions",
            "Transactions ended (ReadyForQuery with status idle)",
            &by_pool(&|_, s| s.xacts as f64),
        )?;
        counter(
            &mut encoder,
            "sluice_queries",
            "Request cycles ended (every ReadyForQuery)",
            &by_pool(&|_, s| s.queries as f64),
        )?;
        counter(
            &mut encoder,
            "sluice_server_assignments",
            "Times a server was lent to a client",
            &by_pool(&|_, s| s.server_assignments as f64),
        )?;
        counter(
            &mut encoder,
            "sluice_received_bytes",
            "Bytes from clients to servers",
            &by_pool(&|_, s| s.received as f64),
        )?;
        counter(
            &mut encoder,
            "sluice_sent_bytes",
            "Bytes from servers to clients",
            &by_pool(&|_, s| s.sent as f64),
        )?;
        counter(
            &mut encoder,
            "sluice_wait_seconds",
            "Time clients spent waiting for a server",
            &by_pool(&|_, s| s.wait_time_us as f64 / 1e6),
        )?;
        counter(
            &mut encoder,
            "sluice_client_logins",
            "Successful client logins",
            &by_pool(&|_, s| s.client_logins as f64),
        )?;
        let mut errors = Vec::new();
        let classes: Vec<(usize, String, u64)> = snapshots
            .iter()
            .enumerate()
            .flat_map(|(i, (_, _, _, s))| {
                s.errors
                    .iter()
                    .map(move |(c, n)| (i, String::from_utf8_lossy(c).into_owned(), *n))
            })
            .collect();
        for (i, class, n) in &classes {
            let (db, user, _, _) = &snapshots[*i];
            errors.push((
                vec![
                    ("database", db.as_str()),
                    ("user", user.as_str()),
                    ("class", class.as_str()),
                ],
                *n as f64,
            ));
        }
        counter(
            &mut encoder,
            "sluice_server_errors",
            "ErrorResponses from servers, by SQLSTATE class",
            &errors,
        )?;
        let failures = app
            .login_failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let failure_series: Vec<(Labels, f64)> = failures
            .iter()
            .map(|(code, n)| (vec![("sqlstate", code.as_str())], *n as f64))
            .collect();
        counter(
            &mut encoder,
            "sluice_client_login_failures",
            "Refused client logins, by SQLSTATE",
            &failure_series,
        )?;
        let hist = |f: &dyn Fn(&crate::backend::stats::PoolStats) -> LatencyHistogram| {
            snapshots
                .iter()
                .map(|(db, user, _, s)| {
                    (
                        vec![("database", db.as_str()), ("user", user.as_str())],
                        f(s),
                    )
                })
                .collect::<Vec<_>>()
        };
        histogram(
            &mut encoder,
            "sluice_transaction_duration_seconds",
            "Time a server was lent to a client (one transaction in transaction mode)",
            &hist(&|s| s.linked),
        )?;
        histogram(
            &mut encoder,
            "sluice_wait_duration_seconds",
            "Time a client waited for a server",
            &hist(&|s| s.waits),
        )?;
        let clients = f64::from(app.clients.load(std::sync::atomic::Ordering::Relaxed));
        gauge(
            &mut encoder,
            "sluice_clients",
            "Client connections open, logging in or logged in",
            &[(vec![], clients)],
        )?;
        gauge(
            &mut encoder,
            "sluice_held_memory_bytes",
            "Memory granted to clients' large messages held whole (max_held_memory_mb bounds it)",
            &[(vec![], crate::held_memory::BUDGET.used() as f64)],
        )?;
        gauge(
            &mut encoder,
            "sluice_parked_clients",
            "Idle clients waiting without a task of their own (idle for a second or two)",
            &[(vec![], crate::frontend::parking::parked() as f64)],
        )?;
        let mut pinned: std::collections::BTreeMap<(String, String, String), f64> =
            std::collections::BTreeMap::new();
        for c in app.cancels.clients() {
            if let Some(reason) = c.meta.pinned.as_deref() {
                *pinned
                    .entry((
                        c.meta.pool.database.clone(),
                        c.meta.pool.user.clone(),
                        reason.to_owned(),
                    ))
                    .or_default() += 1.0;
            }
        }
        let series: Vec<(Labels, f64)> = pinned
            .iter()
            .map(|((db, user, reason), n)| {
                (
                    vec![
                        ("database", db.as_str()),
                        ("user", user.as_str()),
                        ("reason", reason.as_str()),
                    ],
                    *n,
                )
            })
            .collect();
        gauge(
            &mut encoder,
            "sluice_pinned_clients",
            "Transaction-mode clients kept on their server by session objects (temp tables, \
             WITH HOLD cursors, session advisory locks), by reason",
            &series,
        )?;
        hosts(&mut encoder, app)?;
        gauge(
            &mut encoder,
            "sluice_paused",
            "1 while PAUSE is in force",
            &[(vec![], f64::from(u8::from(app.control.is_paused(""))))],
        )?;
        process(&mut encoder)
    }
}

/// The hosts of databases that route reads (SHOW HOSTS), and where their
/// reads went.
fn hosts(encoder: &mut DescriptorEncoder, app: &App) -> std::fmt::Result {
    let topologies = app.topologies();
    let mut up = Vec::new();
    let mut lag_bytes = Vec::new();
    let mut lag_seconds = Vec::new();
    let mut routed = Vec::new();
    let rows: Vec<(String, Vec<crate::backend::topology::HostState>)> = topologies
        .iter()
        .map(|t| (t.database.clone(), t.hosts()))
        .collect();
    let addrs: Vec<Vec<String>> = rows
        .iter()
        .map(|(_, hs)| hs.iter().map(|h| h.addr.to_string()).collect())
        .collect();
    for ((db, hs), addrs) in rows.iter().zip(&addrs) {
        for (h, addr) in hs.iter().zip(addrs) {
            let labels: Labels = vec![
                ("database", db.as_str()),
                ("host", addr.as_str()),
                ("role", h.role.name()),
            ];
            let is_up = h.health == crate::backend::topology::Health::Up && h.listed;
            up.push((labels.clone(), f64::from(u8::from(is_up))));
            if let Some(b) = h.lag_bytes {
                lag_bytes.push((labels.clone(), b as f64));
            }
            if let Some(t) = h.lag {
                lag_seconds.push((labels, t.as_secs_f64()));
            }
        }
    }
    for t in &topologies {
        use std::sync::atomic::Ordering::Relaxed;
        routed.push((
            vec![("database", t.database.as_str()), ("to", "replica")],
            t.reads_on_replicas.load(Relaxed) as f64,
        ));
        routed.push((
            vec![("database", t.database.as_str()), ("to", "primary")],
            t.reads_on_primary.load(Relaxed) as f64,
        ));
    }
    let retries: Vec<(Labels, f64)> = topologies
        .iter()
        .map(|t| {
            (
                vec![("database", t.database.as_str())],
                t.replica_retries.load(std::sync::atomic::Ordering::Relaxed) as f64,
            )
        })
        .collect();
    counter(
        encoder,
        "sluice_replica_retries",
        "Reads a replica refused as writes (25006) or lost before answering, run again on the \
         primary: each is a statement the classifier took for a read",
        &retries,
    )?;
    gauge(
        encoder,
        "sluice_host_up",
        "1 while a host of a database that routes reads passes its checks",
        &up,
    )?;
    gauge(
        encoder,
        "sluice_host_lag_bytes",
        "WAL bytes a host has yet to replay, behind the primary's newest sample",
        &lag_bytes,
    )?;
    gauge(
        encoder,
        "sluice_host_lag_seconds",
        "How far a host's replay is behind the primary in time (upper bound, within one \
         health_check_period)",
        &lag_seconds,
    )?;
    counter(
        encoder,
        "sluice_read_transactions",
        "Transactions classified as reads, by where they ran (the primary when no replica was \
         up and within the lag limits)",
        &routed,
    )
}

/// Standard process metrics from /proc/self.
fn process(encoder: &mut DescriptorEncoder) -> std::fmt::Result {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as f64;
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat
        .rfind(')')
        .map(|i| stat[i + 2..].split(' ').collect())
        .unwrap_or_default();
    let num = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let cpu = (num(11) + num(12)) / hz;
    let rss = num(21) * page;
    let fds = std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(0) as f64;
    counter(
        encoder,
        "process_cpu_seconds",
        "User and system CPU time",
        &[(vec![], cpu)],
    )?;
    gauge(
        encoder,
        "process_resident_memory_bytes",
        "Resident memory",
        &[(vec![], rss)],
    )?;
    gauge(
        encoder,
        "process_open_fds",
        "Open file descriptors",
        &[(vec![], fds)],
    )?;
    Ok(())
}

/// The registry with sluice's collector.
pub fn registry(app: Arc<App>) -> Registry {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(SluiceCollector(app)));
    registry
}

/// The text exposition of `registry`.
pub fn render(registry: &Registry) -> String {
    let mut out = String::new();
    if prometheus_client::encoding::text::encode(&mut out, registry).is_err() {
        out.clear();
    }
    out
}
