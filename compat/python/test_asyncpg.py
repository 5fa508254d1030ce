"""asyncpg (default settings: statement cache on, so every query with
arguments runs as a named prepared statement __asyncpg_stmt_N__), scenarios
1-7. Scenario 8 (server restart) is in test_restart.py."""

from __future__ import annotations

import asyncio
import io
import time

import asyncpg
import pytest

from common import DIRECT_DSN, DSN, arun, ddl, gather_workers

P = "compat_py_ap"  # prefix of this file's schemas, channels, markers
T = "compat_py.ap"  # prefix of its tables (schema compat_py: immune to a leaked search_path)


async def connect() -> asyncpg.Connection:
    return await asyncpg.connect(DSN, timeout=10)


async def make_pool(size: int) -> asyncpg.Pool:
    return await asyncpg.create_pool(DSN, min_size=size, max_size=size, timeout=10)


async def close_pool(pool: asyncpg.Pool) -> None:
    try:
        await asyncio.wait_for(pool.close(), 10)
    except (asyncio.TimeoutError, Exception):  # noqa: BLE001 - best effort
        pool.terminate()


class Rollback(Exception):
    """Raised inside `async with conn.transaction()` to roll it back."""


# --------------------------------------------------------------------------
# 1. many concurrent workers (asyncpg pool), more than sluice's pool of 4
# --------------------------------------------------------------------------

def test_s1_concurrent_workers_pool():
    table = f"{T}_s1"
    ddl(f"drop table if exists {table}",
        f"create table {table} (worker int, i int, primary key (worker, i))")
    workers, iterations = 24, 120

    async def main():
        pool = await make_pool(workers)
        try:
            async def worker(w: int) -> None:
                for i in range(iterations):
                    async with pool.acquire(timeout=30) as conn:
                        async with conn.transaction():
                            n = w * 100_000 + i
                            row = await conn.fetchrow("select $1::int + 1, $2::text", n, f"w{w}")
                            assert tuple(row) == (n + 1, f"w{w}"), row
                            await conn.execute(f"insert into {table} (worker, i) values ($1, $2)", w, i)
                            if i % 20 == 19:
                                got = await conn.fetchval(
                                    f"select count(*) from {table} where worker = $1", w)
                                assert got == i + 1, f"worker {w} sees {got} rows, expected {i + 1}"

            await gather_workers([worker(w) for w in range(workers)], timeout=60)
            async with pool.acquire(timeout=30) as conn:
                rows = await conn.fetch(f"select worker, count(*), sum(i) from {table} "
                                        f"group by worker order by worker")
            return [tuple(r) for r in rows]
        finally:
            await close_pool(pool)

    rows = arun(main(), 70)
    assert rows == [(w, iterations, sum(range(iterations))) for w in range(workers)]


# --------------------------------------------------------------------------
# 2. named prepared statements reused across transactions
# --------------------------------------------------------------------------

SQL_A = "select $1::int * 2, $2::text || '-a'"
SQL_B = "select count(*), coalesce(max(n), -1) from " + T + "_s2 where w = $1"
SQL_INS = "insert into " + T + "_s2 (w, n) values ($1, $2)"


def test_s2_prepared_statements_across_transactions():
    """Pool workers run the same cached statements in many transactions;
    dedicated connections use conn.prepare() statements (the same two SQL
    texts prepared on every connection) across many transactions."""
    ddl(f"drop table if exists {T}_s2", f"create table {T}_s2 (w int, n int)")
    pool_workers, explicit_workers, txns = 12, 6, 40

    async def main():
        pool = await make_pool(pool_workers)
        try:
            async def pool_worker(w: int) -> None:
                for i in range(txns):
                    async with pool.acquire(timeout=30) as conn:
                        async with conn.transaction():
                            async def run_a():
                                row = await conn.fetchrow(SQL_A, i + w, f"w{w}")
                                assert tuple(row) == (2 * (i + w), f"w{w}-a"), row

                            async def run_b():
                                row = await conn.fetchrow(SQL_B, w)
                                assert tuple(row) == (i, i - 1 if i else -1), (w, i, row)

                            if w % 2:
                                await run_a()
                                await run_b()
                            else:
                                await run_b()
                                await run_a()
                            await conn.execute(SQL_INS, w, i)

            async def explicit_worker(e: int) -> list[str]:
                w = 100 + e
                conn = await connect()
                try:
                    stmt_a = await conn.prepare(SQL_A)
                    stmt_b = await conn.prepare(SQL_B)
                    stmt_ins = await conn.prepare(SQL_INS)
                    for i in range(txns):
                        async with conn.transaction():
                            assert tuple(await stmt_a.fetchrow(i, "x")) == (2 * i, "x-a")
                            await stmt_ins.fetch(w, i)
                            row = await stmt_b.fetchrow(w)
                            assert tuple(row) == (i + 1, i), (w, i, row)
                        # and outside an explicit transaction
                        assert await stmt_a.fetchval(i, "y") == 2 * i
                    return [stmt_a.get_name(), stmt_b.get_name(), stmt_ins.get_name()]
                finally:
                    await conn.close(timeout=5)

            await gather_workers([pool_worker(w) for w in range(pool_workers)], timeout=60,
                                 label="pool workers")
            names = await gather_workers([explicit_worker(e) for e in range(explicit_workers)],
                                         timeout=60, label="explicit workers")
            async with pool.acquire(timeout=30) as conn:
                rows = await conn.fetch(f"select w, count(*), sum(n) from {T}_s2 "
                                        f"group by w order by w")
            return names, [tuple(r) for r in rows]
        finally:
            await close_pool(pool)

    names, rows = arun(main(), 70)
    for per_conn in names:
        assert all(n.startswith("__asyncpg_stmt_") for n in per_conn), per_conn
    expected = [(w, txns, sum(range(txns))) for w in range(pool_workers)]
    expected += [(100 + e, txns, sum(range(txns))) for e in range(explicit_workers)]
    assert rows == expected


def test_s2_prepared_concurrently_on_pool():
    """Pool workers, all at once, with explicit conn.prepare() inside each
    acquired connection (statement reused on the next acquisitions)."""

    async def main():
        pool = await make_pool(16)
        try:
            async def worker(w: int) -> None:
                for i in range(30):
                    async with pool.acquire(timeout=30) as conn:
                        stmt = await conn.prepare("select $1::int + $2::int, $3::text")
                        async with conn.transaction():
                            assert tuple(await stmt.fetchrow(i, w, "t")) == (i + w, "t")
                        assert await stmt.fetchval(w, w, "u") == 2 * w

            await gather_workers([worker(w) for w in range(16)], timeout=60)
        finally:
            await close_pool(pool)

    arun(main(), 70)


# --------------------------------------------------------------------------
# 3. transactions rolled back and retried
# --------------------------------------------------------------------------

def test_s3_rollback_and_retry():
    table = f"{T}_s3"
    ddl(f"drop table if exists {table}",
        f"create table {table} (id int primary key, w int, note text)",
        f"insert into {table} values (-1, -1, 'seed')")
    workers, iterations = 12, 25

    async def main():
        pool = await make_pool(workers)
        try:
            async def worker(w: int) -> None:
                for i in range(iterations):
                    key, doomed = w * 1000 + i, 500_000 + w * 1000 + i
                    async with pool.acquire(timeout=30) as conn:
                        async def attempt(conflicting: bool) -> None:
                            async with conn.transaction():
                                await conn.execute(f"insert into {table} values ($1, $2, 'doomed')",
                                                   doomed, w)
                                await conn.execute(f"insert into {table} values ($1, $2, 'ok')",
                                                   -1 if conflicting else key, w)

                        with pytest.raises(asyncpg.UniqueViolationError):
                            await attempt(True)
                        assert not conn.is_in_transaction()
                        assert await conn.fetchval(
                            f"select count(*) from {table} where id = $1", doomed) == 0, \
                            f"rolled-back insert {doomed} is visible"
                        await attempt(False)  # the retry succeeds
                        await conn.execute(f"delete from {table} where id = $1", doomed)

                        # explicit error then the same work again
                        async def explicit(fail: bool) -> None:
                            async with conn.transaction():
                                await conn.execute(
                                    f"update {table} set note = 'updated' where id = $1", key)
                                await conn.fetchval("select 1 / $1::int", 0 if fail else 1)

                        with pytest.raises(asyncpg.DivisionByZeroError):
                            await explicit(True)
                        assert await conn.fetchval(
                            f"select note from {table} where id = $1", key) == "ok"
                        await explicit(False)

                        # rolled back by an exception raised in Python
                        with pytest.raises(Rollback):
                            async with conn.transaction():
                                await conn.execute(f"update {table} set note = 'py' where id = $1",
                                                   key)
                                raise Rollback()
                        # a savepoint rolled back, the outer transaction commits
                        async with conn.transaction():
                            await conn.execute(f"insert into {table} values ($1, $2, 'outer')",
                                               700_000 + key, w)
                            with pytest.raises(asyncpg.UniqueViolationError):
                                async with conn.transaction():
                                    await conn.execute(f"insert into {table} values (-1, $1, 'd')",
                                                       w)
                            await conn.execute(
                                f"update {table} set note = 'outer-ok' where id = $1",
                                700_000 + key)

            await gather_workers([worker(w) for w in range(workers)], timeout=60)
            async with pool.acquire(timeout=30) as conn:
                rows = await conn.fetch(f"select note, count(*) from {table} group by note")
            return {r[0]: r[1] for r in rows}
        finally:
            await close_pool(pool)

    rows = arun(main(), 70)
    assert rows == {"seed": 1, "updated": workers * iterations,
                    "outer-ok": workers * iterations}, rows


# --------------------------------------------------------------------------
# 4. SET / search_path follow the client across transactions
# --------------------------------------------------------------------------

def test_s4_session_settings():
    workers, txns = 8, 40
    for w in range(workers):
        schema = f"{P}_sp{w}"
        ddl(f"drop schema if exists {schema} cascade", f"create schema {schema}",
            f"create table {schema}.sp_t (v int)", f"insert into {schema}.sp_t values ({w})",
            f"create table {schema}.sp_log (i int)")

    async def main():
        async def worker(w: int) -> None:
            schema, app, timeout_ms = f"{P}_sp{w}", f"{P}_w{w}", f"{20001 + w}ms"
            conn = await connect()
            try:
                await conn.execute(f"SET search_path TO {schema}")
                await conn.execute(f"SET application_name TO '{app}'")
                await conn.execute(f"SET statement_timeout TO '{timeout_ms}'")

                async def check(where: str) -> None:
                    got = await conn.fetchrow(
                        "select current_setting('search_path'), current_schema(), "
                        "current_setting('application_name'), current_setting('statement_timeout')")
                    assert tuple(got) == (schema, schema, app, timeout_ms), f"{where}: {got}"
                    assert await conn.fetchval("SHOW search_path") == schema, where
                    assert await conn.fetchval("select v from sp_t") == w, where

                for i in range(txns):
                    async with conn.transaction():
                        await check(f"transaction {i}")
                        await conn.execute("insert into sp_log (i) values ($1)", i)
                    if i % 5 == 0:
                        await check(f"statement after transaction {i}")
                    if i % 10 == 3:
                        async with conn.transaction():
                            await conn.execute("SET LOCAL statement_timeout TO '1234ms'")
                            await conn.execute("SET LOCAL application_name TO 'local_only'")
                            assert await conn.fetchval("SHOW statement_timeout") == "1234ms"
                            assert await conn.fetchval("SHOW application_name") == "local_only"
                        await check(f"after SET LOCAL in transaction {i}")
                    if i % 10 == 7:
                        with pytest.raises(Rollback):
                            async with conn.transaction():
                                await conn.execute("SET search_path TO public")
                                await conn.execute("SET application_name TO 'rolled_back'")
                                assert await conn.fetchval("SHOW search_path") == "public"
                                raise Rollback()
                        await check(f"after rolled-back SET in transaction {i}")
                assert await conn.fetchval("select count(*) from sp_log") == txns
            finally:
                await conn.close(timeout=5)

        await gather_workers([worker(w) for w in range(workers)], timeout=60)
        conn = await connect()
        try:
            counts = [await conn.fetchval(f"select count(*) from {P}_sp{w}.sp_log")
                      for w in range(workers)]
            defaults = (await conn.fetchval("SHOW search_path"),
                        await conn.fetchval("SHOW statement_timeout"))
        finally:
            await conn.close(timeout=5)
        return counts, defaults

    counts, defaults = arun(main(), 70)
    assert counts == [txns] * workers
    # a fresh connection has the defaults, not a worker's settings
    assert defaults == ('"$user", public', "0")


# --------------------------------------------------------------------------
# 5. LISTEN / NOTIFY
# --------------------------------------------------------------------------

def test_s5_listen_notify():
    chan, other = f"{P}_chan", f"{P}_other"
    senders, per_sender = 4, 20
    expected = {f"s{s}-{i}" for s in range(senders) for i in range(per_sender)}

    async def main():
        received: list[tuple[str, str]] = []
        got_other: list[str] = []
        listener = await connect()
        pool = await make_pool(senders)
        try:
            await listener.add_listener(chan, lambda _c, _pid, ch, payload: received.append((ch, payload)))
            await listener.add_listener(other, lambda _c, _pid, _ch, payload: got_other.append(payload))

            async def sender(s: int) -> None:
                for i in range(per_sender):
                    payload = f"s{s}-{i}"
                    async with pool.acquire(timeout=30) as conn:
                        async with conn.transaction():
                            if i % 2:
                                await conn.execute(f"NOTIFY {chan}, '{payload}'")
                            else:
                                await conn.execute("select pg_notify($1, $2)", chan, payload)
                        if i % 5 == 0:  # rolled back: never delivered
                            with pytest.raises(Rollback):
                                async with conn.transaction():
                                    await conn.execute("select pg_notify($1, $2)", chan,
                                                       f"rolledback-{payload}")
                                    await conn.execute(f"NOTIFY {chan}, 'rolledback2-{payload}'")
                                    raise Rollback()

            async def listener_busy(stop: asyncio.Event) -> int:
                # A keeps running transactions of its own while listening
                k = 0
                while not stop.is_set():
                    async with listener.transaction():
                        assert await listener.fetchval("select $1::int + 1", k) == k + 1
                    k += 1
                    await asyncio.sleep(0.01)
                return k

            stop = asyncio.Event()
            busy = asyncio.ensure_future(listener_busy(stop))
            try:
                await gather_workers([sender(s) for s in range(senders)], timeout=30,
                                     label="senders")
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline and not {p for _, p in received} >= expected:
                    await asyncio.sleep(0.05)
                await asyncio.sleep(1.0)  # duplicates / late rolled-back ones
            finally:
                stop.set()
                busy_count = await asyncio.wait_for(busy, 10)
            assert busy_count > 0

            payloads = [p for _, p in received]
            missing = sorted(expected - set(payloads))
            assert not missing, (f"{len(missing)}/{len(expected)} notifications never arrived, "
                                 f"e.g. {missing[:5]}")
            assert all(c == chan for c, _ in received), received
            dups = sorted({p for p in payloads if payloads.count(p) > 1})
            assert not dups, f"delivered more than once: {dups[:5]}"
            extra = sorted(set(payloads) - expected)
            assert not extra, f"unexpected notifications (rolled back?): {extra[:5]}"

            # UNLISTEN chan (the callback stays registered, so anything that
            # still arrived would be seen); `other` is still listened to.
            await listener.execute(f"UNLISTEN {chan}")
            received.clear()
            async with pool.acquire(timeout=30) as conn:
                for i in range(5):
                    await conn.execute("select pg_notify($1, $2)", chan, f"after-unlisten-{i}")
                await conn.execute("select pg_notify($1, $2)", other, "still-listening")
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not got_other:
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)
            assert got_other == ["still-listening"], got_other
            assert received == [], f"received after UNLISTEN: {received}"
        finally:
            await close_pool(pool)
            await listener.close(timeout=5)

    arun(main(), 70)


# --------------------------------------------------------------------------
# 6. COPY
# --------------------------------------------------------------------------

def test_s6_copy():
    table = f"{T}_s6"
    ddl(f"drop table if exists {table}",
        f"create table {table} (id int primary key, w int, name text, note text)")
    workers, n = 4, 3000
    tricky = ["tab\there", "new\nline", "back\\slash", "ünïcødé ✓", "", "quote'\""]

    def rows_of(w: int) -> list[tuple]:
        return [(w * 100_000 + i, w, f"name-{w}-{i}-{tricky[i % len(tricky)]}",
                 None if i % 7 == 0 else f"note {i}") for i in range(n)]

    async def main():
        pool = await make_pool(workers)
        try:
            async def worker(w: int) -> None:
                rows = rows_of(w)
                async with pool.acquire(timeout=30) as conn:
                    if w % 2 == 0:
                        # binary COPY FROM STDIN
                        status = await conn.copy_records_to_table(
                            "ap_s6", schema_name="compat_py", records=rows,
                            columns=["id", "w", "name", "note"])
                    else:
                        # text COPY FROM STDIN, from a file-like object
                        async with conn.transaction():
                            text = "".join(
                                "\t".join([str(r[0]), str(r[1]), _copy_escape(r[2]),
                                           "\\N" if r[3] is None else _copy_escape(r[3])]) + "\n"
                                for r in rows)
                            status = await conn.copy_to_table(
                                "ap_s6", schema_name="compat_py", source=io.BytesIO(text.encode()),
                                columns=["id", "w", "name", "note"])
                    assert status == f"COPY {n}", status
                    count = await conn.fetchrow(
                        f"select count(*), count(note) from {table} where w = $1", w)
                    assert tuple(count) == (n, n - len(range(0, n, 7))), count

                    # COPY TO STDOUT (text) and compare with what went in
                    buf = io.BytesIO()
                    status = await conn.copy_from_query(
                        f"select id, w, name, note from {table} where w = $1 order by id", w,
                        output=buf)
                    assert status == f"COPY {n}", status
                    lines = buf.getvalue().decode().split("\n")
                    assert lines[-1] == "" and len(lines) == n + 1, len(lines)
                    expected = ["\t".join([str(r[0]), str(r[1]), _copy_escape(r[2]),
                                           "\\N" if r[3] is None else _copy_escape(r[3])])
                                for r in rows]
                    assert lines[:-1] == expected, "COPY TO STDOUT returned different rows"

                    # a COPY that fails half-way is rolled back entirely
                    with pytest.raises(asyncpg.UniqueViolationError):
                        await conn.copy_records_to_table(
                            "ap_s6", schema_name="compat_py",
                            records=[(900_000 + w, w, "fresh", None), rows[0]],
                            columns=["id", "w", "name", "note"])
                    assert await conn.fetchval(f"select count(*) from {table} where id = $1",
                                               900_000 + w) == 0

            await gather_workers([worker(w) for w in range(workers)], timeout=60)
            async with pool.acquire(timeout=30) as conn:
                return await conn.fetchval(f"select count(*) from {table}")
        finally:
            await close_pool(pool)

    assert arun(main(), 70) == workers * n


def _copy_escape(value: str) -> str:
    return (value.replace("\\", "\\\\").replace("\t", "\\t")
            .replace("\n", "\\n").replace("\r", "\\r"))


# --------------------------------------------------------------------------
# 7. cancellation
# --------------------------------------------------------------------------

async def _sleeping(marker: str) -> int:
    conn = await asyncpg.connect(DIRECT_DSN, timeout=10)
    try:
        return await conn.fetchval("select count(*) from pg_stat_activity "
                                   "where state = 'active' and query like $1", f"%{marker}%")
    finally:
        await conn.close(timeout=5)


def test_s7_cancel():
    """asyncpg cancels through a CancelRequest when a query times out or its
    task is cancelled (it swallows the server's 57014 then); a server-side
    statement_timeout gives QueryCanceledError (57014)."""

    async def main():
        pool = await make_pool(3)
        stop = asyncio.Event()

        async def busy(b: int) -> int:
            done = 0
            while not stop.is_set():
                async with pool.acquire(timeout=30) as conn:
                    async with conn.transaction():
                        assert await conn.fetchval("select $1::int", done) == done
                        await conn.execute("select pg_sleep(0.01)")
                done += 1
            return done

        busy_task = asyncio.ensure_future(
            gather_workers([busy(b) for b in range(3)], timeout=60, label="busy"))
        conn = await connect()
        try:
            # 1. timeout= on the call: CancelRequest sent after 1 s
            marker = f"{P}_cancel_timeout"
            started = time.monotonic()
            with pytest.raises(asyncio.TimeoutError):
                await conn.fetchval(f"select pg_sleep(30) /* {marker} */", timeout=1.0)
            assert await asyncio.wait_for(conn.fetchval("select $1::int * 3", 14), 5) == 42
            assert time.monotonic() - started < 6, "cancel took too long"
            assert await _sleeping(marker) == 0, "pg_sleep still running on the server"

            # 2. the task running the query is cancelled, inside a transaction
            marker = f"{P}_cancel_task"
            tx = conn.transaction()
            await tx.start()
            task = asyncio.ensure_future(conn.fetchval(f"select pg_sleep(30) /* {marker} */"))
            await asyncio.sleep(1.0)
            started = time.monotonic()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(task, 6)
            await asyncio.wait_for(tx.rollback(), 6)
            assert time.monotonic() - started < 6, "cancel took too long"
            assert await _sleeping(marker) == 0, "pg_sleep still running on the server"
            assert await asyncio.wait_for(conn.fetchval("select $1::int + 1", 41), 5) == 42

            # 3. statement_timeout: the server cancels, SQLSTATE 57014
            marker = f"{P}_cancel_stmt_timeout"
            started = time.monotonic()
            with pytest.raises(asyncpg.QueryCanceledError) as info:
                async with conn.transaction():
                    await conn.execute("SET LOCAL statement_timeout TO '500ms'")
                    await conn.fetchval(f"select pg_sleep(30) /* {marker} */", timeout=10)
            assert info.value.sqlstate == "57014"
            assert time.monotonic() - started < 6
            assert await conn.fetchval("SHOW statement_timeout") == "0"
            assert await asyncio.wait_for(conn.fetchval("select $1::int - 1", 43), 5) == 42
        finally:
            stop.set()
            await conn.close(timeout=5)
            counts = await asyncio.wait_for(busy_task, 30)
            await close_pool(pool)
        assert all(c > 0 for c in counts), counts

    arun(main(), 70)
