//! Authentication through sluice: each client `auth_type` accepting the
//! right password and refusing a wrong one with PostgreSQL's 28P01, each
//! server authentication method with the password taken from the database
//! entry or from the auth file, a SCRAM secret copied from pg_authid (no
//! plain password anywhere), unknown databases, and a psql login.

use sluice_tests::*;

/// sluice with `auth_type` in front of a SCRAM cluster; the auth file holds
/// the application password in plain text (also used for the server login).
fn sluice_with_client_auth(cluster: &Cluster, auth_type: &str) -> SluiceProcess {
    ConfigBuilder::for_cluster(cluster)
        .set("auth_type", auth_type)
        .userlist(&[(APP_USER, APP_PASSWORD)])
        .start()
}

/// What `sql` answers on the cluster's postgres database, trimmed.
fn server_answer(cluster: &Cluster, sql: &str) -> String {
    cluster.psql("postgres", sql).unwrap().trim().to_owned()
}

async fn assert_logs_in_as_app(port: u16, password: &str) {
    let client = connect(port, APP_USER, password, "postgres")
        .await
        .unwrap_or_else(|e| panic!("login with password {password:?} failed: {e:?}"));
    let row = client
        .query_one("select current_user::text", &[])
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), APP_USER);
}

async fn assert_wrong_password_refused(port: u16, user: &str) {
    let error = expect_sqlstate(connect(port, user, "wrong", "postgres").await, "28P01");
    let message = error.as_db_error().expect("a server error").message();
    assert_eq!(
        message,
        format!("password authentication failed for user \"{user}\"")
    );
}

#[tokio::test]
async fn trust_lets_any_password_in() {
    let cluster = app_cluster(ServerAuth::ScramSha256);
    let sluice = sluice_with_client_auth(&cluster, "trust");
    assert_logs_in_as_app(sluice.port(), "not-the-password").await;
    assert_logs_in_as_app(sluice.port(), "").await;
}

#[tokio::test]
async fn plain_auth_accepts_the_password_and_refuses_a_wrong_one() {
    let cluster = app_cluster(ServerAuth::ScramSha256);
    let sluice = sluice_with_client_auth(&cluster, "plain");
    assert_logs_in_as_app(sluice.port(), APP_PASSWORD).await;
    assert_wrong_password_refused(sluice.port(), APP_USER).await;
}

/// A plain password checked against a SCRAM secret (PBKDF2, off the event
/// loop) and a SCRAM login against a plain one (a secret derived once).
#[tokio::test]
async fn plain_passwords_and_scram_secrets_meet_both_ways() {
    let cluster = app_cluster(ServerAuth::ScramSha256);
    let secret = server_answer(
        &cluster,
        &format!("select rolpassword from pg_authid where rolname = '{APP_USER}'"),
    );
    assert!(secret.starts_with("SCRAM-SHA-256$"), "{secret}");
    // (a plain login yields no SCRAM keys: the server login needs the
    // password of the entry)
    let sluice = ConfigBuilder::new()
        .database_on(&cluster, "postgres", &format!("password={APP_PASSWORD}"))
        .set("auth_type", "plain")
        .auth_file(&format!("\"{APP_USER}\" \"{secret}\"\n"))
        .start();
    assert_logs_in_as_app(sluice.port(), APP_PASSWORD).await;
    assert_wrong_password_refused(sluice.port(), APP_USER).await;
    let sluice = sluice_with_client_auth(&cluster, "scram-sha-256");
    for _ in 0..2 {
        assert_logs_in_as_app(sluice.port(), APP_PASSWORD).await;
    }
    assert_wrong_password_refused(sluice.port(), APP_USER).await;
}

/// A user listed with an empty password (or the md5 hash of one), as a
/// cert- or trust-only user may be, gets in by no password exchange: the
/// empty password is no password (PgBouncer: "disallow empty passwords").
#[tokio::test]
async fn an_empty_password_in_the_auth_file_lets_nobody_in() {
    let cluster = app_cluster(ServerAuth::ScramSha256);
    let empty_md5 = server_answer(&cluster, "select 'md5' || md5('dave')");
    for auth_type in ["plain", "md5", "scram-sha-256"] {
        let sluice = ConfigBuilder::new()
            .database(
                "postgres",
                &format!(
                    "host={} port={} dbname=postgres user={APP_USER} password={APP_PASSWORD}",
                    cluster.host(),
                    cluster.port()
                ),
            )
            .set("auth_type", auth_type)
            .auth_file(&format!(
                "\"{APP_USER}\" \"{APP_PASSWORD}\"\n\"carol\" \"\"\n\"dave\" \"{empty_md5}\"\n"
            ))
            .start();
        for user in ["carol", "dave"] {
            let mut config = config_for(sluice.port(), user, "", "postgres");
            config.password("");
            let error = expect_sqlstate(connect_config(&config).await, "28P01");
            assert_eq!(
                error.as_db_error().expect("a server error").message(),
                format!("password authentication failed for user \"{user}\""),
                "{auth_type}"
            );
        }
        assert_logs_in_as_app(sluice.port(), APP_PASSWORD).await;
    }
}

#[tokio::test]
async fn md5_auth_accepts_the_password_and_refuses_a_wrong_one() {
    let cluster = app_cluster(ServerAuth::ScramSha256);
    let sluice = sluice_with_client_auth(&cluster, "md5");
    assert_logs_in_as_app(sluice.port(), APP_PASSWORD).await;
    assert_wrong_password_refused(sluice.port(), APP_USER).await;
    assert_wrong_password_refused(sluice.port(), "nobody").await;
}

#[tokio::test]
async fn md5_auth_with_an_md5_hash_in_the_auth_file() {
    let cluster = app_cluster(ServerAuth::Md5);
    let hash = server_answer(
        &cluster,
        &format!("select 'md5' || md5('{APP_PASSWORD}' || '{APP_USER}')"),
    );
    let sluice = ConfigBuilder::for_cluster(&cluster)
        .set("auth_type", "md5")
        .auth_file(&format!("\"{APP_USER}\" \"{hash}\"\n"))
        .start();
    assert_logs_in_as_app(sluice.port(), APP_PASSWORD).await;
    assert_wrong_password_refused(sluice.port(), APP_USER).await;
}

#[tokio::test]
async fn scram_auth_accepts_the_password_and_refuses_a_wrong_one() {
    let cluster = app_cluster(ServerAuth::ScramSha256);
    let sluice = sluice_with_client_auth(&cluster, "scram-sha-256");
    assert_logs_in_as_app(sluice.port(), APP_PASSWORD).await;
    assert_wrong_password_refused(sluice.port(), APP_USER).await;
    assert_wrong_password_refused(sluice.port(), "nobody").await;
}

/// Server login with each PostgreSQL method: once with `password=` in the
/// database entry (client auth trust, any client user), once with the
/// password found in the auth file for the connecting user.
async fn server_login_works_with(auth: ServerAuth) {
    let cluster = app_cluster(auth);
    let sluice = ConfigBuilder::new()
        .database_on(
            &cluster,
            "via_entry",
            &format!("dbname=postgres user={APP_USER} password={APP_PASSWORD}"),
        )
        .database(
            "via_auth_file",
            &format!("host=127.0.0.1 port={} dbname=postgres", cluster.port()),
        )
        // Under trust the user must still be in the auth file (PgBouncer's
        // rule); its password there is not asked for.
        .userlist(&[(APP_USER, APP_PASSWORD), ("someone", "unused")])
        .start();

    let forced = connect(sluice.port(), "someone", "", "via_entry")
        .await
        .unwrap_or_else(|e| panic!("{auth:?}: login with the entry's password failed: {e:?}"));
    let row = forced
        .query_one("select current_user::text", &[])
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), APP_USER);

    let own = connect(sluice.port(), APP_USER, "", "via_auth_file")
        .await
        .unwrap_or_else(|e| panic!("{auth:?}: login with the auth file's password failed: {e:?}"));
    let row = own
        .query_one("select current_user::text", &[])
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), APP_USER);
}

#[tokio::test]
async fn server_login_with_cleartext_password() {
    server_login_works_with(ServerAuth::Password).await;
}

#[tokio::test]
async fn server_login_with_md5() {
    server_login_works_with(ServerAuth::Md5).await;
}

#[tokio::test]
async fn server_login_with_scram() {
    server_login_works_with(ServerAuth::ScramSha256).await;
}

#[tokio::test]
async fn wrong_server_password_is_an_error_not_a_hang() {
    let cluster = app_cluster(ServerAuth::ScramSha256);
    let sluice = ConfigBuilder::new()
        .database_on(
            &cluster,
            "postgres",
            &format!("user={APP_USER} password=wrong"),
        )
        .start();
    let result = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        connect(sluice.port(), APP_USER, "", "postgres"),
    )
    .await
    .expect("the client must get an answer, not wait forever");
    let error = match result {
        Ok(client) => client
            .simple_query("select 1")
            .await
            .expect_err("a server login with a wrong password cannot serve queries"),
        Err(error) => error,
    };
    assert!(
        error.code().is_some() || error.is_closed(),
        "unexpected error kind: {error:?}"
    );
}

#[tokio::test]
async fn scram_secret_from_pg_authid_logs_in_to_the_server() {
    let cluster = app_cluster(ServerAuth::ScramSha256);
    let secret = cluster
        .psql(
            "postgres",
            &format!("select rolpassword from pg_authid where rolname = '{APP_USER}'"),
        )
        .unwrap();
    assert!(secret.starts_with("SCRAM-SHA-256$"), "{secret}");
    let sluice = ConfigBuilder::for_cluster(&cluster)
        .set("auth_type", "scram-sha-256")
        .auth_file(&format!("\"{APP_USER}\" \"{secret}\"\n"))
        .start();
    assert_logs_in_as_app(sluice.port(), APP_PASSWORD).await;
    // A second client reuses or opens servers with the learnt keys.
    let clients = futures_util::future::join_all(
        (0..3).map(|_| connect(sluice.port(), APP_USER, APP_PASSWORD, "postgres")),
    )
    .await;
    for client in clients {
        let client = client.expect("login with the SCRAM secret");
        client.simple_query("select 1").await.unwrap();
    }
    assert_wrong_password_refused(sluice.port(), APP_USER).await;
}

#[tokio::test]
async fn unknown_database_is_3d000() {
    let cluster = app_cluster(ServerAuth::Trust);
    let sluice = ConfigBuilder::for_cluster(&cluster).start();
    let error = expect_sqlstate(connect(sluice.port(), APP_USER, "", "nope").await, "3D000");
    assert_eq!(
        error.as_db_error().unwrap().message(),
        "database \"nope\" does not exist"
    );
}

#[tokio::test]
async fn psql_logs_in_with_md5() {
    let cluster = app_cluster(ServerAuth::ScramSha256);
    let sluice = sluice_with_client_auth(&cluster, "md5");
    let port = sluice.port();
    let ok = tokio::task::spawn_blocking(move || {
        psql(
            port,
            APP_USER,
            APP_PASSWORD,
            "postgres",
            "select current_user",
        )
    })
    .await
    .unwrap();
    assert!(ok.success(), "psql failed: {}", ok.stderr);
    assert_eq!(ok.stdout.trim(), APP_USER);
    let refused =
        tokio::task::spawn_blocking(move || psql(port, APP_USER, "wrong", "postgres", "select 1"))
            .await
            .unwrap();
    assert!(!refused.success());
    assert!(
        refused.stderr.contains("password authentication failed"),
        "{}",
        refused.stderr
    );
}
