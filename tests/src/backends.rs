//! Counting the client backends PostgreSQL has for a database: the ground
//! truth for "how many server connections does sluice hold".

use std::time::{Duration, Instant};

use sluice_testkit::Cluster;

use crate::client::superuser_connect;

const COUNT_SQL: &str = "select count(*) from pg_stat_activity \
     where backend_type = 'client backend' and datname = $1 and pid <> pg_backend_pid()";

/// Client backends connected to `db`, not counting the one asking (a direct
/// superuser connection to the `postgres` database).
pub async fn count_backends(cluster: &Cluster, db: &str) -> i64 {
    let client = superuser_connect(cluster, "postgres").await;
    client
        .query_one(COUNT_SQL, &[&db])
        .await
        .expect("count backends")
        .get(0)
}

/// [`count_backends`] through psql over the unix socket (blocking).
pub fn count_backends_psql(cluster: &Cluster, db: &str) -> i64 {
    let sql = COUNT_SQL.replace("$1", &format!("'{}'", db.replace('\'', "''")));
    cluster
        .psql("postgres", &sql)
        .expect("count backends with psql")
        .parse()
        .expect("count is a number")
}

/// Polls until `accept(count)` holds, for at most `timeout`. `Ok` holds
/// the accepted count, `Err` the last count seen.
pub async fn wait_for_backends(
    cluster: &Cluster,
    db: &str,
    timeout: Duration,
    accept: impl Fn(i64) -> bool,
) -> Result<i64, i64> {
    let deadline = Instant::now() + timeout;
    loop {
        let count = count_backends(cluster, db).await;
        if accept(count) {
            return Ok(count);
        }
        if Instant::now() >= deadline {
            return Err(count);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
