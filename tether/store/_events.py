"""The store's event log: appending a run's events, reading them back, and telling other
processes (PostgreSQL ``NOTIFY``) that there are new ones.

Every write of events here also announces them in the same transaction, so on PostgreSQL the
notification is delivered on commit and never announces an event that is not durable. A single
SQLite process has no one to tell.

On PostgreSQL the three statements that run for every commit of events and every follower's
catch-up (the insert with its ``NOTIFY``, the read of new events, a run's last seq) are SQL of
their own, prepared once per connection, each one statement in autocommit where it stands alone:
one round trip, and none of the per-statement work of compiling a Core statement's values.

**Fenced by the lease.** An executor's events (:meth:`EventStore.append_event_batches`, the
group commit) are written only for the runs this process still holds (``runs.executor_id``),
checked in the insert itself under a share lock on each run's row. A process that stalled past
its lease (a loaded machine, a long GC pause) and lost a run to another process can therefore
never write into the new executor's log: the takeover's update of ``executor_id`` waits for an
insert that locked the row first (so the new executor reads the run's last seq after it), and an
insert that comes after the takeover writes nothing for that run and says so.
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa

from ..events import StoredEvent
from . import _notify as channels
from ._engine import Reading, StoreBase, Writing
from ._pgdirect import DirectConnection
from ._sqlite import run_sql
from ._tables import Hot, events, runs

__all__ = ["EventStore"]


class EventStore(StoreBase):
    """Event log operations of :class:`~tether.store.Store`."""

    async def append_events(self, run_id: str, batch: Sequence[StoredEvent]) -> frozenset[str]:
        """Append a batch of one run's events in one transaction, as its executor (see
        :meth:`append_event_batches`)."""
        return await self.append_event_batches([(run_id, batch)])

    async def append_event_batches(self, batches: Sequence[tuple[str, Sequence[StoredEvent]]]) -> frozenset[str]:
        """Append batches of several runs' events in one transaction (the group commit across
        runs), as their executor: all of them are durable, or none — except those of runs this
        process no longer executes (taken over by another process while it stalled), which are
        not written. Returns those runs (always none on SQLite: one process executes them all)."""
        batches = [(run_id, batch) for run_id, batch in batches if batch]
        if not batches:
            return frozenset()
        if self._sqlite is not None:
            assert self._write_lock is not None
            async with self._write_lock:
                await self._sqlite.write_in_thread(lambda raw: _insert_events_sqlite(functools.partial(run_sql, raw), batches))
            return frozenset()
        if self._event_writer is not None:
            # One statement, atomic on its own: autocommit, one round trip, on the writer's own
            # connection (a crowd of starts or ends holding the shared pool does not delay it).
            async with self._event_writer.connection() as direct:
                return await self._insert_held_events_postgres(direct, batches)
        async with self._writing() as conn:  # an in-memory SQLite database, on the async driver's connection
            from sqlalchemy.ext.asyncio import AsyncConnection

            assert isinstance(conn, AsyncConnection)
            await conn.run_sync(lambda sync_conn: _insert_events_sqlite(sync_conn.exec_driver_sql, batches))
        return frozenset()

    async def read_events(self, run_id: str, *, after_seq: int = 0, limit: int = 1000) -> list[StoredEvent]:
        """Events with ``seq > after_seq``, in order."""
        async with self._reading() as conn:
            rows: Any
            if isinstance(conn, DirectConnection):
                rows = await conn.exec_driver_sql(_READ_EVENTS_PG, (run_id, after_seq, limit))
            else:
                rows = await conn.execute(_READ_EVENTS, {"run_id": run_id, "after_seq": after_seq, "limit": limit})
            return [StoredEvent(seq, type_, envelope) for seq, type_, envelope in rows]

    async def last_seq(self, run_id: str) -> int:
        """The highest ``seq`` of a run (0 if none)."""
        async with self._point_reading() as conn:
            return await _last_seq(conn, run_id)

    async def send_control(self, message: channels.ControlMessage) -> None:
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
        """Insert the batches and announce each run's newest seq (one notification for them
        all), in one statement: one round trip, one prepared statement whatever the number of
        rows (they travel as arrays)."""
        await conn.exec_driver_sql(_INSERT_AND_NOTIFY_PG, _insert_parameters(self.instance_id, batches))

    async def _insert_held_events_postgres(self, conn: DirectConnection, batches: Sequence[tuple[str, Sequence[StoredEvent]]]) -> frozenset[str]:
        """``_insert_events_postgres`` for the runs this process holds only (the module
        docstring says why); returns the runs it did not write. The notification goes out with
        the insert when every run was written; else (a rare stall) the written runs' in a second
        statement, so none announces an event that was not written."""
        last = [(run_id, batch[-1].seq) for run_id, batch in batches]
        held = await conn.exec_driver_sql(
            _INSERT_HELD_AND_NOTIFY_PG,
            (*_insert_parameters(self.instance_id, batches), self.instance_id, len({run_id for run_id, _seq in last})),
        )
        lost = frozenset(run_id for run_id, _seq in last) - {row[0] for row in held}
        if lost and len(lost) < len(last):
            written = [(run_id, seq) for run_id, seq in last if run_id not in lost]
            await conn.exec_driver_sql(_NOTIFY_PG, (channels.EVENTS_CHANNEL, channels.events_payloads(self.instance_id, written)))
        return lost

    @staticmethod
    async def _next_seq(conn: Reading, run_id: str) -> int:
        """The seq the run's next event gets, read in the caller's transaction."""
        return await _last_seq(conn, run_id) + 1


def _insert_parameters(origin: str, batches: Sequence[tuple[str, Sequence[StoredEvent]]]) -> tuple[Any, ...]:
    """$1–$6 of both PostgreSQL inserts: the events as column arrays, the channel, and the
    payloads announcing each run's newest seq."""
    rows = [(run_id, e) for run_id, batch in batches for e in batch]
    return (
        [run_id for run_id, _e in rows],
        [e.seq for _run_id, e in rows],
        [e.type for _run_id, e in rows],
        [e.envelope for _run_id, e in rows],
        channels.EVENTS_CHANNEL,
        channels.events_payloads(origin, [(run_id, batch[-1].seq) for run_id, batch in batches if batch]),
    )


#: ``read_events``, built once (followers run it on every catch-up).
_READ_EVENTS = (
    sa.select(events.c.seq, events.c.type, events.c.envelope)
    .where(events.c.run_id == sa.bindparam("run_id"), events.c.seq > sa.bindparam("after_seq"))
    .order_by(events.c.seq)
    .limit(sa.bindparam("limit"))
)


#: PostgreSQL: the same read, and the two other statements of every commit of events, as SQL
#: of their own (the module docstring says why).
_READ_EVENTS_PG = f"SELECT seq, type, envelope FROM {events.name} WHERE run_id = $1 AND seq > $2 ORDER BY seq LIMIT $3"
_LAST_SEQ_PG = f"SELECT max(seq) FROM {events.name} WHERE run_id = $1"
#: Insert events given as column arrays and send a ``tether_events`` notification per payload
#: (one per commit, see ``_notify``), in one statement: a data-modifying ``WITH`` runs exactly
#: once whether or not the outer query reads it; the notifications are delivered on commit.
_INSERT_AND_NOTIFY_PG = (
    f"WITH inserted AS (INSERT INTO {events.name} (run_id, seq, type, envelope)"
    " SELECT * FROM unnest($1::varchar[], $2::int[], $3::varchar[], $4::text[]))"
    " SELECT pg_notify($5, p) FROM unnest($6::text[]) AS p"
)
#: The executor's form of it (the group commit): only the events of the runs whose row says this
#: process ($7) executes them, each row share-locked so a takeover's update waits for this insert;
#: the notifications only when all $8 runs were held. Answers the runs it wrote.
_INSERT_HELD_AND_NOTIFY_PG = (
    f"WITH held AS (SELECT id FROM {runs.name} WHERE id = ANY($1::varchar[]) AND executor_id = $7 FOR SHARE),"
    f" inserted AS (INSERT INTO {events.name} (run_id, seq, type, envelope)"
    " SELECT b.run_id, b.seq, b.type, b.envelope"
    " FROM unnest($1::varchar[], $2::int[], $3::varchar[], $4::text[]) AS b(run_id, seq, type, envelope)"
    " WHERE b.run_id IN (SELECT id FROM held)),"
    " notified AS (SELECT pg_notify($5, p) FROM unnest($6::text[]) AS p WHERE (SELECT count(*) FROM held) = $8)"
    " SELECT id, (SELECT count(*) FROM notified) FROM held"
)
_NOTIFY_PG = "SELECT pg_notify($1, p) FROM unnest($2::text[]) AS p"


async def _last_seq(conn: Reading, run_id: str) -> int:
    if isinstance(conn, DirectConnection):
        value = (await conn.exec_driver_sql(_LAST_SEQ_PG, (run_id,))).scalar()
    else:
        value = (await conn.execute(sa.select(sa.func.max(events.c.seq)).where(events.c.run_id == run_id))).scalar()
    return int(value or 0)


async def _notify(conn: Writing, channel: str, payload: str) -> None:
    await conn.execute(sa.select(sa.func.pg_notify(channel, payload)))


# Bound parameters one SQLite statement may take (SQLITE_MAX_VARIABLE_NUMBER: 999 before 3.32).
_SQLITE_MAX_VARIABLES = 32766 if sqlite3.sqlite_version_info >= (3, 32, 0) else 999
_EVENT_COLUMNS = ("run_id", "seq", "type", "envelope")
_SQLITE_EVENT_ROWS_PER_INSERT = min(_SQLITE_MAX_VARIABLES // len(_EVENT_COLUMNS), 2000)


def _insert_events_sqlite(execute: Callable[[str, tuple[Any, ...]], object], batches: Sequence[tuple[str, Sequence[StoredEvent]]]) -> None:
    """Insert a batch with one multi-row ``INSERT`` per chunk, not an ``executemany``
    (``execute`` runs SQL with ``?`` parameters: ``sqlite3``'s, or SQLAlchemy's connection's).

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
        execute(head + ",".join(["(?,?,?,?)"] * len(chunk)), tuple(params))
