"""Runs of a Tether server whose agent uses AnthropicModel, against the Anthropic provider double.

Cancel closes the upstream stream (the double sees the socket close, and how many frames it had
sent); a tool round trip goes through the real server; a provider fault before the first delta
is retried and announced, one after deltas fails the run with the partial answer kept; usage is
stored per call, summed in ``done`` and on the run, and counted in ``/metrics``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import aclosing
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from tether import Agent, RetryPolicy, tool
from tether.client import AsyncClient
from tether.events import TERMINAL_TYPES, Envelope
from tether.models.anthropic import AnthropicModel

from .anthropic_provider import FakeAnthropic, Turn, long_turn
from .conftest import LiveServer, sqlite_url
from .openai_provider import FakeToolCall

pytestmark = pytest.mark.anyio

CHUNKS = 10_000


@tool
async def get_order(order_id: str) -> dict[str, Any]:
    """Look an order up."""
    return {"order_id": order_id, "status": "shipped"}


@pytest.fixture
def provider() -> Iterator[FakeAnthropic]:
    with FakeAnthropic() as fake:
        yield fake


@pytest.fixture
def server(provider: FakeAnthropic, tmp_path: Path) -> Iterator[LiveServer]:
    model = AnthropicModel("claude-fake", base_url=provider.base_url, api_key="x", timeout=30)
    agent = Agent(model, tools=[get_order], retry=RetryPolicy(base_delay_s=0.01, idle_timeout_s=10))
    live = LiveServer(agent, sqlite_url(tmp_path)).start()
    try:
        yield live
    finally:
        live.stop()


async def run_to_end(server: LiveServer, content: str) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http, AsyncClient(server.url) as client:
        thread = await client.create_thread()
        run = await client.start_run(thread["id"], content)
        final = await client.wait_for_run(run["id"])
        response = await http.get(f"/v1/runs/{run['id']}/events", params={"limit": 1000})
        log = response.json()["items"]
        messages = await client.messages(thread["id"])
        metrics = (await http.get("/metrics")).text
    return {"run": final, "log": log, "messages": messages, "metrics": metrics}


def of_type(log: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e["data"] for e in log if e["type"] == kind]


@pytest.mark.parametrize("mode", ["hard", "soft"])
async def test_cancelling_a_run_closes_the_anthropic_stream_and_records_what_it_consumed(server: LiveServer, provider: FakeAnthropic, mode: str) -> None:
    provider.add(long_turn(CHUNKS, delay_s=0.005))
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http, AsyncClient(server.url) as client:
        thread = await client.create_thread()
        run = await client.start_run(thread["id"], "tell me a very long story")
        seen: list[Envelope] = []
        async with aclosing(client.follow(run["id"])) as stream:
            async for event in stream:
                seen.append(event)
                if sum(e.type == "token" for e in seen) >= 20:
                    break
        cancelled_at = time.monotonic()
        assert (await http.post(f"/v1/runs/{run['id']}/cancel", json={"mode": mode})).status_code == 202
        disconnect = await anyio.to_thread.run_sync(provider.wait_for_disconnect, 10.0)
        final = await client.wait_for_run(run["id"])
        log = (await http.get(f"/v1/runs/{run['id']}/events", params={"limit": 1000})).json()["items"]

    assert disconnect.request_index == 0 and disconnect.chunks_sent < CHUNKS // 10
    assert disconnect.at >= cancelled_at
    assert len(provider.requests) == 1
    assert final["status"] == "cancelled"
    assert [e["type"] for e in log if e["type"] in TERMINAL_TYPES] == ["cancelled"]
    tokens = of_type(log, "token")
    assert len(tokens) >= 20
    # What the cancelled call consumed: the prompt, and every delta received before the cut.
    usage = final["usage"]
    assert usage["input_tokens"] == 42
    assert usage["output_tokens"] >= len(tokens)
    assert [c["message_id"] for c in usage["calls"]] == [log[-1]["data"]["partial_message_id"]]


async def test_a_tool_call_round_trip_through_the_server_in_anthropic_shape(server: LiveServer, provider: FakeAnthropic) -> None:
    provider.add(
        Turn(text=["Let me look."], tool_calls=[FakeToolCall(id="toolu_7", name="get_order", arguments='{"order_id": "A100"}')], input_tokens=30),
        Turn(text=["It ", "shipped."], input_tokens=50),
    )

    outcome = await run_to_end(server, "where is A100?")

    assert outcome["run"]["status"] == "completed"
    [call] = of_type(outcome["log"], "tool_call")
    assert (call["call_id"], call["name"], call["args"]) == ("toolu_7", "get_order", {"order_id": "A100"})
    [result] = of_type(outcome["log"], "tool_result")
    assert result["status"] == "ok" and result["result"] == {"order_id": "A100", "status": "shipped"}
    second = provider.requests[1]
    assert second["system"] == "You are a helpful assistant."
    assert second["messages"][1]["content"][-1] == {"type": "tool_use", "id": "toolu_7", "name": "get_order", "input": {"order_id": "A100"}}
    assert second["messages"][2]["content"][0]["type"] == "tool_result"
    assert second["messages"][2]["content"][0]["tool_use_id"] == "toolu_7"

    # Usage: one entry per model call on the run, summed in done and on the run resource.
    [done] = of_type(outcome["log"], "done")
    assert done["usage"] == {"input_tokens": 80, "output_tokens": 6}  # the double counts one token per delta
    usage = outcome["run"]["usage"]
    assert (usage["input_tokens"], usage["output_tokens"]) == (80, 6)
    assert [(c["input_tokens"], c["output_tokens"]) for c in usage["calls"]] == [(30, 1 + 3), (50, 2)]  # text + 3 JSON fragments; 2 texts
    assert 'tether_model_tokens_total{kind="input"} 80.0' in outcome["metrics"]
    assert 'tether_model_tokens_total{kind="output"} 6.0' in outcome["metrics"]


async def test_an_overloaded_provider_is_retried_and_the_retry_is_announced(server: LiveServer, provider: FakeAnthropic) -> None:
    provider.add(Turn(error_status=529, error_type="overloaded_error", retry_after="0.1"), Turn(text=["Fine."]))

    outcome = await run_to_end(server, "hello")

    assert outcome["run"]["status"] == "completed"
    details = [s["detail"] for s in of_type(outcome["log"], "status") if s["stage"] == "model"]
    assert details[0] is None and details[1].startswith("retrying in ") and "after model_overloaded (attempt 2 of 4)" in details[1]
    assert "".join(t["text"] for t in of_type(outcome["log"], "token")) == "Fine."
    assert len(provider.requests) == 2


async def test_a_fault_after_deltas_fails_the_run_and_keeps_the_partial_answer_flagged(server: LiveServer, provider: FakeAnthropic) -> None:
    # Frames: message_start, content_block_start, then two of the three text deltas.
    provider.add(Turn(text=["The ", "answer ", "is "], error_type="overloaded_error", error_event_after=4), Turn(text=["never sent"]))

    outcome = await run_to_end(server, "hello")

    assert outcome["run"]["status"] == "failed"
    [error] = of_type(outcome["log"], "error")
    assert error["code"] == "model_stream_broken" and error["retryable"] is True
    assert "model_overloaded" in error["message"]
    partial = next(m for m in outcome["messages"] if m["id"] == error["partial_message_id"])
    assert partial["status"] == "failed"
    assert partial["content"] == "".join(t["text"] for t in of_type(outcome["log"], "token")) == "The answer "
    assert len(provider.requests) == 1  # never retried: a second answer would follow the first
    assert outcome["run"]["error"]["code"] == "model_stream_broken"
    assert outcome["run"]["usage"]["calls"][0]["output_tokens"] == 2
