"""psycopg 3 (default settings: automatic server-side prepare after
prepare_threshold=5 executions) and psycopg_pool, scenarios 1-7.
Scenario 8 (server restart) is in test_restart.py."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest
from psycopg import errors, sql
from psycopg_pool import ConnectionPool

from common import DSN, ddl, direct_query, run_threads

P = "compat_py_pg"  # prefix of this file's schemas, channels, markers
T = "compat_py.pg"  # prefix of its tables (schema compat_py: immune to a leaked search_path)


def connect(**kwargs) -> psycopg.Connection:
    return psycopg.connect(DSN, connect_timeout=10, **kwargs)


def prepared_names(conn: psycopg.Connection) -> dict[str, str]:
    """SQL text -> statement name psycopg prepared on this connection
    (psycopg's own bookkeeping: what it sends in Parse/Bind)."""
    return {key[0].decode(): name.decode() for key, name in conn._prepared._names.items()}


# --------------------------------------------------------------------------
# 1. many concurrent workers (psycopg_pool), more than sluice's pool of 4
# --------------------------------------------------------------------------

def test_s1_concurrent_workers_pool():
    table = f"{T}_s1"
    ddl(f"drop table if exists {table}",
        f"create table {table} (worker int, i int, primary key (worker, i))")
    workers, iterations = 24, 120

    pool = ConnectionPool(DSN, min_size=workers, max_size=workers, open=False,
                          kwargs={"connect_timeout": 10}, timeout=30)
    pool.open(wait=True, timeout=30)
    try:
        def worker(w: int) -> None:
            for i in range(iterations):
                # pool.connection(): one transaction, committed on exit
                with pool.connection() as conn:
                    n = w * 100_000 + i
                    row = conn.execute("select %s::int + 1, %s::text", (n, f"w{w}")).fetchone()
                    assert row == (n + 1, f"w{w}"), row
                    conn.execute(f"insert into {table} (worker, i) values (%s, %s)", (w, i))
                    if i % 20 == 19:
                        got = conn.execute(f"select count(*) from {table} where worker = %s",
                                           (w,)).fetchone()[0]
                        assert got == i + 1, f"worker {w} sees {got} rows, expected {i + 1}"

        run_threads(worker, workers, timeout=60)
    finally:
        pool.close(timeout=5)

    with connect(autocommit=True) as conn:
        rows = conn.execute(f"select worker, count(*), sum(i) from {table} group by worker "
                            f"order by worker").fetchall()
    expected = [(w, iterations, sum(range(iterations))) for w in range(workers)]
    assert rows == expected


# --------------------------------------------------------------------------
# 2. named prepared statements reused across transactions
# --------------------------------------------------------------------------

SQL_A = "select %s::int * 2, %s::text || '-a'"
SQL_B = "select count(*), coalesce(max(n), -1) from " + T + "_s2 where w = %s"
SQL_INS = "insert into " + T + "_s2 (w, n) values (%s, %s)"
SQL_EXPLICIT = "select %s::bigint - 1, 'explicit'"


def test_s2_prepared_statements_across_transactions():
    """16 connections x 40 transactions; each transaction runs the same
    statements, which psycopg has prepared as _pg3_N (after 5 executions,
    or at once with prepare=True). Half the workers use the statements in
    the other order, so the same name _pg3_0 means different SQL on
    different connections."""
    ddl(f"drop table if exists {T}_s2", f"create table {T}_s2 (w int, n int)")
    workers, txns = 16, 40

    def worker(w: int) -> dict[str, str]:
        autocommit = w % 2 == 0  # both transaction styles
        with connect(autocommit=autocommit) as conn:
            for i in range(txns):
                def body() -> None:
                    def run_a():
                        row = conn.execute(SQL_A, (i + w, f"w{w}")).fetchone()
                        assert row == (2 * (i + w), f"w{w}-a"), row

                    def run_b():
                        row = conn.execute(SQL_B, (w,)).fetchone()
                        assert row == (i, i - 1 if i else -1), (w, i, row)

                    first, second = (run_a, run_b) if w % 4 < 2 else (run_b, run_a)
                    first()
                    second()
                    conn.execute(SQL_INS, (w, i))
                    row = conn.execute(SQL_EXPLICIT, (i,), prepare=True).fetchone()
                    assert row == (i - 1, "explicit"), row

                if autocommit:
                    with conn.transaction():
                        body()
                else:
                    body()  # implicit BEGIN
                    conn.commit()
            names = prepared_names(conn)
        return names

    results = run_threads(worker, workers, timeout=60)

    texts = {q.replace("%s", "$1", 1).replace("%s", "$2", 1)
             for q in (SQL_A, SQL_B, SQL_INS, SQL_EXPLICIT)}
    for w, names in enumerate(results):
        # psycopg really prepared the four statements, as _pg3_N
        assert set(names) == texts, (w, names)
        assert all(n.startswith("_pg3_") for n in names.values()), names
    # the same name stands for different SQL on different connections
    text_a = "select $1::int * 2, $2::text || '-a'"
    text_b = "select count(*), coalesce(max(n), -1) from " + T + "_s2 where w = $1"
    assert results[0][text_a] == results[2][text_b] != results[0][text_b], (results[0], results[2])

    with connect(autocommit=True) as conn:
        rows = conn.execute(f"select w, count(*), sum(n) from {T}_s2 group by w order by w").fetchall()
    assert rows == [(w, txns, sum(range(txns))) for w in range(workers)]


def test_s2_rollback_deallocate_all_is_per_client():
    """psycopg forgets its prepared statements on every rollback and sends
    DEALLOCATE ALL. Half the connections roll back after each transaction
    (and re-prepare under new _pg3_N names); the other half never do and
    keep using their _pg3_0 - another client's DEALLOCATE ALL must not
    take it away from them."""
    steady, rollers, txns = 8, 8, 40

    def worker(i: int) -> dict[str, str]:
        rolls = i >= steady
        with connect(autocommit=True) as conn:
            for j in range(txns):
                with conn.transaction():
                    row = conn.execute(SQL_A, (j, f"c{i}"), prepare=True).fetchone()
                    assert row == (2 * j, f"c{i}-a"), row
                    assert conn.execute(SQL_EXPLICIT, (j,), prepare=True).fetchone() == \
                        (j - 1, "explicit")
                if rolls:
                    with conn.transaction():
                        assert conn.execute(SQL_EXPLICIT, (j,)).fetchone() == (j - 1, "explicit")
                        raise psycopg.Rollback()
                    # psycopg sent DEALLOCATE ALL and forgot its statements
                    assert prepared_names(conn) == {}, prepared_names(conn)
                else:
                    names = prepared_names(conn)
                    assert names["select $1::int * 2, $2::text || '-a'"] == "_pg3_0", names
            return prepared_names(conn)

    results = run_threads(worker, steady + rollers, timeout=60)
    for i in range(steady):
        assert results[i] == {"select $1::int * 2, $2::text || '-a'": "_pg3_0",
                              "select $1::bigint - 1, 'explicit'": "_pg3_1"}, results[i]


def test_s2_pipeline_mode_with_prepared_and_errors():
    """Pipelines of prepared statements from 8 connections at once; every
    4th pipeline has an error in the middle: results before it are right,
    the statements after it are skipped, the error is raised, and the
    connection keeps working."""
    table = f"{T}_s2p"
    ddl(f"drop table if exists {table}", f"create table {table} (w int, n int)")
    workers, pipelines = 8, 24
    sql_sum = "select %s::int + %s::int"
    sql_ins = f"insert into {table} (w, n) values (%s, %s)"

    def worker(w: int) -> int:
        committed = 0
        with connect(autocommit=True) as conn:
            # already prepared (threshold) before the pipelines start
            for k in range(6):
                assert conn.execute(sql_sum, (k, w)).fetchone() == (k + w,)
            assert sql_sum.replace("%s", "$1", 1).replace("%s", "$2", 1) in prepared_names(conn)
            for j in range(pipelines):
                if j % 4 == 3:
                    # an error in the middle: psycopg raises it from the
                    # execute() after it or from the Sync at the block's end
                    with pytest.raises(errors.DivisionByZero):
                        with conn.pipeline():
                            c_sum = conn.execute(sql_sum, (j, w))
                            c_a = conn.execute(SQL_A, (j, "p"), prepare=True)
                            conn.execute(sql_ins, (w, j))
                            conn.execute("select 1 / %s::int", (0,))
                            conn.execute(sql_ins, (w, -j))  # skipped by the server
                            conn.execute(sql_sum, (j, -j))
                    # results before the error arrived and are right
                    assert c_sum.fetchone() == (j + w,)
                    assert c_a.fetchone() == (2 * j, "p-a")
                    # the connection works after, in and out of a pipeline
                    assert conn.execute(sql_sum, (j, 1)).fetchone() == (j + 1,)
                    with conn.pipeline():
                        c_again = conn.execute(SQL_A, (j, "q"))
                    assert c_again.fetchone() == (2 * j, "q-a")
                else:
                    with conn.pipeline() as p:
                        c_sum = conn.execute(sql_sum, (j, w))
                        c_a = conn.execute(SQL_A, (j, "p"), prepare=True)
                        c_ins = conn.execute(sql_ins, (w, j))
                        p.sync()
                        assert c_sum.fetchone() == (j + w,)
                        assert c_a.fetchone() == (2 * j, "p-a")
                        assert c_ins.rowcount == 1
                        c_b = conn.execute(sql_sum, (w, j))
                    assert c_b.fetchone() == (w + j,)
                    committed += 1
            # and after the pipeline
            assert conn.execute(sql_sum, (40, 2)).fetchone() == (42,)
            names = prepared_names(conn)
            assert "select $1::int * 2, $2::text || '-a'" in names, names
        return committed

    committed = run_threads(worker, workers, timeout=60)

    with connect(autocommit=True) as conn:
        rows = conn.execute(f"select w, count(*), count(*) filter (where n < 0) from {table} "
                            f"group by w order by w").fetchall()
    # an error rolls back the whole pipeline segment up to its Sync
    # (implicit transaction): the insert before the error is gone as well
    assert rows == [(w, committed[w], 0) for w in range(workers)]
    assert committed == [pipelines - pipelines // 4] * workers


# --------------------------------------------------------------------------
# 3. transactions rolled back and retried
# --------------------------------------------------------------------------

def test_s3_rollback_and_retry():
    table = f"{T}_s3"
    ddl(f"drop table if exists {table}",
        f"create table {table} (id int primary key, w int, note text)",
        f"insert into {table} values (-1, -1, 'seed')")
    workers, iterations = 12, 25

    def worker(w: int) -> None:
        autocommit = w % 2 == 0
        with connect(autocommit=autocommit) as conn:
            def in_txn(fn):
                if autocommit:
                    with conn.transaction():
                        return fn()
                try:
                    result = fn()
                except BaseException:
                    conn.rollback()
                    raise
                conn.commit()
                return result

            for i in range(iterations):
                key = w * 1000 + i
                doomed = 500_000 + key

                def attempt(conflicting: bool):
                    conn.execute(f"insert into {table} values (%s, %s, 'doomed')", (doomed, w))
                    target = -1 if conflicting else key  # -1 exists: unique violation
                    conn.execute(f"insert into {table} values (%s, %s, 'ok')", (target, w))

                # first attempt fails on the unique key, retry succeeds
                with pytest.raises(errors.UniqueViolation):
                    in_txn(lambda: attempt(True))
                assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
                row = conn.execute(f"select count(*) from {table} where id = %s", (doomed,)).fetchone()
                assert row == (0,), f"rolled-back insert {doomed} is visible"
                if not autocommit:
                    conn.commit()
                in_txn(lambda: attempt(False))
                with pytest.raises(errors.UniqueViolation):  # it is really there
                    in_txn(lambda: conn.execute(f"insert into {table} values (%s, 0, 'x')", (key,)))
                conn.execute(f"delete from {table} where id = %s", (doomed,))
                if not autocommit:
                    conn.commit()

                # explicit error (division by zero) then the same work again
                def explicit(fail: bool):
                    conn.execute(f"update {table} set note = 'updated' where id = %s", (key,))
                    conn.execute("select 1 / %s::int", (0 if fail else 1,))

                with pytest.raises(errors.DivisionByZero):
                    in_txn(lambda: explicit(True))
                note = conn.execute(f"select note from {table} where id = %s", (key,)).fetchone()
                assert note == ("ok",), note
                in_txn(lambda: explicit(False))

                # a savepoint (nested transaction) rolled back, the outer one commits
                if autocommit:
                    with conn.transaction():
                        conn.execute(f"insert into {table} values (%s, %s, 'outer')", (700_000 + key, w))
                        with pytest.raises(errors.UniqueViolation):
                            with conn.transaction():
                                conn.execute(f"insert into {table} values (-1, %s, 'dup')", (w,))
                        conn.execute(f"update {table} set note = 'outer-ok' where id = %s",
                                      (700_000 + key,))
            if not autocommit:
                conn.commit()

    run_threads(worker, workers, timeout=60)

    with connect(autocommit=True) as conn:
        rows = dict(conn.execute(f"select note, count(*) from {table} group by note").fetchall())
    outer = (workers + 1) // 2 * iterations
    assert rows == {"seed": 1, "updated": workers * iterations, "outer-ok": outer}, rows


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

    def worker(w: int) -> None:
        schema, app, timeout_ms = f"{P}_sp{w}", f"{P}_w{w}", f"{20001 + w}ms"
        with connect(autocommit=True) as conn:
            conn.execute(f"SET search_path TO {schema}")
            conn.execute(f"SET application_name TO '{app}'")
            conn.execute(f"SET statement_timeout TO '{timeout_ms}'")

            def check(where: str) -> None:
                got = conn.execute("select current_setting('search_path'), current_schema(), "
                                   "current_setting('application_name'), "
                                   "current_setting('statement_timeout')").fetchone()
                assert got == (schema, schema, app, timeout_ms), f"{where}: {got}"
                assert conn.execute("SHOW search_path").fetchone() == (schema,), where
                assert conn.execute("select v from sp_t").fetchone() == (w,), where

            for i in range(txns):
                with conn.transaction():
                    check(f"transaction {i}")
                    conn.execute("insert into sp_log (i) values (%s)", (i,))  # unqualified
                if i % 5 == 0:
                    check(f"autocommit statement after transaction {i}")
                if i % 10 == 3:  # SET LOCAL does not survive its transaction
                    with conn.transaction():
                        conn.execute("SET LOCAL statement_timeout TO '1234ms'")
                        conn.execute("SET LOCAL application_name TO 'local_only'")
                        assert conn.execute("SHOW statement_timeout").fetchone() == ("1234ms",)
                        assert conn.execute("SHOW application_name").fetchone() == ("local_only",)
                    check(f"after SET LOCAL in transaction {i}")
                if i % 10 == 7:  # a SET in a rolled-back transaction is undone
                    with conn.transaction():
                        conn.execute("SET search_path TO public")
                        conn.execute("SET application_name TO 'rolled_back'")
                        assert conn.execute("SHOW search_path").fetchone() == ("public",)
                        raise psycopg.Rollback()
                    check(f"after rolled-back SET in transaction {i}")
            assert conn.execute("select count(*) from sp_log").fetchone() == (txns,)

    run_threads(worker, workers, timeout=60)

    with connect(autocommit=True) as conn:
        for w in range(workers):
            got = conn.execute(f"select count(*) from {P}_sp{w}.sp_log").fetchone()
            assert got == (txns,), (w, got)
        # a fresh connection has the defaults, not a worker's settings
        assert conn.execute("SHOW search_path").fetchone() == ('"$user", public',)
        assert conn.execute("SHOW statement_timeout").fetchone() == ("0",)


# --------------------------------------------------------------------------
# 5. LISTEN / NOTIFY
# --------------------------------------------------------------------------

def test_s5_listen_notify():
    chan = f"{P}_chan"
    senders, per_sender = 4, 20
    expected = {f"s{s}-{i}" for s in range(senders) for i in range(per_sender)}
    received: list[tuple[str, str]] = []

    listener = connect(autocommit=True)
    try:
        listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(chan)))

        def pump(k: int) -> None:
            # A keeps running transactions of its own while listening
            with listener.transaction():
                assert listener.execute("select %s::int + 1", (k,)).fetchone() == (k + 1,)
            for n in listener.notifies(timeout=0.05):
                received.append((n.channel, n.payload))

        def sender(s: int) -> None:
            with connect() as conn:  # default: transactions, commit()
                for i in range(per_sender):
                    payload = f"s{s}-{i}"
                    if i % 2:
                        conn.execute(sql.SQL("NOTIFY {}, {}").format(
                            sql.Identifier(chan), sql.Literal(payload)))
                    else:
                        conn.execute("select pg_notify(%s, %s)", (chan, payload))
                    conn.commit()
                    if i % 5 == 0:  # never delivered: rolled back
                        conn.execute("select pg_notify(%s, %s)", (chan, f"rolledback-{payload}"))
                        conn.rollback()
                        with conn.transaction():
                            conn.execute(sql.SQL("NOTIFY {}, {}").format(
                                sql.Identifier(chan), sql.Literal(f"rolledback2-{payload}")))
                            raise psycopg.Rollback()

        done = threading.Event()
        sender_error: list[BaseException] = []

        def senders_main():
            try:
                run_threads(sender, senders, timeout=30, label="senders")
            except BaseException as exc:  # noqa: BLE001
                sender_error.append(exc)
            finally:
                done.set()

        threading.Thread(target=senders_main, daemon=True).start()
        k = 0
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            pump(k)
            k += 1
            if done.is_set() and {p for _, p in received} >= expected:
                break
        settle = time.monotonic() + 1.0  # duplicates / late rolled-back ones
        while time.monotonic() < settle:
            pump(k)
            k += 1
        assert not sender_error, sender_error[0]

        payloads = [p for _, p in received]
        missing = sorted(expected - set(payloads))
        assert not missing, f"{len(missing)}/{len(expected)} notifications never arrived, e.g. {missing[:5]}"
        assert all(c == chan for c, _ in received), received
        dups = sorted({p for p in payloads if payloads.count(p) > 1})
        assert not dups, f"delivered more than once: {dups[:5]}"
        extra = sorted(set(payloads) - expected)
        assert not extra, f"unexpected notifications (rolled back?): {extra[:5]}"

        # UNLISTEN: nothing more arrives
        listener.execute(sql.SQL("UNLISTEN {}").format(sql.Identifier(chan)))
        received.clear()
        with connect(autocommit=True) as conn:
            for i in range(5):
                conn.execute("select pg_notify(%s, %s)", (chan, f"after-unlisten-{i}"))
        settle = time.monotonic() + 1.5
        while time.monotonic() < settle:
            pump(k)
            k += 1
        assert received == [], f"received after UNLISTEN: {received}"
    finally:
        listener.close()


# --------------------------------------------------------------------------
# 6. COPY
# --------------------------------------------------------------------------

def _copy_rows(w: int, n: int) -> list[tuple]:
    tricky = ["tab\there", "new\nline", "back\\slash", "ünïcødé ✓", "", "quote'\""]
    return [(w * 100_000 + i, f"name-{w}-{i}-{tricky[i % len(tricky)]}",
             None if i % 7 == 0 else f"note {i}") for i in range(n)]


def test_s6_copy():
    table = f"{T}_s6"
    ddl(f"drop table if exists {table}",
        f"create table {table} (id int primary key, w int, name text, note text)")
    workers, n = 4, 3000

    def worker(w: int) -> None:
        rows = _copy_rows(w, n)
        binary = w % 2 == 1
        fmt = " (format binary)" if binary else ""
        with connect() as conn:
            with conn.cursor() as cur:
                with cur.copy(f"COPY {table} (id, w, name, note) FROM STDIN{fmt}") as copy:
                    if binary:
                        copy.set_types(["int4", "int4", "text", "text"])
                    for r in rows:
                        copy.write_row((r[0], w, r[1], r[2]))
                assert cur.rowcount == n, cur.rowcount
            conn.commit()

            count = conn.execute(f"select count(*), count(note) from {table} where w = %s",
                                 (w,)).fetchone()
            assert count == (n, n - len(range(0, n, 7))), count
            conn.commit()

            query = sql.SQL("COPY (select id, name, note from {} where w = {} order by id) "
                            "TO STDOUT{}").format(sql.SQL(table), sql.Literal(w), sql.SQL(fmt))
            with conn.cursor() as cur:
                with cur.copy(query) as copy:
                    copy.set_types(["int4", "text", "text"])
                    got = list(copy.rows())
            conn.commit()
            assert got == rows, "COPY TO STDOUT returned different rows"

            # raw text COPY TO: line count
            with conn.cursor() as cur:
                with cur.copy(sql.SQL("COPY (select id from {} where w = {}) TO STDOUT").format(
                        sql.SQL(table), sql.Literal(w))) as copy:
                    data = b"".join(bytes(chunk) for chunk in copy)
            conn.commit()
            assert data.count(b"\n") == n

            # COPY FROM STDIN that fails half-way is rolled back entirely
            with pytest.raises(errors.UniqueViolation):
                with conn.cursor() as cur:
                    with cur.copy(f"COPY {table} (id, w, name) FROM STDIN") as copy:
                        copy.write_row((900_000 + w, w, "fresh"))
                        copy.write_row((rows[0][0], w, "duplicate"))
            conn.rollback()
            assert conn.execute(f"select count(*) from {table} where id = %s",
                                (900_000 + w,)).fetchone() == (0,)
            conn.commit()

    run_threads(worker, workers, timeout=60)
    with connect(autocommit=True) as conn:
        assert conn.execute(f"select count(*) from {table}").fetchone() == (workers * n,)


# --------------------------------------------------------------------------
# 7. cancellation
# --------------------------------------------------------------------------

def _sleeping(marker: str) -> int:
    return direct_query("select count(*) from pg_stat_activity "
                        "where state = 'active' and query like %s", (f"%{marker}%",))[0][0]


def test_s7_cancel():
    stop = threading.Event()
    cancelled_elsewhere: list[str] = []

    def busy(b: int) -> int:
        # other clients keep the pool busy; none of them may be cancelled
        done = 0
        with connect(autocommit=True) as conn:
            while not stop.is_set():
                try:
                    with conn.transaction():
                        assert conn.execute("select %s::int", (done,)).fetchone() == (done,)
                        conn.execute("select pg_sleep(0.01)")
                    done += 1
                except errors.QueryCanceled as exc:
                    cancelled_elsewhere.append(f"busy {b}: {exc}")
        return done

    busy_result: list = []

    def busy_main():
        try:
            busy_result.append(run_threads(busy, 3, timeout=60, label="busy"))
        except BaseException as exc:  # noqa: BLE001
            busy_result.append(exc)

    busy_thread = threading.Thread(target=busy_main, daemon=True)
    busy_thread.start()
    try:
        for attempt, autocommit in enumerate((True, False, True)):
            marker = f"{P}_cancel_{attempt}"
            with connect(autocommit=autocommit) as conn:
                if not autocommit:  # cancel inside an open transaction
                    assert conn.execute("select %s::int", (attempt,)).fetchone() == (attempt,)
                timer = threading.Timer(1.0, conn.cancel_safe, kwargs={"timeout": 5})
                timer.start()
                started = time.monotonic()
                try:
                    with pytest.raises(errors.QueryCanceled) as info:
                        conn.execute(f"select pg_sleep(30) /* {marker} */")
                finally:
                    timer.cancel()
                elapsed = time.monotonic() - started
                assert info.value.sqlstate == "57014"
                assert elapsed < 6, f"cancel took {elapsed:.1f}s"
                assert _sleeping(marker) == 0, "pg_sleep still running on the server"
                if not autocommit:
                    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR
                    conn.rollback()
                # the same connection works afterwards
                assert conn.execute("select %s::int * 3", (14,)).fetchone() == (42,)
                if not autocommit:
                    conn.commit()
    finally:
        stop.set()
        busy_thread.join(30)
    assert not busy_thread.is_alive(), "busy workers did not stop"
    assert busy_result and not isinstance(busy_result[0], BaseException), busy_result
    assert all(n > 0 for n in busy_result[0]), busy_result
    assert not cancelled_elsewhere, cancelled_elsewhere
