//! Reading the admin console's answers: rows of a SHOW as (column, value)
//! pairs, and one column of a row.

use tokio_postgres::SimpleQueryMessage;

use crate::client::connect_as;

/// One row of a console answer: (column name, value) in column order.
pub type ConsoleRow = Vec<(String, Option<String>)>;

/// Rows of `command` on the console at `port`, logged in as `user`.
pub async fn console_rows(port: u16, user: &str, command: &str) -> Vec<ConsoleRow> {
    let client = connect_as(port, user, "pgbouncer").await;
    let messages = client.simple_query(command).await.expect(command);
    messages
        .into_iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(row) => Some(
                row.columns()
                    .iter()
                    .enumerate()
                    .map(|(i, c)| (c.name().to_owned(), row.get(i).map(str::to_owned)))
                    .collect(),
            ),
            _ => None,
        })
        .collect()
}

/// The value of column `name` in `row`; panics if it is missing or NULL.
pub fn row_field<'a>(row: &'a [(String, Option<String>)], name: &str) -> &'a str {
    row.iter()
        .find(|(n, _)| n == name)
        .and_then(|(_, v)| v.as_deref())
        .unwrap_or_else(|| panic!("column {name} missing or NULL in {row:?}"))
}
