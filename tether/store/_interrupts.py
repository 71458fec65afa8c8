"""Store operations of human review: interrupts, the approvals inbox and the audit log.

The transitions that matter are single transactions with conditional writes: an interrupt
leaves ``pending`` exactly once (``UPDATE … WHERE status = 'pending'``), and in the same
transaction the run moves ``waiting_human → running`` and the ``resumed`` event is appended.
Two racing resumes (in one process or many) cannot both win, and a resume cannot slip past a
concurrent cancel.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from .._ids import as_utc
from ..errors import InterruptExpired, InterruptResolved, NotFound
from ..events import StoredEvent, format_ts
from ..review import Decision, ParkedTurn
from ._allowances import AllowanceRecord, insert_allowances
from ._events import EventStore
from ._records import AuditEntry, InterruptRecord, RunRecord, RunStatus, audit_entry, interrupt_record, run_record
from ._tables import audit, interrupts, runs

__all__ = ["ReviewStore"]


def _select_interrupts() -> sa.Select[Any]:
    """Interrupts with the principal who requested their run (every read of an interrupt)."""
    return sa.select(interrupts, runs.c.requested_by).join(runs, runs.c.id == interrupts.c.run_id)


class ReviewStore(EventStore):
    """Interrupt and audit operations of :class:`~tether.store.Store`."""

    async def open_interrupt(self, record: InterruptRecord, event: StoredEvent) -> bool:
        """Park a run: ``running → waiting_human``, insert the interrupt and its event, atomically.

        False (nothing written) if the run was no longer ``running`` (a cancel came first) or no
        longer this process's (taken over).
        """
        async with self._writing() as conn:
            # A waiting run belongs to no process: whoever resolves the interrupt executes it.
            result = await conn.execute(
                runs.update()
                .where(runs.c.id == record.run_id, runs.c.status == RunStatus.RUNNING.value, runs.c.executor_id == self.instance_id)
                .values(status=RunStatus.WAITING_HUMAN.value, executor_id=None, lease_expires_at=None)
            )
            if result.rowcount != 1:
                return False
            await conn.execute(
                interrupts.insert().values(
                    id=record.id,
                    run_id=record.run_id,
                    thread_id=record.thread_id,
                    status="pending",
                    **record.columns(),
                    resolved_by=None,
                    created_at=record.created_at,
                    expires_at=record.expires_at,
                    resolved_at=None,
                )
            )
            await self._write_events(conn, record.run_id, [event])
            if self.outbox is not None:
                await self.outbox.interrupt_created(conn, record)
        return True

    async def get_interrupt(self, interrupt_id: str) -> InterruptRecord:
        """Read an interrupt; :class:`NotFound` if missing."""
        async with self._reading() as conn:
            row = (await conn.execute(_select_interrupts().where(interrupts.c.id == interrupt_id))).first()
        if row is None:
            raise NotFound(f"interrupt {interrupt_id!r} not found", code="interrupt_not_found")
        return interrupt_record(row)

    async def pending_interrupts(self, *, run_ids: Sequence[str] = (), thread_ids: Sequence[str] = ()) -> list[InterruptRecord]:
        """Pending interrupts of the given runs or threads."""
        if not run_ids and not thread_ids:
            return []
        cond = sa.or_(interrupts.c.run_id.in_(list(run_ids)), interrupts.c.thread_id.in_(list(thread_ids)))
        async with self._reading() as conn:
            rows = await conn.execute(_select_interrupts().where(interrupts.c.status == "pending", cond))
            return [interrupt_record(r) for r in rows]

    async def latest_interrupt(self, run_id: str) -> InterruptRecord | None:
        """The run's most recent interrupt."""
        query = _select_interrupts().where(interrupts.c.run_id == run_id).order_by(interrupts.c.created_at.desc()).limit(1)
        async with self._reading() as conn:
            row = (await conn.execute(query)).first()
        return interrupt_record(row) if row is not None else None

    async def due_interrupts(self, now: datetime, *, limit: int = 100) -> list[InterruptRecord]:
        """Pending interrupts whose ``expires_at`` has passed."""
        query = _select_interrupts().where(interrupts.c.status == "pending", interrupts.c.expires_at <= now).order_by(interrupts.c.expires_at).limit(limit)
        async with self._reading() as conn:
            return [interrupt_record(r) for r in await conn.execute(query)]

    async def inbox(self, *, requested_by: str | None, limit: int = 100) -> list[InterruptRecord]:
        """Pending interrupts, soonest expiry first: of runs ``requested_by`` started, or every
        one (``None``: for approvers and admins)."""
        query = _select_interrupts().where(interrupts.c.status == "pending")
        if requested_by is not None:
            query = query.where(runs.c.requested_by == requested_by)
        query = query.order_by(interrupts.c.expires_at, interrupts.c.id).limit(limit)
        async with self._reading() as conn:
            return [interrupt_record(r) for r in await conn.execute(query)]

    async def has_interrupts(self, thread_id: str) -> bool:
        """True when the thread has (or had) an interrupt: approvers may read it."""
        query = sa.select(sa.exists().where(interrupts.c.thread_id == thread_id))
        async with self._reading() as conn:
            return bool((await conn.execute(query)).scalar())

    async def count_pending_interrupts(self) -> int:
        """How many interrupts wait for a decision (for ``/metrics``)."""
        query = sa.select(sa.func.count()).select_from(interrupts).where(interrupts.c.status == "pending")
        async with self._reading() as conn:
            return int((await conn.execute(query)).scalar() or 0)

    async def next_expiry(self) -> datetime | None:
        """The earliest ``expires_at`` of any pending interrupt."""
        query = sa.select(sa.func.min(interrupts.c.expires_at)).where(interrupts.c.status == "pending")
        async with self._reading() as conn:
            earliest: datetime | None = (await conn.execute(query)).scalar()
        return as_utc(earliest)

    async def leave_pending(
        self,
        interrupt_id: str,
        *,
        to_status: str,
        now: datetime,
        decisions: list[Decision] | None,
        turn: ParkedTurn,
        actor: str,
        make_event: Callable[[str, int], StoredEvent],
        audit_entries: Sequence[AuditEntry],
        allowances: Sequence[AllowanceRecord] = (),
    ) -> tuple[InterruptRecord, StoredEvent, RunRecord]:
        """The one transition out of ``pending``: to ``resolved`` (decisions) or ``expired``.

        In one transaction: the interrupt's conditional update, ``waiting_human → running`` for
        its run, the ``resumed`` event (built by ``make_event(run_id, seq)``), the audit entries
        and the standing approvals the decisions give (with theirs: :func:`insert_allowances`),
        so a decision that loses leaves no allowance behind. Returns the interrupt, the event and
        the run as committed.
        Raises :class:`InterruptResolved` / :class:`InterruptExpired` when it lost.
        """
        async with self._writing() as conn:
            row = (await conn.execute(_select_interrupts().where(interrupts.c.id == interrupt_id))).first()
            if row is None:
                raise NotFound(f"interrupt {interrupt_id!r} not found", code="interrupt_not_found")
            current = interrupt_record(row)
            _refuse_unless_pending(current, now, expiring=to_status == "expired")
            condition = [interrupts.c.id == interrupt_id, interrupts.c.status == "pending"]
            condition.append(interrupts.c.expires_at <= now if to_status == "expired" else interrupts.c.expires_at > now)
            left = dataclasses.replace(current, status=to_status, decisions=decisions, turn=turn, resolved_by=actor, resolved_at=now)
            columns = left.columns()
            result = await conn.execute(
                interrupts.update()
                .where(*condition)
                .values(status=to_status, decisions=columns["decisions"], turn=columns["turn"], resolved_by=actor, resolved_at=now)
            )
            if result.rowcount != 1:
                raise InterruptResolved(f"interrupt {interrupt_id!r} was resolved by someone else")
            result = await conn.execute(
                runs.update()
                .where(runs.c.id == current.run_id, runs.c.status == RunStatus.WAITING_HUMAN.value)
                .values(status=RunStatus.RUNNING.value, **self._lease_values())  # the resolver executes it
            )
            if result.rowcount != 1:
                # The run was cancelled meanwhile: raising rolls the whole transaction back.
                raise InterruptResolved(f"run {current.run_id!r} is no longer waiting for this interrupt")
            event = make_event(current.run_id, await self._next_seq(conn, current.run_id))
            await self._write_events(conn, current.run_id, [event])
            if audit_entries:
                await conn.execute(audit.insert(), [e.values() for e in audit_entries])
            run_row = (await conn.execute(runs.select().where(runs.c.id == current.run_id))).first()
            if self.outbox is not None:
                await self.outbox.interrupt_left(conn, left)
            await insert_allowances(conn, allowances, self.outbox)  # after the decision, also in the outbox
        return left, event, run_record(run_row)

    async def add_audit(self, entries: Sequence[AuditEntry]) -> None:
        """Append audit entries."""
        if entries:
            async with self._writing() as conn:
                await conn.execute(audit.insert(), [e.values() for e in entries])

    async def list_audit(self, *, thread_id: str | None = None, run_id: str | None = None, limit: int = 1000) -> list[AuditEntry]:
        """Audit entries, oldest first, filtered by thread and/or run (neither: every entry)."""
        query = audit.select().order_by(audit.c.ts, audit.c.id).limit(limit)
        if thread_id:
            query = query.where(audit.c.thread_id == thread_id)
        if run_id:
            query = query.where(audit.c.run_id == run_id)
        async with self._reading() as conn:
            return [audit_entry(row) for row in await conn.execute(query)]


def _refuse_unless_pending(current: InterruptRecord, now: datetime, *, expiring: bool) -> None:
    if current.status == "expired" or (current.status == "pending" and not expiring and current.expires_at <= now):
        raise InterruptExpired(
            f"interrupt {current.id!r} expired at {format_ts(current.expires_at)}; its actions were rejected",
            details={"expires_at": format_ts(current.expires_at)},
        )
    if current.status != "pending":
        raise InterruptResolved(f"interrupt {current.id!r} is already {current.status}", details={"status": current.status})
