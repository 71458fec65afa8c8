"""Cancellation through the real server: ``POST /v1/runs/{id}/cancel`` stops a run for real.

What cancellation promises, checked from the outside: both modes stop the model stream at once;
``soft`` lets an executing tool finish and record its result, ``hard`` cancels the tool too;
the run ends with exactly one ``cancelled`` event; the partial answer is kept, flagged
``cancelled``; a cancelled run never becomes ``completed``; and only one run per thread is ever
active.
"""

from __future__ import annotations

import asyncio
import os
import random
import threading
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from pathlib import Path
from typing import Any

import httpx
import pytest

from tether.client import AsyncClient
from tether.events import TERMINAL_TYPES, Envelope
from tether.store import Store

from .conftest import LiveServer, ServerProcess, script

pytestmark = pytest.mark.anyio


def sleep_then_answer(seconds: float) -> str:
    """A run that calls ``sleep(seconds)`` and would then answer in a second model turn."""
    return script(
        {"text": "let me wait", "tool_calls": [{"name": "sleep", "args": {"seconds": seconds}}]},
        {"text": "after the sleep", "delay_ms": 5},
    )


# -- helpers ---------------------------------------------------------------------------------


@pytest.fixture
async def http(server: LiveServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        yield client


@pytest.fixture
async def client(server: LiveServer) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(server.url) as tether_client:
        yield tether_client


async def new_thread(http: httpx.AsyncClient) -> str:
    response = await http.post("/v1/threads", json={})
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


async def start_run(http: httpx.AsyncClient, thread_id: str, content: str) -> dict[str, Any]:
    response = await http.post(f"/v1/threads/{thread_id}/runs", json={"input": {"content": content}})
    assert response.status_code == 202, response.text
    return response.json()  # type: ignore[no-any-return]


async def cancel(http: httpx.AsyncClient, run_id: str, mode: str, reason: str | None = None) -> httpx.Response:
    body: dict[str, Any] = {"mode": mode}
    if reason is not None:
        body["reason"] = reason
    return await http.post(f"/v1/runs/{run_id}/cancel", json=body)


async def read_log(http: httpx.AsyncClient, run_id: str) -> list[dict[str, Any]]:
    """The run's whole stored log, through the JSON pages of the events endpoint."""
    items: list[dict[str, Any]] = []
    while True:
        response = await http.get(f"/v1/runs/{run_id}/events", params={"after_seq": items[-1]["seq"] if items else 0, "limit": 1000})
        assert response.status_code == 200, response.text
        page = response.json()["items"]
        if not page:
            return items
        items.extend(page)


async def settled_log(http: httpx.AsyncClient, run_id: str) -> list[dict[str, Any]]:
    """The stored log once the run is terminal, re-read after a pause to catch late writes."""
    first = await read_log(http, run_id)
    await asyncio.sleep(0.3)
    again = await read_log(http, run_id)
    assert again == first, "events were appended after the terminal event"
    return again


def assert_one_terminal_at_the_end(log: list[dict[str, Any]]) -> dict[str, Any]:
    """Seqs are 1..n without gaps and exactly one terminal event carries the last seq."""
    assert [e["seq"] for e in log] == list(range(1, len(log) + 1))
    terminals = [e for e in log if e["type"] in TERMINAL_TYPES]
    assert len(terminals) == 1, [e["type"] for e in terminals]
    assert terminals[0] is log[-1]
    return log[-1]


def assert_error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"code", "message", "details"}
    assert error["code"] == code
    assert isinstance(error["message"], str) and error["message"]
    return error  # type: ignore[no-any-return]


async def path_messages(http: httpx.AsyncClient, thread_id: str) -> list[dict[str, Any]]:
    response = await http.get(f"/v1/threads/{thread_id}/messages", params={"view": "path"})
    assert response.status_code == 200, response.text
    return response.json()["items"]  # type: ignore[no-any-return]


async def sleep_effects(http: httpx.AsyncClient, run_id: str) -> list[dict[str, Any]]:
    response = await http.get("/v1/demo/effects", params={"tool": "sleep", "run_id": run_id})
    assert response.status_code == 200, response.text
    return response.json()["items"]  # type: ignore[no-any-return]


async def stream_until(client: AsyncClient, run_id: str, predicate: Any) -> tuple[list[Envelope], AsyncIterator[Envelope]]:
    """Follow the run until ``predicate(event)`` holds; returns the events so far and the live stream."""
    stream = client.follow(run_id)
    seen: list[Envelope] = []
    async for event in stream:
        seen.append(event)
        if predicate(event):
            return seen, stream
        assert not event.terminal, f"the run ended before the moment to cancel: {event.type}"
    raise AssertionError("stream ended without a terminal event")


def token_counter(n: int) -> Any:
    count = 0

    def predicate(event: Envelope) -> bool:
        nonlocal count
        count += event.type == "token"
        return count >= n

    return predicate


# -- cancelling the model stream -------------------------------------------------------------


async def test_hard_cancel_during_the_model_stream_keeps_the_partial_answer_flagged_cancelled(http: httpx.AsyncClient, client: AsyncClient) -> None:
    thread_id = await new_thread(http)
    run = await start_run(http, thread_id, script({"tokens": 500, "delay_ms": 10}))

    seen, stream = await stream_until(client, run["id"], token_counter(10))
    response = await cancel(http, run["id"], "hard")
    assert response.status_code == 202, response.text
    assert response.json()["status"] in ("cancelling", "cancelled")
    seen += [event async for event in stream]

    terminal = seen[-1]
    assert terminal.type == "cancelled"
    assert terminal.data["mode"] == "hard"
    assert terminal.data["actor"] == "local"
    assert (await http.get(f"/v1/runs/{run['id']}")).json()["status"] == "cancelled"

    log = await settled_log(http, run["id"])
    assert assert_one_terminal_at_the_end(log)["type"] == "cancelled"
    assert [Envelope.model_validate(e) for e in log] == seen  # the stream showed exactly the log
    assert all(e["type"] != "done" for e in log)
    tokens = [e["data"]["text"] for e in log if e["type"] == "token"]
    assert 10 <= len(tokens) < 100, "the model stream did not stop at once"

    messages = await path_messages(http, thread_id)
    partial = messages[-1]
    assert partial["role"] == "assistant"
    assert partial["id"] == terminal.data["partial_message_id"]
    assert partial["status"] == "cancelled"
    assert partial["content"] == "".join(tokens)
    assert {e["data"]["message_id"] for e in log if e["type"] == "token"} == {partial["id"]}


async def test_soft_cancel_during_the_model_stream_also_stops_it_at_once(http: httpx.AsyncClient, client: AsyncClient) -> None:
    thread_id = await new_thread(http)
    run = await start_run(http, thread_id, script({"tokens": 3000, "delay_ms": 10}))

    seen, stream = await stream_until(client, run["id"], token_counter(5))
    response = await cancel(http, run["id"], "soft")
    assert response.status_code == 202, response.text
    cancelled_at = time.monotonic()
    after = [event async for event in stream]
    elapsed = time.monotonic() - cancelled_at

    assert after[-1].type == "cancelled"
    assert after[-1].data["mode"] == "soft"
    # Far below the script's 30 s, with room for a loaded machine: the stream was stopped, not finished.
    assert elapsed < 10, f"the cancelled event took {elapsed:.2f} s; the whole script takes 30 s"
    log = await settled_log(http, run["id"])
    assert_one_terminal_at_the_end(log)
    assert [Envelope.model_validate(e) for e in log] == seen + after
    streamed = sum(e["type"] == "token" for e in log)
    assert streamed < 1000, f"{streamed} of 3000 tokens streamed after a soft cancel"

    partial = (await path_messages(http, thread_id))[-1]
    assert partial["id"] == after[-1].data["partial_message_id"]
    assert partial["status"] == "cancelled"
    assert partial["content"] == "".join(e["data"]["text"] for e in log if e["type"] == "token")
    assert (await http.get(f"/v1/runs/{run['id']}")).json()["status"] == "cancelled"


# -- cancelling during a tool call -----------------------------------------------------------


async def wait_inside_the_sleep_tool(client: AsyncClient, run_id: str) -> tuple[list[Envelope], AsyncIterator[Envelope]]:
    # The ``status`` event of the tool stage is emitted as the tools start and reaches a client
    # only after its commit, by which time the tool task is already inside its sleep.
    seen, stream = await stream_until(client, run_id, lambda e: e.type == "status" and e.data["stage"] == "tool")
    return seen, stream


async def test_soft_cancel_lets_the_running_tool_finish_and_then_stops(http: httpx.AsyncClient, client: AsyncClient) -> None:
    thread_id = await new_thread(http)
    run = await start_run(http, thread_id, sleep_then_answer(2))
    seen, stream = await wait_inside_the_sleep_tool(client, run["id"])

    response = await cancel(http, run["id"], "soft")
    assert response.status_code == 202, response.text
    assert response.json()["status"] == "cancelling"  # the tool is still sleeping
    seen += [event async for event in stream]

    log = await settled_log(http, run["id"])
    assert [Envelope.model_validate(e) for e in log] == seen
    assert assert_one_terminal_at_the_end(log)["type"] == "cancelled"
    types = [e["type"] for e in log]
    result_at = types.index("tool_result")
    result = log[result_at]["data"]
    assert result["status"] == "ok"
    assert result["result"] == {"slept": 2}
    # Nothing after the tool's result but the end: no next model call.
    assert types[result_at + 1 :] == ["cancelled"]
    assert log[-1]["data"]["mode"] == "soft"
    assert [e["args"]["finished"] for e in await sleep_effects(http, run["id"])] == [True]
    assert (await http.get(f"/v1/runs/{run['id']}")).json()["status"] == "cancelled"
    replies = [m for m in await path_messages(http, thread_id) if m["role"] == "assistant"]
    assert [m["content"] for m in replies] == ["let me wait"]  # no second model turn


async def test_hard_cancel_cancels_the_running_tool_and_runs_its_cleanup(http: httpx.AsyncClient, client: AsyncClient) -> None:
    thread_id = await new_thread(http)
    run = await start_run(http, thread_id, sleep_then_answer(30))
    seen, stream = await wait_inside_the_sleep_tool(client, run["id"])

    started = time.monotonic()
    response = await cancel(http, run["id"], "hard")
    assert response.status_code == 202, response.text
    seen += [event async for event in stream]
    elapsed = time.monotonic() - started

    assert elapsed < 10, f"hard cancel took {elapsed:.2f} s; the 30 s sleep was not cancelled"
    log = await settled_log(http, run["id"])
    terminal = assert_one_terminal_at_the_end(log)
    assert terminal["type"] == "cancelled" and terminal["data"]["mode"] == "hard"
    types = [e["type"] for e in log]
    assert [e["data"]["status"] for e in log if e["type"] == "tool_result"] == ["cancelled"]
    assert types[types.index("tool_result") + 1 :] == ["cancelled"]  # no next model call
    # The tool's finally block ran: it recorded that it did not finish.
    assert [e["args"] for e in await sleep_effects(http, run["id"])] == [{"seconds": 30.0, "finished": False}]
    assert (await http.get(f"/v1/runs/{run['id']}")).json()["status"] == "cancelled"
    tool_message = (await path_messages(http, thread_id))[-1]
    assert tool_message["role"] == "tool" and tool_message["status"] == "cancelled"


# -- the cancel request itself ---------------------------------------------------------------


async def test_cancel_is_idempotent_while_cancelling_and_hard_upgrades_soft(http: httpx.AsyncClient, client: AsyncClient) -> None:
    thread_id = await new_thread(http)
    run = await start_run(http, thread_id, sleep_then_answer(30))
    _, stream = await wait_inside_the_sleep_tool(client, run["id"])

    first = await cancel(http, run["id"], "soft", reason="first")
    second = await cancel(http, run["id"], "soft", reason="second")
    assert (first.status_code, second.status_code) == (202, 202)
    assert first.json()["status"] == second.json()["status"] == "cancelling"
    assert second.json()["cancel"]["mode"] == "soft"

    started = time.monotonic()
    upgrade = await cancel(http, run["id"], "hard")
    assert upgrade.status_code == 202, upgrade.text
    assert upgrade.json()["cancel"]["mode"] == "hard"
    rest = [event async for event in stream]
    assert time.monotonic() - started < 10, "the upgrade to hard did not cancel the 30 s sleep"

    assert rest[-1].type == "cancelled" and rest[-1].data["mode"] == "hard"
    assert [e.data["status"] for e in rest if e.type == "tool_result"] == ["cancelled"]
    assert [e["args"]["finished"] for e in await sleep_effects(http, run["id"])] == [False]
    assert_one_terminal_at_the_end(await settled_log(http, run["id"]))

    late = await cancel(http, run["id"], "soft")
    error = assert_error(late, 409, "run_not_active")
    assert error["details"] == {"status": "cancelled"}


async def test_cancelling_a_completed_run_is_409_run_not_active(http: httpx.AsyncClient, client: AsyncClient) -> None:
    thread_id = await new_thread(http)
    run = await start_run(http, thread_id, script({"text": "quick answer"}))
    assert (await client.wait_for_run(run["id"]))["status"] == "completed"

    for mode in ("soft", "hard"):
        error = assert_error(await cancel(http, run["id"], mode), 409, "run_not_active")
        assert error["details"] == {"status": "completed"}
    log = await read_log(http, run["id"])
    assert assert_one_terminal_at_the_end(log)["type"] == "done"
    assert (await http.get(f"/v1/runs/{run['id']}")).json()["status"] == "completed"


async def test_the_cancelled_event_carries_the_reason_and_the_actor(http: httpx.AsyncClient, client: AsyncClient) -> None:
    thread_id = await new_thread(http)
    run = await start_run(http, thread_id, script({"tokens": 500, "delay_ms": 10}))
    _, stream = await stream_until(client, run["id"], token_counter(3))

    response = await cancel(http, run["id"], "hard", reason="the user pressed stop")
    assert response.status_code == 202
    terminal = [event async for event in stream][-1]

    assert terminal.type == "cancelled"
    assert terminal.data["reason"] == "the user pressed stop"
    assert terminal.data["actor"] == "local"
    assert terminal.data["mode"] == "hard"
    stored = (await http.get(f"/v1/runs/{run['id']}")).json()
    assert stored["cancel"] == {"mode": "hard", "reason": "the user pressed stop", "actor": "local"}


async def test_a_cancel_of_a_streaming_run_is_written_with_the_run_s_end(http: httpx.AsyncClient, client: AsyncClient) -> None:
    """While the run streams its answer, nothing stands between the request and the end: the
    request, its audit entry and ``cancelled`` are one write, so the 202 already shows the end."""
    thread_id = await new_thread(http)
    run = await start_run(http, thread_id, script({"tokens": 500, "delay_ms": 10}))
    seen, stream = await stream_until(client, run["id"], token_counter(5))

    response = await cancel(http, run["id"], "soft", reason="enough")
    assert response.status_code == 202, response.text
    assert response.json()["status"] == "cancelled"
    assert response.json()["cancel"] == {"mode": "soft", "reason": "enough", "actor": "local"}
    seen += [event async for event in stream]
    assert seen[-1].type == "cancelled"
    assert (seen[-1].data["mode"], seen[-1].data["reason"], seen[-1].data["actor"]) == ("soft", "enough", "local")
    entries = await client.audit(run_id=run["id"])
    assert [(e["action"], e["actor"], e["reason"], e["outcome"], e["details"]) for e in entries] == [
        ("cancel", "local", "enough", "cancelled", {"mode": "soft"})
    ]
    log = await settled_log(http, run["id"])
    assert [Envelope.model_validate(e) for e in log] == seen
    partial = (await path_messages(http, thread_id))[-1]
    assert (partial["id"], partial["status"]) == (seen[-1].data["partial_message_id"], "cancelled")
    assert partial["content"] == "".join(e["data"]["text"] for e in log if e["type"] == "token")


async def test_a_hard_cancel_refused_because_a_soft_one_ended_the_run_leaves_no_trace_on_its_end(
    server: LiveServer, http: httpx.AsyncClient, client: AsyncClient
) -> None:
    """A soft cancel ends a streaming run in one write; a hard request that reached the executor
    before that write, but whose own record comes after it, is refused (409): the run's end then
    says ``soft``, in its event, its record and its one audit entry. The order is forced with
    latches inside the server (no timing): the executor, ending for the soft request, waits
    until the hard request has signalled it; the hard request's record waits for the end."""
    runtime, store = server.app.state.runtime, server.app.state.store
    handed_over = threading.Event()  # set on the server's loop, awaited from the test's
    hard_signalled = asyncio.Event()  # these two are used on the server's loop only
    ended = asyncio.Event()

    thread_id = await new_thread(http)
    run = await start_run(http, thread_id, script({"tokens": 500, "delay_ms": 10}))
    _, stream = await stream_until(client, run["id"], token_counter(2))
    executor = runtime._executors[run["id"]]
    wait_for_idle, finish_run, request_cancel = executor.events.wait_for_idle, store.finish_run, store.request_cancel

    async def idle_after_the_hard_signal() -> None:
        if executor.cancel.handed_over and not handed_over.is_set():  # ending for the soft request
            handed_over.set()
            await hard_signalled.wait()
        await wait_for_idle()

    async def finish_run_then_say_so(run_id: str, **kwargs: Any) -> bool:
        done = bool(await finish_run(run_id, **kwargs))
        if kwargs.get("cancel") is not None:  # the soft request's one-write end
            ended.set()
        return done

    async def record_hard_after_the_end(run_id: str, **kwargs: Any) -> Any:
        if kwargs.get("mode") == "hard":
            hard_signalled.set()  # the runtime signals the executor before it records
            await ended.wait()
        return await request_cancel(run_id, **kwargs)

    executor.events.wait_for_idle = idle_after_the_hard_signal
    store.finish_run, store.request_cancel = finish_run_then_say_so, record_hard_after_the_end
    try:
        soft = asyncio.create_task(cancel(http, run["id"], "soft", "soft first"))
        assert await asyncio.to_thread(handed_over.wait, 30), "the executor did not start ending for the soft request"
        hard = await cancel(http, run["id"], "hard", "hard second")
        assert (await soft).status_code == 202
    finally:
        store.finish_run, store.request_cancel = finish_run, request_cancel
    assert_error(hard, 409, "run_not_active")
    terminal = [event async for event in stream][-1]
    assert (terminal.type, terminal.data["mode"], terminal.data["reason"]) == ("cancelled", "soft", "soft first")
    final = (await http.get(f"/v1/runs/{run['id']}")).json()
    assert (final["status"], final["cancel"]["mode"], final["cancel"]["reason"]) == ("cancelled", "soft", "soft first")
    entries = await client.audit(run_id=run["id"])
    assert [(e["details"]["mode"], e["reason"], e["outcome"]) for e in entries] == [("soft", "soft first", "cancelled")]


async def test_many_cancels_of_one_run_at_once_each_get_an_answer_and_an_audit_entry(http: httpx.AsyncClient, client: AsyncClient) -> None:
    """Clients race to cancel the same streaming run (random modes and reasons, from several
    connections): every request is answered 202 or 409 ``run_not_active``, each accepted one
    has its own audit entry, the run ends once, and its event agrees with its record."""
    seed = int.from_bytes(os.urandom(4), "big")
    rng = random.Random(seed)
    for _ in range(6):
        thread_id = await new_thread(http)
        run = await start_run(http, thread_id, script({"tokens": 500, "delay_ms": 5}))
        _, stream = await stream_until(client, run["id"], token_counter(rng.randint(1, 8)))
        requests = [(rng.choice(["soft", "hard"]), f"reason {i}") for i in range(rng.randint(2, 12))]
        clients = [httpx.AsyncClient(base_url=str(http.base_url), timeout=30) for _ in range(3)]
        try:
            responses = await asyncio.gather(*(cancel(clients[i % 3], run["id"], mode, reason) for i, (mode, reason) in enumerate(requests)))
        finally:
            for c in clients:
                await c.aclose()
        rest = [event async for event in stream]
        where = f"seed={seed} requests={requests} answers={[r.status_code for r in responses]}"
        accepted = [req for req, r in zip(requests, responses, strict=True) if r.status_code == 202]
        for r in responses:
            if r.status_code != 202:
                assert_error(r, 409, "run_not_active")
        assert accepted, where  # the first request finds the run streaming
        terminal = rest[-1]
        assert terminal.type == "cancelled", where
        final = (await http.get(f"/v1/runs/{run['id']}")).json()
        assert final["status"] == "cancelled", where
        assert (final["cancel"]["reason"], final["cancel"]["actor"]) == (terminal.data["reason"], terminal.data["actor"]), where
        assert terminal.data["reason"] in [reason for _, reason in accepted], where
        # An accepted hard request, whenever it came, makes the end hard; the event says what the record does.
        assert terminal.data["mode"] == final["cancel"]["mode"] == ("hard" if any(mode == "hard" for mode, _ in accepted) else "soft"), where
        entries = await client.audit(run_id=run["id"])
        assert sorted((e["details"]["mode"], e["reason"]) for e in entries) == sorted(accepted), where
        assert all(e["action"] == "cancel" and e["outcome"] in ("cancelling", "cancelled") for e in entries), where
        assert_one_terminal_at_the_end(await settled_log(http, run["id"]))


# -- a cancel never produces `completed` -----------------------------------------------------

RACE_SCRIPTS = [
    [{"tokens": 6, "delay_ms": 3}],
    [{"tokens": 4}],
    [{"text": "checking", "tool_calls": [{"name": "get_order", "args": {"order_id": "A1"}}]}, {"text": "it shipped", "delay_ms": 2}],
    [{"text": "a moment", "tool_calls": [{"name": "sleep", "args": {"seconds": 0.03}}]}, {"tokens": 3, "delay_ms": 2}],
]


MOMENTS = ["at_once", "soon", "soon", "at_the_last_token", "after_the_end"]


async def race_one(http: httpx.AsyncClient, client: AsyncClient, rng: random.Random, moment: str) -> dict[str, Any]:
    steps = rng.choice(RACE_SCRIPTS)
    final_text = steps[-1]["text"].split()[-1] if "text" in steps[-1] else f"t{steps[-1]['tokens']}"
    mode = rng.choice(["soft", "hard"])
    thread_id = await new_thread(http)
    run = await start_run(http, thread_id, script(*steps))
    if moment == "soon":
        await asyncio.sleep(rng.uniform(0, 0.08))
    elif moment in ("at_the_last_token", "after_the_end"):
        async with aclosing(client.follow(run["id"])) as stream:
            async for event in stream:
                if moment == "at_the_last_token" and event.type == "token" and event.data["text"].strip() == final_text:
                    break
    response = await cancel(http, run["id"], mode)
    final = await client.wait_for_run(run["id"])
    log = await read_log(http, run["id"])
    messages = await path_messages(http, thread_id)
    return {"moment": moment, "mode": mode, "cancel": response, "run": final, "log": log, "messages": messages, "steps": steps}


async def test_a_cancel_racing_the_end_of_a_run_never_yields_completed(http: httpx.AsyncClient, client: AsyncClient) -> None:
    seed = int.from_bytes(os.urandom(4), "big")
    rng = random.Random(seed)
    outcomes = await asyncio.gather(*(race_one(http, client, random.Random(rng.random()), MOMENTS[i % len(MOMENTS)]) for i in range(30)))
    await asyncio.sleep(0.3)  # let any late write land before re-reading

    statuses = set()
    for outcome in outcomes:
        where = f"seed={seed} moment={outcome['moment']} mode={outcome['mode']} steps={outcome['steps']}"
        run, response = outcome["run"], outcome["cancel"]
        log = await read_log(http, run["id"])
        assert log == outcome["log"], f"events appended after the end ({where})"
        terminal = assert_one_terminal_at_the_end(log)
        assert run["status"] in ("completed", "cancelled"), where
        assert terminal["type"] == {"completed": "done", "cancelled": "cancelled"}[run["status"]], where
        # 202 means the cancel was taken: the run must end cancelled. 409 means it was too late.
        if response.status_code == 202:
            assert run["status"] == "cancelled", where
        else:
            assert_error(response, 409, "run_not_active")
            assert run["status"] == "completed", where
        # Every tool call gets exactly one result, in the log and in the stored history (which
        # is what the next model call is shown; providers refuse a call without its result).
        calls = [e["data"]["call_id"] for e in log if e["type"] == "tool_call"]
        assert sorted(calls) == sorted(e["data"]["call_id"] for e in log if e["type"] == "tool_result"), where
        stored_calls = [c["id"] for m in outcome["messages"] if m["run_id"] == run["id"] for c in m["tool_calls"] or ()]
        answered = [m["tool_call_id"] for m in outcome["messages"] if m["run_id"] == run["id"] and m["role"] == "tool"]
        assert sorted(stored_calls) == sorted(answered), f"a stored tool call without a result ({where})"
        run_messages = [m for m in outcome["messages"] if m["run_id"] == run["id"] and m["role"] == "assistant"]
        assert all(m["status"] != "partial" for m in run_messages), where
        if run["status"] == "completed":
            answer = next(m for m in run_messages if m["id"] == terminal["data"]["message_id"])
            assert answer["status"] == "complete", where
        else:
            # A cancelled run leaves no final answer marked as finished.
            finals = [m for m in run_messages if not m["tool_calls"]]
            assert all(m["status"] != "complete" for m in finals), f"a finished answer in a cancelled run ({where}): {finals}"
            partial_id = terminal["data"]["partial_message_id"]
            if partial_id is not None:
                partial = next(m for m in run_messages if m["id"] == partial_id)
                assert partial["status"] == "cancelled", where
                texts = [e["data"]["text"] for e in log if e["type"] == "token" and e["data"]["message_id"] == partial_id]
                assert partial["content"] == "".join(texts), where
        statuses.add(run["status"])
    assert statuses == {"completed", "cancelled"}, f"seed={seed}: the race did not produce both outcomes"


# -- one active run per thread ---------------------------------------------------------------


async def test_a_second_run_on_a_busy_thread_is_409_until_the_first_ends(http: httpx.AsyncClient, client: AsyncClient) -> None:
    thread_id = await new_thread(http)
    first = await start_run(http, thread_id, script({"tokens": 500, "delay_ms": 10}))

    busy = await http.post(f"/v1/threads/{thread_id}/runs", json={"input": {"content": "me too"}})
    assert_error(busy, 409, "thread_busy")
    assert (await http.get(f"/v1/threads/{thread_id}")).json()["active_run_id"] == first["id"]

    assert (await cancel(http, first["id"], "hard")).status_code == 202
    assert (await client.wait_for_run(first["id"]))["status"] == "cancelled"
    second = await start_run(http, thread_id, script({"text": "second answer"}))
    final = await client.wait_for_run(second["id"])
    assert final["status"] == "completed"
    assert (await path_messages(http, thread_id))[-1]["content"] == "second answer"


async def test_concurrent_runs_on_an_idle_thread_admit_exactly_one(http: httpx.AsyncClient, client: AsyncClient) -> None:
    thread_id = await new_thread(http)
    # Each run would wait for a human (a refund), so the winner stays active while every other
    # request is handled, however late it arrives: exactly one may be admitted.
    contents = [f"refund {i + 1} on order A{i}" for i in range(20)]
    responses = await asyncio.gather(*(http.post(f"/v1/threads/{thread_id}/runs", json={"input": {"content": c}}) for c in contents))

    accepted = [r for r in responses if r.status_code == 202]
    assert len(accepted) == 1, [r.status_code for r in responses]
    for response in responses:
        if response.status_code != 202:
            assert_error(response, 409, "thread_busy")
    run = accepted[0].json()
    assert await client.wait_for_interrupt(run["id"]) is not None
    assert (await http.post(f"/v1/runs/{run['id']}/cancel", json={"mode": "hard"})).status_code == 202
    assert (await client.wait_for_run(run["id"]))["status"] == "cancelled"
    users = [m for m in await path_messages(http, thread_id) if m["role"] == "user"]
    assert [m["id"] for m in users] == [run["input_message_id"]]  # the refused runs left nothing behind
    tree = (await http.get(f"/v1/threads/{thread_id}/messages", params={"view": "tree"})).json()["items"]
    assert sum(m["role"] == "user" for m in tree) == 1


async def test_a_cancel_recorded_without_a_word_to_the_executor_is_picked_up_by_its_lease_keeper(db_url: str, tmp_path: Path) -> None:
    """The lease keeper's backstop, for a cancel whose notification was lost: a cancel written
    straight into the store (no notification, no call to the server) still reaches the run's
    executor at its next lease renewal, and the run ends ``cancelled``."""
    server = ServerProcess(db_url, tmp_path / "server.log", extra_args=("--lease-seconds", "0.6")).start()
    store = await Store.open(db_url)
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as http, asyncio.timeout(60):
            thread_id = await new_thread(http)
            started = await http.post(f"/v1/threads/{thread_id}/runs", json={"input": {"content": script({"tokens": 100_000, "delay_ms": 10})}})
            assert started.status_code == 202, started.text
            run_id = started.json()["id"]
            while (await http.get(f"/v1/runs/{run_id}")).json()["status"] != "running":
                await asyncio.sleep(0.02)
            await store.request_cancel(run_id, mode="soft", reason="lost notification", actor="someone else")
            while (run := (await http.get(f"/v1/runs/{run_id}")).json())["status"] == "cancelling":
                await asyncio.sleep(0.05)
            assert run["status"] == "cancelled", run
            log = (await http.get(f"/v1/runs/{run_id}/events", params={"limit": 1000})).json()["items"]
            assert log[-1]["type"] == "cancelled"
    finally:
        await store.aclose()
        server.stop()
