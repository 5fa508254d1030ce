//! The real prometheus-community pgbouncer_exporter (built from
//! `../shared/tools/pgbouncer_exporter-0.12.1`) pointed at sluice's admin
//! console: it must scrape without a single error, and what it reports must
//! be what sluice's own SHOW commands say. This is the drop-in claim for
//! monitoring: dashboards built for PgBouncer keep working unchanged.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use sluice_tests::*;
use tokio_postgres::{Client, SimpleQueryMessage};

/// The exporter's source, relative to the workspace root's parent.
const EXPORTER_DIR: &str = "shared/tools/pgbouncer_exporter-0.12.1";
/// The console user the exporter logs in as (a stats user, as in production).
const WATCHER: &str = "exporter";
const WATCHER_PASSWORD: &str = "exporter-secret";
/// Settings chosen to differ from the defaults, so equality means something.
const MAX_CLIENT_CONN: &str = "321";
const POOL_SIZE: &str = "6";
const RESERVE_POOL_SIZE: &str = "2";
const MAX_DB_CONNECTIONS: &str = "40";
/// Clients left connected (idle) while the numbers are compared.
const IDLE_CLIENTS: usize = 3;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent directory")
        .to_path_buf()
}

/// `../shared/tools/pgbouncer_exporter-0.12.1` beside the workspace, if present.
fn exporter_source() -> Option<PathBuf> {
    let dir = workspace_root().parent()?.join(EXPORTER_DIR);
    dir.join("go.mod").is_file().then_some(dir)
}

/// `go` on PATH, else the usual install location.
fn go_binary() -> PathBuf {
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("go"))
            .find(|candidate| candidate.is_file())
    });
    let go = on_path.unwrap_or_else(|| PathBuf::from("/usr/local/go/bin/go"));
    assert!(
        go.is_file(),
        "Go is needed to build pgbouncer_exporter: not on PATH nor at {}",
        go.display()
    );
    go
}

/// The newest modification time among the exporter's sources.
fn newest_source(dir: &Path) -> SystemTime {
    let mut newest = SystemTime::UNIX_EPOCH;
    let entries = std::fs::read_dir(dir).expect("read the exporter's source directory");
    for entry in entries {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            newest = newest.max(newest_source(&path));
        } else if let Ok(modified) = path.metadata().and_then(|m| m.modified()) {
            newest = newest.max(modified);
        }
    }
    newest
}

/// Builds the exporter into `target/tools/pgbouncer_exporter-0.12.1/`
/// (module and build caches beside it), or reuses a binary newer than its
/// sources.
fn build_exporter(source: &Path) -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"));
    let out = target.join("tools").join("pgbouncer_exporter-0.12.1");
    let binary = out.join("pgbouncer_exporter");
    let built = binary.metadata().and_then(|m| m.modified()).ok();
    if built.is_some_and(|built| built > newest_source(source)) {
        eprintln!("exporter: reusing {}", binary.display());
        return binary;
    }
    std::fs::create_dir_all(&out).expect("create target/tools");
    let go_dir = out.join("go");
    // Built under another name and renamed, so a half-written binary is
    // never taken for a finished one.
    let partial = out.join(format!("pgbouncer_exporter.partial-{}", std::process::id()));
    let mut cmd = Command::new(go_binary());
    cmd.current_dir(source)
        .arg("build")
        .arg("-o")
        .arg(&partial)
        .arg(".")
        .env("GOPATH", go_dir.join("path"))
        .env("GOMODCACHE", go_dir.join("path").join("pkg").join("mod"))
        .env("GOCACHE", go_dir.join("cache"))
        .env("GOTOOLCHAIN", "local")
        // The source is read-only and shared: never rewrite its go.mod;
        // module files writable so `cargo clean` can remove them.
        .env("GOFLAGS", "-mod=readonly -modcacherw -buildvcs=false")
        .env("CGO_ENABLED", "0");
    let started = Instant::now();
    let built = run_tool(cmd, Duration::from_secs(900));
    assert!(
        built.success(),
        "go build of pgbouncer_exporter failed:\n{}{}",
        built.stdout,
        built.stderr
    );
    std::fs::rename(&partial, &binary).expect("move the exporter binary into place");
    eprintln!(
        "exporter: built {} in {:.1}s",
        binary.display(),
        started.elapsed().as_secs_f64()
    );
    binary
}

/// A running exporter, killed on drop; its log goes to a file.
struct Exporter {
    child: Child,
    port: u16,
    log: PathBuf,
    _dir: ScratchDir,
}

impl Exporter {
    fn start(binary: &Path, console_port: u16) -> Exporter {
        let dir = ScratchDir::create();
        let log = dir.path().join("exporter.log");
        let port = sluice_testkit::free_port().expect("free port for the exporter");
        let log_file = File::create(&log).expect("create the exporter's log");
        let child = Command::new(binary)
            .arg(format!(
                "--pgBouncer.connectionString=postgres://{WATCHER}:{WATCHER_PASSWORD}@127.0.0.1:{console_port}/pgbouncer?sslmode=disable"
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .env_remove("PGBOUNCER_EXPORTER_CONNECTION_STRING")
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().expect("clone log handle"))
            .stderr(log_file)
            .spawn()
            .expect("start pgbouncer_exporter");
        Exporter {
            child,
            port,
            log,
            _dir: dir,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// GET /metrics; `None` while the exporter does not answer yet.
    fn try_scrape(&self) -> Option<String> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .ok()?;
        // HTTP/1.0: no chunked encoding, and the server closes when done.
        stream
            .write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            .ok()?;
        let mut response = String::new();
        stream.read_to_string(&mut response).ok()?;
        let (head, body) = response.split_once("\r\n\r\n")?;
        assert!(
            head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"),
            "exporter answered {head}"
        );
        Some(body.to_owned())
    }

    /// GET /metrics, waiting (up to 20 s) for the exporter to listen.
    async fn scrape(&mut self) -> Vec<Sample> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("exporter exited with {status}:\n{}", self.log());
            }
            if let Some(body) = self.try_scrape() {
                return parse_samples(&body);
            }
            assert!(
                Instant::now() < deadline,
                "exporter did not serve /metrics:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One line of the Prometheus text format.
#[derive(Debug, Clone)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

fn parse_samples(body: &str) -> Vec<Sample> {
    body.lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|line| {
            let (series, value) = line.rsplit_once(' ').expect("sample line has a value");
            let value = match value {
                "NaN" => f64::NAN,
                "+Inf" => f64::INFINITY,
                "-Inf" => f64::NEG_INFINITY,
                v => v.parse().unwrap_or_else(|_| panic!("bad value in {line}")),
            };
            let (name, labels) = match series.split_once('{') {
                Some((name, rest)) => (name, parse_labels(rest.trim_end_matches('}'))),
                None => (series, BTreeMap::new()),
            };
            Sample {
                name: name.to_owned(),
                labels,
                value,
            }
        })
        .collect()
}

/// `a="x",b="y \"q\""` into a map.
fn parse_labels(text: &str) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    let mut chars = text.chars().peekable();
    loop {
        let key: String = chars.by_ref().take_while(|&c| c != '=').collect();
        if key.is_empty() {
            return labels;
        }
        assert_eq!(chars.next(), Some('"'), "label {key} is quoted");
        let mut value = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some('n') => value.push('\n'),
                    Some(other) => value.push(other),
                    None => break,
                },
                '"' => break,
                other => value.push(other),
            }
        }
        labels.insert(key.trim_start_matches(',').to_owned(), value);
        if chars.peek() == Some(&',') {
            chars.next();
        }
    }
}

/// The value of `name` whose labels include `labels`.
fn metric(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .find(|s| {
            s.name == name
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .unwrap_or_else(|| panic!("no {name}{labels:?} in the scrape"))
        .value
}

/// Rows of a console SHOW as column -> value (NULL as "").
type Rows = Vec<BTreeMap<String, String>>;

async fn show(console: &Client, command: &str) -> Rows {
    console
        .simple_query(command)
        .await
        .unwrap_or_else(|e| panic!("{command}: {e:?}"))
        .into_iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(row) => Some(
                row.columns()
                    .iter()
                    .enumerate()
                    .map(|(i, c)| (c.name().to_owned(), row.get(i).unwrap_or("").to_owned()))
                    .collect(),
            ),
            _ => None,
        })
        .collect()
}

/// The row of `rows` whose `key` column is `value`.
fn row<'a>(rows: &'a Rows, key: &str, value: &str) -> &'a BTreeMap<String, String> {
    rows.iter()
        .find(|r| r.get(key).map(String::as_str) == Some(value))
        .unwrap_or_else(|| panic!("no row with {key} = {value} in {rows:?}"))
}

fn num(row: &BTreeMap<String, String>, column: &str) -> f64 {
    row.get(column)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("column {column} is not a number in {row:?}"))
}

/// What the console says, read in one go.
struct Snapshot {
    stats: Rows,
    stats_totals: Rows,
    pools: Rows,
    databases: Rows,
    users: Rows,
    config: Rows,
    lists: Rows,
    clients: Rows,
    version: String,
}

async fn snapshot(console: &Client) -> Snapshot {
    let version = show(console, "SHOW VERSION").await;
    Snapshot {
        stats: show(console, "SHOW STATS").await,
        stats_totals: show(console, "SHOW STATS_TOTALS").await,
        pools: show(console, "SHOW POOLS").await,
        databases: show(console, "SHOW DATABASES").await,
        users: show(console, "SHOW USERS").await,
        config: show(console, "SHOW CONFIG").await,
        lists: show(console, "SHOW LISTS").await,
        clients: show(console, "SHOW CLIENTS").await,
        version: version
            .first()
            .and_then(|r| r.get("version"))
            .cloned()
            .expect("SHOW VERSION row"),
    }
}

/// The `postgres` rows that must not move while nothing runs.
fn quiet_part(s: &Snapshot) -> String {
    format!(
        "{:?} {:?} {:?}",
        row(&s.stats_totals, "database", "postgres"),
        row(&s.pools, "database", "postgres"),
        row(&s.databases, "name", "postgres")
    )
}

/// The families the exporter produced, each with its samples, for the log.
fn print_families(samples: &[Sample]) {
    let mut families: BTreeMap<&str, Vec<&Sample>> = BTreeMap::new();
    for s in samples.iter().filter(|s| s.name.starts_with("pgbouncer_")) {
        families.entry(s.name.as_str()).or_default().push(s);
    }
    eprintln!("exporter: {} pgbouncer_* families:", families.len());
    for (name, samples) in &families {
        let shown: Vec<String> = samples
            .iter()
            .map(|s| {
                let labels: Vec<String> = s
                    .labels
                    .iter()
                    .filter(|(_, v)| !v.is_empty())
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect();
                format!("{{{}}}={}", labels.join(","), s.value)
            })
            .collect();
        eprintln!("  {name} {}", shown.join(" "));
    }
}

/// Asserts equality and prints the pair.
fn same(what: &str, exporter: f64, console: f64) {
    eprintln!("  {what:<58} exporter {exporter:>12} console {console:>12}");
    assert!(
        (exporter - console).abs() <= 1e-9 * console.abs().max(1.0),
        "{what}: exporter says {exporter}, console says {console}"
    );
}

/// Lines of the exporter's log that report a failed or partial scrape:
/// errors and warnings (a failed query, `pgbouncer_up 0`) and the info-level
/// "error parsing" / "namespace disappeared" it logs when a column does not
/// convert or a SHOW fails.
fn scrape_problems(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| {
            let l = l.to_ascii_lowercase();
            l.contains("level=error")
                || l.contains("level=warn")
                || l.contains("error parsing")
                || l.contains("namespace disappeared")
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgbouncer_exporter_scrapes_the_console_and_agrees_with_show() {
    let Some(source) = exporter_source() else {
        eprintln!(
            "skipped: pgbouncer_exporter source {} absent",
            workspace_root()
                .parent()
                .map(|p| p.join(EXPORTER_DIR))
                .unwrap_or_default()
                .display()
        );
        return;
    };
    let test_started = Instant::now();
    let binary = tokio::task::spawn_blocking(move || build_exporter(&source))
        .await
        .expect("exporter build task");
    let built_at = test_started.elapsed();

    let cluster = app_cluster(ServerAuth::ScramSha256);
    cluster.pgbench_init("postgres", 1).expect("pgbench -i");
    cluster
        .psql(
            "postgres",
            &format!("grant select on all tables in schema public to {APP_USER}"),
        )
        .expect("grant select on the pgbench tables");
    let sluice = ConfigBuilder::for_cluster(&cluster)
        .set("pool_mode", "transaction")
        .set("auth_type", "scram-sha-256")
        .set("default_pool_size", POOL_SIZE)
        .set("reserve_pool_size", RESERVE_POOL_SIZE)
        .set("max_db_connections", MAX_DB_CONNECTIONS)
        .set("max_client_conn", MAX_CLIENT_CONN)
        .set("stats_users", WATCHER)
        // A [users] entry, so SHOW USERS has a row for the app's clients
        // (sluice lists only that section's users).
        .user(APP_USER, "max_user_client_connections=50")
        .userlist(&[(APP_USER, APP_PASSWORD), (WATCHER, WATCHER_PASSWORD)])
        .start();
    let port = sluice.port();
    let console = connect(port, WATCHER, WATCHER_PASSWORD, "pgbouncer")
        .await
        .expect("stats user logs in to the console");
    let mut exporter = Exporter::start(&binary, port);

    // Traffic: pgbench -S, 4 clients for 5 seconds, scraped once all 4
    // are in.
    let bench = std::thread::spawn(move || {
        pgbench(
            port,
            APP_USER,
            APP_PASSWORD,
            "postgres",
            &["-n", "-S", "-c", "4", "-j", "2", "-T", "5"],
            Duration::from_secs(60),
        )
    });
    eventually(Duration::from_secs(4), || async {
        let pools = show(&console, "SHOW POOLS").await;
        let clients = pools
            .iter()
            .find(|r| r.get("database").map(String::as_str) == Some("postgres"))
            .map(|r| num(r, "cl_active") + num(r, "cl_waiting"));
        (clients == Some(4.0)).then_some(())
    })
    .await
    .expect("pgbench's 4 clients logged in within 4 s");
    let under_load = exporter.scrape().await;
    let loaded = snapshot(&console).await;
    let out = tokio::task::spawn_blocking(move || bench.join().expect("pgbench thread"))
        .await
        .expect("pgbench join task");
    assert!(out.success(), "pgbench: {}{}", out.stdout, out.stderr);
    assert!(
        out.stdout.contains("number of failed transactions: 0"),
        "{}",
        out.stdout
    );
    let load_pool = row(&loaded.pools, "database", "postgres");
    let load_db = row(&loaded.databases, "name", "postgres");
    let load_user = row(&loaded.users, "name", APP_USER);
    eprintln!(
        "under load: exporter cl_active {} | console SHOW POOLS cl_active {} cl_waiting {} sv_active {} sv_idle {} | SHOW DATABASES current_connections {} current_client_connections {} | SHOW USERS current_connections {} current_client_connections {}",
        metric(
            &under_load,
            "pgbouncer_pools_client_active_connections",
            &[("database", "postgres")]
        ),
        num(load_pool, "cl_active"),
        num(load_pool, "cl_waiting"),
        num(load_pool, "sv_active"),
        num(load_pool, "sv_idle"),
        num(load_db, "current_connections"),
        num(load_db, "current_client_connections"),
        num(load_user, "current_connections"),
        num(load_user, "current_client_connections"),
    );
    assert_eq!(
        num(load_pool, "cl_active") + num(load_pool, "cl_waiting"),
        4.0,
        "pgbench's 4 clients in SHOW POOLS: {load_pool:?}"
    );
    assert_eq!(
        num(load_db, "current_client_connections"),
        4.0,
        "SHOW DATABASES current_client_connections under load: {load_db:?}"
    );
    assert_eq!(
        num(load_user, "current_client_connections"),
        4.0,
        "SHOW USERS current_client_connections under load: {load_user:?}"
    );

    // Quiet: pgbench gone, a few idle clients left; the console must read
    // the same before and after the scrape, and the scrape must match it.
    let mut idle = Vec::new();
    for _ in 0..IDLE_CLIENTS {
        let c = connect(port, APP_USER, APP_PASSWORD, "postgres")
            .await
            .expect("idle client logs in");
        c.simple_query("select 1").await.expect("select 1");
        idle.push(c);
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    let (before, samples) = loop {
        // Closed connections (pgbench's, the exporter's last one) are
        // counted out once sluice has seen them go.
        eventually(Duration::from_secs(10), || async {
            let lists = show(&console, "SHOW LISTS").await;
            let used = num(row(&lists, "list", "used_clients"), "items");
            (used == IDLE_CLIENTS as f64 + 1.0).then_some(())
        })
        .await
        .expect("LISTS used_clients settles on the idle clients and this console");
        let before = snapshot(&console).await;
        let samples = exporter.scrape().await;
        let after = snapshot(&console).await;
        if quiet_part(&before) == quiet_part(&after) {
            break (before, samples);
        }
        assert!(
            Instant::now() < deadline,
            "the console never read the same twice around a scrape"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    print_families(&samples);

    let log = exporter.log();
    let problems = scrape_problems(&log);
    assert!(
        problems.is_empty(),
        "the exporter logged scrape problems:\n{}",
        problems.join("\n")
    );
    assert_eq!(metric(&samples, "pgbouncer_up", &[]), 1.0, "pgbouncer_up");
    assert_eq!(
        metric(&under_load, "pgbouncer_up", &[]),
        1.0,
        "pgbouncer_up under load"
    );
    for family in [
        "pgbouncer_pools_client_active_connections",
        "pgbouncer_pools_client_waiting_connections",
        "pgbouncer_pools_server_active_connections",
        "pgbouncer_pools_server_idle_connections",
        "pgbouncer_pools_client_maxwait_seconds",
        "pgbouncer_stats_totals_queries_pooled_total",
        "pgbouncer_stats_totals_sql_transactions_pooled_total",
        "pgbouncer_stats_totals_received_bytes_total",
        "pgbouncer_stats_totals_sent_bytes_total",
        "pgbouncer_stats_totals_queries_duration_seconds_total",
        "pgbouncer_stats_totals_server_assignments_total",
        "pgbouncer_databases_pool_size",
        "pgbouncer_databases_reserve_pool",
        "pgbouncer_databases_max_connections",
        "pgbouncer_databases_current_connections",
        "pgbouncer_databases_paused",
        "pgbouncer_databases_disabled",
        "pgbouncer_config_max_client_connections",
        "pgbouncer_config_max_user_connections",
        "pgbouncer_version_info",
        "pgbouncer_databases",
        "pgbouncer_pools",
        "pgbouncer_used_clients",
        "pgbouncer_client_connections",
    ] {
        assert!(
            samples.iter().any(|s| s.name == family),
            "family {family} missing from the scrape"
        );
    }

    eprintln!("comparison (console read before and after the scrape, identical):");
    let db = [("database", "postgres")];
    let totals = row(&before.stats_totals, "database", "postgres");
    let stats = row(&before.stats, "database", "postgres");
    for (family, column, stats_column, factor) in [
        (
            "pgbouncer_stats_totals_sql_transactions_pooled_total",
            "xact_count",
            "total_xact_count",
            1.0,
        ),
        (
            "pgbouncer_stats_totals_queries_pooled_total",
            "query_count",
            "total_query_count",
            1.0,
        ),
        (
            "pgbouncer_stats_totals_received_bytes_total",
            "bytes_received",
            "total_received",
            1.0,
        ),
        (
            "pgbouncer_stats_totals_sent_bytes_total",
            "bytes_sent",
            "total_sent",
            1.0,
        ),
        (
            "pgbouncer_stats_totals_server_assignments_total",
            "server_assignment_count",
            "total_server_assignment_count",
            1.0,
        ),
        (
            "pgbouncer_stats_totals_queries_duration_seconds_total",
            "query_time",
            "total_query_time",
            1e-6,
        ),
        (
            "pgbouncer_stats_totals_server_in_transaction_seconds_total",
            "xact_time",
            "total_xact_time",
            1e-6,
        ),
        (
            "pgbouncer_stats_totals_client_wait_seconds_total",
            "wait_time",
            "total_wait_time",
            1e-6,
        ),
    ] {
        let console = num(totals, column) * factor;
        same(
            &format!("{family} = STATS_TOTALS.{column}"),
            metric(&samples, family, &db),
            console,
        );
        assert_eq!(
            num(totals, column),
            num(stats, stats_column),
            "SHOW STATS {stats_column} = SHOW STATS_TOTALS {column}"
        );
    }
    let xacts = num(totals, "xact_count");
    let pgbench_xacts: f64 = out
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("number of transactions actually processed: "))
        .and_then(|rest| rest.split('/').next())
        .and_then(|n| n.trim().parse().ok())
        .expect("pgbench's transaction count");
    eprintln!(
        "  pgbench processed {pgbench_xacts} transactions; sluice counted {xacts} (plus pgbench's setup queries and {IDLE_CLIENTS} × select 1)"
    );
    assert!(
        xacts >= pgbench_xacts + IDLE_CLIENTS as f64,
        "sluice counted fewer transactions ({xacts}) than were run ({pgbench_xacts} + {IDLE_CLIENTS})"
    );

    let pool = row(&before.pools, "database", "postgres");
    let pool_labels = [("database", "postgres"), ("user", APP_USER)];
    for (family, column) in [
        ("pgbouncer_pools_client_active_connections", "cl_active"),
        ("pgbouncer_pools_client_waiting_connections", "cl_waiting"),
        ("pgbouncer_pools_server_active_connections", "sv_active"),
        ("pgbouncer_pools_server_idle_connections", "sv_idle"),
        ("pgbouncer_pools_server_used_connections", "sv_used"),
        ("pgbouncer_pools_server_login_connections", "sv_login"),
        ("pgbouncer_pools_client_maxwait_seconds", "maxwait"),
    ] {
        same(
            &format!("{family} = POOLS.{column}"),
            metric(&samples, family, &pool_labels),
            num(pool, column),
        );
    }
    assert_eq!(
        num(pool, "cl_active"),
        IDLE_CLIENTS as f64,
        "the idle clients are cl_active: {pool:?}"
    );
    assert!(
        num(pool, "sv_idle") >= 1.0 && num(pool, "sv_active") == 0.0,
        "transaction pooling: no server held by an idle client: {pool:?}"
    );

    let database = row(&before.databases, "name", "postgres");
    let db_labels = [("name", "postgres")];
    for (family, column) in [
        ("pgbouncer_databases_pool_size", "pool_size"),
        ("pgbouncer_databases_reserve_pool", "reserve_pool_size"),
        ("pgbouncer_databases_max_connections", "max_connections"),
        (
            "pgbouncer_databases_current_connections",
            "current_connections",
        ),
        ("pgbouncer_databases_paused", "paused"),
        ("pgbouncer_databases_disabled", "disabled"),
    ] {
        same(
            &format!("{family} = DATABASES.{column}"),
            metric(&samples, family, &db_labels),
            num(database, column),
        );
    }
    assert_eq!(
        database.get("pool_size").map(String::as_str),
        Some(POOL_SIZE)
    );
    assert_eq!(
        database.get("reserve_pool_size").map(String::as_str),
        Some(RESERVE_POOL_SIZE)
    );
    assert_eq!(
        database.get("max_connections").map(String::as_str),
        Some(MAX_DB_CONNECTIONS)
    );
    assert_eq!(
        num(database, "current_connections"),
        num(pool, "sv_active")
            + num(pool, "sv_idle")
            + num(pool, "sv_used")
            + num(pool, "sv_login"),
        "current_connections is the pool's servers: {database:?} {pool:?}"
    );
    eprintln!(
        "  SHOW DATABASES current_client_connections {} with {IDLE_CLIENTS} idle clients (cl_active {})",
        num(database, "current_client_connections"),
        num(pool, "cl_active")
    );
    assert_eq!(
        num(database, "current_client_connections"),
        IDLE_CLIENTS as f64,
        "SHOW DATABASES current_client_connections: {database:?}"
    );
    let user = row(&before.users, "name", APP_USER);
    eprintln!(
        "  SHOW USERS {APP_USER}: current_client_connections {} max_user_client_connections {} current_connections {}",
        num(user, "current_client_connections"),
        num(user, "max_user_client_connections"),
        num(user, "current_connections"),
    );
    assert_eq!(
        num(user, "current_client_connections"),
        IDLE_CLIENTS as f64,
        "SHOW USERS current_client_connections: {user:?}"
    );
    assert_eq!(num(user, "max_user_client_connections"), 50.0);
    assert_eq!(
        num(user, "current_connections"),
        num(database, "current_connections")
    );

    for (family, key) in [
        ("pgbouncer_config_max_client_connections", "max_client_conn"),
        (
            "pgbouncer_config_max_user_connections",
            "max_user_connections",
        ),
    ] {
        same(
            &format!("{family} = CONFIG.{key}"),
            metric(&samples, family, &[]),
            num(row(&before.config, "key", key), "value"),
        );
    }
    assert_eq!(
        metric(&samples, "pgbouncer_config_max_client_connections", &[]),
        321.0
    );

    // The exporter's own console connection is open while it scrapes, and
    // PgBouncer counts it in used_clients as sluice does.
    for (family, list, own) in [
        ("pgbouncer_databases", "databases", 0.0),
        ("pgbouncer_users", "users", 0.0),
        ("pgbouncer_pools", "pools", 0.0),
        ("pgbouncer_free_clients", "free_clients", 0.0),
        ("pgbouncer_used_clients", "used_clients", 1.0),
        ("pgbouncer_login_clients", "login_clients", 0.0),
        ("pgbouncer_free_servers", "free_servers", 0.0),
        ("pgbouncer_used_servers", "used_servers", 0.0),
    ] {
        let what = if own > 0.0 {
            format!("{family} = LISTS.{list} + the exporter's connection")
        } else {
            format!("{family} = LISTS.{list}")
        };
        same(
            &what,
            metric(&samples, family, &[]),
            num(row(&before.lists, "list", list), "items") + own,
        );
    }
    let list = |name: &str| num(row(&before.lists, "list", name), "items");
    assert_eq!(
        list("databases"),
        before.databases.len() as f64,
        "LISTS databases counts the rows of SHOW DATABASES (pgbouncer included)"
    );
    assert_eq!(
        list("used_servers"),
        num(database, "current_connections"),
        "LISTS used_servers counts every server connection, idle ones too"
    );
    assert_eq!(
        list("used_clients"),
        IDLE_CLIENTS as f64 + 1.0,
        "LISTS used_clients: the idle clients and this test's console"
    );

    // SHOW CLIENTS grouped as the exporter groups it, for the app's pool
    // (console clients come and go with the scrapes themselves).
    let mut by_state: BTreeMap<(String, String), f64> = BTreeMap::new();
    for c in before
        .clients
        .iter()
        .filter(|c| c.get("database").map(String::as_str) == Some("postgres"))
    {
        let app = c.get("application_name").cloned().unwrap_or_default();
        let state = c.get("state").cloned().unwrap_or_default();
        *by_state.entry((app, state)).or_default() += 1.0;
    }
    assert_eq!(by_state.values().sum::<f64>(), IDLE_CLIENTS as f64);
    for ((app, state), count) in &by_state {
        same(
            &format!("pgbouncer_client_connections{{app={app:?},state={state}}}"),
            metric(
                &samples,
                "pgbouncer_client_connections",
                &[
                    ("database", "postgres"),
                    ("user", APP_USER),
                    ("application_name", app),
                    ("state", state),
                ],
            ),
            *count,
        );
    }

    let version = samples
        .iter()
        .find(|s| s.name == "pgbouncer_version_info")
        .expect("pgbouncer_version_info");
    eprintln!(
        "  pgbouncer_version_info{{version={:?}}} = SHOW VERSION {:?}",
        version.labels.get("version"),
        before.version
    );
    assert_eq!(version.labels.get("version"), Some(&before.version));
    assert_eq!(version.value, 1.0);

    eprintln!("exporter log (no error, warning or parse problem):");
    for line in log.lines() {
        eprintln!("  {line}");
    }
    eprintln!(
        "exporter binary ready after {:.1}s, test took {:.1}s",
        built_at.as_secs_f64(),
        test_started.elapsed().as_secs_f64()
    );
    drop(idle);
}
