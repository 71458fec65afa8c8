"""The durable floor's store: every event written to SQLite or PostgreSQL before it is sent.

Loaded by ``benchmarks/_floor_app.py --db URL``. What it does is what a durable agent server
cannot avoid, and nothing more:

- one table ``events (run_id, seq, type, envelope)`` with the primary key ``(run_id, seq)``,
  as Tether's; no runs table, no leases, no ``NOTIFY`` (no fan-out beyond the one reader);
- one writer task for the process, committing what every stream has queued in one transaction
  (group commit across streams) with the two pacing rules of Tether's
  (``tether/runtime/_groupcommit.py``): after a slow commit under sustained load, with about one
  event per stream waiting, rest as long as the commit took; a small transaction after a quick
  one lingers 1 ms for more. A stream sends an event only once its commit returned;
- SQLite: WAL, ``synchronous=NORMAL``, ``wal_autocheckpoint`` left at SQLite's default, the
  commit in a writer thread (one hop per transaction, as Tether's group commit), multi-row
  ``INSERT`` statements;
- PostgreSQL: asyncpg, one connection, one ``INSERT … SELECT unnest(…)`` statement per commit in
  autocommit (Tether's statement without its ``pg_notify``).
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

_BURST_LINGER_S = 0.001
_BURST_EVENTS = 256
_SLOW_COMMIT_S = 0.002
_FEW_EVENTS_PER_RUN = 2

_SCHEMA = "CREATE TABLE IF NOT EXISTS events (run_id VARCHAR(64) NOT NULL, seq INTEGER NOT NULL, type VARCHAR(32) NOT NULL, envelope TEXT NOT NULL, PRIMARY KEY (run_id, seq))"
_PG_INSERT = "INSERT INTO events (run_id, seq, type, envelope) SELECT * FROM unnest($1::varchar[], $2::int[], $3::varchar[], $4::text[])"
#: Rows per multi-row INSERT on SQLite (4 parameters a row, SQLite's limit of 32,766 variables).
_SQLITE_ROWS = 2000

Row = tuple[str, int, str, str]


class _Queued:
    __slots__ = ("rows", "done")

    def __init__(self, rows: list[Row], done: asyncio.Future[None]) -> None:
        self.rows = rows
        self.done = done


class DurableWriter:
    """Group commit of every stream's events to ``url`` (``sqlite:///path`` or ``postgresql://…``)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._waiting: list[_Queued] = []
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._sqlite: sqlite3.Connection | None = None
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="floor-writer")
        self._pg: Any = None
        self.transactions = 0

    async def open(self) -> None:
        if self.url.startswith("sqlite"):
            path = self.url.split("///", 1)[1]

            def connect() -> sqlite3.Connection:
                conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=NORMAL")
                conn.execute(_SCHEMA)
                return conn

            self._sqlite = await asyncio.get_running_loop().run_in_executor(self._thread, connect)
        else:
            import asyncpg

            self._pg = await asyncpg.connect(self.url.replace("postgresql+asyncpg://", "postgresql://"))
            async with self._pg.transaction():  # workers starting together create it once
                await self._pg.execute("SELECT pg_advisory_xact_lock(4303)")
                await self._pg.execute(_SCHEMA)
        self._task = asyncio.create_task(self._write_loop())

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
        if self._pg is not None:
            await self._pg.close()
        if self._sqlite is not None:
            self._thread.submit(self._sqlite.close).result()
        self._thread.shutdown()

    def write(self, run_id: str, events: Sequence[tuple[int, str, bytes]]) -> asyncio.Future[None]:
        """Queue ``(seq, type, encoded SSE event)`` rows; the future is done once they are durable."""
        done = asyncio.get_running_loop().create_future()
        rows = [(run_id, seq, kind, _envelope(event)) for seq, kind, event in events]
        self._waiting.append(_Queued(rows, done))
        self._wakeup.set()
        return done

    async def _write_loop(self) -> None:
        busy, took = 0, 0.0
        loop = asyncio.get_running_loop()
        while True:
            await self._wakeup.wait()
            if busy >= 2:
                queued = sum(len(q.rows) for q in self._waiting)
                if took >= _SLOW_COMMIT_S and queued < _FEW_EVENTS_PER_RUN * len(self._waiting):
                    await asyncio.sleep(took)
                elif queued < _BURST_EVENTS:
                    await asyncio.sleep(_BURST_LINGER_S)
            self._wakeup.clear()
            work, self._waiting = self._waiting, []
            if work:
                began = loop.time()
                rows = [row for q in work for row in q.rows]
                try:
                    await self._commit(rows)
                except Exception as exc:  # a floor has no retries: the streams that waited fail
                    for q in work:
                        if not q.done.done():
                            q.done.set_exception(exc)
                    continue
                took = loop.time() - began
                self.transactions += 1
                for q in work:
                    if not q.done.done():
                        q.done.set_result(None)
            busy = busy + 1 if self._waiting else 0

    async def _commit(self, rows: list[Row]) -> None:
        if self._sqlite is not None:
            await asyncio.get_running_loop().run_in_executor(self._thread, _insert_sqlite, self._sqlite, rows)
        else:
            columns = list(zip(*rows, strict=True))
            await self._pg.execute(_PG_INSERT, *columns)


def _envelope(event: bytes) -> str:
    # The stored envelope is the ``data:`` line of the SSE event, byte for byte what is sent.
    start = event.index(b"data: ") + 6
    return event[start : event.index(b"\n", start)].decode()


def _insert_sqlite(conn: sqlite3.Connection, rows: list[Row]) -> None:
    conn.execute("BEGIN IMMEDIATE")
    try:
        for i in range(0, len(rows), _SQLITE_ROWS):
            chunk = rows[i : i + _SQLITE_ROWS]
            sql = "INSERT INTO events (run_id, seq, type, envelope) VALUES " + ",".join(["(?,?,?,?)"] * len(chunk))
            conn.execute(sql, [value for row in chunk for value in row])
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
