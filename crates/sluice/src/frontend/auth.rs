//! Authenticating a client by `auth_type` against the auth_file or the
//! secret auth_query returned: trust/any, plain (cleartext), md5 and
//! scram-sha-256, with PostgreSQL's errors. A successful SCRAM login against
//! a stored SCRAM secret yields the keys that let sluice log in to
//! PostgreSQL as that user without knowing the password.

use bytes::BytesMut;
use sluice_config::AuthType;
use sluice_wire::{Authentication, PasswordMessage, tags::frontend};
use tokio::io::AsyncWriteExt;

use super::error::ClientError;
use crate::auth::scram::{
    Channel, ScramError, ScramKeys, ScramSecret, ServerExchange, fill_random,
};
use crate::auth::{Secret, Userlist, md5};
use crate::codec::read_message;
use crate::net::Stream;

/// Largest password or SASL message accepted.
const AUTH_MESSAGE_LIMIT: usize = 8192;

fn auth_failed(user: &str) -> ClientError {
    ClientError::new(
        "28P01",
        format!("password authentication failed for user \"{user}\""),
    )
}

/// Where a client's secret was found.
pub enum Known<'a> {
    /// The auth_file (looked up by user name).
    File(&'a Userlist),
    /// What auth_query returned (`None`: no such user, or no password).
    Queried(Option<Secret>),
}

impl Known<'_> {
    fn secret(&self, user: &str) -> Option<&Secret> {
        match self {
            Self::File(userlist) => userlist.get(user),
            Self::Queried(secret) => secret.as_ref(),
        }
    }

    /// A SCRAM secret for a plain password (the auth_file's is derived once
    /// per user; a queried one, which may change, every time).
    async fn scram_for_plain(
        &self,
        user: &str,
        password: &str,
    ) -> Result<ScramSecret, ClientError> {
        if let Self::File(userlist) = self
            && let Some(secret) = userlist.derived_scram(user)
        {
            return Ok(secret);
        }
        let password = password.to_owned();
        let secret = derive(move || ScramSecret::from_password(&password)).await?;
        if let Self::File(userlist) = self {
            userlist.remember_scram(user, &secret);
        }
        Ok(secret)
    }
}

/// `crate::auth::derive`, failing as a login does.
async fn derive<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, ClientError> {
    crate::auth::derive(work)
        .await
        .ok_or_else(|| ClientError::new("XX000", "password check failed"))
}

/// Runs the exchange `auth_type` asks for. Does not send AuthenticationOk.
pub async fn authenticate(
    stream: &mut Stream,
    buf: &mut BytesMut,
    auth_type: AuthType,
    known: &Known<'_>,
    user: &str,
) -> Result<Option<ScramKeys>, ClientError> {
    // An empty password is no password (as PgBouncer and PostgreSQL have
    // it): a user listed with "" for cert or trust logins elsewhere was let
    // in by a password exchange with an empty password (a review).
    let secret = known.secret(user).filter(|s| !empty_password(s, user));
    match auth_type {
        AuthType::Any | AuthType::Trust => Ok(None),
        AuthType::Plain => {
            let password = ask_password(stream, buf, Authentication::CleartextPassword).await?;
            let ok = match secret {
                Some(Secret::Plain(p)) => *p == password,
                Some(Secret::Md5(h)) => md5::password_hash(&password, user) == *h,
                Some(Secret::Scram(s)) => {
                    let s = s.clone();
                    derive(move || scram_matches(&s, &password)).await?
                }
                None => false,
            };
            if ok { Ok(None) } else { Err(auth_failed(user)) }
        }
        AuthType::Md5 => {
            if let Some(Secret::Scram(s)) = secret {
                return scram(stream, buf, s.clone(), user).await.map(Some);
            }
            let mut salt = [0u8; 4];
            fill_random(&mut salt);
            let answer = ask_password(stream, buf, Authentication::Md5Password { salt }).await?;
            let hash = match secret {
                Some(Secret::Plain(p)) => Some(md5::password_hash(p, user)),
                Some(Secret::Md5(h)) => Some(h.clone()),
                _ => None,
            };
            match hash {
                Some(h) if md5::salted_response(&h, &salt) == answer => Ok(None),
                _ => Err(auth_failed(user)),
            }
        }
        AuthType::ScramSha256 => {
            let answerable = matches!(secret, Some(Secret::Scram(_) | Secret::Plain(_)));
            let (secret, learn) = match secret {
                Some(Secret::Scram(s)) => (s.clone(), true),
                Some(Secret::Plain(p)) => (known.scram_for_plain(user, p).await?, false),
                // An md5 hash cannot answer SCRAM; run the exchange against a
                // mock secret so that the failure looks the same.
                Some(Secret::Md5(_)) | None => (ScramSecret::mock(user), false),
            };
            let keys = scram(stream, buf, secret, user).await?;
            if !answerable {
                return Err(auth_failed(user));
            }
            Ok(learn.then_some(keys))
        }
        other => Err(ClientError::new(
            "28000",
            format!("auth_type {} is not supported by sluice", other.as_str()),
        )),
    }
}

/// The auth_file's `""`, or the md5 hash of an empty password.
fn empty_password(secret: &Secret, user: &str) -> bool {
    match secret {
        Secret::Plain(p) => p.is_empty(),
        Secret::Md5(h) => *h == md5::password_hash("", user),
        Secret::Scram(_) => false,
    }
}

fn scram_matches(secret: &ScramSecret, password: &str) -> bool {
    let (mut client, first) = crate::auth::scram::ClientExchange::start(
        crate::auth::scram::ClientCredential::Password(password.to_owned()),
    );
    let Ok((server, server_first)) =
        ServerExchange::start(secret.clone(), first.as_bytes(), Channel::None)
    else {
        return false;
    };
    let Ok(client_final) = client.respond(server_first.as_bytes()) else {
        return false;
    };
    server.finish(client_final.as_bytes()).is_ok()
}

async fn send(stream: &mut Stream, auth: Authentication<'_>) -> Result<(), ClientError> {
    let mut out = BytesMut::with_capacity(64);
    auth.encode(&mut out);
    stream
        .write_all(&out)
        .await
        .map_err(|e| ClientError::protocol(e.to_string()))
}

async fn read_password_message(
    stream: &mut Stream,
    buf: &mut BytesMut,
) -> Result<BytesMut, ClientError> {
    let (tag, body) = read_message(stream, buf, AUTH_MESSAGE_LIMIT).await?;
    if tag != frontend::PASSWORD {
        return Err(ClientError::protocol(format!(
            "expected password response, got message type {}",
            char::from(tag)
        )));
    }
    Ok(body)
}

async fn ask_password(
    stream: &mut Stream,
    buf: &mut BytesMut,
    request: Authentication<'_>,
) -> Result<String, ClientError> {
    send(stream, request).await?;
    let body = read_password_message(stream, buf).await?;
    match PasswordMessage::decode_password(&body)? {
        PasswordMessage::Password(p) => Ok(p.to_owned()),
        _ => Err(ClientError::protocol("malformed password message")),
    }
}

async fn scram(
    stream: &mut Stream,
    buf: &mut BytesMut,
    secret: ScramSecret,
    user: &str,
) -> Result<ScramKeys, ClientError> {
    // Over TLS, SCRAM-SHA-256-PLUS binds the exchange to sluice's
    // certificate (tls-server-end-point): a man in the middle with another
    // certificate cannot relay the proof.
    let end_point = stream.tls_end_point();
    let mechanisms = if end_point.is_some() {
        vec!["SCRAM-SHA-256-PLUS", "SCRAM-SHA-256"]
    } else {
        vec!["SCRAM-SHA-256"]
    };
    send(stream, Authentication::Sasl { mechanisms }).await?;
    let body = read_password_message(stream, buf).await?;
    let PasswordMessage::SaslInitial { mechanism, data } =
        PasswordMessage::decode_sasl_initial(&body)?
    else {
        return Err(ClientError::protocol("malformed SASLInitialResponse"));
    };
    let channel = match (mechanism, end_point.as_deref()) {
        ("SCRAM-SHA-256-PLUS", Some(data)) => Channel::Bound(data),
        ("SCRAM-SHA-256", Some(_)) => Channel::Offered,
        ("SCRAM-SHA-256", None) => Channel::None,
        _ => {
            return Err(ClientError::protocol(
                "client selected an invalid SASL authentication mechanism",
            ));
        }
    };
    let (exchange, server_first) = ServerExchange::start(secret, data, channel)
        .map_err(|e| ClientError::protocol(e.to_string()))?;
    send(
        stream,
        Authentication::SaslContinue {
            data: server_first.as_bytes(),
        },
    )
    .await?;
    let body = read_password_message(stream, buf).await?;
    let (server_final, keys) = exchange.finish(&body).map_err(|e| match e {
        ScramError::ChannelBinding => ClientError::protocol("SCRAM channel binding check failed"),
        _ => auth_failed(user),
    })?;
    send(
        stream,
        Authentication::SaslFinal {
            data: server_final.as_bytes(),
        },
    )
    .await?;
    Ok(keys)
}
