"""The PostgreSQL bus hands what another process committed to every local follower after one read.

Two stores on one PostgreSQL database stand for two server processes: process A appends a
run's events (each commit sends ``NOTIFY``); process B has several followers of that run. B's
bus reads the new events once per notification, not once per follower, and every follower
still gets the whole log, gapless, in order.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import anyio
import pytest

from tether.errors import NotFound, ThreadBusy
from tether.events import Envelope, Token, now_ts
from tether.runtime import follow_run
from tether.runtime._pgbus import PostgresBus
from tether.store import AtLeaf, Store, StoredEvent
from tether.store._notify import EVENTS_CHANNEL, MAX_PAYLOAD_BYTES, events_payloads, parse_events_payload

pytestmark = pytest.mark.anyio

FOLLOWERS = 8
COMMITS = 30


def token(run_id: str, seq: int) -> StoredEvent:
    return StoredEvent(seq, "token", Envelope.encode(run_id, seq, Token(message_id="m", text=f"t{seq}"), now_ts()))


@pytest.fixture
async def two_processes(pg_db_url: str) -> AsyncIterator[tuple[Store, Store]]:
    a, b = await Store.open(pg_db_url), await Store.open(pg_db_url)
    try:
        yield a, b
    finally:
        await a.aclose()
        await b.aclose()


async def test_followers_on_another_process_share_one_read_per_notification(two_processes: tuple[Store, Store]) -> None:
    a, b = two_processes
    thread = await a.create_thread(owner="alice")
    run = (await a.create_run(thread_id=thread.id, attach=AtLeaf(content="hi"), config={})).run
    reads = 0

    async def counted_read(run_id: str, after_seq: int, limit: int) -> list[StoredEvent]:
        nonlocal reads
        reads += 1
        return await b.read_events(run_id, after_seq=after_seq, limit=limit)

    dsn = b.engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
    bus = PostgresBus(dsn, b.instance_id, read_events=counted_read)
    await bus.start()
    last = 1 + COMMITS
    try:
        attached = anyio.Event()
        attached_count = 0
        logs: list[list[int]] = [[] for _ in range(FOLLOWERS)]

        async def follow(i: int) -> None:
            nonlocal attached_count
            async for batch in follow_run(b, bus, run.id, idle_timeout=60):
                if not logs[i] and batch:
                    attached_count += 1
                    if attached_count == FOLLOWERS:
                        attached.set()
                logs[i] += [e.seq for e in batch]
                if logs[i] and logs[i][-1] == last:
                    return

        with anyio.fail_after(60):
            async with anyio.create_task_group() as group:
                for i in range(FOLLOWERS):
                    group.start_soon(follow, i)
                await attached.wait()  # every follower replayed run_started: now only live events
                for seq in range(2, last + 1):
                    await a.append_events(run.id, [token(run.id, seq)])
                    await asyncio.sleep(0)  # let notifications interleave with the commits
        for log in logs:
            assert log == list(range(1, last + 1))
        # The first notification only wakes the followers (each catches up itself, reading
        # through the store directly); after that the bus reads once per round of notifications
        # for all of them. Per follower it would be COMMITS × FOLLOWERS reads.
        assert 1 <= reads <= COMMITS, reads
    finally:
        await bus.aclose()


def test_a_commit_of_many_runs_is_announced_in_few_payloads_each_under_the_limit() -> None:
    runs = [(f"run_{i:026d}", i + 2) for i in range(600)]
    payloads = events_payloads("proc_a", runs)
    assert 1 < len(payloads) <= 4  # not one per run
    assert all(len(p.encode()) <= MAX_PAYLOAD_BYTES for p in payloads)
    notices = [parse_events_payload(p) for p in payloads]
    assert {n.origin for n in notices} == {"proc_a"}
    assert [r for n in notices for r in n.runs] == runs
    assert parse_events_payload("proc_a run_1 x run_2").runs == [("run_1", -1)]  # a bad seq; a run without one


async def test_a_group_commit_of_hundreds_of_runs_reaches_every_follower_on_another_process(two_processes: tuple[Store, Store]) -> None:
    import asyncpg

    a, b = two_processes
    runs = []
    for _ in range(300):
        thread = await a.create_thread(owner="alice")
        run = (await a.create_run(thread_id=thread.id, attach=AtLeaf(content="hi"), config={})).run
        runs.append(run.id)
    dsn = b.engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
    bus = PostgresBus(dsn, b.instance_id, read_events=lambda run_id, after, limit: b.read_events(run_id, after_seq=after, limit=limit))
    await bus.start()
    payloads: list[str] = []
    listener = await asyncpg.connect(dsn)
    await listener.add_listener(EVENTS_CHANNEL, lambda _c, _p, _ch, payload: payloads.append(payload))
    try:
        attached = 0
        all_attached = anyio.Event()

        async def follow(run_id: str) -> None:
            nonlocal attached
            async for batch in follow_run(b, bus, run_id, idle_timeout=60):
                if batch and batch[0].seq == 1:
                    attached += 1
                    if attached == len(runs):
                        all_attached.set()
                if batch and batch[-1].seq == 3:
                    return

        with anyio.fail_after(60):
            async with anyio.create_task_group() as group:
                for run_id in runs:
                    group.start_soon(follow, run_id)
                await all_attached.wait()
                # Two group commits, each with an event of every run: every follower gets both.
                await a.append_event_batches([(run_id, [token(run_id, 2)]) for run_id in runs])
                await a.append_event_batches([(run_id, [token(run_id, 3)]) for run_id in runs])
        announced = [r for p in payloads for r in parse_events_payload(p).runs]
        assert sorted(announced) == sorted([(r, 2) for r in runs] + [(r, 3) for r in runs])
        assert len(payloads) < 10  # a few per commit, not 300
    finally:
        await listener.close()
        await bus.aclose()


async def test_a_run_start_is_announced_on_commit_with_its_last_seq_and_a_refused_one_is_not(two_processes: tuple[Store, Store]) -> None:
    # A run start on PostgreSQL is one statement (the run, its messages, the leaf, its events and
    # their notification): another process hears of it as of any commit of events.
    import asyncpg

    a, b = two_processes
    dsn = b.engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
    heard: asyncio.Queue[str] = asyncio.Queue()
    listener = await asyncpg.connect(dsn)
    await listener.add_listener(EVENTS_CHANNEL, lambda _c, _p, _ch, payload: heard.put_nowait(payload))
    try:
        thread = await a.create_thread(owner="alice")
        with anyio.fail_after(30):
            created = await a.create_run(thread_id=thread.id, attach=AtLeaf(content="hi"), config={}, running=True)
            notice = parse_events_payload(await heard.get())
            assert (notice.origin, notice.runs) == (a.instance_id, [(created.run.id, 2)])
            assert await b.read_events(created.run.id) == created.events
            # Refused (the thread is busy; another owner's): nothing is written, nothing announced.
            with pytest.raises(ThreadBusy):
                await a.create_run(thread_id=thread.id, attach=AtLeaf(content="again"), config={}, running=True)
            with pytest.raises(NotFound):
                await a.create_run(thread_id=thread.id, attach=AtLeaf(content="mine?"), config={}, owner="bob")
            # A commit of events after the refusals: the next notification heard is its own.
            await a.append_events(created.run.id, [token(created.run.id, 3)])
            assert parse_events_payload(await heard.get()).runs == [(created.run.id, 3)]
        assert heard.empty()
        assert [m.id for m in await b.thread_messages(thread.id)] == [created.input.id, created.first_turn.id]  # type: ignore[union-attr]
    finally:
        await listener.close()
