//! PgBouncer's `auth_file`: one `"user" "secret"` pair per line, where the
//! secret is a plain password, an md5 hash (`md5…`) or a SCRAM-SHA-256 secret
//! as pg_authid stores it. Double quotes inside a field are doubled.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;

use super::scram::ScramSecret;

/// What the auth_file holds for one user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Secret {
    Plain(String),
    /// The 32 hex digits after `md5`: md5(password || user).
    Md5(String),
    Scram(ScramSecret),
}

/// All users of the auth_file.
#[derive(Debug, Default)]
pub struct Userlist {
    users: HashMap<String, Secret>,
    /// SCRAM secrets derived from plain passwords, made once per user:
    /// deriving costs thousands of HMACs, too much for every login.
    derived_scram: Mutex<HashMap<String, ScramSecret>>,
}

/// A line of the auth_file that cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum UserlistError {
    #[error("cannot read auth_file {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("auth_file {path}:{line}: {reason}")]
    Syntax {
        path: String,
        line: usize,
        reason: String,
    },
}

impl Userlist {
    pub fn load(path: &Path) -> Result<Self, UserlistError> {
        let text = std::fs::read_to_string(path).map_err(|source| UserlistError::Io {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&text).map_err(|(line, reason)| UserlistError::Syntax {
            path: path.display().to_string(),
            line,
            reason,
        })
    }

    /// Parses the text; an error carries the 1-based line and the reason.
    pub fn parse(text: &str) -> Result<Self, (usize, String)> {
        let mut users = HashMap::new();
        for (i, line) in text.lines().enumerate() {
            let trimmed = line.trim();
            if trimmed.is_empty() || trimmed.starts_with(';') || trimmed.starts_with('#') {
                continue;
            }
            let mut rest = trimmed;
            let user = quoted_field(&mut rest).map_err(|e| (i + 1, e))?;
            let secret = quoted_field(&mut rest).map_err(|e| (i + 1, e))?;
            users.insert(user, Secret::classify(secret));
        }
        Ok(Self {
            users,
            derived_scram: Mutex::default(),
        })
    }

    /// The SCRAM secret derived for a user with a plain password, if it
    /// was derived already (`remember_scram`).
    pub fn derived_scram(&self, user: &str) -> Option<ScramSecret> {
        let cache = self.derived_scram.lock().unwrap_or_else(|p| p.into_inner());
        cache.get(user).cloned()
    }

    /// Keeps the SCRAM secret derived for `user`'s plain password (the
    /// derivation, PBKDF2, is costly: once per user and auth_file).
    pub fn remember_scram(&self, user: &str, secret: &ScramSecret) {
        let mut cache = self.derived_scram.lock().unwrap_or_else(|p| p.into_inner());
        cache
            .entry(user.to_owned())
            .or_insert_with(|| secret.clone());
    }

    pub fn get(&self, user: &str) -> Option<&Secret> {
        self.users.get(user)
    }

    pub fn len(&self) -> usize {
        self.users.len()
    }
}

impl Secret {
    /// Reads a secret as the auth_file or pg_authid writes it: `md5…`, a
    /// SCRAM-SHA-256 secret, else a plain password.
    pub fn classify(secret: String) -> Secret {
        if let Some(hex) = secret.strip_prefix("md5")
            && hex.len() == 32
            && hex.bytes().all(|b| b.is_ascii_hexdigit())
        {
            return Secret::Md5(hex.to_ascii_lowercase());
        }
        match ScramSecret::parse(&secret) {
            Some(s) => Secret::Scram(s),
            None => Secret::Plain(secret),
        }
    }

    /// The md5 hash a server login as `user` can answer with (none from a
    /// SCRAM secret: its keys come from the client's proof instead).
    pub fn md5_hash(&self, user: &str) -> Option<String> {
        match self {
            Secret::Md5(hash) => Some(hash.clone()),
            Secret::Plain(password) => Some(super::md5::password_hash(password, user)),
            Secret::Scram(_) => None,
        }
    }

    /// Reads a secret auth_query returned. Unlike the auth_file, something
    /// that looks like a hash but does not parse is no password at all:
    /// taking it as a plain password would let whoever read the hash log
    /// in with it.
    pub fn from_catalog(secret: String) -> Option<Secret> {
        let looks_hashed = secret.starts_with("md5") || secret.starts_with("SCRAM-SHA-256$");
        match Self::classify(secret) {
            Secret::Plain(_) if looks_hashed => None,
            s => Some(s),
        }
    }
}

/// Takes one `"…"` field off the front of `rest`.
fn quoted_field(rest: &mut &str) -> Result<String, String> {
    let s = rest.trim_start();
    let Some(body) = s.strip_prefix('"') else {
        return Err("expected a double-quoted field".into());
    };
    let mut out = String::new();
    let mut chars = body.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        if c == '"' {
            if matches!(chars.peek(), Some((_, '"'))) {
                chars.next();
                out.push('"');
                continue;
            }
            *rest = &body[i + 1..];
            return Ok(out);
        }
        out.push(c);
    }
    Err("unterminated double-quoted field".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_all_kinds() {
        let text = "\"alice\" \"secret\"\n; comment\n\"bob\" \"md5aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"\n\"q\"\"x\" \"SCRAM-SHA-256$4096:c2FsdA==$c3RvcmVkc3RvcmVkc3RvcmVkc3RvcmVkc3RvcmVkMTI=:c2VydmVyc2VydmVyc2VydmVyc2VydmVyc2VydmVyMTI=\"\n";
        let u = Userlist::parse(text).unwrap();
        assert_eq!(u.get("alice"), Some(&Secret::Plain("secret".into())));
        assert!(matches!(u.get("bob"), Some(Secret::Md5(_))));
        assert!(matches!(u.get("q\"x"), Some(Secret::Scram(_))));
    }

    #[test]
    fn a_broken_hash_from_the_catalog_is_no_password() {
        assert_eq!(Secret::from_catalog("md5nothex".into()), None);
        assert_eq!(Secret::from_catalog("SCRAM-SHA-256$broken".into()), None);
        assert_eq!(
            Secret::from_catalog("pw".into()),
            Some(Secret::Plain("pw".into()))
        );
    }

    #[test]
    fn reports_bad_line() {
        assert_eq!(Userlist::parse("\"a\" \"b\"\n\"c\" d").unwrap_err().0, 2);
        assert_eq!(Userlist::parse("\"a\" \"b").unwrap_err().0, 1);
    }
}
