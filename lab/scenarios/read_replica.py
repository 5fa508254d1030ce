"""read-replica (E5): send the selects to a streaming replica and both workloads gain.

A primary and a streaming replica; two pgbench at once, write-only (-N) and select-only
(-S), 50 clients each.  Both go through one sluice with the seed's HAProxy-port layout as
[databases] entries: `app` is the leader (port 5000 in the seed) and takes the writes; the
selects use a second entry - `app_reads`, which points at the primary in the first phase
and at the replica in the second (port 5001).  Same pool size for both entries in both
phases, so the only change is where the selects run.  A third phase uses one endpoint:
`app` names both servers (`host=..,.. port=primary,replica route_reads=1`) and both pgbench
connect to it; sluice sends the select-only transactions to the replica by itself.

A replica only adds capacity if it has hardware of its own; the seed's ran on its own VM.
Here everything shares one machine, so the phases run in two layouts: "shared" (both
servers on all cores, as they come) and "a core each" (primary and replica each bound to
one core, standing in for separate machines; pgbench and sluice run anywhere).
"""

from __future__ import annotations

import os
import threading

from lab import options as est
from lab import pgbench, svg
from lab.report import Report, Table, pct_change
from lab.scenarios.common import Context
from lab.stack import Stack
from lab.targets import Skipped, open_target, server

NAME = "read-replica"
EXPERIMENT = "E5"
TITLE = "selects to a streaming replica: write-only and select-only at once"

SEED = {"primary": (82.0, 109.5), "replica": (124.0, 247.6), "routed": (None, None)}
PHASES = (("primary", "both to the primary"), ("replica", "selects to the replica"),
          ("routed", "one endpoint, route_reads"))
LAYOUTS = {"shared": "shared cores", "pinned": "a core each"}


def settings(o) -> dict:
    pin = o.extra.get("pin")
    layouts = ["shared", "pinned"] if pin is None else (["pinned"] if pin else ["shared"])
    if len(_cpus()) < 2:
        layouts = ["shared"]
    return {
        "scale": o.scale or o.pick(10, 150),
        "duration": o.duration or o.pick(5, 30),
        "clients": (o.clients or [50])[0],
        "pool_size": (o.pool_sizes or [20])[0],
        "warmup": o.pick(1, 3),
        "layouts": layouts,
    }


def _cpus() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return [0]


def plan(s):
    steps = [(f"{NAME}: start primary + streaming replica, scale {s['scale']}",
              est.cluster_seconds(s["scale"], replica=True))]
    for layout in s["layouts"]:
        for phase, _ in PHASES:
            steps.append((f"{NAME}: {layout}, {phase} phase warm-up",
                          est.run_seconds(s["warmup"]) + 1))
            steps.append((f"{NAME}: {layout}, -N and -S at once, {phase} phase",
                          est.run_seconds(s["duration"], 2 * s["clients"]) + 1))
    return steps


def run(s, ctx: Context) -> Report:
    report = Report(NAME, TITLE, s)
    results: dict = {}
    with Stack(NAME) as st:
        with ctx.progress.step(f"{NAME}: start primary + streaming replica, scale {s['scale']}"):
            pg = st.cluster(max_connections=200, reserved=3, scale=s["scale"], replica=True,
                            settings={"hot_standby_feedback": "on"})
            st.create_app_role(pg)
            if not pg.replica_port:
                raise Skipped("the testkit started no replica")
        report.data["replica_port"] = pg.replica_port
        for layout in s["layouts"]:
            if layout == "pinned":
                cpus = _cpus()
                if not (st.pin(pg, {cpus[0]}) and st.pin(pg, {cpus[1]}, port=pg.replica_port)):
                    report.skipped["a core each"] = "could not set the servers' CPU affinity"
                    continue
                report.data["pinned_cpus"] = {"primary": cpus[0], "replica": cpus[1]}
            for phase, _ in PHASES:
                reads = server(pg, pg.port if phase == "primary" else pg.replica_port)
                databases = {"app": server(pg), "app_reads": reads}
                if phase == "routed":
                    # One entry for both: the selects find the replica by themselves.
                    both = (f"host={pg.host},{pg.host} port={pg.port},{pg.replica_port} "
                            f"dbname={pg.db} route_reads=1")
                    databases = {"app": both, "app_reads": both}
                with open_target(st, "sluice", pg, pool_size=s["pool_size"],
                                 databases=databases) as t:
                    report.data.setdefault("configs", {})[phase] = t.config
                    with ctx.progress.step(f"{NAME}: {layout}, {phase} phase warm-up"):
                        _both(st, t, s, s["warmup"], log=False)
                    with ctx.progress.step(f"{NAME}: {layout}, -N and -S at once, {phase} phase"):
                        results.setdefault(layout, {})[phase] = _both(st, t, s, s["duration"],
                                                                      log=True)
    report.data["results"] = results
    render(report)
    return report


def render(report: Report) -> None:
    """Table, headline and figure from report.settings and report.data."""
    _table(report, report.settings, report.data["results"])
    _figure(report, report.settings, report.data["results"])


def _both(st, t, s, duration, log):
    """-N against app and -S against app_reads, started together; returns both results."""
    out = {}

    def go(key, wl, db):
        out[key] = pgbench.run(st, t, pgbench.workload(wl), clients=s["clients"],
                               duration=duration, scale=s["scale"], dbname=db, latency_log=log)
    threads = [threading.Thread(target=go, args=("write", "write", "app")),
               threading.Thread(target=go, args=("select", "select", "app_reads"))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=duration + 180)
    return out


def _tps(results, layout, phase, kind):
    return results.get(layout, {}).get(phase, {}).get(kind, {}).get("tps")


def _table(report, s, results):
    t = Table(f"{EXPERIMENT}: two pgbench at once, {s['clients']} clients each, "
              f"{s['duration']:g} s, scale {s['scale']}, through sluice (transaction pool "
              f"{s['pool_size']} per entry)",
              ["servers on", "routing", "write-only tps", "select-only tps", "write lat ms",
               "select lat ms", "seed write", "seed select"])
    for layout, phases in results.items():
        for phase, label in PHASES:
            r = phases.get(phase, {})
            w, sel = r.get("write", {}), r.get("select", {})
            seed_w, seed_s = SEED[phase]
            t.add(LAYOUTS[layout], label, w.get("tps"), sel.get("tps"), w.get("lat_avg_ms"),
                  sel.get("lat_avg_ms"), seed_w, seed_s)
        gw = pct_change(_tps(results, layout, "replica", "write"),
                        _tps(results, layout, "primary", "write"))
        gs = pct_change(_tps(results, layout, "replica", "select"),
                        _tps(results, layout, "primary", "select"))
        t.add(LAYOUTS[layout], "gain", gw, gs, None, None, "+51 %", "+126 %")
        rw = pct_change(_tps(results, layout, "routed", "write"),
                        _tps(results, layout, "primary", "write"))
        rs = pct_change(_tps(results, layout, "routed", "select"),
                        _tps(results, layout, "primary", "select"))
        if rw or rs:
            t.add(LAYOUTS[layout], "gain, one endpoint", rw, rs, None, None, None, None)
    errors = {f"{lay}/{ph}/{k}": v.get("error") for lay, phases in results.items()
              for ph, d in phases.items() for k, v in d.items() if v.get("error")}
    for where, e in errors.items():
        t.notes.append(f"{where}: {pgbench.short_reason(e)}")
    if "pinned" in results:
        cpus = report.data.get("pinned_cpus", {})
        t.notes.append(f"a core each: primary bound to CPU {cpus.get('primary')}, replica to CPU "
                       f"{cpus.get('replica')} (sched_setaffinity), like the seed's separate "
                       "VMs; pgbench and sluice run on any core.")
    t.notes.append("Seed: Patroni, 3 VMs of 2 GB (data larger than memory), synchronous "
                   "replication, HAProxy ports 5000/5001, 600 s; here one machine and the data "
                   "fits in memory.")
    report.tables.append(t)
    parts = []
    for layout in results:
        gw = pct_change(_tps(results, layout, "replica", "write"),
                        _tps(results, layout, "primary", "write"))
        gs = pct_change(_tps(results, layout, "replica", "select"),
                        _tps(results, layout, "primary", "select"))
        if gw and gs:
            parts.append(f"with {LAYOUTS[layout]} write-only {gw}, select-only {gs}")
        rw = pct_change(_tps(results, layout, "routed", "write"),
                        _tps(results, layout, "primary", "write"))
        rs = pct_change(_tps(results, layout, "routed", "select"),
                        _tps(results, layout, "primary", "select"))
        if rw and rs:
            parts.append(f"through one endpoint with route_reads ({LAYOUTS[layout]}) "
                         f"write-only {rw}, select-only {rs}")
    if parts:
        report.notes.append("=> Sending the selects to the replica: " + "; ".join(parts)
                            + " (seed: +51 % and +126 %). A replica adds capacity only when it "
                            "has CPU of its own.")


def _figure(report, s, results):
    groups, series = [], [label for _, label in PHASES]
    vals, lat = {}, {}
    for layout in results:
        for kind, name in (("write", "write-only"), ("select", "select-only")):
            g = f"{name}\n{LAYOUTS[layout]}"
            groups.append(g)
            for phase, label in PHASES:
                r = results[layout].get(phase, {}).get(kind, {})
                vals[(g, label)] = r.get("tps")
                lat[(g, label)] = r.get("lat_avg_ms")
    # writes and selects differ ~8x in TPS: show each as a share of its "both to the
    # primary" value, so both gains are visible on one axis
    rel = {}
    for g in groups:
        base = vals.get((g, series[0]))
        for label in series:
            v = vals.get((g, label))
            rel[(g, label)] = round(v / base * 100, 1) if v and base else None
    colors = {series[0]: "#94a3b8", series[1]: "#0f766e", series[2]: "#2563eb"}
    report.figures.append(svg.Figure(
        name=NAME, title=f"{EXPERIMENT} — selects to a replica help when it has a core of its own",
        subtitle=f"-N and -S at once, {s['clients']} + {s['clients']} clients, scale "
                 f"{s['scale']}, {s['duration']:g} s, through sluice (pool {s['pool_size']} per "
                 "entry); seed: +51 % writes, +126 % selects",
        panels=[svg.BarPanel("Throughput, % of 'both to the primary'", "% of both to primary",
                             groups, series, rel, colors=colors),
                svg.BarPanel("Throughput", "transactions / s", groups, series, vals,
                             colors=colors)]))
