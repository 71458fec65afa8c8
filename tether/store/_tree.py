"""The store's threads and their message trees.

Every message has a ``parent_id``; a thread's ``active_leaf_id`` picks one path from the root.
Forks, regenerated answers and a user's edits add siblings; switching branches moves the active
leaf. Moves that must not happen during a run (switching branches, storing an edit) are one
conditional write: ``UPDATE threads … WHERE NOT EXISTS (an active run)``.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from .._ids import new_id, utcnow
from ..errors import Conflict, FieldError, InvalidRequest, NotFound, ThreadBusy
from ._engine import Reading, StoreBase, Writing
from ._idempotency import record_created
from ._records import MessageRecord, StoredCall, ThreadRecord, calls_json, message_record, message_values, thread_record
from ._tables import Hot, has_active_run, messages, threads
from ._values import AtLeaf, Attach, Fork, Regenerate

__all__ = ["TreeStore", "input_message", "splits_a_tool_turn", "title_from_message", "clean_title", "MAX_TITLE_CHARS", "DERIVED_TITLE_CHARS"]

#: The longest title a thread may be given (characters).
MAX_TITLE_CHARS = 200
#: The longest title taken from a first message (characters, its ``…`` included).
DERIVED_TITLE_CHARS = 80
_CARD_LIKE = re.compile(r"\d{12,19}")
_NOT_PRINTABLE = re.compile(r"[\s\x00-\x1f\x7f-\x9f]+")


def clean_title(text: str) -> str:
    """A title on one line: every run of whitespace and control characters one space, trimmed."""
    return _NOT_PRINTABLE.sub(" ", text).strip()


def title_from_message(content: str) -> str | None:
    """A thread's title from its first message: on one line and trimmed (:func:`clean_title`),
    card-like numbers (12 to 19 digits) shown as ``****`` and their last four, and at most
    :data:`DERIVED_TITLE_CHARS` characters, cut at a word where one is near, with ``…``. None
    when nothing is left."""
    text = clean_title(_CARD_LIKE.sub(lambda m: "****" + m.group(0)[-4:], content[: DERIVED_TITLE_CHARS * 25]))
    if not text:
        return None
    if len(text) <= DERIVED_TITLE_CHARS:
        return text
    cut = text[: DERIVED_TITLE_CHARS - 1]
    space = cut.rfind(" ")
    if text[len(cut)] != " " and space >= DERIVED_TITLE_CHARS // 2:  # cut inside a word: at its start instead
        cut = cut[:space]
    return cut.rstrip() + "…"


class TreeStore(StoreBase):
    """Thread and message operations of :class:`~tether.store.Store`."""

    # -- threads ---------------------------------------------------------------------------

    async def create_thread(
        self, *, owner: str, metadata: dict[str, Any] | None = None, thread_id: str | None = None, title: str | None = None
    ) -> ThreadRecord:
        """Create an empty thread; with ``thread_id`` under that id (an AG-UI client names its
        threads), :class:`~tether.errors.Conflict` ``thread_exists`` if it is taken. Without a
        ``title`` the thread takes one from its first message."""
        now = utcnow()
        record = ThreadRecord(id=thread_id or new_id("thr"), owner=owner, metadata=dict(metadata or {}), active_leaf_id=None, created_at=now, title=title)
        try:
            async with self._writing() as conn:
                await conn.execute(
                    threads.insert().values(
                        id=record.id, owner=owner, metadata=record.metadata, active_leaf_id=None, created_at=now, updated_at=now, title=title
                    )
                )
                # Under an Idempotency-Key: the key names this thread, or the insert rolls back.
                await record_created(conn, "thread", record.id)
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

    async def rename_thread(self, thread_id: str, title: str) -> ThreadRecord:
        """Give a thread a new title (the caller checked it: :func:`clean_title`, at most
        :data:`MAX_TITLE_CHARS`); :class:`NotFound` if the thread is missing."""
        async with self._writing() as conn:
            result = await conn.execute(threads.update().where(threads.c.id == thread_id).values(title=title, updated_at=utcnow()))
            if result.rowcount != 1:
                raise NotFound(f"thread {thread_id!r} not found", code="thread_not_found")
            row = (await conn.execute(threads.select().where(threads.c.id == thread_id))).first()
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
        """Every message of a thread (the whole tree), oldest first. For tests and tools: the
        server and the runtime read pages (:meth:`tree_page`) and paths (:meth:`path_to`)."""
        query = messages.select().where(messages.c.thread_id == thread_id).order_by(messages.c.created_at, messages.c.id)
        async with self._reading() as conn:
            return [message_record(row) for row in await conn.execute(query)]

    async def path_to(self, thread_id: str, leaf_id: str | None, *, limit: int | None = None) -> list[MessageRecord]:
        """The chain of messages from the root to ``leaf_id`` (inclusive), oldest first; with
        ``limit``, only its newest ``limit`` messages.

        One recursive query follows the parent links up from the leaf (each step a primary-key
        lookup), so its cost grows with the length asked for, never with the size of the tree.
        """
        if leaf_id is None or (limit is not None and limit < 1):
            return []
        params = {"leaf_id": leaf_id, "thread_id": thread_id, "limit": limit if limit is not None else _NO_LIMIT}
        async with self._reading() as conn:
            return [message_record(row) for row in await conn.execute(_PATH_TO, params)]

    async def tree_page(self, thread_id: str, *, after_id: str | None = None, limit: int = 100) -> tuple[list[MessageRecord], bool]:
        """Up to ``limit`` messages of the thread's tree in creation order, after the message
        ``after_id`` (a cursor from the previous page); and whether more follow."""
        query = messages.select().where(messages.c.thread_id == thread_id)
        if after_id is not None:
            cursor = await self._message_of(thread_id, after_id)
            key = sa.tuple_(messages.c.created_at, messages.c.id)
            query = query.where(key > sa.tuple_(sa.literal(cursor.created_at, type_=messages.c.created_at.type), sa.literal(cursor.id)))
        query = query.order_by(messages.c.created_at, messages.c.id).limit(limit + 1)
        async with self._reading() as conn:
            page = [message_record(row) for row in await conn.execute(query)]
        return page[:limit], len(page) > limit

    async def path_page(self, thread_id: str, leaf_id: str | None, *, before_id: str | None = None, limit: int = 100) -> tuple[list[MessageRecord], bool]:
        """The newest ``limit`` messages of the path root → ``leaf_id`` that come before the
        message ``before_id`` (a cursor from the previous page; none: up to the leaf itself),
        oldest first; and whether older ones remain."""
        if before_id is not None:
            leaf_id = (await self._message_of(thread_id, before_id)).parent_id
        page = await self.path_to(thread_id, leaf_id, limit=limit + 1)
        return page[-limit:], len(page) > limit

    async def sibling_ids(self, thread_id: str, parent_ids: set[str | None]) -> dict[str | None, list[str]]:
        """The ids of the children of each of ``parent_ids`` (``None``: the roots), in creation order."""
        found: dict[str | None, list[str]] = {parent: [] for parent in parent_ids}
        ids = [p for p in parent_ids if p is not None]
        if not found:
            return found
        condition: sa.ColumnElement[bool] = messages.c.parent_id.in_(ids) if ids else sa.false()
        if None in parent_ids:
            condition = sa.or_(condition, messages.c.parent_id.is_(None))
        query = (
            sa.select(messages.c.id, messages.c.parent_id).where(messages.c.thread_id == thread_id, condition).order_by(messages.c.created_at, messages.c.id)
        )
        async with self._reading() as conn:
            for row in await conn.execute(query):
                found[row.parent_id].append(row.id)
        return found

    async def _message_of(self, thread_id: str, message_id: str) -> MessageRecord:
        """A message of this thread (a page cursor); :class:`InvalidRequest` otherwise."""
        async with self._reading() as conn:
            row = (await conn.execute(messages.select().where(messages.c.id == message_id, messages.c.thread_id == thread_id))).first()
        if row is None:
            raise InvalidRequest(
                f"cursor {message_id!r} is not a message of thread {thread_id!r}",
                code="invalid_cursor",
                fields=[FieldError(("cursor",), "not a message of this thread", "invalid_cursor")],
            )
        return message_record(row)

    async def newest_leaf_under(self, message_id: str) -> str:
        """The deepest descendant of ``message_id`` reached by following the newest child at
        each level (one recursive query)."""
        start = sa.select(messages.c.id, sa.literal_column("1").label("depth")).where(messages.c.id == message_id)
        chain = start.cte("down", recursive=True)
        child, newer = messages.alias("child"), messages.alias("newer")
        is_newest = ~sa.exists().where(
            newer.c.parent_id == child.c.parent_id,
            sa.tuple_(newer.c.created_at, newer.c.id) > sa.tuple_(child.c.created_at, child.c.id),
        )
        step = sa.select(child.c.id, (chain.c.depth + 1).label("depth")).where(child.c.parent_id == chain.c.id, is_newest)
        chain = chain.union_all(step)
        async with self._reading() as conn:
            leaf = (await conn.execute(sa.select(chain.c.id).order_by(chain.c.depth.desc()).limit(1))).scalar()
        return str(leaf) if leaf is not None else message_id

    async def add_message(self, message: MessageRecord) -> MessageRecord:
        """Append a message to its thread and make it the active leaf."""
        async with self._writing() as conn:
            await append_message(conn, message)
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
        tool_calls: tuple[StoredCall, ...] | None = None,
    ) -> None:
        """Change a message's content, status or tool calls (a turn being finished)."""
        values: dict[str, Any] = {}
        if content is not None:
            values["content"] = content
        if status is not None:
            values["status"] = status
        if tool_calls is not None:
            values["tool_calls"] = calls_json(tool_calls)
        if values:
            async with self._writing() as conn:
                await conn.execute(messages.update().where(messages.c.id == message_id).values(**values))

    # -- branches --------------------------------------------------------------------------

    async def set_active_leaf(self, thread_id: str, message_id: str) -> str:
        """Switch the thread to the branch of ``message_id`` (its deepest, newest leaf).

        Refused with :class:`ThreadBusy` while a run of the thread is not terminal: the check
        and the switch are one conditional write.
        """
        async with self._reading() as conn:
            row = (await conn.execute(sa.select(messages.c.id).where(messages.c.id == message_id, messages.c.thread_id == thread_id))).first()
        if row is None:
            raise NotFound(f"message {message_id!r} not found in thread {thread_id!r}", code="message_not_found")
        leaf = await self.newest_leaf_under(message_id)
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
            id=new_id("msg"),
            thread_id=original.thread_id,
            parent_id=original.parent_id,
            run_id=None,
            role="assistant",
            content=content,
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


async def append_message(conn: Writing, message: MessageRecord) -> None:
    """Insert ``message`` and make it its thread's active leaf (in the caller's transaction)."""
    await conn.execute(Hot.insert_message, message_values(message))
    await conn.execute(Hot.set_active_leaf, {"of_thread": message.thread_id, "leaf_id": message.id, "now": utcnow()})


async def splits_a_tool_turn(conn: Reading, parent: MessageRecord) -> bool:
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
    return any(call.id not in answered for call in cursor.tool_calls)


#: ``path_to`` without a limit: deeper than any path.
_NO_LIMIT = 2**31 - 1  # the largest INTEGER PostgreSQL compares a depth with


def _path_query() -> sa.Select[Any]:
    """The recursive query of ``path_to``, built once (building it per call cost more than
    running it). The chain carries whole rows, so the final SELECT reads only the chain
    (joining it back to ``messages`` would let a planner scan the table once per step)."""
    start = sa.select(*messages.c, sa.literal_column("1").label("depth"))
    chain = start.where(messages.c.id == sa.bindparam("leaf_id"), messages.c.thread_id == sa.bindparam("thread_id")).cte("chain", recursive=True)
    up = messages.alias("up")
    step = sa.select(*up.c, (chain.c.depth + 1).label("depth")).where(up.c.id == chain.c.parent_id, chain.c.depth < sa.bindparam("limit"))
    chain = chain.union_all(step)
    return sa.select(*(chain.c[c.name] for c in messages.c)).order_by(chain.c.depth.desc())


_PATH_TO = _path_query()


def _invalid_parent(parent_id: str | None, thread_id: str, why: str = "not a message of this thread") -> InvalidRequest:
    return InvalidRequest(
        f"parent_id {parent_id!r} is not a message of thread {thread_id!r}" if why.startswith("not a message") else f"parent_id {parent_id!r} is {why}",
        code="invalid_parent",
        fields=[FieldError(("parent_id",), why, "invalid_parent")],
    )


async def input_message(conn: Writing, attach: Attach, thread_id: str, active_leaf_id: str | None, run_id: str, now: datetime) -> MessageRecord:
    """The run's input message: new (after the active leaf, or under a checked parent), or the
    existing user message a regeneration answers again."""

    async def message_in_thread(message_id: str | None) -> MessageRecord | None:
        if message_id is None:
            return None
        row = (await conn.execute(Hot.message_by_id, {"message_id": message_id})).first()
        if row is None or row.thread_id != thread_id:
            raise _invalid_parent(message_id, thread_id)
        return message_record(row)

    match attach:
        case AtLeaf(content=content):
            # A new message after the active leaf needs nothing of the leaf: the thread only ever
            # points at its own messages.
            return MessageRecord(id=new_id("msg"), thread_id=thread_id, parent_id=active_leaf_id, run_id=run_id, role="user", content=content, created_at=now)
        case Fork(content=content, parent_id=parent_id):
            parent = await message_in_thread(parent_id)
            if parent is not None and await splits_a_tool_turn(conn, parent):
                raise InvalidRequest(
                    f"parent_id {parent_id!r} is inside a tool turn: a message there would leave a tool call without its result",
                    code="invalid_parent",
                    fields=[FieldError(("parent_id",), "a tool call above it has no result yet", "invalid_parent")],
                )
            return MessageRecord(id=new_id("msg"), thread_id=thread_id, parent_id=parent_id, run_id=run_id, role="user", content=content, created_at=now)
        case Regenerate(message_id=message_id):
            answered = await message_in_thread(message_id if message_id is not None else active_leaf_id)
            if answered is None or answered.role != "user":
                raise InvalidRequest(
                    "a run without input regenerates an answer: parent_id must be a user message of this thread",
                    code="input_required",
                    fields=[FieldError(("input",), "input.content is required unless parent_id is a user message", "missing")],
                )
            return answered
