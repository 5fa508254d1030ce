//! Averages behind SHOW STATS: every `stats_period` the control loop takes
//! the per-database totals, and the difference to the previous sample gives
//! rates (per second) and mean times (per transaction, query, assignment),
//! as PgBouncer computes them.

pub mod http;
pub mod metrics;
pub mod web;

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Instant;

use crate::backend::stats::PoolStats;

/// Averages over the last period.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Averages {
    /// Per second.
    pub server_assignments: u64,
    pub xacts: u64,
    pub queries: u64,
    pub received: u64,
    pub sent: u64,
    pub client_logins: u64,
    /// Microseconds per transaction, per query, per assignment.
    pub xact_time_us: u64,
    pub query_time_us: u64,
    pub wait_time_us: u64,
}

impl Averages {
    fn between(old: &PoolStats, new: &PoolStats, secs: f64) -> Self {
        let d = |a: u64, b: u64| b.saturating_sub(a);
        let rate = |x: u64| (x as f64 / secs.max(0.001)).round() as u64;
        let mean = |t: u64, n: u64| t.checked_div(n).unwrap_or(0);
        let xacts = d(old.xacts, new.xacts);
        let queries = d(old.queries, new.queries);
        let assignments = d(old.server_assignments, new.server_assignments);
        Self {
            server_assignments: rate(assignments),
            xacts: rate(xacts),
            queries: rate(queries),
            received: rate(d(old.received, new.received)),
            sent: rate(d(old.sent, new.sent)),
            client_logins: rate(d(old.client_logins, new.client_logins)),
            xact_time_us: mean(d(old.xact_time_us, new.xact_time_us), xacts),
            query_time_us: mean(d(old.query_time_us, new.query_time_us), queries),
            wait_time_us: mean(d(old.wait_time_us, new.wait_time_us), assignments),
        }
    }

    /// Sums rates and keeps the larger mean (SHOW TOTALS over databases).
    pub fn merge(&mut self, o: &Averages) {
        self.server_assignments += o.server_assignments;
        self.xacts += o.xacts;
        self.queries += o.queries;
        self.received += o.received;
        self.sent += o.sent;
        self.client_logins += o.client_logins;
        self.xact_time_us = self.xact_time_us.max(o.xact_time_us);
        self.query_time_us = self.query_time_us.max(o.query_time_us);
        self.wait_time_us = self.wait_time_us.max(o.wait_time_us);
    }
}

#[derive(Default)]
struct Window {
    last: Option<(Instant, BTreeMap<String, PoolStats>)>,
    averages: HashMap<String, Averages>,
}

/// The sampler.
#[derive(Default)]
pub struct StatsWindow {
    inner: Mutex<Window>,
}

impl StatsWindow {
    /// Takes a sample of per-database totals; returns the new averages.
    pub fn sample(&self, totals: BTreeMap<String, PoolStats>) -> HashMap<String, Averages> {
        let now = Instant::now();
        let mut w = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((then, old)) = &w.last {
            let secs = now.duration_since(*then).as_secs_f64();
            let averages = totals
                .iter()
                .map(|(db, new)| {
                    let old = old.get(db).cloned().unwrap_or_default();
                    (db.clone(), Averages::between(&old, new, secs))
                })
                .collect();
            w.averages = averages;
        }
        w.last = Some((now, totals));
        w.averages.clone()
    }

    pub fn averages(&self) -> HashMap<String, Averages> {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .averages
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_and_means() {
        let old = PoolStats::default();
        let new = PoolStats {
            xacts: 100,
            xact_time_us: 5000,
            received: 1000,
            ..Default::default()
        };
        let a = Averages::between(&old, &new, 10.0);
        assert_eq!(a.queries, 0);
        assert_eq!(a.xacts, 10);
        assert_eq!(a.received, 100);
        assert_eq!(a.xact_time_us, 50);
        assert_eq!(a.wait_time_us, 0);
    }
}
