"""compare: the `make bench` matrix - sluice vs PgBouncer vs Pgpool-II vs direct.

pgbench select-only in simple and extended query mode at several client counts against
PostgreSQL (max_connections=100, 3 reserved) directly and through each pooler: sluice and
PgBouncer with the same pgbouncer.ini (transaction mode, pool 20), Pgpool-II with 97
children (it serves one client per child, so clients past 97 are refused).  Reports TPS,
average and p99 latency, refused clients and the pooler's CPU time per transaction (from
/proc; Pgpool-II's is spread over its children and not counted).
"""

from __future__ import annotations

import pglab

from lab import options as est
from lab import pgbench, svg
from lab.report import Report, Table, pct_change
from lab.scenarios.common import Context, each_target, measure, warm_up
from lab.stack import Stack
from lab.targets import KINDS, LABELS

NAME = "compare"
EXPERIMENT = "bench"
TITLE = "select-only matrix: direct vs sluice vs PgBouncer vs Pgpool-II"


def settings(o) -> dict:
    return {
        "scale": o.scale or 10,
        "duration": o.duration or o.pick(3, 8),
        "clients": o.clients or o.pick([1, 10, 150], [1, 10, 50, 150]),
        "modes": o.extra.get("modes") or o.pick(["simple"], ["simple", "extended"]),
        "pool_size": (o.pool_sizes or [20])[0],
        "targets": o.targets_or(list(KINDS)),
        "warmup": o.pick(1, 2),
    }


def plan(s):
    steps = [(f"{NAME}: start PostgreSQL, pgbench scale {s['scale']}",
              est.cluster_seconds(s["scale"]))]
    for kind in s["targets"]:
        steps.append((f"{NAME}: {kind} warm-up", est.run_seconds(s["warmup"], 20)))
        for m in s["modes"]:
            for c in s["clients"]:
                walls = kind in ("direct", "pgpool") and c > 97
                steps.append((f"{NAME}: {kind}, {m}, {c} clients",
                              est.refused_run_seconds(s["duration"], c) if walls
                              else est.run_seconds(s["duration"], c)))
    return steps


def run(s, ctx: Context) -> Report:
    report = Report(NAME, TITLE, s)
    wl = pgbench.workload("select")
    rows = []
    with Stack(NAME) as st:
        with ctx.progress.step(f"{NAME}: start PostgreSQL, pgbench scale {s['scale']}"):
            pg = st.cluster(max_connections=100, reserved=3, scale=s["scale"], db="bench")
            st.create_app_role(pg)
        for t in each_target(ctx, report, st, pg, s["targets"], pool_size=s["pool_size"],
                             max_client_conn=12000, pgpool_children=97, pgpool_reserved=1,
                             pgpool_max_pool=1):
            warm_up(ctx, st, t, f"{NAME}: {t.kind} warm-up", clients=20, duration=s["warmup"],
                    scale=s["scale"])
            for m in s["modes"]:
                for c in s["clients"]:
                    cpu0 = pglab.proc_cpu_seconds(t.pid) if t.pid and t.kind != "pgpool" else None
                    r = measure(ctx, st, pg, t, f"{NAME}: {t.kind}, {m}, {c} clients", wl,
                                clients=c, duration=s["duration"], scale=s["scale"], mode=m)
                    cpu1 = pglab.proc_cpu_seconds(t.pid) if cpu0 is not None else None
                    tx = r.get("transactions") or 0
                    r["cpu_us_per_tx"] = (round((cpu1 - cpu0) * 1e6 / tx, 1)
                                          if cpu0 is not None and cpu1 is not None and tx and
                                          not r.get("rerun_with_admitted") else None)
                    rows.append({**r, "mode": m})
    report.data["runs"] = rows
    render(report)
    return report


def render(report: Report) -> None:
    """Table, headline and figure from report.settings and report.data."""
    s, rows = report.settings, report.data["runs"]
    t = Table(f"compare: pgbench -S, {s['duration']:g} s per cell, scale {s['scale']}, "
              f"max_connections=100 (3 reserved); sluice/PgBouncer transaction pool "
              f"{s['pool_size']}, Pgpool-II 97 children",
              ["mode", "clients", "target", "tps", "vs direct", "avg ms", "p99 ms", "refused",
               "cpu us/tx"])
    for m in s["modes"]:
        for c in s["clients"]:
            cell = [r for r in rows if r["mode"] == m and r["clients"] == c]
            direct = next((r["tps"] for r in cell if r["target"] == "direct"), None)
            for r in cell:
                t.add(m, c, LABELS[r["target"]], r.get("tps"),
                      pct_change(r.get("tps"), direct) if r["target"] != "direct" else None,
                      r.get("lat_avg_ms"), r.get("p99_ms"), r.get("refused"),
                      r.get("cpu_us_per_tx"))
    if any(r.get("rerun_with_admitted") for r in rows):
        t.notes.append("rows with refused clients: tps/latency of the admitted clients, run "
                       "again on their own (pgbench aborts at the first refusal).")
    report.tables.append(t)
    ratios = []
    for m in s["modes"]:
        for c in s["clients"]:
            a = next((r for r in rows if (r["mode"], r["clients"], r["target"]) ==
                      (m, c, "sluice")), None)
            b = next((r for r in rows if (r["mode"], r["clients"], r["target"]) ==
                      (m, c, "pgbouncer")), None)
            if a and b and a.get("tps") and b.get("tps"):
                ratios.append(a["tps"] / b["tps"])
    if ratios:
        ratios.sort()
        report.notes.append(f"=> sluice/PgBouncer TPS ratio over the {len(ratios)} cells: median "
                            f"{ratios[len(ratios) // 2]:.2f} (range {ratios[0]:.2f}-"
                            f"{ratios[-1]:.2f}).")
    kinds = [k for k in s["targets"] if any(r["target"] == k for r in rows)]
    panels = []
    for m in s["modes"]:
        panels.append(svg.LinePanel(
            f"Throughput, {m} protocol", "clients", "transactions / s",
            [svg.Series(LABELS[k], [(r["clients"], r.get("tps")) for r in rows
                                    if r["target"] == k and r["mode"] == m]) for k in kinds],
            log_x=True, marks=[(97, "97 slots")] if max(s["clients"]) > 97 else []))
    for m in s["modes"]:
        panels.append(svg.LinePanel(
            f"p99 latency, {m} protocol", "clients", "ms",
            [svg.Series(LABELS[k], [(r["clients"], r.get("p99_ms")) for r in rows
                                    if r["target"] == k and r["mode"] == m]) for k in kinds],
            log_x=True))
    report.figures.append(svg.Figure(
        name=NAME, title="compare — pgbench -S through each pooler",
        subtitle=f"scale {s['scale']}, {s['duration']:g} s per point, max_connections=100; "
                 f"transaction pool {s['pool_size']}; points past 97 clients: admitted clients",
        panels=panels, columns=2))
