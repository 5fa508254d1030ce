//! PgBouncer's `auth_hba_file`: pg_hba.conf's format, as much of it as
//! PgBouncer reads. Line types local, host, hostssl, hostnossl; databases
//! all, sameuser, replication, names, `@file`; users all, names, `@file`;
//! addresses all, CIDR or address + netmask (IPv4 and IPv6); methods trust,
//! reject, md5, scram-sha-256, password, cert, peer, with `map=` for cert
//! and peer (names from `auth_ident_file`). What PgBouncer does not read
//! (samehost, samenet, host names, +group, samerole, regular expressions)
//! is refused at load with the line, not silently never matched. The first
//! line that matches decides, as in PostgreSQL; no match is a refusal.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::Path;

/// A pg_hba.conf method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Trust,
    Reject,
    Md5,
    ScramSha256,
    /// Clear-text password ("password").
    Password,
    /// TLS client certificate: its CN is the user (or maps to it).
    Cert,
    /// Unix-socket peer's OS user is the user (or maps to it).
    Peer,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ConnType {
    Local,
    Host,
    HostSsl,
    HostNoSsl,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Name {
    All,
    SameUser,
    Replication,
    Is(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Addr {
    Any,
    Net { net: IpAddr, prefix: u8 },
}

/// One line of the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    conn: ConnType,
    databases: Vec<Name>,
    users: Vec<Name>,
    addr: Option<Addr>,
    pub method: Method,
    /// `map=` of cert and peer lines.
    pub map: Option<String>,
    /// 1-based line number, for logs.
    pub line: usize,
}

/// A connection to decide about.
#[derive(Debug, Clone, Copy)]
pub struct Conn<'a> {
    /// Came over the Unix socket.
    pub unix: bool,
    /// Runs over TLS.
    pub tls: bool,
    /// The peer's address (TCP only).
    pub addr: Option<IpAddr>,
    pub database: &'a str,
    pub user: &'a str,
}

/// The parsed file.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Hba {
    rules: Vec<Rule>,
}

/// Why a file cannot be used: the line and the reason.
#[derive(Debug, thiserror::Error)]
#[error("{path}{}: {reason}", line_suffix(*line))]
pub struct HbaError {
    pub path: String,
    pub line: usize,
    pub reason: String,
}

/// `:N` for a line, nothing for the file as a whole (line 0).
fn line_suffix(line: usize) -> String {
    if line == 0 {
        String::new()
    } else {
        format!(":{line}")
    }
}

impl HbaError {
    fn at(path: &Path, (line, reason): (usize, String)) -> Self {
        Self {
            path: path.display().to_string(),
            line,
            reason,
        }
    }
}

/// A rules file's text; an error names it (line 0: the file as a whole).
fn read_file(path: &Path) -> Result<String, HbaError> {
    std::fs::read_to_string(path).map_err(|e| HbaError::at(path, (0, e.to_string())))
}

impl Hba {
    /// Reads `path`; `@file` names are taken from its directory.
    pub fn load(path: &Path) -> Result<Self, HbaError> {
        let text = read_file(path)?;
        let dir = path.parent().unwrap_or(Path::new("."));
        Self::parse(&text, &|name| {
            std::fs::read_to_string(dir.join(name)).map_err(|e| format!("@{name}: {e}"))
        })
        .map_err(|at| HbaError::at(path, at))
    }

    /// Parses the text; `include` reads an `@file`.
    pub fn parse(
        text: &str,
        include: &dyn Fn(&str) -> Result<String, String>,
    ) -> Result<Self, (usize, String)> {
        let mut rules = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line = i + 1;
            let fields = tokens(raw).map_err(|e| (line, e))?;
            if fields.is_empty() {
                continue;
            }
            rules.push(rule(line, &fields, include).map_err(|e| (line, e))?);
        }
        Ok(Self { rules })
    }

    /// The first rule that matches, if any.
    pub fn decide(&self, conn: &Conn<'_>) -> Option<&Rule> {
        self.rules.iter().find(|r| r.matches(conn))
    }

    /// Whether some line uses `method` (cert lines need client certificates).
    pub fn uses(&self, method: Method) -> bool {
        self.rules.iter().any(|r| r.method == method)
    }
}

impl Rule {
    fn matches(&self, c: &Conn<'_>) -> bool {
        let conn_ok = match self.conn {
            ConnType::Local => c.unix,
            ConnType::Host => !c.unix,
            ConnType::HostSsl => !c.unix && c.tls,
            ConnType::HostNoSsl => !c.unix && !c.tls,
        };
        let addr_ok = match (self.addr, c.addr) {
            (None | Some(Addr::Any), _) => true,
            (Some(Addr::Net { net, prefix }), Some(peer)) => in_net(peer, net, prefix),
            (Some(Addr::Net { .. }), None) => false,
        };
        let db_ok = self.databases.iter().any(|d| match d {
            Name::All => true,
            Name::SameUser => c.database == c.user,
            // sluice refuses replication connections before this.
            Name::Replication => false,
            Name::Is(n) => n == c.database,
        });
        let user_ok = self.users.iter().any(|u| match u {
            Name::All => true,
            Name::Is(n) => n == c.user,
            Name::SameUser | Name::Replication => false,
        });
        conn_ok && addr_ok && db_ok && user_ok
    }
}

/// Splits a line into fields, honouring double quotes and `#` comments. A
/// quoted word keeps its quotes' meaning: `"all"` is a name, not a keyword;
/// a returned field starts with `"` when it was quoted.
fn tokens(line: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut in_quotes = false;
    for ch in line.chars() {
        match ch {
            '"' => {
                in_quotes = !in_quotes;
                cur.push('"');
            }
            '#' if !in_quotes => break,
            c if c.is_whitespace() && !in_quotes => {
                if !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
            }
            c => cur.push(c),
        }
    }
    if in_quotes {
        return Err("unterminated quoted string".into());
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    // "a, b": a field ending in a comma continues with the next one.
    let mut joined: Vec<String> = Vec::new();
    for f in out {
        match joined.last_mut() {
            Some(last) if last.ends_with(',') => last.push_str(&f),
            _ => joined.push(f),
        }
    }
    Ok(joined)
}

/// Splits a comma-separated field into items, each (text, was quoted).
fn items(field: &str) -> Vec<(String, bool)> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut in_quotes = false;
    for ch in field.chars() {
        match ch {
            '"' => {
                in_quotes = !in_quotes;
                quoted = true;
            }
            ',' if !in_quotes => out.push((std::mem::take(&mut cur), std::mem::take(&mut quoted))),
            c => cur.push(c),
        }
    }
    out.push((cur, quoted));
    out
}

fn names(
    field: &str,
    databases: bool,
    include: &dyn Fn(&str) -> Result<String, String>,
) -> Result<Vec<Name>, String> {
    let mut out = Vec::new();
    for (item, quoted) in items(field) {
        if item.is_empty() {
            return Err(format!("empty name in {field:?}"));
        }
        if quoted {
            out.push(Name::Is(item));
            continue;
        }
        if let Some(file) = item.strip_prefix('@') {
            for word in include(file)?
                .lines()
                .map(|l| l.split('#').next().unwrap_or(""))
                .flat_map(|l| l.split([',', ' ', '\t']))
                .filter(|w| !w.is_empty())
            {
                out.push(Name::Is(word.trim_matches('"').to_owned()));
            }
            continue;
        }
        out.push(match item.as_str() {
            "all" => Name::All,
            "sameuser" if databases => Name::SameUser,
            "replication" if databases => Name::Replication,
            "samerole" | "samegroup" if databases => {
                return Err(format!("{item} is not supported (PgBouncer has no roles)"));
            }
            _ if item.starts_with('+') => {
                return Err(format!(
                    "group {item} is not supported (PgBouncer has no roles)"
                ));
            }
            _ if item.starts_with('/') => {
                return Err(format!("regular expression {item} is not supported"));
            }
            _ => Name::Is(item),
        });
    }
    Ok(out)
}

fn method(word: &str) -> Result<Method, String> {
    Ok(match word {
        "trust" => Method::Trust,
        "reject" => Method::Reject,
        "md5" => Method::Md5,
        "scram-sha-256" => Method::ScramSha256,
        "password" => Method::Password,
        "cert" => Method::Cert,
        "peer" => Method::Peer,
        other => {
            return Err(format!(
                "method {other} is not supported (trust, reject, md5, scram-sha-256, password, \
                 cert, peer)"
            ));
        }
    })
}

fn address(fields: &[String]) -> Result<(Addr, usize), String> {
    let first = fields.first().ok_or("missing address")?;
    if first == "all" {
        return Ok((Addr::Any, 1));
    }
    if let Some((ip, bits)) = first.split_once('/') {
        let net: IpAddr = ip.parse().map_err(|_| format!("invalid address {first}"))?;
        let max = if net.is_ipv4() { 32 } else { 128 };
        let prefix: u8 = bits
            .parse()
            .ok()
            .filter(|&b| b <= max)
            .ok_or_else(|| format!("invalid prefix length in {first}"))?;
        return Ok((Addr::Net { net, prefix }, 1));
    }
    let net: IpAddr = first
        .parse()
        .map_err(|_| format!("address {first} is not supported (an IP address or CIDR, or all)"))?;
    let mask: IpAddr = fields
        .get(1)
        .ok_or("an address without /prefix needs a netmask")?
        .parse()
        .map_err(|_| format!("invalid netmask after {first}"))?;
    let prefix = mask_prefix(mask, net.is_ipv4()).ok_or("invalid netmask")?;
    Ok((Addr::Net { net, prefix }, 2))
}

/// The prefix length of a contiguous netmask.
fn mask_prefix(mask: IpAddr, v4: bool) -> Option<u8> {
    let bits: u128 = match (mask, v4) {
        (IpAddr::V4(m), true) => u128::from(u32::from(m)) << 96,
        (IpAddr::V6(m), false) => u128::from(m),
        _ => return None,
    };
    let ones = bits.leading_ones();
    (bits.checked_shl(ones).unwrap_or(0) == 0).then_some(ones as u8)
}

fn in_net(peer: IpAddr, net: IpAddr, prefix: u8) -> bool {
    let peer = match peer {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(peer, IpAddr::V4),
        v4 => v4,
    };
    match (peer, net) {
        (IpAddr::V4(p), IpAddr::V4(n)) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            u32::from(p) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(p), IpAddr::V6(n)) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            u128::from(p) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}

fn rule(
    line: usize,
    fields: &[String],
    include: &dyn Fn(&str) -> Result<String, String>,
) -> Result<Rule, String> {
    let conn = match fields[0].as_str() {
        "local" => ConnType::Local,
        "host" => ConnType::Host,
        "hostssl" => ConnType::HostSsl,
        "hostnossl" => ConnType::HostNoSsl,
        other => {
            return Err(format!(
                "connection type {other} is not supported (local, host, hostssl, hostnossl)"
            ));
        }
    };
    let databases = names(fields.get(1).ok_or("missing database")?, true, include)?;
    let users = names(fields.get(2).ok_or("missing user")?, false, include)?;
    let (addr, rest) = if conn == ConnType::Local {
        (None, &fields[3..])
    } else {
        let (a, used) = address(&fields[3..])?;
        (Some(a), &fields[3 + used..])
    };
    let method = method(rest.first().ok_or("missing method")?)?;
    let mut map = None;
    for option in &rest[1..] {
        match option.split_once('=') {
            Some(("map", m)) if matches!(method, Method::Cert | Method::Peer) => {
                map = Some(m.to_owned());
            }
            _ => return Err(format!("option {option} is not supported here")),
        }
    }
    if method == Method::Peer && conn != ConnType::Local {
        return Err("peer works only on local lines".into());
    }
    if method == Method::Cert && conn == ConnType::Local {
        return Err("cert needs a TLS connection (hostssl)".into());
    }
    Ok(Rule {
        conn,
        databases,
        users,
        addr,
        method,
        map,
        line,
    })
}

/// `auth_ident_file`: `map system-name database-user` lines.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct IdentMap {
    pairs: HashMap<String, Vec<(String, String)>>,
}

impl IdentMap {
    pub fn load(path: &Path) -> Result<Self, HbaError> {
        Self::parse(&read_file(path)?).map_err(|at| HbaError::at(path, at))
    }

    pub fn parse(text: &str) -> Result<Self, (usize, String)> {
        let mut pairs: HashMap<String, Vec<(String, String)>> = HashMap::new();
        for (i, raw) in text.lines().enumerate() {
            let fields = tokens(raw).map_err(|e| (i + 1, e))?;
            if fields.is_empty() {
                continue;
            }
            let [map, system, user] = fields.as_slice() else {
                return Err((i + 1, "expected: map system-name database-user".into()));
            };
            if system.starts_with('/') {
                return Err((i + 1, "regular expressions are not supported".into()));
            }
            pairs.entry(map.clone()).or_default().push((
                system.trim_matches('"').to_owned(),
                user.trim_matches('"').to_owned(),
            ));
        }
        Ok(Self { pairs })
    }

    /// Whether `system` (a certificate CN or an OS user) may log in as
    /// `user`: through `map` when given, else only as itself.
    pub fn allows(&self, map: Option<&str>, system: &str, user: &str) -> bool {
        match map {
            None => system == user,
            Some(m) => self
                .pairs
                .get(m)
                .is_some_and(|p| p.iter().any(|(s, u)| s == system && u == user)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_files(name: &str) -> Result<String, String> {
        match name {
            "admins.txt" => Ok("alice\nbob, carol # comment\n".into()),
            _ => Err(format!("no file {name}")),
        }
    }

    fn conn<'a>(unix: bool, tls: bool, addr: &str, db: &'a str, user: &'a str) -> Conn<'a> {
        Conn {
            unix,
            tls,
            addr: addr.parse().ok(),
            database: db,
            user,
        }
    }

    const FILE: &str = r#"
# comment
local   all       postgres                peer
local   sameuser  all                     md5
hostssl all       @admins.txt  10.0.0.0/8 cert map=certs
hostnossl app,"all" all  192.168.1.0 255.255.255.0  scram-sha-256
host    all       bad          all        reject
host    all       all          ::1/128    trust
host    all       all          0.0.0.0/0  md5
"#;

    #[test]
    fn first_matching_line_decides() {
        use Method::*;
        let hba = Hba::parse(FILE, &no_files).unwrap();
        // (unix, tls, address, database, user) -> (method, line)
        type Case<'a> = (
            (bool, bool, &'a str, &'a str, &'a str),
            Option<(Method, usize)>,
        );
        let cases: &[Case<'_>] = &[
            ((true, false, "", "x", "postgres"), Some((Peer, 3))),
            ((true, false, "", "bob", "bob"), Some((Md5, 4))),
            ((true, false, "", "x", "bob"), None),
            ((false, true, "10.1.2.3", "x", "carol"), Some((Cert, 5))),
            // Not over TLS: the hostssl line does not match.
            ((false, false, "10.1.2.3", "x", "carol"), Some((Md5, 9))),
            // "all" quoted is a database named all.
            (
                (false, false, "192.168.1.7", "all", "u"),
                Some((ScramSha256, 6)),
            ),
            ((false, false, "192.168.1.7", "other", "u"), Some((Md5, 9))),
            ((false, true, "192.168.1.7", "app", "u"), Some((Md5, 9))),
            ((false, false, "1.2.3.4", "x", "bad"), Some((Reject, 7))),
            ((false, false, "::1", "x", "u"), Some((Trust, 8))),
            // An IPv4 peer seen as IPv4-mapped IPv6 still matches 0.0.0.0/0.
            ((false, false, "::ffff:1.2.3.4", "x", "u"), Some((Md5, 9))),
        ];
        for &((unix, tls, addr, db, user), want) in cases {
            let got = hba
                .decide(&conn(unix, tls, addr, db, user))
                .map(|r| (r.method, r.line));
            assert_eq!(got, want, "{addr} {db} {user} tls={tls}");
        }
        let cert = hba.decide(&conn(false, true, "10.1.2.3", "x", "carol"));
        assert_eq!(cert.and_then(|r| r.map.as_deref()), Some("certs"));
        assert!(hba.uses(Cert));
    }

    #[test]
    fn unsupported_lines_are_refused_with_their_number() {
        for (text, why) in [
            ("host all all samehost md5", "samehost"),
            ("host all +admins all md5", "group"),
            ("host samerole all all md5", "samerole"),
            ("host all all all ident", "ident"),
            ("hostgssenc all all all md5", "hostgssenc"),
            ("host all all all peer", "peer"),
            ("local all all cert", "cert"),
            ("host all all 10.0.0.0/33 md5", "prefix"),
            ("host all all 10.0.0.0 255.0.255.0 md5", "netmask"),
            ("host all all all md5 map=x", "option"),
            ("host \"all all all md5", "unterminated"),
            ("host all @nofile all md5", "nofile"),
        ] {
            let err = Hba::parse(&format!("\n{text}\n"), &no_files).unwrap_err();
            assert_eq!(err.0, 2, "{text}");
            assert!(err.1.contains(why), "{text}: {}", err.1);
        }
    }

    #[test]
    fn ident_maps() {
        let map = IdentMap::parse("certs  alice.example  alice\ncerts bob bobby\n").unwrap();
        assert!(map.allows(Some("certs"), "alice.example", "alice"));
        assert!(!map.allows(Some("certs"), "alice.example", "bobby"));
        assert!(!map.allows(Some("other"), "bob", "bobby"));
        assert!(map.allows(None, "carol", "carol"));
        assert!(!map.allows(None, "carol", "alice"));
        assert!(IdentMap::parse("m /^(.*)$ \\1").is_err());
    }
}
