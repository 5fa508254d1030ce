"""A throwaway Patroni cluster: etcd and two PostgreSQL nodes managed by Patroni.

The seed's high-availability stack (E5) is Patroni + etcd + HAProxy; the failover scenario
puts sluice and HAProxy in front of the same Patroni cluster and switches its leader over
under load.  Everything lives in the stack's temp dir on free ports: one etcd, and per node a
Patroni configuration (`pgN.yml`), a data dir, a REST API port and a PostgreSQL port.  Patroni
runs as the `postgres` OS user when the lab runs as root (PostgreSQL refuses root).

Teardown is registered with the stack's Lab, so it also happens on an error or Ctrl-C: each
Patroni is killed (a graceful Patroni stop would wait for PostgreSQL and hand the leader key
over), then `pg_ctl stop -m immediate` stops its PostgreSQL if that is still running (Patroni
starts the postmaster in a session of its own), then etcd stops.  Debian's packages:
`patroni`, `etcd-server`.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pglab
from pglab import LabError

from lab.stack import Cluster, Stack

SCOPE = "sluice-lab"
SUPERUSER, SUPERUSER_PASSWORD = "postgres", "postgres"


def patroni_bin() -> str | None:
    return shutil.which("patroni") or ("/usr/bin/patroni" if Path("/usr/bin/patroni").exists()
                                       else None)


def etcd_bin() -> str | None:
    return shutil.which("etcd") or ("/usr/bin/etcd" if Path("/usr/bin/etcd").exists() else None)


def available() -> str | None:
    """None when a Patroni cluster can start here, else why not."""
    missing = [pkg for pkg, found in (("patroni", patroni_bin()), ("etcd-server", etcd_bin()))
               if not found]
    if missing:
        return (f"{' and '.join(missing)} not installed (apt-get install "
                f"{' '.join(missing)}, or make deps)")
    return None


@dataclass
class Node:
    name: str
    pg_port: int
    rest_port: int
    data_dir: Path
    yml: Path
    log: Path
    proc: object = None

    @property
    def rest_url(self) -> str:
        return f"http://127.0.0.1:{self.rest_port}"


def http_status(url: str, *, method: str = "GET", body: dict | None = None,
                timeout: float = 2) -> tuple[int | None, str]:
    """(status, body) of one request; (None, reason) when nothing answers."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except (OSError, ValueError) as e:  # refused, reset, timeout
        return None, str(e)


class PatroniCluster:
    """etcd + `nodes` Patroni nodes; node 0 bootstraps and leads at first."""

    def __init__(self, stack: Stack, nodes: int = 2):
        self.stack = stack
        self.lab = stack.lab
        self.dir = stack.tmp
        self.etcd_client = pglab.free_port()
        self.etcd_peer = pglab.free_port()
        self.nodes = [Node(name=f"pg{i}", pg_port=pglab.free_port(),
                           rest_port=pglab.free_port(), data_dir=self.dir / f"pg{i}",
                           yml=self.dir / f"pg{i}.yml", log=self.dir / f"patroni{i}.log")
                      for i in range(nodes)]
        self.etcd_log = self.dir / "etcd.log"
        self.bindir = str(pglab.pg_bindir())

    # start ----------------------------------------------------------------------------
    def start(self, timeout: float = 90) -> None:
        why = available()
        if why:
            raise LabError(why)
        self._start_etcd(timeout=30)
        for i, node in enumerate(self.nodes):
            self._start_node(node)
            path = "/primary" if i == 0 else "/replica"
            self._wait_status(node, path, 200, timeout)

    def _start_etcd(self, timeout: float) -> None:
        ec, ep = f"http://127.0.0.1:{self.etcd_client}", f"http://127.0.0.1:{self.etcd_peer}"
        cmd = [etcd_bin(), "--name", "t", "--data-dir", str(self.dir / "etcd"),
               "--listen-client-urls", ec, "--advertise-client-urls", ec,
               "--listen-peer-urls", ep, "--initial-advertise-peer-urls", ep,
               "--initial-cluster", f"t={ep}"]
        out = self.lab.open_file(self.etcd_log)
        proc = self.lab.spawn("etcd", cmd, stdout=out, stderr=out, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise LabError(f"etcd exited with code {proc.returncode}:\n{_tail(self.etcd_log)}")
            status, _ = http_status(f"{ec}/health", timeout=1)
            if status == 200:
                return
            time.sleep(0.2)
        raise LabError(f"etcd not healthy after {timeout:.0f}s:\n{_tail(self.etcd_log)}")

    def _yml(self, i: int, node: Node) -> str:
        d = self.dir
        return f"""\
scope: {SCOPE}
name: {node.name}
restapi: {{listen: 127.0.0.1:{node.rest_port}, connect_address: 127.0.0.1:{node.rest_port}}}
etcd3: {{hosts: 127.0.0.1:{self.etcd_client}}}
bootstrap:
  dcs:
    ttl: 20
    loop_wait: 1
    retry_timeout: 5
    maximum_lag_on_failover: 1048576
    postgresql:
      use_pg_rewind: true
      parameters: {{wal_log_hints: "on", max_wal_senders: 10, max_replication_slots: 10, hot_standby: "on", fsync: "off", synchronous_commit: "off", max_connections: 200}}
      pg_hba:
      - local all all trust
      - host all all 127.0.0.1/32 trust
      - host replication replicator 127.0.0.1/32 trust
  initdb: [{{encoding: UTF8}}]
postgresql:
  listen: 127.0.0.1:{node.pg_port}
  connect_address: 127.0.0.1:{node.pg_port}
  data_dir: {node.data_dir}
  bin_dir: {self.bindir}
  pgpass: {d / f"pgpass{i}"}
  authentication:
    superuser: {{username: {SUPERUSER}, password: {SUPERUSER_PASSWORD}}}
    replication: {{username: replicator, password: rep-pass}}
    rewind: {{username: rewind_user, password: rewind-pass}}
  parameters: {{unix_socket_directories: '{d}'}}
"""

    def _start_node(self, node: Node) -> None:
        i = self.nodes.index(node)
        self.lab.write(node.yml.name, self._yml(i, node))
        out = self.lab.open_file(node.log)
        env = dict(os.environ, HOME=str(self.dir), PGPASSFILE=str(self.dir / f"pgpass{i}"))
        node.proc = self.lab.spawn(f"patroni {node.name}", [patroni_bin(), str(node.yml)],
                                   as_postgres=True, stop=self._stopper(node), stdout=out,
                                   stderr=out, stdin=subprocess.DEVNULL, cwd=str(self.dir),
                                   env=env)

    def _stopper(self, node: Node):
        def stop(proc) -> None:
            pglab.stop_process(proc, signal.SIGKILL, timeout=5)
            if (node.data_dir / "postmaster.pid").exists():
                kw = {}
                if self.lab.pg_uid is not None:
                    kw = dict(user=self.lab.pg_uid, group=self.lab.pg_gid, extra_groups=[])
                try:
                    subprocess.run([pglab.pg_bin("pg_ctl"), "-D", str(node.data_dir), "stop",
                                    "-m", "immediate", "-w", "-t", "20"],
                                   capture_output=True, timeout=30, **kw)
                except (OSError, subprocess.SubprocessError, LabError) as e:
                    pglab.warn(f"pg_ctl stop of {node.data_dir}: {e}")
        return stop

    def _wait_status(self, node: Node, path: str, want: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            if node.proc is not None and node.proc.poll() is not None:
                raise LabError(f"Patroni {node.name} exited with code {node.proc.returncode}:"
                               f"\n{_tail(node.log)}")
            last = http_status(node.rest_url + path, timeout=1)
            if last[0] == want:
                return
            time.sleep(0.2)
        raise LabError(f"Patroni {node.name}: GET {path} did not answer {want} within "
                       f"{timeout:.0f}s (last: {last})\n{_tail(node.log)}")

    # state ----------------------------------------------------------------------------
    def leader(self) -> int | None:
        """Index of the node that answers 200 on /primary, if exactly one does."""
        up = [i for i, n in enumerate(self.nodes)
              if http_status(n.rest_url + "/primary", timeout=1)[0] == 200]
        return up[0] if len(up) == 1 else None

    def wait_settled(self, leader: int, timeout: float = 60) -> None:
        """Until `leader` answers 200 on /primary and every other node 200 on /replica."""
        for i, node in enumerate(self.nodes):
            self._wait_status(node, "/primary" if i == leader else "/replica", 200, timeout)

    def cluster(self, leader: int) -> Cluster:
        """The leader as a lab Cluster (for pgbench -i and SQL through Stack)."""
        other = next((n.pg_port for i, n in enumerate(self.nodes) if i != leader), None)
        return Cluster(host="127.0.0.1", port=self.nodes[leader].pg_port, superuser=SUPERUSER,
                       password=SUPERUSER_PASSWORD, replica_port=other,
                       data_dir=str(self.nodes[leader].data_dir), max_connections=200,
                       reserved=3, db="postgres")

    def switchover(self, leader: int, candidate: int, t0: float, timeout: float = 60) -> dict:
        """Ask Patroni to hand the leader over and wait until the roles have swapped.
        Returns the times (seconds since t0, a time.monotonic()) it was requested, answered
        and completed, and Patroni's answer."""
        old, new = self.nodes[leader], self.nodes[candidate]
        requested = time.monotonic()
        status, body = http_status(old.rest_url + "/switchover", method="POST",
                                   body={"leader": old.name, "candidate": new.name},
                                   timeout=timeout)
        answered = time.monotonic()
        if status != 200:
            raise LabError(f"switchover {old.name} -> {new.name}: {status} {body.strip()}")
        self.wait_settled(candidate, timeout)
        done = time.monotonic()
        return {"from": old.name, "to": new.name, "answer": body.strip(),
                "requested_s": round(requested - t0, 2), "answered_s": round(answered - t0, 2),
                "completed_s": round(done - t0, 2)}


def _tail(path: Path, n: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""
