"""The store's event log: appending a run's events, reading them back, and telling other
processes (PostgreSQL ``NOTIFY``) that there are new ones.

Every write of events here also announces them in the same transaction, so on PostgreSQL the
notification is delivered on commit and never announces an event that is not durable. A single
SQLite process has no one to tell.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from ..events import StoredEvent
from . import _notify as channels
from ._engine import Reading, StoreBase, Writing
from ._pgdirect import INSERT_AND_NOTIFY, insert_and_notify_args
from ._tables import Hot, events

__all__ = ["EventStore"]


class EventStore(StoreBase):
    """Event log operations of :class:`~tether.store.Store`."""

    async def append_events(self, run_id: str, batch: Sequence[StoredEvent]) -> None:
        """Append a batch of one run's events in one transaction."""
        await self.append_event_batches([(run_id, batch)])

    async def append_event_batches(self, batches: Sequence[tuple[str, Sequence[StoredEvent]]]) -> None:
        """Append batches of several runs' events in one transaction (the group commit across
        runs): all of them are durable, or none."""
        batches = [(run_id, batch) for run_id, batch in batches if batch]
        if not batches:
            return
        if self._sqlite is not None:
            assert self._write_lock is not None
            async with self._write_lock:
                await self._sqlite.write_in_thread(lambda conn: _insert_events_sqlite(conn, batches))
            return
        if self._direct is not None:
            await self._direct.append_event_batches(self.instance_id, batches)
            return
        async with self._writing() as conn:  # an in-memory SQLite database, on the async driver's connection
            assert isinstance(conn, AsyncConnection)
            await conn.run_sync(lambda sync_conn: _insert_events_sqlite(sync_conn, batches))

    async def read_events(self, run_id: str, *, after_seq: int = 0, limit: int = 1000) -> list[StoredEvent]:
        """Events with ``seq > after_seq``, in order."""
        if self._direct is not None:
            return await self._direct.read_events(run_id, after_seq, limit)
        async with self._reading() as conn:
            rows = await conn.execute(_READ_EVENTS, {"run_id": run_id, "after_seq": after_seq, "limit": limit})
            return [StoredEvent(seq, type_, envelope) for seq, type_, envelope in rows]

    async def last_seq(self, run_id: str) -> int:
        """The highest ``seq`` of a run (0 if none)."""
        if self._direct is not None:
            return await self._direct.last_seq(run_id)
        async with self._point_reading() as conn:
            return await _last_seq(conn, run_id)

    async def send_control(self, message: dict[str, Any]) -> None:
        """Send a small command to every other process (e.g. cancel a run it executes)."""
        if self.is_sqlite:
            return  # one process: no one else to tell
        async with self._writing() as conn:
            await _notify(conn, channels.CONTROL_CHANNEL, channels.control_payload(message, self.instance_id))

    # -- inside other transactions ---------------------------------------------------------

    async def _write_events(self, conn: Writing, run_id: str, batch: Sequence[StoredEvent]) -> None:
        """Insert ``batch`` in the caller's transaction and announce it on commit."""
        if not self.is_sqlite:
            await self._insert_events_postgres(conn, [(run_id, batch)])
            return
        rows = [{"run_id": run_id, "seq": e.seq, "type": e.type, "envelope": e.envelope} for e in batch]
        await conn.execute(Hot.insert_event, rows[0] if len(rows) == 1 else rows)

    async def _insert_events_postgres(self, conn: Writing, batches: Sequence[tuple[str, Sequence[StoredEvent]]]) -> None:
        """Insert the batches and announce each run's newest seq, in the caller's transaction:
        the group commit's statement (``_pgdirect``), on the caller's connection."""
        await conn.exec_driver_sql(INSERT_AND_NOTIFY, insert_and_notify_args(self.instance_id, batches))

    @staticmethod
    async def _next_seq(conn: Reading, run_id: str) -> int:
        """The seq the run's next event gets, read in the caller's transaction."""
        return await _last_seq(conn, run_id) + 1


#: ``read_events``, built once (followers run it on every catch-up).
_READ_EVENTS = (
    sa.select(events.c.seq, events.c.type, events.c.envelope)
    .where(events.c.run_id == sa.bindparam("run_id"), events.c.seq > sa.bindparam("after_seq"))
    .order_by(events.c.seq)
    .limit(sa.bindparam("limit"))
)


async def _last_seq(conn: Reading, run_id: str) -> int:
    value = (await conn.execute(sa.select(sa.func.max(events.c.seq)).where(events.c.run_id == run_id))).scalar()
    return int(value or 0)


async def _notify(conn: Writing, channel: str, payload: str) -> None:
    await conn.execute(sa.select(sa.func.pg_notify(channel, payload)))


# Bound parameters one SQLite statement may take (SQLITE_MAX_VARIABLE_NUMBER: 999 before 3.32).
_SQLITE_MAX_VARIABLES = 32766 if sqlite3.sqlite_version_info >= (3, 32, 0) else 999
_EVENT_COLUMNS = ("run_id", "seq", "type", "envelope")
_SQLITE_EVENT_ROWS_PER_INSERT = min(_SQLITE_MAX_VARIABLES // len(_EVENT_COLUMNS), 2000)


def _insert_events_sqlite(conn: sa.Connection, batches: Sequence[tuple[str, Sequence[StoredEvent]]]) -> None:
    """Insert a batch with one multi-row ``INSERT`` per chunk, not an ``executemany``.

    ``executemany`` binds and steps row by row, taking the GIL back for each row: while the
    event loop is busy (a model streaming tokens, which is exactly when batches are big), every
    one of those handoffs waits for the loop thread. One statement per chunk binds once and
    steps once, and skips SQLAlchemy's per-row parameter processing too.
    """
    per_insert = _SQLITE_EVENT_ROWS_PER_INSERT
    head = f"INSERT INTO {events.name} ({', '.join(_EVENT_COLUMNS)}) VALUES "
    rows = [(run_id, e) for run_id, batch in batches for e in batch]
    for start in range(0, len(rows), per_insert):
        chunk = rows[start : start + per_insert]
        params: list[Any] = []
        for run_id, e in chunk:
            params += (run_id, e.seq, e.type, e.envelope)
        conn.exec_driver_sql(head + ",".join(["(?,?,?,?)"] * len(chunk)), tuple(params))
