"""The store's threads and their message trees.

Every message has a ``parent_id``; a thread's ``active_leaf_id`` picks one path from the root.
Forks, regenerated answers and a user's edits add siblings; switching branches moves the active
leaf. Moves that must not happen during a run (switching branches, storing an edit) are one
conditional write: ``UPDATE threads … WHERE NOT EXISTS (an active run)``.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from .._ids import new_id, utcnow
from ..errors import Conflict, FieldError, InvalidRequest, NotFound, ThreadBusy
from ._engine import StoreBase
from ._records import MessageRecord, ThreadRecord, message_record, message_values, thread_record
from ._tables import has_active_run, messages, threads

__all__ = ["TreeStore", "splits_a_tool_turn"]


class TreeStore(StoreBase):
    """Thread and message operations of :class:`~tether.store.Store`."""

    # -- threads ---------------------------------------------------------------------------

    async def create_thread(self, *, owner: str, metadata: dict[str, Any] | None = None, thread_id: str | None = None) -> ThreadRecord:
        """Create an empty thread; with ``thread_id`` under that id (an AG-UI client names its
        threads), :class:`~tether.errors.Conflict` ``thread_exists`` if it is taken."""
        now = utcnow()
        record = ThreadRecord(thread_id or new_id("thr"), owner, dict(metadata or {}), None, now)
        try:
            async with self._writing() as conn:
                await conn.execute(
                    threads.insert().values(id=record.id, owner=owner, metadata=record.metadata, active_leaf_id=None, created_at=now, updated_at=now)
                )
        except IntegrityError:
            if thread_id is None:
                raise
            raise Conflict(f"thread {thread_id!r} already exists", code="thread_exists") from None
        return record

    async def get_thread(self, thread_id: str, *, owner: str | None = None) -> ThreadRecord:
        """Read a thread; :class:`NotFound` if missing or owned by someone else."""
        async with self._reading() as conn:
            row = (await conn.execute(threads.select().where(threads.c.id == thread_id))).first()
        if row is None or (owner is not None and row.owner != owner):
            raise NotFound(f"thread {thread_id!r} not found", code="thread_not_found")
        return thread_record(row)

    async def list_threads(self, *, owner: str | None = None, limit: int = 100) -> list[ThreadRecord]:
        """Threads, newest first."""
        query = threads.select().order_by(threads.c.created_at.desc(), threads.c.id.desc()).limit(limit)
        if owner is not None:
            query = query.where(threads.c.owner == owner)
        async with self._reading() as conn:
            return [thread_record(row) for row in await conn.execute(query)]

    # -- messages --------------------------------------------------------------------------

    async def get_message(self, message_id: str) -> MessageRecord:
        """Read one message."""
        async with self._reading() as conn:
            row = (await conn.execute(messages.select().where(messages.c.id == message_id))).first()
        if row is None:
            raise NotFound(f"message {message_id!r} not found", code="message_not_found")
        return message_record(row)

    async def thread_messages(self, thread_id: str) -> list[MessageRecord]:
        """Every message of a thread (the whole tree), oldest first."""
        query = messages.select().where(messages.c.thread_id == thread_id).order_by(messages.c.created_at, messages.c.id)
        async with self._reading() as conn:
            return [message_record(row) for row in await conn.execute(query)]

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
            await conn.execute(messages.insert().values(**message_values(message)))
            await conn.execute(threads.update().where(threads.c.id == message.thread_id).values(active_leaf_id=message.id, updated_at=utcnow()))
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

    # -- branches --------------------------------------------------------------------------

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
                threads.update().where(threads.c.id == thread_id, ~has_active_run(thread_id)).values(active_leaf_id=leaf, updated_at=utcnow())
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
                fields=[FieldError(("message_id",), f"message role is {original.role}", "role")],
            )
        edited = MessageRecord(
            new_id("msg"),
            original.thread_id,
            original.parent_id,
            None,
            "assistant",
            content,
            status="complete",
            edited_from_id=original.id,
        )
        async with self._writing() as conn:
            result = await conn.execute(
                threads.update()
                .where(threads.c.id == original.thread_id, ~has_active_run(original.thread_id))
                .values(active_leaf_id=edited.id, updated_at=utcnow())
            )
            if result.rowcount != 1:
                raise ThreadBusy(f"thread {original.thread_id!r} has an active run; edit after it ends")
            await conn.execute(messages.insert().values(**message_values(edited)))
        return edited


async def splits_a_tool_turn(conn: AsyncConnection, parent: MessageRecord) -> bool:
    """True if ``parent`` is an assistant message with tool calls, or a tool result that is not
    the last of its turn: a message attached there would put a tool call without its result on
    the path, a history no model accepts."""
    answered: set[str | None] = set()
    cursor: MessageRecord | None = parent
    while cursor is not None and cursor.role == "tool":
        answered.add(cursor.tool_call_id)
        row = (await conn.execute(messages.select().where(messages.c.id == cursor.parent_id))).first() if cursor.parent_id else None
        cursor = message_record(row) if row is not None else None
    if cursor is None or cursor.role != "assistant" or not cursor.tool_calls:
        return False
    return any(call["id"] not in answered for call in cursor.tool_calls)
