"""The store contract, run against every backend (SQLite file, PostgreSQL database).

One suite, one fixture parametrised over the backends, so "works on SQLite" never stands in for
"works on PostgreSQL". The races are real: on PostgreSQL every contender has its own connection
(and half of them their own store, as another server process would), on SQLite the store
serialises its writers and a second store on the same file contends through SQLite's own lock.
What decides a race is always the database (a conditional ``UPDATE`` or a constraint), never the
test's scheduling, so each race asserts the outcome, not an order.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import pytest
import sqlalchemy as sa
from alembic.config import Config
from alembic.script import ScriptDirectory

from tether._ids import new_id, utcnow
from tether.errors import EventLogFailed, InterruptExpired, InterruptResolved, InvalidRequest, NotFound, RunNotActive, ThreadBusy
from tether.events import Cancelled, Done, Envelope, Event, Interrupt, Resumed, RunError, Status, Token, format_ts, now_ts
from tether.review import ActionRequest, Approve, Decision, Edit, Expired, ParkedCall, ParkedTurn, ReviewConfig
from tether.runtime import LocalBus
from tether.runtime._eventlog import EventLog
from tether.runtime._groupcommit import GroupCommit
from tether.store import (
    AtLeaf,
    Attach,
    AuditEntry,
    CancelRequest,
    Fork,
    InterruptRecord,
    MessageRecord,
    Regenerate,
    RunFailure,
    RunRecord,
    Store,
    StoredCall,
    StoredEvent,
    ThreadRecord,
    TurnOutcome,
)
from tether.store import _notify as channels
from tether.store import _tables as tables
from tether.webhooks import _tables as _webhook_tables  # noqa: F401  (its tables are on the store's metadata)

from .conftest import postgres_url_for_test, sqlite_url

pytestmark = pytest.mark.anyio

HOUR = timedelta(hours=1)
#: A race that has not settled by then is a deadlock: fail, never hang.
RACE_TIMEOUT_S = 30
ACTIONS = [ActionRequest(call_id="call_1", action="refund", args={"order_id": "42", "card": "****"}, description="Refund", risk="destructive")]
REVIEW = [ReviewConfig(allowed_decisions=["approve", "reject", "edit"])]
TURN = ParkedTurn(assistant_message_id="msg_x", calls=(ParkedCall(id="call_1", name="refund", args={"order_id": "42"}, gated=True),))


def interrupt_record(
    interrupt_id: str,
    run_id: str,
    thread_id: str,
    created_at: datetime,
    expires_at: datetime,
    *,
    actions: list[ActionRequest] = ACTIONS,
    review: list[ReviewConfig] = REVIEW,
    turn: ParkedTurn = TURN,
) -> InterruptRecord:
    """A pending interrupt as the runtime parks one."""
    return InterruptRecord(
        id=interrupt_id,
        run_id=run_id,
        thread_id=thread_id,
        status="pending",
        action_requests=actions,
        review_configs=review,
        turn=turn,
        decisions=None,
        resolved_by=None,
        created_at=created_at,
        expires_at=expires_at,
        resolved_at=None,
    )


# -- fixtures ----------------------------------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgresql"])
async def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """An empty database of each backend (PostgreSQL: a fresh database, dropped afterwards)."""
    if request.param == "sqlite":
        yield sqlite_url(tmp_path)
    else:
        async with postgres_url_for_test() as url:
            yield url


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[Store]:
    """A store opened (and so migrated) on the empty database."""
    async with another_store(database_url) as opened:
        yield opened


@contextlib.asynccontextmanager
async def another_store(url: str) -> AsyncIterator[Store]:
    """A second store on the same database: what another server process would have."""
    opened = await Store.open(url)
    try:
        yield opened
    finally:
        await opened.aclose()


# -- helpers -----------------------------------------------------------------------------------


def stored(run_id: str, seq: int, event: Event) -> StoredEvent:
    return StoredEvent(seq, event.type, Envelope.encode(run_id, seq, event, now_ts()))


def attach_of(content: str | None, parent_id: str | None = None, use_active_leaf: bool = True) -> Attach:
    """The attach a start's old arguments meant: at the leaf, a fork, or a regeneration."""
    if content is None:
        return Regenerate(message_id=parent_id)
    return AtLeaf(content=content) if use_active_leaf else Fork(content=content, parent_id=parent_id)


async def start_run(store: Store, thread: ThreadRecord, content: str | None = "hello", **options: Any) -> tuple[RunRecord, MessageRecord, StoredEvent]:
    attach = attach_of(content, options.pop("parent_id", None), options.pop("use_active_leaf", True))
    created = await store.create_run(thread_id=thread.id, attach=attach, config=options.pop("config", {}), **options)
    return created.run, created.input, created.events[0]


async def finish(store: Store, run_id: str, *, status: str = "completed", from_statuses: tuple[str, ...] = ("queued", "running")) -> bool:
    final = stored(run_id, await store.last_seq(run_id) + 1, Done(message_id=None))
    return await store.finish_run(run_id, status=status, final_event=final, from_statuses=from_statuses)


async def open_interrupt(store: Store, run: RunRecord, *, created_at: datetime | None = None, expires_in: timedelta = HOUR) -> InterruptRecord:
    created = created_at or utcnow()
    record = interrupt_record(new_id("int"), run.id, run.thread_id, created, created + expires_in)
    event = stored(
        run.id,
        await store.last_seq(run.id) + 1,
        Interrupt(interrupt_id=record.id, action_requests=ACTIONS, review_configs=REVIEW, expires_at=format_ts(record.expires_at)),
    )
    assert await store.open_interrupt(record, event)
    return record


async def parked_run(store: Store, thread: ThreadRecord | None = None, **interrupt_options: Any) -> tuple[RunRecord, InterruptRecord]:
    """A run waiting for a human: created, running, then parked on an interrupt."""
    thread = thread or await store.create_thread(owner="alice")
    run, _, _ = await start_run(store, thread, "refund order 42")
    assert await store.mark_running(run.id)
    return run, await open_interrupt(store, run, **interrupt_options)


async def leave(
    store: Store, interrupt: InterruptRecord, *, to_status: str = "resolved", now: datetime | None = None, actor: str = "bob"
) -> tuple[InterruptRecord, StoredEvent, Any]:
    """``leave_pending`` as the runtime calls it: decisions, a ``resumed`` event, audit entries."""
    verdict = "approve" if to_status == "resolved" else "expired"
    decisions: list[Decision] = [Approve(call_id="call_1") if verdict == "approve" else Expired(call_id="call_1")]
    return await store.leave_pending(
        interrupt.id,
        to_status=to_status,
        now=now or utcnow(),
        decisions=decisions,
        turn=interrupt.turn.model_copy(update={"calls": tuple(c.model_copy(update={"decision": decisions[0]}) for c in interrupt.turn.calls)}),
        actor=actor,
        make_event=lambda run_id, seq: stored(
            run_id, seq, Resumed(interrupt_id=interrupt.id, resolution="decided" if to_status == "resolved" else "expired", decisions=decisions)
        ),
        audit_entries=[
            AuditEntry(
                action="decision",
                actor=actor,
                thread_id=interrupt.thread_id,
                run_id=interrupt.run_id,
                interrupt_id=interrupt.id,
                call_id="call_1",
                tool="refund",
                decision=verdict,
            )
        ],
    )


async def event_types(store: Store, run_id: str) -> list[str]:
    return [e.type for e in await store.read_events(run_id)]


def message(thread: ThreadRecord, parent: MessageRecord | None, role: str, content: str, at: datetime, **fields: Any) -> MessageRecord:
    return MessageRecord(
        id=new_id("msg"), thread_id=thread.id, parent_id=parent.id if parent else None, run_id=None, role=role, content=content, created_at=at, **fields
    )


# -- migrations --------------------------------------------------------------------------------


def _schema(sync_conn: sa.Connection) -> dict[str, Any]:
    inspector = sa.inspect(sync_conn)
    return {
        "tables": set(inspector.get_table_names()),
        "json_type": {c["name"]: c["type"].__visit_name__ for c in inspector.get_columns("threads")}["metadata"],
        "run_indexes": {i["name"]: bool(i["unique"]) for i in inspector.get_indexes("runs")},
        "version": sync_conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalars().all(),
    }


def _head() -> str:
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(tables.__file__).parent / "migrations"))
    return ScriptDirectory.from_config(cfg).get_current_head()  # type: ignore[return-value]


async def test_opening_an_empty_database_creates_the_whole_schema_at_the_latest_revision(store: Store) -> None:
    async with store.connection() as conn:
        schema = await conn.run_sync(_schema)
    assert schema["tables"] == {"alembic_version", *tables.metadata.tables}
    assert {"threads", "messages", "runs", "events", "interrupts", "audit"} <= schema["tables"]
    assert schema["version"] == [_head()]
    # json (not jsonb) on PostgreSQL: values come back as they were written.
    assert schema["json_type"] == "JSON"
    assert schema["run_indexes"]["uq_runs_one_active_per_thread"] is True


async def test_opening_a_migrated_database_again_changes_nothing(store: Store, database_url: str) -> None:
    thread = await store.create_thread(owner="alice", metadata={"k": 1})
    async with another_store(database_url) as again:
        assert await again.get_thread(thread.id) == thread
        async with again.connection() as conn:
            schema = await conn.run_sync(_schema)
    assert schema["version"] == [_head()]
    await store.migrate()  # and once more on the open store
    assert await store.get_thread(thread.id) == thread


async def test_stores_opening_one_empty_database_at_once_all_migrate_it(database_url: str) -> None:
    with anyio.fail_after(RACE_TIMEOUT_S):
        opened = await asyncio.gather(*(Store.open(database_url) for _ in range(4)), return_exceptions=True)
    try:
        assert all(isinstance(s, Store) for s in opened), opened
        thread = await opened[0].create_thread(owner="alice")  # type: ignore[union-attr]
        assert await opened[-1].get_thread(thread.id) == thread  # type: ignore[union-attr]
    finally:
        for s in opened:
            if isinstance(s, Store):
                await s.aclose()


_OPEN_AND_CLOSE = """
import asyncio, sys
from tether.store import Store
async def main():
    store = await Store.open(sys.argv[1])
    await store.aclose()
asyncio.run(main())
"""


async def test_server_processes_starting_on_one_empty_database_all_migrate_it(database_url: str) -> None:
    """Several server processes started together: one migrates, the others wait and find it done."""
    with anyio.fail_after(RACE_TIMEOUT_S):
        results = await asyncio.gather(*(anyio.run_process([sys.executable, "-c", _OPEN_AND_CLOSE, database_url], check=False) for _ in range(3)))
    assert [r.returncode for r in results] == [0, 0, 0], [r.stderr.decode()[-2000:] for r in results]
    async with another_store(database_url) as opened, opened.connection() as conn:
        assert (await conn.run_sync(_schema))["version"] == [_head()]


# -- threads -----------------------------------------------------------------------------------


async def test_a_created_thread_reads_back_with_its_owner_and_metadata(store: Store) -> None:
    thread = await store.create_thread(owner="alice", metadata={"title": "refunds"})
    assert thread.owner == "alice" and thread.metadata == {"title": "refunds"} and thread.active_leaf_id is None
    assert await store.get_thread(thread.id) == thread
    assert await store.get_thread(thread.id, owner="alice") == thread
    assert (await store.create_thread(owner="bob")).metadata == {}


async def test_threads_are_listed_newest_first_and_filtered_by_owner(store: Store) -> None:
    alice = [await store.create_thread(owner="alice") for _ in range(3)]
    bob = await store.create_thread(owner="bob")
    assert [t.id for t in await store.list_threads(owner="alice")] == [t.id for t in reversed(alice)]
    assert [t.id for t in await store.list_threads()] == [bob.id, *(t.id for t in reversed(alice))]
    assert [t.id for t in await store.list_threads(owner="alice", limit=2)] == [alice[2].id, alice[1].id]
    assert await store.list_threads(owner="carol") == []


async def test_missing_or_foreign_records_are_not_found_with_their_own_codes(store: Store) -> None:
    thread = await store.create_thread(owner="alice")
    missing_interrupt = interrupt_record("int_missing", "run_x", thread.id, utcnow(), utcnow(), actions=[], review=[], turn=ParkedTurn())
    cases: list[tuple[Callable[[], Awaitable[Any]], str]] = [
        (lambda: store.get_thread("thr_missing"), "thread_not_found"),
        (lambda: store.get_thread(thread.id, owner="bob"), "thread_not_found"),
        (lambda: store.create_run(thread_id="thr_missing", attach=AtLeaf(content="x"), config={}), "thread_not_found"),
        (lambda: store.create_run(thread_id=thread.id, attach=AtLeaf(content="x"), config={}, owner="bob"), "thread_not_found"),
        (lambda: store.create_run(thread_id=thread.id, attach=Fork(content="x", parent_id=None), config={}, owner="bob"), "thread_not_found"),
        (lambda: store.get_run("run_missing"), "run_not_found"),
        (lambda: store.request_cancel("run_missing", mode="soft", reason=None, actor="a"), "run_not_found"),
        (lambda: store.get_message("msg_missing"), "message_not_found"),
        (lambda: store.set_active_leaf(thread.id, "msg_missing"), "message_not_found"),
        (lambda: store.add_edited_version("msg_missing", "x"), "message_not_found"),
        (lambda: store.get_interrupt("int_missing"), "interrupt_not_found"),
        (lambda: leave(store, missing_interrupt), "interrupt_not_found"),
    ]
    for call, code in cases:
        with pytest.raises(NotFound) as caught:
            await call()
        assert caught.value.code == code
    assert await store.list_runs(thread.id) == [] and await store.thread_messages(thread.id) == []


# -- create_run --------------------------------------------------------------------------------


async def test_create_run_writes_the_run_its_user_message_and_run_started_atomically(store: Store) -> None:
    thread = await store.create_thread(owner="alice")
    run, user, started = await start_run(store, thread, "refund order 42", config={"approval_threshold": "destructive"})

    assert (run.status, run.thread_id, run.config, run.input_message_id) == ("queued", thread.id, {"approval_threshold": "destructive"}, user.id)
    assert await store.get_run(run.id) == run  # the run exactly as written
    assert (user.role, user.content, user.parent_id, user.run_id, user.thread_id) == ("user", "refund order 42", None, run.id, thread.id)
    assert await store.thread_messages(thread.id) == [user]
    assert (await store.get_thread(thread.id)).active_leaf_id == user.id
    assert started.seq == 1 and started.type == "run_started"
    assert await store.read_events(run.id) == [started]
    envelope = Envelope.from_json(started.envelope)
    assert (envelope.run_id, envelope.seq, envelope.data) == (run.id, 1, {"thread_id": thread.id, "input_message_id": user.id})
    assert await store.last_seq(run.id) == 1
    assert await store.active_run_ids([thread.id, "thr_other"]) == {thread.id: run.id}
    assert await store.active_run_ids([]) == {}
    assert await store.list_runs(thread.id) == [await store.get_run(run.id)]
    assert (await store.get_run(run.id)).status == run.status == "queued"
    assert run.id in {r.id for r in await store.runs_in_status(("queued",))}


async def test_a_run_created_running_is_one_transaction_with_its_first_status_and_answer_or_nothing(store: Store) -> None:
    """``create_run(running=True)``: what ``create_run`` and then ``mark_running`` write, in one
    commit (the server starts every run this way); refused, it writes nothing."""
    thread = await store.create_thread(owner="alice")
    created = await store.create_run(thread_id=thread.id, attach=AtLeaf(content="refund order 42"), config={}, requested_by="alice", running=True)
    run, user, answer = created.run, created.input, created.first_turn
    assert answer is not None
    assert (run.status, run.requested_by, run.input_message_id) == ("running", "alice", user.id) and run.started_at is not None
    assert await store.get_run(run.id) == run  # the run exactly as written
    assert [(e.seq, e.type) for e in created.events] == [(1, "run_started"), (2, "status")]
    assert await store.read_events(run.id) == created.events
    assert Envelope.from_json(created.events[1].envelope).data == {"stage": "model", "detail": None, "discard_message_id": None}
    assert (answer.role, answer.content, answer.status, answer.parent_id, answer.run_id) == ("assistant", "", "partial", user.id, run.id)
    assert await store.thread_messages(thread.id) == [user, answer]
    assert (await store.get_thread(thread.id)).active_leaf_id == answer.id
    assert not await store.mark_running(run.id)  # running already: nothing left to start

    # Refused (the thread has an active run; a parent of another thread): nothing of it is written.
    other = await store.create_thread(owner="alice")
    foreign = (await start_run(store, other, "elsewhere"))[1]
    for parent_id, use_active_leaf, refusal in ((None, True, ThreadBusy), (foreign.id, False, InvalidRequest)):
        if refusal is InvalidRequest:
            await finish(store, run.id, from_statuses=("running",))
        with pytest.raises(refusal):
            await store.create_run(thread_id=thread.id, attach=attach_of("and another", parent_id, use_active_leaf), config={}, running=True)
        assert len(await store.list_runs(thread.id)) == 1
        assert await store.thread_messages(thread.id) == [user, answer]
        assert (await store.get_thread(thread.id)).active_leaf_id == answer.id


async def test_a_second_run_on_a_thread_with_an_active_run_is_refused_and_writes_nothing(store: Store) -> None:
    for status in ("queued", "running", "waiting_human", "cancelling"):
        thread = await store.create_thread(owner="alice")
        if status == "waiting_human":
            run, _ = await parked_run(store, thread)
        else:
            run, _, _ = await start_run(store, thread)
            if status == "running":
                assert await store.mark_running(run.id)
            elif status == "cancelling":
                await store.request_cancel(run.id, mode="soft", reason=None, actor="alice")
        before = await store.thread_messages(thread.id)
        leaf = (await store.get_thread(thread.id)).active_leaf_id
        with pytest.raises(ThreadBusy) as caught:
            await start_run(store, thread, "and another thing")
        assert caught.value.code == "thread_busy"
        assert (await store.get_run(run.id)).status == status
        assert [r.id for r in await store.list_runs(thread.id)] == [run.id]
        assert await store.thread_messages(thread.id) == before
        assert (await store.get_thread(thread.id)).active_leaf_id == leaf


async def test_of_twenty_concurrent_runs_on_one_thread_exactly_one_is_created(store: Store, database_url: str) -> None:
    thread = await store.create_thread(owner="alice")
    async with another_store(database_url) as other:
        with anyio.fail_after(RACE_TIMEOUT_S):
            outcomes = await asyncio.gather(*(start_run(store if i % 2 else other, thread, f"attempt {i}") for i in range(20)), return_exceptions=True)
    winners = [o for o in outcomes if not isinstance(o, BaseException)]
    losers = [o for o in outcomes if isinstance(o, BaseException)]
    assert len(winners) == 1 and all(isinstance(o, ThreadBusy) for o in losers), losers
    run, user, _ = winners[0]
    assert [r.id for r in await store.list_runs(thread.id)] == [run.id]
    # The losers left nothing behind: no orphan user message, no event, the leaf is the winner's.
    assert await store.thread_messages(thread.id) == [user]
    assert (await store.get_thread(thread.id)).active_leaf_id == user.id
    assert await event_types(store, run.id) == ["run_started"]


async def test_after_its_run_finishes_the_thread_accepts_a_new_run_continuing_the_path(store: Store) -> None:
    thread = await store.create_thread(owner="alice")
    run, u1, _ = await start_run(store, thread, "first")
    a1 = await store.add_message(MessageRecord(id=new_id("msg"), thread_id=thread.id, parent_id=u1.id, run_id=run.id, role="assistant", content="answer"))
    assert await finish(store, run.id)
    assert await store.active_run_ids([thread.id]) == {}
    second, u2, _ = await start_run(store, thread, "second")
    assert u2.parent_id == a1.id and second.input_message_id == u2.id
    assert [m.id for m in await store.path_to(thread.id, u2.id)] == [u1.id, a1.id, u2.id]


async def test_a_run_with_an_explicit_parent_forks_the_thread_and_none_starts_a_new_root(store: Store) -> None:
    thread = await store.create_thread(owner="alice")
    run, u1, _ = await start_run(store, thread, "first")
    a1 = await store.add_message(MessageRecord(id=new_id("msg"), thread_id=thread.id, parent_id=u1.id, run_id=run.id, role="assistant", content="answer"))
    await store.add_message(MessageRecord(id=new_id("msg"), thread_id=thread.id, parent_id=a1.id, run_id=None, role="user", content="follow-up"))
    assert await finish(store, run.id)

    fork, forked, _ = await start_run(store, thread, "instead", parent_id=a1.id, use_active_leaf=False)
    assert forked.parent_id == a1.id and (await store.get_thread(thread.id)).active_leaf_id == forked.id
    assert await finish(store, fork.id)

    rooted, root, _ = await start_run(store, thread, "edited first message", parent_id=None, use_active_leaf=False)
    assert root.parent_id is None and rooted.input_message_id == root.id
    assert (await store.get_thread(thread.id)).active_leaf_id == root.id
    assert await store.path_to(thread.id, root.id) == [root]


async def test_a_run_without_content_regenerates_from_an_existing_user_message(store: Store) -> None:
    thread = await store.create_thread(owner="alice")
    run, u1, _ = await start_run(store, thread, "question")
    await store.add_message(MessageRecord(id=new_id("msg"), thread_id=thread.id, parent_id=u1.id, run_id=run.id, role="assistant", content="answer one"))
    assert await finish(store, run.id)
    count = len(await store.thread_messages(thread.id))

    again, input_message, started = await start_run(store, thread, None, parent_id=u1.id, use_active_leaf=False)
    assert again.input_message_id == u1.id and input_message == u1
    assert len(await store.thread_messages(thread.id)) == count  # no new message
    assert (await store.get_thread(thread.id)).active_leaf_id == u1.id
    assert Envelope.from_json(started.envelope).data["input_message_id"] == u1.id


async def test_invalid_parents_and_missing_input_are_refused_and_write_nothing(store: Store) -> None:
    thread = await store.create_thread(owner="alice")
    elsewhere = await store.create_thread(owner="alice")
    run, u1, _ = await start_run(store, thread, "question")
    calls = (StoredCall(id="call_1", name="lookup", args={"q": "x"}),)
    a1 = await store.add_message(
        MessageRecord(id=new_id("msg"), thread_id=thread.id, parent_id=u1.id, run_id=run.id, role="assistant", content="", tool_calls=calls)
    )
    assert await finish(store, run.id)
    _, foreign, _ = await start_run(store, elsewhere, "other thread")
    before = await store.thread_messages(thread.id)

    cases = [
        ({"content": "x", "parent_id": foreign.id, "use_active_leaf": False}, "invalid_parent"),
        ({"content": "x", "parent_id": "msg_missing", "use_active_leaf": False}, "invalid_parent"),
        # A message under a tool call without its result would make a history no model accepts.
        ({"content": "x", "parent_id": a1.id, "use_active_leaf": False}, "invalid_parent"),
        ({"content": None, "parent_id": a1.id, "use_active_leaf": False}, "input_required"),
        ({"content": None, "parent_id": None, "use_active_leaf": False}, "input_required"),
        ({"content": None, "parent_id": foreign.id, "use_active_leaf": False}, "invalid_parent"),
    ]
    for options, code in cases:
        with pytest.raises(InvalidRequest) as caught:
            await store.create_run(thread_id=thread.id, config={}, attach=attach_of(**options))
        assert caught.value.code == code, options
    assert len(await store.list_runs(thread.id)) == 1
    assert await store.thread_messages(thread.id) == before
    assert (await store.get_thread(thread.id)).active_leaf_id == a1.id


# -- finish_run --------------------------------------------------------------------------------


async def test_finish_run_from_a_status_not_allowed_returns_false_and_writes_nothing(store: Store) -> None:
    thread = await store.create_thread(owner="alice")
    run, _ = await parked_run(store, thread)
    await store.request_cancel(run.id, mode="soft", reason="stop", actor="alice")
    final = stored(run.id, 3, Done(message_id=None))
    before = [stored(run.id, 3, Token(message_id="m", text="late"))]
    # A cancelling run is never committed as completed.
    assert not await store.finish_run(run.id, status="completed", final_event=final, from_statuses=("running",), events_before=before)
    current = await store.get_run(run.id)
    assert current.status == "cancelling" and current.ended_at is None
    assert await store.last_seq(run.id) == 2
    assert len(await store.pending_interrupts(run_ids=[run.id])) == 1


async def test_mark_running_writes_the_start_its_status_event_and_first_answer_together_or_nothing(store: Store) -> None:
    thread = await store.create_thread(owner="alice")
    run, user, _ = await start_run(store, thread)
    answer = MessageRecord(id=new_id("msg"), thread_id=thread.id, parent_id=user.id, run_id=run.id, role="assistant", content="", status="partial")
    announce = stored(run.id, 2, Status(stage="model", detail=None))
    assert await store.mark_running(run.id, announce=announce, message=answer)
    assert (await store.get_run(run.id)).status == "running"
    assert await store.read_events(run.id, after_seq=1) == [announce]
    assert await store.get_message(answer.id) == answer
    assert (await store.get_thread(thread.id)).active_leaf_id == answer.id

    # A run that is no longer queued (here: cancelled while queued) does not start: nothing of it is written.
    await finish(store, run.id)
    second, second_user, _ = await start_run(store, thread)
    await store.request_cancel(second.id, mode="soft", reason=None, actor="alice")
    late = MessageRecord(id=new_id("msg"), thread_id=thread.id, parent_id=second_user.id, run_id=second.id, role="assistant", content="", status="partial")
    assert not await store.mark_running(second.id, announce=stored(second.id, 2, Status(stage="model", detail=None)), message=late)
    assert (await store.get_run(second.id)).status == "cancelling" and await store.last_seq(second.id) == 1
    assert late.id not in {m.id for m in await store.thread_messages(thread.id)}
    assert (await store.get_thread(thread.id)).active_leaf_id == second_user.id


async def test_finish_run_appends_events_before_then_the_final_event_with_the_status(store: Store) -> None:
    thread = await store.create_thread(owner="alice")
    run, _, _ = await start_run(store, thread)
    assert await store.mark_running(run.id)
    before = [stored(run.id, 2, Token(message_id="m", text="a")), stored(run.id, 3, Token(message_id="m", text="b"))]
    final = stored(run.id, 4, RunError(code="model_error", message="boom"))
    error = RunFailure(code="model_error", message="boom")
    assert await store.finish_run(run.id, status="failed", final_event=final, from_statuses=("running",), error=error, events_before=before)
    assert await store.read_events(run.id, after_seq=1) == [*before, final]
    done = await store.get_run(run.id)
    assert done.status == "failed" and done.terminal and done.error == error and done.ended_at is not None
    # Once terminal, a second finisher loses.
    assert not await store.finish_run(run.id, status="completed", final_event=stored(run.id, 5, Done(message_id=None)), from_statuses=("running",))
    assert (await store.get_run(run.id)).status == "failed" and await store.last_seq(run.id) == 4


async def test_finish_run_stores_the_last_turn_with_the_end_or_not_at_all(store: Store) -> None:
    thread = await store.create_thread(owner="alice")
    run, user, _ = await start_run(store, thread)
    answer = MessageRecord(id=new_id("msg"), thread_id=thread.id, parent_id=user.id, run_id=run.id, role="assistant", content="", status="partial")
    assert await store.mark_running(run.id, message=answer)
    await store.request_cancel(run.id, mode="soft", reason=None, actor="alice")
    turn = TurnOutcome(message_id=answer.id, content="half an ans", status="cancelled", input_tokens=7, output_tokens=3)
    # From a status not allowed nothing is written, the turn neither.
    assert not await store.finish_run(
        run.id, status="completed", final_event=stored(run.id, 2, Done(message_id=None)), from_statuses=("running",), last_turn=turn
    )
    assert (await store.get_message(answer.id)).status == "partial"
    assert await store.finish_run(
        run.id, status="cancelled", final_event=stored(run.id, 2, Cancelled(mode="soft")), from_statuses=("cancelling",), last_turn=turn
    )
    stored_answer = await store.get_message(answer.id)
    assert (stored_answer.content, stored_answer.status) == ("half an ans", "cancelled")
    usage = (await store.get_run(run.id)).usage
    assert usage is not None and (usage.input_tokens, usage.output_tokens) == (7, 3)


async def test_an_executor_ends_a_running_run_with_the_cancel_request_in_one_write_or_not_at_all(store: Store) -> None:
    """``finish_run(cancel=…)``: ``running → cancelled`` recording who asked, why and how, with
    the audit entry, the terminal event and the stopped turn; from any other status nothing."""
    thread = await store.create_thread(owner="alice")
    run, user, _ = await start_run(store, thread)
    answer = MessageRecord(id=new_id("msg"), thread_id=thread.id, parent_id=user.id, run_id=run.id, role="assistant", content="", status="partial")
    assert await store.mark_running(run.id, message=answer)
    request = CancelRequest(mode="hard", reason="wrong order", actor="alice")
    entry = AuditEntry(action="cancel", actor="alice", thread_id=thread.id, run_id=run.id, reason="wrong order", outcome="cancelled", details={"mode": "hard"})
    turn = TurnOutcome(message_id=answer.id, content="half", status="cancelled", input_tokens=5, output_tokens=1)

    async def end(of_run: RunRecord) -> bool:
        final = stored(of_run.id, await store.last_seq(of_run.id) + 1, Cancelled(mode="hard", reason="wrong order", actor="alice"))
        return await store.finish_run(
            of_run.id,
            status="cancelled",
            final_event=final,
            from_statuses=("running",),
            audit_entries=[entry],
            last_turn=turn,
            as_executor=True,
            cancel=request,
        )

    assert await end(run)
    ended = await store.get_run(run.id)
    assert (ended.status, ended.cancel_mode, ended.cancel_reason, ended.cancel_actor) == ("cancelled", "hard", "wrong order", "alice")
    assert ended.ended_at is not None
    assert [(e.action, e.actor, e.reason, e.outcome, e.details) for e in await store.list_audit(run_id=run.id)] == [
        ("cancel", "alice", "wrong order", "cancelled", {"mode": "hard"})
    ]
    assert (await event_types(store, run.id))[-1] == "cancelled"
    assert (await store.get_message(answer.id)).status == "cancelled"

    # A run that another request moved to ``cancelling`` first: nothing is written.
    second, _, _ = await start_run(store, await store.create_thread(owner="alice"))
    assert await store.mark_running(second.id)
    await store.request_cancel(second.id, mode="soft", reason="first", actor="bob")
    assert not await end(second)
    kept = await store.get_run(second.id)
    assert (kept.status, kept.cancel_mode, kept.cancel_reason, kept.cancel_actor) == ("cancelling", "soft", "first", "bob")
    assert await store.list_audit(run_id=second.id) == [] and await event_types(store, second.id) == ["run_started"]


async def test_finishing_a_run_cancels_its_pending_interrupt(store: Store) -> None:
    run, interrupt = await parked_run(store)
    await store.request_cancel(run.id, mode="soft", reason=None, actor="alice")
    final = stored(run.id, 3, Cancelled(mode="soft"))
    assert await store.finish_run(run.id, status="cancelled", final_event=final, from_statuses=("cancelling",))
    settled = await store.get_interrupt(interrupt.id)
    assert settled.status == "cancelled" and settled.resolved_at is not None
    assert await store.pending_interrupts(run_ids=[run.id]) == []
    with pytest.raises(InterruptResolved):
        await leave(store, interrupt)
    assert await event_types(store, run.id) == ["run_started", "interrupt", "cancelled"]


async def test_a_failing_finish_run_rolls_back_the_status_change(store: Store) -> None:
    """All or nothing: a final event whose seq is taken leaves the run as it was."""
    thread = await store.create_thread(owner="alice")
    run, _, _ = await start_run(store, thread)
    assert await store.mark_running(run.id)
    with pytest.raises(sa.exc.IntegrityError):
        await store.finish_run(run.id, status="completed", final_event=stored(run.id, 1, Done(message_id=None)), from_statuses=("running",))
    current = await store.get_run(run.id)
    assert current.status == "running" and current.ended_at is None
    assert await event_types(store, run.id) == ["run_started"]


# -- request_cancel ----------------------------------------------------------------------------


async def test_request_cancel_moves_every_active_status_to_cancelling(store: Store) -> None:
    for status in ("queued", "running", "waiting_human"):
        thread = await store.create_thread(owner="alice")
        if status == "waiting_human":
            run, _ = await parked_run(store, thread)
        else:
            run, _, _ = await start_run(store, thread)
            if status == "running":
                assert await store.mark_running(run.id)
        record = await store.request_cancel(run.id, mode="soft", reason="changed my mind", actor="alice")
        assert (record.status, record.cancel_mode, record.cancel_reason, record.cancel_actor) == ("cancelling", "soft", "changed my mind", "alice")
        assert await store.get_run(run.id) == record


async def test_a_cancel_request_claims_a_run_no_process_holds_so_no_other_takes_it_over_until_the_claim_lapses(store: Store, database_url: str) -> None:
    # A waiting run belongs to no process; the process recording its cancel ends it. Were the
    # cancelling run left unclaimed, another process would take it over as abandoned and both
    # would write its ending (a duplicate seq, one of them failing).
    run, _ = await parked_run(store)
    assert (await store.get_run(run.id)).executor_id is None
    record = await store.request_cancel(run.id, mode="soft", reason=None, actor="alice")
    assert record.status == "cancelling" and record.executor_id == store.instance_id
    async with another_store(database_url) as other:
        assert await other.claim_abandoned() == []
        # The canceller dies before ending it: once its claim lapses, another process can.
        store.lease_s = other.lease_s = 0.05
        assert await store.renew_leases([run.id]) == {run.id: "soft"}  # now a 50 ms claim, on a run still cancelling
        await asyncio.sleep(0.1)  # past the 50 ms lease: the lapse itself is what is tested
        assert [r.id for r in await other.claim_abandoned()] == [run.id]


async def test_a_cancel_request_leaves_a_held_claim_with_its_holder(store: Store, database_url: str) -> None:
    thread = await store.create_thread(owner="alice")
    run, _, _ = await start_run(store, thread)
    assert await store.mark_running(run.id)
    held = await store.get_run(run.id)
    async with another_store(database_url) as other:
        record = await other.request_cancel(run.id, mode="soft", reason=None, actor="bob")
    assert (record.executor_id, record.lease_expires_at) == (store.instance_id, held.lease_expires_at)


async def test_an_audited_cancel_request_writes_its_audit_entry_with_it_and_none_for_a_finished_run(store: Store) -> None:
    thread = await store.create_thread(owner="alice")
    run, _, _ = await start_run(store, thread)
    await store.request_cancel(run.id, mode="hard", reason="wrong order", actor="alice", audited=True)
    entries = await store.list_audit(run_id=run.id)
    assert [(e.action, e.actor, e.thread_id, e.reason, e.outcome, e.details) for e in entries] == [
        ("cancel", "alice", thread.id, "wrong order", "cancelling", {"mode": "hard"})
    ]
    assert await finish(store, run.id, status="cancelled", from_statuses=("cancelling",))
    with pytest.raises(RunNotActive):
        await store.request_cancel(run.id, mode="soft", reason=None, actor="bob", audited=True)
    assert len(await store.list_audit(run_id=run.id)) == 1


async def test_a_hard_cancel_upgrades_a_soft_one_and_a_soft_one_never_downgrades(store: Store) -> None:
    thread = await store.create_thread(owner="alice")
    run, _, _ = await start_run(store, thread)
    assert (await store.request_cancel(run.id, mode="soft", reason="first", actor="alice")).cancel_mode == "soft"
    assert (await store.request_cancel(run.id, mode="soft", reason="again", actor="bob")).cancel_reason == "first"
    hard = await store.request_cancel(run.id, mode="hard", reason="now", actor="bob")
    assert hard.status == "cancelling" and hard.cancel_mode == "hard"
    assert (await store.request_cancel(run.id, mode="soft", reason=None, actor="carol")).cancel_mode == "hard"


async def test_cancelling_a_terminal_run_raises_run_not_active_and_changes_nothing(store: Store) -> None:
    thread = await store.create_thread(owner="alice")
    run, _, _ = await start_run(store, thread)
    assert await finish(store, run.id)
    done = await store.get_run(run.id)
    for mode in ("soft", "hard"):
        with pytest.raises(RunNotActive) as caught:
            await store.request_cancel(run.id, mode=mode, reason=None, actor="alice")
        assert caught.value.code == "run_not_active" and caught.value.details == {"status": "completed"}
    assert await store.get_run(run.id) == done


# -- events ------------------------------------------------------------------------------------


async def test_group_commit_puts_many_runs_in_one_transaction_and_a_bad_batch_fails_only_its_run(store: Store) -> None:
    writer = GroupCommit(store)
    bus = LocalBus()
    try:
        runs = [(await start_run(store, await store.create_thread(owner="alice")))[0] for _ in range(30)]
        logs = [EventLog(store, bus, run.id, next_seq=2, writer=writer) for run in runs]

        async def stream(event_log: EventLog) -> None:
            for n in range(40):
                event_log.emit_delta("token", "m", f"{event_log.run_id} {n}")
                await anyio.sleep(0)
            await event_log.wait_for_idle()

        async with anyio.create_task_group() as group:
            for event_log in logs:
                group.start_soon(stream, event_log)
        for run in runs:
            assert [e.seq for e in await store.read_events(run.id)] == list(range(1, 42))
        assert writer.transactions < writer.batches / 5, (writer.transactions, writer.batches)  # the runs shared transactions

        # One transaction with a batch whose seq is taken: only that run's log fails.
        bad = EventLog(store, bus, runs[0].id, next_seq=41, writer=writer)
        good = logs[1]
        bad.emit_delta("token", "m", "again")
        good.emit_delta("token", "m", "fine")
        with pytest.raises(EventLogFailed):
            await bad.wait_for_idle()
        await good.wait_for_idle()
        assert [e.seq for e in await store.read_events(runs[1].id)] == list(range(1, 43))
        assert [e.seq for e in await store.read_events(runs[0].id)] == list(range(1, 42))
    finally:
        await writer.aclose()


async def test_after_slow_commits_the_writer_rests_only_while_many_runs_have_an_event_or_so_each(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rest after a slow commit lets runs streaming at a model's pace gather a few events each
    per commit; runs with many events queued, and a run whose events trickle in one commit at a
    time, never wait for one. Every event is stored, in order, either way."""
    commit = store.append_event_batches

    async def slow_commit(batches: Any) -> frozenset[str]:  # a slow disk: every commit takes 5 ms more
        lost = await commit(batches)
        await asyncio.sleep(0.005)
        return lost

    monkeypatch.setattr(store, "append_event_batches", slow_commit)
    bus = LocalBus()

    async def stream(writer: GroupCommit, runs: int, events: int, pause: Callable[[GroupCommit, EventLog], Awaitable[None]]) -> int:
        """The writer's rests until the first run has emitted its last event (the runs' ends, one
        after the other, trickle like a slow stream would)."""
        logs = [EventLog(store, bus, (await start_run(store, await store.create_thread(owner="alice")))[0].id, next_seq=2, writer=writer) for _ in range(runs)]
        rests: list[int] = []

        async def one(event_log: EventLog) -> None:
            for n in range(events):
                event_log.emit_delta("token", "m", f"{n}")
                await pause(writer, event_log)
            rests.append(writer.rests)
            await event_log.wait_for_idle()

        async with anyio.create_task_group() as group:
            for event_log in logs:
                group.start_soon(one, event_log)
        for event_log in logs:
            assert [e.seq for e in await store.read_events(event_log.run_id)] == list(range(1, events + 2))
        return rests[0]

    pace = random.Random(15)

    async def model_pace(writer: GroupCommit, _log: EventLog) -> None:
        # A model slower than the commits: a run has one event per commit. Paced by the writer's
        # commits, not by a clock: on a loaded machine a commit may take longer than a
        # clock-paced stream's every token (it once took all of them in two commits). The event
        # just emitted is queued, so a commit always comes.
        seen = writer.transactions
        while writer.transactions == seen:
            await asyncio.sleep(pace.uniform(0.001, 0.003))

    emitted: dict[EventLog, int] = {}

    async def fast_model(writer: GroupCommit, event_log: EventLog) -> None:
        # A model faster than the store: four tokens per run during every commit. Queued four at
        # a time without yielding, so the writer never finds a run part-way through its four
        # (paced by a clock, a loaded machine once stalled the runs long enough that a commit
        # found one run with a single event queued, and the writer rested).
        emitted[event_log] = emitted.get(event_log, 0) + 1
        if emitted[event_log] % 4:
            return
        seen = writer.transactions
        while writer.transactions == seen:
            await asyncio.sleep(0.0005)

    async def until_committed(_writer: GroupCommit, event_log: EventLog) -> None:
        await event_log.wait_for_idle()

    # (writer's rests expected, runs, events per run, what each run does after an event)
    for rests_expected, runs, events, pause in ((True, 40, 20, model_pace), (False, 3, 200, fast_model), (False, 1, 30, until_committed)):
        writer = GroupCommit(store)
        try:
            rests = await stream(writer, runs, events, pause)
        finally:
            await writer.aclose()
        assert (rests > 0) is rests_expected, (runs, events, rests, writer.transactions)


async def test_events_append_in_batches_and_read_back_in_order_with_paging(store: Store) -> None:
    thread = await store.create_thread(owner="alice")
    run, _, started = await start_run(store, thread)
    seq = 2
    written = [started]
    for size in (1, 7, 4500, 40):  # 4500: more rows than one SQLite multi-row INSERT takes
        batch = [stored(run.id, seq + i, Token(message_id="m", text=f"t{seq + i} ü")) for i in range(size)]
        await store.append_events(run.id, batch)
        written += batch
        seq += size
    await store.append_events(run.id, [])  # an empty batch is nothing
    assert await store.last_seq(run.id) == seq - 1 == len(written)
    assert await store.read_events(run.id, limit=100_000) == written
    assert await store.read_events(run.id, after_seq=10, limit=5) == written[10:15]
    pages: list[StoredEvent] = []
    while page := await store.read_events(run.id, after_seq=pages[-1].seq if pages else 0, limit=1000):
        pages += page
    assert pages == written
    assert await store.read_events(run.id, after_seq=seq) == []
    assert await store.read_events("run_missing") == [] and await store.last_seq("run_missing") == 0


async def test_a_duplicate_seq_is_refused_by_the_database_and_its_batch_written_not_at_all(store: Store, database_url: str) -> None:
    """The primary key (run_id, seq) keeps seqs unique, whichever process writes."""
    thread = await store.create_thread(owner="alice")
    run, _, started = await start_run(store, thread)
    await store.append_events(run.id, [stored(run.id, 2, Token(message_id="m", text="a"))])
    for batch in (
        [stored(run.id, 3, Token(message_id="m", text="b")), stored(run.id, 2, Token(message_id="m", text="dup"))],
        [stored(run.id, 1, Token(message_id="m", text="dup"))],
    ):
        with pytest.raises(sa.exc.IntegrityError):
            await store.append_events(run.id, batch)
    async with another_store(database_url) as other:
        duplicate = [stored(run.id, 2, Token(message_id="m", text="other process"))]
        if other.is_sqlite:
            with pytest.raises(sa.exc.IntegrityError):
                await other.append_events(run.id, duplicate)
        else:  # PostgreSQL: a process that does not execute the run writes none of its events at all
            assert await other.append_events(run.id, duplicate) == {run.id}
    events = await store.read_events(run.id)
    assert [e.seq for e in events] == [1, 2] and events[0] == started
    assert Envelope.from_json(events[1].envelope).data["text"] == "a"
    # The store is still usable after the refused writes.
    await store.append_events(run.id, [stored(run.id, 3, Token(message_id="m", text="b"))])
    assert await store.last_seq(run.id) == 3


async def test_access_lookups_return_what_the_store_wrote_with_the_owner_and_reviewability(store: Store) -> None:
    """The lookups every request's access check makes (on PostgreSQL through asyncpg directly)
    give back the very records the writes returned: JSON as written, timestamps as aware UTC."""
    metadata = {"title": "Ünïcode ✓", "tags": ["a", {"nested": [1, 2.5, None, True]}]}
    thread = await store.create_thread(owner="alice", metadata=metadata)
    run, message, _ = await start_run(store, thread, config={"approval_threshold": "reversible"})
    found_thread = await store.find_thread(thread.id)
    assert found_thread is not None
    assert (found_thread.record.metadata, found_thread.owner, found_thread.reviewable) == (metadata, "alice", False)
    assert found_thread.record.created_at == thread.created_at and found_thread.record.created_at.utcoffset() == timedelta(0)
    found_run = await store.find_run(run.id)
    assert found_run is not None and (found_run.thread_id, found_run.owner) == (thread.id, "alice")
    assert found_run.record == await store.get_run(run.id)
    assert (found_run.record.config, found_run.record.created_at, found_run.record.status) == ({"approval_threshold": "reversible"}, run.created_at, run.status)
    found_message = await store.find_message(message.id)
    assert found_message is not None and (found_message.record.content, found_message.record.created_at) == ("hello", message.created_at)
    assert await store.mark_running(run.id)
    await open_interrupt(store, run)
    assert (await store.find_run(run.id)).reviewable is True  # type: ignore[union-attr]
    assert await store.find_thread("thr_missing") is None and await store.find_run("run_missing") is None and await store.find_message("msg_missing") is None


# -- interrupts --------------------------------------------------------------------------------


async def test_open_interrupt_parks_only_a_running_run(store: Store) -> None:
    thread = await store.create_thread(owner="alice")
    run, _, _ = await start_run(store, thread)
    record = interrupt_record(new_id("int"), run.id, thread.id, utcnow(), utcnow() + HOUR)
    event = stored(run.id, 2, Interrupt(interrupt_id=record.id, action_requests=ACTIONS, review_configs=REVIEW, expires_at="x"))
    assert not await store.open_interrupt(record, event)  # queued: not yet running
    assert await store.latest_interrupt(run.id) is None and await store.last_seq(run.id) == 1

    assert await store.mark_running(run.id)
    assert not await store.mark_running(run.id)
    assert await store.open_interrupt(record, event)
    assert (await store.get_run(run.id)).status == "waiting_human"
    interrupt = await store.get_interrupt(record.id)
    assert (interrupt.status, interrupt.action_requests, interrupt.review_configs, interrupt.turn) == ("pending", ACTIONS, REVIEW, TURN)
    assert await store.read_events(run.id, after_seq=1) == [event]

    again = interrupt_record(new_id("int"), run.id, thread.id, utcnow(), utcnow() + HOUR)
    assert not await store.open_interrupt(again, stored(run.id, 3, Status(stage="thinking")))  # already waiting
    await store.request_cancel(run.id, mode="soft", reason=None, actor="alice")
    assert not await store.open_interrupt(again, stored(run.id, 3, Status(stage="thinking")))  # cancelling
    assert (await store.latest_interrupt(run.id)).id == record.id  # type: ignore[union-attr]
    assert await store.last_seq(run.id) == 2


async def test_resolving_an_interrupt_resumes_its_run_and_a_second_resolution_is_refused(store: Store) -> None:
    run, interrupt = await parked_run(store)
    now = utcnow()
    resolved, event, run_row = await leave(store, interrupt, now=now, actor="bob")
    assert (resolved.status, resolved.resolved_by, resolved.resolved_at) == ("resolved", "bob", now)
    assert resolved.decisions == [Approve(call_id="call_1")]
    assert run_row.status == "running"
    assert (event.seq, event.type) == (3, "resumed")
    assert await store.get_interrupt(interrupt.id) == resolved
    assert await store.read_events(run.id, after_seq=2) == [event]
    assert [(a.action, a.actor, a.interrupt_id) for a in await store.list_audit(run_id=run.id)] == [("decision", "bob", interrupt.id)]

    for to_status in ("resolved", "expired"):
        with pytest.raises(InterruptResolved) as caught:
            await leave(store, interrupt, to_status=to_status, now=interrupt.expires_at + HOUR)
        assert caught.value.details == {"status": "resolved"}
    assert await store.last_seq(run.id) == 3 and len(await store.list_audit(run_id=run.id)) == 1


async def test_an_interrupt_past_its_deadline_cannot_be_resolved_only_expired(store: Store) -> None:
    run, interrupt = await parked_run(store)
    late = interrupt.expires_at + timedelta(seconds=1)
    with pytest.raises(InterruptExpired) as caught:
        await leave(store, interrupt, now=late)  # pending, but past expires_at
    assert caught.value.code == "interrupt_expired"
    assert (await store.get_interrupt(interrupt.id)).status == "pending"
    assert (await store.get_run(run.id)).status == "waiting_human" and await store.last_seq(run.id) == 2

    expired, event, run_row = await leave(store, interrupt, to_status="expired", now=interrupt.expires_at, actor="system")
    assert expired.status == "expired" and run_row.status == "running" and event.type == "resumed"
    assert Envelope.from_json(event.envelope).data["resolution"] == "expired"
    for to_status in ("resolved", "expired"):
        with pytest.raises(InterruptExpired):
            await leave(store, interrupt, to_status=to_status, now=late)
    assert await store.last_seq(run.id) == 3


async def test_an_interrupt_cannot_be_expired_before_its_deadline(store: Store) -> None:
    run, interrupt = await parked_run(store)
    with pytest.raises(InterruptResolved):
        await leave(store, interrupt, to_status="expired", now=interrupt.expires_at - timedelta(microseconds=1))
    assert (await store.get_interrupt(interrupt.id)).status == "pending"
    assert (await store.get_run(run.id)).status == "waiting_human"
    assert await store.last_seq(run.id) == 2 and await store.list_audit(run_id=run.id) == []


async def test_of_fifty_concurrent_resolutions_of_one_interrupt_exactly_one_wins(store: Store, database_url: str) -> None:
    run, interrupt = await parked_run(store)
    async with another_store(database_url) as other:
        with anyio.fail_after(RACE_TIMEOUT_S):
            outcomes = await asyncio.gather(*(leave(store if i % 2 else other, interrupt, actor=f"approver{i}") for i in range(50)), return_exceptions=True)
    winners = [o for o in outcomes if not isinstance(o, BaseException)]
    losers = [o for o in outcomes if isinstance(o, BaseException)]
    assert len(winners) == 1 and len(losers) == 49 and all(isinstance(o, InterruptResolved) for o in losers), losers
    resolved, event, run_row = winners[0]
    assert await store.get_interrupt(interrupt.id) == resolved
    assert await event_types(store, run.id) == ["run_started", "interrupt", "resumed"]
    assert await store.read_events(run.id, after_seq=2) == [event]
    assert run_row.status == "running" and (await store.get_run(run.id)).status == "running"
    assert [a.actor for a in await store.list_audit(run_id=run.id)] == [resolved.resolved_by]


async def test_a_cancel_racing_a_resolution_never_lets_both_win(store: Store, database_url: str) -> None:
    """Either the resolution wins (the run resumed, then cancelling) or the cancel does (the
    interrupt stays pending for finish_run to cancel, nothing resumed): never a resolved
    interrupt whose run did not resume, nor a resume of a run being cancelled.

    One side or the other gets a head start, from a clear one (so both outcomes happen) to
    none (so they overlap).
    """
    seen: set[str] = set()

    async def after(delay: float, call: Awaitable[Any]) -> Any:
        await asyncio.sleep(delay)
        return await call

    async with another_store(database_url) as other:
        # Positive: the resolution starts first; negative: the cancel does.
        for i, head_start in enumerate((0.1, 0.01, 0.003, 0.001, 0.0005, 0, 0, -0.0005, -0.001, -0.003, -0.01, -0.1)):
            run, interrupt = await parked_run(store)
            resolver, canceller = (store, other) if i % 2 else (other, store)
            with anyio.fail_after(RACE_TIMEOUT_S):
                resolution, cancel = await asyncio.gather(
                    after(max(0, -head_start), leave(resolver, interrupt)),
                    after(max(0, head_start), canceller.request_cancel(run.id, mode="hard", reason=None, actor="alice")),
                    return_exceptions=True,
                )
            assert isinstance(cancel, RunRecord) and cancel.status == "cancelling", cancel
            current = await store.get_interrupt(interrupt.id)
            types = await event_types(store, run.id)
            if isinstance(resolution, BaseException):
                assert isinstance(resolution, InterruptResolved), resolution
                assert current.status == "pending" and types == ["run_started", "interrupt"]
                assert await store.list_audit(run_id=run.id) == []
                seen.add("cancel first")
            else:
                assert resolution[2].status == "running"
                assert current.status == "resolved" and types == ["run_started", "interrupt", "resumed"]
                seen.add("resolution first")
            assert (await store.get_run(run.id)).status == "cancelling"
    assert seen == {"cancel first", "resolution first"}


async def test_due_interrupts_next_expiry_and_pending_interrupts_query_pending_ones(store: Store) -> None:
    base = utcnow()
    parked = [await parked_run(store, created_at=base, expires_in=timedelta(minutes=m)) for m in (30, 10, 20)]
    (run30, i30), (run10, i10), (run20, i20) = parked
    assert await store.next_expiry() == base + timedelta(minutes=10)
    assert await store.due_interrupts(base) == []
    assert [i.id for i in await store.due_interrupts(base + timedelta(minutes=25))] == [i10.id, i20.id]
    assert [i.id for i in await store.due_interrupts(base + timedelta(minutes=25), limit=1)] == [i10.id]
    assert [i.id for i in await store.due_interrupts(base + timedelta(minutes=20))] == [i10.id, i20.id]  # due at expires_at

    await leave(store, i10, to_status="expired", now=base + timedelta(minutes=10), actor="system")
    assert await store.next_expiry() == base + timedelta(minutes=20)
    assert [i.id for i in await store.due_interrupts(base + HOUR)] == [i20.id, i30.id]

    assert [i.id for i in await store.pending_interrupts(run_ids=[run20.id])] == [i20.id]
    assert [i.id for i in await store.pending_interrupts(thread_ids=[run30.thread_id])] == [i30.id]
    assert {i.id for i in await store.pending_interrupts(run_ids=[run20.id], thread_ids=[run30.thread_id])} == {i20.id, i30.id}
    assert await store.pending_interrupts(run_ids=[run10.id]) == []
    assert await store.pending_interrupts() == []

    for interrupt in (i20, i30):
        await leave(store, interrupt, now=base)
    assert await store.next_expiry() is None and await store.due_interrupts(base + HOUR) == []


async def test_latest_interrupt_is_the_most_recent_of_its_run(store: Store) -> None:
    run, first = await parked_run(store, created_at=utcnow() - timedelta(minutes=5))
    assert await store.latest_interrupt(run.id) == first
    await leave(store, first)
    second = await open_interrupt(store, run)
    latest = await store.latest_interrupt(run.id)
    assert latest is not None and latest.id == second.id and latest.status == "pending"
    assert await store.latest_interrupt("run_missing") is None
    assert await event_types(store, run.id) == ["run_started", "interrupt", "resumed", "interrupt"]


# -- audit -------------------------------------------------------------------------------------


async def test_audit_entries_list_oldest_first_filtered_by_thread_and_run(store: Store) -> None:
    await store.add_audit([])
    await store.add_audit(
        [AuditEntry(action="cancel", actor="alice", thread_id="thr_a", run_id="run_1", reason="stop", outcome="cancelling", details={"mode": "soft"})]
    )
    await store.add_audit(
        [
            AuditEntry(
                action="decision",
                actor="bob",
                thread_id="thr_a",
                run_id="run_2",
                interrupt_id="int_1",
                call_id="call_1",
                tool="refund",
                args_digest="sha256:ab",
                decision="approve",
                reason=None,
                outcome="accepted",
            ),
            AuditEntry(
                action="tool_executed",
                actor="system",
                thread_id="thr_a",
                run_id="run_2",
                interrupt_id="int_1",
                call_id="call_1",
                tool="refund",
                args_digest="sha256:ab",
                outcome="ok",
            ),
        ]
    )
    await store.add_audit(
        [
            AuditEntry(
                action="expired", actor="system", thread_id="thr_b", run_id="run_3", interrupt_id="int_2", call_id="call_9", tool="delete", decision="expired"
            )
        ]
    )

    entries = await store.list_audit()
    assert [e.action for e in entries] == ["cancel", "decision", "tool_executed", "expired"]
    assert entries[1] == AuditEntry(
        action="decision",
        actor="bob",
        thread_id="thr_a",
        run_id="run_2",
        interrupt_id="int_1",
        call_id="call_1",
        tool="refund",
        args_digest="sha256:ab",
        decision="approve",
        reason=None,
        outcome="accepted",
        details=None,
        id=entries[1].id,
        ts=entries[1].ts,
    )
    assert entries[1].id is not None and entries[1].id.startswith("aud_")
    assert entries[0].details == {"mode": "soft"}
    assert all(e.ts is not None and e.ts.tzinfo is not None and e.ts.utcoffset() == timedelta(0) for e in entries)
    assert [e.ts for e in entries] == sorted(e.ts for e in entries if e.ts is not None)
    assert [e.action for e in await store.list_audit(thread_id="thr_a")] == ["cancel", "decision", "tool_executed"]
    assert [e.action for e in await store.list_audit(run_id="run_2")] == ["decision", "tool_executed"]
    assert [e.action for e in await store.list_audit(thread_id="thr_a", run_id="run_3")] == []
    assert [e.action for e in await store.list_audit(thread_id="thr_b", run_id="run_3")] == ["expired"]
    assert [e.action for e in await store.list_audit(limit=2)] == ["cancel", "decision"]


# -- messages ----------------------------------------------------------------------------------


async def test_add_message_appends_to_the_tree_and_moves_the_active_leaf(store: Store) -> None:
    thread = await store.create_thread(owner="alice")
    base = utcnow()
    u1 = await store.add_message(message(thread, None, "user", "hi", base))
    a1 = await store.add_message(message(thread, u1, "assistant", "hello", base + timedelta(seconds=1), tool_calls=(StoredCall(id="c", name="t", args={}),)))
    t1 = await store.add_message(message(thread, a1, "tool", "42", base + timedelta(seconds=2), tool_call_id="c", name="t"))
    assert (await store.get_thread(thread.id)).active_leaf_id == t1.id
    assert await store.get_message(t1.id) == t1
    assert await store.thread_messages(thread.id) == [u1, a1, t1]
    assert await store.path_to(thread.id, t1.id) == [u1, a1, t1]
    assert await store.path_to(thread.id, a1.id) == [u1, a1]
    assert await store.path_to(thread.id, None) == []


async def test_set_active_leaf_switches_to_the_deepest_newest_leaf_of_a_branch(store: Store) -> None:
    thread = await store.create_thread(owner="alice")
    base = utcnow()
    at = [base + timedelta(seconds=s) for s in range(10)]
    u1 = await store.add_message(message(thread, None, "user", "q", at[0]))
    a1 = await store.add_message(message(thread, u1, "assistant", "first answer", at[1]))
    u2 = await store.add_message(message(thread, a1, "user", "more", at[2]))
    a2 = await store.add_message(message(thread, u2, "assistant", "more answer", at[3]))
    a1b = await store.add_message(message(thread, u1, "assistant", "second answer", at[4]))
    u3 = await store.add_message(message(thread, a1b, "user", "other branch", at[5]))

    assert await store.set_active_leaf(thread.id, a1.id) == a2.id
    assert (await store.get_thread(thread.id)).active_leaf_id == a2.id
    assert await store.set_active_leaf(thread.id, u1.id) == u3.id  # newest child at each level
    assert await store.set_active_leaf(thread.id, a2.id) == a2.id

    run, _, _ = await start_run(store, thread, "busy now")
    with pytest.raises(ThreadBusy):
        await store.set_active_leaf(thread.id, a1.id)
    assert (await store.get_thread(thread.id)).active_leaf_id == run.input_message_id
    assert await finish(store, run.id)
    assert await store.set_active_leaf(thread.id, a1.id) == run.input_message_id  # the run's input now ends that branch
    other = await store.create_thread(owner="alice")
    with pytest.raises(NotFound):
        await store.set_active_leaf(other.id, a1.id)  # not a message of that thread


async def test_an_edited_version_of_an_assistant_message_becomes_its_active_sibling(store: Store) -> None:
    thread = await store.create_thread(owner="alice")
    run, u1, _ = await start_run(store, thread, "question")
    calls = (StoredCall(id="c1", name="lookup", args={}),)
    a1 = await store.add_message(
        MessageRecord(id=new_id("msg"), thread_id=thread.id, parent_id=u1.id, run_id=run.id, role="assistant", content="wrong", tool_calls=calls)
    )
    with pytest.raises(ThreadBusy):
        await store.add_edited_version(a1.id, "during the run")
    assert await finish(store, run.id)
    count = len(await store.thread_messages(thread.id))

    edited = await store.add_edited_version(a1.id, "right")
    assert (edited.parent_id, edited.edited_from_id, edited.role, edited.content, edited.run_id) == (u1.id, a1.id, "assistant", "right", None)
    assert edited.tool_calls is None and edited.status == "complete"
    assert await store.get_message(edited.id) == edited
    assert (await store.get_thread(thread.id)).active_leaf_id == edited.id
    assert len(await store.thread_messages(thread.id)) == count + 1

    with pytest.raises(InvalidRequest) as caught:
        await store.add_edited_version(u1.id, "not mine to edit")
    assert caught.value.code == "not_an_assistant_message"
    assert len(await store.thread_messages(thread.id)) == count + 1


async def test_update_message_changes_only_what_it_is_given(store: Store) -> None:
    thread = await store.create_thread(owner="alice")
    m = await store.add_message(message(thread, None, "assistant", "", utcnow(), status="partial"))
    await store.update_message(m.id, content="streamed text")
    assert (await store.get_message(m.id)).content == "streamed text"
    calls = (StoredCall(id="c1", name="refund", args={"order_id": "42", "amount": 12.5}),)
    await store.update_message(m.id, status="complete", tool_calls=calls)
    updated = await store.get_message(m.id)
    assert (updated.content, updated.status, updated.tool_calls) == ("streamed text", "complete", calls)
    await store.update_message(m.id)  # nothing to change
    assert await store.get_message(m.id) == updated


# -- values ------------------------------------------------------------------------------------

NESTED = {
    "zeta": "first key, last in sort order",
    "ünïcödé ✓": "日本語 — emoji 🧾",
    "floats": [0.1, 1.0, -2.5e-08, 0.30000000000000004, 1e300, 123456.789, -0.0],
    "ints": [0, -1, 2**53 + 1, 2**70],
    "nested": {"b": [1, [2, {"x": None, "y": True, "z": False}]], "a": {}, "empty": []},
    'quote"and\\slash': "line\nbreak\ttab",
}


async def test_json_columns_round_trip_nested_values_identically(store: Store) -> None:
    thread = await store.create_thread(owner="alice", metadata=NESTED)
    run, _, _ = await start_run(store, thread, config={"config": NESTED})
    assert await store.mark_running(run.id)
    assistant = await store.add_message(
        MessageRecord(
            id=new_id("msg"),
            thread_id=thread.id,
            parent_id=run.input_message_id,
            run_id=run.id,
            role="assistant",
            content="",
            tool_calls=(StoredCall(id="c", name="t", args=NESTED),),
        )
    )
    nested_action = ActionRequest(call_id="c", action="t", args=NESTED, description="d", risk="destructive")
    nested_turn = ParkedTurn(calls=(ParkedCall(id="c", name="t", args=NESTED, gated=True, result=NESTED),))
    record = interrupt_record(new_id("int"), run.id, thread.id, utcnow(), utcnow() + HOUR, actions=[nested_action], turn=nested_turn)
    assert await store.open_interrupt(record, stored(run.id, 2, Status(stage="thinking")))
    edited = Edit(call_id="c", args=NESTED)
    decided_turn = ParkedTurn(calls=(ParkedCall(id="c", name="t", args=NESTED, gated=True, result=NESTED, decision=edited),))
    await store.leave_pending(
        record.id,
        to_status="resolved",
        now=utcnow(),
        decisions=[edited],
        turn=decided_turn,
        actor="bob",
        make_event=lambda run_id, seq: stored(run_id, seq, Status(stage="thinking")),
        audit_entries=[AuditEntry(action="decision", actor="bob", details=NESTED)],
    )
    assert await store.finish_run(
        run.id,
        status="failed",
        final_event=stored(run.id, 4, RunError(code="x", message="y")),
        from_statuses=("running",),
        error=RunFailure(code="x", message=json.dumps(NESTED, ensure_ascii=False)),
    )

    interrupt = await store.get_interrupt(record.id)
    values = {
        "metadata": ((await store.get_thread(thread.id)).metadata, NESTED),
        "config": ((await store.get_run(run.id)).config, {"config": NESTED}),
        "error": ((await store.get_run(run.id)).error.message, json.dumps(NESTED, ensure_ascii=False)),  # type: ignore[union-attr]
        "tool_calls": ((await store.get_message(assistant.id)).tool_calls[0].args, NESTED),  # type: ignore[index]
        "action_requests": (interrupt.action_requests[0].args, NESTED),
        "turn": (interrupt.turn.calls[0].args, NESTED),
        "turn result": (interrupt.turn.calls[0].result, NESTED),
        "decisions": (interrupt.decisions[0].args, NESTED),  # type: ignore[index, union-attr]
        "details": ((await store.list_audit())[0].details, NESTED),
    }
    for column, (back, written) in values.items():
        # Equal, and identical as JSON text: same key order, same number forms.
        assert back == written, column
        assert json.dumps(back, ensure_ascii=False) == json.dumps(written, ensure_ascii=False), column
    assert type(interrupt.turn.calls[0].args["floats"][1]) is float and type(interrupt.turn.calls[0].args["floats"][4]) is float


async def test_timestamps_come_back_timezone_aware_utc_as_the_same_instant(store: Store) -> None:
    def is_utc(moment: datetime | None) -> bool:
        return moment is not None and moment.utcoffset() == timedelta(0) and moment.tzinfo is not None

    thread = await store.create_thread(owner="alice")
    run, user, _ = await start_run(store, thread)
    assert await store.mark_running(run.id)
    # An interrupt written with a +02:00 deadline: stored and compared as the same instant.
    plus_two = timezone(timedelta(hours=2))
    created = datetime(2031, 5, 6, 7, 8, 9, 123456, tzinfo=plus_two)
    interrupt = await open_interrupt(store, run, created_at=created, expires_in=timedelta(minutes=10))
    back = await store.get_interrupt(interrupt.id)
    assert back.created_at == created and back.expires_at == created + timedelta(minutes=10)
    assert is_utc(back.created_at) and is_utc(back.expires_at) and back.created_at.hour == 5
    assert await store.next_expiry() == created + timedelta(minutes=10) and is_utc(await store.next_expiry())
    minus_five = timezone(timedelta(hours=-5))
    just_before = (created + timedelta(minutes=10) - timedelta(microseconds=1)).astimezone(minus_five)
    assert await store.due_interrupts(just_before) == []
    assert [i.id for i in await store.due_interrupts(just_before + timedelta(microseconds=1))] == [interrupt.id]
    resolved, _, _ = await leave(store, interrupt, now=created.astimezone(minus_five))  # before the deadline: resolvable
    assert (await store.get_interrupt(interrupt.id)).resolved_at == resolved.resolved_at
    assert is_utc((await store.get_interrupt(interrupt.id)).resolved_at)
    assert await finish(store, run.id, from_statuses=("running",))

    current = await store.get_run(run.id)
    moments = [
        (await store.get_thread(thread.id)).created_at,
        current.created_at,
        current.started_at,
        current.ended_at,
        (await store.get_message(user.id)).created_at,
        (await store.list_threads())[0].created_at,
    ]
    assert all(is_utc(m) for m in moments), moments
    now = utcnow()
    assert all(now - timedelta(minutes=1) < m <= now for m in moments)  # type: ignore[operator]
    assert current.started_at <= current.ended_at  # type: ignore[operator]


async def test_a_lease_renewal_reports_the_cancel_mode_of_each_cancelling_run_it_holds(store: Store) -> None:
    running, quiet = [(await start_run(store, await store.create_thread(owner="alice")))[0] for _ in range(2)]
    for run in (running, quiet):
        assert await store.mark_running(run.id)
    assert await store.renew_leases([running.id, quiet.id]) == {running.id: None, quiet.id: None}
    await store.request_cancel(running.id, mode="soft", reason=None, actor="alice")
    assert await store.renew_leases([running.id, quiet.id]) == {running.id: "soft", quiet.id: None}
    await store.request_cancel(running.id, mode="hard", reason=None, actor="alice")  # upgraded
    assert await store.renew_leases([running.id, quiet.id, "run_missing"]) == {running.id: "hard", quiet.id: None}


async def test_a_run_taken_over_by_another_store_can_no_longer_be_ended_or_parked_by_the_first(store: Store, database_url: str) -> None:
    thread = await store.create_thread(owner="alice")
    run, _, _ = await start_run(store, thread)
    assert await store.mark_running(run.id)
    assert await store.renew_leases([run.id]) == {run.id: None}  # ours, and still held
    async with another_store(database_url) as other:
        # The first store stalls past its lease; the other one claims the run.
        store.lease_s = other.lease_s = 0.05
        assert await store.renew_leases([run.id]) == {run.id: None}
        await asyncio.sleep(0.1)
        claimed = await other.claim_abandoned()
        assert [r.id for r in claimed] == [run.id] and claimed[0].executor_id == other.instance_id
        # The first store learns it at its next renewal, and cannot finish or park the run.
        assert await store.renew_leases([run.id]) == {}
        final = stored(run.id, 2, Done(message_id=None))
        assert not await store.finish_run(run.id, status="completed", final_event=final, from_statuses=("running",), as_executor=True)
        assert not await store.open_interrupt(
            interrupt_record("int_stale", run.id, thread.id, utcnow(), utcnow() + HOUR, actions=[], review=[], turn=ParkedTurn()),
            stored(run.id, 2, Status(stage="x")),
        )
        assert (await store.get_run(run.id)).status == "running" and await store.last_seq(run.id) == 1
        # The new owner can.
        assert await other.finish_run(run.id, status="completed", final_event=final, from_statuses=("running",), as_executor=True)


async def lapse_lease(store: Store, run_id: str) -> None:
    """The run's executor stalled past its lease (its claim ran out a while ago)."""
    async with store.transaction() as conn:
        await conn.execute(tables.runs.update().where(tables.runs.c.id == run_id).values(lease_expires_at=utcnow() - HOUR))


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
async def test_a_stalled_executor_can_never_write_into_the_log_of_a_run_another_process_took_over(store: Store, database_url: str) -> None:
    """The events an executor commits are fenced by its lease. Raced 40 times: the first
    process keeps committing events of its run while the second claims the run, reads its last
    seq and appends the next one. The second's append must never collide with a late write of
    the first (found under load: the new executor's run failed with a duplicate seq), and the
    first learns at its first refused commit that the run is not its own any more."""
    async with another_store(database_url) as other:
        listener = await asyncpg.connect(store.pg_dsn)
        notices: list[str] = []
        await listener.add_listener(channels.EVENTS_CHANNEL, lambda *args: notices.append(args[-1]))
        try:
            for attempt in range(40):
                run, _, _ = await start_run(store, await store.create_thread(owner="alice"))
                assert await store.mark_running(run.id)

                async def first(run_id: str = run.id) -> int:
                    seq = 2
                    while not await store.append_events(run_id, [stored(run_id, seq, Status(stage="first"))]):
                        seq += 1
                    return seq  # the first seq it could not write

                async def second(run_id: str = run.id, attempt: int = attempt) -> int:
                    for _ in range(attempt % 4):  # the claim lands after a few of the first's commits, or at once
                        await asyncio.sleep(0)
                    await lapse_lease(other, run_id)
                    assert run_id in [r.id for r in await other.claim_abandoned()]
                    seq = await other.last_seq(run_id) + 1
                    assert await other.append_events(run_id, [stored(run_id, seq, Status(stage="second"))]) == frozenset()
                    return seq

                with anyio.fail_after(30):
                    refused, taken = await asyncio.gather(first(), second())
                written = await store.read_events(run.id)
                assert [e.seq for e in written] == list(range(1, taken + 1)), attempt  # gapless, no seq twice
                assert [Envelope.from_json(e.envelope).data["stage"] for e in written[1:]] == ["first"] * (taken - 2) + ["second"]
                assert refused == taken  # refused from the claim on: its last write came before the second's read
            # A group commit with a run it holds and one it lost writes and announces only the first.
            lost_run, _, _ = await start_run(store, await store.create_thread(owner="alice"))
            kept_run, _, _ = await start_run(store, await store.create_thread(owner="alice"))
            await lapse_lease(other, lost_run.id)
            assert lost_run.id in [r.id for r in await other.claim_abandoned()]
            notices.clear()
            batches = [(run_id, [stored(run_id, 2, Token(message_id="m", text="x"))]) for run_id in (lost_run.id, kept_run.id)]
            assert await store.append_event_batches(batches) == {lost_run.id}
            assert await store.last_seq(lost_run.id) == 1 and await store.last_seq(kept_run.id) == 2
            with anyio.fail_after(10):
                while not notices:
                    await asyncio.sleep(0.01)
            assert [channels.parse_events_payload(n).runs for n in notices] == [[(kept_run.id, 2)]]
        finally:
            await listener.close()


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
async def test_the_group_commit_stops_the_executor_of_a_run_taken_over_and_publishes_nothing_of_it(
    store: Store, database_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    writer = GroupCommit(store)
    bus = LocalBus()
    published: list[int] = []
    monkeypatch.setattr(bus, "publish", lambda run_id, batch: published.extend(e.seq for e in batch))
    run, _, _ = await start_run(store, await store.create_thread(owner="alice"))
    try:
        async with another_store(database_url) as other:

            async def execute() -> None:  # as a run's executor task does: it starts its log
                event_log = EventLog(store, bus, run.id, next_seq=2, writer=writer)
                event_log.start()
                event_log.emit_delta("token", "m", "mine")
                await event_log.wait_for_idle()
                await lapse_lease(other, run.id)  # it stalls; the other process takes the run over
                assert run.id in [r.id for r in await other.claim_abandoned()]
                event_log.emit_delta("token", "m", "too late")
                await asyncio.Event().wait()  # it would go on forever: the writer stops it

            executor = asyncio.create_task(execute())
            with anyio.fail_after(10), pytest.raises(asyncio.CancelledError):
                await executor
            assert published == [2] and await store.last_seq(run.id) == 2
            assert f"run {run.id} was taken over by another process; stopping here" in caplog.text
    finally:
        await writer.aclose()


#: A process that opens a store and the demo agent's own table, works a run through the store,
#: and prints which of the modules a restart should not need are loaded: first after that work,
#: then after an agent's own write through ``Store.transaction()`` (which makes the async engine).
_OPEN_AND_WORK = """
import asyncio, json, sys
from tether.demo import DemoShop, demo_effects
from tether.store import AtLeaf, Store
LAZY = ("alembic", "sqlalchemy.ext.asyncio", "sqlalchemy.orm", "greenlet", "aiosqlite")
async def main():
    store = await Store.open(sys.argv[1])
    await DemoShop().open(store)
    thread = await store.create_thread(owner="local")
    created = await store.create_run(thread_id=thread.id, attach=AtLeaf(content="hi"), config={}, owner="local")
    assert [e.type for e in await store.read_events(created.run.id)][0] == "run_started"
    before = [m for m in LAZY if m in sys.modules]
    async with store.transaction() as conn:
        await conn.execute(demo_effects.insert().values(call_id="c", run_id=created.run.id, tool="t", args={}, ts=created.run.created_at))
    async with store.connection() as conn:
        rows = (await conn.execute(demo_effects.select())).all()
    await store.aclose()
    print(json.dumps({"before": before, "after": [m for m in LAZY if m in sys.modules], "effects": len(rows)}))
asyncio.run(main())
"""


def test_the_head_revision_is_the_newest_migration(tmp_path: Path) -> None:
    from tether.store._engine import HEAD_REVISION

    config = Config()
    config.set_main_option("script_location", str(Path(tables.__file__).parent / "migrations"))
    assert ScriptDirectory.from_config(config).get_current_head() == HEAD_REVISION


def test_a_restart_on_a_database_at_head_loads_neither_alembic_nor_the_async_engine_until_an_agent_uses_it(db_url: str) -> None:
    """The store's own operations never go through SQLAlchemy's asyncio engine: on a database at
    the newest schema, with an agent's tables already there, neither Alembic nor that engine's
    modules are imported; an agent's first ``Store.transaction()`` makes the engine and works."""

    def open_and_work() -> dict[str, Any]:
        done = subprocess.run([sys.executable, "-c", _OPEN_AND_WORK, db_url], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        result: dict[str, Any] = json.loads(done.stdout)
        return result

    first = open_and_work()  # an empty database: migrated, the demo's table created
    assert "alembic" in first["before"] and "sqlalchemy.ext.asyncio" in first["before"]
    again = open_and_work()  # a restart: only checked
    assert again["before"] == []
    assert "sqlalchemy.ext.asyncio" in again["after"] and "alembic" not in again["after"]
    assert (first["effects"], again["effects"]) == (1, 2)


async def test_closing_a_postgresql_store_does_not_wait_forever_for_a_connection_never_given_back(pg_db_url: str) -> None:
    """A connection of the direct pool held by a task that never resumes (its loop was
    interrupted, say) must not hold the store's close, and so the process's exit."""
    store = await Store.open(pg_db_url)
    holding = anyio.Event()
    never = anyio.Event()

    async def hold() -> None:
        async with store._reading() as conn:  # a direct connection, checked out
            await conn.execute(sa.select(sa.literal(1)))
            holding.set()
            await never.wait()

    holder = asyncio.create_task(hold())
    try:
        with anyio.fail_after(10):
            await holding.wait()
            await store.aclose()  # gives up waiting for the held connection and closes it
    finally:
        holder.cancel()
        with contextlib.suppress(BaseException):
            await holder


async def test_after_postgresql_closed_every_pooled_connection_the_next_operations_succeed(pg_db_url: str) -> None:
    import asyncpg

    async with another_store(pg_db_url) as store:
        # SQLAlchemy's pool serves agents' own tables (``Store.connection()``), the direct pool
        # (``_pgdirect``) the store's own operations: fill both with idle connections.
        pooled: set[Any] = set()  # the asyncpg connections SQLAlchemy's pool checks out
        sa.event.listen(store.engine.sync_engine, "checkout", lambda dbapi_conn, _record, _proxy: pooled.add(dbapi_conn.driver_connection))
        all_out = anyio.Event()

        async def hold() -> None:
            async with store.connection() as conn:
                await conn.execute(sa.select(sa.literal(1)))
                if len(pooled) == 3:
                    all_out.set()
                await all_out.wait()

        with anyio.fail_after(10):
            await asyncio.gather(*(hold() for _ in range(3)))
        thread = await store.create_thread(owner="alice")
        await asyncio.gather(*(store.get_thread(thread.id) for _ in range(10)))  # ten at once: ten connections
        run, _, _ = await start_run(store, thread)
        assert store._direct is not None and store._direct._pool is not None
        direct = [holder._con for holder in store._direct._pool._holders if holder._con is not None]
        admin = await asyncpg.connect(pg_db_url)
        try:
            # The server ends every other connection to this database (as a restart would).
            ended = await admin.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            assert ended >= 2
            with anyio.fail_after(10):
                while await admin.fetchval("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"):
                    await asyncio.sleep(0.01)  # polling the server for the condition
        finally:
            await admin.close()
        # The event loop reads each ended connection's last message and then its end, an
        # iteration or two apart; wait until the store's side has seen every one of them end
        # (asyncpg's own state of the pooled connections, read here only to know when).
        assert len(pooled) == 3 and len(direct) >= 2
        with anyio.fail_after(10):
            while not all(conn.is_closed() for conn in [*pooled, *direct]):
                await asyncio.sleep(0)
        # No operation sees a dead connection: each is replaced when it is checked out.
        reads = await asyncio.gather(*(store.get_thread(thread.id) for _ in range(10)))
        assert {r.id for r in reads} == {thread.id}
        assert await store.mark_running(run.id)
        assert (await store.get_run(run.id)).status == "running"
        await asyncio.gather(*(store.append_events(run.id, [stored(run.id, seq, Token(message_id="m", text=str(seq)))]) for seq in (2, 3, 4)))
        assert [e.seq for e in await store.read_events(run.id)] == [1, 2, 3, 4]
        async with store.connection() as conn:  # and agents' own connections too
            assert (await conn.execute(sa.select(sa.literal(7)))).scalar_one() == 7


async def test_postgresql_connections_opened_for_a_burst_stay_open_for_the_next_one(pg_db_url: str) -> None:
    from tether.store._engine import POOL_CONNECTIONS

    async with another_store(pg_db_url) as store:

        async def burst() -> set[int]:
            """POOL_CONNECTIONS connections held at once (each waits until all are out)."""
            all_out = anyio.Event()
            pids: set[int] = set()

            async def hold() -> None:
                async with store.connection() as conn:
                    pids.add((await conn.exec_driver_sql("SELECT pg_backend_pid()")).scalar_one())
                    if len(pids) == POOL_CONNECTIONS:
                        all_out.set()
                    await all_out.wait()

            with anyio.fail_after(30):
                async with anyio.create_task_group() as group:
                    for _ in range(POOL_CONNECTIONS):
                        group.start_soon(hold)
            return pids

        first = await burst()
        assert len(first) == POOL_CONNECTIONS
        # The next burst finds every connection of the first one open: none is opened again.
        assert await burst() == first


async def test_postgresql_event_commits_do_not_wait_behind_a_crowd_holding_every_shared_connection(pg_db_url: str) -> None:
    """The group commit has a connection of its own: with every connection of the store's
    shared pool taken (a crowd of starts and ends), a run's events still commit at once."""
    from tether.store._pgdirect import DIRECT_CONNECTIONS

    async with another_store(pg_db_url) as store:
        thread = await store.create_thread(owner="alice")
        run, _, _ = await start_run(store, thread)
        assert await store.mark_running(run.id)
        before = [e.seq for e in await store.read_events(run.id)]
        assert store._direct is not None
        held, release = anyio.Event(), anyio.Event()
        holders = 0

        async def hold() -> None:
            nonlocal holders
            assert store._direct is not None
            async with store._direct.connection() as conn:
                await conn.exec_driver_sql("SELECT 1")
                holders += 1
                if holders == DIRECT_CONNECTIONS:
                    held.set()
                await release.wait()

        async with anyio.create_task_group() as group:
            for _ in range(DIRECT_CONNECTIONS):
                group.start_soon(hold)
            with anyio.fail_after(30):
                await held.wait()
            # The shared pool is exhausted: an operation on it waits ...
            waiting = asyncio.ensure_future(store.get_thread(thread.id))
            # ... and the events commit all the same.
            batch = [stored(run.id, seq, Token(message_id="m", text=str(seq))) for seq in range(before[-1] + 1, before[-1] + 4)]
            with anyio.fail_after(10):
                await store.append_event_batches([(run.id, batch)])
            assert not waiting.done()
            release.set()
        with anyio.fail_after(30):
            assert (await waiting).id == thread.id
        assert [e.seq for e in await store.read_events(run.id)] == [*before, *(e.seq for e in batch)]


async def test_a_thread_to_start_on_is_read_with_the_requesters_busy_runs_in_one_lookup(store: Store) -> None:
    # Busy: queued, running, cancelling; a run waiting for a human holds nothing, an ended one neither.
    threads = [await store.create_thread(owner="alice") for _ in range(5)]
    queued, _, _ = await start_run(store, threads[0], requested_by="alice")
    running, _, _ = await start_run(store, threads[1], requested_by="alice")
    assert await store.mark_running(running.id)
    cancelling, _, _ = await start_run(store, threads[2], requested_by="alice")
    await store.request_cancel(cancelling.id, mode="soft", reason=None, actor="alice")
    parked, _, _ = await start_run(store, threads[3], requested_by="alice")
    assert await store.mark_running(parked.id)
    await open_interrupt(store, parked)
    ended, _, _ = await start_run(store, threads[4], requested_by="alice")
    assert await finish(store, ended.id)
    await start_run(store, await store.create_thread(owner="bob"), requested_by="bob")

    found, busy = await store.find_thread_to_start(threads[0].id, requested_by="alice")
    assert found == await store.find_thread(threads[0].id) and busy == 3 == await store.count_active_runs(requested_by="alice")
    assert (await store.find_thread_to_start(threads[0].id, requested_by="carol"))[1] == 0
    assert await store.find_thread_to_start("thr_missing", requested_by="alice") == (None, 0)
