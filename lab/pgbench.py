"""pgbench runs as the experiments describe them, including the clients that were refused.

The workloads of EXPERIMENTS.md are named here once (TPC-B-like, select-only -S, write-only
-N, and E4's custom read of 5,000 rows).  `run()` wraps pglab.run_pgbench and adds what the
seeds report but pgbench 15 cannot: when clients are refused at connect (past
max_connections, or past Pgpool-II's children), pgbench aborts the whole run with no
numbers.  We then count how many of that many simultaneous clients the target admits, and
run again with only the admitted ones, so the row reads like the seed's "258 TPS, plus FATAL
for the clients over the limit": TPS of the admitted clients, and the refused ones counted.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass

import pglab

from lab import idle
from lab.targets import Target

READ_5000 = """\\set aid random(1, 100000 * :scale - 4999)
SELECT aid, bid, abalance, filler FROM pgbench_accounts WHERE aid BETWEEN :aid AND :aid + 4999;
"""


@dataclass(frozen=True)
class Workload:
    key: str
    label: str
    args: tuple[str, ...] = ()
    script: str | None = None

    def pgbench_args(self, stack, scale: int) -> list[str]:
        args = list(self.args)
        if self.script is not None:
            path = stack.tmp / f"{self.key}.pgbench"
            if not path.exists():
                path.write_text(self.script)
            args += ["-f", str(path), "-s", str(scale)]  # -s sets :scale for custom scripts
        return args


WORKLOADS = {
    "tpcb": Workload("tpcb", "TPC-B-like"),
    "select": Workload("select", "select-only (-S)", ("-S",)),
    "write": Workload("write", "write-only (-N)", ("-N",)),
    "read5000": Workload("read5000", "read 5,000 rows", script=READ_5000),
}


def workload(key: str) -> Workload:
    try:
        return WORKLOADS[key]
    except KeyError:
        raise SystemExit(f"unknown pgbench script {key!r}: one of {', '.join(WORKLOADS)}")


def run(stack, target: Target, wl: Workload, *, clients: int, duration: float, scale: int,
        jobs: int = 2, mode: str = "simple", connect_each: bool = False,
        dbname: str | None = None, latency_log: bool = True, count_refused: bool = True,
        progress=None) -> dict:
    """One pgbench run against target; returns tps, latency, refused clients and the command."""
    extra = wl.pgbench_args(stack, scale)
    if connect_each:
        extra.append("-C")
    db = dbname or target.dbname

    def once(n: int) -> dict:
        return pglab.run_pgbench(
            host=target.host, port=target.port, dbname=db, user=target.user,
            password=target.password, clients=n, duration=duration, mode=mode,
            select_only=False, jobs=jobs, extra_args=extra,
            log_dir=stack.unique("pgbench-log") if latency_log else None,
            timeout=duration + 120)

    res = once(clients)
    out = summarize(res, clients)
    if res["aborted"] and not res["failed_clients_known"] and count_refused:
        if progress:
            progress.detail(f"clients refused: counting how many of {clients} get in")
        time.sleep(0.5)
        probe = idle.probe(target.host, target.port, user=target.user, database=db,
                           n=clients, timeout=10)
        out["refused"] = probe["failed"]
        out["admitted"] = probe["opened"]
        out["refusal"] = Counter(probe["errors"]).most_common(1)[0][0] if probe["errors"] else None
        out["first_run_error"] = res.get("error")
        if 0 < probe["opened"] < clients:
            if progress:
                progress.detail(f"{probe['failed']} refused; running the {probe['opened']} "
                                "admitted clients")
            time.sleep(0.5)
            again = summarize(once(probe["opened"]), probe["opened"])
            for k in ("tps", "lat_avg_ms", "p50_ms", "p99_ms", "transactions", "error",
                      "command", "failed_transactions"):
                out[k] = again.get(k)
            out["rerun_with_admitted"] = True
        elif probe["opened"] == clients:
            # everyone got in on the probe: the refusal was transient; say so, keep tps 0
            out["error"] = f"pgbench aborted ({res.get('error')}) but a probe admitted all"
    return out


def summarize(res: dict, clients: int) -> dict:
    return {
        "clients": clients,
        "tps": res.get("tps"),
        "lat_avg_ms": res.get("lat_avg_ms") or res.get("lat_avg_ms_from_log"),
        "p50_ms": res.get("p50_ms"),
        "p99_ms": res.get("p99_ms"),
        "transactions": res.get("transactions"),
        "failed_transactions": res.get("failed_transactions"),
        "refused": res.get("failed_clients") or 0,
        "admitted": clients - (res.get("failed_clients") or 0),
        "error": res.get("error"),
        "aborted": res.get("aborted"),
        "command": res.get("command"),
        "wall_s": res.get("wall_s"),
    }


def short_reason(text: str | None) -> str | None:
    """The gist of a connection error, e.g. 'remaining connection slots are reserved ...'."""
    if not text:
        return None
    t = text
    for marker in ("FATAL:", "ERROR:", "error:"):
        if marker in t:
            t = t.split(marker, 1)[1]
    return t.strip()[:110]
