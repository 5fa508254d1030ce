"""reconnect (E3): a new connection per transaction (`pgbench -C`), direct vs each pooler.

Opening a PostgreSQL connection means a fork, a socket and authentication; a pooler keeps
server connections open and only accepts the cheap client side.  The seed measured
PgBouncer (transaction mode, max_client_conn=100, default_pool_size=25,
reserve_pool_size=5) and Pgpool-II (connection_cache=on) on `pgbench -c 10 -j 2`, scale 50;
we run the same configuration for sluice and PgBouncer, Pgpool-II with its default 32
children, and both the select-only and the TPC-B-like script with -C.
"""

from __future__ import annotations

from lab import options as est
from lab import pgbench, svg
from lab.report import Report, Table, pct_change
from lab.scenarios.common import Context, each_target, measure, warm_up
from lab.stack import Stack
from lab.targets import KINDS, LABELS

NAME = "reconnect"
EXPERIMENT = "E3"
TITLE = "a new connection per transaction (pgbench -C): direct vs poolers"


def settings(o) -> dict:
    return {
        "scale": o.scale or o.pick(5, 50),
        "duration": o.duration or o.pick(3, 15),
        "clients": (o.clients or [10])[0],
        "workloads": [o.script] if o.script else ["select", "tpcb"],
        "pool_size": (o.pool_sizes or [25])[0],
        "targets": o.targets_or(list(KINDS)),
        "warmup": o.pick(1, 2),
    }


def plan(s):
    steps = [(f"{NAME}: start PostgreSQL, pgbench scale {s['scale']}",
              est.cluster_seconds(s["scale"]))]
    for kind in s["targets"]:
        steps.append((f"{NAME}: {kind} warm-up", est.run_seconds(s["warmup"])))
        for w in s["workloads"]:
            steps.append((f"{NAME}: {kind}, {w} -C", est.run_seconds(s["duration"])))
    return steps


def run(s, ctx: Context) -> Report:
    report = Report(NAME, TITLE, s)
    rows = []
    with Stack(NAME) as st:
        with ctx.progress.step(f"{NAME}: start PostgreSQL, pgbench scale {s['scale']}"):
            pg = st.cluster(max_connections=100, reserved=3, scale=s["scale"], db="bench")
            st.create_app_role(pg)
        for t in each_target(ctx, report, st, pg, s["targets"], pool_size=s["pool_size"],
                             max_client_conn=100,
                             settings={"reserve_pool_size": 5, "reserve_pool_timeout": 1},
                             pgpool_children=32, pgpool_max_pool=4, pgpool_reserved=0):
            warm_up(ctx, st, t, f"{NAME}: {t.kind} warm-up", clients=s["clients"],
                    duration=s["warmup"], scale=s["scale"])
            for w in s["workloads"]:
                wl = pgbench.workload(w)
                rows.append(measure(ctx, st, pg, t, f"{NAME}: {t.kind}, {w} -C", wl,
                                    clients=s["clients"], duration=s["duration"],
                                    scale=s["scale"], connect_each=True))
    report.data["runs"] = rows
    render(report)
    return report


def render(report: Report) -> None:
    """Tables, headline and figure from report.settings and report.data."""
    s, rows = report.settings, report.data["runs"]
    t = Table(f"{EXPERIMENT}: pgbench -C (reconnect per transaction), {s['clients']} clients, "
              f"-j 2, {s['duration']:g} s, scale {s['scale']}; sluice/PgBouncer transaction "
              f"pool {s['pool_size']} + reserve 5, Pgpool-II connection_cache=on",
              ["workload", "target", "tps", "latency ms", "vs direct", "errors"])
    for w in s["workloads"]:
        direct = next((r["tps"] for r in rows if r["workload"] == w and r["target"] == "direct"),
                      None)
        for r in (r for r in rows if r["workload"] == w):
            t.add(pgbench.workload(w).label, LABELS[r["target"]], r.get("tps"),
                  r.get("lat_avg_ms"),
                  pct_change(r.get("tps"), direct) if r["target"] != "direct" else None,
                  pgbench.short_reason(r.get("error")))
    t.notes.append("pgbench -C counts the reconnection in each transaction's time. Seed "
                   "(2 GB VM, PostgreSQL 9.5, scale 50, TPC-B): Pgpool-II with -C +75 % over "
                   "direct; without -C, direct 486 TPS vs PgBouncer 566 (+16 %).")
    report.tables.append(t)
    report.notes.append(_headline(s, rows))
    groups = [pgbench.workload(w).label for w in s["workloads"]]
    series = [LABELS[k] for k in s["targets"] if any(r["target"] == k for r in rows)]
    tps = {(pgbench.workload(r["workload"]).label, LABELS[r["target"]]): r.get("tps")
           for r in rows}
    lat = {(pgbench.workload(r["workload"]).label, LABELS[r["target"]]): r.get("lat_avg_ms")
           for r in rows}
    report.figures.append(svg.Figure(
        name=NAME, title=f"{EXPERIMENT} — a connection per transaction: poolers skip the fork",
        subtitle=f"pgbench -C, {s['clients']} clients, scale {s['scale']}, "
                 f"{s['duration']:g} s per run",
        panels=[svg.BarPanel("Throughput", "transactions / s", groups, series, tps),
                svg.BarPanel("Average latency (incl. reconnect)", "ms", groups, series, lat)]))


def _headline(s, rows) -> str:
    parts = []
    for w in s["workloads"]:
        direct = next((r.get("tps") for r in rows if r["workload"] == w and r["target"] == "direct"),
                      None)
        if not direct:
            continue
        ratios = [f"{LABELS[r['target']]} {r['tps'] / direct:.1f}x" for r in rows
                  if r["workload"] == w and r["target"] != "direct" and r.get("tps")]
        if ratios:
            parts.append(f"{pgbench.workload(w).label}: " + ", ".join(ratios))
    if not parts:
        return ""
    return ("=> With a new connection per transaction, TPS relative to direct - "
            + "; ".join(parts) + " (seed: Pgpool-II 1.75x on TPC-B).")
