"""idle (E4): 1,000 idle connections slow PostgreSQL down; behind a pooler they cost nothing.

Part 1: 100 pgbench clients run TPC-B-like, select-only and the custom read of 5,000 rows,
first alone and then next to 1,000 connections that each read information_schema and sit
idle - directly (1,000 more backends) and through sluice (1,000 idle clients, no servers;
pool 100, max_client_conn 5000).  PgBouncer, when installed, runs the 5,000-row read the same
way, as in the seed.  Part 2: the 5,000-row read through a pool of 20 instead of 100 (on 2
cores the smaller pool should win).  Pool samples are taken every second during every pooled
run: PgBouncer's SHOW POOLS, sluice's when its console answers, otherwise PostgreSQL's side
(labelled as such).
"""

from __future__ import annotations

from lab import options as est
from lab import pgbench, pools, svg
from lab.idle import IdleConnections
from lab.report import Report, Table, pct_change
from lab.scenarios.common import Context, each_target, measure, refresh_pools, warm_up
from lab.stack import Stack
from lab.targets import LABELS

NAME = "idle"
EXPERIMENT = "E4"
TITLE = "idle connections are not free: 1,000 idle, direct vs sluice; pool 20 vs 100"

SEED = {"tpcb": (1249, 1140), "select": (1969, 1610), "read5000": (378, 206)}
SEED_PGBOUNCER = (377.9, 377.5)
SEED_POOL20 = 426.8


def settings(o) -> dict:
    return {
        "scale": o.scale or o.pick(10, 100),
        "duration": o.duration or o.pick(3, 12),
        "clients": (o.clients or [100])[0],
        "idle": int(o.extra.get("idle", 1000)),
        "workloads": [o.script] if o.script else ["tpcb", "select", "read5000"],
        "pool_sizes": o.pool_sizes or [100, 20],
        "targets": o.targets_or(["direct", "sluice", "pgbouncer"]),
        "peer_workloads": ["read5000"],  # PgBouncer runs what the seed ran through it
        "warmup": o.pick(1, 2),
    }


def _workloads_for(s, kind):
    return s["workloads"] if kind in ("direct", "sluice") else [
        w for w in s["workloads"] if w in s["peer_workloads"]] or s["workloads"][-1:]


def plan(s):
    steps = [(f"{NAME}: start PostgreSQL, pgbench scale {s['scale']}",
              est.cluster_seconds(s["scale"]))]
    large, small = s["pool_sizes"][0], s["pool_sizes"][-1]
    for kind in s["targets"]:
        if kind == "pgpool":
            continue
        steps.append((f"{NAME}: {kind} warm-up", est.run_seconds(s["warmup"], s["clients"])))
        ws = _workloads_for(s, kind)
        for w in ws:
            steps.append((f"{NAME}: {kind}, {w}, no idle", est.run_seconds(s["duration"], 100)))
        steps.append((f"{NAME}: {kind}, opening {s['idle']} idle connections",
                      est.idle_open_seconds(s["idle"], kind == "direct")))
        for w in ws:
            steps.append((f"{NAME}: {kind}, {w}, {s['idle']} idle",
                          est.run_seconds(s["duration"], 100)))
    for kind in s["targets"]:
        if kind not in ("direct", "pgpool") and small != large:
            steps.append((f"{NAME}: {kind}, pool {small}, {s['workloads'][-1]}",
                          est.run_seconds(s["duration"], 100) + 1))
    return steps


def _mem_available_kb() -> int | None:
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def run(s, ctx: Context) -> Report:
    report = Report(NAME, TITLE, s)
    rows, idle_info = [], {}
    n_idle, clients = s["idle"], s["clients"]
    large, small = s["pool_sizes"][0], s["pool_sizes"][-1]
    with Stack(NAME) as st:
        with ctx.progress.step(f"{NAME}: start PostgreSQL, pgbench scale {s['scale']}"):
            pg = st.cluster(max_connections=n_idle + clients + 150, reserved=3,
                            scale=s["scale"], db="bench")
            st.create_app_role(pg)
        kinds = [k for k in s["targets"] if k != "pgpool"]
        for t in each_target(ctx, report, st, pg, kinds, pool_size=large, max_client_conn=5000):
            pooled = t.kind != "direct"
            warm_up(ctx, st, t, f"{NAME}: {t.kind} warm-up", clients=clients,
                    duration=s["warmup"], scale=s["scale"])
            ws = _workloads_for(s, t.kind)
            for w in ws:
                r = measure(ctx, st, pg, t, f"{NAME}: {t.kind}, {w}, no idle",
                            pgbench.workload(w), clients=clients, duration=s["duration"],
                            scale=s["scale"], console=pooled)
                rows.append({**r, "idle": 0, "pool_size": large if pooled else None})
            with ctx.progress.step(f"{NAME}: {t.kind}, opening {n_idle} idle connections"):
                mem0 = _mem_available_kb()
                idle = IdleConnections(t.host, t.port, user=t.user, database=t.dbname, n=n_idle)
                idle.open()
                mem1 = _mem_available_kb()
            try:
                info = idle.summary()
                info["mem_available_drop_mb"] = (round((mem0 - mem1) / 1024)
                                                 if mem0 and mem1 else None)
                info["server_conns_after_open"] = st.backends(pg)
                idle_info[t.kind] = info
                if info["opened"] < n_idle:
                    ctx.progress.note(f"{t.label}: only {info['opened']} of {n_idle} idle "
                                      f"connections opened: {info['errors']}")
                for w in ws:
                    r = measure(ctx, st, pg, t, f"{NAME}: {t.kind}, {w}, {n_idle} idle",
                                pgbench.workload(w), clients=clients, duration=s["duration"],
                                scale=s["scale"], console=pooled)
                    rows.append({**r, "idle": info["opened"],
                                 "pool_size": large if pooled else None})
            finally:
                idle.close()
        if small != large:
            w = s["workloads"][-1]
            for t in each_target(ctx, report, st, pg, [k for k in kinds if k != "direct"],
                                 pool_size=small, max_client_conn=5000):
                r = measure(ctx, st, pg, t, f"{NAME}: {t.kind}, pool {small}, {w}",
                            pgbench.workload(w), clients=clients, duration=s["duration"],
                            scale=s["scale"], console=True)
                rows.append({**r, "idle": 0, "pool_size": small})
    report.data.update(runs=rows, idle=idle_info)
    render(report)
    return report


def render(report: Report) -> None:
    """Tables, headline and figure from report.settings and report.data."""
    s, rows = report.settings, report.data["runs"]
    refresh_pools(rows)
    _tables(report, s, rows, report.data["idle"])
    _figures(report, s, rows)
    report.notes.append(_headline(s, rows))


def _headline(s, rows) -> str:
    def change(kind):
        out = []
        for w in s["workloads"]:
            a = _find(rows, kind, w, False, None if kind == "direct" else s["pool_sizes"][0])
            b = _find(rows, kind, w, True)
            c = pct_change(b and b.get("tps"), a and a.get("tps"))
            if c:
                out.append(f"{pgbench.workload(w).label} {c}")
        return ", ".join(out)
    d, sl = change("direct"), change("sluice")
    if not d:
        return ""
    text = f"=> {s['idle']:,} idle connections: direct {d}"
    if sl:
        text += f"; through sluice {sl}"
    w, large, small = s["workloads"][-1], s["pool_sizes"][0], s["pool_sizes"][-1]
    a, b = _find(rows, "sluice", w, False, large), _find(rows, "sluice", w, False, small)
    if a and b and small != large:
        text += (f". {pgbench.workload(w).label} through a pool of {small} instead of {large}: "
                 f"{pct_change(b.get('tps'), a.get('tps'))} (seed: +13 %)")
    return text + "."


def _find(rows, kind, w, idle, pool=None):
    for r in rows:
        if r["target"] == kind and r["workload"] == w and (r["idle"] > 0) == bool(idle) and (
                pool is None or r.get("pool_size") == pool):
            return r
    return None


def _tables(report, s, rows, idle_info):
    n, large, small = s["idle"], s["pool_sizes"][0], s["pool_sizes"][-1]
    kinds = [k for k in s["targets"] if any(r["target"] == k for r in rows)]
    t = Table(f"{EXPERIMENT} part 1: {s['clients']} pgbench clients, {s['duration']:g} s per "
              f"run, scale {s['scale']}, alone and next to {n:,} idle connections "
              f"(poolers: transaction pool {large})",
              ["workload", "target", "tps, no idle", f"tps, {n:,} idle", "change",
               "latency ms (idle)", "seed (no idle -> idle)"])
    for w in s["workloads"]:
        for k in kinds:
            a, b = _find(rows, k, w, False, large if k != "direct" else None), _find(
                rows, k, w, True)
            if not a and not b:
                continue
            seed = None
            if k == "direct" and w in SEED:
                seed = f"{SEED[w][0]} -> {SEED[w][1]} ({pct_change(SEED[w][1], SEED[w][0])})"
            elif k == "pgbouncer" and w == "read5000":
                seed = f"{SEED_PGBOUNCER[0]} -> {SEED_PGBOUNCER[1]} (none)"
            t.add(pgbench.workload(w).label, LABELS[k], a and a.get("tps"), b and b.get("tps"),
                  pct_change(b and b.get("tps"), a and a.get("tps")),
                  b and b.get("lat_avg_ms"), seed)
    for k, info in idle_info.items():
        t.notes.append(f"{LABELS[k]}: {info['opened']:,}/{info['requested']:,} idle "
                       f"connections opened in {info['open_seconds']} s, each after reading "
                       f"information_schema; PostgreSQL then had {info['server_conns_after_open']}"
                       f" connections of the role; MemAvailable fell by "
                       f"{info['mem_available_drop_mb']} MB"
                       + (f"; errors {info['errors']}" if info["errors"] else ""))
    t.notes.append("Seed: AWS RDS db.m5.large (2 vCPU, 8 GB), 600 s runs, the custom read at "
                   "scale 5000; PgBouncer allowed 5,000 clients and 200 servers.")
    report.tables.append(t)

    t2 = Table(f"{EXPERIMENT} part 2: pool {small} vs {large}, {s['workloads'][-1]} "
               f"({pgbench.workload(s['workloads'][-1]).label}), {s['clients']} clients, no idle",
               ["target", "pool", "tps", "latency ms", "p99 ms", f"vs pool {large}",
                "pool at its busiest (1 s samples)", "seed"])
    w = s["workloads"][-1]
    for k in kinds:
        if k == "direct":
            continue
        base = _find(rows, k, w, False, large)
        for pool in (large, small) if small != large else (large,):
            r = _find(rows, k, w, False, pool)
            if not r:
                continue
            seed = None
            if k == "pgbouncer" and w == "read5000":
                seed = (f"{SEED_POOL20} (+13 %)" if pool == small else f"{SEED_PGBOUNCER[0]}")
            t2.add(LABELS[k], pool, r.get("tps"), r.get("lat_avg_ms"), r.get("p99_ms"),
                   pct_change(r.get("tps"), base and base.get("tps")) if pool != large else None,
                   pools.describe(r.get("pools")), seed)
    t2.notes.append("Seed SHOW POOLS with the pool of 20: cl_active 20, cl_waiting 80, "
                    "sv_active 20, maxwait_us 125884; with 1,000 idle clients: cl_active 1000, "
                    "sv_idle 1.")
    report.tables.append(t2)

    t3 = Table(f"{EXPERIMENT}: pool samples during the pooled runs with {n:,} idle clients "
               "(busiest of the 1 s samples)", ["target", "workload", "samples", "source", "busiest sample"])
    for r in rows:
        if r["target"] != "direct" and r["idle"] and r.get("pools"):
            t3.add(LABELS[r["target"]], pgbench.workload(r["workload"]).label,
                   r["pools"]["samples"], r["pools"]["source"], pools.describe(r["pools"]))
    if t3.rows:
        if any(r[3] == "server side" for r in t3.rows):
            t3.notes.append("server side = the role's connections as PostgreSQL has them (its "
                            "backends' process titles), used where the pooler's admin console "
                            "does not answer (sluice before its console exists).")
        report.tables.append(t3)


def _figures(report, s, rows):
    n, large, small = s["idle"], s["pool_sizes"][0], s["pool_sizes"][-1]
    groups = [pgbench.workload(w).label for w in s["workloads"]]
    series, vals = [], {}
    for k in [k for k in s["targets"] if any(r["target"] == k for r in rows)]:
        for idle in (False, True):
            name = f"{LABELS[k]}{f', {n:,} idle' if idle else ''}"
            got = False
            for w in s["workloads"]:
                r = _find(rows, k, w, idle, None if idle or k == "direct" else large)
                if r:
                    vals[(pgbench.workload(w).label, name)] = r.get("tps")
                    got = True
            if got:
                series.append(name)
    colors = {}
    shades = {"direct": ("#9ca3af", "#4b5563"), "sluice": ("#5eead4", "#0f766e"),
              "pgbouncer": ("#fcd34d", "#d97706")}
    for name in series:
        kind = next(k for k in shades if name.lower().startswith(LABELS[k].lower()))
        colors[name] = shades[kind][1 if "idle" in name else 0]
    # normalise per workload: the three workloads differ by 10x in TPS
    rel = {}
    for w in s["workloads"]:
        g = pgbench.workload(w).label
        base = vals.get((g, LABELS["direct"]))
        for name in series:
            v = vals.get((g, name))
            rel[(g, name)] = round(v / base * 100, 1) if v and base else None
    panels = [svg.BarPanel("Throughput relative to direct without idle connections",
                           "% of direct, no idle", groups, series, rel, colors=colors)]
    w = s["workloads"][-1]
    pool_groups, pool_vals, pool_series = [], {}, []
    for k in ("sluice", "pgbouncer"):
        for pool in (large, small):
            r = _find(rows, k, w, False, pool)
            if r:
                pool_vals[(LABELS[k], f"pool {pool}")] = r.get("tps")
                if LABELS[k] not in pool_groups:
                    pool_groups.append(LABELS[k])
                if f"pool {pool}" not in pool_series:
                    pool_series.append(f"pool {pool}")
    if pool_vals and len(pool_series) > 1:
        panels.append(svg.BarPanel(f"{pgbench.workload(w).label}: pool {small} vs {large}",
                                   "transactions / s", pool_groups, pool_series, pool_vals,
                                   colors={f"pool {large}": "#94a3b8",
                                           f"pool {small}": "#0f766e"}))
    report.figures.append(svg.Figure(
        name=NAME, title=f"{EXPERIMENT} — idle connections cost a direct PostgreSQL, "
                         "not a pooled one",
        subtitle=f"{s['clients']} pgbench clients, scale {s['scale']}, {s['duration']:g} s per "
                 f"run; {n:,} idle connections that read information_schema",
        panels=panels))
