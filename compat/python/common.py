"""Shared helpers for the Python compat suite: environment, bounded worker
runners (threads and asyncio) that never hang and report every failure."""

from __future__ import annotations

import asyncio
import collections
import os
import threading
import time
import traceback
from urllib.parse import urlsplit, urlunsplit

DSN = os.environ["COMPAT_DSN"]
DIRECT_PORT = int(os.environ["COMPAT_DIRECT_PORT"])
RESTART_CMD = os.environ["COMPAT_RESTART_CMD"]
POOL_SIZE = int(os.environ.get("COMPAT_POOL_SIZE", "4"))


def _direct_dsn() -> str:
    parts = urlsplit(DSN)
    netloc = parts.netloc.rsplit(":", 1)[0] + f":{DIRECT_PORT}"
    return urlunsplit(parts._replace(netloc=netloc))


# PostgreSQL itself, for out-of-band checks (pg_stat_activity).
DIRECT_DSN = _direct_dsn()


def describe(exc: BaseException) -> str:
    sqlstate = getattr(exc, "sqlstate", None)
    state = f" [{sqlstate}]" if sqlstate else ""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__module__}.{type(exc).__name__}{state}: {text}"


def _summary(label: str, failures: list[tuple[int, BaseException]],
             hung: list[int], total: int) -> str:
    lines = []
    if hung:
        lines.append(f"{len(hung)}/{total} {label} did not finish in time: {hung}")
    if failures:
        lines.append(f"{len(failures)}/{total} {label} failed:")
        by_text = collections.OrderedDict()
        for idx, exc in failures:
            by_text.setdefault(describe(exc), []).append(idx)
        for text, idxs in by_text.items():
            lines.append(f"  {label} {idxs}: {text}")
        # where the first failure happened (the last frames)
        idx, exc = failures[0]
        lines.append(f"  first failure ({label} {idx}): {describe(exc)}")
        ours = [f for f in traceback.extract_tb(exc.__traceback__)
                if os.path.basename(f.filename).startswith("test_")]
        for f in ours[-3:]:
            lines.append(f"    {os.path.basename(f.filename)}:{f.lineno}: {(f.line or '').strip()}")
    return "\n".join(lines)


def run_threads(fn, n: int, timeout: float, label: str = "workers") -> list:
    """Runs fn(i) for i in range(n) in daemon threads; fails (AssertionError
    listing every failing/hung worker) unless all return within timeout."""
    results: list = [None] * n
    errors: list[tuple[int, BaseException]] = []
    lock = threading.Lock()

    def body(i: int) -> None:
        try:
            results[i] = fn(i)
        except BaseException as exc:  # noqa: BLE001 - reported below
            with lock:
                errors.append((i, exc))

    threads = [threading.Thread(target=body, args=(i,), daemon=True,
                                name=f"{label}-{i}") for i in range(n)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    hung = [i for i, t in enumerate(threads) if t.is_alive()]
    with lock:
        failures = sorted(errors, key=lambda e: e[0])
    if failures or hung:
        raise AssertionError(_summary(label, failures, hung, n))
    return results


async def gather_workers(coros, timeout: float, label: str = "workers") -> list:
    """asyncio version of run_threads: all coroutines must succeed in time."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    done, pending = await asyncio.wait(tasks, timeout=timeout)
    hung = [i for i, t in enumerate(tasks) if t in pending]
    for t in pending:
        t.cancel()
    if pending:
        await asyncio.wait(pending, timeout=5)
    failures = []
    for i, t in enumerate(tasks):
        if t in done and t.exception() is not None:
            failures.append((i, t.exception()))
    if failures or hung:
        raise AssertionError(_summary(label, failures, hung, len(tasks)))
    return [t.result() for t in tasks]


def arun(coro, timeout: float):
    """Runs an asyncio test body with an overall deadline."""

    async def bounded():
        try:
            return await asyncio.wait_for(coro, timeout)
        except asyncio.TimeoutError:
            raise AssertionError(f"test body did not finish within {timeout}s") from None

    return asyncio.run(bounded())


def ddl(*statements: str) -> None:
    """Runs setup statements (autocommit, simple protocol) through the
    target under test; each setup statement runs once, so no prepare."""
    import psycopg

    with psycopg.connect(DSN, autocommit=True, connect_timeout=10) as conn:
        for stmt in statements:
            conn.execute(stmt)


def direct_query(query: str, params=None):
    """One query on PostgreSQL itself (out of band), returns all rows."""
    import psycopg

    with psycopg.connect(DIRECT_DSN, autocommit=True, connect_timeout=10) as conn:
        return conn.execute(query, params, prepare=False).fetchall()
