//! `auth_user` + `auth_query` (+ `auth_dbname`, global and per database):
//! users absent from auth_file log in with the secret PostgreSQL holds for
//! them (md5 or SCRAM, read through a SECURITY DEFINER function as
//! PgBouncer's docs advise), and sluice logs in to the server with what the
//! client proved — no password of theirs is configured anywhere. Each case
//! succeeds and fails with PostgreSQL's SQLSTATE and message.

use std::time::Duration;

use sluice_tests::*;

const AUTH_USER: &str = "sluice_auth";
const AUTH_PASSWORD: &str = "auth-secret";
/// PgBouncer's documented pattern: a function that reads pg_authid with
/// its owner's rights, callable only by the auth user.
const LOOKUP_QUERY: &str = "SELECT uname, phash FROM public.user_lookup($1)";

/// A cluster whose server accepts md5 and SCRAM secrets (pg_hba md5 takes a
/// SCRAM-stored password with SCRAM), with an md5 user, a SCRAM user, an
/// expired user, the auth user and its lookup function (in `postgres`
/// only: `appdb` has none, which makes `auth_dbname` observable).
fn auth_cluster() -> Cluster {
    let cluster = app_cluster(ServerAuth::Md5);
    cluster
        .psql(
            "postgres",
            &format!(
                "set password_encryption = 'md5';
                 create role md5user login password 'md5-pw';
                 set password_encryption = 'scram-sha-256';
                 create role scramuser login password 'scram-pw';
                 create role expired login password 'old-pw' valid until '2000-01-01';
                 create role {AUTH_USER} login password '{AUTH_PASSWORD}';
                 create function public.user_lookup(in i_username text, out uname text, out phash text)
                   returns record language sql security definer as $$
                     select rolname::text,
                            case when rolvaliduntil < now() then null else rolpassword end
                     from pg_authid where rolname = i_username and rolcanlogin $$;
                 revoke all on function public.user_lookup(text) from public;
                 grant execute on function public.user_lookup(text) to {AUTH_USER};"
            ),
        )
        .expect("set up roles");
    cluster
        .psql("postgres", "create database appdb")
        .expect("create appdb");
    cluster
}

fn sluice_with_auth_query(cluster: &Cluster, auth_type: &str) -> SluiceProcess {
    ConfigBuilder::for_cluster(cluster)
        .set("auth_type", auth_type)
        .set("auth_user", AUTH_USER)
        .set("auth_query", LOOKUP_QUERY)
        .set("pool_mode", "transaction")
        .userlist(&[(AUTH_USER, AUTH_PASSWORD)])
        .start()
}

/// A `*` entry for every database of `cluster`, users looked up by
/// auth_query under md5.
fn any_database(cluster: &Cluster) -> ConfigBuilder {
    ConfigBuilder::new()
        .database(
            "*",
            &format!("host={} port={}", cluster.host(), cluster.port()),
        )
        .set("auth_type", "md5")
        .set("auth_user", AUTH_USER)
        .set("auth_query", LOOKUP_QUERY)
}

async fn current_user_through(port: u16, user: &str, password: &str, db: &str) -> String {
    let client = connect(port, user, password, db)
        .await
        .unwrap_or_else(|e| panic!("{user} with {password:?} on {db}: {e:?}"));
    scalar_text(&client, "select current_user").await
}

async fn refused(port: u16, user: &str, password: &str, db: &str) {
    let error = expect_sqlstate(connect(port, user, password, db).await, "28P01");
    assert_eq!(
        error.as_db_error().expect("a server error").message(),
        format!("password authentication failed for user \"{user}\"")
    );
}

#[tokio::test]
async fn md5_and_scram_users_from_pg_authid_log_in_under_md5() {
    let cluster = auth_cluster();
    let sluice = sluice_with_auth_query(&cluster, "md5");
    let port = sluice.port();
    assert_eq!(
        current_user_through(port, "md5user", "md5-pw", "postgres").await,
        "md5user"
    );
    // A SCRAM secret answers with SCRAM even under auth_type md5, and the
    // server login uses the keys the client proved.
    assert_eq!(
        current_user_through(port, "scramuser", "scram-pw", "postgres").await,
        "scramuser"
    );
    refused(port, "md5user", "wrong", "postgres").await;
    refused(port, "scramuser", "wrong", "postgres").await;
    refused(port, "nobody", "x", "postgres").await;
    refused(port, "expired", "old-pw", "postgres").await;
    // A name is a parameter, never SQL.
    refused(port, "x' or 'a'='a", "x", "postgres").await;
    // Several clients at once: new servers open with the learnt secrets.
    let clients = futures_util::future::join_all(
        (0..4).map(|_| connect(port, "md5user", "md5-pw", "postgres")),
    )
    .await;
    let mut clients: Vec<_> = clients
        .into_iter()
        .map(|c| c.expect("md5user logs in"))
        .collect();
    let held: Vec<_> = clients.iter_mut().map(|c| c.transaction()).collect();
    for t in futures_util::future::join_all(held).await {
        let t = t.expect("each client holds a server");
        let row = t
            .query_one("select current_user::text", &[])
            .await
            .expect("query");
        assert_eq!(row.get::<_, String>(0), "md5user");
        t.commit().await.expect("commit");
    }
}

#[tokio::test]
async fn scram_auth_takes_scram_secrets_and_refuses_md5_ones() {
    let cluster = auth_cluster();
    let sluice = sluice_with_auth_query(&cluster, "scram-sha-256");
    let port = sluice.port();
    assert_eq!(
        current_user_through(port, "scramuser", "scram-pw", "postgres").await,
        "scramuser"
    );
    refused(port, "scramuser", "wrong", "postgres").await;
    // An md5 hash cannot check a SCRAM proof.
    refused(port, "md5user", "md5-pw", "postgres").await;
    refused(port, "nobody", "x", "postgres").await;
}

#[tokio::test]
async fn a_password_changed_in_postgres_counts_at_the_next_login() {
    let cluster = auth_cluster();
    let sluice = sluice_with_auth_query(&cluster, "md5");
    let port = sluice.port();
    let first = connect(port, "md5user", "md5-pw", "postgres")
        .await
        .expect("old password");
    cluster
        .psql(
            "postgres",
            "set password_encryption = 'md5'; alter role md5user password 'new-pw'",
        )
        .expect("alter role");
    refused(port, "md5user", "md5-pw", "postgres").await;
    let second = connect(port, "md5user", "new-pw", "postgres")
        .await
        .expect("new password");
    // Both hold a server at once: the second server logs in with the new
    // hash.
    let a = first.simple_query("begin").await;
    let b = second.simple_query("begin").await;
    a.expect("first client's transaction");
    b.expect("second client's transaction (a new server)");
    assert_eq!(scalar_text(&second, "select current_user").await, "md5user");
    cluster
        .psql("postgres", "drop role scramuser")
        .expect("drop role");
    refused(port, "scramuser", "scram-pw", "postgres").await;
}

#[tokio::test]
async fn per_database_auth_user_query_and_dbname() {
    let cluster = auth_cluster();
    let server = format!("host={} port={}", cluster.host(), cluster.port());
    let sluice = ConfigBuilder::new()
        .database_on(&cluster, "postgres", "")
        // appdb has no lookup function: the query runs in `authsrc`.
        .database(
            "app",
            &format!(
                "{server} dbname=appdb auth_user={AUTH_USER} auth_dbname=authsrc \
                 auth_query='{LOOKUP_QUERY}'"
            ),
        )
        .database("authsrc", &format!("{server} dbname=postgres"))
        // Without auth_dbname the lookup runs in appdb itself, and fails.
        .database(
            "app_here",
            &format!("{server} dbname=appdb auth_user={AUTH_USER} auth_query='{LOOKUP_QUERY}'"),
        )
        .set("auth_type", "md5")
        .set("pool_mode", "transaction")
        .userlist(&[(AUTH_USER, AUTH_PASSWORD)])
        .start();
    let port = sluice.port();
    let client = connect(port, "md5user", "md5-pw", "app")
        .await
        .expect("md5user on app");
    assert_eq!(
        scalar_text(&client, "select current_database()").await,
        "appdb"
    );
    refused(port, "md5user", "wrong", "app").await;
    // No auth_user for `postgres`: only auth_file users.
    refused(port, "md5user", "md5-pw", "postgres").await;
    let error = expect_sqlstate(
        connect(port, "md5user", "md5-pw", "app_here").await,
        "08006",
    );
    let message = error.as_db_error().expect("a server error").message();
    assert_eq!(
        message,
        "could not look up user \"md5user\" with auth_query (see the pooler's log)"
    );
    // The details are in the log, not in what an unproven client is told.
    assert!(sluice.log().contains("user_lookup"), "{}", sluice.log());
    // The failure hurt nobody else.
    client.simple_query("select 1").await.expect("app client");
}

#[tokio::test]
async fn an_auth_user_that_cannot_log_in_is_a_clear_error() {
    let cluster = auth_cluster();
    let sluice = ConfigBuilder::for_cluster(&cluster)
        .set("auth_type", "md5")
        .set("auth_user", AUTH_USER)
        .set("auth_query", LOOKUP_QUERY)
        .userlist(&[(AUTH_USER, "not-its-password"), (APP_USER, APP_PASSWORD)])
        .start();
    let port = sluice.port();
    let error = expect_sqlstate(
        connect(port, "md5user", "md5-pw", "postgres").await,
        "08006",
    );
    let message = error.as_db_error().expect("a server error").message();
    assert!(
        message.contains("could not look up user \"md5user\""),
        "{message}"
    );
    // auth_file users are not looked up and keep working.
    assert_eq!(
        current_user_through(port, APP_USER, APP_PASSWORD, "postgres").await,
        APP_USER
    );
}

/// A query that can match several roles would hand one role's secret to
/// another: refused, as is a result without a password column.
#[tokio::test]
async fn a_query_answering_several_rows_or_one_column_is_refused() {
    let cluster = auth_cluster();
    let several = "SELECT uname, phash FROM public.user_lookup($1) \
                   UNION ALL SELECT uname, phash FROM public.user_lookup('scramuser')";
    let one_column = "SELECT uname FROM public.user_lookup($1)";
    for query in [several, one_column] {
        let sluice = ConfigBuilder::for_cluster(&cluster)
            .set("auth_type", "md5")
            .set("auth_user", AUTH_USER)
            .set("auth_query", query)
            .userlist(&[(AUTH_USER, AUTH_PASSWORD)])
            .start();
        expect_sqlstate(
            connect(sluice.port(), "md5user", "md5-pw", "postgres").await,
            "08006",
        );
        let log = sluice.log();
        assert!(
            log.contains("expected at most 1") || log.contains("expected 2"),
            "{log}"
        );
    }
}

/// With a `*` entry, every database name a client invents would get an
/// auth pool before any password is checked: a failed login forgets it.
#[tokio::test]
async fn failed_logins_to_invented_databases_leave_no_pools() {
    let cluster = auth_cluster();
    // Real databases, unlisted, holding the lookup function (copies of
    // `postgres`): there the lookup succeeds and only the password fails.
    for i in 0..3 {
        cluster
            .psql(
                "template1",
                &format!("create database real_{i} template postgres"),
            )
            .expect("create database");
    }
    let sluice = any_database(&cluster)
        .set("admin_users", "admin")
        .userlist(&[(AUTH_USER, AUTH_PASSWORD), ("admin", "admin-pw")])
        .start();
    let port = sluice.port();
    for db in (0..3).flat_map(|i| [format!("invented_{i}"), format!("real_{i}")]) {
        let refused = connect(port, "md5user", "wrong", &db).await;
        assert!(refused.is_err(), "{db}: a wrong password got in");
    }
    let client = connect(port, "md5user", "md5-pw", "postgres")
        .await
        .expect("md5user on postgres via *");
    assert_eq!(scalar_text(&client, "select current_user").await, "md5user");
    let console = connect(port, "admin", "admin-pw", "pgbouncer")
        .await
        .expect("console");
    let pools = column(&console, "SHOW POOLS", "database").await;
    assert!(
        pools
            .iter()
            .all(|db| !db.starts_with("invented_") && !db.starts_with("real_")),
        "pools left by failed logins: {pools:?}"
    );
    assert!(pools.iter().any(|db| db == "postgres"), "{pools:?}");
}

/// A failed login whose lookup made the auth user's pool (a `*` entry,
/// nothing there yet) leaves it to the clients that came meanwhile: it was
/// forgotten under them, and each of their transactions then ran on a new
/// server (a review: 8,488 tps down to 1,571, 1,336 backends forked).
#[tokio::test]
async fn a_failed_login_leaves_the_pool_others_joined() {
    let cluster = auth_cluster();
    let sluice = any_database(&cluster)
        .set("pool_mode", "transaction")
        .set("admin_users", "admin")
        .userlist(&[(AUTH_USER, AUTH_PASSWORD), ("admin", "admin-pw")])
        .start();
    let port = sluice.port();
    let mut intruder = RawClient::connect(port).await;
    intruder.startup("nosuchuser", "postgres").await;
    match intruder.read_message(Duration::from_secs(10)).await {
        RawReply::Message(b'R', body) => assert_eq!(body[..4], 5u32.to_be_bytes(), "md5"),
        other => panic!("no password request: {other:?}"),
    }
    // (the auth user's own pool, made by the intruder's lookup)
    let client = connect(port, AUTH_USER, AUTH_PASSWORD, "postgres")
        .await
        .expect("the auth user logs in");
    let pid = scalar_text(&client, "select pg_backend_pid()::text").await;
    let mut wrong = b"md5".to_vec();
    wrong.extend_from_slice(&[b'0'; 32]);
    wrong.push(0);
    intruder
        .send(&[&[b'p'][..], &length_prefixed(&wrong)].concat())
        .await
        .expect("send");
    match intruder.read_message(Duration::from_secs(10)).await {
        RawReply::Message(b'E', _) => {}
        other => panic!("the wrong password was not refused: {other:?}"),
    }
    for _ in 0..5 {
        assert_eq!(
            scalar_text(&client, "select pg_backend_pid()::text").await,
            pid,
            "the pool was forgotten under its client: a new server each transaction\n{}",
            sluice.log_tail(10)
        );
    }
    let console = connect(port, "admin", "admin-pw", "pgbouncer")
        .await
        .expect("console");
    let users = column(&console, "SHOW POOLS", "user").await;
    assert!(users.iter().any(|u| u == AUTH_USER), "{users:?}");
}

/// A flood of logins to one database that does not exist (a `*` entry)
/// costs PostgreSQL one failed login per `server_login_retry`, not one
/// each: the failure is kept, as PgBouncer keeps it ("server login has
/// been failing, cached error"), though the pool is not.
#[tokio::test]
async fn logins_to_a_database_that_does_not_exist_fail_from_a_cache() {
    let cluster = auth_cluster();
    let sluice = any_database(&cluster)
        .userlist(&[(AUTH_USER, AUTH_PASSWORD)])
        .start();
    for _ in 0..5 {
        expect_sqlstate(
            connect(sluice.port(), "md5user", "md5-pw", "nowhere").await,
            "08006",
        );
    }
    let tried = cluster
        .log_text()
        .matches("database \"nowhere\" does not exist")
        .count();
    assert_eq!(tried, 1, "PostgreSQL saw {tried} logins to nowhere");
    // Another database is not held up.
    assert_eq!(
        current_user_through(sluice.port(), "md5user", "md5-pw", "postgres").await,
        "md5user"
    );
}

/// A raw client logged in with a cleartext password (`auth_type = plain`).
async fn plain_login(port: u16, user: &str, password: &str, db: &str) -> RawClient {
    let mut client = RawClient::connect(port).await;
    client.startup(user, db).await;
    loop {
        match client.read_message(Duration::from_secs(10)).await {
            RawReply::Message(b'R', body) if body.get(..4) == Some(&[0, 0, 0, 3]) => {
                let mut answer = password.as_bytes().to_vec();
                answer.push(0);
                let message = sluice_tests::msg::message(b'p', &answer);
                client.send(&message).await.expect("send the password");
            }
            RawReply::Message(b'Z', _) => return client,
            RawReply::Message(b'E', body) => panic!("login failed: {:?}", error_fields(&body)),
            RawReply::Message(..) => {}
            other => panic!("login did not complete: {other:?}"),
        }
    }
}

/// auth_query's lookup runs as the unnamed statement on a server of the
/// auth user's own pool: a client of that pool cannot describe or bind it
/// afterwards (review 31 read a user's secret that way, by binding the
/// lookup with a name of its choosing).
#[tokio::test]
async fn a_client_of_the_auth_users_pool_cannot_run_the_lookup() {
    use sluice_tests::msg::{bind, describe, execute, message, parse, sync};
    let cluster = auth_cluster();
    let sluice = ConfigBuilder::for_cluster(&cluster)
        .set("auth_type", "plain")
        .set("auth_user", AUTH_USER)
        .set("auth_query", LOOKUP_QUERY)
        .set("pool_mode", "transaction")
        .set("default_pool_size", "1")
        .userlist(&[(AUTH_USER, AUTH_PASSWORD)])
        .start();
    let port = sluice.port();
    let mut me = plain_login(port, AUTH_USER, AUTH_PASSWORD, "postgres").await;
    // The server's unnamed statement is this client's own first.
    me.send(&[parse("", "select 1"), bind(""), execute(), sync()].concat())
        .await
        .expect("send");
    assert_eq!(me.kinds_until_ready(Duration::from_secs(10)).await, "12DCZ");
    assert_eq!(
        current_user_through(port, "md5user", "md5-pw", "postgres").await,
        "md5user"
    );
    let mut run = describe(b'S', "");
    let mut body = vec![0u8, 0u8, 0, 0, 0, 1];
    body.extend_from_slice(&7i32.to_be_bytes());
    body.extend_from_slice(b"md5user");
    body.extend_from_slice(&[0, 0]);
    run.extend(message(b'B', &body));
    run.extend(execute());
    run.extend(sync());
    me.send(&run).await.expect("send");
    assert_eq!(
        me.kinds_until_ready(Duration::from_secs(10)).await,
        "E26000Z"
    );
}
