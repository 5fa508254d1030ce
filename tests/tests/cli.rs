//! The command line and process surface: `--check-config` on good and bad
//! files, a missing config file, the unix socket listener, pidfile and
//! logfile.

use std::ffi::OsStr;
use std::time::Duration;

use sluice_tests::*;

fn check_config(text: &str) -> (ToolOutput, std::path::PathBuf, ScratchDir) {
    let dir = ScratchDir::create();
    let path = dir.path().join("pgbouncer.ini");
    std::fs::write(&path, text).unwrap();
    let output = run_sluice(
        &[OsStr::new("--check-config"), path.as_os_str()],
        Duration::from_secs(10),
    );
    (output, path, dir)
}

#[test]
fn check_config_accepts_a_good_file() {
    let text = "[databases]\n\
                app = host=127.0.0.1 port=5432 dbname=app pool_size=5\n\
                [pgbouncer]\n\
                listen_addr = 127.0.0.1\n\
                listen_port = 6543\n\
                pool_mode = transaction\n\
                default_pool_size = 10\n\
                query_wait_timeout = 0.5\n";
    let (output, _, _dir) = check_config(text);
    assert!(
        output.success(),
        "a valid file was rejected ({}): {}",
        output.status,
        output.stderr
    );
}

#[test]
fn check_config_names_file_line_and_key_of_an_error() {
    let text = "[databases]\n\
                app = host=127.0.0.1 dbname=app\n\
                [pgbouncer]\n\
                listen_port = 6543\n\
                pool_mode = sideways\n";
    let (output, path, _dir) = check_config(text);
    assert_eq!(output.status.code(), Some(1), "stderr: {}", output.stderr);
    let expected = format!("{}:5", path.display());
    assert!(
        output.stderr.contains(&expected),
        "stderr should name {expected}: {}",
        output.stderr
    );
    assert!(output.stderr.contains("pool_mode"), "{}", output.stderr);
}

#[test]
fn check_config_rejects_a_bad_number() {
    let text = "[pgbouncer]\nlisten_port = 6543\n\ndefault_pool_size = lots\n";
    let (output, path, _dir) = check_config(text);
    assert_eq!(output.status.code(), Some(1), "stderr: {}", output.stderr);
    assert!(
        output.stderr.contains(&format!("{}:4", path.display())),
        "{}",
        output.stderr
    );
    assert!(
        output.stderr.contains("default_pool_size"),
        "{}",
        output.stderr
    );
}

#[test]
fn missing_config_file_fails_with_a_message() {
    let dir = ScratchDir::create();
    let missing = dir.path().join("absent.ini");
    let output = run_sluice(&[missing.as_os_str()], Duration::from_secs(10));
    assert!(!output.success());
    assert!(
        output.stderr.contains("absent.ini"),
        "the error should name the file: {}",
        output.stderr
    );
}

#[tokio::test]
async fn clients_connect_over_the_unix_socket() {
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = ConfigBuilder::for_cluster(&cluster)
        .set("unix_socket_dir", "@DIR@")
        .start();
    let socket = sluice.dir().join(format!(".s.PGSQL.{}", sluice.port()));
    let appeared = eventually_sync(Duration::from_secs(5), || socket.exists().then_some(()));
    assert!(appeared.is_some(), "no socket at {}", socket.display());

    let mut config = tokio_postgres::Config::new();
    config
        .host_path(sluice.dir())
        .port(sluice.port())
        .user(APP_USER)
        .dbname("postgres");
    let client = connect_config(&config)
        .await
        .expect("login over the unix socket");
    assert_eq!(
        scalar_text(&client, "select 'via socket'").await,
        "via socket"
    );
}

#[tokio::test]
async fn pidfile_and_logfile_are_written() {
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = ConfigBuilder::for_cluster(&cluster)
        .set("pidfile", "@DIR@/sluice.pid")
        .set("logfile", "@DIR@/file.log")
        .start();
    let pid_path = sluice.dir().join("sluice.pid");
    let pid = eventually_sync(Duration::from_secs(5), || {
        std::fs::read_to_string(&pid_path).ok()
    })
    .expect("pidfile written");
    assert_eq!(pid.trim(), sluice.pid().to_string());

    let client = connect_as(sluice.port(), APP_USER, "postgres").await;
    scalar_text(&client, "select 1").await;
    let log_path = sluice.dir().join("file.log");
    let logged = eventually(Duration::from_secs(5), || async {
        let text = std::fs::read_to_string(&log_path).ok()?;
        text.contains("login").then_some(())
    })
    .await;
    assert!(logged.is_some(), "logfile has no login line");
}
