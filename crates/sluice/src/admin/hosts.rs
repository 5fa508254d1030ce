//! SHOW HOSTS: every host of each database that routes reads, with its
//! role, state (`left`: a member Patroni no longer lists), lag and the
//! servers sluice has open on it. Not a PgBouncer
//! command; the column names follow SHOW SERVERS' style.

use std::time::SystemTime;

use super::result::{ResultSet, v};
use crate::app::App;
use crate::backend::target::ServerAddr;

pub fn hosts(app: &App) -> ResultSet {
    let mut rs = ResultSet::new(
        &[
            "database",
            "host",
            "port",
            "role",
            "state",
            "lag_bytes",
            "lag_ms",
            "timeline",
            "last_check_ms",
            "servers",
            "error",
            "patroni_role",
        ],
        "ssissiiiiiss",
    );
    let pools = app.pools();
    for topology in app.topologies() {
        let primary = topology.primary().map(|(i, _)| i);
        for (i, h) in topology.hosts().into_iter().enumerate() {
            let (host, port) = match &h.addr {
                ServerAddr::Tcp { host, port } => (host.clone(), Some(*port)),
                ServerAddr::Unix(path) => (path.clone(), None),
            };
            // Servers open on this host: its own pool, and the clients'
            // pools while it is the primary.
            let servers: u32 = pools
                .iter()
                .filter(|p| p.database == topology.database)
                .filter(|p| p.host as usize == i + 1 || (p.host == 0 && primary == Some(i)))
                .map(|p| {
                    let c = p.counts();
                    c.active + c.idle
                })
                .sum();
            let since = h
                .last_check
                .and_then(|t| SystemTime::now().duration_since(t).ok());
            rs.row(vec![
                v(&topology.database),
                v(host),
                port.map(v).unwrap_or(None),
                v(h.role.name()),
                v(h.state_name()),
                h.lag_bytes.map(v).unwrap_or(None),
                h.lag.map(|d| v(d.as_millis())).unwrap_or(None),
                h.timeline.map(v).unwrap_or(None),
                since.map(|d| v(d.as_millis())).unwrap_or(None),
                v(servers),
                h.last_error.map(v).unwrap_or(None),
                h.patroni_role.map(v).unwrap_or(None),
            ]);
        }
    }
    rs
}
