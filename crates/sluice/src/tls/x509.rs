//! The two facts sluice reads from a certificate itself (rustls checks the
//! certificate; it does not hand out its fields): the subject's Common
//! Name, which `cert` authentication takes as the user name, and the hash
//! of the signature algorithm, which SCRAM's `tls-server-end-point` channel
//! binding hashes the certificate with (RFC 5929 §4.1). A bounded DER
//! walk over the few structures involved; anything unexpected is `None`.

/// One DER element: its tag, its contents, and what follows it.
fn element(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |acc, &b| (acc << 8) | usize::from(b));
        (len, &rest[n..])
    };
    if rest.len() < len {
        return None;
    }
    Some((tag, &rest[..len], &rest[len..]))
}

const SEQUENCE: u8 = 0x30;
const SET: u8 = 0x31;
const OID: u8 = 0x06;
/// 2.5.4.3, commonName.
const OID_COMMON_NAME: &[u8] = &[0x55, 0x04, 0x03];

/// (tbsCertificate, signatureAlgorithm) of a Certificate.
fn parts(der: &[u8]) -> Option<(&[u8], &[u8])> {
    let (tag, cert, _) = element(der)?;
    if tag != SEQUENCE {
        return None;
    }
    let (tag, tbs, rest) = element(cert)?;
    if tag != SEQUENCE {
        return None;
    }
    let (tag, alg, _) = element(rest)?;
    (tag == SEQUENCE).then_some((tbs, alg))
}

/// The subject's Common Name; `None` when there is none, or several (which
/// one would be the user is ambiguous).
pub fn subject_common_name(der: &[u8]) -> Option<String> {
    let (tbs, _) = parts(der)?;
    let mut rest = tbs;
    // [0] version (optional), serialNumber, signature, issuer, validity,
    // subject.
    if rest.first() == Some(&0xa0) {
        rest = element(rest)?.2;
    }
    for _ in 0..4 {
        rest = element(rest)?.2;
    }
    let (tag, subject, _) = element(rest)?;
    if tag != SEQUENCE {
        return None;
    }
    let mut names = Vec::new();
    let mut rdns = subject;
    while !rdns.is_empty() {
        let (tag, set, next) = element(rdns)?;
        if tag != SET {
            return None;
        }
        let mut atvs = set;
        while !atvs.is_empty() {
            let (tag, atv, after) = element(atvs)?;
            if tag != SEQUENCE {
                return None;
            }
            let (tag, oid, value) = element(atv)?;
            if tag == OID && oid == OID_COMMON_NAME {
                let (vtag, text, _) = element(value)?;
                // UTF8String, PrintableString, IA5String, T61String.
                if matches!(vtag, 0x0c | 0x13 | 0x16 | 0x14) {
                    names.push(String::from_utf8(text.to_vec()).ok()?);
                } else {
                    return None;
                }
            }
            atvs = after;
        }
        rdns = next;
    }
    match names.as_slice() {
        [one] => Some(one.clone()),
        _ => None,
    }
}

/// The hash `tls-server-end-point` uses for this certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndPointHash {
    Sha256,
    Sha384,
    Sha512,
}

/// From the certificate's signatureAlgorithm: its hash, with MD5 and SHA-1
/// replaced by SHA-256 (RFC 5929 §4.1); `None` for algorithms without one
/// (Ed25519) or with parameters (RSASSA-PSS), as PostgreSQL also refuses.
pub fn end_point_hash(der: &[u8]) -> Option<EndPointHash> {
    let (_, alg) = parts(der)?;
    let (tag, oid, _) = element(alg)?;
    if tag != OID {
        return None;
    }
    const RSA: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01];
    const ECDSA: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04];
    if let Some(last) = oid.strip_prefix(RSA) {
        return match last {
            // md5, sha1, sha256 WithRSAEncryption
            [4] | [5] | [11] => Some(EndPointHash::Sha256),
            [12] => Some(EndPointHash::Sha384),
            [13] => Some(EndPointHash::Sha512),
            _ => None,
        };
    }
    if let Some(last) = oid.strip_prefix(ECDSA) {
        return match last {
            // ecdsa-with-SHA1, -SHA256
            [1] | [3, 2] => Some(EndPointHash::Sha256),
            [3, 3] => Some(EndPointHash::Sha384),
            [3, 4] => Some(EndPointHash::Sha512),
            _ => None,
        };
    }
    None
}

/// The channel binding data of `tls-server-end-point`: the certificate's
/// hash.
pub fn end_point_binding(der: &[u8]) -> Option<Vec<u8>> {
    use sha2::Digest;
    Some(match end_point_hash(der)? {
        EndPointHash::Sha256 => sha2::Sha256::digest(der).to_vec(),
        EndPointHash::Sha384 => sha2::Sha384::digest(der).to_vec(),
        EndPointHash::Sha512 => sha2::Sha512::digest(der).to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal certificate: version, serial, signature alg, issuer,
    /// validity, subject with the given RDNs, then the outer algorithm.
    fn cert(subject_rdns: &[u8], outer_alg_oid: &[u8]) -> Vec<u8> {
        fn tlv(tag: u8, body: &[u8]) -> Vec<u8> {
            let mut v = vec![tag];
            if body.len() < 0x80 {
                v.push(body.len() as u8);
            } else {
                v.push(0x82);
                v.extend_from_slice(&(body.len() as u16).to_be_bytes());
            }
            v.extend_from_slice(body);
            v
        }
        let alg = tlv(SEQUENCE, &tlv(OID, outer_alg_oid));
        let mut tbs = Vec::new();
        tbs.extend(tlv(0xa0, &tlv(0x02, &[2])));
        tbs.extend(tlv(0x02, &[1]));
        tbs.extend(alg.clone());
        tbs.extend(tlv(SEQUENCE, &[]));
        tbs.extend(tlv(SEQUENCE, &[]));
        tbs.extend(tlv(SEQUENCE, subject_rdns));
        let mut body = tlv(SEQUENCE, &tbs);
        body.extend(alg);
        body.extend(tlv(0x03, &[0, 1, 2]));
        tlv(SEQUENCE, &body)
    }

    fn cn(name: &str, string_tag: u8) -> Vec<u8> {
        let mut atv = vec![OID, 3, 0x55, 0x04, 0x03, string_tag, name.len() as u8];
        atv.extend_from_slice(name.as_bytes());
        let mut seq = vec![SEQUENCE, atv.len() as u8];
        seq.extend(atv);
        let mut set = vec![SET, seq.len() as u8];
        set.extend(seq);
        set
    }

    const ECDSA_SHA384: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x03];
    const ED25519: &[u8] = &[0x2b, 0x65, 0x70];

    #[test]
    fn reads_the_common_name_and_the_hash() {
        let der = cert(&cn("app", 0x0c), ECDSA_SHA384);
        assert_eq!(subject_common_name(&der).as_deref(), Some("app"));
        assert_eq!(end_point_hash(&der), Some(EndPointHash::Sha384));
        assert_eq!(end_point_binding(&der).map(|b| b.len()), Some(48));
        let printable = cert(&cn("bob", 0x13), ED25519);
        assert_eq!(subject_common_name(&printable).as_deref(), Some("bob"));
        assert_eq!(end_point_hash(&printable), None);
    }

    #[test]
    fn two_common_names_or_garbage_give_nothing() {
        let mut two = cn("a", 0x0c);
        two.extend(cn("b", 0x0c));
        assert_eq!(subject_common_name(&cert(&two, ECDSA_SHA384)), None);
        assert_eq!(subject_common_name(&cert(&[], ECDSA_SHA384)), None);
        let der = cert(&cn("app", 0x0c), ECDSA_SHA384);
        for cut in 0..der.len() {
            assert_eq!(subject_common_name(&der[..cut]), None, "{cut}");
        }
        assert_eq!(
            subject_common_name(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]),
            None
        );
    }
}
