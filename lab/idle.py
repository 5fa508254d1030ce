"""E4's idle crowd: many client connections that each read information_schema, then sit idle.

Reading the catalog through information_schema fills each backend's catalog caches, which is
what made the seed's 1,000 idle connections cost 4.8 GB and slow everyone else down.  Opened
directly, each is a PostgreSQL backend; opened through sluice in transaction mode, each borrows
a server only for its one query and then holds nothing.  The connections live on an asyncio
loop in a background thread (so pgbench can run meanwhile) and are closed by `close()` or
when the `with` block ends, with timeouts on every step.
"""

from __future__ import annotations

import asyncio
import struct
import threading
import time
from collections import Counter

import pglab

CATALOG_QUERY = ("SELECT count(*) FROM information_schema.columns c "
                 "JOIN information_schema.tables t USING (table_schema, table_name)")


async def _read_until_ready(reader, startup: bool) -> str | None:
    """Read messages up to ReadyForQuery; returns the first error message, if any.  During
    startup an error is final (the server closes without ReadyForQuery), so it is raised."""
    error = None
    while True:
        hdr = await reader.readexactly(5)
        typ, ln = hdr[:1], struct.unpack("!I", hdr[1:])[0]
        body = await reader.readexactly(ln - 4) if ln > 4 else b""
        if typ == b"R" and struct.unpack("!I", body[:4])[0] != 0:
            raise ConnectionError("server asks for a password; the lab uses trust")
        if typ == b"E" and error is None:
            fields = dict((f[:1], f[1:].decode(errors="replace")) for f in body.split(b"\0") if f)
            error = fields.get(b"M", "error")
            if startup:
                raise ConnectionError(error)
        if typ == b"Z":
            return error


async def _open_one(host, port, user, database, query, app, timeout):
    async def go():
        reader, writer = await asyncio.open_connection(host, port)
        try:
            writer.write(pglab.startup_message(user, database, app=app))
            await writer.drain()
            await _read_until_ready(reader, startup=True)
            if query:
                q = query.encode() + b"\0"
                writer.write(b"Q" + struct.pack("!I", len(q) + 4) + q)
                await writer.drain()
                err = await _read_until_ready(reader, startup=False)
                if err:
                    raise ConnectionError(f"query failed: {err}")
            return reader, writer
        except BaseException:
            writer.close()
            raise
    return await asyncio.wait_for(go(), timeout)


class IdleConnections:
    """`with IdleConnections(host, port, user, db, n) as idle:` keeps n idle clients open."""

    def __init__(self, host: str, port: int, *, user: str, database: str, n: int,
                 query: str | None = CATALOG_QUERY, concurrency: int = 20,
                 connect_timeout: float = 30, open_timeout: float = 600, app: str = "lab-idle"):
        self.args = (host, port, user, database, query, app)
        self.n, self.concurrency = n, concurrency
        self.connect_timeout, self.open_timeout = connect_timeout, open_timeout
        self.opened = 0
        self.errors: Counter = Counter()
        self.open_seconds: float | None = None
        self._loop = asyncio.new_event_loop()
        self._conns: list = []
        self._thread = threading.Thread(target=self._loop.run_forever, name="lab-idle",
                                        daemon=True)

    def __enter__(self) -> "IdleConnections":
        self.open()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def open(self) -> None:
        self._thread.start()
        t0 = time.monotonic()
        fut = asyncio.run_coroutine_threadsafe(self._open_all(), self._loop)
        try:
            fut.result(timeout=self.open_timeout + 10)
        except Exception as e:  # noqa: BLE001 - timeouts included: report, keep what opened
            fut.cancel()
            self.errors[f"opening stopped: {type(e).__name__}"] += 1
        self.open_seconds = round(time.monotonic() - t0, 2)

    async def _open_all(self) -> None:
        sem = asyncio.Semaphore(self.concurrency)

        async def one():
            async with sem:
                try:
                    self._conns.append(await _open_one(*self.args, self.connect_timeout))
                    self.opened += 1
                except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError,
                        ConnectionError) as e:
                    self.errors[_reason(e)] += 1
        await asyncio.wait_for(asyncio.gather(*(one() for _ in range(self.n))),
                               self.open_timeout)

    def close(self) -> None:
        if not self._thread.is_alive():
            return

        async def close_all():
            for _r, w in self._conns:
                try:
                    w.write(b"X\x00\x00\x00\x04")
                    w.close()
                except Exception:  # noqa: BLE001
                    pass
            for _r, w in self._conns:
                try:
                    await asyncio.wait_for(w.wait_closed(), 2)
                except Exception:  # noqa: BLE001
                    pass
            self._conns.clear()
        try:
            asyncio.run_coroutine_threadsafe(close_all(), self._loop).result(timeout=60)
        except Exception:  # noqa: BLE001
            pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        try:
            self._loop.close()
        except RuntimeError:
            pass

    def summary(self) -> dict:
        return {"requested": self.n, "opened": self.opened, "open_seconds": self.open_seconds,
                "errors": dict(self.errors)}


def _reason(e: Exception) -> str:
    if isinstance(e, asyncio.TimeoutError):
        return "timeout"
    if isinstance(e, asyncio.IncompleteReadError):
        return "connection closed during startup"
    return str(e) or type(e).__name__


def probe(host: str, port: int, *, user: str, database: str, n: int,
          timeout: float = 10) -> dict:
    """How many of n simultaneous clients get in (and hold on); the rest and why not.
    It introduces itself as pgbench (application_name), like the runs it stands in for:
    Pgpool-II only reuses a cached backend for a client with the same startup parameters."""
    conns = IdleConnections(host, port, user=user, database=database, n=n, query=None,
                            concurrency=n, connect_timeout=timeout, open_timeout=timeout + 30,
                            app="pgbench")
    with conns:
        pass
    return {"opened": conns.opened, "failed": n - conns.opened, "errors": dict(conns.errors)}
