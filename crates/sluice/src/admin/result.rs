//! A result set the console builds and sends: typed columns as PgBouncer
//! declares them (text, int4, int8, numeric), text values, the `SHOW` tag.

use bytes::BytesMut;
use sluice_wire::{ColumnType, command_complete, data_row, row_description};

/// Columns and rows of one answer.
pub struct ResultSet {
    columns: Vec<(&'static str, ColumnType)>,
    rows: Vec<Vec<Option<String>>>,
}

impl ResultSet {
    /// Columns from PgBouncer's type letters: s text, i int4, q int8,
    /// N numeric, T timestamp (sent as text).
    pub fn new(names: &[&'static str], types: &str) -> Self {
        debug_assert_eq!(names.len(), types.len());
        let columns = names
            .iter()
            .zip(types.chars())
            .map(|(n, t)| {
                let ty = match t {
                    'i' => ColumnType::Int4,
                    'q' => ColumnType::Int8,
                    'N' => ColumnType::Numeric,
                    _ => ColumnType::Text,
                };
                (*n, ty)
            })
            .collect();
        Self {
            columns,
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, values: Vec<Option<String>>) {
        debug_assert_eq!(values.len(), self.columns.len());
        self.rows.push(values);
    }

    /// The rows as JSON objects keyed by column (the web console's API):
    /// numeric columns as numbers, NULL as null.
    pub fn to_json(&self) -> serde_json::Value {
        let rows = self
            .rows
            .iter()
            .map(|row| {
                let object = self
                    .columns
                    .iter()
                    .zip(row)
                    .map(|((name, ty), value)| {
                        let value = match (ty, value) {
                            (_, None) => serde_json::Value::Null,
                            (ColumnType::Text, Some(v)) => serde_json::Value::from(v.as_str()),
                            (_, Some(v)) => v
                                .parse::<i64>()
                                .map(serde_json::Value::from)
                                .or_else(|_| v.parse::<f64>().map(serde_json::Value::from))
                                .unwrap_or_else(|_| serde_json::Value::from(v.as_str())),
                        };
                        ((*name).to_owned(), value)
                    })
                    .collect::<serde_json::Map<_, _>>();
                serde_json::Value::Object(object)
            })
            .collect();
        serde_json::Value::Array(rows)
    }

    /// The rows, for a command that combines result sets.
    pub fn into_rows(self) -> Vec<Vec<Option<String>>> {
        self.rows
    }

    /// Appends RowDescription, the rows and CommandComplete("SHOW").
    pub fn encode(&self, out: &mut BytesMut) {
        row_description(out, &self.columns);
        for r in &self.rows {
            data_row(out, r);
        }
        command_complete(out, "SHOW");
    }
}

/// A value for a row.
pub fn v(x: impl ToString) -> Option<String> {
    Some(x.to_string())
}
