"""The durable store: threads, the message tree, runs and their event logs.

One code path for SQLite (the embedded default) and PostgreSQL: SQLAlchemy Core over an async
driver, schema created by Alembic migrations at open. State changes that must not race are
single conditional writes (``UPDATE … WHERE status IN (…)``) or database constraints, never
in-memory bookkeeping, so they hold across processes.

SQLite has one writer at a time; the store serialises its own write transactions with a lock
(as Datasette does) instead of letting them collide on ``SQLITE_BUSY``. Readers never wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, AsyncIterator, Iterable, Sequence

import sqlalchemy as sa
from sqlalchemy import event as sa_event
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from .._ids import as_utc, new_id, utcnow
from ..errors import InvalidRequest, NotFound, RunNotActive, ThreadBusy
from ..events import Envelope, RunStarted, format_ts
from ._review import AuditEntry, InterruptRecord, ReviewStoreMixin, args_digest
from .tables import ACTIVE_RUN_STATUSES, audit, events, interrupts, messages, runs, threads

__all__ = ["Store", "run_record", "InterruptRecord", "AuditEntry", "args_digest", "ThreadRecord", "RunRecord", "MessageRecord", "StoredEvent", "normalize_db_url", "TERMINAL_RUN_STATUSES"]

TERMINAL_RUN_STATUSES = ("completed", "failed", "cancelled")


def _ts(moment: datetime | None) -> str | None:
    return format_ts(moment) if moment is not None else None


@dataclass(frozen=True, slots=True)
class ThreadRecord:
    """A thread row."""

    id: str
    owner: str
    metadata: dict[str, Any]
    active_leaf_id: str | None
    created_at: datetime

    def to_api(self, *, active_run_id: str | None, pending_interrupt: Any = None) -> dict[str, Any]:
        """The thread as the HTTP API shows it."""
        return {
            "id": self.id,
            "owner": self.owner,
            "metadata": self.metadata,
            "active_leaf_id": self.active_leaf_id,
            "active_run_id": active_run_id,
            "pending_interrupt": pending_interrupt,
            "created_at": _ts(self.created_at),
        }


@dataclass(frozen=True, slots=True)
class RunRecord:
    """A run row."""

    id: str
    thread_id: str
    status: str
    config: dict[str, Any]
    input_message_id: str | None
    created_at: datetime
    started_at: datetime | None
    ended_at: datetime | None
    error: dict[str, Any] | None
    cancel_mode: str | None
    cancel_reason: str | None
    cancel_actor: str | None
    #: The process executing the run (None while it waits for a human, or once it ended).
    executor_id: str | None = None
    lease_expires_at: datetime | None = None

    @property
    def terminal(self) -> bool:
        """True once the run is completed, failed or cancelled."""
        return self.status in TERMINAL_RUN_STATUSES

    def to_api(self, *, pending_interrupt: Any = None) -> dict[str, Any]:
        """The run as the HTTP API shows it."""
        return {
            "id": self.id,
            "thread_id": self.thread_id,
            "status": self.status,
            "config": self.config,
            "input_message_id": self.input_message_id,
            "created_at": _ts(self.created_at),
            "started_at": _ts(self.started_at),
            "ended_at": _ts(self.ended_at),
            "error": self.error,
            "cancel": (
                {"mode": self.cancel_mode, "reason": self.cancel_reason, "actor": self.cancel_actor}
                if self.cancel_mode
                else None
            ),
            "pending_interrupt": pending_interrupt,
        }


@dataclass(frozen=True, slots=True)
class MessageRecord:
    """A message row (a node of the thread's message tree)."""

    id: str
    thread_id: str
    parent_id: str | None
    run_id: str | None
    role: str
    content: str
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    status: str = "complete"
    created_at: datetime = field(default_factory=utcnow)
    #: Set on a user's edited version of an assistant message: the message it replaces.
    edited_from_id: str | None = None

    def to_api(self, *, sibling_ids: Sequence[str] | None = None) -> dict[str, Any]:
        """The message as the HTTP API shows it."""
        siblings = list(sibling_ids) if sibling_ids is not None else [self.id]
        return {
            "id": self.id,
            "thread_id": self.thread_id,
            "parent_id": self.parent_id,
            "run_id": self.run_id,
            "role": self.role,
            "content": self.content,
            "tool_calls": self.tool_calls,
            "tool_call_id": self.tool_call_id,
            "name": self.name,
            "status": self.status,
            "created_at": _ts(self.created_at),
            "edited_by_user": self.edited_from_id is not None,
            "edited_from_id": self.edited_from_id,
            "sibling_ids": siblings,
            "sibling_index": siblings.index(self.id) if self.id in siblings else 0,
        }


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """One stored event: its seq, type and canonical envelope JSON."""

    seq: int
    type: str
    envelope: str


def normalize_db_url(url: str) -> str:
    """Accept ``sqlite:///path`` and ``postgresql://…`` and pick the async drivers."""
    if url.startswith("sqlite:///") or url == "sqlite://":
        return "sqlite+aiosqlite" + url[len("sqlite") :]
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+asyncpg://" + url.split("://", 1)[1]
    return url


def _has_active_run(thread_id: str) -> sa.Exists:
    return sa.exists().where(runs.c.thread_id == thread_id, runs.c.status.in_(ACTIVE_RUN_STATUSES))


def _thread(row: Any) -> ThreadRecord:
    return ThreadRecord(row.id, row.owner, row.metadata or {}, row.active_leaf_id, as_utc(row.created_at))  # type: ignore[arg-type]


def run_record(row: Any) -> RunRecord:
    """A :class:`RunRecord` from a ``runs`` row."""
    return RunRecord(
        id=row.id,
        thread_id=row.thread_id,
        status=row.status,
        config=row.config or {},
        input_message_id=row.input_message_id,
        created_at=as_utc(row.created_at),  # type: ignore[arg-type]
        started_at=as_utc(row.started_at),
        ended_at=as_utc(row.ended_at),
        error=row.error,
        cancel_mode=row.cancel_mode,
        cancel_reason=row.cancel_reason,
        cancel_actor=row.cancel_actor,
        executor_id=row.executor_id,
        lease_expires_at=row.lease_expires_at,
    )


def _message(row: Any) -> MessageRecord:
    return MessageRecord(
        id=row.id,
        thread_id=row.thread_id,
        parent_id=row.parent_id,
        run_id=row.run_id,
        role=row.role,
        content=row.content,
        tool_calls=row.tool_calls,
        tool_call_id=row.tool_call_id,
        name=row.name,
        status=row.status,
        created_at=as_utc(row.created_at),  # type: ignore[arg-type]
        edited_from_id=row.edited_from_id,
    )


async def _splits_a_tool_turn(conn: AsyncConnection, parent: MessageRecord) -> bool:
    """True if ``parent`` is an assistant message with tool calls, or a tool result that is not
    the last of its turn: a message attached there would put a tool call without its result on
    the path, a history no model accepts."""
    answered: set[str | None] = set()
    cursor: MessageRecord | None = parent
    while cursor is not None and cursor.role == "tool":
        answered.add(cursor.tool_call_id)
        row = (await conn.execute(messages.select().where(messages.c.id == cursor.parent_id))).first() if cursor.parent_id else None
        cursor = _message(row) if row is not None else None
    if cursor is None or cursor.role != "assistant" or not cursor.tool_calls:
        return False
    return any(call["id"] not in answered for call in cursor.tool_calls)


def _message_values(message: MessageRecord) -> dict[str, Any]:
    return {
        "id": message.id,
        "thread_id": message.thread_id,
        "parent_id": message.parent_id,
        "run_id": message.run_id,
        "role": message.role,
        "content": message.content,
        "tool_calls": message.tool_calls,
        "tool_call_id": message.tool_call_id,
        "name": message.name,
        "status": message.status,
        "created_at": message.created_at,
        "edited_from_id": message.edited_from_id,
    }


class Store(ReviewStoreMixin):
    """Async access to Tether's tables. Open with :meth:`open`, close with :meth:`aclose`."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self.is_sqlite = engine.dialect.name == "sqlite"
        #: This process's identity: it owns the runs it executes (``runs.executor_id``) and
        #: tags its notifications so it can ignore its own.
        self.instance_id = new_id("proc")
        #: How long a run's claim lasts without renewal (another process may then take it over).
        self.lease_s = 10.0
        # SQLite allows one writer; serialise ours rather than collide on SQLITE_BUSY.
        self._write_lock: asyncio.Lock | None = asyncio.Lock() if self.is_sqlite else None

    # -- lifecycle -------------------------------------------------------------------------

    @classmethod
    async def open(cls, url: str) -> Store:
        """Connect to ``url`` and bring the schema up to date (creating a SQLite file if needed)."""
        url = normalize_db_url(url)
        kwargs: dict[str, Any] = {}
        if url.startswith("sqlite"):
            path = sa.engine.make_url(url).database
            if path and path != ":memory:":
                Path(path).expanduser().parent.mkdir(parents=True, exist_ok=True)
            kwargs["connect_args"] = {"timeout": 30}
        else:
            kwargs.update(pool_size=5, max_overflow=10, pool_pre_ping=True)
        engine = create_async_engine(url, **kwargs)
        if engine.dialect.name == "sqlite":
            sa_event.listen(engine.sync_engine, "connect", _sqlite_pragmas)
        store = cls(engine)
        await store.migrate()
        return store

    async def migrate(self) -> None:
        """Apply pending Alembic migrations."""
        from alembic import command
        from alembic.config import Config

        cfg = Config()
        cfg.set_main_option("script_location", str(Path(__file__).parent / "migrations"))

        def upgrade(sync_conn: sa.Connection) -> None:
            cfg.attributes["connection"] = sync_conn
            command.upgrade(cfg, "head")

        # Stores opening one database at once (server processes starting together) must not
        # both create the tables: the first migrates under a database lock, the others then
        # find the schema at head. Alembic's ``context`` is process-global, so two upgrades
        # interleaving on one event loop (or in two threads) also clobber each other.
        await self._under_schema_lock(upgrade)

    async def create_tables(self, metadata: sa.MetaData) -> None:
        """Create an agent's own tables if missing (safe when several processes start at once)."""
        await self._under_schema_lock(metadata.create_all)

    async def _under_schema_lock(self, fn: Any) -> None:
        async with _process_migration_lock():
            async with self._writing() as conn:
                if self.is_sqlite:
                    # The write lock now, before anything reads the schema (pysqlite would
                    # only BEGIN at the first DML, leaving DDL in autocommit).
                    await conn.exec_driver_sql("BEGIN IMMEDIATE")
                else:
                    await conn.execute(sa.select(sa.func.pg_advisory_xact_lock(_MIGRATION_LOCK_KEY)))
                await conn.run_sync(fn)

    async def aclose(self) -> None:
        """Dispose of the connection pool."""
        await self.engine.dispose()

    @contextlib.asynccontextmanager
    async def _writing(self) -> AsyncIterator[AsyncConnection]:
        if self._write_lock is None:
            async with self.engine.begin() as conn:
                yield conn
            return
        async with self._write_lock:
            async with self.engine.begin() as conn:
                yield conn

    @contextlib.asynccontextmanager
    async def _reading(self) -> AsyncIterator[AsyncConnection]:
        async with self.engine.connect() as conn:
            yield conn

    # -- threads ---------------------------------------------------------------------------

    async def create_thread(self, *, owner: str, metadata: dict[str, Any] | None = None) -> ThreadRecord:
        """Create an empty thread."""
        now = utcnow()
        record = ThreadRecord(new_id("thr"), owner, dict(metadata or {}), None, now)
        async with self._writing() as conn:
            await conn.execute(
                threads.insert().values(
                    id=record.id, owner=owner, metadata=record.metadata, active_leaf_id=None, created_at=now, updated_at=now
                )
            )
        return record

    async def get_thread(self, thread_id: str, *, owner: str | None = None) -> ThreadRecord:
        """Read a thread; :class:`NotFound` if missing or owned by someone else."""
        async with self._reading() as conn:
            row = (await conn.execute(threads.select().where(threads.c.id == thread_id))).first()
        if row is None or (owner is not None and row.owner != owner):
            raise NotFound(f"thread {thread_id!r} not found", code="thread_not_found")
        return _thread(row)

    async def list_threads(self, *, owner: str | None = None, limit: int = 100) -> list[ThreadRecord]:
        """Threads, newest first."""
        query = threads.select().order_by(threads.c.created_at.desc(), threads.c.id.desc()).limit(limit)
        if owner is not None:
            query = query.where(threads.c.owner == owner)
        async with self._reading() as conn:
            return [_thread(row) for row in await conn.execute(query)]

    async def active_run_ids(self, thread_ids: Iterable[str]) -> dict[str, str]:
        """Map thread id → id of its non-terminal run, for those that have one."""
        ids = list(thread_ids)
        if not ids:
            return {}
        query = sa.select(runs.c.thread_id, runs.c.id).where(
            runs.c.thread_id.in_(ids), runs.c.status.in_(ACTIVE_RUN_STATUSES)
        )
        async with self._reading() as conn:
            return {row.thread_id: row.id for row in await conn.execute(query)}

    # -- messages --------------------------------------------------------------------------

    async def get_message(self, message_id: str) -> MessageRecord:
        """Read one message."""
        async with self._reading() as conn:
            row = (await conn.execute(messages.select().where(messages.c.id == message_id))).first()
        if row is None:
            raise NotFound(f"message {message_id!r} not found", code="message_not_found")
        return _message(row)

    async def thread_messages(self, thread_id: str) -> list[MessageRecord]:
        """Every message of a thread (the whole tree), oldest first."""
        query = messages.select().where(messages.c.thread_id == thread_id).order_by(messages.c.created_at, messages.c.id)
        async with self._reading() as conn:
            return [_message(row) for row in await conn.execute(query)]

    async def path_to(self, thread_id: str, leaf_id: str | None) -> list[MessageRecord]:
        """The chain of messages from the root to ``leaf_id`` (inclusive)."""
        if leaf_id is None:
            return []
        by_id = {m.id: m for m in await self.thread_messages(thread_id)}
        path: list[MessageRecord] = []
        cursor: str | None = leaf_id
        while cursor is not None:
            message = by_id.get(cursor)
            if message is None:
                break
            path.append(message)
            cursor = message.parent_id
        path.reverse()
        return path

    async def add_message(self, message: MessageRecord) -> MessageRecord:
        """Append a message to its thread and make it the active leaf."""
        async with self._writing() as conn:
            await conn.execute(messages.insert().values(**_message_values(message)))
            await conn.execute(
                threads.update()
                .where(threads.c.id == message.thread_id)
                .values(active_leaf_id=message.id, updated_at=utcnow())
            )
        return message

    async def move_active_leaf(self, thread_id: str, message_id: str | None) -> None:
        """Point the thread at ``message_id`` (recovery only: no busy check)."""
        async with self._writing() as conn:
            await conn.execute(threads.update().where(threads.c.id == thread_id).values(active_leaf_id=message_id, updated_at=utcnow()))

    async def update_message(
        self,
        message_id: str,
        *,
        content: str | None = None,
        status: str | None = None,
        tool_calls: list[dict[str, Any]] | None = None,
    ) -> None:
        """Change a message's content, status or tool calls (a turn being finished)."""
        values: dict[str, Any] = {}
        if content is not None:
            values["content"] = content
        if status is not None:
            values["status"] = status
        if tool_calls is not None:
            values["tool_calls"] = tool_calls
        if values:
            async with self._writing() as conn:
                await conn.execute(messages.update().where(messages.c.id == message_id).values(**values))

    # -- runs ------------------------------------------------------------------------------

    async def create_run(
        self,
        *,
        thread_id: str,
        content: str | None,
        parent_id: str | None,
        use_active_leaf: bool,
        config: dict[str, Any],
    ) -> tuple[RunRecord, MessageRecord, StoredEvent]:
        """Create a queued run, its input and its ``run_started`` event, atomically.

        With ``content``: a new user message, child of the active leaf (``use_active_leaf``) or
        of ``parent_id`` (``None`` = a new root: editing the first message). A parent other than
        the active leaf forks the thread. Without ``content`` the run *regenerates*: its input
        is the existing user message ``parent_id`` and its answer becomes a sibling of the
        earlier answers. The active leaf moves to the run's input either way.

        Raises :class:`ThreadBusy` if the thread already has a non-terminal run (the partial
        unique index decides, so this holds across processes).
        """
        now = utcnow()
        run_id = new_id("run")
        async with self._writing() as conn:
            thread_row = (await conn.execute(threads.select().where(threads.c.id == thread_id))).first()
            if thread_row is None:
                raise NotFound(f"thread {thread_id!r} not found", code="thread_not_found")
            if use_active_leaf:
                parent_id = thread_row.active_leaf_id
            parent = None
            if parent_id is not None:
                row = (await conn.execute(messages.select().where(messages.c.id == parent_id))).first()
                if row is None or row.thread_id != thread_id:
                    raise InvalidRequest(
                        f"parent_id {parent_id!r} is not a message of thread {thread_id!r}",
                        code="invalid_parent",
                        details=[{"loc": ["body", "parent_id"], "msg": "not a message of this thread", "type": "invalid_parent"}],
                    )
                parent = _message(row)
                if content is not None and not use_active_leaf and await _splits_a_tool_turn(conn, parent):
                    raise InvalidRequest(
                        f"parent_id {parent_id!r} is inside a tool turn: a message there would leave a tool call without its result",
                        code="invalid_parent",
                        details=[{"loc": ["body", "parent_id"], "msg": "a tool call above it has no result yet", "type": "invalid_parent"}],
                    )
            if content is None and (parent is None or parent.role != "user"):
                raise InvalidRequest(
                    "a run without input regenerates an answer: parent_id must be a user message of this thread",
                    code="input_required",
                    details=[{"loc": ["body", "input"], "msg": "input.content is required unless parent_id is a user message", "type": "missing"}],
                )
            input_id = new_id("msg") if content is not None else parent.id  # type: ignore[union-attr]
            lease = self._lease_values()
            run = RunRecord(run_id, thread_id, "queued", config, input_id, now, None, None, None, None, None, None, **lease)
            try:
                # The first write of the transaction: if the partial unique index refuses it,
                # nothing else has been written and the whole transaction rolls back.
                await conn.execute(
                    runs.insert().values(
                        id=run_id, thread_id=thread_id, status="queued", config=config,
                        input_message_id=input_id, created_at=now, **lease,
                    )
                )
            except IntegrityError:
                raise ThreadBusy(f"thread {thread_id!r} already has an active run") from None
            if content is not None:
                message = MessageRecord(input_id, thread_id, parent_id, run_id, "user", content, created_at=now)
                await conn.execute(messages.insert().values(**_message_values(message)))
            else:
                message = parent  # type: ignore[assignment]
            await conn.execute(
                threads.update().where(threads.c.id == thread_id).values(active_leaf_id=input_id, updated_at=now)
            )
            started = Envelope.wrap(run_id, 1, RunStarted(thread_id=thread_id, input_message_id=input_id), now)
            stored = StoredEvent(1, started.type, started.to_json())
            await conn.execute(events.insert().values(run_id=run_id, seq=1, type=stored.type, envelope=stored.envelope))
            await self._announce(conn, run_id, 1)
        return run, message, stored  # type: ignore[return-value]

    async def set_active_leaf(self, thread_id: str, message_id: str) -> str:
        """Switch the thread to the branch of ``message_id`` (its deepest, newest leaf).

        Refused with :class:`ThreadBusy` while a run of the thread is not terminal: the check
        and the switch are one conditional write.
        """
        all_messages = await self.thread_messages(thread_id)
        by_id = {m.id: m for m in all_messages}
        if message_id not in by_id:
            raise NotFound(f"message {message_id!r} not found in thread {thread_id!r}", code="message_not_found")
        newest_child: dict[str, str] = {}
        for m in all_messages:  # oldest first: the last child seen is the newest
            if m.parent_id is not None:
                newest_child[m.parent_id] = m.id
        leaf = message_id
        while leaf in newest_child:
            leaf = newest_child[leaf]
        async with self._writing() as conn:
            result = await conn.execute(
                threads.update()
                .where(threads.c.id == thread_id, ~_has_active_run(thread_id))
                .values(active_leaf_id=leaf, updated_at=utcnow())
            )
        if result.rowcount != 1:
            raise ThreadBusy(f"thread {thread_id!r} has an active run; switch branches after it ends")
        return leaf

    async def add_edited_version(self, message_id: str, content: str) -> MessageRecord:
        """Store a user's edit of an assistant message as a new sibling and make it active.

        The edited version keeps the text only (no tool calls), so the active path never holds
        a tool call without its result. Refused with :class:`ThreadBusy` during a run.
        """
        original = await self.get_message(message_id)
        if original.role != "assistant":
            raise InvalidRequest(
                "only assistant messages can be edited this way; to change a user message, fork with a new run",
                code="not_an_assistant_message",
                details=[{"loc": ["path", "message_id"], "msg": f"message role is {original.role}", "type": "role"}],
            )
        edited = MessageRecord(
            new_id("msg"), original.thread_id, original.parent_id, None, "assistant", content,
            status="complete", edited_from_id=original.id,
        )
        async with self._writing() as conn:
            result = await conn.execute(
                threads.update()
                .where(threads.c.id == original.thread_id, ~_has_active_run(original.thread_id))
                .values(active_leaf_id=edited.id, updated_at=utcnow())
            )
            if result.rowcount != 1:
                raise ThreadBusy(f"thread {original.thread_id!r} has an active run; edit after it ends")
            await conn.execute(messages.insert().values(**_message_values(edited)))
        return edited

    async def get_run(self, run_id: str) -> RunRecord:
        """Read a run; :class:`NotFound` if missing."""
        async with self._reading() as conn:
            row = (await conn.execute(runs.select().where(runs.c.id == run_id))).first()
        if row is None:
            raise NotFound(f"run {run_id!r} not found", code="run_not_found")
        return run_record(row)

    async def runs_in_status(self, statuses: Sequence[str]) -> list[RunRecord]:
        """Runs currently in any of ``statuses``."""
        async with self._reading() as conn:
            return [run_record(r) for r in await conn.execute(runs.select().where(runs.c.status.in_(statuses)))]

    async def list_runs(self, thread_id: str) -> list[RunRecord]:
        """A thread's runs, oldest first."""
        query = runs.select().where(runs.c.thread_id == thread_id).order_by(runs.c.created_at, runs.c.id)
        async with self._reading() as conn:
            return [run_record(r) for r in await conn.execute(query)]

    async def mark_running(self, run_id: str) -> bool:
        """``queued`` → ``running``; False if the run was not queued."""
        async with self._writing() as conn:
            result = await conn.execute(
                runs.update()
                .where(runs.c.id == run_id, runs.c.status == "queued")
                .values(status="running", started_at=utcnow())
            )
        return result.rowcount == 1

    async def request_cancel(self, run_id: str, *, mode: str, reason: str | None, actor: str) -> RunRecord:
        """Record a cancel request: active → ``cancelling``; a second hard request upgrades a soft one.

        Raises :class:`RunNotActive` when the run is already terminal.
        """
        async with self._writing() as conn:
            await conn.execute(
                runs.update()
                .where(runs.c.id == run_id, runs.c.status.in_(("queued", "running", "waiting_human")))
                .values(status="cancelling", cancel_mode=mode, cancel_reason=reason, cancel_actor=actor)
            )
            if mode == "hard":
                await conn.execute(
                    runs.update().where(runs.c.id == run_id, runs.c.status == "cancelling").values(cancel_mode="hard")
                )
            row = (await conn.execute(runs.select().where(runs.c.id == run_id))).first()
        if row is None:
            raise NotFound(f"run {run_id!r} not found", code="run_not_found")
        record = run_record(row)
        if record.terminal:
            raise RunNotActive(f"run {run_id!r} is already {record.status}", details={"status": record.status})
        return record

    async def finish_run(
        self,
        run_id: str,
        *,
        status: str,
        final_event: StoredEvent,
        from_statuses: Sequence[str],
        error: dict[str, Any] | None = None,
        events_before: Sequence[StoredEvent] = (),
        audit_entries: Sequence[AuditEntry] = (),
        as_executor: bool = False,
    ) -> bool:
        """Move the run to a terminal ``status`` and append its terminal event, in one transaction.

        Only succeeds while the run is in one of ``from_statuses``: this is what keeps a run that
        is being cancelled from ever being committed as ``completed``. With ``as_executor`` it
        also needs this process's claim on the run: an executor whose run was taken over (it
        stalled past its lease) cannot end it.
        """
        condition = [runs.c.id == run_id, runs.c.status.in_(from_statuses)]
        if as_executor:
            condition.append(runs.c.executor_id == self.instance_id)
        async with self._writing() as conn:
            result = await conn.execute(
                runs.update().where(*condition).values(status=status, ended_at=utcnow(), error=error)
            )
            if result.rowcount != 1:
                return False  # nothing was written
            # A terminal run has no pending interrupt: nothing can approve its actions any more.
            await conn.execute(
                interrupts.update()
                .where(interrupts.c.run_id == run_id, interrupts.c.status == "pending")
                .values(status="cancelled", resolved_at=utcnow())
            )
            await conn.execute(
                events.insert(),
                [
                    {"run_id": run_id, "seq": e.seq, "type": e.type, "envelope": e.envelope}
                    for e in (*events_before, final_event)
                ],
            )
            await self._announce(conn, run_id, final_event.seq)
            if audit_entries:
                await conn.execute(audit.insert(), [e.values() for e in audit_entries])
        return True

    async def count_runs_by_status(self) -> dict[str, int]:
        """How many runs are in each status (for ``/metrics``)."""
        query = sa.select(runs.c.status, sa.func.count()).group_by(runs.c.status)
        async with self._reading() as conn:
            return {row[0]: int(row[1]) for row in await conn.execute(query)}

    # -- events ----------------------------------------------------------------------------

    async def append_events(self, run_id: str, batch: Sequence[StoredEvent]) -> None:
        """Append a batch of events in one transaction (the group commit)."""
        if not batch:
            return
        async with self._writing() as conn:
            if self.is_sqlite:
                await _insert_events_sqlite(conn, run_id, batch)
                return
            await conn.execute(
                events.insert(),
                [{"run_id": run_id, "seq": e.seq, "type": e.type, "envelope": e.envelope} for e in batch],
            )
            await self._announce(conn, run_id, batch[-1].seq)

    async def read_events(self, run_id: str, *, after_seq: int = 0, limit: int = 1000) -> list[StoredEvent]:
        """Events with ``seq > after_seq``, in order."""
        query = (
            sa.select(events.c.seq, events.c.type, events.c.envelope)
            .where(events.c.run_id == run_id, events.c.seq > after_seq)
            .order_by(events.c.seq)
            .limit(limit)
        )
        async with self._reading() as conn:
            return [StoredEvent(r.seq, r.type, r.envelope) for r in await conn.execute(query)]

    async def last_seq(self, run_id: str) -> int:
        """The highest ``seq`` of a run (0 if none)."""
        async with self._reading() as conn:
            value = (await conn.execute(sa.select(sa.func.max(events.c.seq)).where(events.c.run_id == run_id))).scalar()
        return int(value or 0)

    # -- cross-process signals (PostgreSQL; nothing to do on single-process SQLite) ---------

    async def _announce(self, conn: AsyncConnection, run_id: str, seq: int) -> None:
        """Tell other processes, on commit, that ``run_id`` has events up to ``seq``."""
        if not self.is_sqlite:
            payload = f"{self.instance_id} {run_id} {seq}"
            await conn.execute(sa.select(sa.func.pg_notify("tether_events", payload)))

    async def send_control(self, message: dict[str, Any]) -> None:
        """Send a small command to every other process (e.g. cancel a run it executes)."""
        if self.is_sqlite:
            return
        payload = json.dumps({**message, "origin": self.instance_id})
        async with self._writing() as conn:
            await conn.execute(sa.select(sa.func.pg_notify("tether_control", payload)))

    # -- leases: which process executes a run --------------------------------------------

    def _lease_values(self) -> dict[str, Any]:
        return {"executor_id": self.instance_id, "lease_expires_at": utcnow() + timedelta(seconds=self.lease_s)}

    async def renew_leases(self, run_ids: Sequence[str]) -> set[str]:
        """Extend this process's claim on the runs it executes; returns the runs it still holds
        (a run missing from the answer was taken over by another process)."""
        if not run_ids:
            return set()
        async with self._writing() as conn:
            result = await conn.execute(
                runs.update()
                .where(runs.c.id.in_(list(run_ids)), runs.c.executor_id == self.instance_id)
                .values(lease_expires_at=utcnow() + timedelta(seconds=self.lease_s))
                .returning(runs.c.id)
            )
            return {row[0] for row in result}

    async def claim_abandoned(self, *, limit: int = 20) -> list[RunRecord]:
        """Claim runs that need an executor and whose claim has lapsed (the process that
        executed them died). Each is claimed by one conditional write: exactly one process
        wins it."""
        now = utcnow()
        query = (
            runs.select()
            .where(
                runs.c.status.in_(("queued", "running", "cancelling")),
                sa.or_(runs.c.lease_expires_at.is_(None), runs.c.lease_expires_at < now),
            )
            .limit(limit)
        )
        async with self._reading() as conn:
            candidates = (await conn.execute(query)).all()
        claimed: list[RunRecord] = []
        for row in candidates:
            async with self._writing() as conn:
                result = await conn.execute(
                    runs.update()
                    .where(
                        runs.c.id == row.id,
                        runs.c.status.in_(("queued", "running", "cancelling")),
                        sa.or_(runs.c.lease_expires_at.is_(None), runs.c.lease_expires_at < now),
                    )
                    .values(**self._lease_values())
                )
                if result.rowcount == 1:
                    fresh = (await conn.execute(runs.select().where(runs.c.id == row.id))).first()
                    claimed.append(run_record(fresh))
        return claimed

    async def claim_all_active(self) -> list[RunRecord]:
        """Single-process start-up (SQLite): every run that needs an executor is ours."""
        async with self._writing() as conn:
            await conn.execute(
                runs.update().where(runs.c.status.in_(("queued", "running", "cancelling"))).values(**self._lease_values())
            )
            rows = (await conn.execute(runs.select().where(runs.c.status.in_(("queued", "running", "cancelling"))))).all()
        return [run_record(r) for r in rows]

    # -- for agents' own tables ------------------------------------------------------------

    def transaction(self) -> contextlib.AbstractAsyncContextManager[AsyncConnection]:
        """A write transaction (serialised on SQLite), for an agent's own tables."""
        return self._writing()

    def connection(self) -> contextlib.AbstractAsyncContextManager[AsyncConnection]:
        """A read connection, for an agent's own tables."""
        return self._reading()


#: PostgreSQL advisory lock key held while migrating (any constant; "tether" in ASCII).
_MIGRATION_LOCK_KEY = 0x746574686572
_MIGRATION_LOCK = threading.Lock()


@contextlib.asynccontextmanager
async def _process_migration_lock() -> AsyncIterator[None]:
    """One migration at a time in this process, across event loops and threads.

    Polled rather than acquired in a worker thread, so a cancelled open never leaves the lock
    taken by a thread nobody waits for.
    """
    while not _MIGRATION_LOCK.acquire(blocking=False):
        await asyncio.sleep(0.005)
    try:
        yield
    finally:
        _MIGRATION_LOCK.release()


# Bound parameters one SQLite statement may take (SQLITE_MAX_VARIABLE_NUMBER: 999 before 3.32).
_SQLITE_MAX_VARIABLES = 32766 if sqlite3.sqlite_version_info >= (3, 32, 0) else 999
_EVENT_COLUMNS = ("run_id", "seq", "type", "envelope")
_SQLITE_EVENT_ROWS_PER_INSERT = min(_SQLITE_MAX_VARIABLES // len(_EVENT_COLUMNS), 2000)


async def _insert_events_sqlite(conn: AsyncConnection, run_id: str, batch: Sequence[StoredEvent]) -> None:
    """Insert a batch with one multi-row ``INSERT`` per chunk, not an ``executemany``.

    aiosqlite runs SQLite in its own thread, and ``executemany`` binds and steps row by row,
    taking the GIL back for each row. While the event loop is busy (a model streaming tokens,
    which is exactly when batches are big), every one of those handoffs waits for the loop
    thread: a 4,000-row commit took 120-400 ms instead of 15. One statement per chunk binds
    once and steps once, and skips SQLAlchemy's per-row parameter processing too.
    """
    rows = _SQLITE_EVENT_ROWS_PER_INSERT
    head = f"INSERT INTO {events.name} ({', '.join(_EVENT_COLUMNS)}) VALUES "
    for start in range(0, len(batch), rows):
        chunk = batch[start : start + rows]
        params: list[Any] = []
        for e in chunk:
            params += (run_id, e.seq, e.type, e.envelope)
        await conn.exec_driver_sql(head + ",".join(["(?,?,?,?)"] * len(chunk)), tuple(params))


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.close()

