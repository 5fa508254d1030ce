//! `auth_type = hba` with an `auth_hba_file` of every line type (local,
//! host, hostssl, hostnossl) and every method (trust, reject, md5,
//! scram-sha-256 — with channel binding over TLS —, password, cert, peer
//! with an ident map), each succeeding and failing with PostgreSQL's
//! SQLSTATE and message; plus PgBouncer's console rule (user pgbouncer over
//! the Unix socket from the pooler's own OS user needs no password).

use sluice_tests::*;

const HBA: &str = "
# type    database   user     address        method
local     pgbouncer  all                     reject
host      pgbouncer  all      127.0.0.1/32   reject
local     all        all                     peer map=os
hostssl   certdb     all      127.0.0.1/32   cert
hostssl   all        nobody   127.0.0.1/32   reject
hostssl   all        all      127.0.0.1/32   scram-sha-256
hostnossl plaindb    all      127.0.0.1/32   md5
hostnossl pwdb       all      127.0.0.1     255.255.255.255  password
hostnossl trustdb    all      127.0.0.1/32   trust
";

struct Setup {
    certs: Certs,
    sluice: SluiceProcess,
    _cluster: Cluster,
}

fn setup() -> Setup {
    let cluster = app_cluster(ServerAuth::Trust);
    let certs = Certs::make(APP_USER);
    std::fs::write(certs.file("hba.conf"), HBA).expect("write hba");
    // The tests run as root: root may log in as app over the socket.
    std::fs::write(certs.file("ident.conf"), "os root app\n").expect("write ident");
    let server = format!(
        "host={} port={} dbname=postgres",
        cluster.host(),
        cluster.port()
    );
    let mut builder = ConfigBuilder::new();
    for db in ["postgres", "certdb", "plaindb", "pwdb", "trustdb"] {
        builder = builder.database(db, &server);
    }
    let sluice = builder
        .set("auth_type", "hba")
        .set("auth_hba_file", &certs.path("hba.conf"))
        .set("auth_ident_file", &certs.path("ident.conf"))
        .set("unix_socket_dir", "@DIR@")
        .set("admin_users", "someone_else")
        .set("client_tls_sslmode", "prefer")
        .set("client_tls_cert_file", &certs.path("server.crt"))
        .set("client_tls_key_file", &certs.path("server.key"))
        .set("client_tls_ca_file", &certs.path("ca.crt"))
        .userlist(&[(APP_USER, APP_PASSWORD), ("nobody", "x")])
        .start();
    Setup {
        certs,
        sluice,
        _cluster: cluster,
    }
}

impl Setup {
    /// psql over TCP to `localhost` with `extra` conninfo keys.
    async fn psql(&self, user: &str, password: &str, db: &str, extra: &str) -> ToolOutput {
        let conninfo = format!(
            "host=localhost port={} user={user} dbname={db} {extra}",
            self.sluice.port()
        );
        self.run(conninfo, password).await
    }

    /// psql over the Unix socket.
    async fn psql_local(&self, user: &str, db: &str, sql: &str) -> ToolOutput {
        let conninfo = format!(
            "host={} port={} user={user} dbname={db}",
            self.sluice.dir().display(),
            self.sluice.port()
        );
        let sql = sql.to_owned();
        tokio::task::spawn_blocking(move || psql_conninfo(&conninfo, "", &sql))
            .await
            .expect("psql task")
    }

    async fn run(&self, conninfo: String, password: &str) -> ToolOutput {
        let password = password.to_owned();
        tokio::task::spawn_blocking(move || {
            psql_conninfo(&conninfo, &password, "select current_user")
        })
        .await
        .expect("psql task")
    }

    fn tls(&self) -> String {
        format!(
            "sslmode=verify-full sslrootcert={}",
            self.certs.path("ca.crt")
        )
    }

    fn client_cert(&self) -> String {
        format!(
            "{} sslcert={} sslkey={}",
            self.tls(),
            self.certs.path("client.crt"),
            self.certs.path("client.key")
        )
    }
}

fn assert_in(out: &ToolOutput, user: &str) {
    assert!(out.success(), "login failed: {}", out.stderr);
    assert_eq!(out.stdout.trim(), user);
}

fn assert_refused(out: &ToolOutput, message: &str) {
    assert!(!out.success(), "got in, expected: {message}");
    assert!(
        out.stderr.contains(message),
        "expected {message:?} in: {}",
        out.stderr
    );
}

#[tokio::test]
async fn every_method_succeeds_and_fails_as_postgres_says() {
    let s = setup();
    let no_cert = "sslcert=/nonexistent sslkey=/nonexistent";
    // scram-sha-256 over TLS, with channel binding (SCRAM-SHA-256-PLUS).
    let bound = format!("{} channel_binding=require", s.tls());
    assert_in(
        &s.psql(APP_USER, APP_PASSWORD, "postgres", &bound).await,
        APP_USER,
    );
    assert_refused(
        &s.psql(APP_USER, "wrong", "postgres", &bound).await,
        "password authentication failed for user \"app\"",
    );
    // cert: the certificate's CN is the user.
    assert_in(
        &s.psql(APP_USER, "", "certdb", &s.client_cert()).await,
        APP_USER,
    );
    assert_refused(
        &s.psql("nobody", "", "certdb", &s.client_cert()).await,
        "certificate authentication failed for user \"nobody\"",
    );
    assert_refused(
        &s.psql(APP_USER, "", "certdb", &format!("{} {no_cert}", s.tls()))
            .await,
        "connection requires a valid client certificate",
    );
    // reject, and no line at all.
    assert_refused(
        &s.psql("nobody", "x", "postgres", &s.tls()).await,
        "pg_hba.conf rejects connection for host \"127.0.0.1\", user \"nobody\", database \"postgres\", SSL encryption",
    );
    assert_refused(
        &s.psql(APP_USER, APP_PASSWORD, "postgres", "sslmode=disable")
            .await,
        "no pg_hba.conf entry for host \"127.0.0.1\", user \"app\", database \"postgres\", no encryption",
    );
    // hostnossl lines do not match TLS connections.
    assert_refused(
        &s.psql(APP_USER, "wrong", "trustdb", &s.tls()).await,
        "password authentication failed",
    );
    // md5, password (address + netmask), trust: plain TCP only.
    let plain = "sslmode=disable";
    assert_in(
        &s.psql(APP_USER, APP_PASSWORD, "plaindb", plain).await,
        APP_USER,
    );
    assert_refused(
        &s.psql(APP_USER, "wrong", "plaindb", plain).await,
        "password authentication failed for user \"app\"",
    );
    assert_in(
        &s.psql(APP_USER, APP_PASSWORD, "pwdb", plain).await,
        APP_USER,
    );
    assert_refused(
        &s.psql(APP_USER, "wrong", "pwdb", plain).await,
        "password authentication failed for user \"app\"",
    );
    assert_in(
        &s.psql(APP_USER, "anything", "trustdb", plain).await,
        APP_USER,
    );
    // peer over the Unix socket: OS user root maps to app only.
    assert_in(
        &s.psql_local(APP_USER, "postgres", "select current_user")
            .await,
        APP_USER,
    );
    assert_refused(
        &s.psql_local("nobody", "postgres", "select 1").await,
        "Peer authentication failed for user \"nobody\"",
    );
}

#[tokio::test]
async fn the_console_user_pgbouncer_needs_no_password_over_the_socket() {
    let s = setup();
    // The hba file rejects every local console login; PgBouncer's rule
    // comes first for the pooler's own OS user.
    let ok = s.psql_local("pgbouncer", "pgbouncer", "SHOW VERSION").await;
    assert!(ok.success(), "{}", ok.stderr);
    assert!(ok.stdout.contains("sluice"), "{}", ok.stdout);
    // Not over TCP; and a line for pgbouncer covers the console's other
    // name, sluice.
    for db in ["pgbouncer", "sluice"] {
        assert_refused(
            &s.psql("pgbouncer", "", db, "sslmode=disable").await,
            "pg_hba.conf rejects connection for host \"127.0.0.1\", user \"pgbouncer\"",
        );
    }
}

/// trust, cert and peer check no password, but the user must still be one
/// sluice knows (auth_file here), as in PgBouncer.
#[tokio::test]
async fn methods_without_a_password_still_want_a_known_user() {
    let s = setup();
    assert_refused(
        &s.psql("ghost", "", "trustdb", "sslmode=disable").await,
        "no such user: \"ghost\"",
    );
    assert_refused(
        &s.psql_local("ghost", "postgres", "select 1").await,
        "Peer authentication failed for user \"ghost\"",
    );
}

#[tokio::test]
async fn a_broken_hba_file_stops_startup_and_a_broken_reload_keeps_the_old_rules() {
    let s = setup();
    let bad = "host all all samehost md5\n";
    std::fs::write(s.certs.file("hba.conf"), bad).expect("rewrite hba");
    s.sluice.reload();
    let kept = eventually(std::time::Duration::from_secs(10), || async {
        s.sluice
            .log()
            .contains("auth_hba_file not reloaded, keeping the old rules")
            .then_some(())
    })
    .await;
    assert!(kept.is_some(), "{}", s.sluice.log());
    assert_in(
        &s.psql(APP_USER, "x", "trustdb", "sslmode=disable").await,
        APP_USER,
    );

    let check = run_sluice(
        &[
            std::ffi::OsStr::new("--check-config"),
            s.sluice.ini_path().as_os_str(),
        ],
        std::time::Duration::from_secs(20),
    );
    assert!(!check.success());
    assert!(
        check.stderr.contains("hba.conf:1:") && check.stderr.contains("samehost"),
        "{}",
        check.stderr
    );
}

#[tokio::test]
async fn auth_type_cert_takes_the_user_from_the_certificate() {
    let cluster = app_cluster(ServerAuth::Trust);
    let certs = Certs::make(APP_USER);
    let sluice = ConfigBuilder::for_cluster(&cluster)
        .set("auth_type", "cert")
        .set("client_tls_sslmode", "verify-full")
        .set("client_tls_cert_file", &certs.path("server.crt"))
        .set("client_tls_key_file", &certs.path("server.key"))
        .set("client_tls_ca_file", &certs.path("ca.crt"))
        .userlist(&[(APP_USER, APP_PASSWORD), ("other", "x")])
        .start();
    let with_cert = |user: &str| {
        format!(
            "host=localhost port={} user={user} dbname=postgres sslmode=verify-full \
             sslrootcert={} sslcert={} sslkey={}",
            sluice.port(),
            certs.path("ca.crt"),
            certs.path("client.crt"),
            certs.path("client.key")
        )
    };
    let run = |conninfo: String| {
        tokio::task::spawn_blocking(move || psql_conninfo(&conninfo, "", "select current_user"))
    };
    let ok = run(with_cert(APP_USER)).await.expect("psql task");
    assert_in(&ok, APP_USER);
    let other = run(with_cert("other")).await.expect("psql task");
    assert_refused(
        &other,
        "certificate authentication failed for user \"other\"",
    );
}

/// tokio-postgres over TLS (a rustls connector) with channel binding
/// required: SCRAM-SHA-256-PLUS end to end.
#[tokio::test]
async fn tokio_postgres_over_tls_with_channel_binding() {
    let s = setup();
    let mut config = tokio_postgres::Config::new();
    config
        .host("localhost")
        .port(s.sluice.port())
        .user(APP_USER)
        .password(APP_PASSWORD)
        .dbname("postgres")
        .ssl_mode(tokio_postgres::config::SslMode::Require)
        .channel_binding(tokio_postgres::config::ChannelBinding::Require);
    let tls = RustlsConnector::trusting(&s.certs.file("ca.crt"));
    let (client, connection) = config.connect(tls.clone()).await.expect("SCRAM-PLUS login");
    tokio::spawn(connection);
    let row = client
        .query_one("select current_user::text", &[])
        .await
        .expect("query");
    assert_eq!(row.get::<_, String>(0), APP_USER);
    config.password("wrong");
    let refused = config.connect(tls).await.map(|_| ());
    let error = expect_sqlstate(refused, "28P01");
    assert_eq!(
        error.as_db_error().expect("a server error").message(),
        "password authentication failed for user \"app\""
    );
}
