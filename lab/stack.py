"""The throwaway world of one scenario: clusters, an application role, SQL, cleanup.

`Stack` wraps scripts/pglab.py's `Lab` (which owns a temp dir and every child process and
stops them all on exit, error or Ctrl-C) and adds what the scenarios share: starting a
primary (with a streaming replica if asked) or an empty extra cluster through the testkit,
running SQL on any of them over TCP, creating the ordinary role the benchmarks connect as
(a superuser would slip into the reserved slots and hide the max_connections wall), and
waiting until a pooler's server connections are gone before the next target runs.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pglab
from pglab import LabError

APP_ROLE = "app"
APP_PASSWORD = "app"


@dataclass
class Cluster:
    host: str
    port: int
    superuser: str
    password: str
    replica_port: int | None
    data_dir: str | None
    max_connections: int
    reserved: int
    db: str = "postgres"     # the database holding pgbench's tables


class Stack:
    def __init__(self, name: str):
        self.lab = pglab.Lab(prefix=f"sluice-lab-{name}-")
        self.tmp: Path = self.lab.tmp
        self._n = 0

    def __enter__(self) -> "Stack":
        return self

    def __exit__(self, *exc) -> None:
        self.lab.close()

    def unique(self, stem: str) -> Path:
        self._n += 1
        return self.tmp / f"{stem}-{self._n}"

    # clusters -----------------------------------------------------------------------
    def cluster(self, *, max_connections: int = 100, reserved: int = 3, scale: int | None = None,
                replica: bool = False, settings: dict | None = None, db: str = "postgres",
                tag: str = "primary") -> Cluster:
        """Start a cluster with pgbench data at `scale` in database `db`.  db="postgres" lets
        the testkit initialise it (before a replica's base backup copies it); any other name
        is created and initialised here - Pgpool-II never caches connections to "postgres"."""
        sets = [f"{k}={v}" for k, v in (settings or {}).items()]
        own_db = db != "postgres"
        info = self.lab.start_cluster(max_connections=max_connections, reserved=reserved,
                                      scale=None if own_db else scale, auth="trust",
                                      settings=sets, replica=replica, tag=tag, timeout=900,
                                      databases=[db] if own_db else ())
        c = Cluster(host=info.get("host") or "127.0.0.1", port=int(info["port"]),
                    superuser=info.get("superuser") or "postgres",
                    password=info.get("password") or "postgres",
                    replica_port=info.get("replica_port"), data_dir=info.get("data_dir"),
                    max_connections=max_connections, reserved=reserved, db=db)
        if own_db and scale:
            self.pgbench_init(c, scale)
        return c

    def pgbench_init(self, c: Cluster, scale: int, timeout: float = 900) -> None:
        env = dict(os.environ, PGPASSWORD=c.password)
        r = subprocess.run([pglab.pg_bin("pgbench"), "-i", "-q", "-s", str(scale), "-h", c.host,
                            "-p", str(c.port), "-U", c.superuser, c.db],
                           capture_output=True, text=True, timeout=timeout, env=env)
        if r.returncode != 0:
            raise LabError(f"pgbench -i -s {scale} failed: {r.stderr.strip()[-500:]}")

    def sql(self, cluster: Cluster, query: str, *, port: int | None = None,
            db: str | None = None, timeout: float = 30) -> str:
        """Run SQL as the superuser over TCP (port defaults to the cluster's primary)."""
        env = dict(os.environ, PGPASSWORD=cluster.password, PGCONNECT_TIMEOUT="10")
        r = subprocess.run([pglab.pg_bin("psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-At",
                            "-h", cluster.host, "-p", str(port or cluster.port),
                            "-U", cluster.superuser, "-d", db or cluster.db, "-c", query],
                           capture_output=True, text=True, timeout=timeout, env=env)
        if r.returncode != 0:
            raise LabError(f"psql on port {port or cluster.port} failed: {r.stderr.strip()}")
        return r.stdout.strip()

    def create_app_role(self, cluster: Cluster) -> tuple[str, str]:
        """The ordinary role every benchmark connects as; may read and write pgbench's tables."""
        self.sql(cluster,
                 f"DO $$BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{APP_ROLE}') "
                 f"THEN CREATE ROLE {APP_ROLE} LOGIN PASSWORD '{APP_PASSWORD}'; END IF; END$$; "
                 f"GRANT ALL ON ALL TABLES IN SCHEMA public TO {APP_ROLE}; "
                 f"GRANT ALL ON SCHEMA public TO {APP_ROLE}")
        return APP_ROLE, APP_PASSWORD

    def backends(self, cluster: Cluster, role: str = APP_ROLE, port: int | None = None) -> int | None:
        try:
            return int(self.sql(cluster, "SELECT count(*) FROM pg_stat_activity WHERE "
                                f"backend_type = 'client backend' AND usename = '{role}'",
                                port=port, timeout=10))
        except (LabError, ValueError, subprocess.SubprocessError):
            return None

    def postmaster_pid(self, cluster: Cluster, port: int | None = None) -> int | None:
        try:
            data_dir = self.sql(cluster, "SHOW data_directory", port=port, timeout=10)
            return int(Path(data_dir, "postmaster.pid").read_text().split("\n", 1)[0])
        except (LabError, OSError, ValueError, subprocess.SubprocessError):
            return None

    def pin(self, cluster: Cluster, cpus: set[int], port: int | None = None) -> bool:
        """Bind a server (postmaster, its processes, and the backends it forks later) to cpus:
        on one machine this stands in for "each server on a machine of its own"."""
        pm = self.postmaster_pid(cluster, port)
        if pm is None:
            return False
        try:
            os.sched_setaffinity(pm, cpus)
        except (OSError, AttributeError):
            return False
        for pid in proc_children(pm):
            try:
                os.sched_setaffinity(pid, cpus)
            except OSError:  # a backend that just exited
                pass
        return True

    def wait_backends_gone(self, cluster: Cluster, role: str = APP_ROLE,
                           timeout: float = 20) -> None:
        """After a pooler stopped: its server connections must be gone before direct runs."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            n = self.backends(cluster, role)
            if n == 0:
                return
            time.sleep(0.2)


def proc_children(ppid: int) -> list[int]:
    """Direct children of a process, from /proc."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path("/proc", d, "stat").read_text()
            if int(stat[stat.rindex(")") + 2:].split()[1]) == ppid:
                out.append(int(d))
        except (OSError, ValueError, IndexError):
            continue
    return out
