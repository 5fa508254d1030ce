//! The Debian package and the units around it (issue 12): scripts/package.sh
//! packages the binary under test, the .deb is unpacked into a scratch root
//! (`dpkg-deb -x`, no maintainer scripts run), its files and control data
//! are checked, and the unpacked binary runs with the unpacked default
//! sluice.ini (ports and paths moved into the test's scratch directory) in
//! front of real PostgreSQL: logins over TCP and the Unix socket, `/health`,
//! the container's health check, and systemd's notify protocol as the unit
//! uses it (Type=notify, ExecReload=kill -HUP, KillSignal=SIGINT).

use std::fs::File;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use sluice_tests::*;

/// The package built once for this test binary, and where it was unpacked.
struct Package {
    deb: PathBuf,
    /// `dpkg-deb -x`: the files as installed, under this directory.
    root: PathBuf,
    /// `dpkg-deb -e`: control, conffiles, md5sums, maintainer scripts.
    control: PathBuf,
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent directory")
        .to_path_buf()
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target"))
}

fn command(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut cmd = Command::new(program);
    cmd.env("LC_ALL", "C").env_remove("NOTIFY_SOCKET");
    cmd
}

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(tool).is_file()))
}

/// Runs `cmd`, asserting it succeeds; returns its stdout.
fn ok(cmd: &mut Command) -> String {
    let cmd = std::mem::replace(cmd, Command::new("true"));
    let out = run_tool(cmd, Duration::from_secs(120));
    assert!(
        out.success(),
        "{} failed ({}):\n{}\n{}",
        out.stderr.lines().next().unwrap_or_default(),
        out.status,
        out.stdout,
        out.stderr
    );
    out.stdout
}

/// Packages the binary the suite tests (target/debug/sluice, or
/// $SLUICE_BIN) into target/package-test/, once per test binary. gzip
/// rather than the default xz keeps it to a few seconds on a debug binary.
fn package() -> &'static Package {
    static PACKAGE: OnceLock<Package> = OnceLock::new();
    PACKAGE.get_or_init(|| {
        for tool in ["dpkg-deb", "gzip", "python3", "md5sum"] {
            assert!(on_path(tool), "{tool} is needed to build the package");
        }
        let dir = target_dir().join("package-test");
        let _ = std::fs::remove_dir_all(&dir);
        let out = dir.join("out");
        let started = Instant::now();
        let mut cmd = command("bash");
        cmd.arg(workspace().join("scripts/package.sh"))
            .arg("--bin")
            .arg(sluice_binary())
            .arg("--out")
            .arg(&out)
            .args(["--compress", "gzip"]);
        let printed = ok(&mut cmd);
        eprintln!("packaged in {:?}", started.elapsed());
        let deb = PathBuf::from(printed.lines().last().expect("package.sh prints the .deb"));
        assert!(deb.is_file(), "no {}", deb.display());
        let (root, control) = (dir.join("root"), dir.join("control"));
        let mut cmd = command("dpkg-deb");
        cmd.arg("-x").arg(&deb).arg(&root);
        ok(&mut cmd);
        let mut cmd = command("dpkg-deb");
        cmd.arg("-e").arg(&deb).arg(&control);
        ok(&mut cmd);
        Package { deb, root, control }
    })
}

/// `version = "…"` of `[workspace.package]` in the workspace Cargo.toml.
fn workspace_version() -> String {
    let text = std::fs::read_to_string(workspace().join("Cargo.toml")).expect("Cargo.toml");
    let mut in_section = false;
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_section = line == "[workspace.package]";
        } else if in_section && let Some(value) = line.strip_prefix("version") {
            let value = value.trim_start().trim_start_matches('=').trim();
            return value.trim_matches('"').to_owned();
        }
    }
    panic!("no version in [workspace.package]");
}

/// The `Field: value` lines of a control file.
fn control_field(control: &str, field: &str) -> String {
    control
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}: ")))
        .unwrap_or_else(|| panic!("no {field} in control:\n{control}"))
        .to_owned()
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o7777
}

/// The `key = value` of a unit or ini line, `None` for comments.
fn value_of<'a>(text: &'a str, key: &str) -> Vec<&'a str> {
    text.lines()
        .filter(|l| !l.trim_start().starts_with([';', '#']))
        .filter_map(|l| l.split_once('='))
        .filter(|(k, _)| k.trim() == key)
        .map(|(_, v)| v.trim())
        .collect()
}

/// `text` with the uncommented `key = …` line set to `value` (the key must
/// be there: the tests run the packaged default, not one of their own).
fn set_key(text: &str, key: &str, value: &str) -> String {
    let mut found = false;
    let mut out = String::new();
    for line in text.lines() {
        let is_key = !line.trim_start().starts_with([';', '#'])
            && line.split_once('=').is_some_and(|(k, _)| k.trim() == key);
        if is_key {
            found = true;
            out.push_str(&format!("{key} = {value}\n"));
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    assert!(found, "the packaged sluice.ini has no `{key} =` line");
    out
}

fn add_database(text: &str, entry: &str) -> String {
    assert!(text.contains("[databases]\n"), "no [databases] section");
    text.replacen("[databases]\n", &format!("[databases]\n{entry}\n"), 1)
}

/// The unpacked default sluice.ini with the listen port, the Unix socket,
/// the auth file and the metrics address moved to the test's own.
fn adjusted_default_ini(pkg: &Package, dir: &Path, port: u16, metrics: u16) -> String {
    let text = std::fs::read_to_string(pkg.root.join("etc/sluice/sluice.ini")).expect("ini");
    let text = set_key(&text, "listen_port", &port.to_string());
    let text = set_key(&text, "unix_socket_dir", dir.to_str().expect("utf-8"));
    let text = set_key(
        &text,
        "auth_file",
        dir.join("userlist.txt").to_str().expect("utf-8"),
    );
    set_key(&text, "metrics_addr", &format!("127.0.0.1:{metrics}"))
}

#[test]
fn the_package_holds_binary_conffile_unit_and_man_pages() {
    let pkg = package();
    let version = workspace_version();
    let control = std::fs::read_to_string(pkg.control.join("control")).expect("control");
    assert_eq!(control_field(&control, "Package"), "sluice");
    assert_eq!(
        control_field(&control, "Version"),
        version.replacen('-', "~", 1)
    );
    let arch = ok(command("dpkg").arg("--print-architecture"));
    assert_eq!(control_field(&control, "Architecture"), arch.trim());
    let depends = control_field(&control, "Depends");
    assert!(depends.contains("libc6 (>= 2."), "{depends}");
    assert!(
        depends.contains("adduser"),
        "postinst runs adduser: {depends}"
    );
    assert!(
        pkg.deb
            .file_name()
            .is_some_and(|n| n == format!("sluice_{version}_{}.deb", arch.trim()).as_str()),
        "{}",
        pkg.deb.display()
    );
    assert_eq!(
        std::fs::read_to_string(pkg.control.join("conffiles")).expect("conffiles"),
        "/etc/sluice/sluice.ini\n"
    );

    // Every file as listed in md5sums, owned by root in the archive.
    let mut cmd = command("md5sum");
    cmd.arg("--check")
        .arg("--quiet")
        .arg(pkg.control.join("md5sums"))
        .current_dir(&pkg.root);
    ok(&mut cmd);
    let listing = ok(command("dpkg-deb").arg("--contents").arg(&pkg.deb));
    for line in listing.lines() {
        assert!(line.contains(" root/root "), "not root-owned: {line}");
    }
    for (path, expected) in [
        ("usr/bin/sluice", 0o755),
        ("etc/sluice/sluice.ini", 0o644),
        ("lib/systemd/system/sluice.service", 0o644),
        ("usr/share/man/man1/sluice.1.gz", 0o644),
        ("usr/share/man/man5/sluice.ini.5.gz", 0o644),
        ("usr/share/doc/sluice/copyright", 0o644),
    ] {
        assert_eq!(mode(&pkg.root.join(path)), expected, "{path}");
    }
    let said = ok(command(pkg.root.join("usr/bin/sluice")).arg("--version"));
    assert_eq!(said.trim(), format!("sluice {version}"));

    // Maintainer scripts: valid sh, executable; postinst makes the user the
    // unit runs as.
    for script in ["postinst", "prerm", "postrm"] {
        let path = pkg.control.join(script);
        assert_eq!(mode(&path), 0o755, "{script}");
        ok(command("sh").arg("-n").arg(&path));
    }
    let postinst = std::fs::read_to_string(pkg.control.join("postinst")).expect("postinst");
    assert!(postinst.contains("adduser --system"), "{postinst}");

    // The unit agrees with the package and its default config.
    let unit =
        std::fs::read_to_string(pkg.root.join("lib/systemd/system/sluice.service")).expect("unit");
    let ini = std::fs::read_to_string(pkg.root.join("etc/sluice/sluice.ini")).expect("ini");
    assert_eq!(value_of(&unit, "Type"), ["notify"]);
    assert_eq!(
        value_of(&unit, "ExecStart"),
        ["/usr/bin/sluice /etc/sluice/sluice.ini"]
    );
    assert_eq!(value_of(&unit, "ExecReload"), ["/bin/kill -HUP $MAINPID"]);
    assert_eq!(value_of(&unit, "User"), ["sluice"]);
    assert!(
        postinst.contains(" sluice\n"),
        "postinst creates user sluice"
    );
    assert_eq!(value_of(&unit, "RuntimeDirectory"), ["sluice"]);
    assert_eq!(value_of(&ini, "unix_socket_dir"), ["/run/sluice"]);
    assert_eq!(value_of(&ini, "auth_file"), ["/etc/sluice/userlist.txt"]);
    assert!(
        postinst.contains("/etc/sluice/userlist.txt"),
        "postinst creates the auth_file the default ini names"
    );
    assert_eq!(value_of(&ini, "logfile"), [""], "logs go to the journal");
    assert_eq!(value_of(&unit, "LimitNOFILE"), ["65536"]);
    if on_path("systemd-analyze") {
        verify_unit(pkg, &unit);
    } else {
        eprintln!("systemd-analyze not found: unit not verified");
    }

    // Man pages: gzip intact; rendered without a warning when man is here,
    // every option of --help and every key of docs/config.md in them.
    for page in [
        "usr/share/man/man1/sluice.1.gz",
        "usr/share/man/man5/sluice.ini.5.gz",
    ] {
        ok(command("gzip").arg("-t").arg(pkg.root.join(page)));
    }
    if on_path("man") {
        let help = ok(command(sluice_binary()).arg("--help"));
        let man1 = render_man(&pkg.root.join("usr/share/man/man1/sluice.1.gz"));
        for option in help.split_whitespace().filter(|w| w.starts_with("--")) {
            let option = option.trim_end_matches([',', '.']);
            assert!(man1.contains(option), "sluice(1) lacks {option}:\n{man1}");
        }
        let man5 = render_man(&pkg.root.join("usr/share/man/man5/sluice.ini.5.gz"));
        let reference =
            std::fs::read_to_string(workspace().join("docs/config.md")).expect("config.md");
        let keys: Vec<&str> = reference
            .lines()
            .filter_map(|l| l.strip_prefix("| `"))
            .filter_map(|l| l.split('`').next())
            .collect();
        assert!(keys.len() > 100, "keys of docs/config.md: {}", keys.len());
        for key in keys {
            assert!(man5.contains(key), "sluice.ini(5) lacks {key}");
        }
    } else {
        eprintln!("man not found: man pages only checked with gzip -t");
    }

    // The packaged default config, and the container's, pass --check-config
    // (with an auth file that exists here).
    let dir = ScratchDir::create();
    std::fs::write(dir.path().join("userlist.txt"), "").expect("userlist");
    for (name, text) in [
        ("deb.ini", ini.clone()),
        (
            "docker.ini",
            std::fs::read_to_string(workspace().join("packaging/docker/sluice.ini"))
                .expect("docker ini"),
        ),
    ] {
        let text = set_key(
            &text,
            "auth_file",
            dir.path().join("userlist.txt").to_str().expect("utf-8"),
        );
        let path = dir.path().join(name);
        std::fs::write(&path, text).expect("write ini");
        ok(command(pkg.root.join("usr/bin/sluice"))
            .arg("--check-config")
            .arg(&path));
    }
}

/// `systemd-analyze verify` on the unit, with ExecStart pointed at the
/// unpacked binary (verify checks it exists) and MANPATH at the unpacked
/// man pages (it checks Documentation= too). verify exits 0 even on
/// unknown keys, so any line naming the unit is a failure.
fn verify_unit(pkg: &Package, unit: &str) {
    let dir = ScratchDir::create();
    let copy = dir.path().join("sluice.service");
    let binary = pkg.root.join("usr/bin/sluice");
    std::fs::write(
        &copy,
        unit.replace("/usr/bin/sluice", binary.to_str().expect("utf-8")),
    )
    .expect("write unit");
    let mut cmd = command("systemd-analyze");
    cmd.arg("verify")
        .arg(&copy)
        .env("MANPATH", pkg.root.join("usr/share/man"));
    let out = run_tool(cmd, Duration::from_secs(60));
    let ours: Vec<&str> = out
        .stderr
        .lines()
        .chain(out.stdout.lines())
        .filter(|l| l.contains("sluice"))
        .collect();
    assert!(
        out.success() && ours.is_empty(),
        "systemd-analyze verify ({}):\n{}",
        out.status,
        ours.join("\n")
    );
}

/// `man -l` text of a page; fails on any groff or man warning.
fn render_man(page: &Path) -> String {
    let mut cmd = command("man");
    cmd.args(["--warnings", "-l"])
        .arg(page)
        .env("MANWIDTH", "100")
        .env("MANPAGER", "cat")
        .env("PAGER", "cat");
    let out = run_tool(cmd, Duration::from_secs(60));
    assert!(
        out.success() && out.stderr.trim().is_empty(),
        "man -l {} ({}): {}",
        page.display(),
        out.status,
        out.stderr
    );
    out.stdout
}

/// The unpacked binary running on an ini, killed on drop (its log printed
/// when the test failed).
struct Installed {
    child: Child,
    log: PathBuf,
}

impl Installed {
    /// Starts `root/usr/bin/sluice ini` with `env`, and waits until its log
    /// says it listens; `Err(log)` if it exited or did not within 10 s.
    fn start(pkg: &Package, ini: &Path, env: &[(&str, &str)]) -> Result<Installed, String> {
        let log = ini.with_extension("log");
        let file = File::create(&log).expect("log file");
        let mut cmd = command(pkg.root.join("usr/bin/sluice"));
        cmd.arg(ini)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("clone"))
            .stderr(file);
        let mut installed = Installed {
            child: cmd.spawn().expect("spawn the unpacked sluice"),
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let text = installed.log_text();
            if text.contains("listening on") {
                return Ok(installed);
            }
            if let Some(status) = installed.child.try_wait().expect("try_wait") {
                return Err(format!("exited with {status}:\n{text}"));
            }
            if Instant::now() > deadline {
                return Err(format!("not listening after 10 s:\n{text}"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("kill");
        assert!(status.success(), "kill -{name}");
    }
}

impl Drop for Installed {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- log of the unpacked sluice ---\n{}", self.log_text());
        }
    }
}

/// Writes the adjusted default ini (plus `extra` applied to it) in `dir`
/// and starts the unpacked binary on fresh ports; retries when another
/// process took a port first. Returns the process, its port and metrics port.
fn start_installed(
    pkg: &Package,
    dir: &Path,
    extra: impl Fn(String) -> String,
    env: &[(&str, &str)],
) -> (Installed, u16, u16) {
    let mut last = String::new();
    for _ in 0..5 {
        let port = sluice_testkit::free_port().expect("free port");
        let metrics = sluice_testkit::free_port().expect("free port");
        let ini = dir.join("sluice.ini");
        std::fs::write(&ini, extra(adjusted_default_ini(pkg, dir, port, metrics)))
            .expect("write ini");
        match Installed::start(pkg, &ini, env) {
            Ok(installed) => return (installed, port, metrics),
            Err(log) if log.contains("in use") => last = log,
            Err(log) => panic!("the unpacked sluice did not start: {log}"),
        }
    }
    panic!("the unpacked sluice did not start after 5 attempts: {last}");
}

/// `GET path` on 127.0.0.1:`port`: the status line and the body.
fn http_get(port: u16, path: &str) -> (String, String) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect to metrics_addr");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").expect("send");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).expect("read answer");
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    (
        head.lines().next().unwrap_or("").to_owned(),
        body.to_owned(),
    )
}

/// packaging/docker/healthcheck (the image's HEALTHCHECK) against `port`.
fn healthcheck(port: u16) -> ToolOutput {
    let mut cmd = command("bash");
    cmd.arg(workspace().join("packaging/docker/healthcheck"))
        .arg(format!("127.0.0.1:{port}"));
    run_tool(cmd, Duration::from_secs(30))
}

#[tokio::test]
async fn the_unpacked_binary_serves_with_the_packaged_config() {
    let pkg = package();
    let cluster = app_cluster(ServerAuth::ScramSha256);
    let dir = ScratchDir::create();
    std::fs::write(
        dir.path().join("userlist.txt"),
        format!("\"{APP_USER}\" \"{APP_PASSWORD}\"\n"),
    )
    .expect("userlist");
    let entry = format!(
        "postgres = host={} port={} dbname=postgres",
        cluster.host(),
        cluster.port()
    );
    let (sluice, port, metrics) =
        start_installed(pkg, dir.path(), |ini| add_database(&ini, &entry), &[]);

    // The default auth_type (scram-sha-256) against the auth file, over TCP
    // and over the Unix socket.
    let client = connect(port, APP_USER, APP_PASSWORD, "postgres")
        .await
        .expect("login over TCP with the packaged config");
    assert_eq!(scalar_text(&client, "select 1").await, "1");
    let mut config = tokio_postgres::Config::new();
    config
        .host_path(dir.path())
        .port(port)
        .user(APP_USER)
        .password(APP_PASSWORD)
        .dbname("postgres");
    let over_socket = connect_config(&config)
        .await
        .expect("login over the Unix socket");
    assert_eq!(scalar_text(&over_socket, "select 'socket'").await, "socket");

    // /health on metrics_addr, and the container's check of it.
    let (status, body) = http_get(metrics, "/health");
    assert_eq!(status, "HTTP/1.1 200 OK", "{body}");
    assert_eq!(body, "ok\n");
    let check = healthcheck(metrics);
    assert!(check.success(), "healthcheck: {}", check.stderr);

    // Paused (SIGUSR1), sluice cannot serve: 503, and the check fails.
    sluice.signal("USR1");
    let unhealthy = eventually_sync(Duration::from_secs(5), || {
        let out = healthcheck(metrics);
        (!out.success()).then_some(out)
    })
    .expect("the health check fails while paused");
    assert!(unhealthy.stderr.contains("503"), "{}", unhealthy.stderr);
    sluice.signal("USR2");
    let healthy = eventually_sync(Duration::from_secs(5), || {
        healthcheck(metrics).success().then_some(())
    });
    assert!(healthy.is_some(), "healthy again after SIGUSR2");
    assert_eq!(scalar_text(&client, "select 2").await, "2");

    // Nothing listens: the check fails rather than hangs.
    drop(sluice);
    assert!(!healthcheck(metrics).success());
}

/// The next datagram on the notify socket (10 s at most).
fn next_notification(socket: &UnixDatagram) -> String {
    let mut buf = [0u8; 4096];
    let n = socket
        .recv(&mut buf)
        .expect("a notification within 10 s on NOTIFY_SOCKET");
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

fn has_line(message: &str, line: &str) -> bool {
    message.lines().any(|l| l == line)
}

/// What Type=notify, ExecReload=/bin/kill -HUP and KillSignal=SIGINT in
/// sluice.service rely on, with the unpacked binary: READY=1 once clients
/// can connect, RELOADING=1 then READY=1 on SIGHUP, STOPPING=1 and a clean
/// exit on SIGINT.
#[test]
fn the_unpacked_binary_speaks_systemds_notify_protocol() {
    let pkg = package();
    let dir = ScratchDir::create();
    std::fs::write(dir.path().join("userlist.txt"), "").expect("userlist");
    let path = dir.path().join("notify.sock");
    let socket = UnixDatagram::bind(&path).expect("bind the notify socket");
    socket
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let (mut sluice, port, _) = start_installed(
        pkg,
        dir.path(),
        |ini| ini,
        &[("NOTIFY_SOCKET", path.to_str().expect("utf-8"))],
    );

    let ready = next_notification(&socket);
    assert!(has_line(&ready, "READY=1"), "first notification: {ready:?}");
    // systemd starts dependent units on READY=1: sluice must accept by then.
    TcpStream::connect(("127.0.0.1", port)).expect("TCP listener up at READY=1");
    let unix = dir.path().join(format!(".s.PGSQL.{port}"));
    std::os::unix::net::UnixStream::connect(&unix).expect("Unix socket up at READY=1");
    let pid = format!("MAINPID={}", sluice.child.id());
    assert!(
        ready
            .lines()
            .all(|l| !l.starts_with("MAINPID=") || l == pid),
        "{ready:?}"
    );

    sluice.signal("HUP");
    let reloading = next_notification(&socket);
    assert!(has_line(&reloading, "RELOADING=1"), "{reloading:?}");
    assert!(reloading.contains("MONOTONIC_USEC="), "{reloading:?}");
    let ready = next_notification(&socket);
    assert!(has_line(&ready, "READY=1"), "after the reload: {ready:?}");

    sluice.signal("INT");
    let stopping = next_notification(&socket);
    assert!(has_line(&stopping, "STOPPING=1"), "{stopping:?}");
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = sluice.child.try_wait().expect("try_wait") {
            break status;
        }
        assert!(Instant::now() < deadline, "no exit 10 s after SIGINT");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "exit after SIGINT: {status}");
}
