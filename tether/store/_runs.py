"""The store's runs: their creation and status transitions (their leases are ``_leases``).

Every transition that may race (a cancel against a finish, two processes claiming one run) is a
single conditional write, ``UPDATE runs … WHERE status IN (…)``, so it holds across processes:
the write that matches wins and the other finds nothing to change. "One active run per thread"
is a partial unique index, so the database refuses a second one whoever asks.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from .._ids import new_id, utcnow
from ..errors import NotFound, RunNotActive, ThreadBusy
from ..events import CancelMode, Envelope, RunStarted, Status, StoredEvent
from . import _notify as channels
from ._engine import Writing
from ._events import EventStore
from ._idempotency import record_created, records
from ._records import (
    ACTIVE_RUN_STATUSES,
    AtLeaf,
    Attach,
    AuditEntry,
    CallUsage,
    CancelRequest,
    MessageRecord,
    Regenerate,
    RunFailure,
    RunRecord,
    RunStatus,
    RunUsage,
    TurnOutcome,
    calls_json,
    message_values,
    run_record,
)
from ._tables import ONE_ACTIVE_RUN_INDEX, Hot, audit, events, messages, runs, threads
from ._tree import append_message, input_message, title_from_message

__all__ = ["RunStore", "CreatedRun"]

#: Statuses a cancel request moves to ``cancelling`` (a second request finds it there already).
_CANCELLABLE = (RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.WAITING_HUMAN)


@dataclass(frozen=True, slots=True, kw_only=True)
class CreatedRun:
    """A run as :meth:`RunStore.create_run` created it: ``queued``, or already ``running``."""

    run: RunRecord
    #: The run's input: a new user message, or the existing one whose answer it regenerates.
    input: MessageRecord
    #: What the transaction wrote to the log: ``run_started`` (seq 1), then, for a run created
    #: running, the first ``status``.
    events: list[StoredEvent]
    #: The first model turn's empty, ``partial`` assistant message (None for a queued run).
    first_turn: MessageRecord | None


class RunStore(EventStore):
    """Run operations of :class:`~tether.store.Store`."""

    async def create_run(
        self,
        *,
        thread_id: str,
        attach: Attach,
        config: dict[str, Any],
        owner: str | None = None,
        requested_by: str | None = None,
        running: bool = False,
        run_id: str | None = None,
    ) -> CreatedRun:
        """Create a run (``queued``), its input and its ``run_started`` event, atomically.

        ``attach`` says where its input goes: :class:`AtLeaf` (a new user message after the
        active leaf), :class:`Fork` (a new user message under ``parent_id``, ``None`` a new root:
        a parent other than the active leaf forks the thread) or :class:`Regenerate` (the input
        is the existing user message, and its answer becomes a sibling of the earlier answers).
        The active leaf moves to the run's input either way.

        With ``running`` (a process that executes the run at once: the server) the run is
        created already ``running``, and the same transaction writes what :meth:`mark_running`
        would when its executor starts: its first ``status`` event (``stage: "model"``) and its
        first model turn's empty, ``partial`` assistant message, which becomes the active leaf.
        One commit instead of two before the first token; the run never shows ``queued``.

        ``requested_by`` is the principal starting the run (who may decide its interrupts).
        ``run_id``: the new run's id, when the caller chose it (from :func:`tether._ids.new_id`).
        Raises :class:`NotFound` if the thread is missing or (given ``owner``) someone else's, and
        :class:`ThreadBusy` if it already has a non-terminal run (the partial unique index
        decides, so this holds across processes).
        """
        if self._direct is not None and isinstance(attach, AtLeaf) and not records("run"):
            # The usual start (a new message after the active leaf) on PostgreSQL: one statement.
            # Not under an Idempotency-Key: recording the run on the key needs a transaction.
            return await self._create_run_at_leaf_postgres(
                thread_id=thread_id, content=attach.content, config=config, owner=owner, requested_by=requested_by, running=running, run_id=run_id
            )
        async with self._writing() as conn:
            now = utcnow()
            run_id = run_id or new_id("run")
            thread_row = (await conn.execute(Hot.thread_by_id, {"thread_id": thread_id})).first()
            if thread_row is None or (owner is not None and thread_row.owner != owner):
                raise NotFound(f"thread {thread_id!r} not found", code="thread_not_found")
            message = await input_message(conn, attach, thread_id, thread_row.active_leaf_id, run_id, now)
            content = None if isinstance(attach, Regenerate) else attach.content
            lease = self._lease_values()
            status = RunStatus.RUNNING if running else RunStatus.QUEUED
            started_at = now if running else None
            run = _new_run(run_id, thread_id, status, config, message.id, now, started_at, lease, requested_by)
            try:
                # The first write of the transaction: if the partial unique index refuses it,
                # nothing else has been written and the whole transaction rolls back.
                await conn.execute(
                    Hot.insert_run,
                    {
                        "id": run_id,
                        "thread_id": thread_id,
                        "status": status.value,
                        "config": config,
                        "input_message_id": message.id,
                        "created_at": now,
                        "started_at": started_at,
                        "requested_by": requested_by,
                        **lease,
                    },
                )
            except IntegrityError:
                raise ThreadBusy(f"thread {thread_id!r} already has an active run") from None
            new_messages = [message] if content is not None else []
            written, first_turn = _first_writes(run_id, thread_id, message.id, now, running=running)
            if first_turn is not None:
                new_messages.append(first_turn)
            if new_messages:  # the input and the first turn in one statement (one round trip)
                await conn.execute(Hot.insert_message, [message_values(m) for m in new_messages])
            # The active leaf moves to the input, or past it to the first turn; a thread without
            # a title takes it from this (its first) message.
            leaf = {"of_thread": thread_id, "leaf_id": (first_turn or message).id, "now": now}
            if content is not None:
                await conn.execute(Hot.set_active_leaf_and_title, {**leaf, "title": title_from_message(content)})
            else:
                await conn.execute(Hot.set_active_leaf, leaf)
            await self._write_events(conn, run_id, written)
            # Under an Idempotency-Key: the key names this run, or the whole start rolls back.
            await record_created(conn, "run", run_id)
            return CreatedRun(run=run, input=message, events=written, first_turn=first_turn)

    async def _create_run_at_leaf_postgres(
        self, *, thread_id: str, content: str, config: dict[str, Any], owner: str | None, requested_by: str | None, running: bool, run_id: str | None
    ) -> CreatedRun:
        """:meth:`create_run` of a new message after the active leaf, on PostgreSQL: the same
        rows and notification in one statement, atomic on its own (autocommit), so one round
        trip instead of seven (``BEGIN``, five statements, ``COMMIT``): each waits its turn of a
        busy loop, and a crowd of starts waits for them all."""
        assert self._direct is not None
        now = utcnow()
        run_id = run_id or new_id("run")
        message_id = new_id("msg")
        written, first_turn = _first_writes(run_id, thread_id, message_id, now, running=running)
        first_turn_id = first_turn.id if first_turn is not None else None
        lease = self._lease_values()
        status = RunStatus.RUNNING if running else RunStatus.QUEUED
        started_at = now if running else None
        arguments = (
            thread_id,
            owner,
            run_id,
            status.value,
            json.dumps(config),
            message_id,
            now,
            started_at,
            requested_by,
            lease["executor_id"],
            lease["lease_expires_at"],
            content,
            first_turn_id,
            first_turn_id or message_id,
            [e.seq for e in written],
            [e.type for e in written],
            [e.envelope for e in written],
            channels.EVENTS_CHANNEL,
            channels.events_payloads(self.instance_id, [(run_id, written[-1].seq)]),
            title_from_message(content),
        )
        try:
            async with self._direct.connection() as direct:
                row = (await direct.exec_driver_sql(_CREATE_RUN_AT_LEAF_PG, arguments)).first()
        except IntegrityError as exc:
            if getattr(exc.orig, "constraint_name", None) == ONE_ACTIVE_RUN_INDEX:
                raise ThreadBusy(f"thread {thread_id!r} already has an active run") from None
            raise
        if row is None:  # no such thread (or not ``owner``'s): nothing was written
            raise NotFound(f"thread {thread_id!r} not found", code="thread_not_found")
        message = MessageRecord(id=message_id, thread_id=thread_id, parent_id=row[0], run_id=run_id, role="user", content=content, created_at=now)
        run = _new_run(run_id, thread_id, status, config, message_id, now, started_at, lease, requested_by)
        return CreatedRun(run=run, input=message, events=written, first_turn=first_turn)

    # -- reading ---------------------------------------------------------------------------

    async def get_run(self, run_id: str) -> RunRecord:
        """Read a run; :class:`NotFound` if missing."""
        async with self._point_reading() as conn:
            row = (await conn.execute(Hot.run_by_id, {"run_id": run_id})).first()
        if row is None:
            raise NotFound(f"run {run_id!r} not found", code="run_not_found")
        return run_record(row)

    async def runs_in_status(self, statuses: Sequence[str]) -> list[RunRecord]:
        """Runs currently in any of ``statuses``."""
        async with self._reading() as conn:
            return [run_record(r) for r in await conn.execute(runs.select().where(runs.c.status.in_(_values(statuses))))]

    async def list_runs(self, thread_id: str) -> list[RunRecord]:
        """A thread's runs, oldest first."""
        query = runs.select().where(runs.c.thread_id == thread_id).order_by(runs.c.created_at, runs.c.id)
        async with self._reading() as conn:
            return [run_record(r) for r in await conn.execute(query)]

    async def active_run_ids(self, thread_ids: Iterable[str]) -> dict[str, str]:
        """Map thread id → id of its non-terminal run, for those that have one."""
        ids = list(thread_ids)
        if not ids:
            return {}
        query = sa.select(runs.c.thread_id, runs.c.id).where(runs.c.thread_id.in_(ids), runs.c.status.in_(_values(ACTIVE_RUN_STATUSES)))
        async with self._reading() as conn:
            return {row.thread_id: row.id for row in await conn.execute(query)}

    async def count_active_runs(self, *, requested_by: str) -> int:
        """How many runs ``requested_by`` started are queued, running or being cancelled (a run
        waiting for a human holds nothing, so it does not count)."""
        async with self._point_reading() as conn:
            return int((await conn.execute(Hot.count_busy_runs, {"requested_by": requested_by})).scalar_one())

    async def count_runs_by_status(self) -> dict[str, int]:
        """How many runs are in each status (for ``/metrics``)."""
        query = sa.select(runs.c.status, sa.func.count()).group_by(runs.c.status)
        async with self._reading() as conn:
            return {row[0]: int(row[1]) for row in await conn.execute(query)}

    # -- transitions -----------------------------------------------------------------------

    async def mark_running(self, run_id: str, *, announce: StoredEvent | None = None, message: MessageRecord | None = None) -> bool:
        """``queued`` → ``running``; False if the run was not queued. ``announce`` (the run's
        next event) and ``message`` (its first model turn's assistant message, appended as by
        :meth:`add_message`) are written in the same transaction when the run starts, and only then."""
        async with self._writing() as conn:
            result = await conn.execute(Hot.mark_running, {"run_id": run_id, "now": utcnow()})
            if result.rowcount != 1:
                return False
            if announce is not None:
                await self._write_events(conn, run_id, [announce])
            if message is not None:
                await append_message(conn, message)
        return True

    async def add_usage(self, run_id: str, *, message_id: str, input_tokens: int, output_tokens: int) -> RunUsage:
        """Add one model call's token counts to the run's usage; returns the new usage."""
        async with self._writing() as conn:
            return await _add_usage(conn, run_id, message_id, input_tokens, output_tokens)

    async def set_trace_context(self, run_id: str, traceparent: str) -> bool:
        """Give the run the trace context its stretches continue, unless it has one already."""
        async with self._writing() as conn:
            result = await conn.execute(runs.update().where(runs.c.id == run_id, runs.c.trace_context.is_(None)).values(trace_context=traceparent))
            return bool(result.rowcount)

    async def store_turn(self, run_id: str, turn: TurnOutcome) -> None:
        """A model turn's final state and the tokens its call consumed, in one transaction."""
        async with self._writing() as conn:
            await _write_turn(conn, run_id, turn)

    async def request_cancel(self, run_id: str, *, mode: CancelMode, reason: str | None, actor: str, audited: bool = False) -> RunRecord:
        """Record a cancel request: active → ``cancelling``; a second hard request upgrades a soft one.

        ``audited``: the request's audit entry (``cancel`` by ``actor``) is written in the same
        transaction. Raises :class:`RunNotActive` when the run is already terminal (nothing is
        written then).
        """
        # A run that no process holds (one waiting for a human) is claimed by the request: this
        # process ends it, and until then no other may take it over as abandoned and write a
        # second ending into its log. A held claim stays with its holder.
        lease_until = sa.literal(self._lease_values()["lease_expires_at"], runs.c.lease_expires_at.type)
        unheld = runs.c.executor_id.is_(None)
        async with self._writing() as conn:
            # One statement in the usual case (an active run): the write hands back the row.
            row = (
                await conn.execute(
                    runs.update()
                    .where(runs.c.id == run_id, runs.c.status.in_(_values(_CANCELLABLE)))
                    .values(
                        status=RunStatus.CANCELLING.value,
                        cancel_mode=mode,
                        cancel_reason=reason,
                        cancel_actor=actor,
                        executor_id=sa.func.coalesce(runs.c.executor_id, self.instance_id),
                        lease_expires_at=sa.case((unheld, lease_until), else_=runs.c.lease_expires_at),
                    )
                    .returning(*runs.c)
                )
            ).first()
            if row is None and mode == "hard":  # already cancelling: a hard request upgrades a soft one
                upgrade = runs.update().where(runs.c.id == run_id, runs.c.status == RunStatus.CANCELLING.value).values(cancel_mode="hard")
                row = (await conn.execute(upgrade.returning(*runs.c))).first()
            if row is None:  # cancelling already, terminal, or missing
                row = (await conn.execute(runs.select().where(runs.c.id == run_id))).first()
            record = run_record(row) if row is not None else None
            if audited and record is not None and not record.terminal:
                entry = CancelRequest(mode=mode, reason=reason, actor=actor).audit_entry(record.thread_id, run_id, outcome="cancelling")
                await conn.execute(audit.insert(), [entry.values()])
        if record is None:
            raise NotFound(f"run {run_id!r} not found", code="run_not_found")
        if record.terminal:
            raise RunNotActive(f"run {run_id!r} is already {record.status}", details={"status": record.status.value})
        return record

    async def finish_run(
        self,
        run_id: str,
        *,
        status: str,
        final_event: StoredEvent,
        from_statuses: Sequence[str],
        error: RunFailure | None = None,
        events_before: Sequence[StoredEvent] = (),
        audit_entries: Sequence[AuditEntry] = (),
        last_turn: TurnOutcome | None = None,
        as_executor: bool = False,
        cancel: CancelRequest | None = None,
        if_cancel_mode: CancelMode | None = None,
    ) -> bool:
        """Move the run to a terminal ``status`` and append its terminal event, in one transaction.
        ``last_turn``, a model turn that ended with the run (one stopped by a cancel), is stored
        in it too. ``cancel`` (with ``as_executor``): the cancel request that ends the run is
        recorded by this same write (mode, reason, actor) instead of by a ``cancelling`` write
        of its own; its audit entry comes in ``audit_entries``. ``if_cancel_mode`` (with
        ``as_executor``): only while the recorded cancel mode is this one, the mode the
        terminal event states.

        Only succeeds while the run is in one of ``from_statuses``: this is what keeps a run that
        is being cancelled from ever being committed as ``completed``. With ``as_executor`` it
        also needs this process's claim on the run: an executor whose run was taken over (it
        stalled past its lease) cannot end it.
        """
        now = utcnow()
        values = {"run_id": run_id, **_from_statuses(from_statuses), "status": str(status), "now": now, "error": error.to_json() if error else None}
        async with self._writing() as conn:
            if as_executor and cancel is not None:
                request = {"cancel_mode_value": cancel.mode, "cancel_reason_value": cancel.reason, "cancel_actor_value": cancel.actor}
                result = await conn.execute(Hot.finish_run_cancelled_as_executor, {**values, **request, "held_by": self.instance_id})
            elif as_executor and if_cancel_mode is not None:
                result = await conn.execute(Hot.finish_cancelling_as_executor, {**values, "held_by": self.instance_id, "expected_cancel_mode": if_cancel_mode})
            elif as_executor:
                result = await conn.execute(Hot.finish_run_as_executor, {**values, "held_by": self.instance_id})
            else:
                result = await conn.execute(Hot.finish_run, values)
            if result.rowcount != 1:
                return False  # nothing was written
            # A terminal run has no pending interrupt: nothing can approve its actions any more.
            # (A `running` run has none: parking opens it and resolving closes it with the
            # status change, in one transaction each.)
            if tuple(from_statuses) != (RunStatus.RUNNING.value,):
                await conn.execute(Hot.cancel_pending_interrupts, {"of_run": run_id, "now": now})
            await self._write_events(conn, run_id, [*events_before, final_event])
            if audit_entries:
                await conn.execute(audit.insert(), [e.values() for e in audit_entries])
            if last_turn is not None:
                await _write_turn(conn, run_id, last_turn)
            if self.outbox is not None:
                await self.outbox.run_finished(conn, run_id, str(status))
        return True


def _first_writes(run_id: str, thread_id: str, input_id: str, now: datetime, *, running: bool) -> tuple[list[StoredEvent], MessageRecord | None]:
    """What a new run's creation writes besides the run and its input: ``run_started`` and,
    for a run created running, its first ``status`` and its first model turn's empty answer."""
    started = Envelope.wrap(run_id, 1, RunStarted(thread_id=thread_id, input_message_id=input_id), now)
    written = [StoredEvent(1, started.type, started.to_json())]
    if not running:
        return written, None
    announce = Envelope.wrap(run_id, 2, Status(stage="model", detail=None), now)
    written.append(StoredEvent(2, announce.type, announce.to_json()))
    return written, MessageRecord(
        id=new_id("msg"), thread_id=thread_id, parent_id=input_id, run_id=run_id, role="assistant", content="", status="partial", created_at=now
    )


#: :meth:`RunStore.create_run` of a new message after the active leaf, on PostgreSQL, as one
#: statement: the thread is read (``$2``, an owner, or NULL for any), and the run, its user
#: message (a child of the leaf read), the first turn's empty answer (when ``$13`` names it),
#: the thread's new leaf, the events and their notification are written only if it was found.
#: Data-modifying ``WITH`` parts run once each, on one snapshot; the foreign keys between the
#: rows they insert are checked at the end of the statement; the notification goes on commit.
#: Answers the leaf the message was attached to, or no row when the thread was not found.
_CREATE_RUN_AT_LEAF_PG = f"""
WITH thread AS (
    SELECT active_leaf_id FROM {threads.name} WHERE id = $1::varchar AND ($2::varchar IS NULL OR owner = $2::varchar)
), new_run AS (
    INSERT INTO {runs.name} (id, thread_id, status, config, input_message_id, created_at, started_at, requested_by, executor_id, lease_expires_at)
    SELECT $3::varchar, $1::varchar, $4::varchar, $5::json, $6::varchar, $7::timestamptz, $8::timestamptz, $9::varchar, $10::varchar, $11::timestamptz
    FROM thread
), new_messages AS (
    INSERT INTO {messages.name} (id, thread_id, parent_id, run_id, role, content, status, created_at)
    SELECT $6::varchar, $1::varchar, thread.active_leaf_id, $3::varchar, 'user', $12::text, 'complete', $7::timestamptz FROM thread
    UNION ALL
    SELECT $13::varchar, $1::varchar, $6::varchar, $3::varchar, 'assistant', '', 'partial', $7::timestamptz FROM thread WHERE $13::varchar IS NOT NULL
), new_leaf AS (
    UPDATE {threads.name} SET active_leaf_id = $14::varchar, updated_at = $7::timestamptz, title = COALESCE(title, $20::varchar)
    WHERE id = $1::varchar AND EXISTS (SELECT 1 FROM thread)
), new_events AS (
    INSERT INTO {events.name} (run_id, seq, type, envelope)
    SELECT $3::varchar, e.seq, e.type, e.envelope FROM thread, unnest($15::int[], $16::varchar[], $17::text[]) AS e(seq, type, envelope)
)
SELECT thread.active_leaf_id, pg_notify($18::text, payload) FROM thread, unnest($19::text[]) AS payload
"""


def _from_statuses(statuses: Sequence[str]) -> dict[str, str]:
    """``from_statuses`` as the values of ``Hot.finish_run``'s fixed list (padded with the first)."""
    given = _values(statuses)
    if not 0 < len(given) <= len(RunStatus):
        raise ValueError(f"from_statuses must name 1 to {len(RunStatus)} statuses")
    return {f"from_status_{i}": given[i] if i < len(given) else given[0] for i in range(len(RunStatus))}


def _values(statuses: Iterable[str]) -> list[str]:
    """Statuses as the plain strings the column holds (callers may pass :class:`RunStatus`)."""
    return [str(status) for status in statuses]


async def _write_turn(conn: Writing, run_id: str, turn: TurnOutcome) -> None:
    values: dict[str, Any] = {"message_id": turn.message_id, "content": turn.content, "status": turn.status, "finish_reason": turn.finish_reason}
    if turn.tool_calls is None:
        await conn.execute(Hot.store_turn, values)
    else:
        await conn.execute(Hot.store_turn_with_calls, {**values, "tool_calls": calls_json(turn.tool_calls)})
    await _add_usage(conn, run_id, turn.message_id, turn.input_tokens, turn.output_tokens)


async def _add_usage(conn: Writing, run_id: str, message_id: str, input_tokens: int, output_tokens: int) -> RunUsage:
    """Add one model call's tokens to the run's usage, in the caller's transaction. Only the
    run's executor writes it, one call at a time, so a read-modify-write is enough."""
    current = RunUsage.from_json((await conn.execute(Hot.run_usage, {"run_id": run_id})).scalar_one_or_none()) or RunUsage()
    usage = current.add(CallUsage(message_id=message_id, input_tokens=input_tokens, output_tokens=output_tokens))
    await conn.execute(Hot.set_run_usage, {"run_id": run_id, "usage": usage.to_json()})
    return usage


def _new_run(
    run_id: str,
    thread_id: str,
    status: RunStatus,
    config: dict[str, Any],
    input_message_id: str,
    now: datetime,
    started_at: datetime | None,
    lease: dict[str, Any],
    requested_by: str | None,
) -> RunRecord:
    """A run as its start creates it (either way it is started): no end, no cancel yet."""
    return RunRecord(
        id=run_id,
        thread_id=thread_id,
        status=status,
        config=config,
        input_message_id=input_message_id,
        created_at=now,
        started_at=started_at,
        ended_at=None,
        error=None,
        cancel_mode=None,
        cancel_reason=None,
        cancel_actor=None,
        **lease,
        requested_by=requested_by,
    )
