//! SHOW CLIENTS and SHOW SERVERS: one row per client or server connection
//! with PgBouncer's 21 columns. Clients come from the cancel-key slots (each
//! logged-in client has one), servers from the pools (idle and lent).
//! `ptr` is the connection's process id in hex (sluice's own for a client,
//! the backend's for a server) and `link` the peer's, so the two lists join.
//! SHOW SOCKETS lists both kinds with PgBouncer's seven buffer columns,
//! which are 0: sluice keeps no packet buffer on an idle connection, and a
//! linked one's bytes are the relay's, read and written as they come.
//! SHOW ACTIVE_SOCKETS keeps the linked ones (state `active`).

use std::collections::HashMap;
use std::time::SystemTime;

use super::result::{ResultSet, v};
use crate::app::App;

const COLUMNS: [&str; 21] = [
    "type",
    "user",
    "database",
    "replication",
    "state",
    "addr",
    "port",
    "local_addr",
    "local_port",
    "connect_time",
    "request_time",
    "wait",
    "wait_us",
    "close_needed",
    "ptr",
    "link",
    "remote_pid",
    "tls",
    "application_name",
    "prepared_statements",
    "id",
];
const TYPES: &str = "ssssssisiTTiiississii";
/// SHOW CLIENTS adds one column after PgBouncer's: the session objects that
/// keep a transaction-mode client on its server (empty when none).
const CLIENT_EXTRA: [&str; 1] = ["pinned"];
const CLIENT_TYPES: &str = "ssssssisiTTiiississiis";

/// `YYYY-MM-DD HH:MM:SS UTC`, as PgBouncer prints times.
pub fn utc(t: SystemTime) -> String {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs()) as i64;
    let rem = secs.rem_euclid(86_400);
    let (year, month, day) = crate::logging::civil_date(secs.div_euclid(86_400));
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

fn split(addr: Option<std::net::SocketAddr>) -> (Option<String>, Option<String>) {
    match addr {
        Some(a) => (v(a.ip()), v(a.port())),
        None => (v("unix"), v(0)),
    }
}

pub fn clients(app: &App) -> ResultSet {
    let columns: Vec<&str> = COLUMNS.iter().chain(CLIENT_EXTRA.iter()).copied().collect();
    let mut rs = ResultSet::new(&columns, CLIENT_TYPES);
    for c in app.cancels.clients() {
        let state = if c.waiting {
            "waiting"
        } else if c.server_pid.is_some() {
            "active"
        } else {
            "idle"
        };
        let (addr, port) = split(c.meta.peer);
        let (local_addr, local_port) = split(c.meta.local);
        let connected = utc(c.meta.connected);
        let request = c
            .request_at
            .map_or_else(|| connected.clone(), |at| utc(at.to_wall()));
        // PgBouncer's wait (seconds) and wait_us (the microseconds beyond).
        let waited = c
            .wait_since
            .map(|since| since.elapsed())
            .unwrap_or_default();
        rs.row(vec![
            v("C"),
            v(&c.meta.user),
            v(&c.meta.pool.database),
            v("none"),
            v(state),
            addr,
            port,
            local_addr,
            local_port,
            v(&connected),
            v(&request),
            v(waited.as_secs()),
            v(waited.subsec_micros()),
            v(0),
            v(format!("{:x}", c.pid)),
            v(c.server_pid.map(|p| format!("{p:x}")).unwrap_or_default()),
            v(0),
            v(c.meta.tls.as_deref().unwrap_or("")),
            v(&c.meta.application_name),
            v(0),
            v(c.pid),
            v(c.meta.pinned.as_deref().unwrap_or("")),
        ]);
    }
    rs
}

pub fn servers(app: &App) -> ResultSet {
    let mut rs = ResultSet::new(&COLUMNS, TYPES);
    let client_of: HashMap<i32, i32> = app
        .cancels
        .clients()
        .iter()
        .filter_map(|c| c.server_pid.map(|s| (s, c.pid)))
        .collect();
    let mut pools = app.pools();
    pools.sort_by(|a, b| (&a.database, &a.user).cmp(&(&b.database, &b.user)));
    for p in pools {
        let (_, target) = p.settings_and_target();
        let addr_of = |a: &crate::backend::target::ServerAddr| match a {
            crate::backend::target::ServerAddr::Tcp { host, port } => (v(host), v(port)),
            crate::backend::target::ServerAddr::Unix(path) => (v(path), v(0)),
        };
        for s in p.servers() {
            let on = target.alternates.addrs.get(usize::from(s.alternate));
            let (addr, port) = addr_of(on.unwrap_or(&target.addr));
            let (local_addr, local_port) = split(s.local);
            let connected = utc(s.created);
            let used = utc(s.used.to_wall());
            rs.row(vec![
                v("S"),
                v(&p.user),
                v(&p.database),
                v("none"),
                v(if s.active { "active" } else { "idle" }),
                addr.clone(),
                port.clone(),
                local_addr,
                local_port,
                v(&connected),
                v(&used),
                v(0),
                v(0),
                v(i32::from(s.close_needed)),
                v(format!("{:x}", s.remote_pid)),
                v(client_of
                    .get(&s.remote_pid)
                    .map(|c| format!("{c:x}"))
                    .unwrap_or_default()),
                v(s.remote_pid),
                v(s.tls.as_deref().unwrap_or("")),
                v(""),
                v(s.prepared_statements),
                v(s.id),
            ]);
        }
    }
    rs
}

/// PgBouncer's buffer columns of SHOW SOCKETS.
const BUFFER_COLUMNS: [&str; 7] = [
    "recv_pos",
    "pkt_pos",
    "pkt_remain",
    "send_pos",
    "send_remain",
    "pkt_avail",
    "send_avail",
];

/// SHOW SOCKETS (`active_only`: SHOW ACTIVE_SOCKETS).
pub fn sockets(app: &App, active_only: bool) -> ResultSet {
    let columns: Vec<&str> = COLUMNS
        .iter()
        .chain(BUFFER_COLUMNS.iter())
        .copied()
        .collect();
    let mut rs = ResultSet::new(&columns, &format!("{TYPES}iiiiiii"));
    let rows = clients(app)
        .into_rows()
        .into_iter()
        .map(|mut r| {
            r.truncate(COLUMNS.len());
            r
        })
        .chain(servers(app).into_rows());
    for mut row in rows {
        let active = row[4].as_deref().is_some_and(|s| s.starts_with("active"));
        if active_only && !active {
            continue;
        }
        row.extend(std::iter::repeat_n(v(0), BUFFER_COLUMNS.len()));
        rs.row(row);
    }
    rs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_utc_like_pgbouncer() {
        let t = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_763_700_000);
        assert_eq!(utc(t), "2025-11-21 04:40:00 UTC");
        assert_eq!(utc(SystemTime::UNIX_EPOCH), "1970-01-01 00:00:00 UTC");
    }
}
