"""``GET /v1/runs/{run_id}/timeline`` through the real server, on SQLite and PostgreSQL.

Where a run's time went, from its event log and its cancel requests: queued, model calls (time
to first token), tools (tier, whether they ran), waits for a person (who decided, how long),
steering, a cancel (from its request to the ``cancelled`` event), and what is still under way.
The web UI derives the same timeline in the browser (``tests/test_ui.py`` checks they agree).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import httpx
import pytest

from tether.server._timeline import TimelineBuilder, ts_us

from .conftest import LiveServer, script

pytestmark = pytest.mark.anyio

SLEEP = {"name": "sleep", "args": {"seconds": 1.5}}
REFUND = {"name": "refund", "args": {"order_id": "A100", "amount": 5}}


@pytest.fixture
async def http(server: LiveServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:
        yield client


async def start(http: httpx.AsyncClient, content: str, **config: Any) -> dict[str, Any]:
    thread = (await http.post("/v1/threads")).json()
    body: dict[str, Any] = {"input": {"content": content}}
    if config:
        body["config"] = config
    response = await http.post(f"/v1/threads/{thread['id']}/runs", json=body)
    assert response.status_code == 202, response.text
    run: dict[str, Any] = response.json()
    return run


async def events(http: httpx.AsyncClient, run_id: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    while True:
        page = (await http.get(f"/v1/runs/{run_id}/events", params={"after_seq": found[-1]["seq"] if found else 0, "limit": 1000})).json()["items"]
        found += page
        if len(page) < 1000:
            return found


async def until(condition: Callable[[], Any], what: str, timeout: float = 20) -> Any:
    """Poll the async ``condition`` until it gives something truthy (and return that)."""
    with anyio.fail_after(timeout):
        while not (value := await condition()):
            await anyio.sleep(0.02)
    return value


async def status_is(http: httpx.AsyncClient, run_id: str, *statuses: str) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        run: dict[str, Any] = (await http.get(f"/v1/runs/{run_id}")).json()
        return run if run["status"] in statuses else None

    found: dict[str, Any] = await until(check, f"run {run_id} to be {statuses}")
    return found


async def tool_started(http: httpx.AsyncClient, run_id: str, name: str) -> None:
    async def check() -> bool:
        return any(e["type"] == "status" and e["data"]["stage"] == "tool" and name in (e["data"]["detail"] or "") for e in await events(http, run_id))

    await until(check, f"{name} to start")


async def timeline(http: httpx.AsyncClient, run_id: str) -> dict[str, Any]:
    response = await http.get(f"/v1/runs/{run_id}/timeline")
    assert response.status_code == 200, response.text
    found: dict[str, Any] = response.json()
    return found


def kinds(found: dict[str, Any]) -> list[str]:
    return [s["kind"] if s["kind"] != "tool" else f"tool:{s['name']}" for s in found["segments"]]


async def test_a_run_with_a_tool_a_wait_for_a_person_and_a_soft_cancel(http: httpx.AsyncClient) -> None:
    run = await start(http, script({"tool_calls": [{"name": "get_order", "args": {"order_id": "A100"}}]}, {"tool_calls": [REFUND]}, {"tool_calls": [SLEEP]}))
    await status_is(http, run["id"], "waiting_human")

    # Under way: the wait is open and runs to the time of the request.
    first = await timeline(http, run["id"])
    assert first["status"] == "waiting_human" and first["ended_at"] is None
    assert kinds(first) == ["queued", "model", "tool:get_order", "model", "human", "tool:refund"]
    wait, refund_call = first["segments"][-2:]
    assert (wait["open"], wait["resolution"], wait["actor"]) == (True, "pending", None)
    assert wait["start_ms"] + wait["duration_ms"] == pytest.approx(first["duration_ms"])
    # Not started yet: drawn where the timeline ends so far, waiting.
    assert (refund_call["open"], refund_call["ran"], refund_call["status"], refund_call["gated"]) == (True, False, None, True)
    assert (refund_call["start_ms"], refund_call["duration_ms"]) == (first["duration_ms"], 0)
    later = await until(lambda: _longer(http, run["id"], first["duration_ms"]), "the open timeline to grow")
    assert later["segments"][-2]["duration_ms"] > wait["duration_ms"]

    interrupt = (await http.get(f"/v1/runs/{run['id']}")).json()["pending_interrupt"]
    resumed = await http.post(f"/v1/threads/{run['thread_id']}/resume", json={"interrupt_id": interrupt["id"], "decisions": [{"decision": "approve"}]})
    assert resumed.status_code == 200, resumed.text
    await tool_started(http, run["id"], "sleep")
    cancelled = await http.post(f"/v1/runs/{run['id']}/cancel", json={"mode": "soft", "reason": "enough"})
    assert cancelled.status_code == 202, cancelled.text
    await status_is(http, run["id"], "cancelled")

    found = await timeline(http, run["id"])
    assert found["status"] == "cancelled" and found["ended_at"] is not None and found["error"] is None
    assert kinds(found) == ["queued", "model", "tool:get_order", "model", "human", "tool:refund", "model", "tool:sleep", "cancel"]
    queued, model1, lookup, model2, wait, refund, model3, sleep, cancel = found["segments"]
    assert not any(s["open"] for s in found["segments"])
    assert queued["start_ms"] == 0 and model1["start_ms"] == queued["duration_ms"]
    assert all(m["first_token_ms"] is not None and m["outcome"] == "tool_calls" and m["tool_calls"] == 1 for m in (model1, model2, model3))
    assert [m["index"] for m in (model1, model2, model3)] == [1, 2, 3]
    assert model1["start_ms"] + model1["duration_ms"] == pytest.approx(lookup["start_ms"])  # the model call ends where the tool starts
    assert (lookup["tier"], lookup["ran"], lookup["status"]) == ("read_only", True, "ok")
    assert (refund["tier"], refund["ran"], refund["status"]) == ("destructive", True, "ok")
    assert (wait["actor"], wait["resolution"], wait["open"]) == ("local", "decided", False)
    assert wait["actions"] == [{"call_id": refund["call_id"], "name": "refund", "decision": "approve"}]
    assert wait["start_ms"] + wait["duration_ms"] <= refund["start_ms"]
    assert sleep["duration_ms"] >= 1400 and sleep["status"] == "ok"
    assert (cancel["mode"], cancel["actor"], cancel["reason"], cancel["landed"]) == ("soft", "local", "enough", True)
    assert cancel["requests"] == [{"at_ms": cancel["start_ms"], "mode": "soft", "actor": "local"}]
    # Asked for while the tool slept, it landed after the tool finished: the soft stop's wait.
    assert sleep["start_ms"] < cancel["start_ms"] < sleep["start_ms"] + sleep["duration_ms"] <= cancel["start_ms"] + cancel["duration_ms"]
    assert cancel["start_ms"] + cancel["duration_ms"] == pytest.approx(found["duration_ms"])
    assert ts_us(found["ended_at"]) - ts_us(found["started_at"]) == round(found["duration_ms"] * 1000)


async def _longer(http: httpx.AsyncClient, run_id: str, than: float) -> dict[str, Any] | None:
    found = await timeline(http, run_id)
    return found if found["duration_ms"] > than else None


async def test_a_soft_cancel_upgraded_to_hard_shows_both_requests_and_cancels_the_tool(http: httpx.AsyncClient) -> None:
    run = await start(http, script({"tool_calls": [{"name": "sleep", "args": {"seconds": 30}}]}))
    await tool_started(http, run["id"], "sleep")
    assert (await http.post(f"/v1/runs/{run['id']}/cancel", json={"mode": "soft"})).status_code == 202
    half = await timeline(http, run["id"])
    assert half["status"] == "cancelling"
    assert (half["segments"][-1]["kind"], half["segments"][-1]["landed"], half["segments"][-1]["open"]) == ("cancel", False, True)
    assert (await http.post(f"/v1/runs/{run['id']}/cancel", json={"mode": "hard"})).status_code == 202
    await status_is(http, run["id"], "cancelled")
    found = await timeline(http, run["id"])
    sleep, cancel = found["segments"][-2:]
    assert (sleep["name"], sleep["ran"], sleep["status"]) == ("sleep", True, "cancelled")
    assert (cancel["mode"], cancel["landed"], [r["mode"] for r in cancel["requests"]]) == ("hard", True, ["soft", "hard"])
    assert cancel["requests"][0]["at_ms"] <= cancel["requests"][1]["at_ms"] <= cancel["start_ms"] + cancel["duration_ms"]


async def test_a_cancel_while_the_answer_streams_lands_at_once_and_the_model_call_says_so(http: httpx.AsyncClient) -> None:
    run = await start(http, script({"tokens": 2000, "delay_ms": 5}))

    async def streaming() -> bool:
        return sum(e["type"] == "token" for e in await events(http, run["id"])) >= 5

    await until(streaming, "tokens to stream")
    assert (await http.post(f"/v1/runs/{run['id']}/cancel", json={"mode": "soft"})).status_code == 202
    await status_is(http, run["id"], "cancelled")
    found = await timeline(http, run["id"])
    assert kinds(found) == ["queued", "model", "cancel"]
    model, cancel = found["segments"][1:]
    assert (model["outcome"], model["open"]) == ("cancelled", False)
    assert model["first_token_ms"] is not None and model["message_id"] is not None
    # The request is recorded when it was made, though its audit entry is written with the end.
    assert model["start_ms"] < cancel["start_ms"] and cancel["duration_ms"] > 0
    assert cancel["start_ms"] + cancel["duration_ms"] == pytest.approx(model["start_ms"] + model["duration_ms"])
    assert model["start_ms"] + model["duration_ms"] == pytest.approx(found["duration_ms"])


async def test_an_expired_wait_a_steering_message_and_a_failed_run(http: httpx.AsyncClient) -> None:
    expired = await start(http, script({"tool_calls": [REFUND]}, {"text": "ok then"}), approval_ttl_s=0.3)
    await status_is(http, expired["id"], "completed")
    found = await timeline(http, expired["id"])
    assert kinds(found) == ["queued", "model", "human", "tool:refund", "model"]  # the refund never ran: it is where its result is
    wait, refund, wrap_up = found["segments"][2:]
    assert (wait["actor"], wait["resolution"], wait["actions"][0]["decision"]) == ("system", "expired", "expired")
    assert (refund["ran"], refund["status"]) == (False, "expired")
    assert wrap_up["outcome"] == "answer" and found["status"] == "completed"

    steered = await start(http, script({"tool_calls": [{"name": "sleep", "args": {"seconds": 0.5}}]}, {"text": "done"}))
    await tool_started(http, steered["id"], "sleep")
    assert (await http.post(f"/v1/runs/{steered['id']}/messages", json={"content": "also this"})).status_code == 202
    await status_is(http, steered["id"], "completed")
    assert "steering" in kinds(await timeline(http, steered["id"]))

    failed = await start(http, script({"fail": "the provider is down"}))
    await status_is(http, failed["id"], "failed")
    found = await timeline(http, failed["id"])
    assert found["status"] == "failed" and found["error"]["code"] == "model_error"
    assert found["segments"][-1]["kind"] == "model" and found["segments"][-1]["outcome"] == "failed"


async def test_a_long_run_is_read_across_event_pages_as_the_whole_log_would_give(http: httpx.AsyncClient) -> None:
    run = await start(http, script({"tokens": 2500}))
    await status_is(http, run["id"], "completed")
    log = await events(http, run["id"])
    assert len(log) > 2000  # three pages for the route
    found = await timeline(http, run["id"])
    assert kinds(found) == ["queued", "model"]
    # Every event folded (no text delta skipped), with the run's audit (none): the same answer.
    builder = TimelineBuilder(run["id"])
    for event in log:
        builder.add(event["type"], event["ts"], event["data"])
    assert builder.finish([], now=0) == found
    model = found["segments"][1]
    first_token = next(e for e in log if e["type"] == "token")
    assert model["first_token_ms"] == (ts_us(first_token["ts"]) - ts_us(log[1]["ts"])) / 1000
    assert model["start_ms"] + model["duration_ms"] == pytest.approx(found["duration_ms"])
    assert json.loads(json.dumps(found)) == found


async def test_a_missing_run_has_no_timeline(http: httpx.AsyncClient) -> None:
    response = await http.get("/v1/runs/run_missing/timeline")
    assert response.status_code == 404 and response.json()["error"]["code"] == "run_not_found"
