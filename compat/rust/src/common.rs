//! Shared helpers: the environment, errors, connections, workers and waits.

use std::collections::BTreeMap;
use std::error::Error as StdError;
use std::future::Future;
use std::time::Duration;

use futures_util::future::poll_fn;
use sqlx::postgres::{PgPool, PgPoolOptions};
use tokio::sync::mpsc;
use tokio_postgres::{AsyncMessage, Client, NoTls, Notification};

/// Prefix of every schema, table and channel this suite creates.
pub const PREFIX: &str = "compat_rust";

/// Deadline for one connection attempt.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
/// Deadline for one worker of a scenario.
pub const WORKER_TIMEOUT: Duration = Duration::from_secs(60);

/// `COMPAT_DSN`: `postgres://app:…@127.0.0.1:<port>/compat` (sluice, or
/// PostgreSQL itself with `SLUICE_COMPAT_TARGET=direct`).
pub fn dsn() -> String {
    std::env::var("COMPAT_DSN").expect("COMPAT_DSN is set (run through tests/tests/compat.rs)")
}

/// A failed check: a message, and the SQLSTATE when the server sent one.
#[derive(Debug)]
pub struct Error {
    pub message: String,
    pub code: Option<String>,
}

pub type R<T = ()> = Result<T, Error>;

impl Error {
    pub fn msg(message: impl Into<String>) -> Self {
        Error {
            message: message.into(),
            code: None,
        }
    }

    /// The same error with `context: ` in front of its message.
    pub fn context(self, context: impl std::fmt::Display) -> Self {
        Error {
            message: format!("{context}: {}", self.message),
            code: self.code,
        }
    }
}

impl<E: StdError + 'static> From<E> for Error {
    fn from(e: E) -> Self {
        Error {
            message: describe(&e),
            code: sqlstate(&e),
        }
    }
}

/// The SQLSTATE of a tokio-postgres or sqlx error, if the server sent one.
pub fn sqlstate(e: &(dyn StdError + 'static)) -> Option<String> {
    if let Some(e) = e.downcast_ref::<tokio_postgres::Error>() {
        return e.code().map(|c| c.code().to_owned());
    }
    if let Some(sqlx::Error::Database(db)) = e.downcast_ref::<sqlx::Error>() {
        return db.code().map(|c| c.into_owned());
    }
    None
}

/// "<SQLSTATE>: <message>" for server errors, the error chain otherwise.
pub fn describe(e: &(dyn StdError + 'static)) -> String {
    if let Some(db) = e
        .downcast_ref::<tokio_postgres::Error>()
        .and_then(tokio_postgres::Error::as_db_error)
    {
        return format!("{}: {}", db.code().code(), db.message());
    }
    if let Some(sqlx::Error::Database(db)) = e.downcast_ref::<sqlx::Error>() {
        return format!("{}: {}", db.code().unwrap_or_default(), db.message());
    }
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let s_text = s.to_string();
        if !text.contains(&s_text) {
            text.push_str(": ");
            text.push_str(&s_text);
        }
        source = s.source();
    }
    text
}

/// Returns early with an error when the condition is false.
#[macro_export]
macro_rules! ensure {
    ($cond:expr, $($arg:tt)+) => {
        if !$cond {
            return Err($crate::common::Error::msg(format!($($arg)+)));
        }
    };
}

/// Returns early unless `$actual == $expected`, naming both.
#[macro_export]
macro_rules! ensure_eq {
    ($actual:expr, $expected:expr, $($arg:tt)+) => {
        match (&$actual, &$expected) {
            (actual, expected) => {
                if actual != expected {
                    return Err($crate::common::Error::msg(format!(
                        "{}: got {:?}, expected {:?}",
                        format!($($arg)+),
                        actual,
                        expected
                    )));
                }
            }
        }
    };
}

static NOTES: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// Information (not asserted) printed under the check's result line.
pub fn note(text: impl Into<String>) {
    NOTES.lock().unwrap().push(text.into());
}

/// The notes since the last call.
pub fn take_notes() -> Vec<String> {
    std::mem::take(&mut *NOTES.lock().unwrap())
}

/// `fut`, or an error after `limit`.
pub async fn within<T>(limit: Duration, what: &str, fut: impl Future<Output = T>) -> R<T> {
    tokio::time::timeout(limit, fut)
        .await
        .map_err(|_| Error::msg(format!("timed out after {limit:?}: {what}")))
}

/// Expects `fut` to fail with SQLSTATE `code`.
pub async fn expect_code<T, E>(code: &str, what: &str, fut: impl Future<Output = Result<T, E>>) -> R
where
    E: StdError + 'static,
{
    match within(Duration::from_secs(20), what, fut).await? {
        Ok(_) => Err(Error::msg(format!(
            "{what}: expected SQLSTATE {code}, but it succeeded"
        ))),
        Err(e) => match sqlstate(&e) {
            Some(c) if c == code => Ok(()),
            _ => Err(Error::msg(format!(
                "{what}: expected SQLSTATE {code}, got {}",
                describe(&e)
            ))),
        },
    }
}

/// A tokio-postgres client through the server under test; its connection
/// runs in a task of its own.
pub async fn tp_connect() -> R<Client> {
    let (client, connection) = within(
        CONNECT_TIMEOUT,
        "tokio-postgres connect",
        tokio_postgres::connect(&dsn(), NoTls),
    )
    .await??;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

/// A tokio-postgres client straight to PostgreSQL (`COMPAT_DIRECT_PORT`),
/// bypassing the server under test: for out-of-band observation only.
pub async fn tp_connect_direct() -> R<Client> {
    let port: u16 = std::env::var("COMPAT_DIRECT_PORT")
        .map_err(|_| Error::msg("COMPAT_DIRECT_PORT is not set"))?
        .parse()
        .map_err(|e| Error::msg(format!("COMPAT_DIRECT_PORT: {e}")))?;
    let base: tokio_postgres::Config = dsn().parse()?;
    let mut config = tokio_postgres::Config::new();
    for host in base.get_hosts() {
        if let tokio_postgres::config::Host::Tcp(h) = host {
            config.host(h);
        }
    }
    config.port(port);
    if let Some(user) = base.get_user() {
        config.user(user);
    }
    if let Some(password) = base.get_password() {
        config.password(password);
    }
    if let Some(db) = base.get_dbname() {
        config.dbname(db);
    }
    let (client, connection) = within(
        CONNECT_TIMEOUT,
        "tokio-postgres connect (direct)",
        config.connect(NoTls),
    )
    .await??;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

/// A tokio-postgres client whose connection task forwards every
/// notification (`Connection::poll_message`, `AsyncMessage::Notification`).
pub async fn tp_connect_listening() -> R<(Client, mpsc::UnboundedReceiver<Notification>)> {
    let (client, mut connection) = within(
        CONNECT_TIMEOUT,
        "tokio-postgres connect",
        tokio_postgres::connect(&dsn(), NoTls),
    )
    .await??;
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(message) = poll_fn(|cx| connection.poll_message(cx)).await {
            match message {
                Ok(AsyncMessage::Notification(n)) => {
                    let _ = tx.send(n);
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
    });
    Ok((client, rx))
}

/// A sqlx pool through the server under test, with sqlx's defaults (a
/// statement cache of 100 per connection) and `max` connections.
pub async fn sqlx_pool(max: u32) -> R<PgPool> {
    let pool = within(
        CONNECT_TIMEOUT,
        "sqlx pool connect",
        PgPoolOptions::new()
            .max_connections(max)
            .acquire_timeout(CONNECT_TIMEOUT)
            .connect(&dsn()),
    )
    .await??;
    Ok(pool)
}

/// Runs statements with the simple query protocol on a short-lived
/// connection (setup and final checks).
pub async fn exec(sql: &str) -> R {
    let client = tp_connect().await?;
    within(Duration::from_secs(30), sql, client.batch_execute(sql))
        .await?
        .map_err(|e| Error::from(e).context(sql))
}

/// The first column of the first row of `sql` (simple query protocol), on
/// `client`.
pub async fn simple_value(client: &Client, sql: &str) -> R<Option<String>> {
    use tokio_postgres::SimpleQueryMessage;
    let messages = within(Duration::from_secs(20), sql, client.simple_query(sql))
        .await?
        .map_err(|e| Error::from(e).context(sql))?;
    for m in messages {
        if let SimpleQueryMessage::Row(row) = m {
            return Ok(row.get(0).map(str::to_owned));
        }
    }
    Err(Error::msg(format!("{sql}: no row")))
}

/// One-off: the first column of the first row of `sql` (simple protocol),
/// parsed as an integer.
pub async fn count(sql: &str) -> R<i64> {
    let client = tp_connect().await?;
    let v = simple_value(&client, sql).await?;
    v.as_deref()
        .unwrap_or("")
        .parse::<i64>()
        .map_err(|e| Error::msg(format!("{sql}: {v:?}: {e}")))
}

/// Drops and re-creates the schemas.
pub async fn reset_schemas(names: &[String]) -> R {
    let sql: String = names
        .iter()
        .map(|n| format!("drop schema if exists {n} cascade; create schema {n};"))
        .collect();
    exec(&sql).await
}

/// Runs `n` workers as tasks, each under [`WORKER_TIMEOUT`], and fails with
/// one line per kind of failure (numbers ignored), with an example of each.
pub async fn run_workers<T, F, Fut>(n: usize, f: F) -> R<Vec<T>>
where
    T: Send + 'static,
    F: Fn(usize) -> Fut,
    Fut: Future<Output = R<T>> + Send + 'static,
{
    let handles: Vec<_> = (0..n)
        .map(|w| {
            let fut = f(w);
            tokio::spawn(async move {
                match tokio::time::timeout(WORKER_TIMEOUT, fut).await {
                    Ok(r) => r,
                    Err(_) => Err(Error::msg(format!("timed out after {WORKER_TIMEOUT:?}"))),
                }
            })
        })
        .collect();
    let mut values = Vec::new();
    let mut failures = Vec::new();
    for (w, h) in handles.into_iter().enumerate() {
        match h.await {
            Ok(Ok(v)) => values.push(v),
            Ok(Err(e)) => failures.push(format!("worker {w}: {}", e.message)),
            Err(e) => failures.push(format!("worker {w}: panicked: {e}")),
        }
    }
    if failures.is_empty() {
        return Ok(values);
    }
    Err(Error::msg(format!(
        "{} of {n} workers failed:\n{}",
        failures.len(),
        summarize(&failures)
    )))
}

/// One line per kind of message (digits ignored), with an example and a count.
pub fn summarize(lines: &[String]) -> String {
    let mut kinds: BTreeMap<String, (usize, usize, &String)> = BTreeMap::new();
    for (i, line) in lines.iter().enumerate() {
        let key: String = line
            .chars()
            .map(|c| if c.is_ascii_digit() { 'N' } else { c })
            .collect();
        kinds.entry(key).or_insert((i, 0, line)).1 += 1;
    }
    let mut kinds: Vec<_> = kinds.into_values().collect();
    kinds.sort();
    kinds
        .iter()
        .take(10)
        .map(|(_, n, example)| {
            if *n > 1 {
                format!("  {example}  (and {} more like it)", n - 1)
            } else {
                format!("  {example}")
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Wraps a worker error with the iteration it happened in.
pub fn at(iteration: usize) -> impl FnOnce(Error) -> Error {
    move |e| e.context(format!("iteration {iteration}"))
}

/// Polls `cond` every `step` until it holds, or fails after `limit`.
pub async fn wait_for(limit: Duration, what: &str, mut cond: impl FnMut() -> bool) -> R {
    let deadline = tokio::time::Instant::now() + limit;
    while !cond() {
        if tokio::time::Instant::now() > deadline {
            return Err(Error::msg(format!(
                "timed out after {limit:?} waiting for {what}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// Clients that keep running short transactions until [`Churn::stop`], so
/// that the client under test does not keep getting the same server
/// connection from the pooler.
pub struct Churn {
    stop: tokio::sync::watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<R>>,
}

impl Churn {
    pub async fn start(n: usize) -> R<Churn> {
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let mut tasks = Vec::new();
        for k in 0..n {
            let mut client = tp_connect().await?;
            let stopped = stopped.clone();
            tasks.push(tokio::spawn(async move {
                let mut i = 0i32;
                while !*stopped.borrow() {
                    let tx = client.transaction().await?;
                    let row = tx
                        .query_typed_one(
                            "select $1::int as v, pg_sleep(0.002)",
                            &[(&i, tokio_postgres::types::Type::INT4)],
                        )
                        .await?;
                    let v: i32 = row.get(0);
                    ensure_eq!(v, i, "churn client {k}");
                    tx.commit().await?;
                    i += 1;
                }
                Ok(())
            }));
        }
        Ok(Churn { stop, tasks })
    }

    pub async fn stop(self) -> R {
        let _ = self.stop.send(true);
        for t in self.tasks {
            within(Duration::from_secs(20), "churn client to stop", t)
                .await?
                .map_err(|e| Error::msg(format!("churn client panicked: {e}")))??;
        }
        Ok(())
    }
}
