"""max-connections (E1): past max_connections a pooler turns refused clients into queued ones.

PostgreSQL with max_connections=100 and 3 slots reserved for superusers (97 usable), pgbench
TPC-B-like as an ordinary role with 50 and 150 clients: directly, through sluice
(transaction mode, pool 97, like the seed's managed pool), through PgBouncer with the same
ini, and through Pgpool-II (connection cache, 97 children: it has no transaction pooling, so
it meets the same wall as direct).  Refused clients are counted; the TPS of a run with
refusals is that of the admitted clients (see lab/pgbench.py).
"""

from __future__ import annotations

from lab import options as est
from lab import pgbench, svg
from lab.report import Report, Table, pct_change
from lab.scenarios.common import Context, each_target, measure, server_peak, warm_up
from lab.stack import Stack
from lab.targets import KINDS, LABELS

NAME = "max-connections"
EXPERIMENT = "E1"
TITLE = "the max_connections wall: 50 and 150 clients, direct vs poolers"

SEED = {  # EXPERIMENTS.md E1: (tps, latency ms)
    ("direct", 50): (175.4, 282), ("direct", 150): (258.0, 281),
    ("pool", 50): (171.5, 289), ("pool", 150): (344.4, 422),
}


def settings(o) -> dict:
    return {
        "scale": o.scale or o.pick(10, 150),
        "duration": o.duration or o.pick(3, 15),
        "clients": o.clients or [50, 150],
        "pool_size": (o.pool_sizes or [97])[0],
        "max_connections": 100,
        "reserved": 3,
        "targets": o.targets_or(list(KINDS)),
        "warmup": o.pick(1, 3),
        "workload": o.script or "tpcb",
    }


def _usable(s) -> int:
    return s["max_connections"] - s["reserved"]


def plan(s) -> list[tuple[str, float]]:
    steps = [(f"{NAME}: start PostgreSQL, pgbench scale {s['scale']}",
              est.cluster_seconds(s["scale"]))]
    for kind in s["targets"]:
        steps.append((f"{NAME}: {kind} warm-up", est.run_seconds(s["warmup"])))
        for c in s["clients"]:
            walls = kind in ("direct", "pgpool") and c > _usable(s)
            steps.append((f"{NAME}: {kind}, {c} clients",
                          est.refused_run_seconds(s["duration"], c) if walls
                          else est.run_seconds(s["duration"], c)))
    return steps


def run(s, ctx: Context) -> Report:
    report = Report(NAME, TITLE, s)
    wl = pgbench.workload(s["workload"])
    rows = []
    with Stack(NAME) as st:
        with ctx.progress.step(f"{NAME}: start PostgreSQL, pgbench scale {s['scale']}"):
            pg = st.cluster(max_connections=s["max_connections"], reserved=s["reserved"],
                            scale=s["scale"], db="bench")
            st.create_app_role(pg)
        for t in each_target(ctx, report, st, pg, s["targets"], pool_size=s["pool_size"],
                             max_client_conn=1000, pgpool_children=_usable(s),
                             pgpool_reserved=1, pgpool_max_pool=1):
            warm_up(ctx, st, t, f"{NAME}: {t.kind} warm-up", clients=min(s["clients"]),
                    duration=s["warmup"], scale=s["scale"], workload=wl.key)
            for c in s["clients"]:
                r = measure(ctx, st, pg, t, f"{NAME}: {t.kind}, {c} clients", wl, clients=c,
                            duration=s["duration"], scale=s["scale"])
                rows.append(r)
    report.data["runs"] = rows
    render(report)
    return report


def render(report: Report) -> None:
    """Tables, headline and figure from report.settings and report.data."""
    s, rows = report.settings, report.data["runs"]
    wl = pgbench.workload(s["workload"])
    _tables(report, s, wl, rows)
    _figure(report, s, wl, rows)
    report.notes.append(_headline(s, rows))


def _headline(s, rows) -> str:
    c = max(s["clients"])
    at = {r["target"]: r for r in rows if r["clients"] == c}
    d, sl = at.get("direct"), at.get("sluice")
    if not d or not sl:
        return ""
    text = (f"=> At {c} clients PostgreSQL admitted {d.get('admitted')} and refused "
            f"{d.get('refused')} direct clients; through sluice {c - (sl.get('refused') or 0)} of "
            f"{c} ran, on {server_peak(sl)} server connections, at {sl.get('tps') or 0:,.0f} TPS "
            f"({pct_change(sl.get('tps'), d.get('tps'))} vs the admitted direct clients; "
            "seed +33 %).")
    return text


def _seed_cell(kind, clients):
    key = ("direct" if kind == "direct" else "pool" if kind in ("sluice", "pgbouncer") else None,
           clients)
    seed = SEED.get(key)
    if not seed:
        return None
    tps, lat = seed
    base = SEED.get(("direct", clients))
    change = pct_change(tps, base[0]) if key[0] == "pool" and base else None
    return f"{tps} ({change})" if change else f"{tps}"


def _tables(report, s, wl, rows):
    t = Table(f"{EXPERIMENT}: pgbench {wl.label}, {s['duration']:g} s per run, scale "
              f"{s['scale']}; PostgreSQL max_connections={s['max_connections']} "
              f"({s['reserved']} reserved); poolers in transaction mode, pool {s['pool_size']}",
              ["target", "clients", "connected", "refused", "tps", "latency ms", "vs direct",
               "server conns", "seed tps"])
    direct = {r["clients"]: r["tps"] for r in rows if r["target"] == "direct"}
    reasons = {}
    for c in s["clients"]:
        for r in (r for r in rows if r["clients"] == c):
            refused = r.get("refused") or 0
            if refused and r.get("refusal"):
                reasons[LABELS[r["target"]]] = r["refusal"]
            t.add(LABELS[r["target"]], c, c - refused, refused, r.get("tps"),
                  r.get("lat_avg_ms"),
                  pct_change(r.get("tps"), direct.get(c)) if r["target"] != "direct" else None,
                  server_peak(r), _seed_cell(r["target"], c))
    if any(r.get("rerun_with_admitted") for r in rows):
        t.notes.append("tps/latency of a row with refusals: pgbench aborts a run at the first "
                       "refused client, so the admitted clients ran again on their own.")
    for who, why in reasons.items():
        t.notes.append(f"{who} refused with: {why}")
    t.notes.append("server conns = peak of the role's connections on PostgreSQL (backend process titles, sampled each second). "
                   "Seed: 2 vCPU/4 GB managed PostgreSQL, scale 150, 600 s runs; its pool "
                   "column is DigitalOcean's PgBouncer pool.")
    report.tables.append(t)


def _figure(report, s, wl, rows):
    groups = [f"{c} clients" for c in s["clients"]]
    kinds = [k for k in s["targets"] if any(r["target"] == k for r in rows)]
    series = [LABELS[k] for k in kinds]
    tps, lat, served, notes = {}, {}, {}, {}
    for r in rows:
        key = (f"{r['clients']} clients", LABELS[r["target"]])
        tps[key] = r.get("tps")
        lat[key] = r.get("lat_avg_ms")
        served[key] = r["clients"] - (r.get("refused") or 0)
        if r.get("refused"):
            notes[key] = f"{r['refused']} refused"
    report.figures.append(svg.Figure(
        name=NAME,
        title=f"{EXPERIMENT} — past max_connections, a pooler queues clients instead of "
              "refusing them",
        subtitle=f"pgbench {wl.label}, scale {s['scale']}, {s['duration']:g} s per run; "
                 f"max_connections={s['max_connections']} ({s['reserved']} reserved); "
                 f"transaction pool of {s['pool_size']}; with refusals, TPS of the admitted clients",
        panels=[svg.BarPanel("Clients that got a connection", "clients", groups, series,
                             served, notes),
                svg.BarPanel("Throughput", "transactions / s", groups, series, tps, notes),
                svg.BarPanel("Average latency", "ms", groups, series, lat)],
        columns=3))
