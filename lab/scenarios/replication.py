"""replication-throughput (E2): how fast can followers keep up? Sustainable TPS per client count.

pgbench TPC-B-like on the primary at 1...32 clients while a streaming replica follows (and,
in full mode, a native logical-replication subscriber, the built-in successor of the seed's
pglogical).  After each run we wait until each follower has replayed the primary's last WAL
position (lab/replication.py) and apply the seed's formula:
    sustainable TPS = transactions run on the primary / (run time + time to catch up)
A follower that keeps up has sustainable TPS = TPS; one that falls behind caps it.
"""

from __future__ import annotations

import time

from lab import options as est
from lab import pgbench, replication, svg
from lab.report import Report, Table
from lab.scenarios.common import Context
from lab.stack import Stack
from lab.targets import Skipped, open_target

NAME = "replication-throughput"
EXPERIMENT = "E2"
TITLE = "sustainable TPS: pgbench on the primary while a streaming (and logical) follower keeps up"

SEED = {1: (1075, 1052), 2: (2118, 2048), 4: (3894, 3820), 8: (6506, 6442),
        16: (9570, 8251), 24: (11388, 7728), 32: (12384, 7818)}  # streaming, pglogical


def settings(o) -> dict:
    return {
        "scale": o.scale or o.pick(10, 50),
        "duration": o.duration or o.pick(3, 15),
        "clients": o.clients or o.pick([1, 4, 16], [1, 2, 4, 8, 16, 24, 32]),
        "logical": bool(o.extra.get("logical", not o.quick)),
        "catchup_timeout": o.pick(60, 180),
    }


def plan(s):
    steps = [(f"{NAME}: start primary + streaming replica, scale {s['scale']}",
              est.cluster_seconds(s["scale"], replica=True))]
    if s["logical"]:
        steps.append((f"{NAME}: logical subscriber, initial copy", 4 + 0.5 * s["scale"]))
    for c in s["clients"]:
        steps.append((f"{NAME}: {c} clients", est.run_seconds(s["duration"], c)
                      + (3 if s["logical"] else 1)))
    return steps


def run(s, ctx: Context) -> Report:
    report = Report(NAME, TITLE, s)
    rows = []
    with Stack(NAME) as st:
        with ctx.progress.step(f"{NAME}: start primary + streaming replica, scale {s['scale']}"):
            # async commit (the testkit's default): the WAL writer's delay would add up to
            # 200 ms to every catch-up time, so it wakes every 10 ms here
            sets = {"wal_writer_delay": "10ms"}
            if s["logical"]:
                sets["wal_level"] = "logical"
            pg = st.cluster(max_connections=100, reserved=3, scale=s["scale"], replica=True,
                            settings=sets)
            if not pg.replica_port:
                raise Skipped("the testkit started no replica")
        readers = {"streaming": lambda: replication.replica_replay_lsn(st, pg)}
        if s["logical"]:
            with ctx.progress.step(f"{NAME}: logical subscriber, initial copy"):
                sub = st.cluster(max_connections=50, reserved=3, tag="subscriber",
                                 settings={"wal_receiver_status_interval": "1"})
                copy_s = replication.setup_subscriber(st, pg, sub, s["scale"],
                                                      progress=ctx.progress)
                report.data["logical_initial_copy_s"] = copy_s
            readers["logical"] = lambda: replication.subscriber_lsn(st, pg)
        with open_target(st, "direct", pg) as t:
            t.user, t.password = pg.superuser, pg.password
            for c in s["clients"]:
                with ctx.progress.step(f"{NAME}: {c} clients"):
                    rows.append(_one(st, pg, t, s, c, readers, ctx))
    report.data["runs"] = rows
    render(report)
    return report


def render(report: Report) -> None:
    """Table, headline and figure from report.settings and report.data."""
    s, rows = report.settings, report.data["runs"]
    _table(report, s, rows)
    _figure(report, s, rows)
    report.notes.append(_headline(s, rows))


def _headline(s, rows) -> str:
    parts = []
    for name in ["streaming"] + (["logical"] if s["logical"] else []):
        lags = [r.get(f"{name}_lag_s") for r in rows]
        if any(x is None for x in lags):
            parts.append(f"the {name} follower did not catch up within "
                         f"{s['catchup_timeout']} s after some runs")
            continue
        worst = max(rows, key=lambda r: r["tps"] - (r.get(f"{name}_sustainable") or 0))
        parts.append(f"{name} caught up within {max(lags):.2f} s of every run "
                     f"(sustainable {worst.get(f'{name}_sustainable'):,.0f} vs "
                     f"{worst['tps']:,.0f} TPS at {worst['clients']} clients)")
    best = max(rows, key=lambda r: r["tps"] or 0)
    n = best["clients"]
    return (f"=> {'; '.join(parts)}. The primary peaked at {best['tps']:,.0f} TPS with "
            f"{n} client{'s' if n != 1 else ''}.")


def _one(st, pg, t, s, clients, readers, ctx) -> dict:
    # start from a caught-up state
    replication.wait_caught_up(readers, replication.primary_lsn(st, pg),
                               started=time.monotonic(), timeout=s["catchup_timeout"])
    lsn0 = replication.primary_lsn(st, pg)
    res = pgbench.run(st, t, pgbench.workload("tpcb"), clients=clients,
                      duration=s["duration"], scale=s["scale"], latency_log=False)
    ended = time.monotonic()
    lsn1 = replication.primary_lsn(st, pg)
    ctx.progress.detail("waiting for the followers to catch up")
    lag = replication.wait_caught_up(readers, lsn1, started=ended, timeout=s["catchup_timeout"])
    row = {"clients": clients, "tps": res.get("tps"), "transactions": res.get("transactions"),
           "lat_avg_ms": res.get("lat_avg_ms"), "error": res.get("error"),
           "wal_bytes": lsn1 - lsn0, "duration": s["duration"]}
    tx = res.get("transactions") or 0
    for name in readers:
        behind = lag.get(name)
        row[f"{name}_lag_s"] = behind
        if behind is None:
            # did not catch up within the timeout: an upper bound only
            row[f"{name}_sustainable"] = None
            row[f"{name}_behind_bytes"] = lag.get(name + "_behind_bytes")
        else:
            row[f"{name}_sustainable"] = round(tx / (s["duration"] + behind), 1) if tx else None
    return row


def _table(report, s, rows):
    names = ["streaming"] + (["logical"] if s["logical"] else [])
    cols = ["clients", "primary tps", "WAL MB/s"]
    for n in names:
        cols += [f"{n} lag s", f"{n} sustainable"]
    cols += ["seed streaming", "seed pglogical"]
    t = Table(f"{EXPERIMENT}: pgbench TPC-B-like on the primary, {s['duration']:g} s per client "
              f"count, scale {s['scale']}; sustainable TPS = transactions / (run time + time "
              "until the follower replayed the last WAL position)", cols)
    for r in rows:
        cells = [r["clients"], r["tps"],
                 round(r["wal_bytes"] / r["duration"] / 1e6, 1) if r.get("wal_bytes") else None]
        for n in names:
            lag = r.get(f"{n}_lag_s")
            cells += [lag if lag is not None else f">{s['catchup_timeout']}",
                      r.get(f"{n}_sustainable")]
        seed = SEED.get(r["clients"], (None, None))
        cells += list(seed)
        t.add(*cells)
    t.notes.append("Seed: two AWS i2.4xlarge, PostgreSQL 9.5, scale 5000, pglogical (we use "
                   "built-in logical replication); here primary, followers and pgbench share "
                   "2 cores.")
    if not s["logical"]:
        t.notes.append("Quick mode follows with the streaming replica only; the full mode adds "
                       "a logical-replication subscriber.")
    report.tables.append(t)


def _figure(report, s, rows):
    series = [svg.Series("primary (pgbench)", [(r["clients"], r["tps"]) for r in rows],
                         color="#6b7280"),
              svg.Series("streaming: sustainable", [(r["clients"], r.get("streaming_sustainable"))
                                                    for r in rows], color="#0f766e")]
    if s["logical"]:
        series.append(svg.Series("logical: sustainable",
                                 [(r["clients"], r.get("logical_sustainable")) for r in rows],
                                 color="#d97706"))
    lag = [svg.Series("streaming", [(r["clients"], r.get("streaming_lag_s")) for r in rows],
                      color="#0f766e")]
    if s["logical"]:
        lag.append(svg.Series("logical", [(r["clients"], r.get("logical_lag_s")) for r in rows],
                              color="#d97706"))
    seed = [svg.Series("seed: streaming", [(c, v[0]) for c, v in SEED.items()], color="#0f766e",
                       dashed=True),
            svg.Series("seed: pglogical", [(c, v[1]) for c, v in SEED.items()], color="#d97706",
                       dashed=True)]
    report.figures.append(svg.Figure(
        name=NAME, title=f"{EXPERIMENT} — sustainable throughput of the followers",
        subtitle=f"pgbench TPC-B-like on the primary, scale {s['scale']}, {s['duration']:g} s "
                 "per point; sustainable = transactions / (run + catch-up)",
        panels=[svg.LinePanel("Here: TPS on the primary and what followers sustain",
                              "clients", "transactions / s", series, log_x=True),
                svg.LinePanel("Catch-up time after each run", "clients", "seconds", lag,
                              log_x=True),
                svg.LinePanel("Seed (i2.4xlarge, scale 5000)", "clients", "transactions / s",
                              seed, log_x=True)],
        columns=3))
