"""The scripted model's pacing: ``delay_ms`` apart on the model's own clock, or after each delta.

A real provider streams at its own pace: a server that is slow to read gets the tokens that
piled up at once, it does not slow the model down. The scripted model (the test double of an
LLM) paces the same way by default; ``"pace": "gap"`` keeps the older behaviour. These tests run
it on a fake clock (no real waiting): each wait it asks for moves the clock, and a "busy
server" moves it further between two deltas.
"""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import pytest

from tether import ScriptedModel
from tether.models import ChatMessage, ModelRequest, TextDelta, scripted
from tether.models.scripted import Pace

pytestmark = pytest.mark.anyio


def test_on_the_clock_a_delta_is_due_n_delays_after_the_start_and_a_late_one_goes_at_once() -> None:
    pace = Pace(0.02)
    assert pace.wait_s(10.0) == pytest.approx(0.02)  # delta 1 due at 10.02
    assert pace.wait_s(10.02) == pytest.approx(0.02)  # delta 2 due at 10.04
    # The server was busy until 10.11: deltas 3, 4 and 5 (due 10.06, 10.08, 10.10) are late.
    assert [pace.wait_s(10.11) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert pace.wait_s(10.11) == pytest.approx(0.01)  # delta 6 is due at 10.12, as planned


def test_with_gap_pacing_every_delta_waits_the_whole_delay_however_late() -> None:
    pace = Pace(0.02, clock=False)
    assert [pace.wait_s(now) for now in (10.0, 10.02, 10.11, 10.11)] == [0.02] * 4


def test_without_a_delay_there_is_no_wait_but_still_one_per_delta() -> None:
    pace = Pace(0.0)
    assert [pace.wait_s(now) for now in (1.0, 1.0, 5.0)] == [0.0, 0.0, 0.0]


class FakeClock:
    """``asyncio`` as the scripted model sees it: ``sleep`` records the wait and moves the clock
    (plus a lag injected before a given delta, as a busy event loop would), then yields once."""

    def __init__(self, lag_before: dict[int, float]) -> None:
        self.now = 100.0
        self.waits: list[float] = []
        self._lag_before = lag_before

    def time(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.waits.append(round(seconds, 6))
        self.now += seconds + self._lag_before.get(len(self.waits) + 1, 0.0)
        await asyncio.sleep(0)

    def get_running_loop(self) -> FakeClock:
        return self


async def play(monkeypatch: pytest.MonkeyPatch, step: dict[str, Any], lag_before: dict[int, float]) -> tuple[list[str], list[float]]:
    clock = FakeClock(lag_before)
    monkeypatch.setattr(scripted, "asyncio", SimpleNamespace(sleep=clock.sleep, get_running_loop=clock.get_running_loop))
    request = ModelRequest(messages=[ChatMessage(role="user", content=json.dumps({"script": [step]}))], tools=[])
    texts = [d.text async for d in ScriptedModel().stream(request) if isinstance(d, TextDelta)]
    return texts, clock.waits


async def test_a_scripted_stream_keeps_its_pace_after_the_server_was_busy(monkeypatch: pytest.MonkeyPatch) -> None:
    # 6 tokens 20 ms apart; the server is busy for 50 ms after delta 2 was taken.
    texts, waits = await play(monkeypatch, {"tokens": 6, "delay_ms": 20}, {3: 0.05})
    assert texts == [f"t{n} " for n in range(1, 7)]
    # Due at 20, 40, 60, 80, 100, 120 ms; taken at 20, 40, then 90 (busy): 4 at once, 5 and 6 on time.
    assert waits == [0.02, 0.02, 0.0, 0.0, 0.01, 0.02]


async def test_gap_paced_the_same_stream_is_slowed_down_by_the_busy_server(monkeypatch: pytest.MonkeyPatch) -> None:
    texts, waits = await play(monkeypatch, {"tokens": 6, "delay_ms": 20, "pace": "gap"}, {3: 0.05})
    assert texts == [f"t{n} " for n in range(1, 7)]
    assert waits == [0.02] * 6
