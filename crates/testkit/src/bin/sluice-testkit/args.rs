//! Command-line parsing for `sluice-testkit cluster ...`, by hand to keep the
//! testkit free of CLI dependencies.

use sluice_testkit::{ClusterBuilder, ServerAuth};

pub const USAGE: &str = "\
usage: sluice-testkit cluster [--max-connections N] [--reserved N]
           [--auth trust|password|md5|scram-sha-256] [--user NAME:PASSWORD]...
           [--set KEY=VALUE]... [--database NAME]... [--pgbench-scale N] [--replica]

Starts a throwaway PostgreSQL cluster, prints one JSON line describing it,
and removes it when stdin reaches EOF or on SIGTERM/SIGINT.";

/// What `sluice-testkit cluster` was asked to do.
#[derive(Debug)]
pub struct ClusterArgs {
    pub builder: ClusterBuilder,
    pub pgbench_scale: Option<u32>,
    pub replica: bool,
}

/// Parses everything after the program name; `Err` holds a message for stderr.
pub fn parse(args: impl IntoIterator<Item = String>) -> Result<ClusterArgs, String> {
    let mut args = args.into_iter();
    match args.next().as_deref() {
        Some("cluster") => {}
        Some(other) => return Err(format!("unknown command {other:?}\n{USAGE}")),
        None => return Err(USAGE.to_owned()),
    }
    let mut parsed = ClusterArgs {
        builder: sluice_testkit::Cluster::builder(),
        pgbench_scale: None,
        replica: false,
    };
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
        let builder = std::mem::take(&mut parsed.builder);
        parsed.builder = match flag.as_str() {
            "--max-connections" => builder.max_connections(number(&flag, &value()?)?),
            "--reserved" => builder.superuser_reserved_connections(number(&flag, &value()?)?),
            "--auth" => {
                let name = value()?;
                let auth = ServerAuth::from_hba_method(&name)
                    .ok_or_else(|| format!("unknown --auth {name:?}"))?;
                builder.auth(auth)
            }
            "--user" => {
                let spec = value()?;
                let (name, password) = spec
                    .split_once(':')
                    .ok_or_else(|| format!("--user wants NAME:PASSWORD, got {spec:?}"))?;
                builder.user(name, password)
            }
            "--set" => {
                let spec = value()?;
                let (key, val) = spec
                    .split_once('=')
                    .ok_or_else(|| format!("--set wants KEY=VALUE, got {spec:?}"))?;
                builder.setting(key.trim(), val)
            }
            "--database" => builder.database(&value()?),
            "--pgbench-scale" => {
                parsed.pgbench_scale = Some(number(&flag, &value()?)?);
                builder
            }
            "--replica" => {
                parsed.replica = true;
                builder
            }
            "-h" | "--help" => return Err(USAGE.to_owned()),
            other => return Err(format!("unknown option {other:?}\n{USAGE}")),
        };
    }
    Ok(parsed)
}

fn number(flag: &str, text: &str) -> Result<u32, String> {
    text.parse()
        .map_err(|_| format!("{flag} wants a non-negative number, got {text:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_line(line: &str) -> Result<ClusterArgs, String> {
        parse(line.split_whitespace().map(str::to_owned))
    }

    #[test]
    fn parses_all_flags() {
        let args = parse_line(
            "cluster --max-connections 20 --reserved 1 --auth md5 --user a:b:c \
             --set work_mem=4MB --database x --pgbench-scale 2 --replica",
        )
        .unwrap();
        assert_eq!(args.pgbench_scale, Some(2));
        assert!(args.replica);
    }

    #[test]
    fn rejects_bad_input() {
        assert!(parse_line("").is_err());
        assert!(parse_line("serve").is_err());
        assert!(parse_line("cluster --auth ldap").is_err());
        assert!(parse_line("cluster --user nopassword").is_err());
        assert!(parse_line("cluster --max-connections").is_err());
        assert!(parse_line("cluster --bogus").is_err());
    }
}
