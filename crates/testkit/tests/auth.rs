//! Each TCP authentication method, with a created user: the pg_hba method is
//! in force, the right password logs in and (except with trust) a wrong one
//! does not; passwords are stored in the matching format.

mod support;

use sluice_testkit::{Cluster, ServerAuth};

fn check(auth: ServerAuth) {
    let pg = Cluster::builder()
        .auth(auth)
        .user("app", "s3cret")
        .user("o'neil", "pa ss'word")
        .start()
        .unwrap();
    let methods = pg
        .psql(
            "postgres",
            "SELECT DISTINCT auth_method FROM pg_hba_file_rules WHERE type = 'host'",
        )
        .unwrap();
    assert_eq!(methods, auth.hba_method());
    assert_eq!(
        pg.psql(
            "postgres",
            "SELECT rolsuper::text || rolcanlogin::text FROM pg_roles WHERE rolname = 'app'"
        )
        .unwrap(),
        "falsetrue"
    );

    let stored = pg
        .psql(
            "postgres",
            "SELECT left(rolpassword, 3) FROM pg_authid WHERE rolname IN ('app', 'postgres')",
        )
        .unwrap();
    let expected_prefix = if auth == ServerAuth::Md5 {
        "md5"
    } else {
        "SCR"
    };
    for prefix in stored.lines() {
        assert_eq!(
            prefix, expected_prefix,
            "stored password format for {auth:?}"
        );
    }

    let port = pg.port();
    assert_eq!(
        support::tcp_login(&pg, "app", "s3cret", port).unwrap(),
        "app"
    );
    assert_eq!(
        support::tcp_login(&pg, "o'neil", "pa ss'word", port).unwrap(),
        "o'neil"
    );
    assert_eq!(
        support::tcp_login(&pg, "postgres", "postgres", port).unwrap(),
        "postgres"
    );
    let wrong = support::tcp_login(&pg, "app", "wrong", port);
    if auth == ServerAuth::Trust {
        assert_eq!(wrong.unwrap(), "app");
    } else {
        let stderr = wrong.unwrap_err();
        assert!(
            stderr.contains("password authentication failed"),
            "{auth:?}: {stderr}"
        );
    }
}

#[test]
fn trust() {
    check(ServerAuth::Trust);
}

#[test]
fn password() {
    check(ServerAuth::Password);
}

#[test]
fn md5() {
    check(ServerAuth::Md5);
}

#[test]
fn scram_sha_256() {
    check(ServerAuth::ScramSha256);
}
