//! TLS towards clients, with certificates made at run time: every
//! `client_tls_sslmode` against psql's sslmode variants (verify-full with
//! sslrootcert, a CA that signed nothing, client certificates), pgbench
//! and a 5 MB result over TLS, direct TLS (ALPN `postgresql`), plain bytes
//! smuggled after SSLRequest, and RELOAD swapping the certificate while
//! clients stay connected (a broken one keeps the old).

use std::time::Duration;

use sluice_tests::*;

fn tls_config(cluster: &Cluster, certs: &Certs, mode: &str) -> ConfigBuilder {
    ConfigBuilder::for_cluster(cluster)
        .set("pool_mode", "transaction")
        .set("admin_users", APP_USER)
        .set("client_tls_sslmode", mode)
        .set("client_tls_cert_file", &certs.path("server.crt"))
        .set("client_tls_key_file", &certs.path("server.key"))
        .set("client_tls_ca_file", &certs.path("ca.crt"))
}

/// Runs psql with `extra` conninfo keys against sluice at `localhost`.
async fn psql_with(port: u16, extra: &str, sql: &str) -> ToolOutput {
    let conninfo = format!("host=localhost port={port} user={APP_USER} dbname=postgres {extra}");
    let sql = sql.to_owned();
    tokio::task::spawn_blocking(move || psql_conninfo(&conninfo, APP_PASSWORD, &sql))
        .await
        .expect("psql task")
}

fn conninfo_verify(certs: &Certs, ca: &str) -> String {
    format!("sslmode=verify-full sslrootcert={}", certs.path(ca))
}

#[tokio::test]
async fn require_serves_tls_and_refuses_plain() {
    let cluster = app_cluster(ServerAuth::Trust);
    let certs = Certs::make(APP_USER);
    let sluice = tls_config(&cluster, &certs, "require").start();
    let port = sluice.port();

    let ok = psql_with(port, &conninfo_verify(&certs, "ca.crt"), "\\conninfo").await;
    assert!(ok.success(), "verify-full psql: {}", ok.stderr);
    assert!(
        ok.stdout.contains("SSL connection (protocol: TLSv1.3"),
        "{}",
        ok.stdout
    );

    // SHOW CLIENTS says how each client is encrypted, as PgBouncer does.
    let mut held = psql_interactive_tls(port, &conninfo_verify(&certs, "ca.crt"));
    assert_eq!(held.ask("select 1").await, "1");
    let conninfo =
        format!("host=localhost port={port} user={APP_USER} dbname=pgbouncer sslmode=require");
    let show =
        tokio::task::spawn_blocking(move || psql_conninfo(&conninfo, APP_PASSWORD, "SHOW CLIENTS"))
            .await
            .expect("psql task");
    assert!(show.success(), "{}", show.stderr);
    assert!(
        show.stdout.contains("|TLSv1.3/TLS_AES_") && show.stdout.contains("ECDH="),
        "{}",
        show.stdout
    );

    let plain = psql_with(port, "sslmode=disable", "select 1").await;
    assert!(!plain.success());
    assert!(plain.stderr.contains("SSL required"), "{}", plain.stderr);

    let wrong_ca = psql_with(port, &conninfo_verify(&certs, "other-ca.crt"), "select 1").await;
    assert!(!wrong_ca.success());
    assert!(
        wrong_ca.stderr.contains("certificate verify failed"),
        "{}",
        wrong_ca.stderr
    );
    // The failed handshake hurt nobody.
    let again = psql_with(port, "sslmode=require", "select 42").await;
    assert!(again.success(), "{}", again.stderr);
    assert_eq!(again.stdout.trim(), "42");
}

#[tokio::test]
async fn prefer_takes_both_and_disable_declines_tls() {
    let cluster = app_cluster(ServerAuth::Trust);
    let certs = Certs::make(APP_USER);
    let prefer = tls_config(&cluster, &certs, "prefer").start();
    let tls = psql_with(prefer.port(), "sslmode=require", "\\conninfo").await;
    assert!(tls.success(), "{}", tls.stderr);
    assert!(tls.stdout.contains("SSL connection"), "{}", tls.stdout);
    let plain = psql_with(prefer.port(), "sslmode=disable", "\\conninfo").await;
    assert!(plain.success(), "{}", plain.stderr);
    assert!(!plain.stdout.contains("SSL connection"), "{}", plain.stdout);

    let disable = tls_config(&cluster, &certs, "disable").start();
    let refused = psql_with(disable.port(), "sslmode=require", "select 1").await;
    assert!(!refused.success());
    assert!(
        refused.stderr.contains("server does not support SSL"),
        "{}",
        refused.stderr
    );
    let fallback = psql_with(disable.port(), "sslmode=prefer", "select 1").await;
    assert!(fallback.success(), "{}", fallback.stderr);
}

#[tokio::test]
async fn verify_ca_wants_a_client_certificate_from_the_ca() {
    let cluster = app_cluster(ServerAuth::Trust);
    let certs = Certs::make(APP_USER);
    let sluice = tls_config(&cluster, &certs, "verify-ca").start();
    let port = sluice.port();
    let with_cert = format!(
        "sslmode=verify-full sslrootcert={} sslcert={} sslkey={}",
        certs.path("ca.crt"),
        certs.path("client.crt"),
        certs.path("client.key")
    );
    let ok = psql_with(port, &with_cert, "select current_user").await;
    assert!(ok.success(), "{}", ok.stderr);
    assert_eq!(ok.stdout.trim(), APP_USER);
    // libpq sends no certificate without sslcert (none in ~/.postgresql
    // for this test's HOME).
    let without = psql_with(
        port,
        &format!(
            "{} sslcert=/nonexistent sslkey=/nonexistent",
            conninfo_verify(&certs, "ca.crt")
        ),
        "select 1",
    )
    .await;
    assert!(!without.success(), "a client without a certificate got in");
}

#[tokio::test]
async fn pgbench_and_a_large_result_over_tls() {
    let cluster = app_cluster(ServerAuth::Trust);
    let certs = Certs::make(APP_USER);
    let sluice = tls_config(&cluster, &certs, "require").start();
    let port = sluice.port();
    let big = psql_with(port, "sslmode=require", "select repeat('x', 5000000)").await;
    assert!(big.success(), "{}", big.stderr);
    assert_eq!(big.stdout.trim().len(), 5_000_000);
    pgbench_select_one_ok(
        &certs.file(""),
        port,
        &["-c", "8", "-j", "2", "-T", "3", "-M", "extended"],
        &[("PGSSLMODE", "require")],
    )
    .await;
}

#[tokio::test]
async fn plain_bytes_after_ssl_request_are_refused() {
    let cluster = app_cluster(ServerAuth::Trust);
    let certs = Certs::make(APP_USER);
    let sluice = tls_config(&cluster, &certs, "prefer").start();
    let mut raw = RawClient::connect(sluice.port()).await;
    let mut smuggled = ssl_request();
    smuggled.extend(startup_packet(&[
        ("user", APP_USER),
        ("database", "postgres"),
    ]));
    raw.send(&smuggled).await.expect("send");
    let fields = raw
        .expect_error_or_close(Duration::from_secs(5))
        .await
        .expect("an ErrorResponse, not TLS");
    assert_eq!(error_field(&fields, b'C'), Some("08P01"));
    assert_eq!(
        error_field(&fields, b'M'),
        Some("received unencrypted data after SSL request")
    );
}

/// A TLS handshake that stalls (SSLRequest answered, then nothing) ends
/// at client_login_timeout, as the rest of a login does, not at the
/// handshake's own 10 s limit.
#[tokio::test]
async fn a_stalled_tls_handshake_ends_at_client_login_timeout() {
    let cluster = app_cluster(ServerAuth::Trust);
    let certs = Certs::make(APP_USER);
    let sluice = tls_config(&cluster, &certs, "prefer")
        .set("client_login_timeout", "1")
        .start();
    let mut raw = RawClient::connect(sluice.port()).await;
    raw.send(&ssl_request()).await.expect("send");
    assert!(matches!(
        raw.read_byte(Duration::from_secs(5)).await,
        RawReply::Message(b'S', _)
    ));
    // (the handshake's own limit would close it after 10 s)
    assert!(
        matches!(
            raw.read_byte(Duration::from_secs(6)).await,
            RawReply::Closed
        ),
        "the stalled handshake outlived client_login_timeout"
    );
}

#[tokio::test]
async fn reload_swaps_the_certificate_and_keeps_connected_clients() {
    let cluster = app_cluster(ServerAuth::Trust);
    let first = Certs::make(APP_USER);
    let second = Certs::make(APP_USER);
    let config = |certs: &Certs| tls_config(&cluster, certs, "require").render();
    let sluice = SluiceProcess::start(&config(&first));
    let port = sluice.port();
    let mut held = psql_interactive_tls(port, &conninfo_verify(&first, "ca.crt"));
    assert_eq!(held.ask("select 1").await, "1", "held psql over TLS");

    sluice.rewrite_config(&config(&second));
    sluice.reload();
    let ca = conninfo_verify(&second, "ca.crt");
    let swapped = eventually(Duration::from_secs(10), || {
        let ca = ca.clone();
        async move {
            psql_with(port, &ca, "select 1")
                .await
                .success()
                .then_some(())
        }
    })
    .await;
    assert!(
        swapped.is_some(),
        "the new certificate is not served after RELOAD"
    );
    let old = psql_with(port, &conninfo_verify(&first, "ca.crt"), "select 1").await;
    assert!(!old.success(), "the old CA still verifies after RELOAD");

    // A broken certificate path: the second certificate stays.
    let broken = config(&second).replace(&second.path("server.crt"), "/nonexistent.crt");
    sluice.rewrite_config(&broken);
    sluice.reload();
    let kept = eventually(Duration::from_secs(10), || async {
        sluice
            .log()
            .contains("client TLS not reloaded, keeping the old one")
            .then_some(())
    })
    .await;
    assert!(kept.is_some(), "{}", sluice.log());
    let still = psql_with(port, &ca, "select 2").await;
    assert!(still.success(), "{}", still.stderr);
    // SHOW CONFIG shows the certificate in force, not the one that failed.
    let shown = psql_with(port, &format!("{ca} dbname=pgbouncer"), "show config").await;
    assert!(shown.success(), "{}", shown.stderr);
    let line = shown
        .stdout
        .lines()
        .find(|l| l.starts_with("client_tls_cert_file|"))
        .unwrap_or_else(|| panic!("{}", shown.stdout))
        .to_owned();
    assert!(line.contains(&second.path("server.crt")), "{line}");

    // The client connected before both reloads still works.
    assert_eq!(held.ask("select 3").await, "3");
}

/// An idle TLS client parks like a plain one (its socket stays on the
/// event loop: rustls holds it) and comes back on its next query, also
/// when the query arrives while it is parked.
#[tokio::test]
async fn an_idle_tls_client_parks_and_comes_back() {
    let cluster = app_cluster(ServerAuth::Trust);
    let certs = Certs::make(APP_USER);
    let mport = sluice_testkit::free_port().expect("free port");
    let sluice = tls_config(&cluster, &certs, "require")
        .sluice("metrics_addr", &format!("127.0.0.1:{mport}"))
        .start();
    let mut held = psql_interactive_tls(sluice.port(), &conninfo_verify(&certs, "ca.crt"));
    assert_eq!(held.ask("select 1").await, "1");
    http::parked_until(mport, |n| n >= 1.0).await;
    assert_eq!(held.ask("select 40 + 2").await, "42");
    assert_eq!(
        held.ask("select ssl from pg_stat_ssl where pid = pg_backend_pid()")
            .await,
        "f",
        "sluice speaks plain to the server"
    );
    http::parked_until(mport, |n| n >= 1.0).await;
    assert_eq!(held.ask("select 'back'").await, "back");
}

/// A psql kept open over TLS, fed one query at a time on stdin.
struct HeldPsql {
    child: std::process::Child,
    stdout: Option<std::io::BufReader<std::process::ChildStdout>>,
}

fn psql_interactive_tls(port: u16, extra: &str) -> HeldPsql {
    let conninfo = format!("host=localhost port={port} user={APP_USER} dbname=postgres {extra}");
    let mut child = std::process::Command::new(sluice_testkit::psql_path().expect("psql"))
        .args(["-X", "-A", "-t", "-q", "-d", &conninfo])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn psql");
    let stdout = child.stdout.take().map(std::io::BufReader::new);
    HeldPsql { child, stdout }
}

impl HeldPsql {
    /// Sends `sql` and returns the first line it prints (within 20 s).
    async fn ask(&mut self, sql: &str) -> String {
        use std::io::{BufRead, Write};
        let stdin = self.child.stdin.as_mut().expect("stdin");
        writeln!(stdin, "{sql};").expect("write to psql");
        stdin.flush().expect("flush");
        let mut reader = self.stdout.take().expect("stdout");
        let (reader, line) = tokio::time::timeout(
            Duration::from_secs(20),
            tokio::task::spawn_blocking(move || {
                let mut line = String::new();
                let _ = reader.read_line(&mut line);
                (reader, line)
            }),
        )
        .await
        .expect("psql answered")
        .expect("psql task");
        self.stdout = Some(reader);
        line.trim().to_owned()
    }
}

impl Drop for HeldPsql {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A TLS client straight from the first byte (PostgreSQL 17's
/// `sslnegotiation=direct`), trusting the test CA, offering `alpn`.
async fn direct_tls(
    port: u16,
    certs: &Certs,
    alpn: &[&[u8]],
) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    use rustls_pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in
        rustls_pki_types::CertificateDer::pem_file_iter(certs.file("ca.crt")).expect("read ca.crt")
    {
        roots.add(cert.expect("ca cert")).expect("add ca");
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    let name = rustls_pki_types::ServerName::try_from("localhost").expect("name");
    connector.connect(name, tcp).await
}

#[tokio::test]
async fn direct_tls_with_alpn_postgresql_logs_in() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let cluster = app_cluster(ServerAuth::Trust);
    let certs = Certs::make(APP_USER);
    let sluice = tls_config(&cluster, &certs, "require").start();
    let mut tls = direct_tls(sluice.port(), &certs, &[b"postgresql"])
        .await
        .expect("direct TLS handshake");
    tls.write_all(&startup_packet(&[
        ("user", APP_USER),
        ("database", "postgres"),
    ]))
    .await
    .expect("send startup");
    let mut tag = [0u8; 1];
    tokio::time::timeout(Duration::from_secs(10), tls.read_exact(&mut tag))
        .await
        .expect("an answer in time")
        .expect("read");
    assert_eq!(tag[0], b'R', "AuthenticationOk expected over direct TLS");

    // Without ALPN the connection is dropped after the handshake.
    if let Ok(mut tls) = direct_tls(sluice.port(), &certs, &[]).await {
        let _ = tls
            .write_all(&startup_packet(&[
                ("user", APP_USER),
                ("database", "postgres"),
            ]))
            .await;
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(10), tls.read(&mut byte))
            .await
            .expect("closed in time");
        assert!(
            matches!(read, Ok(0) | Err(_)),
            "direct TLS without ALPN was served: {read:?}"
        );
    }
}

/// A RELOAD that asks for require but cannot load its certificate must not
/// leave plain logins open: the stricter mode holds with the old (here no)
/// certificate.
#[tokio::test]
async fn a_broken_reload_to_require_refuses_plain_logins() {
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = ConfigBuilder::for_cluster(&cluster)
        .set("pool_mode", "transaction")
        .start();
    let port = sluice.port();
    let before = psql_with(port, "sslmode=disable", "select 1").await;
    assert!(before.success(), "{}", before.stderr);
    let broken = ConfigBuilder::for_cluster(&cluster)
        .set("pool_mode", "transaction")
        .set("client_tls_sslmode", "require")
        .set("client_tls_cert_file", "/nonexistent.crt")
        .set("client_tls_key_file", "/nonexistent.key")
        .render();
    sluice.rewrite_config(&broken);
    sluice.reload();
    let refused = eventually(Duration::from_secs(10), || async {
        let out = psql_with(port, "sslmode=disable", "select 1").await;
        out.stderr.contains("SSL required").then_some(())
    })
    .await;
    assert!(
        refused.is_some(),
        "plain logins still served:\n{}",
        sluice.log()
    );
}

/// RELOAD swaps the certificate again and again while pgbench opens a new
/// TLS connection for every transaction (-C), verifying each: no client
/// fails.
#[tokio::test]
async fn reload_swapping_certificates_under_pgbench_fails_no_client() {
    let cluster = app_cluster(ServerAuth::Trust);
    let certs = Certs::make(APP_USER);
    let config = |cert: &str| {
        tls_config(&cluster, &certs, "require")
            .set("client_tls_cert_file", &certs.path(&format!("{cert}.crt")))
            .set("client_tls_key_file", &certs.path(&format!("{cert}.key")))
            .render()
    };
    let sluice = SluiceProcess::start(&config("server"));
    let port = sluice.port();
    let root = certs.path("ca.crt");
    let dir = certs.file("");
    let bench = tokio::spawn(async move {
        pgbench_select_one_ok(
            &dir,
            port,
            &["-C", "-c", "4", "-j", "2", "-T", "6"],
            &[
                ("PGSSLMODE", "verify-full"),
                ("PGSSLROOTCERT", &root),
                ("PGHOST", "localhost"),
            ],
        )
        .await
    });
    for i in 0..10 {
        tokio::time::sleep(Duration::from_millis(400)).await;
        sluice.rewrite_config(&config(if i % 2 == 0 { "server2" } else { "server" }));
        sluice.reload();
    }
    bench.await.expect("pgbench task");
    let reloads = sluice.log().matches("configuration reloaded").count();
    assert!(reloads >= 10, "{reloads} reloads seen:\n{}", sluice.log());
}

/// A TLS client that closes while its query waits for a server leaves the
/// line at once and its query never runs, as a plain one (its FIN is seen
/// under TLS, without reading the records before it).
#[tokio::test]
async fn a_tls_client_that_closes_while_queued_never_has_its_query_run() {
    let cluster = app_cluster(ServerAuth::Trust);
    app_table(&cluster, "queued", "n int");
    let certs = Certs::make(APP_USER);
    let sluice = tls_config(&cluster, &certs, "require")
        .set("default_pool_size", "1")
        .set("query_wait_timeout", "60")
        .start();
    let port = sluice.port();
    let mut config = tokio_postgres::Config::new();
    config
        .host("localhost")
        .port(port)
        .user(APP_USER)
        .password(APP_PASSWORD)
        .dbname("postgres")
        .ssl_mode(tokio_postgres::config::SslMode::Require);
    let tls = RustlsConnector::trusting(&certs.file("ca.crt"));
    let (holder, connection) = config.connect(tls.clone()).await.expect("login");
    tokio::spawn(connection);
    holder.batch_execute("begin; select 1").await.unwrap();
    let (gone, connection) = config.connect(tls.clone()).await.expect("login");
    let connection = tokio::spawn(connection);
    let query =
        tokio::spawn(async move { gone.batch_execute("insert into queued values (1)").await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The client goes away (its task and its socket), as on a timeout.
    query.abort();
    connection.abort();
    let (admin, connection) = config
        .clone()
        .dbname("pgbouncer")
        .connect(tls)
        .await
        .expect("console");
    tokio::spawn(connection);
    let left = eventually(Duration::from_secs(10), || async {
        let rows = admin.simple_query("SHOW CLIENTS").await.ok()?;
        let listed = rows
            .iter()
            .filter(|m| matches!(m, tokio_postgres::SimpleQueryMessage::Row(r) if r.get("database") == Some("postgres")))
            .count();
        (listed == 1).then_some(())
    })
    .await;
    assert!(left.is_some(), "the closed TLS client is still listed");
    holder.batch_execute("commit").await.unwrap();
    assert_eq!(
        scalar_text(&holder, "select count(*)::text from queued").await,
        "0"
    );
}
