//! Authentication requests ('R'): what a server asks of sluice when it logs
//! in, and what sluice asks of a client.

use bytes::BytesMut;

use crate::{MessageBuilder, Reader, WireError, tags::backend};

/// One authentication message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Authentication<'a> {
    Ok,
    CleartextPassword,
    Md5Password {
        salt: [u8; 4],
    },
    /// SASL with the mechanisms offered.
    Sasl {
        mechanisms: Vec<&'a str>,
    },
    SaslContinue {
        data: &'a [u8],
    },
    SaslFinal {
        data: &'a [u8],
    },
    /// Kerberos, GSS, SSPI: methods sluice does not speak.
    Unsupported {
        code: i32,
    },
}

impl<'a> Authentication<'a> {
    pub fn decode(body: &'a [u8]) -> Result<Self, WireError> {
        let mut r = Reader::new(body);
        let code = r.i32()?;
        Ok(match code {
            0 => Self::Ok,
            3 => Self::CleartextPassword,
            5 => {
                let s = r.bytes(4)?;
                Self::Md5Password {
                    salt: [s[0], s[1], s[2], s[3]],
                }
            }
            10 => {
                let mut mechanisms = Vec::new();
                loop {
                    let m = r.cstr()?;
                    if m.is_empty() {
                        break;
                    }
                    mechanisms.push(m);
                }
                Self::Sasl { mechanisms }
            }
            11 => Self::SaslContinue { data: r.rest() },
            12 => Self::SaslFinal { data: r.rest() },
            other => Self::Unsupported { code: other },
        })
    }

    pub fn encode(&self, buf: &mut BytesMut) {
        let m = MessageBuilder::new(buf, backend::AUTHENTICATION);
        match self {
            Self::Ok => m.i32(0),
            Self::CleartextPassword => m.i32(3),
            Self::Md5Password { salt } => m.i32(5).bytes(salt),
            Self::Sasl { mechanisms } => {
                let mut m = m.i32(10);
                for mech in mechanisms {
                    m = m.cstr(mech);
                }
                m.u8(0)
            }
            Self::SaslContinue { data } => m.i32(11).bytes(data),
            Self::SaslFinal { data } => m.i32(12).bytes(data),
            Self::Unsupported { code } => m.i32(*code),
        }
        .finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let cases = [
            Authentication::Ok,
            Authentication::CleartextPassword,
            Authentication::Md5Password { salt: [1, 2, 3, 4] },
            Authentication::Sasl {
                mechanisms: vec!["SCRAM-SHA-256"],
            },
            Authentication::SaslContinue { data: b"r=abc" },
            Authentication::SaslFinal { data: b"v=xyz" },
        ];
        for case in cases {
            let mut buf = BytesMut::new();
            case.encode(&mut buf);
            assert_eq!(Authentication::decode(&buf[5..]).unwrap(), case);
        }
    }
}
