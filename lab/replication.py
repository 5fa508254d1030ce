"""Followers of the primary for E2: LSN positions, a logical subscriber, waiting for catch-up.

E2's metric is "sustainable TPS = transactions run on the primary / time until the standby
has caught up".  We take the primary's WAL insert position when pgbench ends and poll, every
0.1 s, until each follower has passed it:
  * the streaming replica: pg_last_wal_replay_lsn() on the replica itself (exact);
  * the logical subscriber: the replay_lsn its apply worker reports to the primary
    (pg_stat_replication), sent at least every wal_receiver_status_interval = 1 s and
    whenever it has applied something.
The subscriber is a second, empty cluster with pgbench's tables and keys (pgbench -i -I dtp),
subscribed to a publication of those tables with an initial copy.
"""

from __future__ import annotations

import os
import subprocess
import time

import pglab
from pglab import LabError

from lab.stack import Cluster, Stack

SUBSCRIPTION = "lab_sub"
PUBLICATION = "lab_pub"
TABLES = ("pgbench_accounts", "pgbench_branches", "pgbench_tellers", "pgbench_history")


def lsn_to_int(lsn: str) -> int:
    hi, lo = lsn.strip().split("/")
    return (int(hi, 16) << 32) | int(lo, 16)


def primary_lsn(stack: Stack, primary: Cluster) -> int:
    return lsn_to_int(stack.sql(primary, "SELECT pg_current_wal_lsn()"))


def replica_replay_lsn(stack: Stack, primary: Cluster) -> int | None:
    out = stack.sql(primary, "SELECT pg_last_wal_replay_lsn()", port=primary.replica_port,
                    timeout=10)
    return lsn_to_int(out) if out else None


def subscriber_lsn(stack: Stack, primary: Cluster) -> int | None:
    out = stack.sql(primary, "SELECT replay_lsn FROM pg_stat_replication "
                    f"WHERE application_name = '{SUBSCRIPTION}'", timeout=10)
    return lsn_to_int(out) if out else None


def setup_subscriber(stack: Stack, primary: Cluster, subscriber: Cluster, scale: int,
                     timeout: float = 900, progress=None) -> float:
    """Tables + keys on the subscriber, publication on the primary, subscription with the
    initial copy; returns the seconds the initial copy took."""
    env = dict(os.environ, PGPASSWORD=subscriber.password)
    r = subprocess.run([pglab.pg_bin("pgbench"), "-i", "-I", "dtp", "-s", str(scale), "-q",
                        "-h", subscriber.host, "-p", str(subscriber.port), "-U",
                        subscriber.superuser, "postgres"],
                       capture_output=True, text=True, timeout=120, env=env)
    if r.returncode != 0:
        raise LabError(f"creating pgbench tables on the subscriber failed: {r.stderr.strip()}")
    stack.sql(primary, f"CREATE PUBLICATION {PUBLICATION} FOR TABLE {', '.join(TABLES)}")
    conn = (f"host={primary.host} port={primary.port} dbname=postgres "
            f"user={primary.superuser} password={primary.password}")
    t0 = time.monotonic()
    stack.sql(subscriber, f"CREATE SUBSCRIPTION {SUBSCRIPTION} CONNECTION '{conn}' "
              f"PUBLICATION {PUBLICATION} WITH (copy_data = true)", timeout=60)
    deadline = t0 + timeout
    while time.monotonic() < deadline:
        pending = stack.sql(subscriber, "SELECT count(*) FROM pg_subscription_rel "
                            "WHERE srsubstate <> 'r'", timeout=10)
        if pending == "0":
            return round(time.monotonic() - t0, 1)
        if progress:
            progress.detail(f"initial copy, {pending} table(s) left")
        time.sleep(0.5)
    raise LabError(f"the logical subscriber did not finish its initial copy in {timeout:.0f} s")


def wait_caught_up(readers: dict, target_lsn: int, *, started: float, timeout: float,
                   poll: float = 0.1) -> dict:
    """readers: name -> function returning the follower's LSN.  Returns name -> seconds after
    `started` (a time.monotonic()) when it reached target_lsn, or None if it did not within
    timeout (then also name + '_behind_bytes')."""
    result: dict = {name: None for name in readers}
    pending = dict(readers)
    deadline = time.monotonic() + timeout
    last: dict = {}
    while pending and time.monotonic() < deadline:
        for name, read in list(pending.items()):
            try:
                lsn = read()
            except (LabError, subprocess.SubprocessError, ValueError):
                lsn = None
            if lsn is not None:
                last[name] = lsn
                if lsn >= target_lsn:
                    result[name] = round(time.monotonic() - started, 2)
                    del pending[name]
        if pending:
            time.sleep(poll)
    for name in pending:
        result[name + "_behind_bytes"] = (target_lsn - last[name]) if name in last else None
    return result
