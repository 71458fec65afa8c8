"""The in-process bus: a subscription's waits (woken by a batch, the end, staleness or an idle
moment; never lost between two waits, never left behind by a cancelled wait), and many
publishers and readers racing without an event lost, duplicated or reordered."""

from __future__ import annotations

import asyncio
import random

import pytest

from tether.events import StoredEvent
from tether.runtime import LocalBus, Subscription

pytestmark = pytest.mark.anyio


def event(seq: int) -> StoredEvent:
    return StoredEvent(seq, "token", f'{{"seq":{seq}}}')


async def next_wait(subscription: Subscription, timeout: float = 30.0) -> list[StoredEvent] | None:
    """One wait of the reader, bounded (a lost wake-up fails the test instead of hanging it)."""
    return await asyncio.wait_for(subscription.wait_for_events(timeout), 60)


async def test_a_waiting_reader_is_woken_by_a_batch_published_from_another_task() -> None:
    bus = LocalBus()
    with bus.subscribe("run_a") as live:
        waiting = asyncio.create_task(next_wait(live))
        await asyncio.sleep(0)  # the reader is waiting now
        assert not waiting.done()
        bus.publish("run_a", [event(1), event(2)])
        assert [e.seq for e in await waiting or []] == [1, 2]


async def test_a_batch_published_before_the_wait_is_returned_without_waiting() -> None:
    bus = LocalBus()
    with bus.subscribe("run_a") as live:
        bus.publish("run_a", [event(1)])
        bus.publish("run_a", [event(2)])
        assert [e.seq for e in await next_wait(live) or []] == [1, 2]
        # Nothing is left over for the next wait, which waits again.
        waiting = asyncio.create_task(next_wait(live))
        await asyncio.sleep(0)
        assert not waiting.done()
        bus.publish("run_a", [event(3)])
        assert [e.seq for e in await waiting or []] == [3]


async def test_an_idle_wait_returns_none_and_a_batch_right_after_it_is_not_lost() -> None:
    bus = LocalBus()
    with bus.subscribe("run_a") as live:
        assert await next_wait(live, timeout=0.05) is None  # nothing was published: a keep-alive
        bus.publish("run_a", [event(1)])
        assert [e.seq for e in await next_wait(live, timeout=0.05) or []] == [1]


async def test_the_end_and_staleness_each_wake_a_waiting_reader() -> None:
    bus = LocalBus()
    with bus.subscribe("run_a") as stale, bus.subscribe("run_a") as ended:
        waits = [asyncio.create_task(next_wait(s)) for s in (stale, ended)]
        await asyncio.sleep(0)
        assert not any(w.done() for w in waits)
        stale.mark_stale()
        bus.end_streams()
        assert await waits[0] == [] and stale.stale
        assert await waits[1] == [] and ended.ended


async def test_a_cancelled_wait_leaves_the_subscription_working() -> None:
    bus = LocalBus()
    with bus.subscribe("run_a") as live:
        waiting = asyncio.create_task(next_wait(live))
        await asyncio.sleep(0)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        bus.publish("run_a", [event(1)])  # after the cancelled wait, before the next one
        assert [e.seq for e in await next_wait(live) or []] == [1]


async def test_many_publishers_and_readers_racing_deliver_every_event_once_in_order() -> None:
    """20 runs, each published in random batches at random moments, each followed by three
    readers that wait with short timeouts (so idle returns race with publishes too)."""
    rng = random.Random(1234)
    bus = LocalBus(max_pending_bytes=10**9)  # never stale here: every event comes through the queue
    runs, per_run, readers_per_run = 20, 300, 3
    subscriptions = {f"run_{r}": [bus.open(f"run_{r}") for _ in range(readers_per_run)] for r in range(runs)}
    received: dict[tuple[str, int], list[int]] = {}

    async def publish(run_id: str) -> None:
        seq = 0
        while seq < per_run:
            size = rng.randint(1, 7)
            bus.publish(run_id, [event(s) for s in range(seq + 1, min(per_run, seq + size) + 1)])
            seq = min(per_run, seq + size)
            await asyncio.sleep(rng.choice([0, 0, 0, 0.001]))

    async def read(run_id: str, n: int, subscription: Subscription) -> None:
        got = received.setdefault((run_id, n), [])
        while len(got) < per_run:
            batch = await next_wait(subscription, timeout=rng.choice([0.001, 0.005, 1.0]))
            got.extend(e.seq for e in batch or [])

    try:
        async with asyncio.timeout(120):
            await asyncio.gather(
                *(publish(run_id) for run_id in subscriptions),
                *(read(run_id, n, s) for run_id, subs in subscriptions.items() for n, s in enumerate(subs)),
            )
    finally:
        for subs in subscriptions.values():
            for s in subs:
                bus.close(s)
    assert len(received) == runs * readers_per_run
    assert all(got == list(range(1, per_run + 1)) for got in received.values())
    assert bus.total_subscribers() == 0
