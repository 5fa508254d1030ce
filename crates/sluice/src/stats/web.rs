//! The web console (`[sluice] web_console = 1`, issue 12), served next to
//! `/metrics`: a page that shows pools, databases, clients and hosts with
//! live numbers, and a JSON API that lists them and creates, resizes,
//! pauses, resumes and removes databases at run time. What the API
//! creates lives in a file sluice owns (`web_console_file`), read with the
//! configuration and rewritten atomically (temporary file, then rename), so
//! a restart keeps it; every change is a RELOAD. Access is HTTP Basic with
//! an `admin_users` name (changes) or a `stats_users` name (read-only) and
//! that user's `auth_file` password (plain, md5 or SCRAM).
//! The request handling here is synchronous and I/O-free except for the
//! file write; `http.rs` reads and writes the sockets.

use std::sync::Mutex;

use base64::Engine as _;
use serde_json::{Value, json};

use crate::admin::result::ResultSet;
use crate::app::App;
use crate::auth::userlist::Secret;

/// One request, as `http.rs` read it.
pub struct Request<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub authorization: Option<&'a str>,
    pub body: &'a [u8],
}

/// One response.
pub struct Response {
    pub status: &'static str,
    pub content_type: &'static str,
    pub body: String,
    /// Extra header lines (`WWW-Authenticate`).
    pub headers: Vec<String>,
}

impl Response {
    fn json(status: &'static str, body: &Value) -> Self {
        Self {
            status,
            content_type: "application/json",
            body: body.to_string(),
            headers: Vec::new(),
        }
    }

    fn error(status: &'static str, message: &str) -> Self {
        Self::json(status, &json!({ "error": message }))
    }
}

const PAGE: &str = include_str!("web_console.html");
const OPENAPI: &str = include_str!("openapi.json");

/// What a caller may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    Admin,
    Stats,
}

/// Changes to the managed file, one at a time.
static WRITING: Mutex<()> = Mutex::new(());

/// Whether a path belongs to the web console.
pub fn owns(path: &str) -> bool {
    path == "/" || path == "/index.html" || path.starts_with("/api/")
}

/// Answers one request for the console or its API.
pub fn handle(app: &App, req: &Request<'_>) -> Response {
    let access = match access(app, req.authorization) {
        Some(a) => a,
        None => {
            let mut r = Response::error("401 Unauthorized", "credentials needed");
            r.headers
                .push("WWW-Authenticate: Basic realm=\"sluice\", charset=\"UTF-8\"".into());
            return r;
        }
    };
    let path = req.path.split('?').next().unwrap_or("");
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    match (req.method, parts.as_slice()) {
        ("GET", [""] | ["index.html"]) => Response {
            status: "200 OK",
            content_type: "text/html; charset=utf-8",
            body: PAGE.to_owned(),
            headers: vec!["Cache-Control: no-store".into()],
        },
        ("GET", ["api", "openapi.json"]) => Response {
            status: "200 OK",
            content_type: "application/json",
            body: OPENAPI.to_owned(),
            headers: Vec::new(),
        },
        ("GET", ["api", "pools"]) => listing(crate::admin::show::pools(app)),
        ("GET", ["api", "stats"]) => listing(crate::admin::show::stats(app)),
        ("GET", ["api", "clients"]) => listing(crate::admin::sockets::clients(app)),
        ("GET", ["api", "hosts"]) => listing(crate::admin::hosts::hosts(app)),
        ("GET", ["api", "latency"]) => Response::json("200 OK", &latency(app)),
        ("GET", ["api", "databases"]) => {
            let config = app.config();
            let mut rows = crate::admin::show::databases(app).to_json();
            if let Value::Array(rows) = &mut rows {
                for row in rows {
                    let name = row.get("name").and_then(Value::as_str).unwrap_or("");
                    let managed = config.managed.iter().any(|m| m == name);
                    row["managed"] = Value::Bool(managed);
                }
            }
            Response::json("200 OK", &rows)
        }
        (method, ["api", "databases", ..]) if method != "GET" && access != Access::Admin => {
            Response::error("403 Forbidden", "admin access needed")
        }
        ("POST", ["api", "databases"]) => create(app, req.body),
        ("PATCH", ["api", "databases", name]) => update(app, name, req.body),
        ("DELETE", ["api", "databases", name]) => remove(app, name),
        ("POST", ["api", "databases", name, action @ ("pause" | "resume")]) => {
            if app.config().database(name).is_none() {
                return Response::error("404 Not Found", "no such database");
            }
            if *action == "pause" {
                app.control.pause(Some(name));
            } else {
                app.control.resume(Some(name));
            }
            tracing::info!(db = %name, "web console: {action}");
            Response::json(
                "200 OK",
                &json!({ "name": name, "paused": *action == "pause" }),
            )
        }
        (_, ["api", ..]) => Response::error("404 Not Found", "no such endpoint"),
        _ => Response::error("404 Not Found", "not found"),
    }
}

fn listing(rs: ResultSet) -> Response {
    Response::json("200 OK", &rs.to_json())
}

/// HTTP Basic against `admin_users`/`stats_users` and the auth_file.
fn access(app: &App, authorization: Option<&str>) -> Option<Access> {
    let encoded = authorization?.trim().strip_prefix("Basic ")?;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (user, password) = text.split_once(':')?;
    let config = app.config();
    let s = &config.settings;
    let role = if s.admin_users.iter().any(|u| u == user) {
        Access::Admin
    } else if s.stats_users.iter().any(|u| u == user) {
        Access::Stats
    } else {
        return None;
    };
    let users = app.userlist();
    let ok = match users.get(user)? {
        Secret::Plain(p) => same(p.as_bytes(), password.as_bytes()),
        Secret::Md5(h) => same(
            h.as_bytes(),
            crate::auth::md5::password_hash(password, user).as_bytes(),
        ),
        Secret::Scram(secret) => secret.matches_password(password),
    };
    ok.then_some(role)
}

/// Compares without stopping at the first difference.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Per database: transaction (time a client held a server) and wait
/// histograms since start, with their p50/p99 (upper bucket bounds), for
/// the page to take differences between two polls.
fn latency(app: &App) -> Value {
    use crate::backend::stats::LATENCY_BOUNDS_US;
    let pick = |h: &crate::backend::stats::LatencyHistogram, q: f64| {
        let total: u64 = h.counts.iter().sum();
        if total == 0 {
            return Value::Null;
        }
        let want = (total as f64 * q).ceil() as u64;
        let mut seen = 0;
        for (i, c) in h.counts.iter().enumerate() {
            seen += c;
            if seen >= want {
                return LATENCY_BOUNDS_US.get(i).map_or(Value::Null, |b| json!(b));
            }
        }
        Value::Null
    };
    let rows: Vec<Value> = app
        .totals_by_database()
        .iter()
        .map(|(db, s)| {
            json!({
                "database": db,
                "bounds_us": LATENCY_BOUNDS_US,
                "xact_counts": s.linked.counts,
                "wait_counts": s.waits.counts,
                "xact_p50_us": pick(&s.linked, 0.5),
                "xact_p99_us": pick(&s.linked, 0.99),
                "wait_p99_us": pick(&s.waits, 0.99),
            })
        })
        .collect();
    Value::Array(rows)
}

/// A database entry the API manages.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Managed {
    name: String,
    host: String,
    port: u16,
    dbname: String,
    pool_mode: Option<String>,
    pool_size: Option<u32>,
}

impl Managed {
    fn line(&self) -> String {
        let mut line = format!(
            "{} = host={} port={} dbname={}",
            self.name, self.host, self.port, self.dbname
        );
        if let Some(m) = &self.pool_mode {
            line.push_str(&format!(" pool_mode={m}"));
        }
        if let Some(n) = self.pool_size {
            line.push_str(&format!(" pool_size={n}"));
        }
        line
    }
}

fn plain_name(s: &str) -> bool {
    !s.is_empty() && s.len() <= 63 && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

fn plain_host(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 255
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_' | b':' | b'/'))
}

/// The entries the API manages now, from the running configuration.
fn managed_now(app: &App) -> Vec<Managed> {
    let config = app.config();
    config
        .managed
        .iter()
        .filter_map(|name| config.database(name))
        .map(|d| Managed {
            name: d.name.clone(),
            host: d.host.clone().unwrap_or_default(),
            port: d.port.unwrap_or(5432),
            dbname: d.dbname.clone().unwrap_or_else(|| d.name.clone()),
            pool_mode: d.pool_mode.map(|m| m.as_str().to_owned()),
            pool_size: d.pool_size,
        })
        .collect()
}

/// Writes the managed file atomically, then reloads; the change is in
/// force when this returns Ok.
fn commit(app: &App, entries: &[Managed]) -> Result<(), String> {
    let path = app.config().web_console_path();
    let mut text = String::from(
        "; Written by sluice's web console: databases created through its API.\n\
         ; Edit it while sluice runs and the next change through the API overwrites it.\n\
         [databases]\n",
    );
    for e in entries {
        text.push_str(&e.line());
        text.push('\n');
    }
    // Checked as the configuration reader will read it.
    sluice_config::parse_str(&text, &path).map_err(|e| e.to_string())?;
    let tmp = path.with_extension("ini.tmp");
    std::fs::write(&tmp, &text)
        .and_then(|()| std::fs::rename(&tmp, &path))
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    let said = crate::control::reload(app);
    if let Some(failed) = said.iter().find(|s| s.starts_with("reload failed")) {
        return Err(failed.clone());
    }
    Ok(())
}

fn body_json(body: &[u8]) -> Result<serde_json::Map<String, Value>, Response> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(map)) => Ok(map),
        _ => Err(Response::error(
            "400 Bad Request",
            "the body must be a JSON object",
        )),
    }
}

fn pool_fields(
    map: &serde_json::Map<String, Value>,
) -> Result<(Option<String>, Option<u32>), Response> {
    let mode = match map.get("pool_mode") {
        None | Some(Value::Null) => None,
        Some(Value::String(m)) if ["session", "transaction", "statement"].contains(&m.as_str()) => {
            Some(m.clone())
        }
        Some(_) => {
            return Err(Response::error(
                "400 Bad Request",
                "pool_mode: session, transaction or statement",
            ));
        }
    };
    let size = match map.get("pool_size") {
        None | Some(Value::Null) => None,
        Some(v) => match v
            .as_u64()
            .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
        {
            Some(n) if (1..=100_000).contains(&n) => Some(n as u32),
            _ => {
                return Err(Response::error(
                    "400 Bad Request",
                    "pool_size: a number from 1 to 100000",
                ));
            }
        },
    };
    Ok((mode, size))
}

fn create(app: &App, body: &[u8]) -> Response {
    let map = match body_json(body) {
        Ok(m) => m,
        Err(r) => return r,
    };
    let text = |k: &str| map.get(k).and_then(Value::as_str).map(str::trim);
    let Some(name) = text("name").filter(|n| plain_name(n) && *n != "pgbouncer") else {
        return Response::error(
            "400 Bad Request",
            "name: letters, digits and _ (not pgbouncer)",
        );
    };
    let Some(host) = text("host").filter(|h| plain_host(h)) else {
        return Response::error(
            "400 Bad Request",
            "host: a host name, an address or a socket directory",
        );
    };
    let port = match map.get("port") {
        None | Some(Value::Null) => Some(5432),
        Some(v) => v
            .as_u64()
            .or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()))
            .and_then(|p| u16::try_from(p).ok())
            .filter(|&p| p > 0),
    };
    let Some(port) = port else {
        return Response::error("400 Bad Request", "port: 1-65535");
    };
    let dbname = text("dbname").filter(|d| !d.is_empty()).unwrap_or(name);
    if !plain_name(dbname) {
        return Response::error("400 Bad Request", "dbname: letters, digits and _");
    }
    let (pool_mode, pool_size) = match pool_fields(&map) {
        Ok(f) => f,
        Err(r) => return r,
    };
    let _one = WRITING.lock().unwrap_or_else(|p| p.into_inner());
    if app.config().database(name).is_some() {
        return Response::error("409 Conflict", "a database of that name exists");
    }
    let mut entries = managed_now(app);
    entries.push(Managed {
        name: name.to_owned(),
        host: host.to_owned(),
        port,
        dbname: dbname.to_owned(),
        pool_mode,
        pool_size,
    });
    match commit(app, &entries) {
        Ok(()) => {
            tracing::info!(db = %name, "web console: database created");
            Response::json("201 Created", &json!({ "name": name }))
        }
        Err(e) => Response::error("500 Internal Server Error", &e),
    }
}

fn update(app: &App, name: &str, body: &[u8]) -> Response {
    let map = match body_json(body) {
        Ok(m) => m,
        Err(r) => return r,
    };
    let (pool_mode, pool_size) = match pool_fields(&map) {
        Ok(f) => f,
        Err(r) => return r,
    };
    let _one = WRITING.lock().unwrap_or_else(|p| p.into_inner());
    let mut entries = managed_now(app);
    let Some(entry) = entries.iter_mut().find(|e| e.name == name) else {
        return not_managed(app, name);
    };
    if pool_mode.is_some() {
        entry.pool_mode = pool_mode;
    }
    if pool_size.is_some() {
        entry.pool_size = pool_size;
    }
    match commit(app, &entries) {
        Ok(()) => {
            tracing::info!(db = %name, "web console: database changed");
            Response::json("200 OK", &json!({ "name": name }))
        }
        Err(e) => Response::error("500 Internal Server Error", &e),
    }
}

fn remove(app: &App, name: &str) -> Response {
    let _one = WRITING.lock().unwrap_or_else(|p| p.into_inner());
    let mut entries = managed_now(app);
    let before = entries.len();
    entries.retain(|e| e.name != name);
    if entries.len() == before {
        return not_managed(app, name);
    }
    match commit(app, &entries) {
        Ok(()) => {
            tracing::info!(db = %name, "web console: database removed");
            Response {
                status: "204 No Content",
                content_type: "application/json",
                body: String::new(),
                headers: Vec::new(),
            }
        }
        Err(e) => Response::error("500 Internal Server Error", &e),
    }
}

fn not_managed(app: &App, name: &str) -> Response {
    if app.config().database(name).is_some() {
        Response::error(
            "409 Conflict",
            "this database is in the configuration file, not the web console's: change it there",
        )
    } else {
        Response::error("404 Not Found", "no such database")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_hosts_are_plain() {
        assert!(plain_name("webdb_1"));
        assert!(!plain_name("web db"));
        assert!(!plain_name("a;b"));
        assert!(!plain_name(""));
        assert!(plain_host("127.0.0.1"));
        assert!(plain_host("/var/run/postgresql"));
        assert!(plain_host("db-1.example.com"));
        assert!(!plain_host("a b"));
        assert!(!plain_host("x'y"));
    }

    #[test]
    fn lines_read_back_as_written() {
        let m = Managed {
            name: "webdb".into(),
            host: "127.0.0.1".into(),
            port: 5433,
            dbname: "postgres".into(),
            pool_mode: Some("transaction".into()),
            pool_size: Some(5),
        };
        let text = format!("[databases]\n{}\n", m.line());
        let config = sluice_config::parse_str(&text, std::path::Path::new("x.ini")).unwrap();
        let d = config.database("webdb").unwrap();
        assert_eq!(d.port, Some(5433));
        assert_eq!(d.pool_size, Some(5));
        assert_eq!(d.dbname.as_deref(), Some("postgres"));
    }

    #[test]
    fn basic_credentials_compare_in_full() {
        assert!(same(b"abc", b"abc"));
        assert!(!same(b"abc", b"abd"));
        assert!(!same(b"abc", b"ab"));
    }
}
