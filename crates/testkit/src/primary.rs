//! Creating a primary: a fresh data directory in a new temp dir, install the testkit's
//! configuration, start it, then set the superuser password and create the
//! requested roles and databases.

use crate::cluster::{Cluster, SUPERUSER, SUPERUSER_PASSWORD};
use crate::error::TestkitError;
use crate::initdb;
use crate::server_conf::{ServerAuth, ServerConf};
use crate::sql::{ident, literal};
use crate::temp_dir::TempDir;

/// A started primary with the given configuration and nothing provisioned yet.
pub(crate) fn create(conf: ServerConf) -> Result<Cluster, TestkitError> {
    let dir = TempDir::create()?;
    let mut cluster = Cluster::unstarted(dir, conf);
    initdb::populate(&cluster.data_dir)?;
    cluster.conf.install(&cluster.data_dir)?;
    cluster.start_on_free_port()?;
    Ok(cluster)
}

/// Sets the superuser password, then creates roles and databases.
pub(crate) fn provision(
    cluster: &Cluster,
    auth: ServerAuth,
    users: &[(String, String)],
    databases: &[String],
) -> Result<(), TestkitError> {
    let mut roles = format!(
        "SET password_encryption = {};\nALTER ROLE {} PASSWORD {};\n",
        literal(auth.password_encryption())?,
        ident(SUPERUSER)?,
        literal(SUPERUSER_PASSWORD)?,
    );
    for (name, password) in users {
        roles.push_str(&format!(
            "CREATE ROLE {} LOGIN NOSUPERUSER PASSWORD {};\n",
            ident(name)?,
            literal(password)?
        ));
    }
    let mut statements = vec![roles];
    for db in databases {
        statements.push(format!(
            "CREATE DATABASE {} OWNER {}",
            ident(db)?,
            ident(SUPERUSER)?
        ));
    }
    let statements: Vec<&str> = statements.iter().map(String::as_str).collect();
    cluster.psql_each("postgres", &statements).map(drop)
}
