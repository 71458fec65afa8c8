"""AnthropicModel against a real HTTP server that speaks the Messages API (no mocks)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from contextlib import aclosing

import anyio
import pytest

from tether.errors import ModelError
from tether.models import ChatMessage, Model, ModelDelta, ModelRequest, TextDelta, ThinkingDelta, ToolCallRequest, ToolSpec
from tether.models.anthropic import AnthropicModel

from .anthropic_provider import FakeAnthropic, Turn
from .openai_provider import FakeToolCall

pytestmark = pytest.mark.anyio

HELLO = ModelRequest(messages=[ChatMessage("system", "Be brief."), ChatMessage("user", "hello")])
ORDER_TOOL = ToolSpec("get_order", "Look an order up.", {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]})


@pytest.fixture
def provider() -> Iterator[FakeAnthropic]:
    with FakeAnthropic() as fake:
        yield fake


@pytest.fixture
async def model(provider: FakeAnthropic) -> AsyncIterator[AnthropicModel]:
    async with AnthropicModel("claude-fake", base_url=provider.base_url, api_key="x", timeout=10) as anthropic_model:
        yield anthropic_model


async def collect(model: Model, request: ModelRequest = HELLO) -> list[ModelDelta]:
    async with aclosing(model.stream(request)) as stream:  # type: ignore[type-var]
        return [delta async for delta in stream]


async def test_anthropic_model_satisfies_the_model_protocol(model: AnthropicModel) -> None:
    assert isinstance(model, Model)


async def test_text_streams_as_text_deltas_with_the_system_prompt_at_the_top_level(provider: FakeAnthropic, model: AnthropicModel) -> None:
    provider.add(Turn(text=["Hel", "lo", ", world"], input_tokens=17))

    deltas = await collect(model, request := ModelRequest(HELLO.messages))

    assert deltas == [TextDelta("Hel"), TextDelta("lo"), TextDelta(", world")]
    sent = provider.requests[0]
    assert sent["model"] == "claude-fake" and sent["stream"] is True and sent["max_tokens"] > 0
    assert sent["system"] == "Be brief."
    assert sent["messages"] == [{"role": "user", "content": [{"type": "text", "text": "hello"}]}]
    assert "thinking" not in sent
    assert (request.usage.input_tokens, request.usage.output_tokens) == (17, 3)
    assert provider.disconnects == []


async def test_extended_thinking_streams_as_thinking_deltas(provider: FakeAnthropic) -> None:
    provider.add(Turn(thinking=["Let me ", "think."], text=["Answer."]))

    async with AnthropicModel("claude-fake", base_url=provider.base_url, api_key="x", thinking_budget=2048) as model:
        deltas = await collect(model)

    assert deltas == [ThinkingDelta("Let me "), ThinkingDelta("think."), TextDelta("Answer.")]
    assert provider.requests[0]["thinking"] == {"type": "enabled", "budget_tokens": 2048}


async def test_tool_use_input_is_assembled_from_streamed_json_and_results_go_back_in_anthropic_shape(provider: FakeAnthropic) -> None:
    arguments = json.dumps({"order_id": "A100", "note": "ünïcode"})
    provider.add(
        Turn(
            thinking=["I should look it up."], text=["Checking."], tool_calls=[FakeToolCall(id="toolu_1", name="get_order", arguments=arguments, fragments=5)]
        ),
        Turn(thinking=["Done."], text=["It shipped."]),
    )
    async with AnthropicModel("claude-fake", base_url=provider.base_url, api_key="x", thinking_budget=1024) as model:
        first = await collect(model, ModelRequest([ChatMessage("user", "where is A100?")], [ORDER_TOOL]))
        call = first[-1]
        assert call == ToolCallRequest(id="toolu_1", name="get_order", args={"order_id": "A100", "note": "ünïcode"})

        history = [
            ChatMessage("system", "You are a shop assistant."),
            ChatMessage("user", "where is A100?"),
            ChatMessage("assistant", "Checking.", (call,)),
            ChatMessage("tool", '{"status": "shipped"}', (), "toolu_1", "get_order"),
        ]
        second = await collect(model, ModelRequest(history, [ORDER_TOOL]))

    assert second == [ThinkingDelta("Done."), TextDelta("It shipped.")]
    sent = provider.requests[1]
    assert sent["system"] == "You are a shop assistant."
    assert sent["tools"] == [{"name": "get_order", "description": "Look an order up.", "input_schema": ORDER_TOOL.parameters}]
    assert sent["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "where is A100?"}]},
        {
            "role": "assistant",
            "content": [
                # The signed thinking block of the turn that made the call goes back with it.
                {"type": "thinking", "thinking": "I should look it up.", "signature": "sig-fake"},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_order", "input": {"order_id": "A100", "note": "ünïcode"}},
            ],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": '{"status": "shipped"}'}]},
    ]
    assert sent["thinking"] == {"type": "enabled", "budget_tokens": 1024}


async def test_without_the_signed_thinking_of_a_tool_turn_the_request_goes_without_thinking(provider: FakeAnthropic) -> None:
    call = ToolCallRequest("toolu_unknown", "get_order", {"order_id": "A100"})
    history = [ChatMessage("user", "where is A100?"), ChatMessage("assistant", "", (call,)), ChatMessage("tool", "{}", (), "toolu_unknown", "get_order")]
    async with AnthropicModel("claude-fake", base_url=provider.base_url, api_key="x", thinking_budget=1024) as model:
        await collect(model, ModelRequest(history, [ORDER_TOOL]))

    sent = provider.requests[0]
    assert "thinking" not in sent  # the API would refuse a tool turn without its thinking
    assert sent["messages"][1] == {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "toolu_unknown", "name": "get_order", "input": {"order_id": "A100"}}],
    }


async def test_several_tool_results_and_a_user_message_after_them_form_one_user_turn(provider: FakeAnthropic, model: AnthropicModel) -> None:
    calls = (ToolCallRequest("toolu_a", "get_order", {"order_id": "A"}), ToolCallRequest("toolu_b", "get_order", '{"order_id": "B"}'))
    history = [
        ChatMessage("user", "both?"),
        ChatMessage("assistant", "", calls),
        ChatMessage("tool", "a", (), "toolu_a"),
        ChatMessage("tool", "b", (), "toolu_b"),
        ChatMessage("user", "and hurry"),
        ChatMessage("assistant", ""),  # a cancelled turn that said nothing is left out
    ]
    await collect(model, ModelRequest(history, [ORDER_TOOL]))

    messages = provider.requests[0]["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert messages[1]["content"][1]["input"] == {"order_id": "B"}
    assert messages[2]["content"] == [
        {"type": "tool_result", "tool_use_id": "toolu_a", "content": "a"},
        {"type": "tool_result", "tool_use_id": "toolu_b", "content": "b"},
        {"type": "text", "text": "and hurry"},
    ]


@pytest.mark.parametrize(
    ("status", "error_type", "code", "retryable"),
    [
        (429, "rate_limit_error", "model_rate_limited", True),
        (529, "overloaded_error", "model_overloaded", True),
        (500, "api_error", "model_error", True),
        (400, "invalid_request_error", "model_error", False),
        (401, "authentication_error", "model_error", False),
    ],
)
async def test_http_errors_become_model_errors(
    provider: FakeAnthropic, model: AnthropicModel, status: int, error_type: str, code: str, retryable: bool
) -> None:
    provider.add(Turn(error_status=status, error_type=error_type, retry_after="7"))

    with pytest.raises(ModelError) as caught:
        await collect(model)

    assert (caught.value.code, caught.value.retryable, caught.value.retry_after) == (code, retryable, 7.0)
    assert len(provider.requests) == 1  # the SDK itself never retries: Tether decides


async def test_an_error_event_mid_stream_becomes_a_model_error(provider: FakeAnthropic, model: AnthropicModel) -> None:
    provider.add(Turn(text=["partial"], error_type="overloaded_error", error_event_after=4))

    with pytest.raises(ModelError) as caught:
        await collect(model)

    assert caught.value.code == "model_overloaded" and caught.value.retryable


async def test_a_dropped_connection_becomes_a_retryable_model_error(provider: FakeAnthropic, model: AnthropicModel) -> None:
    provider.add(Turn(text=["a", "b", "c"], drop_after=3))

    with pytest.raises(ModelError) as caught:
        await collect(model)

    assert caught.value.code == "model_unavailable" and caught.value.retryable


async def test_closing_the_stream_early_closes_the_connection(provider: FakeAnthropic, model: AnthropicModel) -> None:
    provider.add(Turn(text=[f"t{n} " for n in range(10_000)], delay_s=0.002))

    async with aclosing(model.stream(request := ModelRequest(HELLO.messages))) as stream:  # type: ignore[type-var]
        async for _ in stream:
            break

    disconnect = await anyio.to_thread.run_sync(provider.wait_for_disconnect, 10.0)
    assert disconnect.chunks_sent < 1000
    assert request.usage.input_tokens == 42 and request.usage.output_tokens >= 1
