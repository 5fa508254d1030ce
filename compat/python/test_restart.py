"""Scenario 8: PostgreSQL restarted (pg_ctl restart -m fast) under load.

psycopg and asyncpg workers run transactions in a loop, both on their own
connections (with statements prepared before the restart: psycopg's
prepare=True / threshold statements, asyncpg's conn.prepare()) and through
their pools. Errors while PostgreSQL is down are allowed (workers back off,
reconnect when the driver says the connection is gone, and retry); within
20 s after the restart every worker must complete transactions again."""

from __future__ import annotations

import asyncio
import subprocess
import threading
import time

import asyncpg
import psycopg
from psycopg_pool import ConnectionPool

from common import DSN, RESTART_CMD, describe, run_threads

T = "compat_py.rs"  # prefix of its tables
RECOVERY_S = 20          # every worker must succeed again within this
SUCCESSES_AFTER = 5      # transactions each worker must complete after the restart
SQL_PG = "select %s::int * 2, %s::text"
SQL_AP = "select $1::int * 2, $2::text"


class Worker:
    """Progress of one worker, shared with the main thread."""

    def __init__(self, name: str):
        self.name = name
        self.lock = threading.Lock()
        self.ok_started: list[float] = []   # start time of each committed transaction
        self.errors: list[tuple[float, str]] = []
        self.reconnects = 0
        self.reconnect_causes: list[str] = []  # the error that broke each connection
        self.same_conn_after_restart = False  # succeeded on a pre-restart connection

    def ok(self, started: float) -> None:
        with self.lock:
            self.ok_started.append(started)

    def error(self, exc: BaseException) -> None:
        with self.lock:
            self.errors.append((time.monotonic(), describe(exc)))

    def ok_since(self, t: float) -> int:
        with self.lock:
            return sum(1 for s in self.ok_started if s >= t)

    def report(self, since: float, when: str) -> str:
        with self.lock:
            errs = [e[:200] for t, e in self.errors if t >= since]
            oks = sum(1 for s in self.ok_started if s >= since)
            causes = sorted(set(c[:160] for c in self.reconnect_causes))
            first_ok = min((s for s in self.ok_started if s >= since), default=None)
            first = "" if first_ok is None else f" (first {first_ok - since:+.1f}s)"
            return (f"  {self.name}: {oks} ok{first} and {len(errs)} errors {when}, "
                    f"{self.reconnects} reconnects (after: {causes[:3]}); "
                    f"last errors: {errs[-2:]}")

    def reconnected(self) -> None:
        with self.lock:
            self.reconnects += 1
            if self.errors:
                self.reconnect_causes.append(self.errors[-1][1])


def test_s8_restart_under_load():
    ddl_conn = psycopg.connect(DSN, autocommit=True, connect_timeout=10)
    with ddl_conn:
        ddl_conn.execute(f"drop table if exists {T}_t")
        ddl_conn.execute(f"create table {T}_t (who text, n int)")

    stop = threading.Event()
    workers: list[Worker] = []
    restart_done = [float("inf")]

    # ---------------- psycopg: own connections ----------------
    def pg_own(i: int) -> None:
        me = Worker(f"psycopg-conn-{i}")
        workers.append(me)
        conn = None
        conn_born = 0.0
        n = 0
        backoff = 0.05
        while not stop.is_set():
            try:
                if conn is None or conn.closed or conn.broken:
                    if conn is not None:
                        conn.close()
                        me.reconnected()
                    conn = psycopg.connect(DSN, autocommit=True, connect_timeout=5)
                    conn_born = time.monotonic()
                started = time.monotonic()
                with conn.transaction():
                    # prepare=True: named at once; the insert gets named after 5 runs
                    row = conn.execute(SQL_PG, (n, me.name), prepare=True).fetchone()
                    assert row == (2 * n, me.name), row
                    conn.execute(f"insert into {T}_t (who, n) values (%s, %s)", (me.name, n))
                me.ok(started)
                if conn_born < restart_done[0] <= started:
                    me.same_conn_after_restart = True
                n += 1
                backoff = 0.05
                time.sleep(0.01)
            except Exception as exc:  # noqa: BLE001 - allowed around the restart
                me.error(exc)
                time.sleep(backoff)
                backoff = min(backoff * 2, 0.5)
        if conn is not None:
            conn.close()

    # ---------------- psycopg: ConnectionPool ----------------
    pool = ConnectionPool(DSN, min_size=4, max_size=4, open=False, timeout=5,
                          kwargs={"connect_timeout": 5}, reconnect_timeout=60)

    def pg_pool(i: int) -> None:
        me = Worker(f"psycopg-pool-{i}")
        workers.append(me)
        n = 0
        backoff = 0.05
        while not stop.is_set():
            try:
                started = time.monotonic()
                with pool.connection(timeout=5) as conn:
                    row = conn.execute(SQL_PG, (n, me.name)).fetchone()
                    assert row == (2 * n, me.name), row
                me.ok(started)
                n += 1
                backoff = 0.05
                time.sleep(0.01)
            except Exception as exc:  # noqa: BLE001 - allowed around the restart
                me.error(exc)
                time.sleep(backoff)
                backoff = min(backoff * 2, 0.5)

    # ---------------- asyncpg, in its own thread/event loop ----------------
    async def ap_main() -> None:
        ap_pool = await asyncpg.create_pool(DSN, min_size=4, max_size=4, timeout=5)

        async def ap_own(i: int) -> None:
            me = Worker(f"asyncpg-conn-{i}")
            workers.append(me)
            conn = None
            stmt = None
            conn_born = 0.0
            n = 0
            backoff = 0.05
            while not stop.is_set():
                try:
                    if conn is None or conn.is_closed():
                        if conn is not None:
                            conn.terminate()
                            me.reconnected()
                        conn = await asyncpg.connect(DSN, timeout=5)
                        conn_born = time.monotonic()
                        stmt = await conn.prepare(SQL_AP)  # explicit, named
                    started = time.monotonic()
                    async with conn.transaction():
                        row = await stmt.fetchrow(n, me.name, timeout=5)
                        assert tuple(row) == (2 * n, me.name), row
                        await conn.execute(f"insert into {T}_t (who, n) values ($1, $2)",
                                           me.name, n, timeout=5)
                    me.ok(started)
                    if conn_born < restart_done[0] <= started:
                        me.same_conn_after_restart = True
                    n += 1
                    backoff = 0.05
                    await asyncio.sleep(0.01)
                except Exception as exc:  # noqa: BLE001 - allowed around the restart
                    me.error(exc)
                    if conn is not None and isinstance(exc, asyncpg.exceptions.InternalClientError):
                        # asyncpg lost track of the protocol state: only a
                        # new connection helps (a server error does not
                        # count: the same connection must work again)
                        conn.terminate()
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 0.5)
            if conn is not None:
                try:
                    await conn.close(timeout=3)
                except Exception:  # noqa: BLE001
                    conn.terminate()

        async def ap_pool_worker(i: int) -> None:
            me = Worker(f"asyncpg-pool-{i}")
            workers.append(me)
            n = 0
            backoff = 0.05
            while not stop.is_set():
                try:
                    started = time.monotonic()
                    async with ap_pool.acquire(timeout=5) as conn:
                        async with conn.transaction():
                            row = await conn.fetchrow(SQL_AP, n, me.name, timeout=5)
                            assert tuple(row) == (2 * n, me.name), row
                    me.ok(started)
                    n += 1
                    backoff = 0.05
                    await asyncio.sleep(0.01)
                except Exception as exc:  # noqa: BLE001 - allowed around the restart
                    me.error(exc)
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 0.5)

        try:
            await asyncio.gather(*[ap_own(i) for i in range(4)],
                                 *[ap_pool_worker(i) for i in range(4)])
        finally:
            try:
                await asyncio.wait_for(ap_pool.close(), 5)
            except Exception:  # noqa: BLE001
                ap_pool.terminate()

    ap_error: list[BaseException] = []

    def ap_thread() -> None:
        try:
            asyncio.run(ap_main())
        except BaseException as exc:  # noqa: BLE001
            ap_error.append(exc)

    pool.open(wait=True, timeout=30)
    runner_errors: list[BaseException] = []

    def sync_workers() -> None:
        def body(i: int) -> None:
            (pg_own if i < 4 else pg_pool)(i % 4)
        try:
            run_threads(body, 8, timeout=90, label="psycopg workers")
        except BaseException as exc:  # noqa: BLE001
            runner_errors.append(exc)

    threads = [threading.Thread(target=sync_workers, daemon=True),
               threading.Thread(target=ap_thread, daemon=True)]
    for t in threads:
        t.start()
    try:
        # warm up: every worker has committed a few transactions
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if len(workers) == 16 and all(w.ok_since(0) >= 10 for w in workers):
                break
            time.sleep(0.05)
        warmed = len(workers) == 16 and all(w.ok_since(0) >= 10 for w in workers)
        before = "\n".join(w.report(0, "before the restart") for w in
                           sorted(workers, key=lambda w: w.name))

        # restart even if the warm-up went wrong: how the clients fare
        # through the restart is worth knowing either way
        restart_started = time.monotonic()
        proc = subprocess.run(["sh", "-c", RESTART_CMD], timeout=90,
                              capture_output=True, text=True)
        assert proc.returncode == 0, f"restart command failed: {proc.stderr}"
        restart_done[0] = time.monotonic()
        print(f"\nrestart took {restart_done[0] - restart_started:.1f}s")

        deadline = restart_done[0] + RECOVERY_S
        while time.monotonic() < deadline:
            if all(w.ok_since(restart_done[0]) >= SUCCESSES_AFTER for w in workers):
                break
            time.sleep(0.05)
        recovered = time.monotonic() - restart_done[0]
        laggards = [w for w in workers if w.ok_since(restart_done[0]) < SUCCESSES_AFTER]
        after = "\n".join(
            w.report(restart_started, "since the restart")
            + (", succeeded on its pre-restart connection" if w.same_conn_after_restart else "")
            for w in sorted(workers, key=lambda w: w.name))
        print(after)
        problems = []
        if not warmed:
            problems.append("not every worker committed 10 transactions in the 10 s before "
                            "the restart:\n" + before)
        if laggards:
            problems.append(
                f"{len(laggards)}/{len(workers)} workers did not complete {SUCCESSES_AFTER} "
                f"transactions within {RECOVERY_S}s after the restart: "
                f"{sorted(w.name for w in laggards)}\n" + after)
        assert not problems, "\n".join(problems)
        print(f"all workers recovered {recovered:.1f}s after the restart")
    finally:
        stop.set()
        join_deadline = time.monotonic() + 15
        for t in threads:
            t.join(max(0.0, join_deadline - time.monotonic()))
        pool.close(timeout=5)
    assert not any(t.is_alive() for t in threads), "workers did not stop"
    assert not runner_errors, runner_errors[0]
    assert not ap_error, describe(ap_error[0])

    with psycopg.connect(DSN, autocommit=True, connect_timeout=10) as conn:
        counts = dict(conn.execute(f"select who, count(*) from {T}_t group by who").fetchall())
    for w in workers:
        if w.name.startswith(("psycopg-conn", "asyncpg-conn")):
            # every committed transaction is there; at most one more whose
            # COMMIT went through while the connection broke
            got, ok = counts.get(w.name, 0), len(w.ok_started)
            assert ok <= got <= ok + 1, f"{w.name}: {got} rows for {ok} committed transactions"
