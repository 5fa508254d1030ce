//! ErrorResponse ('E') and NoticeResponse ('N'): typed fields. sluice reads
//! the SQLSTATE of server errors for its counters and builds its own errors
//! with PostgreSQL's field layout so that every client library shows them.

use bytes::BytesMut;

use crate::{MessageBuilder, Reader, WireError, tags::backend};

/// Severity of an error or notice, as PostgreSQL names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    Error,
    Fatal,
    Panic,
    Warning,
    Notice,
    Log,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Error => "ERROR",
            Self::Fatal => "FATAL",
            Self::Panic => "PANIC",
            Self::Warning => "WARNING",
            Self::Notice => "NOTICE",
            Self::Log => "LOG",
        }
    }
}

/// The fields of an error or notice that sluice reads or writes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ErrorFields<'a> {
    pub severity: &'a str,
    pub code: &'a str,
    pub message: &'a str,
    pub detail: Option<&'a str>,
    pub hint: Option<&'a str>,
}

impl<'a> ErrorFields<'a> {
    pub fn decode(body: &'a [u8]) -> Result<Self, WireError> {
        let mut r = Reader::new(body);
        let mut f = ErrorFields::default();
        loop {
            let kind = r.u8()?;
            if kind == 0 {
                break;
            }
            let value = r.cstr()?;
            match kind {
                b'V' => f.severity = value,
                b'S' if f.severity.is_empty() => f.severity = value,
                b'C' => f.code = value,
                b'M' => f.message = value,
                b'D' => f.detail = Some(value),
                b'H' => f.hint = Some(value),
                _ => {}
            }
        }
        Ok(f)
    }

    /// Appends an ErrorResponse (or, for notice severities, a
    /// NoticeResponse).
    pub fn encode(&self, buf: &mut BytesMut) {
        let tag = match self.severity {
            "ERROR" | "FATAL" | "PANIC" => backend::ERROR_RESPONSE,
            _ => backend::NOTICE_RESPONSE,
        };
        let mut m = MessageBuilder::new(buf, tag)
            .u8(b'S')
            .cstr(self.severity)
            .u8(b'V')
            .cstr(self.severity)
            .u8(b'C')
            .cstr(self.code)
            .u8(b'M')
            .cstr(self.message);
        if let Some(d) = self.detail {
            m = m.u8(b'D').cstr(d);
        }
        if let Some(h) = self.hint {
            m = m.u8(b'H').cstr(h);
        }
        m.u8(0).finish();
    }

    /// Shorthand for a message without detail or hint.
    pub fn new(severity: Severity, code: &'a str, message: &'a str) -> Self {
        Self {
            severity: severity.as_str(),
            code,
            message,
            detail: None,
            hint: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let mut buf = BytesMut::new();
        let e = ErrorFields {
            detail: Some("d"),
            ..ErrorFields::new(Severity::Fatal, "28P01", "password authentication failed")
        };
        e.encode(&mut buf);
        assert_eq!(buf[0], b'E');
        assert_eq!(ErrorFields::decode(&buf[5..]).unwrap(), e);
    }
}
