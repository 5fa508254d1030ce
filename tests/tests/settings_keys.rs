//! Keys that used to be accepted and ignored (issue 12), each doing what
//! PgBouncer's reference says: `transaction_timeout` (global and per user),
//! the per-user `idle_transaction_timeout`, `disable_pqexec` and
//! `unix_socket_group`, `server_check_query`/`server_check_delay`, and
//! `dns_max_ttl` (with the c-ares-only keys refused at startup),
//! `log_connections` and `syslog`/`syslog_ident`/`syslog_facility`.

use std::time::{Duration, Instant};

use sluice_tests::*;

fn transaction_pool(cluster: &Cluster) -> ConfigBuilder {
    ConfigBuilder::for_cluster(cluster)
        .set("pool_mode", "transaction")
        .set("default_pool_size", "2")
}

/// The SQLSTATE and message of a failed request.
fn failure<T: std::fmt::Debug>(result: Result<T, tokio_postgres::Error>) -> (String, String) {
    let error = result.expect_err("the request must fail");
    let db = error
        .as_db_error()
        .unwrap_or_else(|| panic!("no ErrorResponse: {error:?}"));
    (db.code().code().to_owned(), db.message().to_owned())
}

/// The FATAL a client was sent: with the failed request's result when it
/// came as its answer, else from the connection (sent while it was idle).
async fn fatal<T: std::fmt::Debug>(
    client: &mut Tracked,
    result: Result<T, tokio_postgres::Error>,
) -> (String, String) {
    let error = result.expect_err("the request must fail");
    if let Some(db) = error.as_db_error() {
        return (db.code().code().to_owned(), db.message().to_owned());
    }
    match client.ended(Duration::from_secs(5)).await {
        Some(Err(e)) => {
            let db = e
                .as_db_error()
                .unwrap_or_else(|| panic!("no ErrorResponse: {e:?}"));
            (db.code().code().to_owned(), db.message().to_owned())
        }
        other => panic!("the connection did not end with an error: {other:?}"),
    }
}

#[tokio::test]
async fn transaction_timeout_ends_a_long_transaction_not_a_short_one() {
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = transaction_pool(&cluster)
        .set("transaction_timeout", "1")
        .start();
    let port = sluice.port();

    // Busy inside its transaction the whole time: idle_transaction_timeout
    // (off here) would never fire; transaction_timeout counts from BEGIN.
    let long = connect_as(port, APP_USER, "postgres").await;
    long.batch_execute("begin").await.unwrap();
    let started = Instant::now();
    let mut ended = None;
    for _ in 0..20 {
        if let Err(e) = long.simple_query("select pg_sleep(0.2)").await {
            ended = Some(e);
            break;
        }
    }
    let error = ended.expect("a 4 s transaction under transaction_timeout=1 went on");
    let waited = started.elapsed();
    assert_eq!(sqlstate(&error), Some("08P01"), "{error:?}");
    assert_eq!(
        error.as_db_error().map(|d| d.message()),
        Some("transaction timeout")
    );
    assert!(
        waited >= Duration::from_millis(800) && waited < Duration::from_secs(3),
        "ended after {waited:?}"
    );

    // One statement running longer than the limit, outside a block.
    let single = connect_as(port, APP_USER, "postgres").await;
    let (code, message) = failure(single.simple_query("select pg_sleep(3)").await);
    assert_eq!(
        (code.as_str(), message.as_str()),
        ("08P01", "transaction timeout")
    );

    // Many short transactions add up to more than the limit: never ended.
    let short = connect_as(port, APP_USER, "postgres").await;
    let until = Instant::now() + Duration::from_millis(2500);
    while Instant::now() < until {
        short
            .batch_execute("begin; select pg_sleep(0.05); commit")
            .await
            .expect("short transactions are not timed out");
    }
    // Pipelined autocommit statements (the next always in flight before
    // the previous answer) are as many transactions, each timed alone.
    {
        use futures_util::StreamExt;
        let mut in_flight = futures_util::stream::FuturesUnordered::new();
        for _ in 0..3 {
            in_flight.push(short.simple_query("select pg_sleep(0.05)"));
        }
        let until = Instant::now() + Duration::from_millis(2500);
        let mut done = 0;
        while let Some(result) = in_flight.next().await {
            result.expect("pipelined statements are not timed out together");
            done += 1;
            if Instant::now() < until {
                in_flight.push(short.simple_query("select pg_sleep(0.05)"));
            }
        }
        assert!(done > 40, "{done}");
    }
    // Idle between transactions is not a transaction either.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        scalar_text(&short, "select 'still here'").await,
        "still here"
    );
}

#[tokio::test]
async fn per_user_transaction_and_idle_transaction_timeouts_override_the_global_ones() {
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = transaction_pool(&cluster)
        .user(APP_USER, "idle_transaction_timeout=1")
        .user(cluster.superuser(), "transaction_timeout=1")
        .start();
    let port = sluice.port();

    let mut app = connect_tracked(port, APP_USER, "", "postgres")
        .await
        .expect("login");
    app.client.batch_execute("begin").await.unwrap();
    tokio::time::sleep(Duration::from_millis(2000)).await;
    let result = app.client.simple_query("select 1").await;
    let (code, message) = fatal(&mut app, result).await;
    assert_eq!(
        (code.as_str(), message.as_str()),
        ("25P03", "idle transaction timeout")
    );

    let superuser = connect_as(port, cluster.superuser(), "postgres").await;
    let (code, message) = failure(superuser.simple_query("select pg_sleep(3)").await);
    assert_eq!(
        (code.as_str(), message.as_str()),
        ("08P01", "transaction timeout")
    );

    // Without an override neither applies: a user with no [users] line.
    let direct = superuser_connect(&cluster, "postgres").await;
    direct
        .batch_execute("create role other login")
        .await
        .expect("create role");
    let other = connect_as(port, "other", "postgres").await;
    other.batch_execute("begin").await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    other
        .batch_execute("select pg_sleep(1.2); commit")
        .await
        .expect("no timeout applies to other");
}

#[tokio::test]
async fn disable_pqexec_refuses_the_simple_protocol_and_serves_the_extended_one() {
    let cluster = app_cluster(ServerAuth::Trust);
    for mode in ["transaction", "session"] {
        let sluice = ConfigBuilder::for_cluster(&cluster)
            .set("pool_mode", mode)
            .set("disable_pqexec", "1")
            .start();
        let port = sluice.port();

        let extended = connect_as(port, APP_USER, "postgres").await;
        let row = extended
            .query_one("select $1::int + 1", &[&41i32])
            .await
            .unwrap_or_else(|e| panic!("{mode}: extended protocol refused: {e:?}"));
        assert_eq!(row.get::<_, i32>(0), 42);

        // A first message that is a Query, and one in the middle of a
        // session that has a server already.
        for warm in [false, true] {
            let mut client = connect_tracked(port, APP_USER, "", "postgres")
                .await
                .expect("login");
            // (the statement is kept: dropping it would send a Close whose
            // reply slot tokio-postgres would give the FATAL to)
            let _kept = if warm {
                let st = client.client.prepare("select 1").await.expect("prepare");
                client
                    .client
                    .query_one(&st, &[])
                    .await
                    .expect("extended query");
                Some(st)
            } else {
                None
            };
            let result = client.client.simple_query("select 1").await;
            let (code, message) = fatal(&mut client, result).await;
            assert_eq!(
                (code.as_str(), message.as_str()),
                ("08P01", "PQexec disallowed"),
                "{mode}, warm {warm}"
            );
            assert!(
                client.client.is_closed() || client.ended(Duration::from_secs(5)).await.is_some(),
                "{mode}: the client stays connected after PQexec"
            );
        }
        // psql sends its query with the simple protocol.
        let psql_out = psql(port, APP_USER, "", "postgres", "select 1");
        assert!(!psql_out.success());
        assert!(
            psql_out.stderr.contains("PQexec disallowed"),
            "{}",
            psql_out.stderr
        );
        // Others are served on.
        assert_eq!(
            extended
                .query_one("select 2", &[])
                .await
                .expect("still served")
                .get::<_, i32>(0),
            2
        );
    }
}

#[test]
fn unix_socket_group_owns_the_socket_and_an_unknown_group_stops_startup() {
    use std::os::unix::fs::MetadataExt;
    let cluster = app_cluster(ServerAuth::Trust);
    // The group PostgreSQL's files belong to exists on every machine that
    // runs these tests.
    let gid = std::fs::metadata(cluster.data_dir())
        .expect("data dir")
        .gid();
    let sluice = ConfigBuilder::for_cluster(&cluster)
        .set("unix_socket_dir", "@DIR@")
        .set("unix_socket_group", &gid.to_string())
        .set("unix_socket_mode", "0770")
        .start();
    let socket = sluice.dir().join(format!(".s.PGSQL.{}", sluice.port()));
    let meta = std::fs::metadata(&socket).expect("the unix socket exists");
    assert_eq!(meta.gid(), gid);
    assert_eq!(meta.mode() & 0o777, 0o770);
    let out = psql_conninfo(
        &format!(
            "host={} port={} user={APP_USER} dbname=postgres",
            sluice.dir().display(),
            sluice.port()
        ),
        "",
        "select 'by socket'",
    );
    assert!(out.success(), "{}", out.stderr);
    assert_eq!(out.stdout.trim(), "by socket");

    let scratch = ScratchDir::create();
    let said = refused_at_startup(
        &ConfigBuilder::for_cluster(&cluster)
            .set("unix_socket_dir", &scratch.path().display().to_string())
            .set("unix_socket_group", "no-such-group-here"),
    );
    assert!(
        said.contains("unix_socket_group") && said.contains("no-such-group-here"),
        "{said}"
    );
}

#[tokio::test]
async fn server_check_query_runs_on_servers_idle_past_server_check_delay() {
    let cluster = app_cluster(ServerAuth::Trust);
    let direct = superuser_connect(&cluster, "postgres").await;
    direct
        .batch_execute(&format!(
            "create table checks (x int); grant insert on checks to {APP_USER}"
        ))
        .await
        .expect("create table");
    let checks = || async {
        scalar_text(&direct, "select count(*) from checks")
            .await
            .parse::<i64>()
            .expect("a number")
    };

    // Every lend checks (delay 0): three transactions, three checks.
    let always = transaction_pool(&cluster)
        .set("server_check_delay", "0")
        .set("server_check_query", "insert into checks values (1)")
        .start();
    let client = connect_as(always.port(), APP_USER, "postgres").await;
    let before = checks().await;
    for _ in 0..3 {
        client.batch_execute("select 1").await.expect("query");
    }
    assert_eq!(checks().await - before, 3);

    // With the default delay (30 s) a server just used is not checked.
    let lazy = transaction_pool(&cluster)
        .set("server_check_query", "insert into checks values (1)")
        .start();
    let client = connect_as(lazy.port(), APP_USER, "postgres").await;
    client.batch_execute("select 1").await.expect("query");
    let before = checks().await;
    for _ in 0..3 {
        client.batch_execute("select 1").await.expect("query");
    }
    assert_eq!(checks().await, before);

    // PgBouncer's `<empty>` sends an empty query; an empty value checks
    // nothing; a check that fails closes the server, and the client is
    // told once no server passes.
    for (query, ok) in [("<empty>", true), ("", true), ("select 1/0", false)] {
        let sluice = transaction_pool(&cluster)
            .set("server_check_delay", "0")
            .set("server_check_query", query)
            .start();
        let client = connect_as(sluice.port(), APP_USER, "postgres").await;
        let result = client.simple_query("select 42").await;
        if ok {
            result.unwrap_or_else(|e| panic!("check {query:?}: {e:?}"));
        } else {
            let error = expect_sqlstate(result, "08006");
            let message = error.as_db_error().map(|d| d.message().to_owned());
            assert!(
                message
                    .as_deref()
                    .is_some_and(|m| m.contains("server_check_query")),
                "{message:?}"
            );
            assert!(
                sluice
                    .log()
                    .contains("closing because: server check failed")
            );
        }
    }
}

#[tokio::test]
async fn host_names_are_cached_per_dns_max_ttl_and_zone_checks_are_refused() {
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = ConfigBuilder::new()
        .database(
            "postgres",
            &format!("host=localhost port={} dbname=postgres", cluster.port()),
        )
        .set("admin_users", "admin")
        .set("dns_max_ttl", "60")
        .start();
    let client = connect_as(sluice.port(), APP_USER, "postgres").await;
    assert_eq!(scalar_text(&client, "select 'by name'").await, "by name");
    let console = connect_as(sluice.port(), "admin", "pgbouncer").await;
    let lists = console
        .simple_query("SHOW LISTS")
        .await
        .expect("SHOW LISTS");
    let dns_names = lists.iter().find_map(|m| match m {
        tokio_postgres::SimpleQueryMessage::Row(r) if r.get(0) == Some("dns_names") => {
            r.get(1).map(str::to_owned)
        }
        _ => None,
    });
    assert_eq!(dns_names.as_deref(), Some("1"), "{lists:?}");
    // SHOW DNS_HOSTS lists the name: its TTL counting down from 60 and
    // the address the server was reached at; no zone is ever watched.
    let rows = |messages: Vec<tokio_postgres::SimpleQueryMessage>| -> Vec<Vec<String>> {
        messages
            .iter()
            .filter_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r) => Some(
                    (0..r.len())
                        .map(|i| r.get(i).unwrap_or_default().to_owned())
                        .collect(),
                ),
                _ => None,
            })
            .collect()
    };
    let hosts = rows(
        console
            .simple_query("SHOW DNS_HOSTS")
            .await
            .expect("SHOW DNS_HOSTS"),
    );
    assert_eq!(hosts.len(), 1, "{hosts:?}");
    assert_eq!(hosts[0][0], "localhost");
    let ttl: u64 = hosts[0][1].parse().expect("a number");
    assert!(ttl > 40 && ttl <= 60, "{hosts:?}");
    let port = format!(":{}", cluster.port());
    assert!(
        hosts[0][2]
            .split(',')
            .any(|a| a == format!("127.0.0.1{port}")),
        "{hosts:?}"
    );
    assert!(
        hosts[0][2].split(',').all(|a| a.ends_with(&port)),
        "{hosts:?}"
    );
    let zones = rows(
        console
            .simple_query("SHOW DNS_ZONES")
            .await
            .expect("SHOW DNS_ZONES"),
    );
    assert!(zones.is_empty(), "{zones:?}");

    for (key, value) in [
        ("dns_zone_check_period", "60"),
        ("resolv_conf", "/etc/resolv.conf"),
    ] {
        let said = refused_at_startup(&ConfigBuilder::for_cluster(&cluster).set(key, value));
        assert!(said.contains(key), "{said}");
    }
}

#[tokio::test]
async fn log_connections_writes_pgbouncer_login_and_server_lines_and_can_be_off() {
    let cluster = app_cluster(ServerAuth::Trust);
    for (value, logged) in [("1", true), ("0", false)] {
        let sluice = transaction_pool(&cluster)
            .set("log_connections", value)
            .start();
        let client = connect_as(sluice.port(), APP_USER, "postgres").await;
        client.batch_execute("select 1").await.expect("query");
        let log = sluice.log();
        assert_eq!(
            log.contains(&format!(
                "login attempt: db=postgres user={APP_USER} tls=no replication=no"
            )),
            logged,
            "log_connections={value}:\n{log}"
        );
        assert_eq!(
            log.contains("new connection to server (from 127.0.0.1:"),
            logged,
            "log_connections={value}:\n{log}"
        );
    }
}

#[tokio::test]
async fn syslog_sends_lines_with_ident_and_facility_and_reload_turns_it_off() {
    let cluster = app_cluster(ServerAuth::Trust);
    let dir = ScratchDir::create();
    let path = dir.path().join("log.sock");
    let socket = std::os::unix::net::UnixDatagram::bind(&path).expect("bind syslog socket");
    socket
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let config = transaction_pool(&cluster)
        .set("syslog", "1")
        .set("syslog_ident", "sluicetest")
        .set("syslog_facility", "local3");
    let sluice = SluiceProcess::start_with_env(
        &config.render(),
        &[("SLUICE_SYSLOG_SOCKET", path.to_str().expect("utf-8"))],
    );
    let mut lines = Vec::new();
    let mut buf = [0u8; 8192];
    while !lines.iter().any(|l: &String| l.contains("listening on")) {
        let n = socket.recv(&mut buf).expect("a syslog line within 5 s");
        lines.push(String::from_utf8_lossy(&buf[..n]).into_owned());
    }
    let line = lines
        .iter()
        .find(|l| l.contains("listening on"))
        .expect("the startup line");
    // local3 (19) * 8 + info (6) = 158; then "Mmm dd hh:mm:ss ident[pid]: ".
    assert!(line.starts_with("<158>"), "{line}");
    assert!(
        line.contains(&format!("sluicetest[{}]: sluice ", sluice.pid())),
        "{line}"
    );

    // A login is sent while it is on.
    let client = connect_as(sluice.port(), APP_USER, "postgres").await;
    client.batch_execute("select 1").await.expect("query");
    loop {
        let n = socket.recv(&mut buf).expect("the login line within 5 s");
        if String::from_utf8_lossy(&buf[..n]).contains("login attempt: db=postgres") {
            break;
        }
    }

    // RELOAD with syslog off: nothing more arrives.
    sluice.rewrite_config(&config.clone().set("syslog", "0").render());
    sluice.reload();
    tokio::time::sleep(Duration::from_millis(500)).await;
    socket.set_nonblocking(true).expect("nonblocking");
    while socket.recv(&mut buf).is_ok() {}
    let _other = connect_as(sluice.port(), APP_USER, "postgres").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        socket.recv(&mut buf).is_err(),
        "a line after RELOAD with syslog = 0"
    );
    assert!(sluice.log().contains("login attempt"), "{}", sluice.log());

    // A facility syslog does not have stops startup.
    let said = refused_at_startup(&transaction_pool(&cluster).set("syslog_facility", "local9"));
    assert!(said.contains("syslog_facility = local9"), "{said}");
}

#[tokio::test]
async fn track_extra_parameters_startup_values_follow_their_client_only() {
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = transaction_pool(&cluster)
        .set("default_pool_size", "1")
        .set("track_extra_parameters", "IntervalStyle, search_path")
        .start();
    let t = Duration::from_secs(10);
    let mut raw = RawClient::connect(sluice.port()).await;
    raw.send(&startup_packet(&[
        ("user", APP_USER),
        ("database", "postgres"),
        ("search_path", "extra_schema"),
        ("IntervalStyle", "iso_8601"),
    ]))
    .await
    .expect("startup");
    raw.read_until_ready(t).await;
    let other = connect_as(sluice.port(), APP_USER, "postgres").await;
    // One server, taken in turn: each client finds its own values.
    for _ in 0..3 {
        assert_eq!(
            raw.simple_query("show search_path", t).await,
            vec![Some("extra_schema".to_owned())]
        );
        assert_eq!(
            raw.simple_query("select interval '1 day'", t).await,
            vec![Some("P1D".to_owned())]
        );
        assert_eq!(
            scalar_text(&other, "show search_path").await,
            "\"$user\", public"
        );
        assert_eq!(
            scalar_text(&other, "select interval '1 day'::text").await,
            "1 day"
        );
    }
}
