"""Lookups for access checks: a resource by id, with what decides who may see it, in one query.

Each returns the record together with its thread's ``owner`` and whether that thread has (or
had) an interrupt (approvers may read those), or None. One query whether the resource exists,
belongs to the caller or not: a resource you may not see costs the server the same work as a
missing one, so the time of a 404 tells nothing. The rules themselves live in the server's
``_access``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import sqlalchemy as sa

from ._engine import StoreBase
from ._records import MessageRecord, RunRecord, ThreadRecord, message_record, run_record, thread_record
from ._tables import Hot, interrupts, messages, runs, threads

__all__ = ["Found", "LookupStore"]

R = TypeVar("R")


@dataclass(frozen=True, slots=True, kw_only=True)
class Found(Generic[R]):
    """A resource and what its visibility depends on."""

    record: R
    thread_id: str
    #: The principal who owns the resource's thread.
    owner: str
    #: True when the thread has (or had) an interrupt.
    reviewable: bool


def _reviewable(thread_id: Any) -> sa.Label[bool]:
    return sa.exists().where(interrupts.c.thread_id == thread_id).label("tether_reviewable")


def _in_thread_query(table: sa.Table) -> sa.Select[Any]:
    return (
        sa.select(table, threads.c.owner.label("tether_owner"), _reviewable(table.c.thread_id))
        .join(threads, threads.c.id == table.c.thread_id)
        .where(table.c.id == sa.bindparam("row_id"))
    )


# Built once: every request checks access with one of these.
_THREAD_QUERY = sa.select(threads, _reviewable(threads.c.id)).where(threads.c.id == sa.bindparam("row_id"))
_IN_THREAD_QUERIES = {table.name: _in_thread_query(table) for table in (runs, messages)}
#: A thread as ``_THREAD_QUERY`` reads it, with how many runs ``requested_by`` has busy.
_THREAD_TO_START_QUERY = sa.select(threads, _reviewable(threads.c.id), Hot.count_busy_runs.scalar_subquery().label("tether_busy_runs")).where(
    threads.c.id == sa.bindparam("row_id")
)


class LookupStore(StoreBase):
    """Access-check lookups of :class:`~tether.store.Store`."""

    async def find_thread(self, thread_id: str) -> Found[ThreadRecord] | None:
        """A thread, its owner and whether it has interrupts; None if missing."""
        async with self._point_reading() as conn:
            row = (await conn.execute(_THREAD_QUERY, {"row_id": thread_id})).first()
        return None if row is None else Found(record=thread_record(row), thread_id=row.id, owner=row.owner, reviewable=bool(row.tether_reviewable))

    async def find_thread_to_start(self, thread_id: str, *, requested_by: str) -> tuple[Found[ThreadRecord] | None, int]:
        """:meth:`find_thread`, and how many runs ``requested_by`` has busy
        (:meth:`~tether.store.Store.count_active_runs`), in one query: a run start's checks
        read once before its write."""
        async with self._point_reading() as conn:
            row = (await conn.execute(_THREAD_TO_START_QUERY, {"row_id": thread_id, "requested_by": requested_by})).first()
        if row is None:
            return None, 0
        return Found(record=thread_record(row), thread_id=row.id, owner=row.owner, reviewable=bool(row.tether_reviewable)), int(row.tether_busy_runs)

    async def find_run(self, run_id: str) -> Found[RunRecord] | None:
        """A run, its thread's owner and whether that thread has interrupts; None if missing."""
        return await self._find_in_thread(runs, run_id, run_record)

    async def find_message(self, message_id: str) -> Found[MessageRecord] | None:
        """A message, its thread's owner and whether that thread has interrupts; None if missing."""
        return await self._find_in_thread(messages, message_id, message_record)

    async def _find_in_thread(self, table: sa.Table, row_id: str, to_record: Callable[[Any], R]) -> Found[R] | None:
        """A row of ``table`` (which has ``thread_id``) with its thread's owner and whether that
        thread has interrupts, in one query."""
        async with self._point_reading() as conn:
            row = (await conn.execute(_IN_THREAD_QUERIES[table.name], {"row_id": row_id})).first()
        return None if row is None else Found(record=to_record(row), thread_id=row.thread_id, owner=row.tether_owner, reviewable=bool(row.tether_reviewable))
