//! A single cluster: starting, querying, settings, lifecycle and cleanup.

mod support;

use std::time::{Duration, Instant};

use sluice_testkit::{Cluster, TestkitError, bindir, free_port};

#[test]
fn starts_and_answers_queries() {
    let started = Instant::now();
    let pg = Cluster::builder().start().expect("start cluster");
    eprintln!("cluster started in {:?}", started.elapsed());
    assert_eq!(pg.host(), "127.0.0.1");
    assert_eq!(pg.superuser(), "postgres");
    assert!(pg.port() > 0);
    assert!(pg.data_dir().starts_with(pg.socket_dir()));
    assert!(
        pg.socket_dir()
            .join(format!(".s.PGSQL.{}", pg.port()))
            .exists()
    );
    assert_eq!(pg.psql("postgres", "SELECT 1 + 1").unwrap(), "2");
    assert_eq!(pg.psql("postgres", "SHOW fsync").unwrap(), "off");
    assert_eq!(pg.psql("postgres", "SHOW wal_level").unwrap(), "replica");
    assert_eq!(pg.psql("postgres", "SHOW server_encoding").unwrap(), "UTF8");
    assert_eq!(
        pg.psql("postgres", "SHOW listen_addresses").unwrap(),
        "127.0.0.1"
    );
    // The superuser can log in over TCP with its password.
    assert_eq!(
        support::tcp_login(&pg, "postgres", "postgres", pg.port()).unwrap(),
        "postgres"
    );
}

#[test]
fn psql_errors_carry_stderr() {
    let pg = Cluster::builder().start().unwrap();
    let error = pg
        .psql("postgres", "SELECT * FROM no_such_table")
        .unwrap_err();
    assert!(
        matches!(&error, TestkitError::CommandFailed { stderr, .. } if stderr.contains("no_such_table")),
        "{error}"
    );
}

#[test]
fn applies_limits_settings_and_databases() {
    let pg = Cluster::builder()
        .max_connections(37)
        .superuser_reserved_connections(2)
        .setting("work_mem", "7MB")
        .setting("sluice.note", "it's quoted")
        .database("alpha")
        .database("beta gamma")
        .start()
        .unwrap();
    assert_eq!(pg.psql("postgres", "SHOW max_connections").unwrap(), "37");
    assert_eq!(
        pg.psql("postgres", "SHOW superuser_reserved_connections")
            .unwrap(),
        "2"
    );
    assert_eq!(pg.psql("postgres", "SHOW work_mem").unwrap(), "7MB");
    assert_eq!(
        pg.psql("postgres", "SHOW sluice.note").unwrap(),
        "it's quoted"
    );
    assert_eq!(
        pg.psql("alpha", "SELECT current_database()").unwrap(),
        "alpha"
    );
    assert_eq!(
        pg.psql(
            "postgres",
            "SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = 'beta gamma'"
        )
        .unwrap(),
        "postgres"
    );
}

#[test]
fn startup_failure_reports_the_log_tail_and_cleans_up() {
    let error = Cluster::builder()
        .setting("shared_buffers", "lots")
        .start()
        .unwrap_err();
    let TestkitError::StartFailed {
        log_tail, log_file, ..
    } = &error
    else {
        panic!("unexpected error: {error}");
    };
    assert!(log_tail.contains("shared_buffers"), "{error}");
    // <temp dir>/data/postgresql.log: the whole temp dir is gone.
    let dir = log_file.parent().unwrap().parent().unwrap();
    assert!(!dir.exists(), "{} left behind", dir.display());
}

#[test]
fn drop_stops_the_server_and_removes_the_directory() {
    let pg = Cluster::builder().start().unwrap();
    let dir = pg.socket_dir().to_owned();
    let pid_file = pg.data_dir().join("postmaster.pid");
    let postmaster_pid: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .lines()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    drop(pg);
    assert!(!dir.exists(), "{} still exists", dir.display());
    // The postmaster removes its pid file just before exiting, and once
    // orphaned it may linger as a zombie until its new parent reaps it.
    support::eventually("the postmaster to exit", Duration::from_secs(10), || {
        match std::fs::read_to_string(format!("/proc/{postmaster_pid}/stat")) {
            Err(_) => true,
            Ok(stat) => stat
                .rsplit_once(") ")
                .is_some_and(|(_, rest)| rest.starts_with('Z')),
        }
    });
}

#[test]
fn drop_cleans_up_when_a_test_panics() {
    let dir = std::sync::Mutex::new(None);
    let result = std::panic::catch_unwind(|| {
        let pg = Cluster::builder().start().unwrap();
        *dir.lock().unwrap() = Some(pg.socket_dir().to_owned());
        panic!("test failure while the cluster is alive");
    });
    assert!(result.is_err());
    let dir = dir.lock().unwrap().take().unwrap();
    assert!(!dir.exists(), "{} still exists", dir.display());
}

#[test]
fn stop_start_again_restart_and_reload() {
    let pg = Cluster::builder().start().unwrap();
    let port = pg.port();
    pg.psql(
        "postgres",
        "CREATE TABLE kept (x int); INSERT INTO kept VALUES (42)",
    )
    .unwrap();

    pg.stop().unwrap();
    assert!(pg.psql("postgres", "SELECT 1").is_err());
    assert!(pg.data_dir().exists());
    pg.start_again().unwrap();
    assert_eq!(pg.port(), port);
    assert_eq!(pg.psql("postgres", "SELECT x FROM kept").unwrap(), "42");

    let before = pg
        .psql("postgres", "SELECT pg_postmaster_start_time()")
        .unwrap();
    pg.restart().unwrap();
    let after = pg
        .psql("postgres", "SELECT pg_postmaster_start_time()")
        .unwrap();
    assert_ne!(before, after);

    pg.psql("postgres", "ALTER SYSTEM SET work_mem = '9MB'")
        .unwrap();
    pg.pg_ctl_reload().unwrap();
    support::eventually("reload to apply work_mem", Duration::from_secs(10), || {
        pg.psql("postgres", "SHOW work_mem").unwrap() == "9MB"
    });
}

#[test]
fn pgbench_init_creates_tables() {
    let pg = Cluster::builder().start().unwrap();
    pg.pgbench_init("postgres", 1).unwrap();
    assert_eq!(
        pg.psql("postgres", "SELECT count(*) FROM pgbench_accounts")
            .unwrap(),
        "100000"
    );
}

#[test]
fn many_clusters_in_parallel_get_distinct_ports_and_dirs() {
    let clusters: Vec<Cluster> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..3)
            .map(|_| scope.spawn(|| Cluster::builder().start().unwrap()))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut ports: Vec<u16> = clusters.iter().map(Cluster::port).collect();
    ports.sort_unstable();
    ports.dedup();
    assert_eq!(ports.len(), 3);
    for pg in &clusters {
        assert_eq!(pg.psql("postgres", "SELECT 1").unwrap(), "1");
    }
}

#[test]
fn binaries_and_ports_are_found() {
    let dir = bindir().unwrap();
    assert!(dir.join("initdb").is_file());
    assert!(sluice_testkit::psql_path().unwrap().is_file());
    assert!(sluice_testkit::pgbench_path().unwrap().is_file());
    let a = free_port().unwrap();
    let b = free_port().unwrap();
    assert_ne!(a, b);
}
