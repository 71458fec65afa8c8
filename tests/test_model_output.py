"""A model's output that is neither an answer nor a tool call is never shown, never run, asked for once more.

The decoder of the local model's constrained output on cut-short, repeating and malformed
outputs (no model needed: it reads text); then whole runs of a real server against the OpenAI
and Anthropic provider doubles whose tool calls are cut off by the token limit: the call is not
executed, not shown as text, the model is asked once more with the reason, and a second failure
ends the run with ``model_output_invalid``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tether import Agent, RetryPolicy, tool
from tether.client import AsyncClient
from tether.errors import ModelError
from tether.models import AnswerCut, TextDelta, ToolCallRequest, ToolCallStart, ToolSpec
from tether.models._constrained import ConstrainedOutput, repeating, tool_choice_schema
from tether.models.anthropic import AnthropicModel
from tether.models.openai import OpenAIModel

from . import anthropic_provider
from .conftest import LiveServer, sqlite_url
from .openai_provider import FakeProvider, FakeToolCall, Turn

pytestmark = pytest.mark.anyio

CUT_CALL = '{"order_id": "A1'  # the arguments as far as the token limit let them get


# -- the local model's decoder ---------------------------------------------------------------


def feed_all(pieces: list[str]) -> tuple[ConstrainedOutput, list[Any]]:
    output = ConstrainedOutput()
    deltas = [delta for piece in pieces for delta in output.feed(piece)]
    return output, deltas


def test_a_call_cut_short_by_max_tokens_is_an_invalid_output_never_text() -> None:
    output, deltas = feed_all(['{ "tool" :"ask_user",', '"arguments" : {"question" :"a_ques_t', "_a_ques_t_a_ques_t"])

    assert deltas == [ToolCallStart("ask_user")]  # a status, never the envelope as text
    with pytest.raises(ModelError) as caught:
        output.finish("length", 512)
    assert caught.value.code == "model_output_invalid" and not caught.value.retryable
    assert caught.value.message == "cut off by the output limit (512 tokens) in the middle of a tool call"


def test_a_call_stopped_for_repeating_itself_is_an_invalid_output() -> None:
    output, _ = feed_all(['{"tool": "write_note", "arguments": {"text": "', "la la " * 20])

    with pytest.raises(ModelError, match="stopped for repeating itself in the middle of a tool call"):
        output.finish("repeating", 512)


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ('{"tool": "get_order", "arguments": "A1"}', "neither an answer nor a well-formed tool call"),  # arguments not an object
        ('{"tool": "get_order", "arguments": {"order_id": "A1"}} trailing', "neither an answer nor a well-formed tool call"),
        ('{"tool": 7}', "neither an answer nor a well-formed tool call"),
        ("", "empty"),
    ],
)
def test_a_malformed_output_is_an_invalid_output_saying_why(raw: str, reason: str) -> None:
    output, deltas = feed_all([raw])

    assert not any(isinstance(d, TextDelta) for d in deltas)
    with pytest.raises(ModelError) as caught:
        output.finish("stop", 512)
    assert caught.value.code == "model_output_invalid" and caught.value.message == reason


def test_an_answer_cut_short_keeps_the_text_it_streamed_and_says_why() -> None:
    output, deltas = feed_all(['{"answer": "Once upon', " a time, a cat"])

    assert "".join(d.text for d in deltas) == "Once upon a time, a cat"
    assert output.finish("length", 512) == [AnswerCut("length")]
    assert feed_all(['{"answer": "a_a_a_a'])[0].finish("repeating", 512) == [AnswerCut("repetition")]
    # Cut after its string closed, the answer is whole: only the JSON around it was cut.
    assert feed_all(['{"answer": "Once upon a time."'])[0].finish("length", 512) == []
    assert feed_all(['{"answer": "Once upon a time."}'])[0].finish("stop", 512) == []


def test_a_raw_line_break_inside_a_call_string_still_parses() -> None:
    output, _ = feed_all(['{"tool": "write_note", "arguments": {"text": "one\ntwo"}}'])

    [call] = output.finish("stop", 512)
    assert isinstance(call, ToolCallRequest) and call.args == {"text": "one\ntwo"}


def test_the_repetition_stop_sees_a_short_pattern_repeated_and_not_ordinary_text() -> None:
    assert repeating([1, 2, 3, 4] * 8, 32)  # 32 tokens of one 4-token pattern
    assert repeating([9, 8] + [5] * 32, 32)
    assert not repeating([1, 2, 3, 4] * 7, 32)  # not 32 tokens yet
    assert not repeating(list(range(100)), 32)
    assert not repeating([1, 2, 3, 4] * 7 + [5, 6, 7, 8], 32)  # the pattern broke at the end


def test_the_grammar_bounds_string_arguments_unless_the_schema_does() -> None:
    spec = ToolSpec(
        "send",
        "Send it.",
        {
            "type": "object",
            "properties": {
                "body": {"type": "string"},
                "subject": {"type": "string", "maxLength": 40},
                "tags": {"type": "array", "items": {"type": "string"}},
                "kind": {"type": "string", "enum": ["a", "b"]},
            },
        },
    )

    schema = tool_choice_schema([spec], max_string_length=256)

    arguments = schema["oneOf"][0]["properties"]["arguments"]["properties"]
    assert arguments["body"]["maxLength"] == 256
    assert arguments["subject"]["maxLength"] == 40  # the tool's own bound wins
    assert arguments["tags"]["items"]["maxLength"] == 256
    assert "maxLength" not in arguments["kind"]
    assert spec.parameters["properties"]["body"] == {"type": "string"}  # the tool's schema is not changed
    assert tool_choice_schema([spec])["oneOf"][0]["properties"]["arguments"] == spec.parameters


# -- runs against provider doubles -----------------------------------------------------------

executed: list[dict[str, Any]] = []


@tool
async def get_order(order_id: str) -> dict[str, Any]:
    """Look an order up."""
    executed.append({"order_id": order_id})
    return {"order_id": order_id, "status": "shipped"}


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    with FakeProvider() as fake:
        yield fake


@pytest.fixture
def openai_server(provider: FakeProvider, tmp_path: Path) -> Iterator[LiveServer]:
    executed.clear()
    model = OpenAIModel("fake", base_url=provider.base_url, api_key="x", timeout=30, max_tokens=16)
    live = LiveServer(Agent(model, tools=[get_order], retry=RetryPolicy(base_delay_s=0.01)), sqlite_url(tmp_path)).start()
    try:
        yield live
    finally:
        live.stop()


async def run_to_end(server: LiveServer, content: str) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http, AsyncClient(server.url) as client:
        thread = await client.create_thread()
        run = await client.start_run(thread["id"], content)
        final = await client.wait_for_run(run["id"])
        log = (await http.get(f"/v1/runs/{run['id']}/events", params={"limit": 1000})).json()["items"]
        messages = await client.messages(thread["id"])
    return {"run": final, "log": log, "messages": messages}


def of_type(log: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e["data"] for e in log if e["type"] == kind]


def cut_call() -> Turn:
    return Turn(tool_calls=[FakeToolCall(id="call_cut", name="get_order", arguments=CUT_CALL)], finish_reason="length")


async def test_a_tool_call_cut_off_twice_by_the_token_limit_ends_the_run_with_a_clear_error(openai_server: LiveServer, provider: FakeProvider) -> None:
    provider.add(cut_call(), cut_call())

    outcome = await run_to_end(openai_server, "What is the status of order A1?")

    log, run = outcome["log"], outcome["run"]
    assert run["status"] == "failed" and log[-1]["type"] == "error"
    error = log[-1]["data"]
    assert error["code"] == "model_output_invalid" and error["retryable"] is False
    assert "cut off by the output limit (16 tokens) in the middle of a tool call" in error["message"]
    assert "also when asked once more" in error["message"] and "Nothing was run" in error["message"]
    # Not executed, not announced as a call, not shown as text.
    assert executed == [] and of_type(log, "tool_call") == [] and of_type(log, "token") == []
    # Each attempt announced its call; the second attempt was announced with the reason.
    details = [s["detail"] for s in of_type(log, "status")]
    assert details == [
        None,
        "calling a tool: get_order",
        "asking the model again (attempt 2 of 2): its reply was cut off by the output limit (16 tokens) in the middle of a tool call",
        "calling a tool: get_order",
    ]
    # Asked once more, and told why.
    assert len(provider.requests) == 2
    note = provider.requests[1]["messages"][-1]
    assert note["role"] == "system" and "cut off by the output limit" in note["content"]
    assert provider.requests[1]["messages"][:-1] == provider.requests[0]["messages"]
    # The turn is stored failed, with nothing of the cut call in it.
    turn = outcome["messages"][-1]
    assert turn["role"] == "assistant" and turn["status"] == "failed" and turn["content"] == "" and not turn["tool_calls"]
    assert run["error"]["code"] == "model_output_invalid"
    assert len(run["usage"]["calls"]) == 1  # one model call of the run, both attempts summed
    assert run["usage"]["calls"][0]["input_tokens"] == 2 * 11


async def test_a_tool_call_cut_off_once_is_asked_for_again_and_the_run_goes_on(openai_server: LiveServer, provider: FakeProvider) -> None:
    provider.add(
        cut_call(),
        Turn(tool_calls=[FakeToolCall(id="call_ok", name="get_order", arguments='{"order_id": "A1"}')]),
        Turn(text=["It ", "shipped."]),
    )

    outcome = await run_to_end(openai_server, "What is the status of order A1?")

    assert outcome["run"]["status"] == "completed"
    assert [c["call_id"] for c in of_type(outcome["log"], "tool_call")] == ["call_ok"]
    assert executed == [{"order_id": "A1"}]  # the cut call never ran
    assert "".join(t["text"] for t in of_type(outcome["log"], "token")) == "It shipped."
    assert len(provider.requests) == 3
    # The note was for the retried attempt only: the next model call's history has no trace of it.
    assert not any("discarded" in str(m.get("content")) for m in provider.requests[2]["messages"])


async def test_a_call_cut_off_after_text_streamed_fails_at_once_and_keeps_the_text_flagged(openai_server: LiveServer, provider: FakeProvider) -> None:
    provider.add(Turn(text=["Let me ", "look."], tool_calls=[FakeToolCall(id="call_cut", name="get_order", arguments=CUT_CALL)], finish_reason="length"))

    outcome = await run_to_end(openai_server, "What is the status of order A1?")

    [error] = of_type(outcome["log"], "error")
    assert error["code"] == "model_output_invalid" and "not asked again" in error["message"]
    assert len(provider.requests) == 1  # a second reply would follow the text already shown
    partial = next(m for m in outcome["messages"] if m["id"] == error["partial_message_id"])
    assert partial["status"] == "failed" and partial["content"] == "Let me look." and not partial["tool_calls"]
    assert executed == []


async def test_an_anthropic_tool_call_cut_off_by_max_tokens_is_not_run_and_ends_in_the_clear_error(tmp_path: Path) -> None:
    executed.clear()
    cut = anthropic_provider.Turn(tool_calls=[FakeToolCall(id="toolu_cut", name="get_order", arguments=CUT_CALL)], stop_reason="max_tokens")
    with anthropic_provider.FakeAnthropic([cut, cut]) as fake:
        model = AnthropicModel("claude-fake", base_url=fake.base_url, api_key="x", timeout=30, max_tokens=16)
        live = LiveServer(Agent(model, tools=[get_order], retry=RetryPolicy(base_delay_s=0.01)), sqlite_url(tmp_path)).start()
        try:
            outcome = await run_to_end(live, "What is the status of order A1?")
        finally:
            live.stop()
        requests = fake.requests

    error = outcome["log"][-1]["data"]
    assert outcome["run"]["status"] == "failed" and error["code"] == "model_output_invalid"
    assert "cut off by the output limit (16 tokens) in the middle of a tool call" in error["message"]
    assert executed == [] and of_type(outcome["log"], "tool_call") == [] and of_type(outcome["log"], "token") == []
    assert [s["detail"] for s in of_type(outcome["log"], "status")].count("calling a tool: get_order") == 2
    assert len(requests) == 2 and "cut off by the output limit" in requests[1]["system"]


# -- an answer in words cut by the output limit: kept, marked (issue 55, item 15) -------------


async def test_an_openai_answer_cut_by_max_tokens_ends_done_marked_length(openai_server: LiveServer, provider: FakeProvider) -> None:
    provider.add(Turn(text=["The order ", "shipped on"], finish_reason="length"), Turn(text=["It ", "shipped."]))

    cut = await run_to_end(openai_server, "Tell me about order A1.")
    whole = await run_to_end(openai_server, "Tell me about order A1.")

    assert cut["run"]["status"] == "completed" and cut["log"][-1]["data"]["finish_reason"] == "length"
    answer = cut["messages"][-1]
    assert answer["content"] == "The order shipped on" and answer["status"] == "complete" and answer["finish_reason"] == "length"
    # An answer the model ended: done as it always was, nothing on the message.
    assert "finish_reason" not in whole["log"][-1]["data"] and whole["messages"][-1]["finish_reason"] is None


async def test_an_anthropic_answer_cut_by_max_tokens_ends_done_marked_length(tmp_path: Path) -> None:
    with anthropic_provider.FakeAnthropic([anthropic_provider.Turn(text=["The order ", "shipped on"], stop_reason="max_tokens")]) as fake:
        model = AnthropicModel("claude-fake", base_url=fake.base_url, api_key="x", timeout=30, max_tokens=16)
        live = LiveServer(Agent(model, tools=[get_order]), sqlite_url(tmp_path)).start()
        try:
            outcome = await run_to_end(live, "Tell me about order A1.")
        finally:
            live.stop()

    assert outcome["run"]["status"] == "completed" and outcome["log"][-1]["data"]["finish_reason"] == "length"
    assert outcome["messages"][-1]["finish_reason"] == "length" and outcome["messages"][-1]["content"] == "The order shipped on"
