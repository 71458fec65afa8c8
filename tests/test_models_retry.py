"""Provider faults, handled honestly: each fault played by the provider doubles, through both adapters.

Before the first delta, 429 / 5xx / overloaded / a dropped connection / silence are retried with
backoff (at least ``Retry-After``), a bounded number of times; after deltas were streamed nothing
is retried and the call fails with ``model_stream_broken``.
"""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

import anyio
import pytest

from tether.errors import ModelError
from tether.models import ChatMessage, Model, ModelDelta, ModelRequest, RetryPolicy, TextDelta
from tether.models._retry import retry_after_seconds, stream_with_retries
from tether.models.anthropic import AnthropicModel
from tether.models.openai import OpenAIModel

from . import anthropic_provider, openai_provider

pytestmark = pytest.mark.anyio

FAST = RetryPolicy(attempts=4, base_delay_s=0.01, max_delay_s=5.0, idle_timeout_s=1.0)


@dataclass
class Double:
    """A provider double, a model talking to it, and how to program a turn of it."""

    kind: str
    provider: Any
    model: Model
    turn: Callable[..., Any]
    overloaded: dict[str, Any]


@pytest.fixture(params=["openai", "anthropic"])
async def double(request: pytest.FixtureRequest) -> AsyncIterator[Double]:
    if request.param == "openai":
        with openai_provider.FakeProvider() as fake:
            async with OpenAIModel("fake", base_url=fake.base_url, api_key="x", timeout=10) as model:
                yield Double("openai", fake, model, openai_provider.Turn, {"error_status": 503})
    else:
        with anthropic_provider.FakeAnthropic() as fake:
            async with AnthropicModel("fake", base_url=fake.base_url, api_key="x", timeout=10) as model:
                yield Double("anthropic", fake, model, anthropic_provider.Turn, {"error_status": 529, "error_type": "overloaded_error"})


@dataclass
class Outcome:
    deltas: list[ModelDelta]
    retries: list[tuple[int, float, str]]
    error: ModelError | None
    request: ModelRequest


async def run(model: Model, policy: RetryPolicy = FAST) -> Outcome:
    retries: list[tuple[int, float, str]] = []
    request = ModelRequest([ChatMessage("user", "hello")])
    deltas: list[ModelDelta] = []
    error = None
    try:
        async with aclosing(stream_with_retries(model, request, policy, on_retry=lambda n, delay, exc: retries.append((n, delay, exc.code)))) as stream:
            async for delta in stream:
                deltas.append(delta)
    except ModelError as exc:
        error = exc
    return Outcome(deltas, retries, error, request)


def text(outcome: Outcome) -> str:
    return "".join(d.text for d in outcome.deltas if isinstance(d, TextDelta))


async def test_a_rate_limit_before_the_first_delta_is_retried_no_sooner_than_retry_after(double: Double) -> None:
    double.provider.add(double.turn(error_status=429, retry_after="0.3"), double.turn(text=["fine"]))

    outcome = await run(double.model)

    assert outcome.error is None and text(outcome) == "fine"
    assert len(double.provider.requests) == 2
    [(attempt, delay, code)] = outcome.retries
    assert (attempt, code) == (1, "model_rate_limited")
    assert delay >= 0.3


async def test_overload_and_server_errors_are_retried_with_growing_jittered_backoff(double: Double) -> None:
    double.provider.add(double.turn(**double.overloaded), double.turn(error_status=500), double.turn(text=["at last"]))

    outcome = await run(double.model)

    assert outcome.error is None and text(outcome) == "at last"
    assert [(n, code) for n, _, code in outcome.retries] == [(1, "model_overloaded"), (2, "model_error")]
    for n, delay, _ in outcome.retries:
        ceiling = FAST.base_delay_s * 2 ** (n - 1)
        assert ceiling / 2 <= delay <= ceiling


async def test_a_connection_dropped_before_the_first_delta_is_retried(double: Double) -> None:
    double.provider.add(double.turn(text=["lost"], drop_after=0), double.turn(text=["found"]))

    outcome = await run(double.model)

    assert outcome.error is None and text(outcome) == "found"
    assert [code for _, _, code in outcome.retries] == ["model_unavailable"]


async def test_retries_are_bounded_and_the_last_error_is_reported(double: Double) -> None:
    double.provider.add(*[double.turn(error_status=500, error_message=f"down {n}") for n in range(5)])

    outcome = await run(double.model, RetryPolicy(attempts=3, base_delay_s=0.01))

    assert outcome.error is not None and outcome.error.code == "model_error"
    assert "down 2" in outcome.error.message
    assert len(double.provider.requests) == 3


async def test_a_client_error_is_not_retried(double: Double) -> None:
    double.provider.add(double.turn(error_status=400), double.turn(text=["never"]))

    outcome = await run(double.model)

    assert outcome.error is not None and not outcome.error.retryable
    assert len(double.provider.requests) == 1 and outcome.retries == []


async def test_a_retry_after_longer_than_the_policy_allows_is_not_waited_for(double: Double) -> None:
    double.provider.add(double.turn(error_status=429, retry_after="120"), double.turn(text=["never"]))

    outcome = await run(double.model, RetryPolicy(max_delay_s=30.0))

    assert outcome.error is not None and outcome.error.code == "model_rate_limited" and outcome.error.retry_after == 120.0
    assert len(double.provider.requests) == 1


async def test_a_failure_after_deltas_is_never_retried_and_keeps_what_streamed(double: Double) -> None:
    pieces = ["one ", "two ", "three ", "four ", "five "]
    double.provider.add(double.turn(text=pieces, drop_after=5), double.turn(text=["a second answer"]))

    outcome = await run(double.model)

    assert outcome.error is not None and outcome.error.code == "model_stream_broken"
    assert "model_unavailable" in outcome.error.message and "not retried" in outcome.error.message
    assert 1 <= len(outcome.deltas) < len(pieces) and pieces[0].startswith(text(outcome)[:4])
    assert len(double.provider.requests) == 1
    assert outcome.request.usage.output_tokens == len(outcome.deltas)


async def test_a_silent_provider_times_out_and_is_asked_again(double: Double) -> None:
    double.provider.add(double.turn(text=["never"], stall_after=0), double.turn(text=["awake"]))

    outcome = await run(double.model, RetryPolicy(base_delay_s=0.01, idle_timeout_s=0.5))

    assert outcome.error is None and text(outcome) == "awake"
    assert [code for _, _, code in outcome.retries] == ["model_timeout"]
    assert double.provider.wait_for_disconnect(5.0).request_index == 0  # the silent request was closed


async def test_a_provider_going_silent_mid_stream_fails_the_step(double: Double) -> None:
    double.provider.add(double.turn(text=["a ", "b ", "c ", "d ", "e "], stall_after=4), double.turn(text=["never"]))

    outcome = await run(double.model, RetryPolicy(base_delay_s=0.01, idle_timeout_s=0.5))

    assert outcome.error is not None and outcome.error.code == "model_stream_broken" and "model_timeout" in outcome.error.message
    assert len(double.provider.requests) == 1
    assert double.provider.wait_for_disconnect(5.0).request_index == 0


def test_retry_after_is_read_in_milliseconds_seconds_or_as_a_date() -> None:
    assert retry_after_seconds({"retry-after-ms": "250", "retry-after": "9"}) == 0.25
    assert retry_after_seconds({"retry-after": "2.5"}) == 2.5
    assert retry_after_seconds({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 0.0  # in the past
    assert retry_after_seconds({"retry-after": "soon"}) is None
    assert retry_after_seconds({}) is None


class _QuickModel:
    """A model that yields its deltas at once (a test double of a fast provider)."""

    def __init__(self, count: int) -> None:
        self.count = count

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelDelta]:
        for n in range(self.count):
            yield TextDelta(f"t{n} ")


async def test_a_consumer_holding_a_delta_longer_than_the_idle_timeout_is_not_a_silent_provider() -> None:
    # The idle timeout covers only the wait for the provider, never the time the consumer
    # takes with a delta (the generator is suspended at its yield meanwhile).
    policy = RetryPolicy(attempts=1, idle_timeout_s=0.05)
    request = ModelRequest([ChatMessage("user", "hi")], [])
    got: list[str] = []
    async with aclosing(stream_with_retries(_QuickModel(3), request, policy)) as stream:
        async for delta in stream:
            assert isinstance(delta, TextDelta)
            got.append(delta.text)
            await anyio.sleep(0.2)  # the consumer's own slow work, four idle timeouts long
    assert got == ["t0 ", "t1 ", "t2 "]


async def test_an_outside_cancel_during_a_wait_for_the_provider_stays_a_cancel() -> None:
    # A cancellation that is not the idle timer's propagates as a cancellation, not a timeout.
    class Stalled:
        async def stream(self, request: ModelRequest) -> AsyncIterator[ModelDelta]:
            yield TextDelta("first ")
            await anyio.sleep_forever()
            yield TextDelta("never")  # pragma: no cover

    policy = RetryPolicy(attempts=1, idle_timeout_s=30.0)
    request = ModelRequest([ChatMessage("user", "hi")], [])
    got: list[str] = []
    with anyio.move_on_after(0.2) as scope:
        async with aclosing(stream_with_retries(Stalled(), request, policy)) as stream:
            async for delta in stream:
                assert isinstance(delta, TextDelta)
                got.append(delta.text)
    assert scope.cancelled_caught and got == ["first "]


async def test_a_finished_stream_leaves_nothing_for_the_garbage_collector() -> None:
    """A model call's idle timer must not keep a reference cycle (with the run's task in it)
    alive after the call: with hundreds of runs streaming, every such cycle is work for the
    garbage collector's slow passes. Without automatic collection, nothing of the call is left."""
    from tether.models._retry import _Silence
    from tether.models.scripted import ScriptedModel

    request = ModelRequest(messages=[ChatMessage(role="user", content='{"script": [{"tokens": 5}]}')], tools=[])
    gc.collect()
    gc.disable()
    try:
        with anyio.fail_after(5):
            async with aclosing(stream_with_retries(ScriptedModel(), request, FAST)) as stream:
                deltas = [delta async for delta in stream]
        assert [d.text for d in deltas if isinstance(d, TextDelta)] == [f"t{i} " for i in range(1, 6)]
        left = [o for o in gc.get_objects() if isinstance(o, _Silence)]
        assert left == []
    finally:
        gc.enable()
