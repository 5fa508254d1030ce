"""Samples of what the pool looks like during a run (E4's `SHOW POOLS` observations).

E4 reads PgBouncer's `SHOW POOLS` mid-run: `cl_active 1000, sv_idle 1` (idle clients hold no
server) and `cl_active 20, cl_waiting 80, sv_active 20` with a pool of 20.  A `PoolSampler`
thread takes such a sample every second while pgbench runs:
  * from the pooler's admin console (virtual database `pgbouncer`) when it answers - always
    for PgBouncer, for sluice once its console exists;
  * otherwise from PostgreSQL's side: the role's server connections by state, read from the
    backends' process titles (or pg_stat_activity), and every sample says which source it
    came from.  Nothing is invented: a console
    that does not answer yields no console rows.
"""

from __future__ import annotations

import csv
import io
import os
import subprocess
import threading
import time
from pathlib import Path

import pglab

from lab.stack import APP_ROLE, Cluster, Stack
from lab.targets import Target

CONSOLE_FIELDS = ("cl_active", "cl_waiting", "sv_active", "sv_idle", "sv_used", "maxwait",
                  "maxwait_us")


def show_pools(target: Target, cluster: Cluster, timeout: float = 5) -> list[dict] | None:
    """SHOW POOLS rows from the target's admin console, or None if it does not answer."""
    if target.kind not in ("sluice", "pgbouncer"):
        return None
    env = dict(os.environ, PGPASSWORD=cluster.password, PGCONNECT_TIMEOUT="3")
    try:
        r = subprocess.run([pglab.pg_bin("psql"), "-X", "-q", "--csv", "-h", target.host,
                            "-p", str(target.port), "-U", cluster.superuser, "-d", "pgbouncer",
                            "-c", "SHOW POOLS"], capture_output=True, text=True,
                           timeout=timeout, env=env)
    except (OSError, subprocess.SubprocessError):
        return None
    if r.returncode != 0 or not r.stdout.strip():
        return None
    return list(csv.DictReader(io.StringIO(r.stdout)))


def server_side(stack: Stack, cluster: Cluster, role: str = APP_ROLE) -> dict | None:
    """The role's server connections by state, as PostgreSQL sees them.  Read from the
    backends' process titles when possible: a query would need a connection of its own, and
    at the max_connections wall (E1) even a superuser's connection takes one of the slots the
    clients are fighting for.  pg_stat_activity otherwise."""
    counts = backend_titles(cluster, role)
    if counts is not None:
        return counts
    try:
        out = stack.sql(cluster, "SELECT coalesce(state, '?'), count(*) FROM pg_stat_activity "
                        f"WHERE backend_type = 'client backend' AND usename = '{role}' "
                        "GROUP BY 1", timeout=5)
    except (pglab.LabError, subprocess.SubprocessError):
        return None
    counts = {"active": 0, "idle": 0, "idle in transaction": 0}
    for line in out.splitlines():
        state, _, n = line.rpartition("|")
        counts[state] = counts.get(state, 0) + int(n)
    counts["total"] = sum(v for k, v in counts.items())
    counts["via"] = "pg_stat_activity"
    return counts


def _postmaster_pid(cluster: Cluster) -> int | None:
    try:
        return int(Path(cluster.data_dir, "postmaster.pid").read_text().split("\n", 1)[0])
    except (OSError, ValueError, TypeError):
        return None


def backend_titles(cluster: Cluster, role: str = APP_ROLE) -> dict | None:
    """Count the role's backends by state from /proc: children of the cluster's postmaster
    whose title is "postgres: ROLE DB HOST(PORT) STATE"."""
    pm = _postmaster_pid(cluster)
    if pm is None:
        return None
    counts = {"active": 0, "idle": 0, "idle in transaction": 0}
    prefix = f"postgres: {role} "
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path("/proc", d, "stat").read_text()
            if int(stat[stat.rindex(")") + 2:].split()[1]) != pm:
                continue
            title = Path("/proc", d, "cmdline").read_bytes().replace(b"\0", b" ").decode(
                errors="replace").strip()
        except (OSError, ValueError, IndexError):
            continue
        if not title.startswith(prefix):
            continue
        state = title.split(")", 1)[1].strip() if ")" in title else ""
        if state.startswith("idle in transaction"):
            counts["idle in transaction"] += 1
        elif state == "idle":
            counts["idle"] += 1
        else:
            counts["active"] += 1
    counts["total"] = sum(counts.values())
    counts["via"] = "backend process titles"
    return counts


class PoolSampler:
    """Background sampling (1 s) during one run; `stop()` returns the samples."""

    def __init__(self, stack: Stack, target: Target, cluster: Cluster, *,
                 interval: float = 1.0, dbname: str | None = None, console: bool = True):
        self.stack, self.target, self.cluster = stack, target, cluster
        self.interval = interval
        self.dbname = dbname or target.dbname
        self.samples: list[dict] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="lab-pools", daemon=True)
        self.console = console and show_pools(target, cluster) is not None

    def __enter__(self) -> "PoolSampler":
        self._t0 = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> list[dict]:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=15)
        return self.samples

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            t = round(time.monotonic() - self._t0, 1)
            if self.console:
                rows = show_pools(self.target, self.cluster) or []
                mine = [r for r in rows if r.get("database") == self.dbname]
                if mine:  # no row yet: the pool is created by its first client
                    row = {k: _int(mine[0].get(k)) for k in CONSOLE_FIELDS if k in mine[0]}
                    self.samples.append({"t": t, "source": "SHOW POOLS", **row})
                    continue
            counts = server_side(self.stack, self.cluster)
            if counts is not None:
                self.samples.append({"t": t, "source": "server side", **counts})


def _int(v):
    try:
        return int(v)
    except (TypeError, ValueError):
        return v


def summarize(samples: list[dict]) -> dict | None:
    """The busiest sample of a run (most clients served and waiting) - one real moment, not
    a mix of per-field maxima - plus the longest wait seen."""
    if not samples:
        return None

    def load(x):
        if x["source"] == "SHOW POOLS":
            return (_num(x.get("sv_active")) + _num(x.get("cl_waiting")), _num(x.get("cl_active")))
        return (_num(x.get("active")) + _num(x.get("idle in transaction")), _num(x.get("total")))
    busiest = max(samples, key=load)
    peak = {k: v for k, v in busiest.items() if k not in ("t", "source", "via")}
    waits = [_num(x.get("maxwait")) * 1_000_000 + _num(x.get("maxwait_us")) for x in samples
             if "maxwait_us" in x]
    return {"source": busiest["source"], "via": busiest.get("via"), "samples": len(samples),
            "at_s": busiest.get("t"), "peak": peak, "max_wait_us": max(waits) if waits else None}


def _num(v) -> int:
    return v if isinstance(v, int) else 0


def describe(summary: dict | None) -> str:
    if not summary:
        return "-"
    p = summary["peak"]
    if summary["source"] == "SHOW POOLS":
        return (f"cl_active {p.get('cl_active')}, cl_waiting {p.get('cl_waiting')}, "
                f"sv_active {p.get('sv_active')}, sv_idle {p.get('sv_idle')}; longest wait "
                f"{(summary.get('max_wait_us') or 0) / 1000:,.0f} ms")
    return (f"server conns {p.get('total')} (active {p.get('active')}, idle {p.get('idle')}, "
            f"idle in tx {p.get('idle in transaction')})")
