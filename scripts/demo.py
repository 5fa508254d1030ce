#!/usr/bin/env python3
"""make demo: 150 clients against a PostgreSQL that allows 100 connections, directly and
through sluice (transaction pooling, pool of 20).

Starts a throwaway PostgreSQL 15 (max_connections=100, 3 reserved for superusers, pgbench
scale 2) and sluice in front of it, runs `pgbench -S` (select-only) with 150 clients as the
ordinary role "app" for a few seconds directly and then through sluice, and prints a short
table.  Everything it starts is stopped at the end.

Environment: SLUICE_BIN (default target/release/sluice), SLUICE_TESTKIT (default
target/release/sluice-testkit), PG_BINDIR.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pglab  # noqa: E402
from pglab import Lab, LabError, log  # noqa: E402

MAX_CONNECTIONS = 100
RESERVED = 3
SCALE = 2
ROLE, ROLE_PW = "app", "app"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=150)
    ap.add_argument("--duration", type=int, default=5, help="seconds per pgbench run (default 5)")
    ap.add_argument("--pool-size", type=int, default=20)
    a = ap.parse_args(argv)

    pglab.raise_nofile()
    pglab.install_signal_handlers()
    t0 = time.monotonic()
    with Lab(prefix="sluice-demo-") as lab:
        log(f"starting a throwaway PostgreSQL (max_connections={MAX_CONNECTIONS}, "
            f"{RESERVED} reserved for superusers, pgbench scale {SCALE}) ...")
        c = lab.start_cluster(max_connections=MAX_CONNECTIONS, reserved=RESERVED, scale=SCALE,
                              auth="trust")
        pg_port = int(c["port"])
        # an ordinary (non-superuser) role, like an application would use
        lab.psql(f"DO $$BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{ROLE}') "
                 f"THEN CREATE ROLE {ROLE} LOGIN PASSWORD '{ROLE_PW}'; END IF; END$$; "
                 f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {ROLE}")
        auth_file = lab.write("userlist.txt", pglab.userlist(
            {ROLE: ROLE_PW, c.get("superuser") or "postgres": c.get("password") or "postgres"}))

        def ini(port, logfile):
            return pglab.pooler_ini(pg_port=pg_port, listen_port=port, logfile=logfile,
                                    auth_file=auth_file, dbname="appdb",
                                    default_pool_size=a.pool_size, max_client_conn=1000,
                                    admin_users=c.get("superuser") or "postgres")
        sluice = lab.start_proxy("sluice", ini)
        log(f"PostgreSQL on 127.0.0.1:{pg_port}; sluice on 127.0.0.1:{sluice.port} "
            f"(pool_mode=transaction, default_pool_size={a.pool_size}, database appdb)")

        # ---- 1. directly ---------------------------------------------------------
        log(f"\n1) pgbench -S -c {a.clients} -T {a.duration} directly against PostgreSQL ...")
        direct = pglab.run_pgbench(host="127.0.0.1", port=pg_port, dbname="postgres", user=ROLE,
                                   password=ROLE_PW, clients=a.clients, duration=a.duration)
        if direct["aborted"] or direct["error"]:
            log(f"   {direct['error']}")
            # pgbench stops at the first refused client; count how many of the clients
            # PostgreSQL actually accepts at once
            time.sleep(0.5)
            probe = pglab.probe_connections("127.0.0.1", pg_port, user=ROLE, database="postgres",
                                            n=a.clients)
            direct_ok, direct_refused = probe["opened"], probe["failed"]
            reasons = probe["errors"]
        else:
            direct_ok, direct_refused, reasons = a.clients, 0, {}
        log(f"   {direct_ok} of {a.clients} clients got a connection, {direct_refused} refused")

        # ---- 2. through sluice --------------------------------------------------
        log(f"\n2) pgbench -S -c {a.clients} -T {a.duration} through sluice; PostgreSQL's own "
            f"view (pg_stat_activity) meanwhile:")
        samples: list[int] = []
        stop = threading.Event()

        def watch():
            start = time.monotonic()
            while not stop.wait(1.0):
                try:
                    n = int(lab.psql(
                        "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'"
                        f" AND datname = 'postgres' AND usename = '{ROLE}'", timeout=5))
                except (LabError, ValueError, Exception):  # noqa: BLE001
                    continue
                samples.append(n)
                log(f"   t={time.monotonic() - start:4.1f}s  server connections from {ROLE}: {n:3d}")

        th = threading.Thread(target=watch, daemon=True)
        th.start()
        try:
            via = pglab.run_pgbench(host="127.0.0.1", port=sluice.port, dbname="appdb", user=ROLE,
                                    password=ROLE_PW, clients=a.clients, duration=a.duration)
        finally:
            stop.set()
            th.join(timeout=10)
        if via["error"]:
            log(f"   {via['error']}")
            if not sluice.alive():
                log(f"   sluice exited with code {sluice.proc.returncode}:\n{sluice.log_tail()}")
        via_refused = via["failed_clients"] if not via["aborted"] else None
        if via["aborted"]:
            time.sleep(0.5)
            probe = pglab.probe_connections("127.0.0.1", sluice.port, user=ROLE, database="appdb",
                                            n=a.clients)
            via_refused = probe["failed"]

    # ---- table --------------------------------------------------------------------
    reason = next(iter(reasons), "")
    rows = [
        ("directly", a.clients, a.clients - direct_refused, direct_refused,
         direct["tps"] or 0.0, str(a.clients - direct_refused)),
        ("through sluice", a.clients, a.clients - via_refused, via_refused, via["tps"] or 0.0,
         f"{max(samples)} (max seen)" if samples else "-"),
    ]
    print()
    print(f"pgbench -S (select-only), {a.clients} clients, {a.duration} s, PostgreSQL "
          f"max_connections={MAX_CONNECTIONS} ({RESERVED} reserved for superusers)")
    hdr = ("", "clients", "connected", "refused", "tps", "PostgreSQL connections")
    fmt = "{:<15} {:>7} {:>9} {:>7} {:>10} {:>23}"
    print(fmt.format(*hdr))
    for r in rows:
        print(fmt.format(r[0], r[1], r[2], r[3], f"{r[4]:,.0f}", r[5]))
    if reason:
        print(f"refused directly with: {reason}")
    print()
    if direct_refused:
        print(f"PostgreSQL has {MAX_CONNECTIONS} connection slots and keeps {RESERVED} for superusers, so of "
              f"{a.clients} clients connecting directly")
        print(f"only {direct_ok} got in; {direct_refused} were refused and pgbench gave up on the whole run "
              f"(tps {direct['tps'] or 0:.0f}).")
    else:
        print(f"All {a.clients} clients fit into PostgreSQL's {MAX_CONNECTIONS} slots directly "
              f"(try --clients 150 to see refusals).")
    peak = max(samples) if samples else None
    print(f"Through sluice {a.clients - via_refused} of {a.clients} clients connected and ran, while "
          f"PostgreSQL saw at most {peak if peak is not None else '?'} connections from them:")
    print(f"sluice lends one of its {a.pool_size} server connections to a client only for the duration "
          f"of a transaction (transaction pooling).")
    print(f"(total {time.monotonic() - t0:.0f} s; everything started was stopped)")
    return 0 if via_refused == 0 and not via["aborted"] else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("\ninterrupted; everything started was stopped", file=sys.stderr)
        sys.exit(130)
    except LabError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
