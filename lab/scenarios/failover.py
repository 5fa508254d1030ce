"""failover: TPS second by second through a Patroni switchover, via sluice and via HAProxy.

E5's seed ran Patroni + etcd with HAProxy in front (a port for the leader, one for the
replicas); the lesson it draws is that one endpoint should follow the leader when it changes.
This scenario changes the leader under load and shows what the clients see.  A two-node
Patroni cluster (lab/patroni.py: etcd and Patroni from Debian's packages, in the temp dir) is
switched over while two pgbench run at once: writers (`-N`, 16 clients, `-R 200`) and readers
(`-S`, 8 clients, `-R 2000`), `-P 1`.

  * sluice: one [databases] entry naming both servers with `route_reads=1` and `patroni=`
    (the REST URLs), `failover_hold = 15`; both pgbench connect to it.
  * HAProxy (lab/haproxy.py): the seed's layout, writers to the port checked with
    `GET /primary`, readers to the port checked with `GET /replica`.

Both targets run on the same cluster, one after the other; the switchover is requested at a
third of the run and goes the other way for the second target.  pgbench does not reconnect:
a client whose connection dies is aborted for the rest of the run.  The table counts them,
and the longest stretch of seconds without a write (or a read) after the switchover.

TPS per second and the pauses come from pgbench's per-transaction log (`-l`: each
transaction's completion time, one file per thread) rather than its progress lines: pgbench
prints progress from thread 0 only, so the lines stop when thread 0's clients have all aborted
while thread 1's go on, and a pause shorter than a second hides in one-second buckets.  The
pause is the longest time without a completed transaction after the switchover was requested.
pgbench's error lines are timestamped as they arrive, which places each aborted client.
"""

from __future__ import annotations

import csv
import io
import math
import os
import re
import subprocess
import threading
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import pglab
from pglab import LabError

from lab import haproxy, patroni, svg
from lab import options as est
from lab.report import Report, Table
from lab.scenarios.common import Context
from lab.stack import Stack
from lab.targets import LABELS, available, pooler_ini

NAME = "failover"
EXPERIMENT = "E5+"
TITLE = "TPS through a Patroni switchover: sluice and HAProxy"
USES_TESTKIT = False      # the clusters are Patroni's

WRITERS, READERS = 16, 8
WRITE_RATE, READ_RATE = 200, 2000
FAILOVER_HOLD = 15
KINDS = ("sluice", "haproxy")


def settings(o) -> dict:
    return {
        "scale": o.scale or o.pick(2, 10),
        "duration": int(o.duration or o.pick(20, 60)),
        "pool_size": (o.pool_sizes or [20])[0],
        "targets": [k for k in o.targets_or(list(KINDS)) if k in KINDS],
        "writers": WRITERS, "readers": READERS,
        "write_rate": WRITE_RATE, "read_rate": READ_RATE,
        "failover_hold": FAILOVER_HOLD,
    }


def plan(s):
    steps = [(f"{NAME}: start etcd + 2 Patroni nodes, pgbench -i -s {s['scale']}",
              8 + est.cluster_seconds(s["scale"]))]
    for kind in s["targets"]:
        # start the target and wait for it to see the cluster, the run, the roles settling
        steps.append((_step(kind, s), 4 + est.run_seconds(s["duration"], WRITERS + READERS)))
    return steps


def _step(kind, s) -> str:
    return (f"{NAME}: through {LABELS[kind]}, -N and -S for {s['duration']} s, switchover "
            f"at {s['duration'] / 3:.0f} s")


def run(s, ctx: Context) -> Report:
    report = Report(NAME, TITLE, s)
    results: dict = {}
    report.data["results"] = results
    why = patroni.available()
    if why:
        report.skipped["failover (every target)"] = why
        ctx.progress.note(f"skipped {NAME}: {why}")
        render(report)
        return report
    kinds = []
    for kind in s["targets"]:
        why = available(kind)
        if why:
            report.skipped[LABELS[kind]] = why
            ctx.progress.note(f"skipped {LABELS[kind]}: {why}")
        else:
            kinds.append(kind)
    if not kinds:
        render(report)
        return report
    with Stack(NAME) as st:
        pc = patroni.PatroniCluster(st, nodes=2)
        with ctx.progress.step(plan(s)[0][0]):
            pc.start()
            leader = pc.leader()
            if leader is None:
                raise LabError("the Patroni cluster has no single leader")
            st.pgbench_init(pc.cluster(leader), s["scale"])
        report.data["patroni"] = {"nodes": {n.name: {"pg_port": n.pg_port,
                                                     "rest_port": n.rest_port}
                                            for n in pc.nodes},
                                  "config": pc.nodes[0].yml.read_text()}
        for kind in kinds:
            label = LABELS[kind]
            leader = _settled_leader(pc)
            candidate = 1 - leader
            with ctx.progress.step(_step(kind, s)):
                try:
                    opener = _sluice if kind == "sluice" else _haproxy
                    with opener(st, pc, s, leader) as ends:
                        report.data.setdefault("targets", {})[kind] = {
                            "describe": ends["describe"], "config": ends["config"]}
                        results[kind] = _run_both(st, pc, ends, s, leader, candidate, ctx)
                        if ends.get("log_tail"):
                            results[kind]["log_tail"] = ends["log_tail"]()
                except _TargetSkipped as e:
                    report.skipped[label] = str(e)
                    ctx.progress.note(f"skipped {label}: {e}")
    render(report)
    return report


class _TargetSkipped(Exception):
    pass


def _settled_leader(pc, timeout: float = 60) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        leader = pc.leader()
        if leader is not None:
            pc.wait_settled(leader, timeout=max(1.0, deadline - time.monotonic()))
            return leader
        time.sleep(0.5)
    raise LabError(f"the Patroni cluster has no single leader after {timeout:.0f}s")


# ---------------------------------------------------------------------------- targets

@contextmanager
def _sluice(st: Stack, pc, s, leader):
    """sluice with one entry naming both servers, route_reads and Patroni's REST API."""
    nodes = pc.nodes
    entry = (f"host={','.join('127.0.0.1' for _ in nodes)} "
             f"port={','.join(str(n.pg_port) for n in nodes)} dbname=postgres route_reads=1 "
             f"patroni={','.join(n.rest_url for n in nodes)}")
    auth_file = st.lab.write("userlist.txt", pglab.userlist(
        {patroni.SUPERUSER: patroni.SUPERUSER_PASSWORD}))

    def ini(port, logfile):
        return (pooler_ini(listen_port=port, logfile=logfile, auth_file=auth_file,
                           databases={"app": entry}, pool_size=s["pool_size"])
                + f"\n[sluice]\nfailover_hold = {s['failover_hold']}\n")
    proxy = st.lab.start_proxy("sluice", ini)
    try:
        _wait_sluice_hosts(proxy.port, nodes[leader].pg_port, proxy)
        yield {"writers": (proxy.port, "app"), "readers": (proxy.port, "app"),
               "describe": f"one entry, route_reads=1, patroni=, pool_mode=transaction, "
                           f"default_pool_size={s['pool_size']}, failover_hold="
                           f"{s['failover_hold']}",
               "config": proxy.ini.read_text(), "log_tail": lambda: proxy.log_tail(30)}
    finally:
        pglab.stop_process(proxy.proc)


def show_hosts(port: int, timeout: float = 5) -> list[dict] | None:
    env = dict(os.environ, PGPASSWORD=patroni.SUPERUSER_PASSWORD, PGCONNECT_TIMEOUT="3")
    try:
        r = subprocess.run([pglab.pg_bin("psql"), "-X", "-q", "--csv", "-h", "127.0.0.1",
                            "-p", str(port), "-U", patroni.SUPERUSER, "-d", "pgbouncer",
                            "-c", "SHOW HOSTS"], capture_output=True, text=True,
                           timeout=timeout, env=env)
    except (OSError, subprocess.SubprocessError):
        return None
    if r.returncode != 0:
        return None
    return list(csv.DictReader(io.StringIO(r.stdout)))


def _wait_sluice_hosts(port: int, primary_port: int, proxy, timeout: float = 30) -> None:
    """Until sluice's checks agree with Patroni: the leader primary, the other a replica.
    sluice starts checking an entry's hosts when its first client arrives: one `SELECT 1`
    first.  (Not "caught up": a replica of an idle primary may stay a few bytes behind.)"""
    env = dict(os.environ, PGPASSWORD=patroni.SUPERUSER_PASSWORD, PGCONNECT_TIMEOUT="10")
    r = subprocess.run([pglab.pg_bin("psql"), "-X", "-q", "-At", "-h", "127.0.0.1", "-p",
                        str(port), "-U", patroni.SUPERUSER, "-d", "app", "-c", "SELECT 1"],
                       capture_output=True, text=True, timeout=timeout, env=env)
    if r.returncode != 0:
        raise LabError(f"a first query through sluice failed: {r.stderr.strip()}")
    deadline = time.monotonic() + timeout
    rows = None
    while time.monotonic() < deadline:
        if not proxy.alive():
            raise LabError(f"sluice exited with code {proxy.proc.returncode}:\n"
                           f"{proxy.log_tail()}")
        rows = show_hosts(port)
        if rows and all(
                (r.get("role") == "primary" and r.get("state") == "up"
                 and r.get("patroni_role") == "leader")
                if r.get("port") == str(primary_port) else
                (r.get("role") == "replica" and r.get("state") == "up")
                for r in rows):
            return
        time.sleep(0.2)
    raise LabError(f"sluice's SHOW HOSTS did not settle within {timeout:.0f}s: {rows}")


@contextmanager
def _haproxy(st: Stack, pc, s, leader):
    try:
        hp = haproxy.start(st, pc)
    except LabError as e:
        raise _TargetSkipped(f"HAProxy did not start: {e}") from e
    try:
        hp.wait_checks(pc.nodes[leader].name,
                       {n.name for i, n in enumerate(pc.nodes) if i != leader})
        yield {"writers": (hp.write_port, "postgres"), "readers": (hp.read_port, "postgres"),
               "describe": "writes: GET /primary, reads: GET /replica; inter 1s fall 2 rise 1 "
                           "on-marked-down shutdown-sessions",
               "config": hp.config}
    finally:
        pglab.stop_process(hp.proc)


# ---------------------------------------------------------------------------- the run

_ABORTED = re.compile(r"client (\d+) (?:script \d+ )?aborted(?:[^:]*: ?)?(.*)")


def _pgbench_cmd(port, db, args, logdir: Path, s) -> list[str]:
    return [pglab.pg_bin("pgbench"), "-h", "127.0.0.1", "-p", str(port), "-U",
            patroni.SUPERUSER, *args, "-T", str(s["duration"]), "-P", "1", "-l",
            f"--log-prefix={logdir / 'pgb'}", db]


def _run_both(st, pc, ends, s, leader, candidate, ctx) -> dict:
    """Writers and readers at once; the switchover at a third of the run."""
    env = dict(os.environ, PGPASSWORD=patroni.SUPERUSER_PASSWORD, PGCONNECT_TIMEOUT="10",
               PGAPPNAME="pgbench")
    jobs = ctx.options.jobs
    specs = {
        "writes": (ends["writers"], ["-n", "-N", "-c", str(s["writers"]), "-j", str(jobs),
                                     "-R", str(s["write_rate"])]),
        "reads": (ends["readers"], ["-n", "-S", "-c", str(s["readers"]), "-j", str(jobs),
                                    "-R", str(s["read_rate"])]),
    }
    lines: dict[str, list[tuple[float, str]]] = {k: [] for k in specs}
    ended: dict[str, float] = {}
    procs, readers, cmds, logdirs = {}, [], {}, {}
    epoch0, t0 = time.time(), time.monotonic()
    for key, ((port, db), args) in specs.items():
        logdirs[key] = st.unique(f"pgbench-{key}")
        logdirs[key].mkdir()
        cmds[key] = _pgbench_cmd(port, db, args, logdirs[key], s)
        procs[key] = st.lab.spawn(f"pgbench {key}", cmds[key], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env,
                                  cwd=str(logdirs[key]))
        th = threading.Thread(target=_collect, args=(procs[key].stderr, lines[key], ended, key),
                              daemon=True)
        th.start()
        readers.append(th)
    time.sleep(max(0.0, t0 + s["duration"] / 3 - time.monotonic()))
    ctx.progress.detail(f"switchover {pc.nodes[leader].name} -> {pc.nodes[candidate].name}")
    try:
        switch = pc.switchover(leader, candidate, t0, timeout=60)
    except LabError as e:
        switch = {"from": pc.nodes[leader].name, "to": pc.nodes[candidate].name,
                  "error": str(e)[:2000]}
        ctx.progress.note(f"switchover failed: {e}")
    ctx.progress.detail("")
    for key, proc in procs.items():
        try:
            proc.wait(timeout=max(5.0, t0 + s["duration"] + 60 - time.monotonic()))
        except subprocess.TimeoutExpired:
            pglab.stop_process(proc, first_signal=2)
    for th in readers:
        th.join(timeout=10)
    out = {"switch": switch, "origin_epoch": epoch0}
    for key in specs:
        done = _completions(logdirs[key], epoch0)
        end = round(ended.get(key, time.time()) - epoch0, 2)
        out[key] = {
            "clients": s["writers"] if key == "writes" else s["readers"],
            "command": " ".join(cmds[key]),
            "rc": procs[key].returncode,
            "ended_s": end,
            "transactions": len(done),
            "tps": _per_second(done),
            **_gaps(done, switch.get("requested_s", s["duration"] / 3),
                    min(end, float(s["duration"]))),
            **_aborts(lines[key], epoch0),
            "progress": _progress(lines[key]),
            "stderr_tail": [l for _, l in lines[key] if not l.startswith("progress:")][-8:],
            "exit_error": _exit_error(lines[key]),
        }
    return out


def _collect(stream, into: list, ended: dict, key: str) -> None:
    """Each stderr line of a pgbench with its arrival time (epoch seconds); the time the
    stream closed is (about) when pgbench exited."""
    for raw in iter(stream.readline, b""):
        into.append((time.time(), raw.decode(errors="replace").rstrip()))
    ended[key] = time.time()
    stream.close()


def _completions(logdir: Path, epoch0: float) -> list[float]:
    """Completion times (seconds since epoch0, sorted) of the transactions in pgbench's
    per-transaction logs (client, transaction, latency us, script, epoch s, us [, lag]);
    failed and skipped ones have no latency and are left out."""
    out = []
    for f in sorted(logdir.glob("pgb*")):
        try:
            text = f.read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            parts = line.split()
            if len(parts) < 6:
                continue
            try:
                int(parts[2])
                out.append(int(parts[4]) - epoch0 + int(parts[5]) / 1e6)
            except ValueError:
                continue
    out.sort()
    return out


def _per_second(done: list[float]) -> dict[int, float]:
    """Transactions per second, keyed by the second's end (1 = the first second)."""
    n = Counter(math.floor(t) + 1 for t in done)
    return {k: float(v) for k, v in sorted(n.items())}


def _gaps(done: list[float], since: float, end: float) -> dict:
    """The longest time without a completed transaction after `since` (the switchover
    request), and whether transactions came back before `end` (the run's end)."""
    after = [t for t in done if since < t <= end]
    longest, prev = 0.0, since
    for t in after:
        longest = max(longest, t - prev)
        prev = t
    trailing = end - prev
    return {"pause_s": round(longest, 2), "last_s": round(prev, 2),
            "trailing_gap_s": round(trailing, 2)}


def _aborts(lines, epoch0: float) -> dict:
    """Aborted clients per second (the second a client's error line arrived) and the
    reasons, most common first."""
    seen: dict[str, int] = {}
    reasons: Counter = Counter()
    for t, line in lines:
        m = _ABORTED.search(line)
        if not m or m.group(1) in seen:
            continue
        seen[m.group(1)] = math.floor(t - epoch0) + 1
        reasons[_reason(m.group(2))] += 1
    per_second = Counter(seen.values())
    return {"aborted": len(seen), "aborted_per_s": dict(sorted(per_second.items())),
            "abort_reasons": reasons.most_common(4)}


def _exit_error(lines) -> str | None:
    """pgbench's own last error, if it is not about one client (e.g. "unexpected error
    status: 4", after which pgbench 15 exits with every client)."""
    for _, line in reversed(lines):
        if "error:" in line and not _ABORTED.search(line) and "Run was aborted" not in line:
            return line.split("error:", 1)[1].strip()[:160]
    return None


def _reason(text: str) -> str:
    t = text.strip()
    for marker in ("FATAL:", "ERROR:"):
        if marker in t:
            t = marker + " " + t.split(marker, 1)[1].strip()
            break
    else:  # "in command 1 (SQL) of script 0; perhaps the backend died while processing"
        t = re.sub(r"^in command \d+ \(\w+\) of script \d+; ", "", t)
    return t[:220] or "(no message)"


_PROGRESS = re.compile(r"^progress: ([\d.]+) s, ([\d.]+) tps")


def _progress(lines) -> list[list[float]]:
    """pgbench's own progress lines (time, tps), kept for reference: thread 0 prints them."""
    out = []
    for _, line in lines:
        m = _PROGRESS.match(line)
        if m:
            out.append([float(m.group(1)), float(m.group(2))])
    return out


# ---------------------------------------------------------------------------- analysis

def _series(r: dict, key: str, duration: int) -> list[tuple[int, float]]:
    """(second, tps) for seconds 1..duration, 0 where pgbench logged nothing."""
    tps = {int(k): v for k, v in (r.get(key, {}).get("tps") or {}).items()}
    return [(k, tps.get(k, 0.0)) for k in range(1, duration + 1)]


def _mean(vals) -> float | None:
    vals = list(vals)
    return round(sum(vals) / len(vals), 1) if vals else None


def analyse(r: dict, key: str, duration: int) -> dict:
    """The pause after the switchover, whether the workload came back, TPS around it."""
    sw = r.get("switch") or {}
    x = r.get(key, {})
    req = sw.get("requested_s", duration / 3)
    done = sw.get("completed_s", req)
    clients, aborted = x.get("clients"), x.get("aborted") or 0
    ended = x.get("ended_s", duration)
    exited_early = ended < duration - 1 and x.get("rc") not in (0, None)
    never = (aborted >= (clients or 0) > 0 or exited_early
             or (x.get("trailing_gap_s") or 0) >= 2)
    series = _series(r, key, duration)
    before = _mean(v for k, v in series if 1 < k <= req)
    after_tps = _mean(v for k, v in series if k - 1 >= done + 2)
    return {"pause_s": x.get("pause_s"), "never_resumed": never, "tps_before": before,
            "tps_after": after_tps, "exited_early": exited_early, "ended_s": ended}


def _aborted_cell(r: dict, key: str, a: dict) -> str:
    x = r.get(key, {})
    n, clients = x.get("aborted") or 0, x.get("clients") or 0
    if a["exited_early"] and n < clients:
        return f"{n} (+{clients - n} when pgbench exited at {a['ended_s']:.0f} s)"
    return str(n)


def render(report: Report) -> None:
    s, results = report.settings, report.data.get("results") or {}
    if not results:
        return
    _table(report, s, results)
    for kind, r in results.items():
        _figure(report, s, kind, r)


def _pause_cell(a: dict) -> str:
    if a["never_resumed"]:
        return "never resumed"
    return f"{a['pause_s']:.2f} s" if a["pause_s"] is not None else None


def _table(report, s, results):
    t = Table(f"{NAME}: Patroni switchover under -N ({s['writers']} clients, -R "
              f"{s['write_rate']}) and -S ({s['readers']} clients, -R {s['read_rate']}), "
              f"{s['duration']} s, scale {s['scale']}",
              ["target", f"writers aborted (of {s['writers']})",
               f"readers aborted (of {s['readers']})", "write pause", "read pause",
               "write tps before", "write tps after", "read tps before", "read tps after"])
    heads = []
    for kind, r in results.items():
        w, rd = analyse(r, "writes", s["duration"]), analyse(r, "reads", s["duration"])
        t.add(LABELS.get(kind, kind), _aborted_cell(r, "writes", w),
              _aborted_cell(r, "reads", rd), _pause_cell(w), _pause_cell(rd), w["tps_before"], w["tps_after"],
              rd["tps_before"], rd["tps_after"])
        sw = r.get("switch") or {}
        if "error" in sw:
            t.notes.append(f"{LABELS.get(kind, kind)}: switchover {sw.get('from')} -> "
                           f"{sw.get('to')} failed: {sw['error'][:200]}")
        else:
            t.notes.append(f"{LABELS.get(kind, kind)}: switchover {sw.get('from')} -> "
                           f"{sw.get('to')} requested at {sw.get('requested_s')} s, Patroni "
                           f"answered at {sw.get('answered_s')} s, roles settled at "
                           f"{sw.get('completed_s')} s.")
        for key, who in (("writes", "writers"), ("reads", "readers")):
            for reason, n in r[key].get("abort_reasons") or ():
                t.notes.append(f"  {who} aborted ({n}): {reason}")
            if r[key].get("exit_error"):
                t.notes.append(f"  {who}' pgbench exited (rc {r[key].get('rc')}) at "
                               f"{r[key].get('ended_s'):.1f} s: {r[key]['exit_error']}")
        heads.append(_headline(kind, r, w, rd, s))
    t.notes.append("Pause: the longest time without a completed transaction after the "
                   "switchover was requested (from pgbench's per-transaction log); 'never "
                   "resumed': none for the last 2 s or more of the run, or every client "
                   "aborted, or pgbench exited (it does not reconnect an aborted client). tps "
                   "before: the whole seconds before the request; after: from 2 s after the "
                   "roles settled to the end.")
    report.tables.append(t)
    if heads:
        report.notes.append("=> Through a Patroni switchover: " + "; ".join(heads) + ".")


def _headline(kind, r, w, rd, s) -> str:
    def part(a, what):
        if a["never_resumed"]:
            return f"{what} never resumed"
        return f"{what} paused at most {a['pause_s']:.2f} s"
    return (f"{LABELS.get(kind, kind)} lost {_aborted_cell(r, 'writes', w)} of {s['writers']} "
            f"writers and {_aborted_cell(r, 'reads', rd)} of {s['readers']} readers, "
            f"{part(w, 'writes')}, {part(rd, 'reads')}")


def _figure(report, s, kind, r):
    dur = s["duration"]
    sw = r.get("switch") or {}
    marks = []
    if "requested_s" in sw:
        marks = [(sw["requested_s"], "switchover"), (sw["completed_s"], "")]
    ticks = [float(x) for x in range(0, dur + 1, 5 if dur <= 30 else 10)]
    color = svg.color_for(kind, 0)

    def cumulative(key):
        per = {int(k): v for k, v in (r[key].get("aborted_per_s") or {}).items()}
        out, total = [], 0
        for k in range(0, dur + 1):
            total += per.get(k, 0)
            out.append((k, float(total)))
        return out
    panels = [
        svg.LinePanel(f"Writes (-N, {s['writers']} clients, -R {s['write_rate']})", "seconds",
                      "transactions / s",
                      [svg.Series("write tps", _series(r, "writes", dur), color=color)],
                      marks=marks, x_ticks=ticks, dots=False),
        svg.LinePanel(f"Reads (-S, {s['readers']} clients, -R {s['read_rate']})", "seconds",
                      "transactions / s",
                      [svg.Series("read tps", _series(r, "reads", dur), color="#2563eb")],
                      marks=marks, x_ticks=ticks, dots=False),
        svg.LinePanel("Aborted clients (cumulative)", "seconds", "clients",
                      [svg.Series(f"writers (of {s['writers']})", cumulative("writes"),
                                  color=color),
                       svg.Series(f"readers (of {s['readers']})", cumulative("reads"),
                                  color="#2563eb", dashed=True)],
                      marks=marks, x_ticks=ticks, dots=False, y_top=s["writers"]),
    ]
    when = (f"switchover {sw.get('from')} → {sw.get('to')} requested at "
            f"{sw.get('requested_s')} s, roles settled at {sw.get('completed_s')} s (red lines)"
            if "requested_s" in sw else f"switchover failed: {sw.get('error', '')[:80]}")
    report.figures.append(svg.Figure(
        name=f"{NAME}-{kind}",
        title=f"Patroni switchover through {LABELS.get(kind, kind)}",
        subtitle=f"{when}; scale {s['scale']}, {dur} s; "
                 + ("one entry, route_reads=1, patroni=, failover_hold "
                    f"{s['failover_hold']} s" if kind == "sluice"
                    else "writes to the GET /primary port, reads to the GET /replica port"),
        panels=panels, columns=3))
