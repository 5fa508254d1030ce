//! SCRAM-SHA-256 (RFC 5802/7677) in both roles: verifying a client against a
//! stored secret or a plain password, and logging in to PostgreSQL with a
//! password or with the ClientKey recovered from a client's proof (so an
//! auth_file holding only pg_authid's SCRAM secrets still works end to end).

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

type HmacSha256 = Hmac<Sha256>;
const KEY_LEN: usize = 32;
/// Iterations used when sluice derives a secret from a plain password.
const DEFAULT_ITERATIONS: u32 = 4096;

/// `scram_iterations`: PBKDF2 rounds of the secrets sluice derives from
/// plain passwords (set at startup and by RELOAD; secrets already derived
/// keep theirs).
static ITERATIONS: std::sync::atomic::AtomicU32 =
    std::sync::atomic::AtomicU32::new(DEFAULT_ITERATIONS);

/// Sets `scram_iterations` (0 means PostgreSQL's 4096).
pub fn set_iterations(n: u32) {
    let n = if n == 0 { DEFAULT_ITERATIONS } else { n };
    ITERATIONS.store(n, std::sync::atomic::Ordering::Relaxed);
}

fn iterations() -> u32 {
    ITERATIONS.load(std::sync::atomic::Ordering::Relaxed)
}

/// A SCRAM-SHA-256 secret as pg_authid stores it:
/// `SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScramSecret {
    pub iterations: u32,
    pub salt: Vec<u8>,
    pub stored_key: [u8; KEY_LEN],
    pub server_key: [u8; KEY_LEN],
}

fn hmac(key: &[u8], parts: &[&[u8]]) -> [u8; KEY_LEN] {
    // HMAC accepts keys of any length; new_from_slice cannot fail here.
    let mut m = <HmacSha256 as Mac>::new_from_slice(key).expect("HMAC takes keys of any length");
    for p in parts {
        m.update(p);
    }
    m.finalize().into_bytes().into()
}

fn sha256(data: &[u8]) -> [u8; KEY_LEN] {
    Sha256::digest(data).into()
}

/// Hi() of RFC 5802: PBKDF2-HMAC-SHA-256 with one output block.
fn salted_password(password: &str, salt: &[u8], iterations: u32) -> [u8; KEY_LEN] {
    let mut u = hmac(password.as_bytes(), &[salt, &1u32.to_be_bytes()]);
    let mut out = u;
    for _ in 1..iterations {
        u = hmac(password.as_bytes(), &[&u]);
        for (o, x) in out.iter_mut().zip(u.iter()) {
            *o ^= x;
        }
    }
    out
}

fn key32(bytes: &[u8]) -> Option<[u8; KEY_LEN]> {
    bytes.try_into().ok()
}

impl ScramSecret {
    pub fn parse(s: &str) -> Option<Self> {
        let rest = s.strip_prefix("SCRAM-SHA-256$")?;
        let (iter_salt, keys) = rest.split_once('$')?;
        let (iterations, salt) = iter_salt.split_once(':')?;
        let (stored, server) = keys.split_once(':')?;
        Some(Self {
            iterations: iterations.parse().ok().filter(|&i| i > 0)?,
            salt: B64.decode(salt).ok()?,
            stored_key: key32(&B64.decode(stored).ok()?)?,
            server_key: key32(&B64.decode(server).ok()?)?,
        })
    }

    /// Derives a secret from a plain password with a fresh random salt.
    pub fn from_password(password: &str) -> Self {
        let mut salt = vec![0u8; 16];
        fill_random(&mut salt);
        let rounds = iterations();
        let salted = salted_password(password, &salt, rounds);
        Self::from_salted(&salted, salt, rounds)
    }

    /// The secret of a user who cannot log in with SCRAM (unknown, or only
    /// an md5 hash): the exchange runs and fails like a wrong password.
    /// As PostgreSQL's mock salt, the salt is stable per user name (a hash
    /// of it under a key random per process), so two tries do not tell an
    /// unknown user from a known one; the keys are random and no PBKDF2
    /// runs, so an unknown name costs no hashing.
    pub fn mock(user: &str) -> Self {
        static KEY: std::sync::OnceLock<[u8; KEY_LEN]> = std::sync::OnceLock::new();
        let key = KEY.get_or_init(|| {
            let mut k = [0u8; KEY_LEN];
            fill_random(&mut k);
            k
        });
        let salt = hmac(key, &[b"mock salt", user.as_bytes()])[..16].to_vec();
        let mut stored_key = [0u8; KEY_LEN];
        let mut server_key = [0u8; KEY_LEN];
        fill_random(&mut stored_key);
        fill_random(&mut server_key);
        Self {
            iterations: iterations(),
            salt,
            stored_key,
            server_key,
        }
    }

    /// Whether `password` is the one this secret was made from (HTTP Basic
    /// on the web console); the comparison takes the same time either way.
    pub fn matches_password(&self, password: &str) -> bool {
        let salted = salted_password(password, &self.salt, self.iterations.min(100_000));
        let stored = sha256(&hmac(&salted, &[b"Client Key"]));
        stored
            .iter()
            .zip(self.stored_key.iter())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
    }

    fn from_salted(salted: &[u8; KEY_LEN], salt: Vec<u8>, iterations: u32) -> Self {
        let client_key = hmac(salted, &[b"Client Key"]);
        Self {
            iterations,
            salt,
            stored_key: sha256(&client_key),
            server_key: hmac(salted, &[b"Server Key"]),
        }
    }
}

/// Random bytes for nonces and salts. getrandom only fails when the OS has
/// no entropy source at all; then sluice cannot authenticate safely.
pub fn fill_random(buf: &mut [u8]) {
    if let Err(e) = getrandom::fill(buf) {
        panic!("no operating-system random source: {e}");
    }
}

fn nonce() -> String {
    let mut raw = [0u8; 18];
    fill_random(&mut raw);
    B64.encode(raw)
}

/// Keys learnt from a client's successful SCRAM login, enough to log in to a
/// PostgreSQL server that holds the same secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScramKeys {
    pub client_key: [u8; KEY_LEN],
    pub server_key: [u8; KEY_LEN],
    pub salt: Vec<u8>,
    pub iterations: u32,
}

/// A failed SCRAM exchange; the client gets 28P01 either way.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ScramError {
    #[error("malformed SCRAM message: {0}")]
    Malformed(&'static str),
    #[error("SCRAM nonce mismatch")]
    Nonce,
    #[error("wrong password")]
    WrongProof,
    #[error("server signature does not match")]
    ServerSignature,
    #[error("channel binding does not match what was negotiated")]
    ChannelBinding,
    #[error("the client supports channel binding but thinks sluice does not (a downgrade?)")]
    Downgrade,
    #[error(
        "the server asks for {0} SCRAM iterations, more than the {MAX_ITERATIONS} sluice computes"
    )]
    TooManyIterations(u32),
}

/// Most PBKDF2 iterations sluice computes for a server's SCRAM challenge:
/// the hash runs on a worker thread, and a server (or anyone on the path to
/// it) must not be able to freeze that worker. PostgreSQL's default is
/// 4,096; a million takes about a second.
pub const MAX_ITERATIONS: u32 = 1_000_000;

fn attribute(msg: &str, name: char) -> Option<&str> {
    msg.split(',').find_map(|part| {
        let mut c = part.chars();
        (c.next() == Some(name) && c.next() == Some('=')).then(|| &part[2..])
    })
}

/// Channel binding on the client's connection, as sluice offered it.
#[derive(Debug, Clone, Copy)]
pub enum Channel<'a> {
    /// No TLS: only SCRAM-SHA-256 was offered.
    None,
    /// TLS: SCRAM-SHA-256-PLUS was offered, and the client chose plain
    /// SCRAM-SHA-256.
    Offered,
    /// The client chose SCRAM-SHA-256-PLUS; the data to bind to.
    Bound(&'a [u8]),
}

/// sluice as the SCRAM server, verifying a connecting client.
pub struct ServerExchange {
    secret: ScramSecret,
    client_first_bare: String,
    server_first: String,
    /// What `c=` of the client-final message must decode to: the GS2
    /// header, plus the channel binding data when bound.
    binding: Vec<u8>,
    nonce: String,
}

impl ServerExchange {
    /// Takes the client-first message; returns the exchange and the
    /// server-first message to send.
    pub fn start(
        secret: ScramSecret,
        client_first: &[u8],
        channel: Channel<'_>,
    ) -> Result<(Self, String), ScramError> {
        let msg = std::str::from_utf8(client_first).map_err(|_| ScramError::Malformed("utf8"))?;
        // gs2-header: cb-flag "," [authzid] ","; an authzid is not taken.
        let (flag, bare) = msg
            .split_once(",,")
            .ok_or(ScramError::Malformed("gs2 header"))?;
        let gs2 = format!("{flag},,");
        let binding = match (flag, channel) {
            ("p=tls-server-end-point", Channel::Bound(data)) => {
                let mut b = gs2.into_bytes();
                b.extend_from_slice(data);
                b
            }
            // PLUS chosen without binding, or binding without PLUS, or
            // another binding type.
            (_, Channel::Bound(_)) => return Err(ScramError::ChannelBinding),
            (f, _) if f.starts_with("p=") => return Err(ScramError::ChannelBinding),
            // "y": the client could bind but thinks sluice cannot; sluice
            // offered PLUS, so something on the way removed it.
            ("y", Channel::Offered) => return Err(ScramError::Downgrade),
            ("n" | "y", _) => gs2.into_bytes(),
            _ => return Err(ScramError::Malformed("gs2 header")),
        };
        let client_nonce = attribute(bare, 'r').ok_or(ScramError::Malformed("nonce"))?;
        let nonce = format!("{client_nonce}{}", self::nonce());
        let server_first = format!(
            "r={nonce},s={},i={}",
            B64.encode(&secret.salt),
            secret.iterations
        );
        Ok((
            Self {
                secret,
                client_first_bare: bare.to_owned(),
                server_first: server_first.clone(),
                binding,
                nonce,
            },
            server_first,
        ))
    }

    /// Checks the client-final message. On success returns the server-final
    /// message and the keys recovered from the proof.
    pub fn finish(self, client_final: &[u8]) -> Result<(String, ScramKeys), ScramError> {
        let msg = std::str::from_utf8(client_final).map_err(|_| ScramError::Malformed("utf8"))?;
        let (without_proof, proof_b64) = msg
            .rsplit_once(",p=")
            .ok_or(ScramError::Malformed("proof"))?;
        let binding = attribute(without_proof, 'c').ok_or(ScramError::Malformed("binding"))?;
        if B64.decode(binding).ok().as_deref() != Some(self.binding.as_slice()) {
            return Err(ScramError::ChannelBinding);
        }
        if attribute(without_proof, 'r') != Some(self.nonce.as_str()) {
            return Err(ScramError::Nonce);
        }
        let proof = B64
            .decode(proof_b64)
            .ok()
            .and_then(|p| key32(&p))
            .ok_or(ScramError::Malformed("proof"))?;
        let auth_message = format!(
            "{},{},{}",
            self.client_first_bare, self.server_first, without_proof
        );
        let signature = hmac(&self.secret.stored_key, &[auth_message.as_bytes()]);
        let mut client_key = [0u8; KEY_LEN];
        for i in 0..KEY_LEN {
            client_key[i] = proof[i] ^ signature[i];
        }
        if sha256(&client_key) != self.secret.stored_key {
            return Err(ScramError::WrongProof);
        }
        let server_sig = hmac(&self.secret.server_key, &[auth_message.as_bytes()]);
        Ok((
            format!("v={}", B64.encode(server_sig)),
            ScramKeys {
                client_key,
                server_key: self.secret.server_key,
                salt: self.secret.salt,
                iterations: self.secret.iterations,
            },
        ))
    }
}

/// What sluice proves its identity with when logging in to PostgreSQL.
#[derive(Debug, Clone)]
pub enum ClientCredential {
    Password(String),
    Keys(ScramKeys),
}

/// sluice as the SCRAM client, logging in to PostgreSQL.
pub struct ClientExchange {
    credential: ClientCredential,
    client_first_bare: String,
    nonce: String,
    server_key: Option<[u8; KEY_LEN]>,
    auth_message: String,
}

impl ClientExchange {
    /// Returns the exchange and the client-first message.
    pub fn start(credential: ClientCredential) -> (Self, String) {
        let nonce = nonce();
        let bare = format!("n=,r={nonce}");
        let first = format!("n,,{bare}");
        (
            Self {
                credential,
                client_first_bare: bare,
                nonce,
                server_key: None,
                auth_message: String::new(),
            },
            first,
        )
    }

    /// Takes the server-first message, returns the client-final message.
    pub fn respond(&mut self, server_first: &[u8]) -> Result<String, ScramError> {
        let msg = std::str::from_utf8(server_first).map_err(|_| ScramError::Malformed("utf8"))?;
        let nonce = attribute(msg, 'r').ok_or(ScramError::Malformed("nonce"))?;
        if !nonce.starts_with(&self.nonce) {
            return Err(ScramError::Nonce);
        }
        let salt = attribute(msg, 's')
            .and_then(|s| B64.decode(s).ok())
            .ok_or(ScramError::Malformed("salt"))?;
        let iterations: u32 = attribute(msg, 'i')
            .and_then(|i| i.parse().ok())
            .filter(|&i| i > 0)
            .ok_or(ScramError::Malformed("iterations"))?;
        if iterations > MAX_ITERATIONS {
            return Err(ScramError::TooManyIterations(iterations));
        }
        let (client_key, server_key) = match &self.credential {
            ClientCredential::Password(p) => {
                let salted = salted_password(p, &salt, iterations);
                (
                    hmac(&salted, &[b"Client Key"]),
                    hmac(&salted, &[b"Server Key"]),
                )
            }
            ClientCredential::Keys(k) => {
                if k.salt != salt || k.iterations != iterations {
                    return Err(ScramError::WrongProof);
                }
                (k.client_key, k.server_key)
            }
        };
        let without_proof = format!("c=biws,r={nonce}");
        self.auth_message = format!("{},{},{}", self.client_first_bare, msg, without_proof);
        let signature = hmac(&sha256(&client_key), &[self.auth_message.as_bytes()]);
        let mut proof = [0u8; KEY_LEN];
        for i in 0..KEY_LEN {
            proof[i] = client_key[i] ^ signature[i];
        }
        self.server_key = Some(server_key);
        Ok(format!("{without_proof},p={}", B64.encode(proof)))
    }

    /// Checks the server-final message.
    pub fn verify(&self, server_final: &[u8]) -> Result<(), ScramError> {
        let msg = std::str::from_utf8(server_final).map_err(|_| ScramError::Malformed("utf8"))?;
        let sig = attribute(msg, 'v')
            .and_then(|v| B64.decode(v).ok())
            .ok_or(ScramError::Malformed("verifier"))?;
        let key = self.server_key.ok_or(ScramError::Malformed("order"))?;
        if sig != hmac(&key, &[self.auth_message.as_bytes()]) {
            return Err(ScramError::ServerSignature);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(secret: ScramSecret, credential: ClientCredential) -> Result<ScramKeys, ScramError> {
        let (mut client, first) = ClientExchange::start(credential);
        let (server, server_first) =
            ServerExchange::start(secret, first.as_bytes(), Channel::None)?;
        let client_final = client.respond(server_first.as_bytes())?;
        let (server_final, keys) = server.finish(client_final.as_bytes())?;
        client.verify(server_final.as_bytes())?;
        Ok(keys)
    }

    #[test]
    fn password_round_trip_and_key_reuse() {
        let secret = ScramSecret::from_password("pencil");
        let keys = run(secret.clone(), ClientCredential::Password("pencil".into())).unwrap();
        // The recovered keys log in again without the password.
        run(secret, ClientCredential::Keys(keys)).unwrap();
    }

    #[test]
    fn wrong_password_fails() {
        let secret = ScramSecret::from_password("pencil");
        assert_eq!(
            run(secret, ClientCredential::Password("crayon".into())).unwrap_err(),
            ScramError::WrongProof
        );
    }

    #[test]
    fn parses_postgres_secret_format() {
        let s = ScramSecret::from_password("x");
        let text = format!(
            "SCRAM-SHA-256${}:{}${}:{}",
            s.iterations,
            B64.encode(&s.salt),
            B64.encode(s.stored_key),
            B64.encode(s.server_key)
        );
        assert_eq!(ScramSecret::parse(&text), Some(s));
        assert_eq!(ScramSecret::parse("SCRAM-SHA-256$x"), None);
    }

    #[test]
    fn channel_binding_is_checked() {
        let secret = ScramSecret::from_password("pencil");
        let first = "n=,r=abc";
        // A client that could bind but saw no PLUS: sluice offered it.
        assert_eq!(
            ServerExchange::start(
                secret.clone(),
                format!("y,,{first}").as_bytes(),
                Channel::Offered
            )
            .err(),
            Some(ScramError::Downgrade)
        );
        assert!(
            ServerExchange::start(
                secret.clone(),
                format!("y,,{first}").as_bytes(),
                Channel::None
            )
            .is_ok()
        );
        // PLUS chosen but no binding in the header, and the reverse.
        assert_eq!(
            ServerExchange::start(
                secret.clone(),
                format!("n,,{first}").as_bytes(),
                Channel::Bound(b"h")
            )
            .err(),
            Some(ScramError::ChannelBinding)
        );
        assert_eq!(
            ServerExchange::start(
                secret.clone(),
                format!("p=tls-server-end-point,,{first}").as_bytes(),
                Channel::None
            )
            .err(),
            Some(ScramError::ChannelBinding)
        );
        // Bound: c= must carry the header and the certificate's hash.
        let (exchange, server_first) = ServerExchange::start(
            secret.clone(),
            format!("p=tls-server-end-point,,{first}").as_bytes(),
            Channel::Bound(b"certhash"),
        )
        .unwrap();
        let nonce = attribute(&server_first, 'r').unwrap().to_owned();
        let plain_c = B64.encode("p=tls-server-end-point,,");
        let wrong = format!("c={plain_c},r={nonce},p={}", B64.encode([0u8; 32]));
        assert_eq!(
            exchange.finish(wrong.as_bytes()).err(),
            Some(ScramError::ChannelBinding)
        );
    }
}
