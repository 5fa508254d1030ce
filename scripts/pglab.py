#!/usr/bin/env python3
"""Shared helpers for scripts/bench.py and scripts/demo.py (Python 3.11 stdlib only).

What lives here:
  * Lab: a cleanup registry / context manager owning a temp dir and every child
    process (PostgreSQL via sluice-testkit, sluice, PgBouncer).  Children run in
    their own process groups and get PR_SET_PDEATHSIG, so they are stopped on
    normal exit, on exceptions, on Ctrl-C and on SIGTERM.
  * pooler ini generation shared by sluice and PgBouncer,
  * pgbench runner + robust output/log parser,
  * /proc readers (CPU ticks, VmRSS, VmHWM, descriptors, the kernel's socket and slab
    memory),
  * an asyncio opener of many idle PostgreSQL client connections, and ClientFleet,
    which spreads them over several processes and loopback source addresses (a process
    may hold only RLIMIT_NOFILE descriptors, an address reach one port from only the
    ephemeral range),
  * PgConn, a blocking client for console queries and timed logins,
  * Sysctls, kernel settings raised for a run and put back after.

Also usable as a stand-alone development stand-in for the testkit CLI:
    python3 scripts/pglab.py cluster [--max-connections N] [--reserved N] ...
which mimics `sluice-testkit cluster` (prints one JSON line, keeps the cluster
up until stdin closes or SIGTERM).  Select it with
    SLUICE_TESTKIT="python3 scripts/pglab.py"
It is only a fallback for developing these scripts; by default the scripts use
target/release/sluice-testkit.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import math
import os
import platform
import pwd
import re
import resource
import select
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
IS_ROOT = os.geteuid() == 0
CLK_TCK = os.sysconf("SC_CLK_TCK")


# --------------------------------------------------------------------------
# small utilities
# --------------------------------------------------------------------------

def log(msg: str) -> None:
    print(msg, flush=True)


def warn(msg: str) -> None:
    print(f"warning: {msg}", file=sys.stderr, flush=True)


class LabError(RuntimeError):
    pass


def pg_bindir() -> Path:
    env = os.environ.get("PG_BINDIR")
    if env:
        return Path(env)
    try:
        out = subprocess.run(["pg_config", "--bindir"], capture_output=True,
                             text=True, timeout=10, check=True).stdout.strip()
        if out:
            return Path(out)
    except (OSError, subprocess.SubprocessError):
        pass
    for cand in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (cand / "pgbench").exists():
            return cand
    raise LabError("cannot find PostgreSQL binaries (pg_config --bindir); set PG_BINDIR")


def pg_bin(name: str) -> str:
    p = pg_bindir() / name
    if not p.exists():
        raise LabError(f"{p} not found")
    return str(p)


def sluice_bin() -> str:
    return os.environ.get("SLUICE_BIN") or str(REPO / "target/release/sluice")


def sluice_base_bin() -> str | None:
    """The "before" sluice for the bench's sluice-base target: $SLUICE_BASE_BIN, or None
    when it is unset or names no file."""
    env = os.environ.get("SLUICE_BASE_BIN")
    if env and (Path(env).is_file() or shutil.which(env)):
        return env
    return None


def testkit_cmd() -> list[str]:
    env = os.environ.get("SLUICE_TESTKIT")
    if env:
        return shlex.split(env)
    return [str(REPO / "target/release/sluice-testkit")]


def pgbouncer_bin() -> str | None:
    env = os.environ.get("PGBOUNCER_BIN")
    if env:
        return env if Path(env).exists() else None
    return shutil.which("pgbouncer") or (
        "/usr/sbin/pgbouncer" if Path("/usr/sbin/pgbouncer").exists() else None)


def raise_nofile(want: int = 65536) -> tuple[int, int]:
    """Raise RLIMIT_NOFILE (inherited by every child we start)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < want:
        try:  # root (CAP_SYS_RESOURCE) may raise the hard limit too
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, want))
            return want, want
        except (ValueError, OSError):
            pass
    new_soft = hard if hard != resource.RLIM_INFINITY else max(soft, want)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (new_soft, hard))
    except (ValueError, OSError) as e:
        warn(f"could not raise RLIMIT_NOFILE: {e}")
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(host: str, port: int, timeout: float, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise LabError(f"process exited with code {proc.returncode} before listening on {port}")
        try:
            with socket.create_connection((host, port), timeout=1):
                return
        except OSError as e:
            last = e
            time.sleep(0.1)
    raise LabError(f"nothing listening on {host}:{port} after {timeout}s ({last})")


def cmd_output(cmd: list[str], timeout: float = 10) -> str | None:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        out = (r.stdout or r.stderr).strip()
        return out if r.returncode == 0 and out else (out or None)
    except (OSError, subprocess.SubprocessError):
        return None


def machine_info() -> dict:
    info = {
        "nproc": os.cpu_count(),
        "kernel": platform.release(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_model": None,
        "mem_total_kb": None,
    }
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu_model"] = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                info["mem_total_kb"] = int(line.split()[1])
                break
    except OSError:
        pass
    try:
        info["nproc_available"] = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        pass
    return info


def git_head() -> str | None:
    try:
        r = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"],
                           capture_output=True, text=True, timeout=10)
        return r.stdout.strip() if r.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


# --------------------------------------------------------------------------
# /proc readers
# --------------------------------------------------------------------------

def proc_cpu_seconds(pid: int) -> float | None:
    """utime+stime of a process (all threads), seconds."""
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = data[data.rindex(")") + 2:].split()
    # fields[0] is field 3 (state); utime is field 14, stime field 15
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def proc_status_kb(pid: int, key: str) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def vm_rss_kb(pid: int) -> int | None:
    return proc_status_kb(pid, "VmRSS")


def vm_hwm_kb(pid: int) -> int | None:
    return proc_status_kb(pid, "VmHWM")


# --------------------------------------------------------------------------
# child-process plumbing
# --------------------------------------------------------------------------

try:  # loaded here, in the parent, so the forked child only makes the call
    _libc = ctypes.CDLL(None, use_errno=True)
except OSError:
    _libc = None


def _pdeathsig() -> None:
    """preexec_fn: the child gets SIGTERM when the thread that started it dies.
    Only spawn with this from the main thread (PDEATHSIG follows the creating thread)."""
    if _libc is not None:
        _libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        try:
            proc.send_signal(sig)
        except ProcessLookupError:
            pass


def stop_process(proc: subprocess.Popen, first_signal: int = signal.SIGTERM,
                 timeout: float = 10.0) -> None:
    """Stop a child started with start_new_session=True (its own process group)."""
    if proc.poll() is None:
        _signal_group(proc, first_signal)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _signal_group(proc, signal.SIGKILL)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                warn(f"pid {proc.pid} did not die after SIGKILL")
    else:
        # the leader is gone; make sure nothing else of its group survives
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def install_signal_handlers() -> None:
    """Turn SIGTERM/SIGHUP into KeyboardInterrupt so `finally` blocks run."""
    def handler(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")
    for s in (signal.SIGTERM, signal.SIGHUP):
        try:
            signal.signal(s, handler)
        except (ValueError, OSError):
            pass


class Proxy:
    def __init__(self, kind: str, proc: subprocess.Popen, port: int, ini: Path, logfile: Path):
        self.kind = kind
        self.proc = proc
        self.port = port
        self.ini = ini
        self.logfile = logfile

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, n: int = 15) -> str:
        for f in (self.logfile, self.logfile.with_suffix(".stderr")):
            try:
                lines = f.read_text(errors="replace").splitlines()
                if lines:
                    return "\n".join(lines[-n:])
            except OSError:
                pass
        return ""


class Lab:
    """Owns a temp dir and every process started through it; stops them all on exit."""

    def __init__(self, prefix: str = "sluice-lab-"):
        self.tmp = Path(tempfile.mkdtemp(prefix=prefix))
        os.chmod(self.tmp, 0o755)
        self.pg_uid = self.pg_gid = None
        if IS_ROOT:
            try:
                pw = pwd.getpwnam("postgres")
                self.pg_uid, self.pg_gid = pw.pw_uid, pw.pw_gid
                os.chown(self.tmp, self.pg_uid, self.pg_gid)
            except KeyError:
                pass
        self._procs: list[tuple[str, subprocess.Popen, object]] = []
        self._files: list = []
        self.cluster: dict | None = None

    # context manager -----------------------------------------------------
    def __enter__(self) -> "Lab":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        # ignore further Ctrl-C while tearing down
        old = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            for name, proc, stop in reversed(self._procs):
                try:
                    stop(proc)
                except Exception as e:  # noqa: BLE001
                    warn(f"stopping {name}: {e}")
            self._procs.clear()
            for f in self._files:
                try:
                    f.close()
                except OSError:
                    pass
            shutil.rmtree(self.tmp, ignore_errors=True)
        finally:
            signal.signal(signal.SIGINT, old)

    def chown_pg(self, path: Path) -> None:
        if self.pg_uid is not None:
            os.chown(path, self.pg_uid, self.pg_gid)

    def open_file(self, path: Path, mode: str = "wb"):
        """Open a file that is closed with the Lab (e.g. the log of a process it starts)."""
        f = open(path, mode)
        self._files.append(f)
        return f

    def write(self, name: str, text: str) -> Path:
        p = self.tmp / name
        p.write_text(text)
        self.chown_pg(p)
        return p

    def spawn(self, name: str, cmd: list[str], *, stop=None, as_postgres: bool = False,
              **kw) -> subprocess.Popen:
        if as_postgres and self.pg_uid is not None:
            kw.setdefault("user", self.pg_uid)
            kw.setdefault("group", self.pg_gid)
            kw.setdefault("extra_groups", [])
        proc = subprocess.Popen(cmd, start_new_session=True, preexec_fn=_pdeathsig, **kw)
        self._procs.append((name, proc, stop or stop_process))
        return proc

    # PostgreSQL ------------------------------------------------------------
    def start_cluster(self, *, max_connections: int = 100, reserved: int | None = None,
                      scale: int | None = None, auth: str | None = "trust",
                      users: list[str] = (), settings: list[str] = (),
                      timeout: float = 300, replica: bool = False,
                      databases: list[str] = (), tag: str = "testkit") -> dict:
        """Start a throwaway cluster via `sluice-testkit cluster` and return its JSON line.
        replica=True adds a streaming replica (its port is info["replica_port"]); tag names the
        stderr file, so a Lab may own several clusters (the last one is self.cluster)."""
        cmd = testkit_cmd()
        if len(cmd) == 1 and not Path(cmd[0]).exists():
            raise LabError(
                f"{cmd[0]} not found: build it (cargo build --release -p sluice-testkit) "
                "or set SLUICE_TESTKIT to its path")
        cmd += ["cluster", "--max-connections", str(max_connections)]
        if reserved is not None:
            cmd += ["--reserved", str(reserved)]
        if auth:
            cmd += ["--auth", auth]
        for u in users:
            cmd += ["--user", u]
        for s in settings:
            cmd += ["--set", s]
        for d in databases:
            cmd += ["--database", d]
        if scale:
            cmd += ["--pgbench-scale", str(scale)]
        if replica:
            cmd.append("--replica")
        errf = open(self.tmp / f"{tag}.stderr", "w+b")
        self._files.append(errf)

        def stop(p: subprocess.Popen) -> None:
            # closing stdin is the documented "shut down and remove" signal
            try:
                if p.stdin:
                    p.stdin.close()
            except OSError:
                pass
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                stop_process(p, signal.SIGTERM, timeout=30)

        proc = self.spawn("testkit", cmd, stop=stop, stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, stderr=errf)
        line = b""
        deadline = time.monotonic() + timeout
        fd = proc.stdout.fileno()
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0:
                raise LabError(f"sluice-testkit printed no JSON line within {timeout}s"
                               f"{self._tail(errf)}")
            r, _, _ = select.select([fd], [], [], min(left, 1.0))
            if r:
                chunk = os.read(fd, 65536)
                if not chunk:
                    raise LabError(f"sluice-testkit exited (rc={proc.wait(timeout=10)}) "
                                   f"without printing its JSON line{self._tail(errf)}")
                line += chunk
        first = line.split(b"\n", 1)[0]
        try:
            info = json.loads(first)
        except json.JSONDecodeError:
            raise LabError(f"sluice-testkit printed something that is not JSON: {first[:300]!r}")
        info.setdefault("host", "127.0.0.1")
        info.setdefault("superuser", "postgres")
        info.setdefault("password", "postgres")
        self.cluster = info
        return info

    @staticmethod
    def _tail(f) -> str:
        try:
            f.flush()
            f.seek(0)
            t = f.read().decode(errors="replace").strip().splitlines()
            return ("\n--- testkit stderr ---\n" + "\n".join(t[-20:])) if t else ""
        except OSError:
            return ""

    def psql(self, sql: str, *, user: str | None = None, db: str = "postgres",
             timeout: float = 30) -> str:
        """Run SQL as the superuser over the cluster's unix socket (TCP if that fails)."""
        c = self.cluster
        env = dict(os.environ, PGPASSWORD=c.get("password") or "", PGCONNECT_TIMEOUT="10")
        hosts = [h for h in (c.get("socket_dir"), c.get("host") or "127.0.0.1") if h]
        err = ""
        for host in hosts:
            r = subprocess.run([pg_bin("psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-At",
                                "-h", host, "-p", str(c["port"]), "-U", user or c["superuser"],
                                "-d", db, "-c", sql],
                               capture_output=True, text=True, timeout=timeout, env=env)
            if r.returncode == 0:
                return r.stdout.strip()
            err = r.stderr.strip()
            if r.returncode != 2:  # 2 = could not connect; anything else is the SQL's fault
                break
        raise LabError(f"psql failed: {err}")

    # poolers -----------------------------------------------------------------
    def start_proxy(self, kind: str, ini_text_for_port, *, timeout: float = 20,
                    port: int | None = None, ready=None) -> Proxy:
        """kind: 'sluice' (or 'sluice-…', a variant), 'sluice-base' (sluice from
        $SLUICE_BASE_BIN instead of SLUICE_BIN) or 'pgbouncer'.
        ini_text_for_port(port, logfile) -> ini text.  port: a given listen port (several
        so_reuseport processes share one) instead of a free one; ready(proxy) -> bool then
        says when this process is up, since the port answers as soon as the first one is."""
        port = port or free_port()
        logfile = self.tmp / f"{kind}.log"
        logfile.touch()
        self.chown_pg(logfile)
        ini = self.write(f"{kind}.ini", ini_text_for_port(port, logfile))
        errpath = self.tmp / f"{kind}.stderr"
        errf = open(errpath, "wb")
        self._files.append(errf)
        if kind == "sluice-base":
            binary = sluice_base_bin()
            if not binary:
                raise LabError("SLUICE_BASE_BIN is unset or names no file")
            proc = self.spawn(kind, [binary, str(ini)], stdout=errf, stderr=errf,
                              stdin=subprocess.DEVNULL)
        elif kind.startswith("sluice"):
            binary = sluice_bin()
            if not Path(binary).exists() and not shutil.which(binary):
                raise LabError(f"{binary} not found: build it (cargo build --release -p sluice) "
                               "or set SLUICE_BIN")
            proc = self.spawn(kind, [binary, str(ini)], stdout=errf, stderr=errf,
                              stdin=subprocess.DEVNULL)
        elif kind.startswith("pgbouncer"):
            binary = pgbouncer_bin()
            if not binary:
                raise LabError("pgbouncer not installed")
            # PgBouncer refuses to run as root: run it as postgres directly (same PID)
            proc = self.spawn(kind, [binary, str(ini)], as_postgres=True, stdout=errf,
                              stderr=errf, stdin=subprocess.DEVNULL, cwd=str(self.tmp))
        else:
            raise ValueError(kind)
        proxy = Proxy(kind, proc, port, ini, logfile)
        try:
            wait_port("127.0.0.1", port, timeout, proc)
            deadline = time.monotonic() + timeout
            while ready is not None and not ready(proxy):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise LabError(f"not ready after {timeout}s (exit code {proc.poll()})")
                time.sleep(0.1)
        except LabError as e:
            raise LabError(f"{kind} did not start: {e}\n{proxy.log_tail()}")
        return proxy


# --------------------------------------------------------------------------
# pooler configuration (same text for sluice and PgBouncer)
# --------------------------------------------------------------------------

def pooler_ini(*, pg_port: int, listen_port: int, logfile: Path, auth_file: Path,
               dbname: str = "bench", pg_host: str = "127.0.0.1", server_db: str = "postgres",
               pool_mode: str = "transaction", default_pool_size: int = 20,
               max_client_conn: int = 12000, admin_users: str = "postgres",
               extra: dict | None = None, databases: dict[str, str] | None = None,
               unix_socket_dir: str = "") -> str:
    """One pgbouncer.ini for sluice and PgBouncer alike. `databases` (name ->
    connection string) replaces the single `dbname` entry when given; no Unix socket
    unless `unix_socket_dir` is given."""
    entries = databases or {dbname: f"host={pg_host} port={pg_port} dbname={server_db}"}
    lines = ["[databases]"]
    lines += [f"{name} = {conn}" for name, conn in entries.items()]
    lines += [
        "",
        "[pgbouncer]",
        "listen_addr = 127.0.0.1",
        f"listen_port = {listen_port}",
        f"unix_socket_dir = {unix_socket_dir}".rstrip(),
        "auth_type = trust",
        f"auth_file = {auth_file}",
        f"pool_mode = {pool_mode}",
        f"default_pool_size = {default_pool_size}",
        f"max_client_conn = {max_client_conn}",
        "max_db_connections = 0",
        "ignore_startup_parameters = extra_float_digits",
        f"logfile = {logfile}",
        f"admin_users = {admin_users}",
        f"stats_users = {admin_users}",
    ]
    for k, v in (extra or {}).items():
        lines.append(f"{k} = {v}")
    return "\n".join(lines) + "\n"


def userlist(users: dict[str, str]) -> str:
    return "".join(f'"{u}" "{p}"\n' for u, p in users.items())


# --------------------------------------------------------------------------
# pgbench
# --------------------------------------------------------------------------

CONN_FAIL_PATTERNS = (
    "remaining connection slots are reserved",
    "too many clients",
    "sorry, too many clients",
    "could not create connection for client",
    "connection to server",
    "no more connections allowed",
    "connection refused",
    "server closed the connection unexpectedly",
)

_RE = {
    "tx": re.compile(r"number of transactions actually processed:\s*(\d+)"),
    "failed_tx": re.compile(r"number of failed transactions:\s*(\d+)"),
    "lat_avg": re.compile(r"latency average\s*=\s*([\d.]+)\s*ms"),
    "lat_std": re.compile(r"latency stddev\s*=\s*([\d.]+)\s*ms"),
    "conn_time": re.compile(r"initial connection time\s*=\s*([\d.]+)\s*ms"),
    "tps": re.compile(r"tps\s*=\s*([\d.]+)\s*\((?:without|excluding)"),
    "tps_any": re.compile(r"tps\s*=\s*([\d.]+)"),
    "clients": re.compile(r"number of clients:\s*(\d+)"),
    "client_id": re.compile(r"(?:for|of) client (\d+)"),
}


def percentile(sorted_vals: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100) of an already sorted list."""
    if not sorted_vals:
        return None
    k = max(0, min(len(sorted_vals) - 1, math.ceil(q / 100.0 * len(sorted_vals)) - 1))
    return sorted_vals[k]


def read_pgbench_logs(log_dir: Path) -> list[float]:
    """Latency column (3rd, microseconds) of pgbench per-transaction logs; skips failures."""
    lat: list[float] = []
    for f in sorted(log_dir.glob("pgb*")):
        try:
            with open(f, "rb") as fh:
                for raw in fh:
                    parts = raw.split()
                    if len(parts) >= 3:
                        try:
                            lat.append(float(parts[2]))
                        except ValueError:  # "failed"/"skipped" rows
                            pass
        except OSError:
            pass
    lat.sort()
    return lat


def run_pgbench(*, host: str, port: int, dbname: str, user: str, clients: int,
                duration: float, mode: str = "simple", select_only: bool = True,
                jobs: int = 2, password: str | None = None, log_dir: Path | None = None,
                sampling_rate: float | None = None, extra_args: list[str] = (),
                timeout: float | None = None, env: dict | None = None) -> dict:
    """Run pgbench and return a dict of parsed numbers (never raises on pgbench failure)."""
    jobs = max(1, min(jobs, clients))
    cmd = [pg_bin("pgbench"), "-h", host, "-p", str(port), "-U", user, "-n",
           "-M", mode, "-c", str(clients), "-j", str(jobs), "-T", str(int(duration))]
    if select_only:
        cmd.append("-S")
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
        cmd += ["-l", f"--log-prefix={log_dir / 'pgb'}"]
        if sampling_rate and sampling_rate < 1.0:
            cmd.append(f"--sampling-rate={sampling_rate}")
    cmd += list(extra_args)
    cmd.append(dbname)
    env = dict(os.environ, PGCONNECT_TIMEOUT="10", PGAPPNAME="pgbench", **(env or {}))
    if password is not None:
        env["PGPASSWORD"] = password
    timeout = timeout or (duration + 90)
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True, preexec_fn=_pdeathsig,
                            cwd=str(log_dir) if log_dir else None)
    timed_out = False
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        _signal_group(proc, signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            _signal_group(proc, signal.SIGKILL)
            out, err = proc.communicate(timeout=10)
    except BaseException:
        stop_process(proc, signal.SIGINT, timeout=5)
        raise
    wall = time.monotonic() - t0
    res = parse_pgbench(out, err, clients)
    res.update(rc=proc.returncode, wall_s=round(wall, 3), timed_out=timed_out,
               command=" ".join(shlex.quote(c) for c in cmd))
    if timed_out and not res["error"]:
        res["error"] = f"pgbench timed out after {timeout:.0f}s"
    if log_dir is not None:
        lat = read_pgbench_logs(log_dir)
        res["latency_samples"] = len(lat)
        p = percentile(lat, 99)
        res["p99_ms"] = round(p / 1000.0, 3) if p is not None else None
        p50 = percentile(lat, 50)
        res["p50_ms"] = round(p50 / 1000.0, 3) if p50 is not None else None
        if res["lat_avg_ms"] is None and lat:
            res["lat_avg_ms_from_log"] = round(sum(lat) / len(lat) / 1000.0, 3)
        shutil.rmtree(log_dir, ignore_errors=True)
    return res


def parse_pgbench(out: str, err: str, clients: int) -> dict:
    out = out or ""
    err = err or ""
    def num(key, text=out, cast=float):
        m = _RE[key].search(text)
        return cast(m.group(1)) if m else None

    tps = num("tps")
    if tps is None:
        tps = num("tps_any")
    res = {
        "tps": tps,
        "transactions": num("tx", cast=int),
        "failed_transactions": num("failed_tx", cast=int),
        "lat_avg_ms": num("lat_avg"),
        "lat_stddev_ms": num("lat_std"),
        "initial_connection_ms": num("conn_time"),
        "aborted": False,
        "error": None,
        "failed_clients": 0,
        "failed_clients_known": True,
        "connection_errors": 0,
    }
    err_lines = [l.strip() for l in err.splitlines() if l.strip()]
    # first line that is an actual problem (skip warning/notice noise)
    problem = [l for l in err_lines
               if not l.startswith(("NOTICE", "pgbench: warning", "WARNING", "HINT", "DETAIL"))]
    if problem:
        res["error"] = problem[0]
    res["connection_errors"] = sum(l.count("connection to server") for l in err_lines)
    aborted_ids = set(_RE_ABORTED.findall(err))
    start_conn_fail = ("could not create connection for client" in err
                       or (res["transactions"] is None
                           and any(p in err for p in CONN_FAIL_PATTERNS)))
    if start_conn_fail or res["transactions"] is None:
        # pgbench (>= 15) exits at the first client that cannot connect, without a
        # summary, so it cannot tell how many of the clients would have connected;
        # the caller probes (probe_connections) and fills failed_clients in.
        res["aborted"] = True
        res["failed_clients"] = max(res["connection_errors"], 1) if start_conn_fail else 0
        res["failed_clients_known"] = False
        res["tps"] = res["tps"] or 0.0
        res["transactions"] = res["transactions"] or 0
    elif aborted_ids or "Run was aborted" in out + err:
        # clients that connected but were dropped during the run
        res["aborted"] = True
        res["failed_clients"] = len(aborted_ids)
    return res


_RE_ABORTED = re.compile(r"client (\d+) (?:script \d+ )?aborted")


# --------------------------------------------------------------------------
# raw PostgreSQL client connections (asyncio)
# --------------------------------------------------------------------------

def startup_message(user: str, database: str, app: str = "sluice-lab") -> bytes:
    params = b"".join(k.encode() + b"\0" + v.encode() + b"\0" for k, v in
                      (("user", user), ("database", database), ("application_name", app)))
    body = struct.pack("!I", 196608) + params + b"\0"
    return struct.pack("!I", len(body) + 4) + body


class PgError(ConnectionError):
    """An ErrorResponse: str() is its message, .sqlstate its code."""

    def __init__(self, body: bytes):
        fields = dict((f[:1], f[1:].decode(errors="replace")) for f in body.split(b"\0") if f)
        super().__init__(fields.get(b"M", "error response"))
        self.sqlstate = fields.get(b"C")


# Linux: bind() a client socket to a source address but leave the port to connect(), which
# picks one free for that 4-tuple: each source address then has the whole ephemeral range
# for each destination instead of one range shared by every socket bound to it.
IP_BIND_ADDRESS_NO_PORT = getattr(socket, "IP_BIND_ADDRESS_NO_PORT", 24)


def client_socket(source: str | None) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if source:
        s.setsockopt(socket.IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, 1)
        s.bind((source, 0))
    return s


async def _handshake(host: str, port: int, user: str, database: str, timeout: float,
                     source: str | None = None):
    """Open one connection (from source address `source` when given) and read up to
    ReadyForQuery.  Returns (reader, writer) or raises."""
    async def go():
        if source:
            sock = client_socket(source)
            sock.setblocking(False)
            try:
                await asyncio.get_running_loop().sock_connect(sock, (host, port))
            except BaseException:
                sock.close()
                raise
            reader, writer = await asyncio.open_connection(sock=sock)
        else:
            reader, writer = await asyncio.open_connection(host, port)
        try:
            writer.write(startup_message(user, database))
            await writer.drain()
            while True:
                hdr = await reader.readexactly(5)
                typ, ln = hdr[:1], struct.unpack("!I", hdr[1:])[0]
                body = await reader.readexactly(ln - 4) if ln > 4 else b""
                if typ == b"R":
                    code = struct.unpack("!I", body[:4])[0]
                    if code != 0:
                        raise ConnectionError(f"server wants authentication (code {code}); "
                                              "only trust is supported here")
                elif typ == b"E":
                    raise PgError(body)
                elif typ == b"Z":
                    return reader, writer
        except BaseException:
            writer.close()
            raise
    return await asyncio.wait_for(go(), timeout)


async def _open_many(host, port, user, database, n, concurrency, timeout, hold):
    sem = asyncio.Semaphore(concurrency)
    conns = []
    errors: dict[str, int] = {}

    async def one():
        async with sem:
            try:
                conns.append(await _handshake(host, port, user, database, timeout))
            except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError,
                    ConnectionError) as e:
                key = str(e) or type(e).__name__
                if isinstance(e, asyncio.TimeoutError):
                    key = "timeout"
                elif isinstance(e, asyncio.IncompleteReadError):
                    key = "connection closed during startup"
                errors[key] = errors.get(key, 0) + 1

    t0 = time.monotonic()
    await asyncio.gather(*(one() for _ in range(n)))
    open_s = time.monotonic() - t0
    try:
        extra = await hold(len(conns)) if hold else None
    finally:
        for _r, w in conns:
            try:
                w.write(b"X\x00\x00\x00\x04")
                w.close()
            except Exception:  # noqa: BLE001
                pass
        await asyncio.sleep(0)
        for _r, w in conns:
            try:
                await asyncio.wait_for(w.wait_closed(), 5)
            except Exception:  # noqa: BLE001
                pass
    return {"requested": n, "opened": len(conns), "failed": n - len(conns),
            "errors": errors, "open_seconds": round(open_s, 3), "hold": extra}


def open_connections(host: str, port: int, *, user: str, database: str, n: int,
                     concurrency: int = 200, timeout: float = 20.0, hold=None,
                     overall_timeout: float = 600.0) -> dict:
    """Open n connections concurrently (startup -> ReadyForQuery), call `await hold(opened)`
    while they are all open, then close them.  Returns counts and error reasons."""
    async def main():
        return await asyncio.wait_for(
            _open_many(host, port, user, database, n, concurrency, timeout, hold),
            overall_timeout)
    return asyncio.run(main())


def probe_connections(host: str, port: int, *, user: str, database: str, n: int,
                      timeout: float = 10.0) -> dict:
    """How many of n simultaneous clients can connect (and hold the connection)."""
    return open_connections(host, port, user=user, database=database, n=n,
                            concurrency=n, timeout=timeout, overall_timeout=120)


# --------------------------------------------------------------------------
# a blocking client (console queries, timed logins)
# --------------------------------------------------------------------------

class PgConn:
    """One blocking PostgreSQL connection, trust login only: for console queries and for
    timing a login.  host may be a Unix socket directory (a leading /)."""

    def __init__(self, host: str, port: int, *, user: str, database: str,
                 timeout: float = 10.0, source: str | None = None):
        if host.startswith("/"):
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            addr = f"{host}/.s.PGSQL.{port}"
        else:
            self.sock = client_socket(source)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            addr = (host, port)
        self.buf = bytearray()
        try:
            self.sock.settimeout(timeout)
            self.sock.connect(addr)
            self.sock.sendall(startup_message(user, database))
            while True:
                typ, body = self._message()
                if typ == b"R" and struct.unpack("!I", body[:4])[0] != 0:
                    raise ConnectionError("server wants a password; only trust is supported")
                if typ == b"E":
                    raise PgError(body)
                if typ == b"Z":
                    break
        except BaseException:
            self.sock.close()
            raise

    def _message(self) -> tuple[bytes, bytes]:
        while True:
            if len(self.buf) >= 5:
                ln = struct.unpack("!I", self.buf[1:5])[0]
                if len(self.buf) >= ln + 1:
                    typ, body = bytes(self.buf[:1]), bytes(self.buf[5:ln + 1])
                    del self.buf[:ln + 1]
                    return typ, body
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise ConnectionError("connection closed by the server")
            self.buf += chunk

    def query(self, sql: str) -> list[dict]:
        """Simple query; the rows of its last result as dicts of text (None for NULL)."""
        self.sock.sendall(b"Q" + struct.pack("!I", len(sql) + 5) + sql.encode() + b"\0")
        cols: list[str] = []
        rows: list[dict] = []
        err = None
        while True:
            typ, body = self._message()
            if typ == b"T":
                n, pos, cols, rows = struct.unpack("!H", body[:2])[0], 2, [], []
                for _ in range(n):
                    end = body.index(b"\0", pos)
                    cols.append(body[pos:end].decode())
                    pos = end + 1 + 18
            elif typ == b"D":
                n, pos, vals = struct.unpack("!H", body[:2])[0], 2, []
                for _ in range(n):
                    ln = struct.unpack("!i", body[pos:pos + 4])[0]
                    pos += 4
                    vals.append(None if ln < 0 else body[pos:pos + ln].decode(errors="replace"))
                    pos += max(ln, 0)
                rows.append(dict(zip(cols, vals)))
            elif typ == b"E":
                err = PgError(body)
            elif typ == b"Z":
                if err:
                    raise err
                return rows

    def timed(self, sql: str) -> tuple[float, int]:
        """Seconds from sending a simple query to its ReadyForQuery, and the number of
        DataRows, without decoding them (so the time is the server's, not Python's)."""
        t0 = time.perf_counter()
        self.sock.sendall(b"Q" + struct.pack("!I", len(sql) + 5) + sql.encode() + b"\0")
        rows, err = 0, None
        while True:
            typ, body = self._message()
            if typ == b"D":
                rows += 1
            elif typ == b"E":
                err = PgError(body)
            elif typ == b"Z":
                if err:
                    raise err
                return time.perf_counter() - t0, rows

    def close(self) -> None:
        try:
            self.sock.sendall(b"X\x00\x00\x00\x04")
        except OSError:
            pass
        self.sock.close()


def timed_login(host: str, port: int, *, user: str, database: str,
                source: str | None = None, timeout: float = 10.0) -> float:
    """Seconds from connect() to the first ReadyForQuery (connect, startup, auth)."""
    t0 = time.perf_counter()
    c = PgConn(host, port, user=user, database=database, timeout=timeout, source=source)
    dt_ = time.perf_counter() - t0
    c.close()
    return dt_


# --------------------------------------------------------------------------
# idle clients held by several processes, from several source addresses
# --------------------------------------------------------------------------

def _error_key(e: BaseException) -> str:
    if isinstance(e, asyncio.TimeoutError):
        return "timeout"
    if isinstance(e, asyncio.IncompleteReadError):
        return "connection closed during startup"
    if isinstance(e, PgError) and e.sqlstate:
        return f"{e.sqlstate} {e}"
    return str(e) or type(e).__name__


async def _fleet_worker_main(pipe, host, port, user, database, n, sources, concurrency,
                             timeout) -> None:
    loop = asyncio.get_running_loop()
    conns: list = []
    errors: dict[str, int] = {}
    first_error = []
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with sem:
            try:
                conns.append(await _handshake(host, port, user, database, timeout,
                                              source=sources[i % len(sources)]))
            except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError,
                    ConnectionError) as e:
                key = _error_key(e)
                errors[key] = errors.get(key, 0) + 1
                if not first_error:
                    first_error.append(key)

    t0 = time.monotonic()
    await asyncio.gather(*(one(i) for i in range(n)))
    pipe.send({"opened": len(conns), "errors": errors,
               "first_error": first_error[0] if first_error else None,
               "open_seconds": round(time.monotonic() - t0, 3)})
    while True:
        try:
            cmd = await loop.run_in_executor(None, pipe.recv)
        except EOFError:  # the parent is gone
            break
        if cmd[0] != "query":
            break
        _, sql, k = cmd
        ok, errs = 0, {}
        for reader, writer in conns[:k]:
            try:
                writer.write(b"Q" + struct.pack("!I", len(sql) + 5) + sql.encode() + b"\0")
                failed = None
                while True:
                    try:
                        hdr = await asyncio.wait_for(reader.readexactly(5), timeout)
                        body = await reader.readexactly(struct.unpack("!I", hdr[1:])[0] - 4)
                    except asyncio.IncompleteReadError:
                        raise failed or ConnectionError("connection closed by the pooler")
                    if hdr[:1] == b"E":
                        failed = PgError(body)
                    elif hdr[:1] == b"Z":
                        break
                if failed:
                    raise failed
                ok += 1
            except (OSError, asyncio.TimeoutError, ConnectionError) as e:
                errs[_error_key(e)] = errs.get(_error_key(e), 0) + 1
        pipe.send({"ok": ok, "errors": errs})
    for _r, w in conns:
        try:
            w.write(b"X\x00\x00\x00\x04")
            w.close()
        except Exception:  # noqa: BLE001
            pass
    await asyncio.sleep(0.5)


def _fleet_worker(pipe, *args) -> None:
    _pdeathsig()  # dies with the bench
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and stops us
    asyncio.run(_fleet_worker_main(pipe, *args))


class ClientFleet:
    """`sum(counts)` idle clients logged in (trust, up to ReadyForQuery) and held open by
    len(counts) processes, worker i holding counts[i] of them from the source addresses
    sources[i] (round robin).  A process may hold at most RLIMIT_NOFILE descriptors, so a
    fleet of more clients than that needs several; and one source address reaches one
    destination from at most the ephemeral port range, so many need several sources.

        fleet = ClientFleet(host, port, user=..., database=..., counts=[...], sources=[[...]])
        summary = fleet.open()       # blocks until every worker has tried all of its share
        fleet.query("SELECT 1", 5)   # each worker runs it on 5 of the clients it holds
        fleet.close()
    """

    def __init__(self, host: str, port: int, *, user: str, database: str,
                 counts: list[int], sources: list[list[str]], concurrency: int = 50,
                 timeout: float = 30.0):
        import multiprocessing
        assert len(counts) == len(sources)
        self.procs, self.pipes = [], []
        ctx = multiprocessing.get_context("fork")
        for n, src in zip(counts, sources):
            mine, theirs = ctx.Pipe()
            p = ctx.Process(target=_fleet_worker, daemon=True,
                            args=(theirs, host, port, user, database, n, src,
                                  min(concurrency, n), timeout))
            p.start()
            theirs.close()
            self.procs.append(p)
            self.pipes.append(mine)
        self.counts = counts

    def _gather(self, timeout: float) -> list[dict]:
        out = []
        deadline = time.monotonic() + timeout
        for i, pipe in enumerate(self.pipes):
            if not pipe.poll(max(0.0, deadline - time.monotonic())):
                raise LabError(f"client worker {i} did not answer within {timeout:.0f}s")
            out.append(pipe.recv())
        return out

    def open(self, timeout: float = 900) -> dict:
        each = self._gather(timeout)
        errors: dict[str, int] = {}
        for r in each:
            for k, v in r["errors"].items():
                errors[k] = errors.get(k, 0) + v
        return {"requested": sum(self.counts), "opened": sum(r["opened"] for r in each),
                "failed": sum(self.counts) - sum(r["opened"] for r in each),
                "errors": errors,
                "first_error": next((r["first_error"] for r in each if r["first_error"]), None),
                "open_seconds": max(r["open_seconds"] for r in each),
                "per_worker": [r["opened"] for r in each]}

    def query(self, sql: str, k: int, timeout: float = 60) -> dict:
        for pipe in self.pipes:
            pipe.send(("query", sql, k))
        each = self._gather(timeout)
        errors: dict[str, int] = {}
        for r in each:
            for key, v in r["errors"].items():
                errors[key] = errors.get(key, 0) + v
        return {"ok": sum(r["ok"] for r in each), "errors": errors}

    def close(self) -> None:
        for pipe in self.pipes:
            try:
                pipe.send(("close",))
            except OSError:
                pass
        for p in self.procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        for pipe in self.pipes:
            pipe.close()
        self.procs, self.pipes = [], []


def split_clients(n: int, per_worker: int, per_source: int, min_workers: int,
                  first_source: int) -> tuple[list[int], list[list[str]], int]:
    """Share n clients among max(min_workers, ceil(n / per_worker)) workers and give each
    worker enough fresh loopback source addresses (127.0.0.<first_source>, then the next
    ones, and on into 127.0.1.x …) that none carries more than per_source clients.
    Returns (counts, sources, the next unused source number)."""
    workers = max(min_workers, math.ceil(n / per_worker))
    counts = [n // workers + (1 if i < n % workers else 0) for i in range(workers)]
    sources, nxt = [], first_source
    for c in counts:
        k = max(1, math.ceil(c / per_source))
        sources.append([f"127.0.{x // 256}.{x % 256}" for x in range(nxt, nxt + k)])
        nxt += k
    return counts, sources, nxt


# --------------------------------------------------------------------------
# kernel settings and kernel memory
# --------------------------------------------------------------------------

class Sysctls:
    """Raise kernel settings for a run (root only), never lower one, and put the old values
    back on exit.  wanted: key -> value (ip_local_port_range as "LOW HIGH": widened only)."""

    def __init__(self, wanted: dict[str, str]):
        self.wanted = wanted
        self.changed: dict[str, tuple[str, str]] = {}  # key -> (old, new)
        self.failed: dict[str, str] = {}

    @staticmethod
    def path(key: str) -> Path:
        return Path("/proc/sys") / key.replace(".", "/")

    def __enter__(self) -> "Sysctls":
        for key, want in self.wanted.items():
            try:
                old = " ".join(self.path(key).read_text().split())
            except OSError as e:
                self.failed[key] = str(e)
                continue
            o, w = [int(x) for x in old.split()], [int(x) for x in want.split()]
            new = (" ".join(str(x) for x in (min(o[0], w[0]), max(o[1], w[1])))
                   if len(o) == 2 else str(max(o[0], w[0])))
            if new == old:
                continue
            try:
                self.path(key).write_text(new)
                self.changed[key] = (old, new)
            except OSError as e:
                self.failed[key] = f"{old} kept: {e}"
        return self

    def __exit__(self, *exc) -> None:
        for key, (old, _new) in self.changed.items():
            try:
                self.path(key).write_text(old)
            except OSError as e:
                warn(f"could not restore {key} = {old}: {e}")


def kernel_memory() -> dict:
    """What the kernel holds for sockets: /proc/net/sockstat (sockets in use, TCP buffer
    pages) and the slab (socket, inode, dentry, epoll objects …) from /proc/meminfo."""
    out: dict = {}
    try:
        for line in Path("/proc/net/sockstat").read_text().splitlines():
            head, _, rest = line.partition(":")
            vals = rest.split()
            d = dict(zip(vals[::2], (int(v) for v in vals[1::2])))
            if head == "sockets":
                out["sockets_used"] = d.get("used")
            elif head == "TCP":
                out["tcp_inuse"] = d.get("inuse")
                out["tcp_tw"] = d.get("tw")
                out["tcp_mem_pages"] = d.get("mem")
        for line in Path("/proc/meminfo").read_text().splitlines():
            k, _, v = line.partition(":")
            if k in ("Slab", "SUnreclaim", "MemAvailable"):
                out[f"{k.lower()}_kb"] = int(v.split()[0])
    except (OSError, ValueError):
        pass
    out["slab_caches"] = slab_bytes()
    return out


def slab_bytes() -> dict[str, int]:
    """Bytes in use per slab cache (active objects x object size), from /proc/slabinfo
    (root only; empty otherwise)."""
    out: dict[str, int] = {}
    try:
        for line in Path("/proc/slabinfo").read_text().splitlines()[2:]:
            f = line.split()
            out[f[0]] = int(f[1]) * int(f[3])
    except (OSError, ValueError, IndexError):
        pass
    return out


def fd_count(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


# --------------------------------------------------------------------------
# development stand-in for `sluice-testkit cluster`
# --------------------------------------------------------------------------

def _fallback_cluster(argv: list[str]) -> int:
    import argparse
    ap = argparse.ArgumentParser(prog="pglab.py cluster")
    ap.add_argument("--max-connections", type=int, default=100)
    ap.add_argument("--reserved", type=int, default=3)
    ap.add_argument("--auth", default="trust", choices=["trust", "md5", "scram-sha-256"])
    ap.add_argument("--user", action="append", default=[])
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--pgbench-scale", type=int, default=0)
    a = ap.parse_args(argv)
    base = Path(tempfile.mkdtemp(prefix="pglab-cluster-"))
    os.chmod(base, 0o755)
    data, sock = base / "data", base / "sock"
    uid = gid = None
    if IS_ROOT:
        pw = pwd.getpwnam("postgres")
        uid, gid = pw.pw_uid, pw.pw_gid
        os.chown(base, uid, gid)
    kw = dict(user=uid, group=gid, extra_groups=[]) if uid is not None else {}
    port = free_port()
    pwfile = base / "pw"
    pwfile.write_text("postgres\n")
    if uid is not None:
        os.chown(pwfile, uid, gid)
    post = None
    stopping = False

    def on_term(*_):
        nonlocal stopping
        stopping = True
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    try:
        subprocess.run([pg_bin("initdb"), "-D", str(data), "-U", "postgres", "-A", a.auth,
                        f"--pwfile={pwfile}", "--no-sync", "-E", "UTF8", "--locale=C"],
                       check=True, capture_output=True, timeout=120, **kw)
        sock.mkdir()
        if uid is not None:
            os.chown(sock, uid, gid)
        conf = [f"port = {port}", "listen_addresses = '127.0.0.1'",
                f"unix_socket_directories = '{sock}'",
                f"max_connections = {a.max_connections}",
                f"superuser_reserved_connections = {a.reserved}",
                "fsync = off", "synchronous_commit = off", "full_page_writes = off",
                "shared_buffers = 128MB", "logging_collector = off"]
        for s in a.set:
            k, v = s.split("=", 1)
            conf.append(f"{k} = '{v}'")
        with open(data / "postgresql.conf", "a") as f:
            f.write("\n".join(conf) + "\n")
        post = subprocess.Popen([pg_bin("postgres"), "-D", str(data)],
                                stdout=open(base / "pg.log", "wb"), stderr=subprocess.STDOUT,
                                start_new_session=True, **kw)
        env = dict(os.environ, PGPASSWORD="postgres")
        deadline = time.monotonic() + 60
        while subprocess.run([pg_bin("pg_isready"), "-q", "-h", str(sock), "-p", str(port)],
                             timeout=10).returncode != 0:
            if time.monotonic() > deadline or post.poll() is not None:
                raise LabError("postgres did not start: " + (base / "pg.log").read_text()[-2000:])
            time.sleep(0.2)
        for u in a.user:
            name, pw_ = u.split(":", 1)
            subprocess.run([pg_bin("psql"), "-X", "-q", "-h", str(sock), "-p", str(port),
                            "-U", "postgres", "-d", "postgres", "-c",
                            f"CREATE ROLE \"{name}\" LOGIN PASSWORD '{pw_}'"],
                           check=True, env=env, timeout=30, capture_output=True)
        if a.pgbench_scale:
            subprocess.run([pg_bin("pgbench"), "-i", "-q", "-s", str(a.pgbench_scale),
                            "-h", str(sock), "-p", str(port), "-U", "postgres", "postgres"],
                           check=True, env=env, timeout=600, capture_output=True)
        print(json.dumps({"host": "127.0.0.1", "port": port, "socket_dir": str(sock),
                          "data_dir": str(data), "superuser": "postgres",
                          "password": "postgres", "replica_port": None}), flush=True)
        while not stopping:
            try:
                r, _, _ = select.select([sys.stdin], [], [], 0.5)
            except InterruptedError:
                continue
            if r and not sys.stdin.buffer.read1(4096):
                break
            if post.poll() is not None:
                break
        return 0
    finally:
        if post is not None and post.poll() is None:
            post.send_signal(signal.SIGINT)  # fast shutdown
            try:
                post.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(post.pid, signal.SIGKILL)
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "cluster":
        sys.exit(_fallback_cluster(sys.argv[2:]))
    print(__doc__)
    sys.exit(2)
