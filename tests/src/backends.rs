//! Counting the client backends PostgreSQL has for a database: the ground
//! truth for "how many server connections does sluice hold".

use std::time::{Duration, Instant};

use sluice_testkit::{Cluster, SUPERUSER_PASSWORD};

use crate::client::{config_for, connect_config};

/// The application_name of the connections that count: an earlier count's
/// backend may still be exiting when the next count looks (a fresh-clone CI
/// run saw "21 server backends for a pool of 20" under load), so counts
/// leave out every counting connection, not only their own.
const COUNTER: &str = "sluice-tests-count";

const COUNT_SQL: &str = "select count(*) from pg_stat_activity \
     where backend_type = 'client backend' and datname = $1 \
     and application_name <> 'sluice-tests-count'";

/// Client backends connected to `db`, not counting the ones asking (direct
/// superuser connections to the `postgres` database, named [`COUNTER`]).
pub async fn count_backends(cluster: &Cluster, db: &str) -> i64 {
    let mut config = config_for(
        cluster.port(),
        cluster.superuser(),
        SUPERUSER_PASSWORD,
        "postgres",
    );
    config.application_name(COUNTER);
    let client = connect_config(&config)
        .await
        .unwrap_or_else(|e| panic!("direct superuser login to the cluster failed: {e:?}"));
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
        .psql(&format!("dbname=postgres application_name={COUNTER}"), &sql)
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
