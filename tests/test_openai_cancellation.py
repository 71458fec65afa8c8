"""Cancelling a run closes the upstream request, so the provider stops generating.

A Tether server whose agent uses :class:`~tether.models.openai.OpenAIModel` against
:class:`~tests.openai_provider.FakeProvider`, a real HTTP server that records when a client
closes its stream and how many chunks it had sent by then. Stopping only our reading would
leave the provider streaming (and billing) to the end; these tests see the socket close.
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

from tether.agent import Agent
from tether.client import AsyncClient
from tether.events import TERMINAL_TYPES, Envelope
from tether.models.openai import OpenAIModel

from .conftest import LiveServer, sqlite_url
from .openai_provider import FakeProvider, long_turn

pytestmark = pytest.mark.anyio

CHUNKS = 10_000  # about 50 s of stream at 5 ms a chunk: a cancel always cuts it mid-way


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    with FakeProvider() as fake:
        yield fake


@pytest.fixture
def openai_server(provider: FakeProvider, tmp_path: Path) -> Iterator[LiveServer]:
    model = OpenAIModel("fake", base_url=provider.base_url, api_key="x", timeout=30)
    live = LiveServer(Agent(model, tools=[]), sqlite_url(tmp_path)).start()
    try:
        yield live
    finally:
        live.stop()


async def read_log(http: httpx.AsyncClient, run_id: str) -> list[dict[str, Any]]:
    response = await http.get(f"/v1/runs/{run_id}/events", params={"limit": 1000})
    assert response.status_code == 200, response.text
    return response.json()["items"]  # type: ignore[no-any-return]


async def cancel_mid_stream(server: LiveServer, provider: FakeProvider, mode: str) -> dict[str, Any]:
    """Start a run on a long provider stream, cancel it after some tokens, report what happened."""
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
        response = await http.post(f"/v1/runs/{run['id']}/cancel", json={"mode": mode})
        assert response.status_code == 202, response.text
        disconnect = await anyio.to_thread.run_sync(provider.wait_for_disconnect, 5.0)
        final = await client.wait_for_run(run["id"])
        await anyio.sleep(0.2)
        log = await read_log(http, run["id"])
        messages = await client.messages(thread["id"])
    return {"run": final, "log": log, "messages": messages, "disconnect": disconnect, "cancelled_at": cancelled_at}


@pytest.mark.parametrize("mode", ["hard", "soft"])
async def test_cancelling_a_run_closes_the_provider_stream_promptly(openai_server: LiveServer, provider: FakeProvider, mode: str) -> None:
    outcome = await cancel_mid_stream(openai_server, provider, mode)

    disconnect = outcome["disconnect"]
    assert disconnect.request_index == 0
    assert disconnect.chunks_total == CHUNKS + 4  # role chunk, the text, finish chunk, usage chunk, [DONE]
    assert disconnect.chunks_sent < CHUNKS // 10, f"the provider sent {disconnect.chunks_sent} chunks"
    assert disconnect.at - outcome["cancelled_at"] < 5.0
    assert len(provider.requests) == 1  # no further model call after the cancel

    run, log = outcome["run"], outcome["log"]
    assert run["status"] == "cancelled"
    assert [e["seq"] for e in log] == list(range(1, len(log) + 1))
    assert [e["type"] for e in log if e["type"] in TERMINAL_TYPES] == ["cancelled"]
    assert log[-1]["type"] == "cancelled" and log[-1]["data"]["mode"] == mode

    tokens = [e["data"]["text"] for e in log if e["type"] == "token"]
    assert 20 <= len(tokens) <= disconnect.chunks_sent
    partial = outcome["messages"][-1]
    assert partial["role"] == "assistant"
    assert partial["id"] == log[-1]["data"]["partial_message_id"]
    assert partial["status"] == "cancelled"
    assert partial["content"] == "".join(tokens)
    assert partial["content"].startswith("t1 t2 t3 ")
