"""``IdleTimer``: one timer for "nothing happened for N seconds", re-armed lazily."""

from __future__ import annotations

import asyncio

import anyio
import pytest

from tether._idle import IdleTimer

pytestmark = pytest.mark.anyio


async def test_it_fires_only_after_a_full_idle_period_since_the_last_touch() -> None:
    loop = asyncio.get_running_loop()
    period = 0.05
    touches: list[float] = []
    fires: list[float] = []
    fired = asyncio.Event()

    def on_idle() -> None:
        fires.append(loop.time())
        fired.set()

    timer = IdleTimer(period, on_idle)
    try:
        # Touched every 10 ms for six idle periods; a loaded machine may stall longer than a
        # period between two touches, and then a fire is right: what must hold is that every
        # fire comes a whole period after the touch before it.
        for _ in range(30):
            timer.touch()
            touches.append(loop.time())
            await asyncio.sleep(0.01)
        with anyio.fail_after(5):  # left alone, it fires
            while not fires or fires[-1] < touches[-1]:
                fired.clear()
                await fired.wait()
    finally:
        timer.cancel()
    for fire in fires:
        before = max((t for t in touches if t <= fire), default=None)
        assert before is None or fire - before >= period - 1e-3, (fire, before)
    stalls = sum(1 for a, b in zip(touches, touches[1:], strict=False) if b - a >= period)
    assert len(fires) <= stalls + 1 + 1  # a fire per stall at most, then the final one


async def test_it_fires_again_after_each_further_idle_period_until_cancelled() -> None:
    count = 0
    third = asyncio.Event()

    def on_idle() -> None:
        nonlocal count
        count += 1
        if count == 3:
            third.set()

    timer = IdleTimer(0.02, on_idle)
    with anyio.fail_after(5):
        await third.wait()
    timer.cancel()
    seen = count
    await asyncio.sleep(0.1)  # five periods: a cancelled timer stays quiet
    assert count == seen


async def test_on_idle_may_cancel_its_own_timer() -> None:
    fired = asyncio.Event()
    timer: IdleTimer | None = None

    def once() -> None:
        assert timer is not None
        timer.cancel()
        fired.set()

    timer = IdleTimer(0.01, once)
    with anyio.fail_after(5):
        await fired.wait()
    assert timer._handle is None
