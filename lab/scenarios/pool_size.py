"""pool-size: sweep sluice's pool size for one workload and recommend a size.

E4 found by hand that 100 clients ran faster through 20 server connections than through
100 on a 2-vCPU database.  This scenario does the search: the same pgbench script and client
count through sluice (transaction mode) at each pool size (several rounds, sizes interleaved,
median taken: a shared machine is noisy), then recommends the smallest pool
whose throughput is within 5 % of the best among those meeting the latency bound (p99,
`--p99-bound MS`; no bound by default).  Average latency is no guide here - with a fixed
number of closed-loop clients it is just clients / TPS - so the bound is on p99, which
queueing for a small pool does move.
"""

from __future__ import annotations

import statistics

from lab import options as est
from lab import pgbench, pools, svg
from lab.report import Report, Table, pct_change
from lab.scenarios.common import Context, measure, refresh_pools, warm_up
from lab.stack import Stack
from lab.targets import open_target

NAME = "pool-size"
EXPERIMENT = "E4"
TITLE = "sweep the pool size for a workload, recommend the best one within a latency bound"

WITHIN = 0.05  # "as good as the best": within 5 % of its TPS


def settings(o) -> dict:
    return {
        "scale": o.scale or o.pick(10, 50),
        "duration": o.duration or o.pick(3, 12),
        "clients": (o.clients or [100])[0],
        "pool_sizes": sorted(o.pool_sizes or o.pick([5, 20, 100], [2, 5, 10, 20, 40, 70, 100])),
        "workload": o.script or "read5000",
        "p99_bound_ms": o.p99_bound_ms,
        "warmup": o.pick(1, 2),
        "rounds": int(o.extra.get("rounds") or o.pick(1, 2)),
    }


def plan(s):
    steps = [(f"{NAME}: start PostgreSQL, pgbench scale {s['scale']}",
              est.cluster_seconds(s["scale"]))]
    for rnd in range(1, s["rounds"] + 1):
        for p in s["pool_sizes"]:
            steps.append((f"{NAME}: pool {p} warm-up, round {rnd}",
                          est.run_seconds(s["warmup"], s["clients"])))
            steps.append((f"{NAME}: pool {p}, round {rnd}",
                          est.run_seconds(s["duration"], s["clients"])))
    return steps


def recommend(rows, bound_ms):
    ok = [r for r in rows if r.get("tps") and (bound_ms is None or (
        r.get("p99_ms") is not None and r["p99_ms"] <= bound_ms))]
    if not ok:
        return None, "no pool size met the latency bound"
    best = max(r["tps"] for r in ok)
    good = [r for r in ok if r["tps"] >= best * (1 - WITHIN)]
    pick = min(good, key=lambda r: r["pool_size"])
    why = (f"pool {pick['pool_size']}: {pick['tps']:,.0f} TPS, within {WITHIN:.0%} of the best "
           f"({best:,.0f})" + (f" among sizes with p99 <= {bound_ms:g} ms" if bound_ms else "")
           + "; the smallest such pool leaves the most connections for everything else")
    return pick["pool_size"], why


def by_size(runs: list[dict]) -> list[dict]:
    """One row per pool size: the median over its rounds (the pool samples of the median
    round)."""
    out = []
    for size in sorted({r["pool_size"] for r in runs}):
        rs = sorted((r for r in runs if r["pool_size"] == size), key=lambda r: r.get("tps") or 0)
        mid = rs[len(rs) // 2]
        row = {"pool_size": size, "pools": mid.get("pools"),
               "tps_rounds": [r.get("tps") or 0 for r in rs if r.get("tps") is not None]}
        for k in ("tps", "lat_avg_ms", "p50_ms", "p99_ms"):
            vals = [r[k] for r in rs if r.get(k) is not None]
            row[k] = round(statistics.median(vals), 3) if vals else None
        out.append(row)
    return out


def run(s, ctx: Context) -> Report:
    report = Report(NAME, TITLE, s)
    wl = pgbench.workload(s["workload"])
    rows = []
    with Stack(NAME) as st:
        with ctx.progress.step(f"{NAME}: start PostgreSQL, pgbench scale {s['scale']}"):
            pg = st.cluster(max_connections=max(100, max(s["pool_sizes"]) + 20), reserved=3,
                            scale=s["scale"], db="bench")
            st.create_app_role(pg)
        # rounds go over all sizes in turn, so a noisy minute on a shared machine hits one
        # round of every size rather than every round of one size
        for rnd in range(1, s["rounds"] + 1):
            for p in s["pool_sizes"]:
                with open_target(st, "sluice", pg, pool_size=p, max_client_conn=5000) as t:
                    warm_up(ctx, st, t, f"{NAME}: pool {p} warm-up, round {rnd}",
                            clients=s["clients"], duration=s["warmup"], scale=s["scale"],
                            workload=wl.key)
                    r = measure(ctx, st, pg, t, f"{NAME}: pool {p}, round {rnd}", wl,
                                clients=s["clients"], duration=s["duration"], scale=s["scale"],
                                console=True)
                    rows.append({**r, "pool_size": p, "round": rnd})
    report.data["runs"] = rows
    render(report)
    return report


def render(report: Report) -> None:
    """Recommendation, table and figure from report.settings and report.data."""
    s, runs = report.settings, report.data["runs"]
    refresh_pools(runs)
    rows = by_size(runs)
    wl = pgbench.workload(s["workload"])
    size, why = recommend(rows, s["p99_bound_ms"])
    report.data["recommendation"] = {"pool_size": size, "why": why}
    best = max((r["tps"] or 0 for r in rows), default=0)
    t = Table(f"pool-size: pgbench {wl.label}, {s['clients']} clients, {s['duration']:g} s per "
              f"size, scale {s['scale']}, through sluice (transaction mode)",
              ["pool", "tps", "vs best", "latency ms", "p50 ms", "p99 ms", "tps per round",
               "pool at its busiest", ""])
    for r in rows:
        t.add(r["pool_size"], r.get("tps"), pct_change(r.get("tps"), best), r.get("lat_avg_ms"),
              r.get("p50_ms"), r.get("p99_ms"),
              " / ".join(f"{v:,.0f}" for v in r["tps_rounds"]) if len(r["tps_rounds"]) > 1
              else None, pools.describe(r.get("pools")),
              "<- recommended" if r["pool_size"] == size else "")
    if max(len(r["tps_rounds"]) for r in rows) > 1:
        t.notes.append("each value is the median over the rounds (sizes interleaved).")
    t.notes.append(f"recommendation: {why}")
    report.tables.append(t)
    report.figures.append(svg.Figure(
        name=NAME, title=f"pool-size — {wl.label}, {s['clients']} clients through sluice",
        subtitle=f"scale {s['scale']}, {s['duration']:g} s per pool size x "
                 f"{s.get('rounds', 1)} round(s), median; "
                 f"recommended: {size if size else 'none'}",
        panels=[svg.LinePanel("Throughput", "pool size (server connections)", "transactions / s",
                              [svg.Series("sluice", [(r["pool_size"], r.get("tps"))
                                                     for r in rows])], log_x=True,
                              marks=[(size, f"recommended: {size}")] if size else []),
                svg.LinePanel("Latency", "pool size (server connections)", "ms",
                              [svg.Series("p99", [(r["pool_size"], r.get("p99_ms")) for r in rows],
                                          color="#dc2626"),
                               svg.Series("average", [(r["pool_size"], r.get("lat_avg_ms"))
                                                      for r in rows], color="#0f766e"),
                               svg.Series("p50", [(r["pool_size"], r.get("p50_ms"))
                                                  for r in rows], color="#0f766e", dashed=True)],
                              log_x=True)]))
