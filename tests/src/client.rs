//! Connecting tokio-postgres clients to sluice (or straight to PostgreSQL)
//! with bounded logins, keeping hold of the connection task's result (which
//! carries the FATAL error when sluice closes an idle client), and reading
//! SQLSTATEs out of errors.

use std::fmt::Debug;
use std::time::Duration;

use sluice_testkit::{Cluster, SUPERUSER_PASSWORD};
use tokio::task::JoinHandle;
use tokio_postgres::{Client, Config, Error, NoTls};

/// Upper bound for one login; sluice never needs this long in a passing test.
const LOGIN_DEADLINE: Duration = Duration::from_secs(30);

/// A client together with its connection task, whose result says why the
/// connection ended (for example a FATAL sent by sluice while idle).
#[derive(Debug)]
pub struct Tracked {
    pub client: Client,
    pub connection: JoinHandle<Result<(), Error>>,
}

impl Tracked {
    /// Waits up to `timeout` for the connection to end and returns how it
    /// ended; `None` when it is still open.
    pub async fn ended(&mut self, timeout: Duration) -> Option<Result<(), Error>> {
        match tokio::time::timeout(timeout, &mut self.connection).await {
            Ok(joined) => Some(joined.expect("connection task panicked")),
            Err(_) => None,
        }
    }
}

/// tokio-postgres settings for sluice on 127.0.0.1:`port`; an empty
/// password means none is sent.
pub fn config_for(port: u16, user: &str, password: &str, db: &str) -> Config {
    let mut config = Config::new();
    config
        .host("127.0.0.1")
        .port(port)
        .user(user)
        .dbname(db)
        .connect_timeout(Duration::from_secs(10));
    if !password.is_empty() {
        config.password(password);
    }
    config
}

/// Logs in to sluice on `port` and spawns the connection task.
pub async fn connect(port: u16, user: &str, password: &str, db: &str) -> Result<Client, Error> {
    connect_config(&config_for(port, user, password, db)).await
}

/// Logs in with explicit settings and spawns the connection task.
pub async fn connect_config(config: &Config) -> Result<Client, Error> {
    connect_tracked_config(config).await.map(|t| t.client)
}

/// Like [`connect`], keeping the connection task's handle.
pub async fn connect_tracked(
    port: u16,
    user: &str,
    password: &str,
    db: &str,
) -> Result<Tracked, Error> {
    connect_tracked_config(&config_for(port, user, password, db)).await
}

async fn connect_tracked_config(config: &Config) -> Result<Tracked, Error> {
    let (client, connection) = tokio::time::timeout(LOGIN_DEADLINE, config.connect(NoTls))
        .await
        .unwrap_or_else(|_| panic!("login did not finish within {LOGIN_DEADLINE:?}"))?;
    let connection = tokio::spawn(connection);
    Ok(Tracked { client, connection })
}

/// Logs in to sluice with no password (trust) and panics on failure.
pub async fn connect_as(port: u16, user: &str, db: &str) -> Client {
    connect(port, user, "", db)
        .await
        .unwrap_or_else(|e| panic!("login as {user} to {db} through sluice failed: {e:?}"))
}

/// Superuser connection straight to the cluster (bypassing sluice), for
/// inspecting server state.
pub async fn superuser_connect(cluster: &Cluster, db: &str) -> Client {
    let config = config_for(cluster.port(), cluster.superuser(), SUPERUSER_PASSWORD, db);
    connect_config(&config)
        .await
        .unwrap_or_else(|e| panic!("direct superuser login to the cluster failed: {e:?}"))
}

/// The SQLSTATE of a server (or sluice) error, if it is one.
pub fn sqlstate(error: &Error) -> Option<&str> {
    error.code().map(|code| code.code())
}

/// Asserts that `result` failed with SQLSTATE `code` and returns the error.
pub fn expect_sqlstate<T: Debug>(result: Result<T, Error>, code: &str) -> Error {
    match result {
        Ok(value) => panic!("expected an error with SQLSTATE {code}, got success: {value:?}"),
        Err(error) => {
            assert_eq!(
                sqlstate(&error),
                Some(code),
                "expected SQLSTATE {code}, got {error:?}"
            );
            error
        }
    }
}

/// Runs `sql` with the simple protocol and returns the first column of the
/// first row (NULL as `None`); panics on an error or when there is no row.
pub async fn scalar(client: &Client, sql: &str) -> Option<String> {
    let messages = client
        .simple_query(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql:?} failed: {e:?}"));
    messages
        .iter()
        .find_map(|message| match message {
            tokio_postgres::SimpleQueryMessage::Row(row) => Some(row.get(0).map(str::to_owned)),
            _ => None,
        })
        .unwrap_or_else(|| panic!("{sql:?} returned no row"))
}

/// Runs `sql` (simple protocol: a console SHOW, say) and returns `column`
/// of every row (NULL as empty); panics on an error.
pub async fn column(client: &Client, sql: &str, column: &str) -> Vec<String> {
    let messages = client
        .simple_query(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql:?} failed: {e:?}"));
    messages
        .iter()
        .filter_map(|message| match message {
            tokio_postgres::SimpleQueryMessage::Row(row) => {
                Some(row.get(column).unwrap_or_default().to_owned())
            }
            _ => None,
        })
        .collect()
}

/// [`scalar`] for a value that must not be NULL.
pub async fn scalar_text(client: &Client, sql: &str) -> String {
    scalar(client, sql)
        .await
        .unwrap_or_else(|| panic!("{sql:?} returned NULL"))
}

/// Runs `sql` (simple protocol) in a background task that owns `client`
/// and hands it back with the result, so a test can check whether a query
/// is stuck waiting for a server and later collect it.
pub fn spawn_query(
    client: Client,
    sql: &str,
) -> JoinHandle<(
    Client,
    Result<Vec<tokio_postgres::SimpleQueryMessage>, Error>,
)> {
    let sql = sql.to_owned();
    tokio::spawn(async move {
        let result = client.simple_query(&sql).await;
        (client, result)
    })
}

/// Logs in to sluice (trust) and returns the client with a stream of the
/// notifications (LISTEN/NOTIFY) its connection receives.
pub async fn connect_listening(
    port: u16,
    user: &str,
    db: &str,
) -> (
    Client,
    tokio::sync::mpsc::UnboundedReceiver<tokio_postgres::Notification>,
) {
    let config = config_for(port, user, "", db);
    let (client, mut connection) = tokio::time::timeout(LOGIN_DEADLINE, config.connect(NoTls))
        .await
        .unwrap_or_else(|_| panic!("login did not finish within {LOGIN_DEADLINE:?}"))
        .unwrap_or_else(|e| panic!("login as {user} to {db} failed: {e:?}"));
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(message) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            match message {
                Ok(tokio_postgres::AsyncMessage::Notification(n)) => {
                    let _ = tx.send(n);
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
    });
    (client, rx)
}
