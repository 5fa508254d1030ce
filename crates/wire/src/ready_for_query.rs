//! ReadyForQuery ('Z'): the end of a request cycle and the transaction status,
//! which decides when a transaction-mode server goes back to the pool.

use bytes::BytesMut;

use crate::{MessageBuilder, WireError, tags::backend};

/// The status byte of ReadyForQuery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransactionStatus {
    /// 'I': not in a transaction block.
    Idle,
    /// 'T': in a transaction block.
    InTransaction,
    /// 'E': in a failed transaction block.
    Failed,
}

impl TransactionStatus {
    pub fn decode(body: &[u8]) -> Result<Self, WireError> {
        match body {
            [b'I'] => Ok(Self::Idle),
            [b'T'] => Ok(Self::InTransaction),
            [b'E'] => Ok(Self::Failed),
            _ => Err(WireError::Invalid {
                what: "ReadyForQuery",
                detail: format!("status {body:?}"),
            }),
        }
    }

    pub fn as_byte(self) -> u8 {
        match self {
            Self::Idle => b'I',
            Self::InTransaction => b'T',
            Self::Failed => b'E',
        }
    }
}

/// Appends a ReadyForQuery with `status`.
pub fn ready_for_query(buf: &mut BytesMut, status: TransactionStatus) {
    MessageBuilder::new(buf, backend::READY_FOR_QUERY)
        .u8(status.as_byte())
        .finish();
}
