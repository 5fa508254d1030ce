//! SHOW <what>: picks the listing (`admin::show`, `sockets`, `hosts`).

use bytes::BytesMut;
use sluice_wire::{ErrorFields, Severity, command_complete};

use super::{Line, invalid_command};
use crate::admin::{error, hosts, show, sockets};
use crate::app::App;

const HELP: &str = "Console usage\n\
\tSHOW HELP|CONFIG|DATABASES|POOLS|CLIENTS|SERVERS|USERS|STATS|STATS_TOTALS|STATS_AVERAGES|TOTALS|LISTS|STATE|VERSION|MEM|DNS_HOSTS|DNS_ZONES|HOSTS|PEERS|PEER_POOLS|SOCKETS|ACTIVE_SOCKETS\n\
\tSET key = arg\n\
\tRELOAD\n\
\tPAUSE [<db>]\n\
\tRESUME [<db>]\n\
\tDISABLE <db>\n\
\tENABLE <db>\n\
\tRECONNECT [<db>]\n\
\tWAIT_CLOSE [<db>]\n\
\tKILL <db>\n\
\tKILL_CLIENT <id>\n\
\tSHUTDOWN\n\
\tSHUTDOWN WAIT_FOR_SERVERS|WAIT_FOR_CLIENTS";

pub(super) fn run(app: &App, line: &Line<'_>, out: &mut BytesMut) {
    let what = line
        .arg()
        .map(|w| w.to_ascii_uppercase())
        .unwrap_or_default();
    let rs = match what.as_str() {
        "POOLS" => show::pools(app),
        "STATS" => show::stats(app),
        "STATS_TOTALS" => show::stats_totals(app),
        "STATS_AVERAGES" => show::stats_averages(app),
        "TOTALS" => show::totals(app),
        "DATABASES" => show::databases(app),
        "USERS" => show::users(app),
        "CONFIG" => show::config(app),
        "LISTS" => show::lists(app),
        "STATE" => show::state(app),
        "VERSION" => show::version(),
        "MEM" => show::mem(),
        "DNS_HOSTS" => show::dns_hosts(app),
        "DNS_ZONES" => show::dns_zones(),
        "CLIENTS" => sockets::clients(app),
        "SERVERS" => sockets::servers(app),
        "HOSTS" => hosts::hosts(app),
        "PEERS" => show::peers_list(app),
        "SOCKETS" => sockets::sockets(app, false),
        "ACTIVE_SOCKETS" => sockets::sockets(app, true),
        "PEER_POOLS" => show::peer_pools(app),
        "HELP" | "" => {
            ErrorFields::new(Severity::Notice, "00000", HELP).encode(out);
            command_complete(out, "SHOW");
            return;
        }
        "FDS" => {
            error(
                out,
                "0A000",
                "SHOW FDS lists sockets handed over in PgBouncer's online restart, \
                 which sluice replaces with so_reuseport: there are none",
            );
            return;
        }
        _ => match line.arg().and_then(super::fake_param) {
            Some((name, value)) => {
                let mut rs = crate::admin::result::ResultSet::new(&[name], "s");
                rs.row(vec![Some(value.to_owned())]);
                rs
            }
            None => {
                error(out, "42601", &invalid_command(line.sql));
                return;
            }
        },
    };
    rs.encode(out);
}
