//! RowDescription ('T') for result sets sluice produces itself. Column types
//! follow PgBouncer's console: text, int4, int8 and numeric.

use bytes::BytesMut;

use crate::{MessageBuilder, tags::backend};

/// Types the admin console uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColumnType {
    Text,
    Int4,
    Int8,
    Numeric,
}

impl ColumnType {
    pub fn oid(self) -> i32 {
        match self {
            Self::Text => 25,
            Self::Int4 => 23,
            Self::Int8 => 20,
            Self::Numeric => 1700,
        }
    }

    fn size(self) -> i16 {
        match self {
            Self::Text | Self::Numeric => -1,
            Self::Int4 => 4,
            Self::Int8 => 8,
        }
    }
}

/// Appends a RowDescription for text-format columns.
pub fn row_description(buf: &mut BytesMut, columns: &[(&str, ColumnType)]) {
    let mut m = MessageBuilder::new(buf, backend::ROW_DESCRIPTION).i16(columns.len() as i16);
    for (name, ty) in columns {
        m = m
            .cstr(name)
            .i32(0)
            .i16(0)
            .i32(ty.oid())
            .i16(ty.size())
            .i32(-1)
            .i16(0);
    }
    m.finish();
}
