//! One `[databases]` entry: the name clients connect to and where and how
//! sluice connects to the server for it, read from its connection string.

use std::time::Duration;

use crate::choices::{LoadBalanceHosts, PoolMode};
use crate::codecs::{Choice, Codec, parse_count, parse_flag, parse_port};
use crate::connstring::ConnParam;
use crate::entry_source::{EntrySource, ParamProblem};
use crate::error::ConfigError;
use crate::time_text::{parse_optional_seconds, parse_seconds};

/// A `[databases]` entry. `None` means "not set here": the global setting
/// (or, for `dbname`, the entry's own name) applies.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Database {
    /// The name clients ask for (`*` for the fallback entry).
    pub name: String,
    /// As written: a host name or address, a comma-separated list of them,
    /// or a Unix socket directory (starting with `/`, or `@` for the
    /// abstract namespace). `None` means the default Unix socket.
    pub host: Option<String>,
    /// Server port (the first of a `port` list); `None` means 5432.
    pub port: Option<u16>,
    /// A `port` list, one per host (or one for all); empty when `port`
    /// names one port.
    pub ports: Vec<u16>,
    /// Overrides `[sluice] route_reads`.
    pub route_reads: Option<bool>,
    /// Patroni REST API addresses (`host:port`, from `http://host:port`)
    /// of the cluster's members: its leader is the only host that may be
    /// the primary; with no `host`, the members are the hosts. Empty:
    /// roles from the hosts' own checks alone.
    pub patroni: Vec<String>,
    /// Server database name; `None` means the same as `name`.
    pub dbname: Option<String>,
    /// Forced server user: every client shares one pool under this user.
    pub user: Option<String>,
    /// Password for the forced user; `None` means take it from auth_file.
    pub password: Option<String>,
    /// Overrides the global `auth_user`.
    pub auth_user: Option<String>,
    /// Overrides the global `auth_query`.
    pub auth_query: Option<String>,
    /// Overrides the global `auth_dbname`.
    pub auth_dbname: Option<String>,
    pub pool_size: Option<u32>,
    pub min_pool_size: Option<u32>,
    /// `reserve_pool_size`, or its old name `reserve_pool`.
    pub reserve_pool_size: Option<u32>,
    pub pool_mode: Option<PoolMode>,
    pub max_db_connections: Option<u32>,
    pub max_db_client_connections: Option<u32>,
    pub server_lifetime: Option<Duration>,
    /// `query_wait_timeout` for this database; `-1` in the file means unset.
    pub query_wait_timeout: Option<Duration>,
    /// Run on each new server connection before clients use it.
    pub connect_query: Option<String>,
    pub client_encoding: Option<String>,
    pub datestyle: Option<String>,
    pub timezone: Option<String>,
    pub application_name: Option<String>,
    /// How a host from a `host` list is picked; `None` means round-robin.
    pub load_balance_hosts: Option<LoadBalanceHosts>,
    /// Which servers are acceptable: any, read-write, read-only, primary,
    /// standby or prefer-standby (with route_reads: read-only and standby
    /// send every transaction, or session, to a replica; prefer-standby
    /// too, falling back to the primary). `None` means any.
    pub target_session_attrs: Option<String>,
    /// Line of the entry in the file that defined it.
    pub line: usize,
}

/// The parameters a database connection string may use, with a description
/// for the docs. The reader accepts exactly these.
pub(crate) const DATABASE_PARAMETERS: &[(&str, &str)] = &[
    (
        "dbname",
        "Server database name; default: the entry's own name.",
    ),
    (
        "host",
        "Host, address, comma-separated list, or Unix socket directory; default: Unix socket.",
    ),
    (
        "port",
        "Server port, or a comma-separated list with one port per host; default 5432.",
    ),
    (
        "route_reads",
        "Overrides [sluice] route_reads: send read-only transactions to replicas.",
    ),
    (
        "patroni",
        "Patroni REST API URLs of the cluster (http://host:port, comma-separated): only the member \
         Patroni names leader may take writes. With no host=, the hosts are Patroni's members, \
         followed as they join and leave, and writes follow the leader even with route_reads off.",
    ),
    (
        "user",
        "Forced server user: all clients share one pool logged in as this user.",
    ),
    (
        "password",
        "Password for the forced user; default: from auth_file.",
    ),
    ("auth_user", "Overrides auth_user for this database."),
    (
        "auth_query",
        "Overrides auth_query for this database (quote it).",
    ),
    ("auth_dbname", "Overrides auth_dbname for this database."),
    ("pool_size", "Overrides default_pool_size."),
    ("min_pool_size", "Overrides min_pool_size."),
    (
        "reserve_pool_size",
        "Overrides reserve_pool_size; reserve_pool is the old name.",
    ),
    ("reserve_pool", "Old name of reserve_pool_size."),
    ("pool_mode", "Overrides pool_mode."),
    ("max_db_connections", "Overrides max_db_connections."),
    (
        "max_db_client_connections",
        "Overrides max_db_client_connections.",
    ),
    ("server_lifetime", "Overrides server_lifetime. (seconds)"),
    (
        "query_wait_timeout",
        "Overrides query_wait_timeout; -1 means not set. (seconds)",
    ),
    (
        "connect_query",
        "Query run on each new server connection before clients use it.",
    ),
    ("client_encoding", "client_encoding asked of the server."),
    ("datestyle", "DateStyle asked of the server."),
    ("timezone", "TimeZone asked of the server."),
    ("application_name", "application_name asked of the server."),
    (
        "load_balance_hosts",
        "Without route_reads, how a new server connection picks a host of a host list: \
         round-robin (default: the next host each time) or disable (the first that answers). \
         A host that does not answer is skipped.",
    ),
    (
        "target_session_attrs",
        "any (default), read-write, read-only, primary, standby or prefer-standby; with route_reads, \
         read-only and standby send every transaction (every session in session mode) to a replica, \
         prefer-standby too unless none qualifies.",
    ),
];

/// One server of an entry's host list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPort {
    /// As written (`None`: the default Unix socket).
    pub host: Option<String>,
    pub port: u16,
}

impl Database {
    /// Every server the entry names, in order: `host=a,b,c` with one port
    /// for all or a `port` list of the same length (PgBouncer 1.25).
    pub fn hosts(&self) -> Vec<HostPort> {
        // Split as the pool does (`resolve` takes the first item): a socket
        // directory may be one item of a list.
        let names: Vec<Option<String>> = match &self.host {
            Some(h) => h
                .split(',')
                .map(|x| Some(x.trim().to_owned()))
                .filter(|x| x.as_deref().is_some_and(|x| !x.is_empty()))
                .collect(),
            None => vec![None],
        };
        let names = if names.is_empty() { vec![None] } else { names };
        let port_of = |i: usize| self.ports.get(i).copied().or(self.port).unwrap_or(5432);
        names
            .into_iter()
            .enumerate()
            .map(|(i, host)| HostPort {
                host,
                port: if self.ports.is_empty() {
                    port_of(0)
                } else {
                    port_of(i)
                },
            })
            .collect()
    }
}

const SESSION_ATTRS: [&str; 6] = [
    "any",
    "read-write",
    "read-only",
    "primary",
    "standby",
    "prefer-standby",
];

impl Database {
    /// Builds the entry `source.name = connstring`.
    pub(crate) fn from_connstring(
        source: &EntrySource<'_>,
        connstring: &str,
    ) -> Result<Database, ConfigError> {
        let mut database = Database {
            name: source.name.to_string(),
            line: source.line,
            ..Database::default()
        };
        source.apply_params(connstring, |param| database.apply(param))?;
        Ok(database)
    }

    fn apply(&mut self, param: &ConnParam) -> Result<(), ParamProblem> {
        let value = param.value.clone();
        let text = value.as_str();
        match param.key.as_str() {
            "dbname" => self.dbname = Some(value),
            "host" => self.host = Some(value),
            "port" => {
                let ports = text
                    .split(',')
                    .map(parse_port)
                    .collect::<Result<Vec<u16>, String>>()?;
                self.port = ports.first().copied();
                self.ports = if ports.len() > 1 { ports } else { Vec::new() };
            }
            "route_reads" => self.route_reads = Some(parse_flag(text)?),
            "patroni" => {
                self.patroni = text
                    .split(',')
                    .map(parse_patroni_url)
                    .collect::<Result<Vec<String>, String>>()?;
            }
            "user" => self.user = Some(value),
            "password" => self.password = Some(value),
            "auth_user" => self.auth_user = Some(value),
            "auth_query" => self.auth_query = Some(value),
            "auth_dbname" => self.auth_dbname = Some(value),
            "pool_size" => self.pool_size = Some(parse_count(text)?),
            "min_pool_size" => self.min_pool_size = Some(parse_count(text)?),
            "reserve_pool" | "reserve_pool_size" => {
                self.reserve_pool_size = Some(parse_count(text)?);
            }
            "pool_mode" => self.pool_mode = Some(Choice::<PoolMode>::parse(text)?),
            "max_db_connections" => self.max_db_connections = Some(parse_count(text)?),
            "max_db_client_connections" => {
                self.max_db_client_connections = Some(parse_count(text)?);
            }
            "server_lifetime" => self.server_lifetime = Some(parse_seconds(text)?),
            "query_wait_timeout" => self.query_wait_timeout = parse_optional_seconds(text)?,
            "connect_query" => self.connect_query = Some(value),
            "client_encoding" => self.client_encoding = Some(value),
            "datestyle" => self.datestyle = Some(value),
            "timezone" => self.timezone = Some(value),
            "application_name" => self.application_name = Some(value),
            "load_balance_hosts" => {
                self.load_balance_hosts = Some(Choice::<LoadBalanceHosts>::parse(text)?);
            }
            "target_session_attrs" => {
                let attrs = text.to_ascii_lowercase();
                if !SESSION_ATTRS.contains(&attrs.as_str()) {
                    return Err(format!("expected one of {}", SESSION_ATTRS.join(", ")).into());
                }
                self.target_session_attrs = Some(attrs);
            }
            _ => return Err(ParamProblem::Unknown),
        }
        Ok(())
    }
}

/// `http://host:port[/]` (or `host:port`) → `host:port`.
fn parse_patroni_url(text: &str) -> Result<String, String> {
    let text = text.trim();
    if text.starts_with("https://") {
        return Err("https is not supported for the Patroni REST API yet: use http://".to_owned());
    }
    let rest = text.strip_prefix("http://").unwrap_or(text);
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    let (host, port) = rest
        .rsplit_once(':')
        .ok_or_else(|| format!("expected http://host:port, got \"{text}\""))?;
    if host.is_empty() || host.contains('/') || host.contains('@') {
        return Err(format!("expected http://host:port, got \"{text}\""));
    }
    parse_port(port)?;
    Ok(rest.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn parse(connstring: &str) -> Result<Database, ConfigError> {
        let source = EntrySource {
            kind: "database",
            file: Path::new("test.ini"),
            line: 3,
            name: "app",
        };
        Database::from_connstring(&source, connstring)
    }

    #[test]
    fn every_documented_parameter_is_accepted() {
        for (name, _) in DATABASE_PARAMETERS {
            let value = match *name {
                "port"
                | "pool_size"
                | "min_pool_size"
                | "reserve_pool"
                | "reserve_pool_size"
                | "max_db_connections"
                | "max_db_client_connections"
                | "server_lifetime"
                | "query_wait_timeout" => "5",
                "pool_mode" => "transaction",
                "load_balance_hosts" => "disable",
                "target_session_attrs" => "primary",
                "route_reads" => "1",
                "patroni" => "http://127.0.0.1:8008",
                _ => "x",
            };
            parse(&format!("{name}={value}")).unwrap();
        }
    }

    #[test]
    fn host_and_port_lists_pair_up() {
        let d = parse("host=a,b,c port=5433").unwrap();
        let ports: Vec<u16> = d.hosts().iter().map(|h| h.port).collect();
        assert_eq!(ports, [5433, 5433, 5433]);
        let d = parse("host=a,b port=1,2").unwrap();
        let hosts: Vec<(Option<String>, u16)> =
            d.hosts().into_iter().map(|h| (h.host, h.port)).collect();
        assert_eq!(
            hosts,
            [(Some("a".to_owned()), 1), (Some("b".to_owned()), 2)]
        );
        assert_eq!(d.port, Some(1));
        let d = parse("host=/tmp").unwrap();
        assert_eq!(d.hosts().len(), 1);
        let d = parse("host=/tmp,10.0.0.2 port=5432,5433").unwrap();
        let hosts: Vec<Option<String>> = d.hosts().into_iter().map(|h| h.host).collect();
        assert_eq!(
            hosts,
            [Some("/tmp".to_owned()), Some("10.0.0.2".to_owned())]
        );
        assert!(parse("port=1,x").is_err());
        assert_eq!(parse("route_reads=on").unwrap().route_reads, Some(true));
        assert_eq!(
            parse("patroni=http://10.0.0.1:8008/,10.0.0.2:8008")
                .unwrap()
                .patroni,
            ["10.0.0.1:8008", "10.0.0.2:8008"]
        );
        assert!(parse("patroni=https://a:8008").is_err());
        assert!(parse("patroni=http://a").is_err());
        assert!(parse("patroni=http://a:99999").is_err());
    }

    #[test]
    fn empty_connstring_sets_nothing() {
        let database = parse("").unwrap();
        assert_eq!(database.name, "app");
        assert_eq!(database.line, 3);
        assert_eq!(database.host, None);
    }

    #[test]
    fn query_wait_timeout_minus_one_is_unset() {
        assert_eq!(
            parse("query_wait_timeout=-1").unwrap().query_wait_timeout,
            None
        );
        assert_eq!(
            parse("query_wait_timeout=2.5").unwrap().query_wait_timeout,
            Some(Duration::from_millis(2500))
        );
    }
}
