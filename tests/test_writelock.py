"""The SQLite store's write lock (tether/store/_writelock.py): exclusive, wakes all, fair, cancellable."""

from __future__ import annotations

import asyncio
import random

import pytest

from tether.store._writelock import WriteLock

pytestmark = pytest.mark.anyio


async def test_many_tasks_never_hold_it_together_and_all_get_it() -> None:
    rng = random.Random(20261203)
    lock = WriteLock()
    holding = 0
    turns: list[int] = []

    async def worker(n: int) -> None:
        nonlocal holding
        for _ in range(20):
            async with lock:
                holding += 1
                assert holding == 1
                if rng.random() < 0.3:  # some hold it across an await, as the group commit does
                    await asyncio.sleep(0)
                holding -= 1
                turns.append(n)
            if rng.random() < 0.5:
                await asyncio.sleep(0)

    async with asyncio.timeout(30):
        await asyncio.gather(*(worker(n) for n in range(50)))
    assert sorted(turns) == sorted(n for n in range(50) for _ in range(20))
    assert not lock.locked()


async def test_a_release_lets_every_waiter_through_in_the_same_turn() -> None:
    lock = WriteLock()
    done: list[int] = []
    turn = 0
    await lock.acquire()

    async def short(n: int) -> None:
        async with lock:  # synchronous statements: no await inside
            done.append(turn)

    async with asyncio.timeout(10):
        tasks = [asyncio.create_task(short(n)) for n in range(8)]
        await asyncio.sleep(0)  # all eight wait now
        assert done == []
        lock.release()
        while len(done) < 8:
            turn += 1
            await asyncio.sleep(0)
        await asyncio.gather(*tasks)
    assert done == [done[0]] * 8, done  # all in one turn (a first-in-first-out lock takes eight)


async def test_a_holder_that_takes_it_back_at_once_cannot_keep_the_woken_waiters_out() -> None:
    lock = WriteLock()
    got: list[str] = []
    stop = asyncio.Event()

    async def greedy() -> None:
        # Takes the lock again right after each release, holding it across an await each time.
        while not stop.is_set():
            async with lock:
                await asyncio.sleep(0)

    async def start(n: int) -> None:
        async with lock:
            got.append(f"start {n}")

    async with asyncio.timeout(10):
        hog = asyncio.create_task(greedy())
        await asyncio.sleep(0)
        await asyncio.gather(*(start(n) for n in range(8)))
        stop.set()
        await hog
    assert sorted(got) == sorted(f"start {n}" for n in range(8))


async def test_a_woken_waiter_cancelled_before_it_runs_passes_the_lock_on() -> None:
    lock = WriteLock()
    await lock.acquire()
    owed = asyncio.create_task(lock.acquire())
    await asyncio.sleep(0)  # it waits
    # Its first step runs before the owed one's wake-up: it finds the lock owed to another, waits.
    late = asyncio.create_task(lock.acquire())
    lock.release()  # the lock is owed to the waiter it woke
    owed.cancel()  # which is cancelled before it runs
    async with asyncio.timeout(10):
        with pytest.raises(asyncio.CancelledError):
            await owed
        await late  # not stuck: the cancelled one passed the lock on
    assert lock.locked()
    lock.release()
    assert not lock.locked()


async def test_a_waiter_cancelled_while_the_lock_is_held_leaves_it_to_the_others() -> None:
    lock = WriteLock()
    await lock.acquire()
    gone = asyncio.create_task(lock.acquire())
    stays = asyncio.create_task(lock.acquire())
    await asyncio.sleep(0)
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    lock.release()
    async with asyncio.timeout(10):
        await stays
    assert lock.locked()
    lock.release()


async def test_releasing_it_unheld_is_an_error() -> None:
    with pytest.raises(RuntimeError):
        WriteLock().release()
