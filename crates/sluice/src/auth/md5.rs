//! PostgreSQL's md5 password scheme: "md5" + md5(md5(password || user) || salt).

use md5::{Digest, Md5};

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s
}

/// md5(password || user) as 32 hex digits: what pg_authid stores after "md5".
pub fn password_hash(password: &str, user: &str) -> String {
    let mut h = Md5::new();
    h.update(password.as_bytes());
    h.update(user.as_bytes());
    hex(&h.finalize())
}

/// The response to an md5 challenge, given the stored hash (32 hex digits).
pub fn salted_response(hash_hex: &str, salt: &[u8; 4]) -> String {
    let mut h = Md5::new();
    h.update(hash_hex.as_bytes());
    h.update(salt);
    format!("md5{}", hex(&h.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_postgres() {
        // Values from Python's hashlib, same as PostgreSQL's md5().
        let hash = password_hash("secret", "alice");
        assert_eq!(hash, "4a0a68b43b6cd5cf266fa02f196e2371");
        assert_eq!(
            salted_response(&hash, &[1, 2, 3, 4]),
            "md598a0412b9c31436fc53776e863350083"
        );
    }
}
