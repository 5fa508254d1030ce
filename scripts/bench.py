#!/usr/bin/env python3
"""make bench: pgbench against PostgreSQL directly, through sluice and through PgBouncer.

One throwaway PostgreSQL 15 (max_connections=100, 3 reserved, pgbench scale 10), one sluice
and the PgBouncers running the whole time with the same generated pgbouncer.ini (only
listen_port differs: transaction pooling, default_pool_size=20; PgBouncer 1.25 also gets
max_prepared_statements=200, sluice's default).  For every pgbench script x
query mode x client count the targets run interleaved (A B C A B C ...) and the median over
rounds is reported: TPS, average and p99 latency, failed clients, the proxy's CPU
microseconds per transaction, then the proxies' peak RSS and RSS per idle client over 10,000
idle connections.  Table on the terminal (one per script), JSON in bench-results/.

Scripts (--script, a comma list; each runs its whole matrix, in the order given):
  select  pgbench -S -n, the built-in select-only script: one SELECT (the default);
  tpcb    pgbench -n, the built-in TPC-B-like script: BEGIN, three UPDATEs, a SELECT,
          an INSERT, END.  It writes to pgbench's tables, never vacuumed here (-n).

Targets (--targets): direct, sluice, sluice-base, sluice-epoll, pgbouncer, pgbouncer125,
sluice-metrics, sluice-routed.  sluice-epoll is sluice with io_backend = epoll (one sendto per
message instead of its default io_uring batches; both in the same run).  pgbouncer is the PgBouncer on PATH (Debian's 1.18, which predates
max_prepared_statements: its -M prepared clients fail).  pgbouncer125 is PgBouncer 1.25:
$PGBOUNCER125_BIN, else a pgbouncer 1.25 on PATH, else 1.25.2 built once from
../shared/tools/pgbouncer-1.25.2-13a344f.tar.gz into target/peers/pgbouncer-1.25.2/ (its
build dependencies come with make peers); skipped with a warning when none of these is there.
It is the anchor of the "s/pgb125" columns (sluice / PgBouncer 1.25), the fair one for
-M prepared; "s/pgb" are sluice / pgbouncer.
sluice-routed is sluice with a streaming replica behind the same entry and route_reads=1 (its
report line gives cpu/tx routing on / off against sluice).  sluice-base is
sluice started from $SLUICE_BASE_BIN with the same ini as sluice, to compare a change to
sluice before (sluice-base) and after (sluice) in the same run on the same database; the
report gives cpu/tx and tps of sluice / sluice-base per cell.  It is among the default
targets when SLUICE_BASE_BIN is set, and skipped with a warning when it names no file.
sluice-metrics is sluice with /metrics scraped every second.  sluice-tls, pgbouncer-tls and
pgbouncer125-tls are sluice and the PgBouncers with client_tls_sslmode=require and a P-256
certificate made with the openssl CLI, pgbench connecting with PGSSLMODE=require (the ratio
columns of sluice-tls compare it with pgbouncer-tls and pgbouncer125-tls).  --connect adds
pgbench -C (a new connection, so a new TLS handshake, per transaction): the per-connection
cost.  --server-socket: the proxies (sluice and the PgBouncers; not direct, not sluice-routed)
reach PostgreSQL over its Unix socket instead of 127.0.0.1 (also with --profile); the JSON
says which in "server_host".

--scale-clients runs the many-clients measurements instead of the pgbench matrix (issue 13,
"100,000 clients"; see the section of that name below and docs/scale.md): 19,000 idle clients
through one sluice and through PgBouncer 1.25 (RSS per client, new-login latency and SHOW POOLS
time while they are held, what the client past the descriptor limit gets), 100,000 idle
clients over six sluices sharing one port (so_reuseport), and 10,000 active pgbench clients
(p99 / p50 latency) through sluice and PgBouncer 1.25.  JSON in bench-results/scale-*.json.

--profile measures what one transaction costs each proxy instead of the pgbench matrix (see
the section of that name below): pgbench -S -n, --modes (default simple,prepared) x --clients
(default 50) on a pool of 20, through --targets (sluice, sluice-base, sluice-epoll, pgbouncer,
pgbouncer125; default sluice,pgbouncer,pgbouncer125).  User-space instructions per transaction: the proxy runs under valgrind --tool=callgrind
with instrumentation switched on (callgrind_control -i on) for the measured pgbench run only,
Ir/tx = the run's instructions / pgbench's transactions; counted, not timed, so a busy machine
does not change them.  Syscalls per transaction: the proxy runs normally and strace -c -f is
attached for the measured run only.  A fresh proxy per measurement, targets alternated per
round, medians over --rounds (default 2).  Table on the terminal, JSON and markdown in
bench-results/profile-*.{json,md}, the callgrind files beside them (for callgrind_annotate).

Environment: SLUICE_BIN (default target/release/sluice), SLUICE_BASE_BIN (the "before" sluice
binary for sluice-base; no default), SLUICE_TESTKIT (default target/release/sluice-testkit),
PGBOUNCER_BIN (default: pgbouncer on PATH), PGBOUNCER125_BIN (default: see pgbouncer125),
PG_BINDIR.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pglab  # noqa: E402
from pglab import Lab, LabError, log, warn  # noqa: E402

POOL_SIZE = 20
MAX_CONNECTIONS = 100
RESERVED = 3
SCALE = 10
IDLE_CLIENTS = 10_000
# sluice-metrics: sluice with metrics_addr set and /metrics scraped every
# second during its runs, to show what the metrics cost (issue #3: within 3 %).
# sluice-base: sluice from $SLUICE_BASE_BIN, the "before" of a before/after comparison.
# sluice-routed: sluice with a streaming replica behind the same database
# entry and route_reads on (issue 10: what routing costs per transaction).
# sluice-tls, pgbouncer-tls: clients over TLS (issue 11).
# pgbouncer125: PgBouncer 1.25, the fair anchor for -M prepared (issue 13).
PROXIES = ("sluice", "sluice-base", "sluice-epoll", "pgbouncer", "pgbouncer125",
           "sluice-metrics", "sluice-routed", "sluice-tls", "pgbouncer-tls", "pgbouncer125-tls")
TLS_TARGETS = ("sluice-tls", "pgbouncer-tls", "pgbouncer125-tls")
PGB125_TARGETS = ("pgbouncer125", "pgbouncer125-tls")
PGB125_TARBALL = pglab.REPO.parent / "shared/tools/pgbouncer-1.25.2-13a344f.tar.gz"
PGB125_DIR = pglab.REPO / "target/peers/pgbouncer-1.25.2"
# sluice's default max_prepared_statements (its bench ini leaves it unset), given to
# PgBouncer 1.25 explicitly
MAX_PREPARED = 200
# --scale-clients (issue 13 part 3): sizes; why these, in the section "--scale-clients" below.
SCALE_IDLE = 19_000        # idle clients through one pooler: below its 20,000 descriptors
SCALE_OVERFLOW = 1_100     # and this many more, to run past them
SCALE_TOTAL = 100_000      # idle clients over SCALE_PROCS sluices sharing one port
SCALE_PROCS = 6
SCALE_ACTIVE = 10_000      # pgbench clients of the active part
# pgbench's built-in scripts: what --script accepts.
SCRIPTS = {
    "select": {"select_only": True, "pgbench": "-S (select-only), -n",
               "title": "pgbench -S (built-in select-only), -n"},
    "tpcb": {"select_only": False, "pgbench": "built-in tpcb-like (no -S), -n",
             "title": "pgbench TPC-B-like (built-in tpcb-like), -n"},
}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="3 s runs, 1 round, clients 1,10,150 (unless given explicitly)")
    ap.add_argument("--duration", type=int, help="seconds per pgbench run (default 10)")
    ap.add_argument("--rounds", type=int, help="interleaved rounds per cell (default 2)")
    ap.add_argument("--clients", help="comma list (default 1,10,150,1000)")
    ap.add_argument("--modes",
                    help="comma list of simple,extended,prepared (pgbench -M; default all "
                         "three, simple,prepared with --profile)")
    ap.add_argument("--script", dest="scripts", default="select", metavar="SCRIPT",
                    help="comma list of select (pgbench -S, the default), tpcb (pgbench's "
                         "TPC-B-like script); several run one after the other")
    ap.add_argument("--targets",
                    help="comma list of direct,sluice,sluice-base,sluice-epoll,pgbouncer,pgbouncer125,"
                         "sluice-metrics,sluice-routed,sluice-tls,pgbouncer-tls,"
                         "pgbouncer125-tls "
                         "(default all but sluice-base, and sluice-base too when "
                         "SLUICE_BASE_BIN is set)")
    ap.add_argument("--connect", action="store_true",
                    help="pgbench -C: a new connection per transaction (login and TLS "
                         "handshake cost)")
    ap.add_argument("--skip-idle", action="store_true", help="skip the 10,000 idle clients test")
    ap.add_argument("--server-socket", action="store_true",
                    help="the proxies reach PostgreSQL over its Unix socket instead of TCP "
                         "(sluice and the PgBouncers alike; direct and sluice-routed stay on TCP)")
    sc = ap.add_argument_group("--scale-clients (issue 13: many clients; replaces the matrix)")
    sc.add_argument("--scale-clients", action="store_true",
                    help="run the many-clients measurements instead of the pgbench matrix")
    sc.add_argument("--scale-parts", default="idle,reuseport,active",
                    help="comma list of idle (19,000 idle through one pooler), reuseport "
                         "(100,000 over six sluices), active (10,000 pgbench clients)")
    sc.add_argument("--scale-idle", type=int, default=SCALE_IDLE,
                    help=f"idle clients through one pooler (default {SCALE_IDLE:,})")
    sc.add_argument("--scale-overflow", type=int, default=SCALE_OVERFLOW,
                    help="more clients on top, to reach the descriptor limit "
                         f"(default {SCALE_OVERFLOW:,})")
    sc.add_argument("--scale-total", type=int, default=SCALE_TOTAL,
                    help=f"idle clients over the so_reuseport sluices (default {SCALE_TOTAL:,})")
    sc.add_argument("--scale-procs", type=int, default=SCALE_PROCS,
                    help=f"sluice processes sharing the port (default {SCALE_PROCS})")
    sc.add_argument("--scale-active", type=int, default=SCALE_ACTIVE,
                    help=f"pgbench clients of the active part (default {SCALE_ACTIVE:,}); "
                         "its duration is --duration (default 20 s here), -j is --jobs "
                         "(default 8 here), --sampling-rate defaults to 0.1 here")
    pr = ap.add_argument_group("--profile (instructions and syscalls per transaction; replaces "
                               "the matrix)")
    pr.add_argument("--profile", action="store_true",
                    help="measure the proxies' user-space instructions (valgrind callgrind) and "
                         "syscalls (strace -c -f) per pgbench -S transaction instead of the "
                         "matrix; --targets among sluice,pgbouncer,pgbouncer125 (default all "
                         "three), --modes (default simple,prepared), --clients (default 50), "
                         "--duration (default 10), --rounds (default 2)")
    pr.add_argument("--profile-tools", default="callgrind,strace",
                    help="comma list of callgrind (Ir/tx), strace (syscalls/tx); default both")
    ap.add_argument("--idle-clients", type=int, default=IDLE_CLIENTS, help=argparse.SUPPRESS)
    ap.add_argument("--jobs", type=int, help="pgbench -j (default 2)")
    ap.add_argument("--sampling-rate", type=float,
                    help="pgbench --sampling-rate for the p99 log (default 1.0 = every transaction)")
    ap.add_argument("--out-dir", default=str(pglab.REPO / "bench-results"))
    a = ap.parse_args(argv)
    if a.profile and a.scale_clients:
        ap.error("--profile and --scale-clients are separate runs: give one of them")
    if a.profile:
        return profile_args(ap, a)
    if a.scale_clients:
        a.duration = a.duration or 20
        a.jobs = a.jobs or 8
        a.sampling_rate = a.sampling_rate or 0.1
        a.scale_parts = [x.strip() for x in a.scale_parts.split(",") if x.strip()]
        for x in a.scale_parts:
            if x not in ("idle", "reuseport", "active"):
                ap.error(f"unknown --scale-parts entry {x!r}")
        return a
    a.jobs = a.jobs or 2
    a.sampling_rate = a.sampling_rate or 1.0
    a.duration = a.duration or (3 if a.quick else 10)
    a.rounds = a.rounds or (1 if a.quick else 2)
    a.clients = [int(c) for c in (a.clients or ("1,10,150" if a.quick else "1,10,150,1000")).split(",") if c]
    a.modes = [m.strip() for m in (a.modes or "simple,extended,prepared").split(",")
               if m.strip()]
    a.scripts = list(dict.fromkeys(x.strip() for x in a.scripts.split(",") if x.strip()))
    if a.targets is None:
        a.targets = ("direct,sluice,sluice-base,pgbouncer,pgbouncer125,sluice-metrics"
                     if os.environ.get("SLUICE_BASE_BIN")
                     else "direct,sluice,pgbouncer,pgbouncer125,sluice-metrics")
    a.targets = [t.strip() for t in a.targets.split(",") if t.strip()]
    check_choices(ap, a.targets, ("direct",) + PROXIES, "target")
    check_choices(ap, a.modes, MODES, "mode")
    check_choices(ap, a.scripts, tuple(SCRIPTS), "script", " (select or tpcb)")
    if (a.duration < 1 or a.rounds < 1 or not a.clients or not a.targets or not a.modes
            or not a.scripts):
        ap.error("empty matrix")
    return a


MODES = ("simple", "extended", "prepared")


def bench_cluster(lab, result: dict, replica: bool):
    """Starts the benchmark's PostgreSQL; (cluster, port, user, password, auth_file)."""
    log(f"starting PostgreSQL (max_connections={MAX_CONNECTIONS}, reserved={RESERVED}, "
        f"pgbench scale {SCALE}) via {' '.join(pglab.testkit_cmd())} ...")
    cluster = lab.start_cluster(max_connections=MAX_CONNECTIONS, reserved=RESERVED,
                                scale=SCALE, auth="trust", replica=replica)
    result["cluster"] = {k: cluster.get(k) for k in ("host", "port", "superuser")}
    pg_port = int(cluster["port"])
    user = cluster.get("superuser") or "postgres"
    password = cluster.get("password")
    auth_file = lab.write("userlist.txt", pglab.userlist({user: password or user}))
    log(f"PostgreSQL on 127.0.0.1:{pg_port}")
    return cluster, pg_port, user, password, auth_file


def server_host_for(a, cluster: dict, result: dict) -> str:
    """Where the proxies reach PostgreSQL: 127.0.0.1, or its socket directory with
    --server-socket (recorded in the result)."""
    host = "127.0.0.1"
    if getattr(a, "server_socket", False):
        host = cluster.get("socket_dir") or ""
        if not host:
            raise LabError("--server-socket: the cluster reports no socket directory")
        log(f"the proxies reach PostgreSQL over its Unix socket in {host}")
    result["server_host"] = host
    return host


def check_choices(ap, values, allowed, what: str, hint: str = "") -> None:
    for v in values:
        if v not in allowed:
            ap.error(f"unknown {what} {v!r}{hint}")


def versions(pgbouncer125: str | None) -> dict:
    v = {
        "postgres": pglab.cmd_output([pglab.pg_bin("postgres"), "--version"]),
        "pgbench": pglab.cmd_output([pglab.pg_bin("pgbench"), "--version"]),
        "pgbouncer": None,
        "pgbouncer_bin": pglab.pgbouncer_bin(),
        "pgbouncer125": first_line(pgbouncer125, "-V") if pgbouncer125 else None,
        "pgbouncer125_bin": pgbouncer125,
        "sluice": None,
        "sluice_bin": pglab.sluice_bin(),
        "sluice_sha256": None,
        "sluice_base": None,
        "sluice_base_bin": os.environ.get("SLUICE_BASE_BIN"),
        "sluice_base_sha256": None,
        "git_head": pglab.git_head(),
    }
    pgb = pglab.pgbouncer_bin()
    if pgb:
        v["pgbouncer"] = first_line(pgb, "--version")
    for key, path in (("sluice", pglab.sluice_bin()), ("sluice_base", pglab.sluice_base_bin())):
        sb = Path(path) if path else None
        if sb is None or not sb.exists():
            continue
        try:
            v[f"{key}_sha256"] = hashlib.sha256(sb.read_bytes()).hexdigest()
            v[f"{key}_mtime_utc"] = dt.datetime.fromtimestamp(
                sb.stat().st_mtime, dt.timezone.utc).isoformat(timespec="seconds")
        except OSError:
            pass
        out = pglab.cmd_output([str(sb), "--version"], timeout=5)
        v[key] = out.splitlines()[0] if out else None
    return v


def first_line(*cmd) -> str | None:
    out = pglab.cmd_output(list(cmd), timeout=5)
    return out.splitlines()[0] if out else None


def pgbouncer125() -> tuple[str | None, str]:
    """PgBouncer 1.25 for the pgbouncer125 targets: (binary, where it comes from), or
    (None, why there is none).  Builds 1.25.2 from ../shared/tools into PGB125_DIR the
    first time (about a minute), never inside ../shared."""
    env = os.environ.get("PGBOUNCER125_BIN")
    if env:
        return (env, "$PGBOUNCER125_BIN") if Path(env).is_file() else (
            None, f"PGBOUNCER125_BIN={env} names no file")
    on_path = shutil.which("pgbouncer")
    if on_path and (first_line(on_path, "-V") or "").startswith("PgBouncer 1.25"):
        return on_path, "PATH"
    built = PGB125_DIR / "pgbouncer"
    if built.is_file() and first_line(str(built), "-V") == "PgBouncer 1.25.2":
        return str(built), "built before"
    if not PGB125_TARBALL.is_file():
        return None, f"no PgBouncer 1.25 on PATH and no {PGB125_TARBALL} to build it from"
    src = PGB125_DIR / PGB125_TARBALL.name.removesuffix(".tar.gz")
    build_log = PGB125_DIR / "build.log"
    log(f"building PgBouncer 1.25.2 from {PGB125_TARBALL} in {PGB125_DIR} "
        f"(once, about a minute; log in {build_log}) ...")
    shutil.rmtree(PGB125_DIR, ignore_errors=True)
    PGB125_DIR.mkdir(parents=True)
    steps = (["tar", "-xzf", str(PGB125_TARBALL), "--no-same-owner", "-C", str(PGB125_DIR)],
             ["./autogen.sh"], ["./configure", "--without-cares"],
             ["make", f"-j{os.cpu_count() or 1}", "pgbouncer"])
    with open(build_log, "wb") as out:
        for cmd in steps:
            out.write(f"$ {' '.join(cmd)}\n".encode())
            out.flush()
            try:
                r = subprocess.run(cmd, cwd=str(PGB125_DIR if cmd[0] == "tar" else src),
                                   stdout=out, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL)
            except OSError as e:
                return None, f"building PgBouncer 1.25.2: {cmd[0]}: {e} (make peers installs it)"
            if r.returncode != 0:
                return None, (f"building PgBouncer 1.25.2 failed at {' '.join(cmd)} (see "
                              f"{build_log}; make peers installs what it needs)")
    shutil.copy2(src / "pgbouncer", built)
    if first_line(str(built), "-V") != "PgBouncer 1.25.2":
        return None, f"{built} built but its -V does not say PgBouncer 1.25.2"
    return str(built), "built now"


@contextmanager
def pgbouncer_binary(path: str):
    """pglab.Lab.start_proxy runs $PGBOUNCER_BIN (else pgbouncer on PATH) for every
    pgbouncer* kind: point it at `path` while one is started, then put it back."""
    old = os.environ.get("PGBOUNCER_BIN")
    os.environ["PGBOUNCER_BIN"] = path
    try:
        yield
    finally:
        if old is None:
            del os.environ["PGBOUNCER_BIN"]
        else:
            os.environ["PGBOUNCER_BIN"] = old


def med(vals):
    vals = [v for v in vals if v is not None]
    return round(statistics.median(vals), 3) if vals else None


def fmt(v, digits=1):
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return f"{v:,}"


def ratio(a, b):
    if a is None or b is None or b == 0:
        return None
    return round(a / b, 3)


def loadavg() -> str | None:
    try:
        return Path("/proc/loadavg").read_text().strip()
    except OSError:
        return None


def load1() -> float | None:
    la = loadavg()
    return float(la.split()[0]) if la else None


def count_backends(lab: Lab) -> int | None:
    try:
        return int(lab.psql("SELECT count(*) FROM pg_stat_activity WHERE backend_type = "
                            "'client backend' AND pid <> pg_backend_pid()"))
    except (LabError, ValueError, subprocess.SubprocessError):
        return None


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.scale_clients:
        return scale_main(a)
    if a.profile:
        return profile_main(a)
    nofile = pglab.raise_nofile()
    pglab.install_signal_handlers()
    pgb125, pgb125_from = (pgbouncer125() if any(t in PGB125_TARGETS for t in a.targets)
                           else (None, "not requested"))
    if pgb125:
        log(f"pgbouncer125: {pgb125} ({pgb125_from})")
    t_start = time.monotonic()
    started = dt.datetime.now(dt.timezone.utc)
    result = {
        "schema": 2,  # 2: runs and summary rows carry "script"
        "started_utc": started.isoformat(timespec="seconds"),
        "args": {k: v for k, v in vars(a).items()},
        "rlimit_nofile": list(nofile),
        "loadavg_start": loadavg(),
        "machine": pglab.machine_info(),
        "versions": versions(pgb125),
        "settings": {"max_connections": MAX_CONNECTIONS, "superuser_reserved_connections": RESERVED,
                     "pgbench_scale": SCALE, "pool_mode": "transaction",
                     "default_pool_size": POOL_SIZE,
                     "pgbench": ("; ".join(f"{x}: {SCRIPTS[x]['pgbench']}" for x in a.scripts)
                                 if len(a.scripts) > 1 else SCRIPTS[a.scripts[0]]["pgbench"]),
                     "pgbench_scripts": list(a.scripts)},
        "targets": {},
        "runs": [],
        "summary": [],
        "peak_rss_kb": {},
        "idle": {},
    }
    if nofile[0] < a.idle_clients + 2000 and not a.skip_idle:
        warn(f"RLIMIT_NOFILE is {nofile[0]}: the idle test may run out of file descriptors")

    with Lab(prefix="sluice-bench-") as lab:
        cluster, pg_port, user, password, auth_file = bench_cluster(
            lab, result, replica="sluice-routed" in a.targets)
        server_host = server_host_for(a, cluster, result)

        endpoints = {}
        if "direct" in a.targets:
            endpoints["direct"] = {"port": pg_port, "dbname": "postgres", "proxy": None}
            result["targets"]["direct"] = {"port": pg_port}
        for kind in PROXIES:
            if kind not in a.targets:
                continue
            if kind in PGB125_TARGETS and not pgb125:
                warn(f"{kind}: {pgb125_from}: skipped")
                result["targets"][kind] = {"skipped": pgb125_from}
                continue
            if (kind.startswith("pgbouncer") and kind not in PGB125_TARGETS
                    and not pglab.pgbouncer_bin()):
                msg = "pgbouncer not found (install it or set PGBOUNCER_BIN): skipped"
                warn(msg)
                result["targets"][kind] = {"skipped": msg}
                continue
            if kind == "sluice-base" and not pglab.sluice_base_bin():
                env = os.environ.get("SLUICE_BASE_BIN")
                msg = (f"SLUICE_BASE_BIN={env} not found: skipped" if env else
                       "SLUICE_BASE_BIN is not set (path of the sluice to compare with): skipped")
                warn(msg)
                result["targets"][kind] = {"skipped": msg}
                continue

            metrics_port = pglab.free_port() if kind == "sluice-metrics" else None

            databases = None
            if kind == "sluice-routed":
                databases = {"bench": f"host=127.0.0.1,127.0.0.1 "
                                      f"port={pg_port},{cluster['replica_port']} "
                                      f"dbname=postgres route_reads=1"}

            extra = {}
            if kind in PGB125_TARGETS:
                extra["max_prepared_statements"] = MAX_PREPARED
            if kind in TLS_TARGETS:
                cert, key = lab_certificate(lab)
                extra.update({"client_tls_sslmode": "require", "client_tls_cert_file": cert,
                              "client_tls_key_file": key})

            def ini(port, logfile, metrics_port=metrics_port, databases=databases,
                    extra=extra):
                text = pglab.pooler_ini(pg_port=pg_port, listen_port=port, logfile=logfile,
                                        auth_file=auth_file, default_pool_size=POOL_SIZE,
                                        max_client_conn=12000, admin_users=user,
                                        databases=databases, extra=extra or None,
                                        pg_host=server_host)
                if metrics_port:
                    text += f"\n[sluice]\nmetrics_addr = 127.0.0.1:{metrics_port}\n"
                if kind == "sluice-epoll":
                    text += "\n[sluice]\nio_backend = epoll\n"
                return text
            try:
                if kind in PGB125_TARGETS:
                    with pgbouncer_binary(pgb125):
                        proxy = lab.start_proxy(kind, ini)
                else:
                    proxy = lab.start_proxy(kind, ini)
            except LabError as e:
                if kind in ("pgbouncer", "sluice-base") + PGB125_TARGETS:
                    warn(f"{kind} did not start, skipped: {e}")
                    result["targets"][kind] = {"skipped": str(e)}
                    continue
                raise
            endpoints[kind] = {"port": proxy.port, "dbname": "bench", "proxy": proxy,
                               "metrics_port": metrics_port,
                               "env": {"PGSSLMODE": "require"} if kind in TLS_TARGETS else {}}
            result["targets"][kind] = {"port": proxy.port, "pid": proxy.pid,
                                       "ini": proxy.ini.read_text()}
            log(f"{kind} on 127.0.0.1:{proxy.port} (pid {proxy.pid})")
        targets = [t for t in a.targets if t in endpoints]
        if not targets:
            raise LabError("no target left to benchmark")

        dead: dict[str, str] = {}

        def check_alive(t):
            p = endpoints[t]["proxy"]
            if p is not None and not p.alive() and t not in dead:
                dead[t] = f"{t} exited with code {p.proc.returncode}"
                warn(dead[t] + "\n" + p.log_tail())
            return t not in dead

        # Idle memory first, on processes that have served nothing yet:
        # after the pgbench matrix an allocator reuses memory it already
        # holds, and the growth it shows would flatter either proxy.
        if not a.skip_idle:
            for t in targets:
                p = endpoints[t]["proxy"]
                if p is None or t == "sluice-metrics" or t in TLS_TARGETS or not check_alive(t):
                    continue
                log(f"idle test: {a.idle_clients:,} idle clients to {t} ...")
                result["idle"][t] = idle_test(p, user, a.idle_clients)
                check_alive(t)
                r = result["idle"][t]
                log(f"      opened {r['opened']:,}/{r['requested']:,} in {r['open_seconds']} s, "
                    f"RSS {r['rss_before_kb']:,} -> {r['rss_idle_kb']:,} kB"
                    + (f", errors: {r['errors']}" if r["errors"] else ""))

        # warm-up: fill the pools and the page cache, not recorded
        warm = 1 if a.quick else 2
        for t in targets:
            ep = endpoints[t]
            log(f"warm-up {t} ({warm} s, 20 clients) ...")
            pglab.run_pgbench(host="127.0.0.1", port=ep["port"], dbname=ep["dbname"], user=user,
                              password=password, clients=20, jobs=a.jobs, duration=warm,
                              mode="simple", env=ep.get("env"))
            check_alive(t)

        total = len(a.scripts) * len(a.modes) * len(a.clients) * a.rounds * len(targets)
        i = 0
        for script in a.scripts:
            for mode in a.modes:
                for clients in a.clients:
                    for rnd in range(1, a.rounds + 1):
                        for t in targets:
                            i += 1
                            log(f"[{i}/{total}] {script} {mode} c={clients} {t} round {rnd} ...")
                            run = {"script": script, "mode": mode, "clients": clients, "target": t,
                                   "round": rnd}
                            if not check_alive(t):
                                run.update(error=dead[t], skipped=True)
                                result["runs"].append(run)
                                continue
                            run.update(one_run(lab, a, endpoints[t], user, password, script,
                                               mode, clients))
                            check_alive(t)
                            result["runs"].append(run)
                            short = (f"      tps={fmt(run.get('tps'))} "
                                     f"avg={fmt(run.get('lat_avg_ms'), 3)}ms "
                                     f"p99={fmt(run.get('p99_ms'), 3)}ms "
                                     f"failed={run.get('failed_clients')}")
                            if run.get("cpu_us_per_tx") is not None:
                                short += f" cpu/tx={run['cpu_us_per_tx']:.1f}us"
                            if run.get("error"):
                                short += f"  [{run['error'][:110]}]"
                            log(short)

        for t in targets:
            p = endpoints[t]["proxy"]
            if p is not None and p.alive():
                result["peak_rss_kb"][t] = {"after_matrix": pglab.vm_hwm_kb(p.pid)}

        for t in targets:
            p = endpoints[t]["proxy"]
            if p is not None and p.alive():
                result["peak_rss_kb"].setdefault(t, {})["end"] = pglab.vm_hwm_kb(p.pid)
        result["proxy_dead"] = dead

    # ---------------------------------------------------------------- summary
    result["summary"] = summarize(result["runs"], a, targets)
    result["loadavg_end"] = loadavg()
    result["finished_utc"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    result["wall_seconds"] = round(time.monotonic() - t_start, 1)
    print_report(result, a, targets)
    out_dir = Path(a.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    text = json.dumps(result, indent=2, sort_keys=False) + "\n"
    path = out_dir / f"bench-{stamp}.json"
    path.write_text(text)
    (out_dir / "latest.json").write_text(text)
    log(f"\nJSON: {path} (and {out_dir / 'latest.json'}); wall time {result['wall_seconds']} s")
    return 0


def lab_certificate(lab: Lab) -> tuple[str, str]:
    """A self-signed P-256 certificate for localhost in the lab's directory (made once),
    readable by PgBouncer (which runs as postgres)."""
    d = lab.tmp / "tls"
    cert, key = d / "server.crt", d / "server.key"
    if not cert.exists():
        d.mkdir(parents=True, exist_ok=True)
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                        "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", str(key), "-out",
                        str(cert), "-days", "2", "-subj", "/CN=localhost",
                        "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
                       check=True, capture_output=True)
        key.chmod(0o600)
        for f in (d, cert, key):
            lab.chown_pg(f)
    return str(cert), str(key)


def scrape_metrics_while(ep: dict, stop: threading.Event, counter: list) -> None:
    """Fetches /metrics once a second until `stop` (the sluice-metrics target)."""
    import urllib.request
    while not stop.wait(1.0):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{ep['metrics_port']}/metrics",
                                        timeout=2) as r:
                r.read()
            counter[0] += 1
        except OSError:
            pass


def one_run(lab: Lab, a, ep: dict, user: str, password, script: str, mode: str,
            clients: int) -> dict:
    stop = threading.Event()
    scrapes = [0]
    scraper = None
    if ep.get("metrics_port"):
        scraper = threading.Thread(target=scrape_metrics_while, args=(ep, stop, scrapes),
                                   daemon=True)
        scraper.start()
    try:
        res = one_run_inner(lab, a, ep, user, password, script, mode, clients)
    finally:
        stop.set()
        if scraper:
            scraper.join(timeout=5)
    if scraper:
        res["metrics_scrapes"] = scrapes[0]
    return res


def one_run_inner(lab: Lab, a, ep: dict, user: str, password, script: str, mode: str,
                  clients: int) -> dict:
    proxy = ep["proxy"]
    backends_before = count_backends(lab)
    cpu0 = pglab.proc_cpu_seconds(proxy.pid) if proxy else None
    res = pglab.run_pgbench(host="127.0.0.1", port=ep["port"], dbname=ep["dbname"], user=user,
                            password=password, clients=clients, jobs=a.jobs,
                            duration=a.duration, mode=mode, log_dir=lab.tmp / "pgbench-log",
                            sampling_rate=a.sampling_rate,
                            select_only=SCRIPTS[script]["select_only"],
                            extra_args=["-C"] if a.connect else [], env=ep.get("env"))
    cpu1 = pglab.proc_cpu_seconds(proxy.pid) if proxy else None
    res["proxy_cpu_s"] = round(cpu1 - cpu0, 4) if cpu0 is not None and cpu1 is not None else None
    tx = res.get("transactions") or 0
    res["cpu_us_per_tx"] = (round(res["proxy_cpu_s"] * 1e6 / tx, 2)
                            if res["proxy_cpu_s"] is not None and tx > 0 else None)
    res["failed_clients_method"] = "pgbench"
    if not res["failed_clients_known"]:
        # pgbench 15 exits at the first client that cannot connect: measure how many of
        # `clients` simultaneous connections this target accepts right now instead.
        time.sleep(0.5)
        probe = pglab.probe_connections("127.0.0.1", ep["port"], user=user,
                                        database=ep["dbname"], n=clients)
        res["probe"] = {k: probe[k] for k in ("opened", "failed", "errors")}
        res["failed_clients"] = probe["failed"]
        res["failed_clients_method"] = "probe"
    res["pg_backends_before"] = backends_before
    res["loadavg_1m_after"] = load1()
    res["pg_backends_after"] = count_backends(lab)
    del res["failed_clients_known"]
    return res


def idle_test(proxy, user: str, n: int) -> dict:
    rss0 = pglab.vm_rss_kb(proxy.pid)
    snap = {}

    async def hold(opened):
        import asyncio
        await asyncio.sleep(2)
        snap["rss"] = pglab.vm_rss_kb(proxy.pid)
        snap["hwm"] = pglab.vm_hwm_kb(proxy.pid)

    r = pglab.open_connections("127.0.0.1", proxy.port, user=user, database="bench", n=n,
                               concurrency=100, timeout=30, hold=hold, overall_timeout=900)
    time.sleep(1)
    rss1 = snap.get("rss")
    out = {
        "requested": n, "opened": r["opened"], "failed": r["failed"], "errors": r["errors"],
        "open_seconds": r["open_seconds"], "rss_before_kb": rss0, "rss_idle_kb": rss1,
        "hwm_idle_kb": snap.get("hwm"), "rss_after_close_kb": pglab.vm_rss_kb(proxy.pid),
        "per_client_bytes": (round((rss1 - rss0) * 1024 / r["opened"], 1)
                             if rss0 is not None and rss1 is not None and r["opened"] else None),
    }
    return out


def summarize(runs, a, targets):
    out = []
    for script in a.scripts:
        for mode in a.modes:
            for clients in a.clients:
                cells = {}
                for t in targets:
                    mine = [r for r in runs if r["script"] == script and r["mode"] == mode
                            and r["clients"] == clients and r["target"] == t]
                    rs = [r for r in mine if not r.get("skipped")]
                    errs = [r.get("error") for r in mine if r.get("error")]
                    cells[t] = {
                        "script": script, "mode": mode, "clients": clients, "target": t,
                        "rounds": len(rs),
                        "tps": med([r.get("tps") for r in rs]),
                        "tps_min": min((r["tps"] for r in rs if r.get("tps") is not None), default=None),
                        "tps_max": max((r["tps"] for r in rs if r.get("tps") is not None), default=None),
                        "avg_ms": med([r.get("lat_avg_ms") for r in rs]),
                        "p99_ms": med([r.get("p99_ms") for r in rs]),
                        "failed_clients": (max(r.get("failed_clients") or 0 for r in rs) if rs else None),
                        "failed_clients_method": ("probe" if any(r.get("failed_clients_method") == "probe"
                                                                 for r in rs) else "pgbench"),
                        "cpu_us_per_tx": med([r.get("cpu_us_per_tx") for r in rs]),
                        "transactions": med([r.get("transactions") for r in rs]),
                        "pg_backends_before": med([r.get("pg_backends_before") for r in rs]),
                        "error": errs[0] if errs else None,
                    }
                # sluice / PgBouncer: *_vs_pgbouncer against the one on PATH (Debian's 1.18),
                # *_vs_pgbouncer125 against 1.25; TLS against TLS, like with like
                for anchor, mine in (("pgbouncer", ("sluice", "sluice-base", "sluice-epoll")),
                                     ("pgbouncer-tls", ("sluice-tls",)),
                                     ("pgbouncer125", ("sluice", "sluice-base", "sluice-epoll")),
                                     ("pgbouncer125-tls", ("sluice-tls",))):
                    b = cells.get(anchor)
                    suffix = "pgbouncer125" if anchor in PGB125_TARGETS else "pgbouncer"
                    for kind in mine:
                        s = cells.get(kind)
                        if s and b:
                            s[f"tps_ratio_vs_{suffix}"] = ratio(s["tps"], b["tps"])
                            s[f"cpu_ratio_vs_{suffix}"] = ratio(s["cpu_us_per_tx"],
                                                                b["cpu_us_per_tx"])
                s, routed = cells.get("sluice"), cells.get("sluice-routed")
                if s and routed:
                    # routing on / off: cpu > 1, routing costs that much more
                    routed["cpu_ratio_vs_sluice"] = ratio(routed["cpu_us_per_tx"],
                                                          s["cpu_us_per_tx"])
                    routed["tps_ratio_vs_sluice"] = ratio(routed["tps"], s["tps"])
                s, base = cells.get("sluice"), cells.get("sluice-base")
                if s and base:
                    # after / before: cpu < 1, the change (SLUICE_BIN) costs less; tps < 1, slower
                    s["tps_ratio_vs_base"] = ratio(s["tps"], base["tps"])
                    s["cpu_ratio_vs_base"] = ratio(s["cpu_us_per_tx"], base["cpu_us_per_tx"])
                out.extend(cells.values())
    return out


def geomean(vals):
    vals = [v for v in vals if v]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else None


def print_report(result, a, targets):
    # ratio columns, sluice / anchor: PgBouncer 1.25 first when it ran (the fair anchor
    # for -M prepared), then the PgBouncer on PATH
    anchors = [(suffix, label) for suffix, label in (("pgbouncer125", "pgb125"),
                                                     ("pgbouncer", "pgb"))
               if any(f"cpu_ratio_vs_{suffix}" in s for s in result["summary"])]
    hdr = ["mode", "clients", "target", "tps", "avg_ms", "p99_ms", "failed", "cpu_us/tx"]
    for _, label in anchors:
        hdr += [f"tps s/{label}", f"cpu s/{label}"]
    rows = []
    for s in result["summary"]:
        failed = s["failed_clients"]
        failed_s = "-" if failed is None else f"{failed}{'*' if s['failed_clients_method'] == 'probe' and failed else ''}"
        row = [s["mode"], str(s["clients"]), s["target"], fmt(s["tps"]), fmt(s["avg_ms"], 3),
               fmt(s["p99_ms"], 3), failed_s, fmt(s["cpu_us_per_tx"], 1)]
        for suffix, _ in anchors:
            row += [fmt(s[k], 2) if k in s else ""
                    for k in (f"tps_ratio_vs_{suffix}", f"cpu_ratio_vs_{suffix}")]
        rows.append(row)
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(hdr)]
    left = {0, 1, 2}
    tw = max(len(t) for t in list(targets) + list(result["targets"]))

    def line(cells):
        return "  ".join(c.ljust(widths[i]) if i in left else c.rjust(widths[i])
                         for i, c in enumerate(cells)).rstrip()
    m = result["machine"]
    several = len(a.scripts) > 1
    v = result["versions"]
    if anchors:
        print()
        print("; ".join(f"s/{label} = sluice / {suffix} ({v.get(suffix) or '-'})"
                        for suffix, label in anchors)
              + (" (sluice-tls: against their -tls)" if "sluice-tls" in targets else ""))
    # one table per pgbench script, its header naming the script
    for script in a.scripts:
        print()
        print(f"[{script}] {SCRIPTS[script]['title']}, -j {a.jobs}, {a.duration} s x {a.rounds} "
              f"round(s) per cell (median), PostgreSQL max_connections={MAX_CONNECTIONS}, "
              f"pool_mode=transaction, default_pool_size={POOL_SIZE}; {m['nproc']} CPUs, "
              f"kernel {m['kernel']}")
        print(line(hdr))
        print(line(["-" * w for w in widths]))
        prev = None
        for r, s in zip(rows, result["summary"]):
            if s["script"] != script:
                continue
            key = (s["mode"], s["clients"])
            if prev is not None and key != prev:
                print()
            prev = key
            print(line(r))
    print()
    loads = [r["loadavg_1m_after"] for r in result["runs"] if r.get("loadavg_1m_after") is not None]
    ncpu = m.get("nproc_available") or m["nproc"] or 1
    if loads and max(loads) > ncpu * 1.5:
        print(f"! the machine was busy (1-min load average up to {max(loads):.1f} on {ncpu} CPUs, "
              f"partly this benchmark itself): expect noise; see the per-round numbers in the JSON.")
    if any(s["failed_clients_method"] == "probe" and s["failed_clients"] for s in result["summary"]):
        print("* pgbench aborts the whole run at the first refused client (tps 0); failed = how many of "
              "that many simultaneous connections the target refused, measured right after.")
        busy = [s["pg_backends_before"] for s in result["summary"]
                if s["target"] == "direct" and s["pg_backends_before"] is not None]
        if busy and "direct" in targets and len(targets) > 1:
            print(f"  PostgreSQL's {MAX_CONNECTIONS} slots are shared with the poolers' idle server "
                  f"connections ({min(busy):.0f}-{max(busy):.0f} client backends before the direct runs).")
    errs = {}
    for s in result["summary"]:
        if s.get("error"):
            where = f"{s['mode']}/c={s['clients']}/{s['target']}"
            errs.setdefault(s["error"], []).append(f"{s['script']}/{where}" if several else where)
    if errs:
        print("errors (first stderr line):")
        for e, where in errs.items():
            print(f"  {e[:160]}  <- {', '.join(where[:4])}{' ...' if len(where) > 4 else ''}")
    print()
    for t in targets:
        if t == "direct":
            continue
        pk = result["peak_rss_kb"].get(t, {})
        idle = result["idle"].get(t)
        line_ = f"{t:<{tw}} peak RSS (VmHWM): {fmt(pk.get('after_matrix'))} kB after pgbench matrix"
        if pk.get("end") is not None and pk.get("end") != pk.get("after_matrix"):
            line_ += f", {fmt(pk.get('end'))} kB at end"
        print(line_)
        if idle:
            pc = idle["per_client_bytes"]
            print(f"{t:<{tw}} idle: {idle['opened']:,}/{idle['requested']:,} clients open "
                  f"({idle['failed']} failed), RSS {fmt(idle['rss_before_kb'])} -> "
                  f"{fmt(idle['rss_idle_kb'])} kB = {fmt(pc, 0)} bytes per idle client")
    for t, info in result["targets"].items():
        if info.get("skipped"):
            print(f"{t:<{tw}} SKIPPED: {info['skipped']}")
    for t, why in result.get("proxy_dead", {}).items():
        print(f"{t:<{tw}} DIED during the run: {why}")
    by = {(x["script"], x["mode"], x["clients"], x["target"]): x for x in result["summary"]}
    for x in result["summary"]:
        base = by.get((x["script"], x["mode"], x["clients"], "sluice"))
        if x["target"] == "sluice-metrics" and base and x["cpu_us_per_tx"] and base["cpu_us_per_tx"]:
            print(f"metrics cost {x['script'] + ' ' * (7 - len(x['script'])) if several else ''}"
                  f"{x['mode']:<8} "
                  f"c={x['clients']:<5} cpu/tx with /metrics scraped each second "
                  f"/ without = {x['cpu_us_per_tx'] / base['cpu_us_per_tx']:.3f}")
        if x["target"] == "sluice-routed" and x.get("cpu_ratio_vs_sluice"):
            print(f"routing    {x['script'] + ' ' * (7 - len(x['script'])) if several else ''}"
                  f"{x['mode']:<8} c={x['clients']:<5} cpu/tx route_reads on / off = "
                  f"{x['cpu_ratio_vs_sluice']:.3f}   tps on / off = "
                  f"{x.get('tps_ratio_vs_sluice') or 0:.2f}")
    for script in a.scripts:
        for clients in a.clients:
            sp = by.get((script, "prepared", clients, "sluice"))
            se = by.get((script, "extended", clients, "sluice"))
            be = by.get((script, "extended", clients, "pgbouncer"))
            if sp and se and sp["tps"] and se["tps"]:
                cpu = ""
                if be and sp["cpu_us_per_tx"] and be["cpu_us_per_tx"]:
                    cpu = (f"; cpu/tx sluice prepared / pgbouncer extended = "
                           f"{sp['cpu_us_per_tx'] / be['cpu_us_per_tx']:.2f}")
                print(f"prepared   {f'{script:<7}' if several else ''}c={clients:<5} tps sluice "
                      f"prepared / sluice extended = {sp['tps'] / se['tps']:.2f}{cpu}")
    # the anchor: sluice's cpu/tx over PgBouncer 1.25's, one line per script and mode
    for script in a.scripts:
        for mode in a.modes:
            for mine in ("sluice", "sluice-base", "sluice-epoll"):
                each = [f"c={c} {x['cpu_ratio_vs_pgbouncer125']:.2f}" for c in a.clients
                        if (x := by.get((script, mode, c, mine)))
                        and x.get("cpu_ratio_vs_pgbouncer125")]
                if each:
                    print(f"cpu/tx {mine} / pgbouncer125 {f'{script:<7}' if several else ''}"
                          f"{mode:<8} {', '.join(each)}")
    # before/after: sluice (SLUICE_BIN) against sluice-base (SLUICE_BASE_BIN), same run
    vs_base = [x for x in result["summary"] if "cpu_ratio_vs_base" in x]
    if vs_base:
        print(f"sluice vs sluice-base (after / before; sluice = {v.get('sluice_bin')}, "
              f"sluice-base = {v.get('sluice_base_bin')}):")
        if v.get("sluice_sha256") and v.get("sluice_sha256") == v.get("sluice_base_sha256"):
            print("  (the two binaries are identical: an A/A run, the ratios show the noise)")
        for x in vs_base:
            print(f"  {x['script']:<6} {x['mode']:<8} c={x['clients']:<5} cpu/tx sluice / sluice-base "
                  f"= {fmt(x['cpu_ratio_vs_base'], 3)}   tps sluice / sluice-base = "
                  f"{fmt(x['tps_ratio_vs_base'], 3)}")
        gc = geomean([x["cpu_ratio_vs_base"] for x in vs_base])
        gt = geomean([x["tps_ratio_vs_base"] for x in vs_base])
        if len(vs_base) > 1 and gc is not None:
            print(f"  geometric mean over {len(vs_base)} cells: cpu/tx {gc:.3f}"
                  + (f", tps {gt:.3f}" if gt is not None else ""))
    s_idle = result["idle"].get("sluice")
    for anchor in ("pgbouncer125", "pgbouncer"):
        b_idle = result["idle"].get(anchor)
        if s_idle and b_idle and s_idle["per_client_bytes"] and b_idle["per_client_bytes"]:
            print(f"idle bytes/client sluice/{anchor} = "
                  f"{s_idle['per_client_bytes'] / b_idle['per_client_bytes']:.2f}")
    base_idle = result["idle"].get("sluice-base")
    if s_idle and base_idle and s_idle["per_client_bytes"] and base_idle["per_client_bytes"]:
        print(f"idle bytes/client sluice/sluice-base = "
              f"{s_idle['per_client_bytes'] / base_idle['per_client_bytes']:.2f}")


# ---------------------------------------------------------------------------
# --scale-clients (issue 13 part 3, "100,000 clients")
# ---------------------------------------------------------------------------
# What is measured, and why it is set up this way:
#  * A process on these machines may hold 20,000 descriptors (hard RLIMIT_NOFILE, and no
#    CAP_SYS_RESOURCE to raise it).  So one pooler is loaded with 19,000 idle clients
#    (RSS per client, the login latency of one more client and SHOW POOLS time while they
#    are held), then 1,100 more to run it out of descriptors (what that client is told,
#    and whether the pooler still serves), sluice and PgBouncer 1.25 alike; and 100,000
#    clients need several sluices: six share one port through so_reuseport (the kernel
#    spreads new connections over their listeners), each with its own unix_socket_dir so
#    that its console can be asked how many clients it holds.
#  * The clients have the same limit, so they are opened by several processes
#    (pglab.ClientFleet, < 12,500 each), and from several loopback source addresses
#    (127.0.0.x, <= 5,000 clients each, fresh ones for each part so that the TIME_WAIT
#    of a part does not meet the next), so no address runs short of ephemeral ports.
#  * The kernel's accept queues (somaxconn, tcp_max_syn_backlog, netdev_max_backlog) and
#    the ephemeral port range are raised for the run and put back at the end (Sysctls);
#    the poolers get listen_backlog = 4096 and max_client_conn = 25,000, so that what
#    limits them is the descriptors, not a setting.  PostgreSQL keeps max_connections=100.
#  * Parts run idle, active, reuseport: idle memory is measured first, on poolers that
#    have served nothing yet (as in main()); the six sluices come after the two poolers
#    are stopped.
#  * 10,000 active clients: pgbench -c 10000 -j 8 (10,003 descriptors in one process,
#    under the limit; pgbench 15 waits with ppoll, not select) against a pool of 20.
#    With so many clients the latency is mostly the wait for a server: p99 / p50 says
#    how evenly the pooler shares its 20 servers among them (FIFO: close to 1).

SCALE_SYSCTLS = {
    # sources carry <= 5,000 clients each, far below the default 28,232 ports; widened
    # anyway as headroom (pgbench's 10,000 clients all come from 127.0.0.1)
    "net.ipv4.ip_local_port_range": "10240 65535",
    "net.core.somaxconn": "65535",
    "net.ipv4.tcp_max_syn_backlog": "65535",
    "net.core.netdev_max_backlog": "65536",  # loopback SYN bursts queue here
}
SCALE_MAX_CLIENT_CONN = 25_000
SCALE_BACKLOG = 4096
PER_WORKER = 12_500          # clients per client process (< 20,000 descriptors)
PER_SOURCE = 5_000           # clients per source address
LOGINS = 200                 # new logins timed one after the other while the rest are held
TARGETS = {"idle_bytes": 768, "login_p99_ms": 10.0, "show_pools_ms": 100.0,
           "p99_over_p50": 1.5}


class Sources:
    """Hands out fresh loopback source addresses (127.0.0.2, .3, ...)."""

    def __init__(self):
        self.next = 2

    def split(self, n: int, min_workers: int) -> tuple[list[int], list[list[str]]]:
        counts, sources, self.next = pglab.split_clients(n, PER_WORKER, PER_SOURCE,
                                                         min_workers, self.next)
        return counts, sources


def kib(b):
    return b / 1024 if b is not None else None


def pct_ms(vals: list[float], q: float) -> float | None:
    p = pglab.percentile(sorted(vals), q)
    return round(p * 1000, 3) if p is not None else None


def login_latencies(port: int, user: str, n: int = LOGINS) -> dict:
    """n new clients logged in one after the other (connect to ReadyForQuery), each
    leaving before the next: p50/p99/max in ms."""
    lat, errors = [], {}
    for _ in range(n):
        try:
            lat.append(pglab.timed_login("127.0.0.1", port, user=user, database="bench"))
        except (OSError, ConnectionError) as e:
            key = pglab._error_key(e)
            errors[key] = errors.get(key, 0) + 1
    return {"n": n, "ok": len(lat), "errors": errors, "p50_ms": pct_ms(lat, 50),
            "p99_ms": pct_ms(lat, 99), "max_ms": round(max(lat) * 1000, 3) if lat else None}


def console_times(host: str, port: int, user: str) -> dict:
    """SHOW LISTS (client counts), SHOW POOLS timed 5 times, SHOW CLIENTS once, on the
    admin console (host: 127.0.0.1, or a Unix socket directory).  A time runs from sending
    the query to its ReadyForQuery; rows are counted, not decoded."""
    c = pglab.PgConn(host, port, user=user, database="pgbouncer", timeout=60)
    try:
        lists = {r["list"]: int(r["items"]) for r in c.query("SHOW LISTS")}
        pools = [c.timed("SHOW POOLS")[0] for _ in range(5)]
        t_clients, n_clients = c.timed("SHOW CLIENTS")
    finally:
        c.close()
    return {"used_clients": lists.get("used_clients"), "lists": lists,
            "show_pools_ms": [round(x * 1000, 2) for x in pools],
            "show_pools_max_ms": round(max(pools) * 1000, 2),
            "show_clients_ms": round(t_clients * 1000, 2), "show_clients_rows": n_clients}


def login_and_select(port: int, user: str, within: float = 15.0) -> dict:
    """Does the pooler serve a new client (login + SELECT 1)?  Retried for `within` s."""
    t0 = time.monotonic()
    last = None
    while time.monotonic() - t0 < within:
        try:
            c = pglab.PgConn("127.0.0.1", port, user=user, database="bench", timeout=5)
            try:
                ok = c.query("SELECT 1")[0]["?column?"] == "1"
            finally:
                c.close()
            if ok:
                return {"ok": True, "after_s": round(time.monotonic() - t0, 3),
                        "last_error": last}
        except (OSError, ConnectionError) as e:
            last = pglab._error_key(e)
        time.sleep(0.2)
    return {"ok": False, "after_s": None, "last_error": last}


def proc_snapshot(pids: list[int]) -> dict:
    # the kernel's memory first: listing /proc/PID/fd (fd_count) makes a proc inode and a
    # dentry per descriptor, which would otherwise count as memory per client
    kernel = pglab.kernel_memory()
    return {"rss_kb": sum(pglab.vm_rss_kb(p) or 0 for p in pids),
            "cpu_s": sum(pglab.proc_cpu_seconds(p) or 0 for p in pids),
            "fds": sum(pglab.fd_count(p) or 0 for p in pids),
            "kernel": kernel}


def per_client(before: dict, after: dict, opened: int) -> dict:
    """Growth per held client: the pooler's RSS and CPU, and the kernel's slab (both ends
    of each loopback connection, and the client processes' epoll entries)."""
    kb, ka = before["kernel"], after["kernel"]
    ca, cb = ka.pop("slab_caches", {}), kb.pop("slab_caches", {})  # too long to keep
    if not opened:
        return {"rss_bytes": None, "cpu_us_per_login": None, "kernel_slab_bytes": None}
    # the slab caches that grew by 32 bytes or more per client, largest first
    grew = {k: round((ca.get(k, 0) - cb.get(k, 0)) / opened) for k in ca}
    top = dict(sorted(((k, v) for k, v in grew.items() if v >= 32), key=lambda kv: -kv[1]))
    return {
        "slab_caches_bytes": top,
        "rss_bytes": round((after["rss_kb"] - before["rss_kb"]) * 1024 / opened, 1),
        "cpu_us_per_login": round((after["cpu_s"] - before["cpu_s"]) * 1e6 / opened, 1),
        "kernel_slab_bytes": (round((ka["slab_kb"] - kb["slab_kb"]) * 1024 / opened, 1)
                              if "slab_kb" in ka and "slab_kb" in kb else None),
        "kernel_tcp_mem_pages_delta": (ka.get("tcp_mem_pages", 0)
                                       - kb.get("tcp_mem_pages", 0)),
        "sockets_delta": ka.get("sockets_used", 0) - kb.get("sockets_used", 0),
    }


# Seconds after the last idle client logged in when memory is read again (before the
# console is asked anything): sluice parks a client idle for 1-2 s (its task freed,
# frontend/parking.rs) and jemalloc's background thread gives freed pages back after 5 s.
SETTLE_S = 14


def print_settled(x: dict, t: dict, mark) -> None:
    ps = x.get("per_client_settled")
    if ps:
        b = ps["rss_bytes"]
        print(f"    settled, {SETTLE_S} s after the last login: RSS {x['settled']['rss_kb']:,} kB: "
              f"{fmt(b, 0)} bytes = {fmt(kib(b), 2)} KiB per idle client"
              f"{mark(b is not None and b <= t['idle_bytes'])}")


def settle(out: dict, pids: list[int], before: dict) -> None:
    left = SETTLE_S - (time.monotonic() - out["open"]["finished_at"])
    if left > 0:
        time.sleep(left)
    out["settled"] = proc_snapshot(pids)
    out["per_client_settled"] = per_client(before, out["settled"], out["open"]["opened"])


def scale_idle(proxy, user: str, a, src: Sources) -> dict:
    """Part 1: a.scale_idle idle clients through one pooler, then a.scale_overflow more."""
    pid = proxy.pid
    before = proc_snapshot([pid])
    counts, sources = src.split(a.scale_idle, min_workers=4)
    log(f"      {len(counts)} client processes x {counts[0]:,}, source addresses "
        f"{sources[0][0]} .. {sources[-1][-1]}")
    out = {"requested": a.scale_idle, "client_processes": counts,
           "source_addresses": [s for ss in sources for s in ss], "before": before}
    fleet = pglab.ClientFleet("127.0.0.1", proxy.port, user=user, database="bench",
                              counts=counts, sources=sources, concurrency=50, timeout=30)
    try:
        out["open"] = fleet.open()
        out["open"]["finished_at"] = time.monotonic()
        time.sleep(2)
        out["held"] = proc_snapshot([pid])
        out["hwm_kb"] = pglab.vm_hwm_kb(pid)
        out["per_client"] = per_client(before, out["held"], out["open"]["opened"])
        log(f"      opened {out['open']['opened']:,}/{a.scale_idle:,} in "
            f"{out['open']['open_seconds']} s; RSS {before['rss_kb']:,} -> "
            f"{out['held']['rss_kb']:,} kB = {fmt(out['per_client']['rss_bytes'], 0)} B/client")
        # before the console's SHOW CLIENTS: its 19,000 rows are megabytes the allocator
        # keeps for a while
        settle(out, [pid], before)
        log(f"      settled ({SETTLE_S} s after opening): RSS {out['settled']['rss_kb']:,} kB = "
            f"{fmt(out['per_client_settled']['rss_bytes'], 0)} B/client")
        out["console"] = console_times("127.0.0.1", proxy.port, user)
        out["login"] = login_latencies(proxy.port, user)
        log(f"      new login p50 {out['login']['p50_ms']} ms, p99 {out['login']['p99_ms']} ms; "
            f"SHOW POOLS {out['console']['show_pools_max_ms']} ms (max of 5)")
        if a.scale_overflow:
            out["overflow"] = scale_overflow(proxy, user, a.scale_overflow, fleet, src)
    finally:
        fleet.close()
    time.sleep(1)
    out["rss_after_close_kb"] = pglab.vm_rss_kb(pid)
    out["alive_at_end"] = proxy.alive()
    return out


def scale_overflow(proxy, user: str, n: int, fleet, src: Sources) -> dict:
    """n more clients at once on top of the held ones: the pooler runs out of descriptors.
    What the first refused client is told, whether the held clients still get answers
    while it is at the limit, and whether a new client is served once the extra ones left."""
    counts, sources = src.split(n, min_workers=1)
    extra = pglab.ClientFleet("127.0.0.1", proxy.port, user=user, database="bench",
                              counts=counts, sources=sources, concurrency=n, timeout=10)
    out = {"requested": n}
    log_at = proxy.logfile.stat().st_size if proxy.logfile.exists() else 0
    try:
        out["open"] = extra.open()
        out["fds_at_limit"] = pglab.fd_count(proxy.pid)
        out["held_select_1"] = fleet.query("SELECT 1", 5)
    finally:
        extra.close()
    time.sleep(1)
    out["after"] = login_and_select(proxy.port, user)
    out["alive"] = proxy.alive()
    try:  # what the pooler logged meanwhile
        with open(proxy.logfile, "rb") as f:
            f.seek(log_at)
            lines = f.read().decode(errors="replace").splitlines()
        noisy = ("login attempt", "closing because", "new connection to server")
        out["log_lines"] = len(lines)
        out["log"] = [x for x in lines if not any(n in x for n in noisy)][:40]
    except OSError:
        pass
    o = out["open"]
    log(f"      +{n:,}: {o['opened']:,} opened, {o['failed']:,} refused; first error: "
        f"{o['first_error']!r}; held clients' SELECT 1 at the limit: "
        f"{out['held_select_1']['ok']} ok {out['held_select_1']['errors'] or ''}; "
        f"new login + SELECT 1 afterwards: {'ok' if out['after']['ok'] else 'FAILED'}")
    return out


def scale_reuseport(lab: Lab, make_ini, user: str, a, src: Sources) -> dict:
    """Part 2: a.scale_total idle clients over a.scale_procs sluices sharing one port."""
    port = pglab.free_port()
    procs = []
    for k in range(a.scale_procs):
        sock_dir = lab.tmp / f"sock-{k}"
        sock_dir.mkdir()

        def ready(_proxy, sock_dir=sock_dir):  # its own console answers on its socket
            try:
                pglab.PgConn(str(sock_dir), port, user=user, database="pgbouncer",
                             timeout=2).close()
                return True
            except (OSError, ConnectionError):
                return False
        procs.append(lab.start_proxy(f"sluice-rp{k}", make_ini({"so_reuseport": 1},
                                                               str(sock_dir)),
                                     port=port, ready=ready))
    pids = [p.pid for p in procs]
    log(f"      {a.scale_procs} sluices on 127.0.0.1:{port} (pids {', '.join(map(str, pids))})")
    before = proc_snapshot(pids)
    counts, sources = src.split(a.scale_total, min_workers=a.scale_procs)
    log(f"      {len(counts)} client processes x {counts[0]:,}, "
        f"{sum(len(s) for s in sources)} source addresses "
        f"{sources[0][0]} .. {sources[-1][-1]}")
    out = {"port": port, "pids": pids, "requested": a.scale_total, "client_processes": counts,
           "source_addresses": [s for ss in sources for s in ss], "before": before,
           "rss_before_each_kb": [pglab.vm_rss_kb(p) for p in pids]}
    fleet = pglab.ClientFleet("127.0.0.1", port, user=user, database="bench",
                              counts=counts, sources=sources, concurrency=50, timeout=30)
    try:
        out["open"] = fleet.open()
        out["open"]["finished_at"] = time.monotonic()
        time.sleep(2)
        out["held"] = proc_snapshot(pids)
        out["rss_held_each_kb"] = [pglab.vm_rss_kb(p) for p in pids]
        out["fds_each"] = [pglab.fd_count(p) for p in pids]
        out["per_client"] = per_client(before, out["held"], out["open"]["opened"])
        settle(out, pids, before)
        each = [console_times(str(lab.tmp / f"sock-{k}"), port, user)
                for k in range(a.scale_procs)]
        # used_clients counts the console connection that asks, too
        out["clients_each"] = [c["used_clients"] - 1 if c["used_clients"] is not None else None
                               for c in each]
        out["console_each"] = each
        out["login"] = login_latencies(port, user)
        out["alive"] = [p.alive() for p in procs]
    finally:
        fleet.close()
    log(f"      opened {out['open']['opened']:,}/{a.scale_total:,} in "
        f"{out['open']['open_seconds']} s; per sluice {out['clients_each']}; "
        f"{out['per_client'].get('rss_bytes')} B/client; new login p99 "
        f"{out['login']['p99_ms']} ms")
    for p in procs:
        pglab.stop_process(p.proc)
    return out


def scale_active(lab: Lab, kind: str, proxy, user: str, a) -> dict:
    """Part 3: a.scale_active pgbench clients, select-only, through a pool of 20."""
    cpu0 = pglab.proc_cpu_seconds(proxy.pid)
    res = pglab.run_pgbench(host="127.0.0.1", port=proxy.port, dbname="bench", user=user,
                            clients=a.scale_active, jobs=a.jobs, duration=a.duration,
                            mode="simple", select_only=True,
                            log_dir=lab.tmp / f"pgbench-{kind}",
                            sampling_rate=a.sampling_rate, timeout=a.duration + 300)
    cpu1 = pglab.proc_cpu_seconds(proxy.pid)
    tx = res.get("transactions") or 0
    res["proxy_cpu_s"] = round(cpu1 - cpu0, 3) if cpu0 is not None and cpu1 else None
    res["cpu_us_per_tx"] = (round(res["proxy_cpu_s"] * 1e6 / tx, 2)
                            if res["proxy_cpu_s"] and tx else None)
    res["p99_over_p50"] = ratio(res.get("p99_ms"), res.get("p50_ms"))
    res["alive"] = proxy.alive()
    log(f"      tps {fmt(res.get('tps'))}, p50 {res.get('p50_ms')} ms, p99 {res.get('p99_ms')} ms, "
        f"p99/p50 {res['p99_over_p50']}, connect {fmt(res.get('initial_connection_ms'))} ms"
        + (f"  [{res['error'][:120]}]" if res.get("error") else ""))
    return res


def scale_main(a) -> int:
    nofile = pglab.raise_nofile()
    pglab.install_signal_handlers()
    t_start = time.monotonic()
    started = dt.datetime.now(dt.timezone.utc)
    pgb125, pgb125_from = pgbouncer125()
    result = {
        "schema": 1, "mode": "scale-clients",
        "started_utc": started.isoformat(timespec="seconds"),
        "command": " ".join(["python3", "scripts/bench.py"] + sys.argv[1:]),
        "args": vars(a), "rlimit_nofile": list(nofile), "machine": pglab.machine_info(),
        "versions": versions(pgb125),
        "settings": {"max_connections": MAX_CONNECTIONS, "pool_mode": "transaction",
                     "default_pool_size": POOL_SIZE, "max_client_conn": SCALE_MAX_CLIENT_CONN,
                     "listen_backlog": SCALE_BACKLOG, "clients_per_process": PER_WORKER,
                     "clients_per_source_address": PER_SOURCE},
        "targets_issue": TARGETS, "idle": {}, "reuseport": None, "active": {},
    }
    log(f"RLIMIT_NOFILE {nofile[0]}/{nofile[1]}; pgbouncer125: {pgb125 or pgb125_from}")
    with pglab.Sysctls(SCALE_SYSCTLS) as sysctls:
        result["sysctl_changed"] = {k: {"old": o, "new": n}
                                    for k, (o, n) in sysctls.changed.items()}
        result["sysctl_failed"] = sysctls.failed
        for k, (o, n) in sysctls.changed.items():
            log(f"sysctl {k}: {o} -> {n} (put back at the end)")
        for k, why in sysctls.failed.items():
            warn(f"sysctl {k} not changed: {why}")
        with Lab(prefix="sluice-scale-") as lab:
            scale_run(lab, a, pgb125, pgb125_from, result)
    log("sysctl values put back: " + (", ".join(f"{k} = {o}" for k, (o, _n)
                                                 in sysctls.changed.items()) or "none changed"))
    result["finished_utc"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    result["wall_seconds"] = round(time.monotonic() - t_start, 1)
    print_scale_report(result, a)
    out_dir = Path(a.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    text = json.dumps(result, indent=2) + "\n"
    path = out_dir / f"scale-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    path.write_text(text)
    (out_dir / "scale-latest.json").write_text(text)
    log(f"\nJSON: {path} (and {out_dir / 'scale-latest.json'}); wall time "
        f"{result['wall_seconds']} s")
    return 0


def scale_run(lab: Lab, a, pgb125: str | None, pgb125_from: str, result: dict) -> None:
    log(f"starting PostgreSQL (max_connections={MAX_CONNECTIONS}, pgbench scale {SCALE}) ...")
    cluster = lab.start_cluster(max_connections=MAX_CONNECTIONS, reserved=RESERVED,
                                scale=SCALE, auth="trust")
    pg_port = int(cluster["port"])
    user = cluster.get("superuser") or "postgres"
    auth_file = lab.write("userlist.txt",
                          pglab.userlist({user: cluster.get("password") or user}))

    def make_ini(more: dict | None = None, unix_socket_dir: str = ""):
        extra = {"listen_backlog": SCALE_BACKLOG, **(more or {})}

        def ini(port, logfile):
            return pglab.pooler_ini(pg_port=pg_port, listen_port=port, logfile=logfile,
                                    auth_file=auth_file, default_pool_size=POOL_SIZE,
                                    max_client_conn=SCALE_MAX_CLIENT_CONN, admin_users=user,
                                    extra=extra, unix_socket_dir=unix_socket_dir)
        return ini

    proxies = {}
    if {"idle", "active"} & set(a.scale_parts):
        proxies["sluice"] = lab.start_proxy("sluice", make_ini())
        if pgb125:
            try:
                with pgbouncer_binary(pgb125):
                    proxies["pgbouncer125"] = lab.start_proxy(
                        "pgbouncer125", make_ini({"max_prepared_statements": MAX_PREPARED}))
            except LabError as e:
                warn(f"pgbouncer125 did not start, skipped: {e}")
                result["pgbouncer125_skipped"] = str(e)
        else:
            warn(f"pgbouncer125: {pgb125_from}: skipped")
            result["pgbouncer125_skipped"] = pgb125_from
        for kind, p in proxies.items():
            log(f"{kind} on 127.0.0.1:{p.port} (pid {p.pid})")
            result.setdefault("ini", {})[kind] = p.ini.read_text()
    src = Sources()
    if "idle" in a.scale_parts:
        for kind, p in proxies.items():
            log(f"[1] {a.scale_idle:,} idle clients through {kind} ...")
            result["idle"][kind] = scale_idle(p, user, a, src)
    if "active" in a.scale_parts:
        for kind, p in proxies.items():
            if not p.alive():
                result["active"][kind] = {"error": f"{kind} is not running"}
                continue
            log(f"[3] pgbench -S -c {a.scale_active:,} -j {a.jobs} -T {a.duration} through "
                f"{kind} ...")
            result["active"][kind] = scale_active(lab, kind, p, user, a)
    for p in proxies.values():
        pglab.stop_process(p.proc)
    if "reuseport" in a.scale_parts:
        log(f"[2] {a.scale_total:,} idle clients over {a.scale_procs} sluices (so_reuseport) ...")
        result["reuseport"] = scale_reuseport(lab, make_ini, user, a, src)
    result["sources_used"] = src.next - 2


def print_scale_report(r: dict, a) -> None:
    t = r["targets_issue"]

    def mark(ok):
        return "" if ok is None else ("  (target met)" if ok else "  (target NOT met)")
    print()
    print(f"== --scale-clients: {r['machine']['nproc']} CPUs, RLIMIT_NOFILE "
          f"{r['rlimit_nofile'][0]:,}, pool_mode=transaction, default_pool_size={POOL_SIZE}, "
          f"PostgreSQL max_connections={MAX_CONNECTIONS}")
    print("sysctl for the run (put back after): " + (", ".join(
        f"{k} {v['old']} -> {v['new']}" for k, v in r["sysctl_changed"].items()) or "none"))
    for kind, x in r["idle"].items():
        o, pc, c, lg = x["open"], x["per_client"], x["console"], x["login"]
        print(f"\n[1] {kind}: {o['opened']:,}/{x['requested']:,} idle clients "
              f"({len(x['client_processes'])} client processes, "
              f"{len(x['source_addresses'])} source addresses, {o['failed']} failed"
              f"{', ' + str(o['errors']) if o['errors'] else ''}) in {o['open_seconds']} s")
        print(f"    RSS {x['before']['rss_kb']:,} -> {x['held']['rss_kb']:,} kB: "
              f"{fmt(pc['rss_bytes'], 0)} bytes = {fmt(kib(pc['rss_bytes']), 2)} KiB per idle "
              f"client{mark(pc['rss_bytes'] is not None and pc['rss_bytes'] <= t['idle_bytes'])}; "
              f"pooler CPU {pc['cpu_us_per_login']} us per login")
        print_settled(x, t, mark)
        print(f"    new login while held ({lg['ok']}/{lg['n']} one after the other): "
              f"p50 {lg['p50_ms']} ms, p99 {lg['p99_ms']} ms, max {lg['max_ms']} ms"
              f"{mark(lg['p99_ms'] is not None and lg['p99_ms'] < t['login_p99_ms'])}")
        print(f"    SHOW POOLS {c['show_pools_max_ms']} ms (max of 5: {c['show_pools_ms']})"
              f"{mark(c['show_pools_max_ms'] < t['show_pools_ms'])}; SHOW CLIENTS "
              f"({c['show_clients_rows']:,} rows) {c['show_clients_ms']} ms; "
              f"used_clients {c['used_clients']:,}")
        kb, kh = x["before"]["kernel"], x["held"]["kernel"]
        print(f"    kernel: sockets {kb.get('sockets_used'):,} -> {kh.get('sockets_used'):,}, "
              f"TCP mem {kb.get('tcp_mem_pages')} -> {kh.get('tcp_mem_pages')} pages, slab "
              f"{kb.get('slab_kb'):,} -> {kh.get('slab_kb'):,} kB = "
              f"{fmt(pc['kernel_slab_bytes'], 0)} bytes per client (both ends of the loopback "
              f"connection); pooler fds {x['before']['fds']} -> {x['held']['fds']:,}")
        print("    slab growth per client, by cache (bytes): " + ", ".join(
            f"{k} {v:,}" for k, v in list(pc.get("slab_caches_bytes", {}).items())[:8]))
        ov = x.get("overflow")
        if ov:
            oo = ov["open"]
            print(f"    +{ov['requested']:,} past that: {oo['opened']:,} opened, "
                  f"{oo['failed']:,} not ({oo['errors']}); pooler fds at the limit: "
                  f"{ov['fds_at_limit']}")
            print(f"      first error: {oo['first_error']!r}")
            if ov.get("log"):
                print(f"      its log meanwhile ({ov['log_lines']:,} lines), the first but "
                      "logins and closes:")
                for line in ov["log"][:4]:
                    print(f"        {line[:200]}")
            hs = ov["held_select_1"]
            print(f"      held clients' SELECT 1 at the limit: {hs['ok']} ok"
                  f"{', errors ' + str(hs['errors']) if hs['errors'] else ''}; after the "
                  f"extra clients left, new login + SELECT 1: "
                  + (f"ok (after {ov['after']['after_s']} s)" if ov["after"]["ok"]
                     else f"FAILED ({ov['after']['last_error']})")
                  + f"; process {'alive' if ov['alive'] else 'DEAD'}")
    rp = r.get("reuseport")
    if rp:
        o, pc, lg = rp["open"], rp["per_client"], rp["login"]
        print(f"\n[2] {len(rp['pids'])} sluices, so_reuseport, one port: {o['opened']:,}/"
              f"{rp['requested']:,} idle clients ({len(rp['client_processes'])} client "
              f"processes x {rp['client_processes'][0]:,}, {len(rp['source_addresses'])} source "
              f"addresses, {o['failed']} failed{', ' + str(o['errors']) if o['errors'] else ''})"
              f" in {o['open_seconds']} s")
        print(f"    clients per sluice (SHOW LISTS used_clients): {rp['clients_each']} "
              f"= {sum(c or 0 for c in rp['clients_each']):,}; fds {rp['fds_each']}")
        print(f"    RSS summed over the {len(rp['pids'])}: {rp['before']['rss_kb']:,} -> "
              f"{rp['held']['rss_kb']:,} kB = {fmt(pc['rss_bytes'], 0)} bytes per idle client; "
              f"CPU {pc['cpu_us_per_login']} us per login; kernel slab "
              f"{fmt(pc['kernel_slab_bytes'], 0)} bytes per client")
        print_settled(rp, t, mark)
        print(f"    new login while held: p50 {lg['p50_ms']} ms, p99 {lg['p99_ms']} ms, max "
              f"{lg['max_ms']} ms ({lg['ok']}/{lg['n']})"
              f"{mark(lg['p99_ms'] is not None and lg['p99_ms'] < t['login_p99_ms'])}; "
              f"SHOW POOLS max {max(c['show_pools_max_ms'] for c in rp['console_each'])} ms")
    for kind, x in r["active"].items():
        if "tps" not in x:
            print(f"\n[3] {kind}: {x.get('error')}")
            continue
        ok = x["p99_over_p50"] is not None and x["p99_over_p50"] <= t["p99_over_p50"]
        print(f"\n[3] {kind}: pgbench -S -c {a.scale_active:,} -j {a.jobs} -T {a.duration}, "
              f"pool {POOL_SIZE}: tps {fmt(x['tps'])}, p50 {x['p50_ms']} ms, p99 "
              f"{x['p99_ms']} ms, p99/p50 {x['p99_over_p50']}{mark(ok)}")
        print(f"    {x.get('latency_samples', 0):,} sampled transactions "
              f"(--sampling-rate {a.sampling_rate}), avg {x.get('lat_avg_ms')} ms, connect "
              f"{fmt(x.get('initial_connection_ms'))} ms, failed clients "
              f"{x.get('failed_clients')}, pooler CPU {x.get('cpu_us_per_tx')} us/tx"
              + (f"; error: {x['error'][:160]}" if x.get("error") else ""))
    if r.get("pgbouncer125_skipped"):
        print(f"\npgbouncer125 SKIPPED: {r['pgbouncer125_skipped']}")


# ---------------------------------------------------------------------------
# --profile: what one transaction costs each proxy, in instructions and syscalls
# ---------------------------------------------------------------------------
# What is measured, and why it is set up this way:
#  * Instructions: the proxy runs under valgrind --tool=callgrind --instr-atstart=no, so
#    nothing is counted until callgrind_control --instr=on, sent after a 2 s warm-up (the
#    pools are full, the code is translated, -M prepared statements are prepared on the
#    servers) and switched off again when the measured pgbench run is over.  Ir/tx = the
#    instructions of all the proxy's threads in user space (the kernel's work is not in it)
#    / pgbench's "number of transactions actually processed".  pgbench's own logins fall
#    in the window too (--clients of them per run, amortized over its transactions).
#    Instructions are counted, not timed: a busy machine does not change them, and valgrind
#    slowing the proxy 30-50x only lowers the number of transactions.
#  * Syscalls: the proxy runs normally and strace -c -f is attached to all its threads
#    after the warm-up and detached (SIGINT) after the measured run; each syscall's count
#    / pgbench's transactions.  strace slows the proxy, which changes no count per
#    transaction except perhaps the epoll_wait ones (fewer ready events per wait when the
#    proxy is slower, more when it is faster): read those as an order of magnitude.
#  * A fresh proxy per measurement; targets alternate within each round (A B A B) and the
#    report gives the median over rounds.  callgrind_control without a pid talks to every
#    callgrind it finds under vgdb's default prefix, anyone else's too: ours get a
#    --vgdb-prefix in the lab's directory and callgrind_control is given it and the pid,
#    and runs as the proxy's user (postgres for PgBouncer, which refuses to run as root).

PROFILE_TARGETS = ("sluice", "sluice-base", "sluice-epoll", "pgbouncer", "pgbouncer125")
PROFILE_TOOLS = ("callgrind", "strace")
PROFILE_WARMUP = 2          # seconds of pgbench before each measured run, not counted
PROFILE_SYSCALLS = ("sendto", "recvfrom", "epoll_wait", "epoll_ctl")  # always a column
PROFILE_MAX_EXTRA = 5       # other syscalls with a column of their own (>= 0.1/tx somewhere)


def profile_args(ap, a):
    a.duration = a.duration or 10
    a.rounds = a.rounds or 2
    a.jobs = a.jobs or 2
    a.sampling_rate = a.sampling_rate or 1.0
    a.clients = [int(c) for c in (a.clients or "50").split(",") if c.strip()]
    a.modes = [m.strip() for m in (a.modes or "simple,prepared").split(",") if m.strip()]
    a.targets = [t.strip() for t in (a.targets or "sluice,pgbouncer,pgbouncer125").split(",")
                 if t.strip()]
    a.profile_tools = [x.strip() for x in a.profile_tools.split(",") if x.strip()]
    check_choices(ap, a.targets, PROFILE_TARGETS, "--profile target",
                  " (sluice, sluice-base, sluice-epoll, pgbouncer, pgbouncer125)")
    check_choices(ap, a.modes, MODES, "mode")
    check_choices(ap, a.profile_tools, PROFILE_TOOLS, "--profile-tools entry",
                  " (callgrind, strace)")
    if (a.duration < 1 or a.rounds < 1 or not a.clients or not a.targets or not a.modes
            or not a.profile_tools):
        ap.error("empty matrix")
    return a


def profile_main(a) -> int:
    nofile = pglab.raise_nofile()
    pglab.install_signal_handlers()
    need = (["valgrind", "callgrind_control", "callgrind_annotate"]
            if "callgrind" in a.profile_tools else []) + (
        ["strace"] if "strace" in a.profile_tools else [])
    missing = [x for x in need if not shutil.which(x)]
    if missing:
        raise LabError(f"--profile needs {', '.join(missing)} (make peers installs valgrind "
                       "and strace)")
    t_start = time.monotonic()
    started = dt.datetime.now(dt.timezone.utc)
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    out_dir = Path(a.out_dir)
    cg_keep = out_dir / f"profile-{stamp}"
    pgb125, pgb125_from = (pgbouncer125() if "pgbouncer125" in a.targets
                           else (None, "not requested"))
    if pgb125:
        log(f"pgbouncer125: {pgb125} ({pgb125_from})")
    result = {
        "schema": 1, "mode": "profile",
        "started_utc": started.isoformat(timespec="seconds"),
        "command": " ".join(["python3", "scripts/bench.py"] + sys.argv[1:]),
        "args": vars(a), "rlimit_nofile": list(nofile), "loadavg_start": loadavg(),
        "machine": pglab.machine_info(), "versions": versions(pgb125),
        "tools": {"valgrind": first_line("valgrind", "--version"),
                  "strace": first_line("strace", "-V")},
        "settings": {"max_connections": MAX_CONNECTIONS, "superuser_reserved_connections":
                     RESERVED, "pgbench_scale": SCALE, "pool_mode": "transaction",
                     "default_pool_size": POOL_SIZE, "pgbench": "-S (select-only), -n",
                     "warmup_s": PROFILE_WARMUP, "jobs": a.jobs,
                     "callgrind": "valgrind --tool=callgrind --instr-atstart=no; "
                                  "callgrind_control --instr=on/off around the measured run",
                     "strace": "strace -c -f -p PID, attached for the measured run"},
        "targets": {}, "runs": [], "summary": [],
    }
    with Lab(prefix="sluice-profile-") as lab:
        cluster, pg_port, user, password, auth_file = bench_cluster(lab, result, replica=False)
        server_host = server_host_for(a, cluster, result)
        # callgrind writes its file as the proxy's user: postgres for PgBouncer
        cg_dir = lab.tmp / "callgrind"
        cg_dir.mkdir()
        lab.chown_pg(cg_dir)

        binaries = {}
        for kind in a.targets:
            if kind in ("sluice", "sluice-epoll"):
                b = pglab.sluice_bin()
                why = (None if Path(b).exists() or shutil.which(b) else
                       f"{b} not found: build it (cargo build --release -p sluice) or set "
                       "SLUICE_BIN")
            elif kind == "sluice-base":
                b = os.environ.get("SLUICE_BASE_BIN") or ""
                why = (None if b and Path(b).exists() else
                       f"SLUICE_BASE_BIN={b} not found" if b else
                       "SLUICE_BASE_BIN is not set (path of the sluice to compare with)")
            elif kind == "pgbouncer":
                b = pglab.pgbouncer_bin()
                why = None if b else "pgbouncer not found (install it or set PGBOUNCER_BIN)"
            else:
                b, why = pgb125, (None if pgb125 else pgb125_from)
            if why:
                warn(f"{kind}: {why}: skipped")
                result["targets"][kind] = {"skipped": why}
            else:
                binaries[kind] = b
                result["targets"][kind] = {"bin": b}
        targets = [t for t in a.targets if t in binaries]
        if not targets:
            raise LabError("no target left to profile")

        def ini_for(kind):
            extra = {"max_prepared_statements": MAX_PREPARED} if kind == "pgbouncer125" else None

            def ini(port, logfile):
                text = pglab.pooler_ini(pg_port=pg_port, listen_port=port, logfile=logfile,
                                        auth_file=auth_file, default_pool_size=POOL_SIZE,
                                        max_client_conn=12000, admin_users=user, extra=extra,
                                        pg_host=server_host)
                if kind == "sluice-epoll":
                    text += "\n[sluice]\nio_backend = epoll\n"
                return text
            return ini

        total = len(a.modes) * len(a.clients) * a.rounds * len(targets) * len(a.profile_tools)
        i = 0
        for mode in a.modes:
            for clients in a.clients:
                for rnd in range(1, a.rounds + 1):
                    for t in targets:
                        for tool in a.profile_tools:
                            i += 1
                            tag = f"{t}-{mode}-c{clients}-r{rnd}-{tool}"
                            log(f"[{i}/{total}] {mode} c={clients} {t} {tool} round {rnd} ...")
                            run = {"mode": mode, "clients": clients, "target": t,
                                   "tool": tool, "round": rnd}
                            fn = profile_callgrind if tool == "callgrind" else profile_strace
                            try:
                                run.update(fn(lab, a, t, binaries[t], ini_for(t), user,
                                              password, mode, clients, tag, cg_dir))
                            except LabError as e:
                                run["error"] = str(e)
                            if run.get("callgrind_files"):
                                cg_keep.mkdir(parents=True, exist_ok=True)
                                kept = []
                                for f in run["callgrind_files"]:
                                    shutil.copy2(f, cg_keep / Path(f).name)
                                    kept.append(str(cg_keep / Path(f).name))
                                run["callgrind_files"] = kept
                            result["runs"].append(run)
                            log("      " + profile_short(run))

    result["summary"] = profile_summary(result["runs"], a, targets)
    result["loadavg_end"] = loadavg()
    result["finished_utc"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    result["wall_seconds"] = round(time.monotonic() - t_start, 1)
    columns = profile_columns(result["summary"])
    print()
    print(profile_report(result, a, targets, columns, markdown=False))
    out_dir.mkdir(parents=True, exist_ok=True)
    text = json.dumps(result, indent=2) + "\n"
    path = out_dir / f"profile-{stamp}.json"
    path.write_text(text)
    (out_dir / "profile-latest.json").write_text(text)
    md = profile_report(result, a, targets, columns, markdown=True)
    (out_dir / f"profile-{stamp}.md").write_text(md)
    (out_dir / "profile-latest.md").write_text(md)
    log(f"\nJSON: {path}, markdown: {out_dir / f'profile-{stamp}.md'} (and profile-latest.*)"
        + (f", callgrind files: {cg_keep}/" if cg_keep.exists() else "")
        + f"; wall time {result['wall_seconds']} s")
    return 0


def profile_start(lab: Lab, kind: str, name: str, binary: str, ini_for_port,
                  wrap: list[str] = (), timeout: float = 20) -> pglab.Proxy:
    """Lab.start_proxy, with the binary given and an optional command in front of it
    (valgrind); PgBouncer runs as postgres (it refuses root), and so does its valgrind."""
    port = pglab.free_port()
    logfile = lab.tmp / f"{name}.log"
    logfile.touch()
    lab.chown_pg(logfile)
    ini = lab.write(f"{name}.ini", ini_for_port(port, logfile))
    errf = lab.open_file(lab.tmp / f"{name}.stderr")
    proc = lab.spawn(name, list(wrap) + [binary, str(ini)],
                     as_postgres=kind.startswith("pgbouncer"), stdout=errf, stderr=errf,
                     stdin=subprocess.DEVNULL, cwd=str(lab.tmp))
    proxy = pglab.Proxy(kind, proc, port, ini, logfile)
    try:
        pglab.wait_port("127.0.0.1", port, timeout, proc)
    except LabError as e:
        profile_stop(proxy)
        raise LabError(f"{name} did not start: {e}\n{proxy.log_tail()}")
    return proxy


def profile_stop(proxy: pglab.Proxy, wait: float = 30) -> None:
    """SIGINT (shut down once the clients are gone: pgbench is), then SIGTERM, to the proxy
    itself (under valgrind the same pid), so that callgrind writes its file on the way
    out; SIGKILL to its group last."""
    proc = proxy.proc
    for sig in (signal.SIGINT, signal.SIGTERM):
        if proc.poll() is not None:
            return
        try:
            proc.send_signal(sig)
            proc.wait(timeout=wait)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            pass
    pglab.stop_process(proc)


def profile_pgbench(a, port: int, user: str, password, mode: str, clients: int,
                    duration: int) -> dict:
    res = pglab.run_pgbench(host="127.0.0.1", port=port, dbname="bench", user=user,
                            password=password, clients=clients, jobs=a.jobs,
                            duration=duration, mode=mode, select_only=True,
                            timeout=duration + 60)
    bad = None
    if res.get("aborted") or res.get("failed_clients") or not res.get("transactions"):
        bad = res.get("error") or (f"{res['failed_clients']} client(s) failed"
                                   if res.get("failed_clients") else "no transactions")
    res["bad"] = bad
    return res


def pgbench_fields(res: dict) -> dict:
    return {"tx": res.get("transactions"), "tps": res.get("tps"),
            "lat_avg_ms": res.get("lat_avg_ms"), "pgbench": res.get("command")}


def profile_callgrind(lab: Lab, a, kind: str, binary: str, ini, user: str, password,
                      mode: str, clients: int, tag: str, cg_dir: Path) -> dict:
    """Ir/tx: the proxy under callgrind, counting only during the measured pgbench run."""
    out_file = cg_dir / f"{tag}.out"
    # vgdb's FIFOs under our own prefix: a callgrind_control without a pid elsewhere on
    # the machine (it addresses every callgrind it finds under /tmp/vgdb-pipe) cannot
    # switch this proxy's counting on or off, nor hang it
    prefix = f"--vgdb-prefix={cg_dir / 'vgdb-pipe'}"
    wrap = ["valgrind", "--tool=callgrind", "--instr-atstart=no", prefix,
            f"--callgrind-out-file={out_file}"]
    proxy = profile_start(lab, kind, tag, binary, ini, wrap, timeout=180)
    as_pg = kind.startswith("pgbouncer")
    try:
        warm = profile_pgbench(a, proxy.port, user, password, mode, clients, PROFILE_WARMUP)
        if warm["bad"]:
            return {"error": f"warm-up: {warm['bad']}"}
        callgrind_control(lab, proxy.pid, as_pg, prefix, "--instr=on")
        res = profile_pgbench(a, proxy.port, user, password, mode, clients, a.duration)
        callgrind_control(lab, proxy.pid, as_pg, prefix, "--instr=off")
    finally:
        profile_stop(proxy)
    out = pgbench_fields(res)
    if res["bad"]:
        out["error"] = f"{res['bad']} (the proxy's log: {proxy.log_tail(3)[-300:]})"
        return out
    files = sorted(cg_dir.glob(f"{tag}.out*"))
    if not files:
        out["error"] = f"callgrind wrote no {out_file} (exit code {proxy.proc.returncode})"
        return out
    out["callgrind_files"] = [str(f) for f in files]
    out["ir"] = sum(callgrind_total(f) for f in files)
    out["ir_per_tx"] = round(out["ir"] / out["tx"], 1)
    return out


def callgrind_control(lab: Lab, pid: int, as_pg: bool, *args: str) -> None:
    """callgrind_control ARGS PID as the proxy's user (vgdb finds the FIFOs of its own
    user's valgrinds only)."""
    kw = {}
    if as_pg and lab.pg_uid is not None:
        kw = {"user": lab.pg_uid, "group": lab.pg_gid, "extra_groups": []}
    try:
        r = subprocess.run(["callgrind_control", *args, str(pid)], capture_output=True,
                           text=True, timeout=60, stdin=subprocess.DEVNULL, **kw)
    except subprocess.TimeoutExpired:
        raise LabError(f"callgrind_control {' '.join(args)} {pid}: no answer in 60 s")
    text = (r.stdout + r.stderr).strip()
    if r.returncode != 0 or "OK." not in text or "Error" in text:
        raise LabError(f"callgrind_control {' '.join(args)} {pid} failed: {text[-300:]}")


def callgrind_total(path: Path) -> int:
    """The PROGRAM TOTALS line of callgrind_annotate (the Ir of all the file's threads)."""
    r = subprocess.run(["callgrind_annotate", str(path)], capture_output=True, text=True,
                       timeout=300)
    for line in r.stdout.splitlines():
        if "PROGRAM TOTALS" in line:
            return int(line.split()[0].replace(",", ""))
    raise LabError(f"callgrind_annotate {path}: no PROGRAM TOTALS ({r.stderr.strip()[-200:]})")


def profile_strace(lab: Lab, a, kind: str, binary: str, ini, user: str, password,
                   mode: str, clients: int, tag: str, _cg_dir: Path) -> dict:
    """syscalls/tx: strace -c -f attached to the (normally running) proxy for the
    measured pgbench run only."""
    proxy = profile_start(lab, kind, tag, binary, ini)
    st_file = lab.tmp / f"{tag}.txt"
    st = None
    try:
        warm = profile_pgbench(a, proxy.port, user, password, mode, clients, PROFILE_WARMUP)
        if warm["bad"]:
            return {"error": f"warm-up: {warm['bad']}"}
        errf = lab.open_file(lab.tmp / f"{tag}.strace.stderr")
        st = lab.spawn(f"strace {tag}", ["strace", "-c", "-f", "-p", str(proxy.pid), "-o",
                                         str(st_file)],
                       stdout=errf, stderr=errf, stdin=subprocess.DEVNULL)
        threads = wait_traced(proxy.pid, st, 15)
        res = profile_pgbench(a, proxy.port, user, password, mode, clients, a.duration)
        st.send_signal(signal.SIGINT)  # detach; strace writes the table
        try:
            st.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pglab.stop_process(st)
    finally:
        if st is not None and st.poll() is None:
            pglab.stop_process(st, signal.SIGINT)
        pglab.stop_process(proxy.proc)
    out = pgbench_fields(res)
    out["threads_traced"] = threads
    if res["bad"]:
        out["error"] = res["bad"]
        return out
    try:
        calls, errors = parse_strace_c(st_file.read_text())
    except OSError as e:
        raise LabError(f"strace wrote no table ({e}): "
                       + (lab.tmp / f"{tag}.strace.stderr").read_text()[-300:])
    out["syscalls"] = calls
    out["syscall_errors"] = errors
    out["syscalls_per_tx"] = {k: round(v / out["tx"], 3) for k, v in calls.items()}
    out["syscalls_total_per_tx"] = round(sum(calls.values()) / out["tx"], 3)
    return out


def wait_traced(pid: int, st: subprocess.Popen, timeout: float) -> int:
    """Waits until strace traces every thread of pid; returns how many."""
    deadline = time.monotonic() + timeout
    while True:
        tracers = []
        for status in Path(f"/proc/{pid}/task").glob("*/status"):
            try:
                for line in status.read_text().splitlines():
                    if line.startswith("TracerPid:"):
                        tracers.append(int(line.split()[1]))
            except (OSError, ValueError):
                pass
        if tracers and all(x == st.pid for x in tracers):
            return len(tracers)
        if st.poll() is not None:
            raise LabError(f"strace exited with code {st.returncode} before attaching")
        if time.monotonic() > deadline:
            raise LabError(f"strace did not attach to all threads of {pid} in {timeout} s")
        time.sleep(0.05)


def parse_strace_c(text: str) -> tuple[dict, dict]:
    """strace -c's table: {syscall: calls}, {syscall: errors}."""
    calls, errors = {}, {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 5 or parts[-1] == "total" or not parts[0][0].isdigit():
            continue
        try:
            nums = parts[:-1]
            calls[parts[-1]] = int(nums[3])
            if len(nums) > 4:
                errors[parts[-1]] = int(nums[4])
        except (ValueError, IndexError):
            continue
    if not calls:
        raise LabError("no syscall counted in strace's table:\n" + text[-500:])
    return calls, errors


def profile_short(run: dict) -> str:
    if run.get("error") and run.get("tx") is None:
        return f"[{run['error'][:160]}]"
    s = f"tx={fmt(run.get('tx'))} (tps {fmt(run.get('tps'))})"
    if run.get("ir_per_tx") is not None:
        s += f" Ir={fmt(run['ir'])} Ir/tx={fmt(run['ir_per_tx'], 0)}"
    if run.get("syscalls_per_tx"):
        top = sorted(run["syscalls_per_tx"].items(), key=lambda kv: -kv[1])[:5]
        s += (f" syscalls/tx={run['syscalls_total_per_tx']:.2f} ("
              + ", ".join(f"{k} {v:.2f}" for k, v in top) + ")")
    if run.get("error"):
        s += f"  [{run['error'][:120]}]"
    return s


def profile_summary(runs, a, targets):
    out = []
    for mode in a.modes:
        for clients in a.clients:
            cells = {}
            for t in targets:
                mine = [r for r in runs if r["mode"] == mode and r["clients"] == clients
                        and r["target"] == t]
                cg = [r for r in mine if r["tool"] == "callgrind" and r.get("ir_per_tx")]
                st = [r for r in mine if r["tool"] == "strace" and r.get("syscalls_per_tx")]
                names = sorted({k for r in st for k in r["syscalls_per_tx"]})
                errs = [f"{r['tool']} round {r['round']}: {r['error']}" for r in mine
                        if r.get("error")]
                irs = [r["ir_per_tx"] for r in cg]
                cells[t] = {
                    "mode": mode, "clients": clients, "target": t,
                    "callgrind_rounds": len(cg), "strace_rounds": len(st),
                    "tx_callgrind": med([r["tx"] for r in cg]),
                    "ir_per_tx": med(irs),
                    "ir_per_tx_min": min(irs, default=None),
                    "ir_per_tx_max": max(irs, default=None),
                    "tx_strace": med([r["tx"] for r in st]),
                    "syscalls_per_tx": {k: med([r["syscalls_per_tx"].get(k, 0) for r in st])
                                        for k in names},
                    "syscalls_total_per_tx": med([r["syscalls_total_per_tx"] for r in st]),
                    "errors": errs,
                }
            b = cells.get("pgbouncer125")
            for c in cells.values():
                if b:
                    c["ir_ratio_vs_pgbouncer125"] = ratio(c["ir_per_tx"], b["ir_per_tx"])
                    c["syscalls_ratio_vs_pgbouncer125"] = ratio(c["syscalls_total_per_tx"],
                                                                b["syscalls_total_per_tx"])
            out.extend(cells.values())
    return out


def profile_columns(summary) -> list[str]:
    """The syscall columns: PROFILE_SYSCALLS, then the others that reach 0.1/tx in some
    row (io_uring_enter whenever it shows), largest first; the rest make "other"."""
    peak = {}
    for s in summary:
        for k, v in s["syscalls_per_tx"].items():
            if k not in PROFILE_SYSCALLS:
                peak[k] = max(peak.get(k, 0), v or 0)
    extra = sorted((k for k, v in peak.items() if v >= 0.1 or k == "io_uring_enter"),
                   key=lambda k: (k != "io_uring_enter", -peak[k]))
    return list(PROFILE_SYSCALLS) + extra[:PROFILE_MAX_EXTRA]


def profile_report(result, a, targets, columns, markdown: bool) -> str:
    m, v = result["machine"], result["versions"]
    anchor = any("ir_ratio_vs_pgbouncer125" in s for s in result["summary"])
    hdr = ["target", "mode", "clients", "tx (cg)", "Ir/tx"]
    if anchor:
        hdr.append("Ir/pgb125")
    hdr += ["tx (strace)"] + columns + ["other", "syscalls/tx"]
    if anchor:
        hdr.append("sys/pgb125")
    rows = []
    others = []
    for s in result["summary"]:
        sp = s["syscalls_per_tx"]
        have = bool(sp)
        row = [s["target"], s["mode"], str(s["clients"]), fmt(s["tx_callgrind"], 0),
               fmt(s["ir_per_tx"], 0)]
        if anchor:
            row.append(fmt(s.get("ir_ratio_vs_pgbouncer125"), 2))
        row.append(fmt(s["tx_strace"], 0))
        row += [fmt(float(sp.get(k, 0)), 2) if have else "-" for k in columns]
        rest = {k: x for k, x in sp.items() if k not in columns and x}
        row.append(fmt(float(sum(rest.values())), 2) if have else "-")
        row.append(fmt(s["syscalls_total_per_tx"], 2))
        if anchor:
            row.append(fmt(s.get("syscalls_ratio_vs_pgbouncer125"), 2))
        rows.append(row)
        if rest:
            top = sorted(rest.items(), key=lambda kv: -kv[1])
            others.append(f"{s['target']} {s['mode']} c={s['clients']}: " + ", ".join(
                f"{k} {x:.3f}" for k, x in top[:8]) + (" ..." if len(top) > 8 else ""))
    lines = []
    title = (f"--profile: pgbench -S -n -j {a.jobs}, {a.duration} s measured after a "
             f"{PROFILE_WARMUP} s warm-up, a fresh proxy each time, median of {a.rounds} "
             f"alternated round(s); pool_mode=transaction, default_pool_size={POOL_SIZE}, "
             f"PostgreSQL max_connections={MAX_CONNECTIONS}; {m['nproc']} CPUs, kernel "
             f"{m['kernel']}")
    legend = ("Ir/tx: the proxy's user-space instructions per transaction, all threads "
              "(valgrind callgrind, counted during the measured run only; tx (cg) are the "
              "transactions of that run, slowed by valgrind). Syscall columns: calls per "
              "transaction (strace -c -f, attached during the measured run only; tx (strace) "
              "its transactions). Ir/pgb125, sys/pgb125: the row / pgbouncer125, same mode and "
              "clients.")
    vers = (f"sluice {v.get('sluice_bin')} (sha256 {(v.get('sluice_sha256') or '-')[:12]}, "
            f"git {v.get('git_head') or '-'}); pgbouncer: {v.get('pgbouncer') or '-'}; "
            f"pgbouncer125: {v.get('pgbouncer125') or '-'} ({v.get('pgbouncer125_bin') or '-'}); "
            f"{result['tools'].get('valgrind') or '-'}; {result['tools'].get('strace') or '-'}")
    if markdown:
        lines += [f"# sluice --profile, {result['started_utc']}", "",
                  f"`{result['command']}`", "", title + ".", "", legend, "", vers, "",
                  "| " + " | ".join(hdr) + " |",
                  "|" + "|".join("---" if i < 3 else "---:" for i in range(len(hdr))) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        if others:
            lines += ["", "Other syscalls per transaction:", ""]
            lines += [f"- {o}" for o in others]
    else:
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(hdr)]

        def line(cells):
            return "  ".join(c.ljust(widths[i]) if i < 3 else c.rjust(widths[i])
                             for i, c in enumerate(cells)).rstrip()
        lines += [f"== {title}", legend, vers, "", line(hdr), line(["-" * w for w in widths])]
        prev = None
        for r, s in zip(rows, result["summary"]):
            key = (s["mode"], s["clients"])
            if prev is not None and key != prev:
                lines.append("")
            prev = key
            lines.append(line(r))
        if others:
            lines += ["", "other syscalls per transaction:"] + [f"  {o}" for o in others]
    errs = [f"{s['target']} {s['mode']} c={s['clients']}: {e[:200]}"
            for s in result["summary"] for e in s["errors"]]
    skipped = [f"{t}: SKIPPED: {x['skipped']}" for t, x in result["targets"].items()
               if x.get("skipped")]
    if errs or skipped:
        lines += ["", "errors:"]
        lines += [("- " if markdown else "  ") + e for e in skipped + errs]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("\ninterrupted; everything started was stopped", file=sys.stderr)
        sys.exit(130)
    except LabError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
