"""HAProxy in front of a Patroni cluster, the seed's layout (E5): one port for writes, one
for reads.

HAProxy does not speak PostgreSQL: it forwards TCP to whichever servers Patroni's REST API
vouches for, by health check - `GET /primary` for the write port, `GET /replica` for the
read port, every second, and a server that fails two checks in a row is marked down and its
sessions are cut (`on-marked-down shutdown-sessions`).  It is what the failover scenario
compares sluice with.  HAProxy runs in the foreground (`-db`) as a child of the stack's Lab,
its configuration and admin socket in the lab's temp dir.  Debian's package: `haproxy`.
"""

from __future__ import annotations

import csv
import io
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pglab
from pglab import LabError

from lab.patroni import PatroniCluster


def binary() -> str | None:
    return shutil.which("haproxy") or ("/usr/sbin/haproxy" if Path("/usr/sbin/haproxy").exists()
                                       else None)


def available() -> str | None:
    if not binary():
        return "HAProxy is not installed (make peers, or apt-get install haproxy)"
    return None


@dataclass
class HAProxy:
    proc: subprocess.Popen
    write_port: int
    read_port: int
    config: str
    socket: Path
    log: Path

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stat(self) -> list[dict]:
        """`show stat` from the admin socket: one row per frontend, backend and server."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(3)
            s.connect(str(self.socket))
            s.sendall(b"show stat\n")
            chunks = []
            while True:
                b = s.recv(65536)
                if not b:
                    break
                chunks.append(b)
        text = b"".join(chunks).decode(errors="replace").lstrip("# ")
        return list(csv.DictReader(io.StringIO(text)))

    def servers_up(self) -> dict[str, set[str]]:
        """Which servers each proxy ("primary", "replicas") counts as up."""
        out: dict[str, set[str]] = {"primary": set(), "replicas": set()}
        for row in self.stat():
            if row.get("svname") in ("FRONTEND", "BACKEND"):
                continue
            if row.get("pxname") in out and (row.get("status") or "").startswith("UP"):
                out[row["pxname"]].add(row["svname"])
        return out

    def wait_checks(self, primary: str, replicas: set[str], timeout: float = 30) -> None:
        """Until the health checks agree with Patroni: only `primary` up for writes, only
        `replicas` up for reads (servers start out up, before their first check)."""
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            if not self.alive():
                raise LabError(f"haproxy exited with code {self.proc.returncode}:\n"
                               f"{_tail(self.log)}")
            try:
                last = self.servers_up()
                if last["primary"] == {primary} and last["replicas"] == set(replicas):
                    return
            except OSError as e:
                last = str(e)
            time.sleep(0.2)
        raise LabError(f"HAProxy's checks did not settle within {timeout:.0f}s "
                       f"(want {primary} for writes, {sorted(replicas)} for reads; last {last})")


def config_text(pc: PatroniCluster, write_port: int, read_port: int, sock: Path) -> str:
    def servers() -> str:
        return "".join(f"    server {n.name} 127.0.0.1:{n.pg_port} check port {n.rest_port}\n"
                       for n in pc.nodes)
    defaults = "    default-server inter 1s fall 2 rise 1 on-marked-down shutdown-sessions\n"
    return (
        "global\n"
        "    maxconn 1000\n"
        f"    stats socket {sock} mode 600 level admin\n"
        "\n"
        "defaults\n"
        "    mode tcp\n"
        "    retries 2\n"
        "    timeout client 30m\n"
        "    timeout server 30m\n"
        "    timeout connect 4s\n"
        "    timeout check 5s\n"
        "    maxconn 1000\n"
        "\n"
        "listen primary\n"
        f"    bind 127.0.0.1:{write_port}\n"
        "    option httpchk GET /primary\n"
        "    http-check expect status 200\n"
        + defaults + servers() +
        "\n"
        "listen replicas\n"
        f"    bind 127.0.0.1:{read_port}\n"
        "    balance roundrobin\n"
        "    option httpchk GET /replica\n"
        "    http-check expect status 200\n"
        + defaults + servers())


def start(stack, pc: PatroniCluster, timeout: float = 20) -> HAProxy:
    """Start HAProxy (raises LabError if it does not listen); stopped with the stack's Lab."""
    why = available()
    if why:
        raise LabError(why)
    write_port, read_port = pglab.free_port(), pglab.free_port()
    sock = stack.tmp / "haproxy.sock"
    text = config_text(pc, write_port, read_port, sock)
    cfg = stack.lab.write("haproxy.cfg", text)
    log = stack.tmp / "haproxy.log"
    out = stack.lab.open_file(log)
    proc = stack.lab.spawn("haproxy", [binary(), "-f", str(cfg), "-db"], stdout=out,
                           stderr=out, stdin=subprocess.DEVNULL)
    try:
        pglab.wait_port("127.0.0.1", write_port, timeout, proc)
        pglab.wait_port("127.0.0.1", read_port, timeout, proc)
    except LabError as e:
        raise LabError(f"haproxy did not start: {e}\n{_tail(log)}") from e
    return HAProxy(proc=proc, write_port=write_port, read_port=read_port, config=text,
                   socket=sock, log=log)


def _tail(path: Path, n: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""
