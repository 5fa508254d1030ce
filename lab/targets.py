"""The things pgbench is pointed at: PostgreSQL directly, sluice, PgBouncer, Pgpool-II.

A target is started for the runs that use it and stopped right after (`with open_target(...)
as t:`), so a pooler's idle server connections never eat the slots of the next target: E1
depends on the direct runs having all 97 of them.  sluice and PgBouncer get the same
generated pgbouncer.ini (sluice reads PgBouncer's format unchanged); Pgpool-II gets its own
files (lab/pgpool.py).  A peer that is not installed or does not start is reported as
skipped with the reason; nothing is ever substituted for it.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pglab
from pglab import LabError

from lab import haproxy, pgpool
from lab.stack import APP_PASSWORD, APP_ROLE, Cluster, Stack

KINDS = ("direct", "sluice", "pgbouncer", "pgpool")
# Targets that only some scenarios run (not in the default list of the others): HAProxy, in
# front of a Patroni cluster, in the failover scenario (lab/haproxy.py).
OTHER_KINDS = ("haproxy",)
LABELS = {"direct": "direct", "sluice": "sluice", "pgbouncer": "PgBouncer", "pgpool": "Pgpool-II",
          "haproxy": "HAProxy"}


class Skipped(Exception):
    """A peer that cannot run here; the message says why (shown in the report)."""


@dataclass
class Target:
    kind: str
    port: int
    dbname: str                      # what pgbench connects to
    host: str = "127.0.0.1"
    user: str = APP_ROLE
    password: str = APP_PASSWORD
    proc: object = None              # subprocess.Popen of the pooler (None for direct)
    config: str = ""                 # the pooler's configuration, for the JSON
    describe: str = ""               # one line: pool mode and size
    extra_dbs: dict[str, str] = field(default_factory=dict)
    log_tail: Callable[[], str] | None = None  # the pooler's last log lines, for errors

    @property
    def label(self) -> str:
        return LABELS.get(self.kind, self.kind)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def alive(self) -> bool:
        return self.proc is None or self.proc.poll() is None


def available(kind: str) -> str | None:
    """None when the target can run here, else why not."""
    if kind == "pgbouncer" and not pglab.pgbouncer_bin():
        return "PgBouncer is not installed (make peers, or apt-get install pgbouncer)"
    if kind == "pgpool" and not pgpool.binary():
        return "Pgpool-II is not installed (make peers, or apt-get install pgpool2)"
    if kind == "haproxy":
        return haproxy.available()
    if kind == "sluice" and not Path(pglab.sluice_bin()).exists():
        return f"{pglab.sluice_bin()} not found (cargo build --release -p sluice)"
    return None


def pooler_ini(*, listen_port: int, logfile: Path, auth_file: Path,
               databases: dict[str, str], pool_mode: str = "transaction",
               pool_size: int = 20, max_client_conn: int = 5000,
               settings: dict | None = None) -> str:
    """One pgbouncer.ini for sluice and PgBouncer alike; databases: name -> connection string."""
    return pglab.pooler_ini(pg_port=0, listen_port=listen_port, logfile=logfile,
                            auth_file=auth_file, pool_mode=pool_mode,
                            default_pool_size=pool_size, max_client_conn=max_client_conn,
                            admin_users="postgres", extra=settings, databases=databases)


def server(cluster: Cluster, port: int | None = None) -> str:
    return f"host={cluster.host} port={port or cluster.port} dbname={cluster.db}"


@contextmanager
def open_target(stack: Stack, kind: str, cluster: Cluster, *, pool_size: int = 20,
                max_client_conn: int = 5000, settings: dict | None = None,
                databases: dict[str, str] | None = None, pgpool_children: int = 32,
                pgpool_max_pool: int = 1, pgpool_reserved: int = 0, dbname: str = "app"):
    """Start one target (raises Skipped when it cannot run here) and stop it on exit.
    databases: for the poolers, name -> connection string (default: dbname -> the primary)."""
    why = available(kind)
    if why:
        raise Skipped(why)
    if kind == "haproxy":
        raise Skipped("HAProxy runs in the failover scenario only (in front of Patroni)")
    if kind == "direct":
        yield Target(kind="direct", port=cluster.port, dbname=cluster.db, host=cluster.host,
                     describe="no pooler")
        return
    if kind == "pgpool":
        try:
            proc, port, conf = pgpool.start(stack, cluster, children=pgpool_children,
                                            max_pool=pgpool_max_pool, reserved=pgpool_reserved)
        except LabError as e:
            raise Skipped(f"Pgpool-II did not start: {e}") from e
        target = Target(kind="pgpool", port=port, dbname=cluster.db, proc=proc, config=conf,
                        describe=f"connection_cache=on, num_init_children={pgpool_children}, "
                                 f"max_pool={pgpool_max_pool}, reserved_connections={pgpool_reserved}")
        try:
            yield target
        finally:
            pglab.stop_process(proc)
            stack.wait_backends_gone(cluster)
        return

    dbs = databases or {dbname: server(cluster)}
    auth_file = stack.lab.write("userlist.txt", pglab.userlist(
        {APP_ROLE: APP_PASSWORD, cluster.superuser: cluster.password}))

    def ini(port, logfile):
        return pooler_ini(listen_port=port, logfile=logfile, auth_file=auth_file,
                          databases=dbs, pool_size=pool_size, max_client_conn=max_client_conn,
                          settings=settings)
    try:
        proxy = stack.lab.start_proxy(kind, ini)
    except LabError as e:
        if kind == "sluice":
            raise
        raise Skipped(f"{LABELS[kind]} did not start: {e}") from e
    extra = ", ".join(f"{k}={v}" for k, v in (settings or {}).items())
    target = Target(kind=kind, port=proxy.port, dbname=next(iter(dbs)), proc=proxy.proc,
                    config=proxy.ini.read_text(), extra_dbs=dict(dbs), log_tail=proxy.log_tail,
                    describe=f"pool_mode=transaction, default_pool_size={pool_size}"
                             + (f", {extra}" if extra else ""))
    try:
        yield target
    finally:
        pglab.stop_process(proxy.proc)
        stack.wait_backends_gone(cluster)
