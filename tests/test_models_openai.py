"""OpenAIModel against a real HTTP server that speaks the Chat Completions API (no mocks)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import aclosing

import anyio
import pytest

from tether.errors import ModelError
from tether.models import AnswerCut, ChatMessage, Model, ModelDelta, ModelRequest, TextDelta, ThinkingDelta, ToolCallRequest, ToolCallStart, ToolSpec
from tether.models.openai import OpenAIModel

from .openai_provider import FakeProvider, FakeToolCall, Turn, long_turn

pytestmark = pytest.mark.anyio

HELLO = ModelRequest(messages=[ChatMessage(role="user", content="hello")])


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    with FakeProvider() as fake:
        yield fake


@pytest.fixture
async def model(provider: FakeProvider) -> AsyncIterator[OpenAIModel]:
    async with OpenAIModel("fake-model", base_url=provider.base_url, timeout=10) as openai_model:
        yield openai_model


async def collect(model: Model, request: ModelRequest = HELLO) -> list[ModelDelta]:
    async with aclosing(model.stream(request)) as stream:
        return [delta async for delta in stream]


async def test_openai_model_satisfies_the_model_protocol(model: OpenAIModel) -> None:
    assert isinstance(model, Model)


async def test_text_stream_arrives_as_text_deltas(provider: FakeProvider, model: OpenAIModel) -> None:
    provider.add(Turn(text=["Hel", "lo", ", world"]))

    deltas = await collect(model)

    assert deltas == [TextDelta("Hel"), TextDelta("lo"), TextDelta(", world")]
    assert provider.requests[0]["model"] == "fake-model"
    assert provider.requests[0]["stream"] is True
    assert provider.disconnects == []


async def test_streamed_tool_call_fragments_are_assembled_into_one_call(provider: FakeProvider, model: OpenAIModel) -> None:
    refund = json.dumps({"order_id": "A100", "amount": 25, "reason": "damaged on arrival"})
    lookup = json.dumps({"order_id": "B200"})
    provider.add(
        Turn(
            text=["Let me check."],
            tool_calls=[
                FakeToolCall(id="call_refund", name="refund", arguments=refund, fragments=5),
                FakeToolCall(id="call_lookup", name="get_order", arguments=lookup, fragments=4),
            ],
        )
    )

    deltas = await collect(model)

    assert deltas == [
        TextDelta("Let me check."),
        # Each call is announced at its first fragment, before its arguments stream.
        ToolCallStart("refund"),
        ToolCallStart("get_order"),
        ToolCallRequest(id="call_refund", name="refund", args={"order_id": "A100", "amount": 25, "reason": "damaged on arrival"}),
        ToolCallRequest(id="call_lookup", name="get_order", args={"order_id": "B200"}),
    ]


async def test_tool_call_arguments_that_are_not_a_json_object_stay_raw_text(provider: FakeProvider, model: OpenAIModel) -> None:
    provider.add(
        Turn(
            tool_calls=[
                FakeToolCall(id="call_1", name="note", arguments='{"text": "unterminated', fragments=3),
                FakeToolCall(id="call_2", name="note", arguments="[1, 2]", fragments=2),
            ]
        )
    )

    deltas = await collect(model)

    assert deltas == [
        ToolCallStart("note"),
        ToolCallStart("note"),
        ToolCallRequest(id="call_1", name="note", args='{"text": "unterminated'),
        ToolCallRequest(id="call_2", name="note", args="[1, 2]"),
    ]


async def test_a_tool_call_without_an_id_gets_one(provider: FakeProvider, model: OpenAIModel) -> None:
    provider.add(Turn(tool_calls=[FakeToolCall(id=None, name="get_order", arguments='{"order_id": "A1"}')]))

    start, call = await collect(model)

    assert start == ToolCallStart("get_order") and isinstance(call, ToolCallRequest)
    assert call.id.startswith("call_") and len(call.id) > len("call_")
    assert (call.name, call.args) == ("get_order", {"order_id": "A1"})


async def test_history_and_tools_are_sent_in_openai_format(provider: FakeProvider, model: OpenAIModel) -> None:
    parameters = {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}
    request = ModelRequest(
        messages=[
            ChatMessage(role="system", content="You are a support agent."),
            ChatMessage(role="user", content="Where is order A100?"),
            ChatMessage(
                role="assistant",
                content="",
                tool_calls=(
                    ToolCallRequest(id="call_1", name="get_order", args={"order_id": "A100"}),
                    ToolCallRequest(id="call_2", name="note", args="not json"),
                ),
            ),
            ChatMessage(role="tool", content='{"status": "shipped"}', tool_call_id="call_1", name="get_order"),
            ChatMessage(role="tool", content="ok", tool_call_id="call_2", name="note"),
            ChatMessage(role="assistant", content="It has shipped."),
        ],
        tools=[ToolSpec(name="get_order", description="Look up an order.", parameters=parameters)],
    )

    await collect(model, request)

    [body] = provider.requests
    assert body["messages"] == [
        {"role": "system", "content": "You are a support agent."},
        {"role": "user", "content": "Where is order A100?"},
        {
            "role": "assistant",
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_order", "arguments": '{"order_id": "A100"}'}},
                {"id": "call_2", "type": "function", "function": {"name": "note", "arguments": "not json"}},
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"status": "shipped"}'},
        {"role": "tool", "tool_call_id": "call_2", "content": "ok"},
        {"role": "assistant", "content": "It has shipped."},
    ]
    assert body["tools"] == [{"type": "function", "function": {"name": "get_order", "description": "Look up an order.", "parameters": parameters}}]


async def test_no_tools_means_no_tools_field_and_temperature_is_only_sent_when_set(provider: FakeProvider) -> None:
    async with OpenAIModel("fake-model", base_url=provider.base_url) as default_model:
        await collect(default_model)
    async with OpenAIModel("fake-model", base_url=provider.base_url, temperature=0.2) as warm_model:
        await collect(warm_model)

    first, second = provider.requests
    assert "tools" not in first and "temperature" not in first
    assert second["temperature"] == 0.2


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
async def test_reasoning_content_becomes_thinking_deltas(provider: FakeProvider, model: OpenAIModel, field: str) -> None:
    provider.add(Turn(reasoning=["The user ", "greets me."], reasoning_field=field, text=["Hi!"]))

    deltas = await collect(model)

    assert deltas == [ThinkingDelta("The user "), ThinkingDelta("greets me."), TextDelta("Hi!")]


async def test_cancelling_the_consumer_closes_the_upstream_request(provider: FakeProvider, model: OpenAIModel) -> None:
    provider.add(long_turn(10_000, delay_s=0.005))
    received: list[ModelDelta] = []
    five_received = anyio.Event()

    async def consume() -> None:
        async with aclosing(model.stream(HELLO)) as stream:
            async for delta in stream:
                received.append(delta)
                if len(received) == 5:
                    five_received.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(consume)
        await five_received.wait()
        cancelled_at = time.monotonic()
        tg.cancel_scope.cancel()

    disconnect = await anyio.to_thread.run_sync(provider.wait_for_disconnect, 2.0)
    assert disconnect.at - cancelled_at < 2.0
    assert disconnect.chunks_total > 10_000
    assert disconnect.chunks_sent < 1_000, "the provider kept streaming after the consumer was cancelled"
    assert 5 <= len(received) < 1_000


async def test_cancelling_an_asyncio_task_closes_the_upstream_request(provider: FakeProvider, model: OpenAIModel) -> None:
    provider.add(long_turn(10_000, delay_s=0.005))
    three_received = asyncio.Event()

    async def consume() -> None:
        count = 0
        async with aclosing(model.stream(HELLO)) as stream:
            async for _ in stream:
                count += 1
                if count == 3:
                    three_received.set()

    task = asyncio.create_task(consume())
    await three_received.wait()
    cancelled_at = time.monotonic()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    disconnect = await anyio.to_thread.run_sync(provider.wait_for_disconnect, 2.0)
    assert disconnect.at - cancelled_at < 2.0
    assert disconnect.chunks_sent < 1_000


async def test_aclose_of_the_stream_closes_the_upstream_request(provider: FakeProvider, model: OpenAIModel) -> None:
    provider.add(long_turn(10_000, delay_s=0.005))
    stream = model.stream(HELLO)
    first = [await anext(stream) for _ in range(3)]

    closed_at = time.monotonic()
    await stream.aclose()

    disconnect = await anyio.to_thread.run_sync(provider.wait_for_disconnect, 2.0)
    assert first == [TextDelta("t1 "), TextDelta("t2 "), TextDelta("t3 ")]
    assert disconnect.at - closed_at < 2.0
    assert disconnect.chunks_sent < 1_000


async def test_the_model_still_works_after_a_cancelled_stream(provider: FakeProvider, model: OpenAIModel) -> None:
    provider.add(long_turn(10_000, delay_s=0.005), Turn(text=["again"]))
    with anyio.CancelScope() as scope:
        async with aclosing(model.stream(HELLO)) as stream:
            async for _ in stream:
                scope.cancel()
    assert scope.cancelled_caught

    assert await collect(model) == [TextDelta("again")]


@pytest.mark.parametrize(
    ("status", "retryable", "code"),
    [
        (500, True, "model_error"),
        (502, True, "model_error"),
        (503, True, "model_overloaded"),
        (529, True, "model_overloaded"),
        (400, False, "model_error"),
        (401, False, "model_error"),
        (429, True, "model_rate_limited"),
    ],
)
async def test_http_error_becomes_model_error(provider: FakeProvider, model: OpenAIModel, status: int, retryable: bool, code: str) -> None:
    provider.add(Turn(error_status=status, error_message="the fake says no"))

    with pytest.raises(ModelError) as caught:
        await collect(model)

    assert caught.value.retryable is retryable
    assert caught.value.code == code
    assert str(status) in caught.value.message
    assert len(provider.requests) == 1, "the model must not retry on its own"


async def test_connection_refused_becomes_a_retryable_model_error(provider: FakeProvider) -> None:
    provider.stop()  # nothing listens on its port any more

    async with OpenAIModel("fake-model", base_url=provider.base_url, timeout=5) as model:
        with pytest.raises(ModelError) as caught:
            await collect(model)

    assert caught.value.retryable is True
    assert caught.value.code == "model_unavailable"


async def test_a_slow_provider_becomes_a_retryable_model_error(provider: FakeProvider) -> None:
    provider.add(Turn(text=["late"], delay_s=1.0))

    async with OpenAIModel("fake-model", base_url=provider.base_url, timeout=0.2) as model:
        with pytest.raises(ModelError) as caught:
            await collect(model)

    assert caught.value.retryable is True
    assert caught.value.code == "model_unavailable"


async def test_from_env_reads_model_base_url_and_key(provider: FakeProvider, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TETHER_OPENAI_MODEL", "env-model")
    monkeypatch.setenv("TETHER_OPENAI_BASE_URL", provider.base_url)
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")  # the Tether variable wins
    monkeypatch.delenv("TETHER_OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)

    async with OpenAIModel.from_env() as model:
        assert await collect(model) == [TextDelta("ok")]

    assert provider.requests[0]["model"] == "env-model"


async def test_usage_comes_from_the_providers_usage_chunk(provider: FakeProvider, model: OpenAIModel) -> None:
    provider.add(Turn(text=["a", "b", "c"], usage=(31, 9)))

    await collect(model, request := ModelRequest(HELLO.messages))

    assert provider.requests[0]["stream_options"] == {"include_usage": True}
    assert (request.usage.input_tokens, request.usage.output_tokens) == (31, 9)


async def test_without_a_usage_chunk_output_tokens_are_counted_as_content_chunks(provider: FakeProvider) -> None:
    provider.add(Turn(text=["a", "b", "c"], usage=(31, 9)))

    async with OpenAIModel("fake-model", base_url=provider.base_url, stream_usage=False) as quiet:
        await collect(quiet, request := ModelRequest(HELLO.messages))

    assert "stream_options" not in provider.requests[0]
    assert (request.usage.input_tokens, request.usage.output_tokens) == (0, 3)


async def test_tool_choice_is_sent_with_the_tools(provider: FakeProvider, model: OpenAIModel) -> None:
    tools = [ToolSpec("get_order", "Look up an order.", {"type": "object", "properties": {}})]

    await collect(model, ModelRequest(HELLO.messages, tools))

    assert provider.requests[0]["tool_choice"] == "auto"


async def test_a_tool_call_cut_off_by_the_token_limit_is_not_yielded_but_an_invalid_output(provider: FakeProvider) -> None:
    provider.add(Turn(text=["Let me "], tool_calls=[FakeToolCall(id="call_1", name="get_order", arguments='{"order_id": "A1')], finish_reason="length"))

    async with OpenAIModel("fake-model", base_url=provider.base_url, timeout=10, max_tokens=16) as capped:
        deltas: list[ModelDelta] = []
        with pytest.raises(ModelError) as caught:
            async with aclosing(capped.stream(HELLO)) as stream:
                async for delta in stream:
                    deltas.append(delta)

    assert caught.value.code == "model_output_invalid" and not caught.value.retryable
    assert "cut off by the output limit (16 tokens) in the middle of a tool call" in caught.value.message
    assert deltas == [TextDelta("Let me "), ToolCallStart("get_order")]  # no ToolCallRequest
    assert provider.requests[0]["max_tokens"] == 16


async def test_text_cut_off_by_the_token_limit_is_still_text_marked_as_cut(provider: FakeProvider, model: OpenAIModel) -> None:
    provider.add(Turn(text=["Once upon ", "a time"], finish_reason="length"))

    assert await collect(model) == [TextDelta("Once upon "), TextDelta("a time"), AnswerCut("length")]
    assert "max_tokens" not in provider.requests[0]  # no cap unless the author sets one
