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

/// One request, as `http.rs` read it (credentials already checked).
pub struct Request<'a> {
    pub method: &'a str,
    pub path: &'a str,
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
    /// 401 with the Basic challenge.
    /// Too many failed logins lately: no password is checked now.
    pub fn throttled() -> Self {
        let mut r = Self::error(
            "429 Too Many Requests",
            "too many failed logins; try again in a few seconds",
        );
        r.headers.push("Retry-After: 2".into());
        r
    }

    pub fn unauthorized() -> Self {
        let mut r = Self::error("401 Unauthorized", "credentials needed");
        r.headers
            .push("WWW-Authenticate: Basic realm=\"sluice\", charset=\"UTF-8\"".into());
        r
    }

    pub fn json(status: &'static str, body: &Value) -> Self {
        Self {
            status,
            content_type: "application/json",
            body: body.to_string(),
            headers: Vec::new(),
        }
    }

    pub fn error(status: &'static str, message: &str) -> Self {
        Self::json(status, &json!({ "error": message }))
    }
}

const PAGE: &str = include_str!("web_console.html");
const OPENAPI: &str = include_str!("openapi.json");

/// What a caller may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Admin,
    Stats,
}

/// Changes to the managed file, one at a time.
static WRITING: Mutex<()> = Mutex::new(());

/// Whether a path belongs to the web console.
pub fn owns(path: &str) -> bool {
    path == "/" || path == "/index.html" || path.starts_with("/api/")
}

/// Answers one request for the console or its API, from a caller whose
/// credentials gave it `access`.
pub fn handle(app: &App, access: Access, req: &Request<'_>) -> Response {
    let mut response = route(app, access, req);
    // Never framed, never sniffed, never cached.
    response.headers.extend([
        "X-Frame-Options: DENY".to_owned(),
        "X-Content-Type-Options: nosniff".to_owned(),
        "Cache-Control: no-store".to_owned(),
        "Content-Security-Policy: default-src 'none'; script-src 'unsafe-inline'; \
         style-src 'unsafe-inline'; connect-src 'self'; img-src data:; \
         frame-ancestors 'none'; form-action 'none'"
            .to_owned(),
    ]);
    response
}

fn route(app: &App, access: Access, req: &Request<'_>) -> Response {
    let path = req.path.split('?').next().unwrap_or("");
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    match (req.method, parts.as_slice()) {
        ("GET", [""] | ["index.html"]) => Response {
            status: "200 OK",
            content_type: "text/html; charset=utf-8",
            body: PAGE.to_owned(),
            headers: Vec::new(),
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

/// Why a request of the web console's is not let in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// No credentials, or wrong ones (401).
    Unauthorized,
    /// Too many failed logins lately (429): nothing was checked.
    Throttled,
}

/// Failed web console logins allowed, every second and at once, for the
/// whole process (review 50: wrong guesses for a SCRAM admin, each a
/// PBKDF2, cut pgbench's throughput by a third, and a delay per failure
/// held the endpoint's connections and failed `/health`). Past them no
/// password is checked until the budget refills: guessing stays at 10 a
/// second whatever the number of connections or addresses, a password
/// verified in the last five minutes still passes, and other logins wait.
const FAILURES_PER_SECOND: f64 = 10.0;
const FAILURES_AT_ONCE: f64 = 20.0;

/// The failure budget: tokens left and when they were counted.
static FAILURES: Mutex<Option<(f64, std::time::Instant)>> = Mutex::new(None);

/// Whether a failure may be afforded now (`spend`: one is spent).
fn failure_budget(spend: bool) -> bool {
    let mut budget = FAILURES.lock().unwrap_or_else(|p| p.into_inner());
    let now = std::time::Instant::now();
    let (tokens, at) = budget.get_or_insert((FAILURES_AT_ONCE, now));
    *tokens = (*tokens + at.elapsed().as_secs_f64() * FAILURES_PER_SECOND).min(FAILURES_AT_ONCE);
    *at = now;
    if *tokens < 1.0 {
        return false;
    }
    if spend {
        *tokens -= 1.0;
    }
    true
}

/// HTTP Basic against `admin_users`/`stats_users` and the auth_file (an
/// empty password never passes). A SCRAM secret costs thousands of HMACs
/// to check, so the caller runs this off the event loop, and a password
/// once verified is remembered (by its hash) for five minutes. Failures
/// share one budget (`FAILURES_PER_SECOND`): past it nothing is checked.
pub fn authorize(app: &App, authorization: Option<&str>) -> Result<Access, Refused> {
    let checked = check_credentials(app, authorization);
    match checked {
        Ok(access) => Ok(access),
        Err(Refused::Unauthorized) if authorization.is_some() => {
            tracing::warn!("web console: a login failed");
            failure_budget(true);
            Err(Refused::Unauthorized)
        }
        Err(refused) => Err(refused),
    }
}

fn check_credentials(app: &App, authorization: Option<&str>) -> Result<Access, Refused> {
    use Refused::Unauthorized;
    check_credentials_inner(app, authorization).ok_or(Unauthorized)?
}

fn check_credentials_inner(
    app: &App,
    authorization: Option<&str>,
) -> Option<Result<Access, Refused>> {
    // (the scheme's name is case-insensitive: RFC 9110 11.1)
    let (scheme, encoded) = authorization?.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (user, password) = text.split_once(':')?;
    if password.is_empty() {
        return None;
    }
    // (throttled, nothing is looked up: a 429 for known names only told
    // which names exist, review 51)
    let key = (user.to_owned(), sha256_of(password.as_bytes()));
    let verified = verified_recently(&key);
    if !verified && !failure_budget(false) {
        return Some(Err(Refused::Throttled));
    }
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
    let secret = users.get(user)?;
    if let Secret::Scram(_) = secret
        && verified
    {
        return Some(Ok(role));
    }
    let ok = match secret {
        Secret::Plain(p) => same(p.as_bytes(), password.as_bytes()),
        Secret::Md5(h) => same(
            h.as_bytes(),
            crate::auth::md5::password_hash(password, user).as_bytes(),
        ),
        Secret::Scram(secret) => {
            let ok = secret.matches_password(password);
            if ok {
                remember_verified(key);
            }
            ok
        }
    };
    ok.then_some(Ok(role))
}

type VerifiedKey = (String, [u8; 32]);

/// SCRAM passwords verified lately (user, SHA-256 of the password).
static VERIFIED: Mutex<Vec<(VerifiedKey, std::time::Instant)>> = Mutex::new(Vec::new());

const VERIFIED_FOR: std::time::Duration = std::time::Duration::from_secs(300);

fn sha256_of(bytes: &[u8]) -> [u8; 32] {
    use sha2::Digest as _;
    sha2::Sha256::digest(bytes).into()
}

fn verified_recently(key: &VerifiedKey) -> bool {
    let mut seen = VERIFIED.lock().unwrap_or_else(|p| p.into_inner());
    seen.retain(|(_, at)| at.elapsed() < VERIFIED_FOR);
    seen.iter().any(|(k, _)| k == key)
}

fn remember_verified(key: VerifiedKey) {
    let mut seen = VERIFIED.lock().unwrap_or_else(|p| p.into_inner());
    if seen.len() >= 64 {
        seen.remove(0);
    }
    seen.push((key, std::time::Instant::now()));
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

/// The web console's file as raw `name = connection string` lines of its
/// `[databases]` section: what the API changes is the file on disk (lines
/// added by hand keep every parameter), not the running configuration.
fn read_managed(path: &std::path::Path) -> Result<(String, Vec<(String, String)>), String> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    let mut entries = Vec::new();
    let mut in_databases = false;
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with(';') || line.starts_with('#') {
            continue;
        }
        if line.starts_with('[') {
            in_databases = line == "[databases]";
            continue;
        }
        // (read as the configuration reader reads it: a quoted name may
        // hold '=' or spaces)
        if let (true, Ok(entry)) = (in_databases, sluice_config::ini_key_value(line)) {
            entries.push(entry);
        }
    }
    Ok((text, entries))
}

fn managed_text(entries: &[(String, String)]) -> String {
    let mut text = String::from(
        "; Written by sluice's web console: databases created through its API.\n\
         ; Lines added by hand stay as written; the API rewrites the rest.\n\
         [databases]\n",
    );
    for (name, value) in entries {
        text.push_str(&format!("{} = {value}\n", sluice_config::ini_key(name)));
    }
    text
}

/// Writes `text` to `path` through a temporary file of this process
/// (written, synced, renamed).
fn replace_file(path: &std::path::Path, text: &str) -> Result<(), String> {
    use std::io::Write as _;
    let tmp = path.with_extension(format!("ini.{}.tmp", std::process::id()));
    let written = std::fs::File::create(&tmp)
        .and_then(|mut f| f.write_all(text.as_bytes()).and_then(|()| f.sync_all()))
        .and_then(|()| std::fs::rename(&tmp, path));
    written.map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        format!("cannot write {}: {e}", path.display())
    })
}

/// Holds an exclusive lock on `<file>.lock` (sluices sharing the file take
/// turns) for as long as it lives.
struct FileLock {
    _held: std::fs::File,
}

impl FileLock {
    fn take(path: &std::path::Path) -> Result<Self, String> {
        use std::os::fd::AsRawFd;
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path.with_extension("ini.lock"))
            .map_err(|e| format!("cannot lock {}: {e}", path.display()))?;
        // SAFETY: flock on a descriptor this struct owns.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(format!(
                "cannot lock {}: {}",
                path.display(),
                std::io::Error::last_os_error()
            ));
        }
        Ok(Self { _held: lock })
    }
}

/// Applies `change` to the file's entries under the locks, writes it,
/// reloads; a reload that fails puts the old file back. `change` answers
/// an error response to refuse.
fn change_managed(
    app: &App,
    change: impl FnOnce(&mut Vec<(String, String)>) -> Result<(), Response>,
) -> Result<(), Response> {
    let _one = WRITING.lock().unwrap_or_else(|p| p.into_inner());
    let path = app.config().web_console_path();
    let fail = |e: String| Response::error("500 Internal Server Error", &e);
    let _file = FileLock::take(&path).map_err(fail)?;
    let (old, mut entries) = read_managed(&path).map_err(fail)?;
    change(&mut entries)?;
    let text = managed_text(&entries);
    // Checked as the configuration reader will read it.
    sluice_config::parse_str(&text, &path)
        .map_err(|e| Response::error("400 Bad Request", &e.to_string()))?;
    replace_file(&path, &text).map_err(fail)?;
    let said = crate::reload::reload(app);
    if let Some(failed) = said.refused() {
        let restored = replace_file(&path, &old);
        return Err(fail(format!(
            "{failed}; the web console's file {}",
            if restored.is_ok() {
                "was put back as it was"
            } else {
                "could not be put back"
            }
        )));
    }
    Ok(())
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
    let Some(name) =
        text("name").filter(|n| plain_name(n) && !crate::admin::CONSOLE_DATABASES.contains(n))
    else {
        return Response::error(
            "400 Bad Request",
            "name: letters, digits and _ (not pgbouncer or sluice)",
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
    let mut pairs = vec![
        ("host".to_owned(), host.to_owned()),
        ("port".to_owned(), port.to_string()),
        ("dbname".to_owned(), dbname.to_owned()),
    ];
    pairs.extend(pool_mode.map(|m| ("pool_mode".to_owned(), m)));
    pairs.extend(pool_size.map(|n| ("pool_size".to_owned(), n.to_string())));
    let changed = change_managed(app, |entries| {
        if app.config().database(name).is_some() || entries.iter().any(|(n, _)| n == name) {
            return Err(Response::error(
                "409 Conflict",
                "a database of that name exists",
            ));
        }
        entries.push((name.to_owned(), sluice_config::connstring_text(&pairs)));
        Ok(())
    });
    match changed {
        Ok(()) => {
            tracing::info!(db = %name, "web console: database created");
            Response::json("201 Created", &json!({ "name": name }))
        }
        Err(r) => r,
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
    let changed = change_managed(app, |entries| {
        let Some((_, value)) = entries.iter_mut().find(|(n, _)| n == name) else {
            return Err(not_managed(app, name));
        };
        let mut pairs = sluice_config::connstring_pairs(value).map_err(|e| {
            Response::error("409 Conflict", &format!("the entry cannot be read: {e}"))
        })?;
        for (key, new) in [
            ("pool_mode", pool_mode.clone()),
            ("pool_size", pool_size.map(|n| n.to_string())),
        ] {
            let Some(new) = new else { continue };
            match pairs.iter_mut().find(|(k, _)| k == key) {
                Some((_, v)) => *v = new,
                None => pairs.push((key.to_owned(), new)),
            }
        }
        *value = sluice_config::connstring_text(&pairs);
        Ok(())
    });
    match changed {
        Ok(()) => {
            tracing::info!(db = %name, "web console: database changed");
            Response::json("200 OK", &json!({ "name": name }))
        }
        Err(r) => r,
    }
}

fn remove(app: &App, name: &str) -> Response {
    let changed = change_managed(app, |entries| {
        let before = entries.len();
        entries.retain(|(n, _)| n != name);
        if entries.len() == before {
            return Err(not_managed(app, name));
        }
        Ok(())
    });
    match changed {
        Ok(()) => {
            tracing::info!(db = %name, "web console: database removed");
            Response {
                status: "204 No Content",
                content_type: "application/json",
                body: String::new(),
                headers: Vec::new(),
            }
        }
        Err(r) => r,
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
    fn the_file_keeps_hand_written_lines() {
        let dir = std::env::temp_dir().join(format!("sluice-web-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("sluice-web.ini");
        std::fs::write(
            &path,
            "; mine\n[databases]\nhand = host=/tmp port=5433 user=x password='a b'\n\
             \"my db=2\" = host=/tmp dbname=x\n\"say \"\"hi\"\"\" = host=/tmp\n",
        )
        .unwrap();
        let (_, mut entries) = read_managed(&path).unwrap();
        assert_eq!(entries.len(), 3);
        assert_eq!(entries[1].0, "my db=2");
        assert_eq!(entries[2].0, "say \"hi\"");
        entries.push(("api".into(), "host=127.0.0.1 port=5432 dbname=api".into()));
        let text = managed_text(&entries);
        replace_file(&path, &text).unwrap();
        let config =
            sluice_config::parse_str(&std::fs::read_to_string(&path).unwrap(), &path).unwrap();
        let hand = config.database("hand").unwrap();
        assert_eq!(hand.password.as_deref(), Some("a b"));
        // (names that need quotes keep them)
        assert!(config.database("my db=2").is_some());
        assert!(config.database("say \"hi\"").is_some());
        assert_eq!(config.database("api").and_then(|d| d.port), Some(5432));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn basic_credentials_compare_in_full() {
        assert!(same(b"abc", b"abc"));
        assert!(!same(b"abc", b"abd"));
        assert!(!same(b"abc", b"ab"));
    }
}
