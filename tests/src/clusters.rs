//! The clusters most tests need: PostgreSQL with one application role whose
//! password the tests (and auth files) know.

use sluice_testkit::{Cluster, ServerAuth};

use crate::{APP_PASSWORD, APP_USER};

/// A cluster requiring `auth` over TCP, with role [`APP_USER`] / [`APP_PASSWORD`].
pub fn app_cluster(auth: ServerAuth) -> Cluster {
    app_cluster_with(auth, |builder| builder)
}

/// Like [`app_cluster`], letting the caller adjust the builder first.
pub fn app_cluster_with(
    auth: ServerAuth,
    adjust: impl FnOnce(sluice_testkit::ClusterBuilder) -> sluice_testkit::ClusterBuilder,
) -> Cluster {
    adjust(Cluster::builder().auth(auth).user(APP_USER, APP_PASSWORD))
        .start()
        .unwrap_or_else(|e| panic!("cannot start PostgreSQL: {e}"))
}

/// Lets [`APP_USER`] create tables in schema public of the `postgres` database.
pub fn grant_create(cluster: &Cluster) {
    cluster
        .psql(
            "postgres",
            &format!("grant create on schema public to {APP_USER}"),
        )
        .expect("grant create on public");
}

/// Creates table `name` with `columns` in database postgres, owned by the
/// superuser, with every privilege on it for the application user.
pub fn app_table(cluster: &Cluster, name: &str, columns: &str) {
    cluster
        .psql(
            "postgres",
            &format!("create table {name}({columns}); grant all on {name} to {APP_USER}"),
        )
        .unwrap_or_else(|e| panic!("create table {name}: {e}"));
}
