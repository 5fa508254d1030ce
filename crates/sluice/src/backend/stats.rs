//! Counters behind SHOW STATS and SHOW POOLS. A lease collects what one
//! linked period did; the pool adds it to its totals when the server comes
//! back, under the lock it takes anyway, so counting costs the hot path no
//! extra synchronisation.

use std::time::Duration;

/// What one client did with one server between lease and release.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
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
}

/// A pool's totals since start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
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
    }
}
