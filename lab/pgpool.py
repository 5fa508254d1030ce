"""Pgpool-II 4.x as a lab peer: its configuration files and a foreground process.

Pgpool-II is a different animal from PgBouncer: every client is served by one of
`num_init_children` pre-forked processes for as long as it stays connected, and each child
caches up to `max_pool` backend connections (connection_cache=on), so it saves the fork and
login of a new connection (E3's `pgbench -C`) but does not multiplex many clients over few
servers (E1).  Clients beyond `num_init_children - reserved_connections` are refused with
"Sorry, too many clients already" (reserved_connections >= 1) instead of hanging in the
listen queue.  We run it in raw mode (one backend, no load balancing, no health checks), in
the foreground (-n), as the postgres user, with every pid/socket/status file in the lab's
temp dir.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pglab
from pglab import LabError


def binary() -> str | None:
    env = os.environ.get("PGPOOL_BIN")
    if env:
        return env if Path(env).exists() else None
    found = shutil.which("pgpool")
    if found:
        return found
    return "/usr/sbin/pgpool" if Path("/usr/sbin/pgpool").exists() else None


def version() -> str | None:
    b = binary()
    return pglab.cmd_output([b, "--version"]) if b else None


def config(*, port: int, pcp_port: int, workdir: Path, backend_host: str, backend_port: int,
           children: int, max_pool: int, reserved: int) -> str:
    w = str(workdir)
    return "\n".join([
        "backend_clustering_mode = 'raw'",
        "listen_addresses = '127.0.0.1'",
        f"port = {port}",
        f"unix_socket_directories = '{w}'",
        "pcp_listen_addresses = ''",
        f"pcp_port = {pcp_port}",
        f"pcp_socket_dir = '{w}'",
        f"wd_ipc_socket_dir = '{w}'",
        f"pid_file_name = '{w}/pgpool.pid'",
        f"logdir = '{w}'",
        f"backend_hostname0 = '{backend_host}'",
        f"backend_port0 = {backend_port}",
        "backend_weight0 = 1",
        "backend_flag0 = 'DISALLOW_TO_FAILOVER'",
        "enable_pool_hba = off",
        "pool_passwd = ''",
        f"num_init_children = {children}",
        f"max_pool = {max_pool}",
        f"reserved_connections = {reserved}",
        "listen_backlog_multiplier = 4",
        "connection_cache = on",
        "load_balance_mode = off",
        "health_check_period = 0",
        "sr_check_period = 0",
        "memory_cache_enabled = off",
        "child_life_time = 0",
        "log_destination = 'stderr'",
        "log_min_messages = warning",
        "",
    ])


def start(stack, cluster, *, children: int, max_pool: int, reserved: int,
          timeout: float = 30) -> tuple[subprocess.Popen, int, str]:
    """Start pgpool in the foreground; returns (process, port, pgpool.conf text)."""
    lab = stack.lab
    workdir = stack.unique("pgpool")
    workdir.mkdir()
    lab.chown_pg(workdir)
    port, pcp_port = pglab.free_port(), pglab.free_port()
    text = config(port=port, pcp_port=pcp_port, workdir=workdir, backend_host=cluster.host,
                  backend_port=cluster.port, children=children, max_pool=max_pool,
                  reserved=reserved)
    conf = workdir / "pgpool.conf"
    conf.write_text(text)
    pcp = workdir / "pcp.conf"
    pcp.write_text("")
    for f in (conf, pcp):
        lab.chown_pg(f)
    log = lab.open_file(workdir / "pgpool.log")
    proc = lab.spawn("pgpool", [binary(), "-n", "-f", str(conf), "-F", str(pcp)],
                     as_postgres=True, stdout=log, stderr=subprocess.STDOUT,
                     stdin=subprocess.DEVNULL, cwd=str(workdir))
    try:
        pglab.wait_port("127.0.0.1", port, timeout, proc)
    except LabError as e:
        tail = (workdir / "pgpool.log").read_text(errors="replace").strip().splitlines()[-8:]
        pglab.stop_process(proc)
        raise LabError(f"{e}\n" + "\n".join(tail)) from e
    return proc, port, text
