//! Streaming replicas: they stream, are read-only, see the primary's writes
//! and clean up after themselves.

mod support;

use std::time::Duration;

use sluice_testkit::{Cluster, ServerAuth};

#[test]
fn replica_streams_rows_from_the_primary() {
    let primary = Cluster::builder()
        .auth(ServerAuth::ScramSha256)
        .user("app", "pw")
        .start()
        .unwrap();
    primary
        .psql(
            "postgres",
            "CREATE TABLE t (x int); INSERT INTO t VALUES (1)",
        )
        .unwrap();
    let replica = primary.start_replica().unwrap();
    assert_ne!(replica.port(), primary.port());
    assert_ne!(replica.socket_dir(), primary.socket_dir());
    assert_eq!(
        replica
            .psql("postgres", "SELECT pg_is_in_recovery()")
            .unwrap(),
        "t"
    );
    assert_eq!(
        replica
            .psql("postgres", "SELECT status FROM pg_stat_wal_receiver")
            .unwrap(),
        "streaming"
    );
    assert_eq!(replica.psql("postgres", "SELECT x FROM t").unwrap(), "1");

    primary
        .psql("postgres", "INSERT INTO t VALUES (2)")
        .unwrap();
    support::eventually("the replica to see row 2", Duration::from_secs(30), || {
        replica.psql("postgres", "SELECT count(*) FROM t").unwrap() == "2"
    });
    assert!(
        replica
            .psql("postgres", "INSERT INTO t VALUES (3)")
            .is_err()
    );
    // Same roles and pg_hba as the primary.
    assert_eq!(
        support::tcp_login(&replica, "app", "pw", replica.port()).unwrap(),
        "app"
    );
    assert_eq!(
        primary
            .psql("postgres", "SELECT count(*) FROM pg_stat_replication")
            .unwrap(),
        "1"
    );

    let replica_dir = replica.socket_dir().to_owned();
    drop(replica);
    assert!(!replica_dir.exists());
    assert_eq!(
        primary.psql("postgres", "SELECT count(*) FROM t").unwrap(),
        "2"
    );
}
