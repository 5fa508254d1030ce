//! Counters behind SHOW STATS and SHOW POOLS. A lease collects what one
//! linked period did; the pool adds it to its totals when the server comes
//! back, under the lock it takes anyway, so counting costs the hot path no
//! extra synchronisation.

use std::time::Duration;

/// Upper bounds of the latency histograms, in microseconds: 50 µs to 10 s.
pub const LATENCY_BOUNDS_US: [u64; 17] = [
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000, 5_000_000, 10_000_000,
];

/// Counts per latency bucket (the last one is +Inf), not cumulative.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LatencyHistogram {
    pub counts: [u64; LATENCY_BOUNDS_US.len() + 1],
    pub sum_us: u64,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self {
            counts: [0; LATENCY_BOUNDS_US.len() + 1],
            sum_us: 0,
        }
    }
}

impl LatencyHistogram {
    pub fn observe(&mut self, d: Duration) {
        let us = d.as_micros() as u64;
        let i = LATENCY_BOUNDS_US.partition_point(|&b| b < us);
        self.counts[i] += 1;
        self.sum_us += us;
    }

    pub fn merge(&mut self, o: &LatencyHistogram) {
        for (a, b) in self.counts.iter_mut().zip(o.counts.iter()) {
            *a += b;
        }
        self.sum_us += o.sum_us;
    }
}

/// What one client did with one server between lease and release.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TxStats {
    /// Transactions ended (ReadyForQuery 'I').
    pub xacts: u64,
    /// Request cycles ended (every ReadyForQuery).
    pub queries: u64,
    /// Bytes from the client to the server.
    pub received: u64,
    /// Bytes from the server to the client.
    pub sent: u64,
    /// Time the server was lent.
    pub linked: Duration,
    /// Time the client waited for the server.
    pub waited: Duration,
    /// SQLSTATE classes of the errors the server sent (rarely any).
    /// Server errors by SQLSTATE class, with counts (one entry per class,
    /// so a long session-mode link that errs often stays small).
    pub error_classes: Vec<([u8; 2], u64)>,
}

/// A pool's totals since start.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolStats {
    pub server_assignments: u64,
    pub xacts: u64,
    pub queries: u64,
    pub received: u64,
    pub sent: u64,
    pub xact_time_us: u64,
    pub query_time_us: u64,
    pub wait_time_us: u64,
    pub client_logins: u64,
    /// Time servers were lent (a transaction in transaction mode).
    pub linked: LatencyHistogram,
    /// Time clients waited for a server.
    pub waits: LatencyHistogram,
    /// Server errors by SQLSTATE class.
    pub errors: std::collections::BTreeMap<[u8; 2], u64>,
}

impl PoolStats {
    pub fn add(&mut self, tx: &TxStats) {
        self.server_assignments += 1;
        self.xacts += tx.xacts;
        self.queries += tx.queries;
        self.received += tx.received;
        self.sent += tx.sent;
        let linked = tx.linked.as_micros() as u64;
        self.xact_time_us += linked;
        self.query_time_us += linked;
        self.wait_time_us += tx.waited.as_micros() as u64;
        self.linked.observe(tx.linked);
        self.waits.observe(tx.waited);
        for (class, n) in &tx.error_classes {
            *self.errors.entry(*class).or_default() += n;
        }
    }

    /// Sums several pools (SHOW STATS is per database).
    pub fn merge(&mut self, other: &PoolStats) {
        self.server_assignments += other.server_assignments;
        self.xacts += other.xacts;
        self.queries += other.queries;
        self.received += other.received;
        self.sent += other.sent;
        self.xact_time_us += other.xact_time_us;
        self.query_time_us += other.query_time_us;
        self.wait_time_us += other.wait_time_us;
        self.client_logins += other.client_logins;
        self.linked.merge(&other.linked);
        self.waits.merge(&other.waits);
        for (class, n) in &other.errors {
            *self.errors.entry(*class).or_default() += n;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_by_upper_bound() {
        let mut h = LatencyHistogram::default();
        h.observe(Duration::from_micros(50));
        h.observe(Duration::from_micros(51));
        h.observe(Duration::from_secs(60));
        assert_eq!(h.counts[0], 1);
        assert_eq!(h.counts[1], 1);
        assert_eq!(h.counts[LATENCY_BOUNDS_US.len()], 1);
        assert_eq!(h.counts.iter().sum::<u64>(), 3);
    }
}
