"""A server killed mid-run and started again on the same database.

The server runs as a child process (``tether demo``) that the test SIGKILLs: no shutdown code
runs, exactly as in a crash. What was committed must come back byte for byte; the run that was
executing is taken over from its last checkpoint: a ``status: recovering`` event names the
half-finished answer (kept off the active path, flagged ``failed``, with the text it had
streamed), the step is done again, and the run ends with exactly one terminal event; the thread
is usable again.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import aclosing
from pathlib import Path
from typing import Any

import httpx
import pytest

from tether.events import TERMINAL_TYPES, Envelope

from .conftest import ServerProcess, script, start_server

pytestmark = pytest.mark.anyio

SSE = {"Accept": "text/event-stream"}


async def replay(http: httpx.AsyncClient, run_id: str) -> tuple[bytes, bytes]:
    """A finished run as the API serves it: the whole SSE body and the JSON page, as bytes."""
    sse = await http.get(f"/v1/runs/{run_id}/events", headers=SSE)
    assert sse.status_code == 200, sse.text
    page = await http.get(f"/v1/runs/{run_id}/events", params={"limit": 1000})
    assert page.status_code == 200, page.text
    return sse.content, page.content


async def run_to_end(http: httpx.AsyncClient, thread_id: str, content: str) -> dict[str, Any]:
    response = await http.post(f"/v1/threads/{thread_id}/runs", json={"input": {"content": content}})
    assert response.status_code == 202, response.text
    run_id = response.json()["id"]
    await http.get(f"/v1/runs/{run_id}/events", headers=SSE)  # the stream closes after the terminal event
    return (await http.get(f"/v1/runs/{run_id}")).json()  # type: ignore[no-any-return]


async def stream_events(http: httpx.AsyncClient, run_id: str) -> AsyncIterator[Envelope]:
    async with http.stream("GET", f"/v1/runs/{run_id}/events", headers=SSE) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                yield Envelope.from_json(line[len("data: ") :])


async def test_a_killed_server_restarts_with_every_run_intact_and_continues_the_interrupted_one(processes: list[ServerProcess], tmp_path: Path) -> None:
    first = start_server(processes, tmp_path)
    async with httpx.AsyncClient(base_url=first.url, timeout=30) as http:
        thread_id = (await http.post("/v1/threads", json={"metadata": {"case": "restart"}})).json()["id"]
        finished: dict[str, dict[str, Any]] = {}
        for content in (
            script({"text": "a finished answer"}),
            script({"text": "looking", "tool_calls": [{"name": "get_order", "args": {"order_id": "A100"}}]}, {"text": "it shipped"}),
            script({"fail": "the provider fell over"}),
        ):
            run = await run_to_end(http, thread_id, content)
            finished[run["id"]] = run
        # And one cancelled run.
        response = await http.post(f"/v1/threads/{thread_id}/runs", json={"input": {"content": script({"tokens": 500, "delay_ms": 10})}})
        cancelled_id = response.json()["id"]
        await asyncio.sleep(0.2)
        assert (await http.post(f"/v1/runs/{cancelled_id}/cancel", json={"mode": "hard", "reason": "enough"})).status_code == 202
        await http.get(f"/v1/runs/{cancelled_id}/events", headers=SSE)
        finished[cancelled_id] = (await http.get(f"/v1/runs/{cancelled_id}")).json()
        assert sorted(r["status"] for r in finished.values()) == ["cancelled", "completed", "completed", "failed"]
        before = {run_id: await replay(http, run_id) for run_id in finished}
        messages_before = (await http.get(f"/v1/threads/{thread_id}/messages", params={"view": "tree"})).json()["items"]

        # A slow run, killed in the middle of its stream.
        response = await http.post(f"/v1/threads/{thread_id}/runs", json={"input": {"content": script({"tokens": 400, "delay_ms": 5})}})
        assert response.status_code == 202, response.text
        interrupted_id = response.json()["id"]
        seen: list[Envelope] = []
        async with aclosing(stream_events(http, interrupted_id)) as events:
            async for event in events:
                seen.append(event)
                if sum(e.type == "token" for e in seen) >= 30:
                    break
    first.kill()

    second = start_server(processes, tmp_path)
    async with httpx.AsyncClient(base_url=second.url, timeout=30) as http:
        # Every finished run replays exactly as before: same SSE bytes, same JSON envelopes.
        for run_id, (sse, page) in before.items():
            assert await replay(http, run_id) == (sse, page), f"run {run_id} replays differently"
            after = (await http.get(f"/v1/runs/{run_id}")).json()
            assert after == finished[run_id]
        tree = (await http.get(f"/v1/threads/{thread_id}/messages", params={"view": "tree"})).json()["items"]
        assert tree[: len(messages_before)] == messages_before  # the settled messages are untouched

        # The interrupted run is taken over from its last checkpoint and completes; a client
        # that follows it from the start gets one gapless log with one terminal event.
        replayed = [event async for event in stream_events(http, interrupted_id)]
        run = (await http.get(f"/v1/runs/{interrupted_id}")).json()
        assert run["status"] == "completed" and run["error"] is None and run["ended_at"] is not None
        log = (await http.get(f"/v1/runs/{interrupted_id}/events", params={"limit": 1000})).json()["items"]
        assert [e.model_dump() for e in replayed] == log
        assert [e["seq"] for e in log] == list(range(1, len(log) + 1))
        assert [e["type"] for e in log if e["type"] in TERMINAL_TYPES] == ["done"] and log[-1]["type"] == "done"
        # Durable before sent: everything a client saw before the crash is in the log, unchanged.
        assert [Envelope.model_validate(e) for e in log[: len(seen)]] == seen

        # The half-finished step: its tokens, then one `recovering` status naming the message
        # to discard, then the step done again in full under a new message.
        recovering = [i for i, e in enumerate(log) if e["type"] == "status" and e["data"]["stage"] == "recovering"]
        assert len(recovering) == 1
        cut = recovering[0]
        discarded_id = log[cut]["data"]["discard_message_id"]
        before_cut = [e for e in log[:cut] if e["type"] == "token"]
        after_cut = [e for e in log[cut:] if e["type"] == "token"]
        assert {e["data"]["message_id"] for e in before_cut} == {discarded_id}
        assert 30 <= len(before_cut) < 400
        assert "".join(e["data"]["text"] for e in after_cut) == "".join(f"t{n} " for n in range(1, 401))
        answer_id = log[-1]["data"]["message_id"]
        assert {e["data"]["message_id"] for e in after_cut} == {answer_id} and answer_id != discarded_id

        # No message is duplicated in the history: the path holds the full answer once; the
        # discarded partial stays in the tree as a failed sibling, off the path.
        path = (await http.get(f"/v1/threads/{thread_id}/messages", params={"view": "path"})).json()["items"]
        assert path[-1]["id"] == answer_id and path[-1]["status"] == "complete"
        assert path[-1]["content"] == "".join(f"t{n} " for n in range(1, 401))
        assert discarded_id not in {m["id"] for m in path}
        tree = (await http.get(f"/v1/threads/{thread_id}/messages", params={"view": "tree"})).json()["items"]
        discarded = next(m for m in tree if m["id"] == discarded_id)
        assert discarded["status"] == "failed" and discarded["parent_id"] == path[-1]["parent_id"]
        assert discarded["content"] == "".join(e["data"]["text"] for e in before_cut)
        interrupted_replay = await replay(http, interrupted_id)

        # The thread is usable again: a new run completes on it.
        assert (await http.get(f"/v1/threads/{thread_id}")).json()["active_run_id"] is None
        after_restart = await run_to_end(http, thread_id, script({"text": "back in business"}))
        assert after_restart["status"] == "completed"
        path = (await http.get(f"/v1/threads/{thread_id}/messages", params={"view": "path"})).json()["items"]
        assert path[-1]["content"] == "back in business"
        assert path[-1]["status"] == "complete"
    second.stop()

    # Recovery happens once: a further restart changes nothing that is already settled.
    third = start_server(processes, tmp_path)
    async with httpx.AsyncClient(base_url=third.url, timeout=30) as http:
        assert await replay(http, interrupted_id) == interrupted_replay
        for run_id, (sse, page) in before.items():
            assert await replay(http, run_id) == (sse, page)
        assert (await http.get(f"/v1/runs/{after_restart['id']}")).json()["status"] == "completed"


async def test_a_read_only_tool_cut_off_by_a_kill_is_run_again_after_the_restart(processes: list[ServerProcess], tmp_path: Path) -> None:
    first = start_server(processes, tmp_path)
    async with httpx.AsyncClient(base_url=first.url, timeout=30) as http:
        thread_id = (await http.post("/v1/threads", json={})).json()["id"]
        content = script({"text": "one moment", "tool_calls": [{"name": "sleep", "args": {"seconds": 1}}]}, {"text": "slept well"})
        run_id = (await http.post(f"/v1/threads/{thread_id}/runs", json={"input": {"content": content}})).json()["id"]
        async with aclosing(stream_events(http, run_id)) as events:
            async for event in events:
                if event.type == "tool_call":
                    call_id = event.data["call_id"]
                if event.type == "status" and event.data["stage"] == "tool":
                    break  # emitted as the tool starts, seen after its commit: the tool is sleeping now
    first.kill()

    second = start_server(processes, tmp_path)
    async with httpx.AsyncClient(base_url=second.url, timeout=30) as http:
        replayed = [event async for event in stream_events(http, run_id)]
        assert replayed[-1].type == "done"
        assert (await http.get(f"/v1/runs/{run_id}")).json()["status"] == "completed"
        # Exactly one result for the call: the re-run's.
        results = [(e.data["call_id"], e.data["status"]) for e in replayed if e.type == "tool_result"]
        assert results == [(call_id, "ok")]
        # Read-only, so it may run again: the killed run left no effect (SIGKILL skips `finally`),
        # the re-run left one.
        effects = (await http.get("/v1/demo/effects", params={"run_id": run_id})).json()["items"]
        assert [(e["tool"], e["args"]["finished"]) for e in effects] == [("sleep", True)]
        path = (await http.get(f"/v1/threads/{thread_id}/messages", params={"view": "path"})).json()["items"]
        assert [m["tool_call_id"] for m in path if m["role"] == "tool"] == [call_id]
        assert path[-1]["content"] == "slept well"


async def test_a_destructive_tool_cut_off_by_a_kill_is_never_rerun_without_a_human(processes: list[ServerProcess], tmp_path: Path) -> None:
    first = start_server(processes, tmp_path)
    async with httpx.AsyncClient(base_url=first.url, timeout=30) as http:
        thread_id = (await http.post("/v1/threads", json={})).json()["id"]
        content = script({"text": "purging", "tool_calls": [{"name": "purge_cache", "args": {"seconds": 30}}]}, {"text": "all done"})
        run_id = (await http.post(f"/v1/threads/{thread_id}/runs", json={"input": {"content": content}})).json()["id"]
        interrupt = None
        async with aclosing(stream_events(http, run_id)) as events:
            async for event in events:
                if event.type == "interrupt":
                    interrupt = event.data
                    break
        assert interrupt is not None
        call_id = interrupt["action_requests"][0]["call_id"]
        body = {"interrupt_id": interrupt["interrupt_id"], "decisions": [{"decision": "approve"}]}
        assert (await http.post(f"/v1/threads/{thread_id}/resume", json=body)).status_code == 200
        await asyncio.sleep(0.5)  # purging now
    first.kill()

    second = start_server(processes, tmp_path)
    async with httpx.AsyncClient(base_url=second.url, timeout=30) as http:
        # Nobody knows whether the purge happened: it goes back to a human, marked as such.
        async with asyncio.timeout(10):
            while (run := (await http.get(f"/v1/runs/{run_id}")).json())["status"] != "waiting_human":
                await asyncio.sleep(0.05)
        pending = run["pending_interrupt"]
        assert pending["id"] != interrupt["interrupt_id"]
        [request] = pending["action_requests"]
        assert request["call_id"] == call_id and request["outcome_unknown"] is True
        assert "Outcome unknown" in request["description"]
        await asyncio.sleep(0.5)
        assert (await http.get("/v1/demo/effects", params={"run_id": run_id})).json()["items"] == []  # not re-run
        # The human declines to run it again: its result is `unknown`, and the run goes on.
        body = {"interrupt_id": pending["id"], "decisions": [{"decision": "reject", "reason": "check by hand"}]}
        assert (await http.post(f"/v1/threads/{thread_id}/resume", json=body)).status_code == 200
        replayed = [event async for event in stream_events(http, run_id)]
        assert replayed[-1].type == "done"
        assert [e.model_dump()["seq"] for e in replayed] == list(range(1, len(replayed) + 1))
        results = [(e.data["call_id"], e.data["status"]) for e in replayed if e.type == "tool_result"]
        assert results == [(call_id, "unknown")]
        assert (await http.get("/v1/demo/effects", params={"run_id": run_id})).json()["items"] == []
        path = (await http.get(f"/v1/threads/{thread_id}/messages", params={"view": "path"})).json()["items"]
        assert [m["tool_call_id"] for m in path if m["role"] == "tool"] == [call_id]
        assert path[-1]["content"] == "all done"
