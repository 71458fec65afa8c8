"""Human review through the real server.

What the review gate promises, checked from the outside: a gated tool is never executed before
its interrupt is resolved (``tool_call`` → ``interrupt`` → decision → execution →
``tool_result``); every decision applies to its own action; an interrupt leaves ``pending``
exactly once, so racing approvals execute a tool once; invalid decisions change nothing;
expiry needs no client; a cancel stops everything; and a sensitive argument never leaves the
tool. Executions are counted where they happen (the demo shop's ``GET /v1/demo/effects``, one
row per real execution), never inferred from responses.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import aclosing
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from tether.agent import Agent
from tether.client import APIError, AsyncClient
from tether.demo import build_demo_agent
from tether.events import TERMINAL_TYPES
from tether.models import ChatMessage, ModelDelta, ModelRequest
from tether.models.scripted import ScriptedModel
from tether.tools import tool

from .conftest import LiveServer, ServerProcess, script, sqlite_url

pytestmark = pytest.mark.anyio

SSE = {"Accept": "text/event-stream"}


# -- a test double that shows what the model was given -------------------------------------


class RecordingModel(ScriptedModel):
    """Test double: :class:`ScriptedModel`, also keeping the history of every call it gets.

    ``requests[k]`` is the ``ModelRequest.messages`` of model call *k* (over the server's life),
    so a test sees exactly what the model was shown, not what the API says it was shown.
    """

    def __init__(self) -> None:
        super().__init__(word_delay_s=0)
        self.requests: list[list[ChatMessage]] = []

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelDelta]:
        self.requests.append(list(request.messages))
        async with aclosing(super().stream(request)) as deltas:  # type: ignore[type-var]
            async for delta in deltas:
                yield delta


class RecordingShop:
    """The demo agent with a :class:`RecordingModel`, an ``ask_user`` that records whether it
    ever ran, and ``close_account``, a destructive tool with its own short approval TTL."""

    def __init__(self) -> None:
        self.model = RecordingModel()
        #: Every question the ``ask_user`` tool function itself received (it must never run).
        self.asked: list[str] = []
        #: Every account ``close_account`` really closed.
        self.closed: list[str] = []
        demo = build_demo_agent(self.model)

        @tool(allowed_decisions=("respond",), describe="Question for you: {question}")
        async def ask_user(question: str) -> dict[str, Any]:
            """Ask the user a question; the human's answer is the result."""
            self.asked.append(question)
            return {"answer": None, "note": "the tool function ran"}

        @tool(risk="destructive", approval_ttl_s=0.5)
        async def close_account(customer: str) -> dict[str, Any]:
            """Close a customer's account (irreversible); its approvals expire fast."""
            self.closed.append(customer)
            return {"closed": customer}

        tools = [t for t in demo.tools.values() if t.name != "ask_user"] + [ask_user, close_account]
        self.agent = Agent(
            self.model,
            tools,
            system_prompt=demo.system_prompt,
            name="recording-demo",
            on_startup=demo.on_startup,
            routes=demo.routes,
        )


# -- fixtures and helpers --------------------------------------------------------------------


@pytest.fixture
async def client(server: LiveServer) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(server.url) as tether_client:
        yield tether_client


@pytest.fixture
async def http(server: LiveServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as raw:
        yield raw


@pytest.fixture
def shop(db_url: str) -> Iterator[tuple[RecordingShop, LiveServer]]:
    recording = RecordingShop()
    live = LiveServer(recording.agent, db_url).start()
    try:
        yield recording, live
    finally:
        live.stop()


async def start(client: AsyncClient, *steps: dict[str, Any], config: dict[str, Any] | None = None) -> dict[str, Any]:
    """A new thread with one run playing ``steps``."""
    thread = await client.create_thread()
    return await client.start_run(thread["id"], script(*steps), config=config)


async def read_log(http: httpx.AsyncClient, run_id: str) -> list[dict[str, Any]]:
    """The run's whole stored log (JSON page form)."""
    response = await http.get(f"/v1/runs/{run_id}/events", params={"limit": 1000})
    assert response.status_code == 200, response.text
    return response.json()["items"]  # type: ignore[no-any-return]


def assert_well_formed(log: list[dict[str, Any]]) -> None:
    """Seq is gapless from 1 and exactly one terminal event ends the run, as its last seq."""
    assert [e["seq"] for e in log] == list(range(1, len(log) + 1))
    terminals = [e for e in log if e["type"] in TERMINAL_TYPES]
    assert len(terminals) == 1, [e["type"] for e in log]
    assert terminals[0] is log[-1]


async def finished_log(client: AsyncClient, http: httpx.AsyncClient, run_id: str) -> list[dict[str, Any]]:
    """Follow the run to its end; its stored log, checked well formed."""
    await client.wait_for_run(run_id)
    log = await read_log(http, run_id)
    assert_well_formed(log)
    return log


async def effects(http: httpx.AsyncClient, **params: str) -> list[dict[str, Any]]:
    """What the demo shop really did: one row per real tool execution."""
    response = await http.get("/v1/demo/effects", params=params)
    assert response.status_code == 200, response.text
    return response.json()["items"]  # type: ignore[no-any-return]


async def interrupt_of(client: AsyncClient, run_id: str, after_seq: int = 0) -> dict[str, Any]:
    interrupt = await client.wait_for_interrupt(run_id, after_seq=after_seq)
    assert interrupt is not None, "the run ended without asking for review"
    return interrupt


async def assert_still_pending(client: AsyncClient, interrupt: dict[str, Any]) -> None:
    run = await client.get_run(interrupt["run_id"])
    assert run["status"] == "waiting_human"
    assert run["pending_interrupt"] is not None and run["pending_interrupt"]["id"] == interrupt["id"]
    assert run["pending_interrupt"]["status"] == "pending"
    thread = await client.get_thread(interrupt["thread_id"])
    assert thread["pending_interrupt"]["id"] == interrupt["id"]


def window_s(interrupt: dict[str, Any]) -> float:
    """How long an interrupt was open for a decision, by the server's stamps (to the millisecond)."""
    opened = datetime.fromisoformat(interrupt["created_at"].replace("Z", "+00:00"))
    closes = datetime.fromisoformat(interrupt["expires_at"].replace("Z", "+00:00"))
    return round((closes - opened).total_seconds(), 3)


def of_type(log: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in log if e["type"] == kind]


async def wait_until_terminal(client: AsyncClient, run_id: str, timeout: float = 10) -> dict[str, Any]:
    """Poll the run (no stream open) until it is terminal."""
    deadline = time.monotonic() + timeout
    while True:
        run = await client.get_run(run_id)
        if run["status"] in ("completed", "failed", "cancelled"):
            return run
        assert time.monotonic() < deadline, f"run still {run['status']}"
        await asyncio.sleep(0.05)


REFUND_THEN_WRAP_UP = (
    {"text": "I will refund it.", "tool_calls": [{"name": "refund", "args": {"order_id": "A1", "amount": 5}}]},
    {"text": "All settled."},
)


# -- the gate --------------------------------------------------------------------------------


async def test_a_refund_waits_for_approval_and_executes_once_after_it(client: AsyncClient, http: httpx.AsyncClient) -> None:
    run = await start(client, *REFUND_THEN_WRAP_UP)
    interrupt = await interrupt_of(client, run["id"])

    before = await read_log(http, run["id"])
    kinds = [e["type"] for e in before]
    assert "tool_result" not in kinds  # nothing executed, nothing reported as executed
    call = of_type(before, "tool_call")[0]["data"]
    assert call["name"] == "refund" and call["risk"] == "destructive" and call["gated"] is True
    assert kinds.index("tool_call") < kinds.index("interrupt") == len(kinds) - 1
    event = before[-1]["data"]
    assert event["interrupt_id"] == interrupt["id"]
    assert event["action_requests"] == interrupt["action_requests"]
    request = interrupt["action_requests"][0]
    assert request["call_id"] == call["call_id"] and request["action"] == "refund"
    assert request["args"] == {"order_id": "A1", "amount": 5}
    assert request["description"] == "Refund 5 on order A1"
    # allow_args: an approval may also allow this call with the same arguments for a while.
    assert interrupt["review_configs"] == [{"allowed_decisions": ["approve", "reject", "edit"], "allow_args": ["same"]}]
    assert interrupt["expires_at"] == event["expires_at"]
    await assert_still_pending(client, interrupt)
    await asyncio.sleep(0.2)
    assert await effects(http) == []  # waiting costs nothing and does nothing

    resumed = await client.approve(interrupt)
    assert resumed["id"] == run["id"] and resumed["pending_interrupt"] is None
    log = await finished_log(client, http, run["id"])
    after = log[len(before) :]
    assert [e["type"] for e in after if e["type"] != "status" and e["type"] != "token"] == ["resumed", "tool_result", "done"]
    assert after[0]["data"] == {
        "interrupt_id": interrupt["id"],
        "resolution": "decided",
        "decisions": [{"call_id": call["call_id"], "decision": "approve"}],
        "actor": "local",
    }
    result = of_type(log, "tool_result")[0]["data"]
    assert result["call_id"] == call["call_id"] and result["status"] == "ok"
    assert result["result"]["amount"] == 5 and result["result"]["status"] == "issued"
    assert (await client.get_run(run["id"]))["status"] == "completed"

    done = await effects(http, tool="refund")
    assert [(e["call_id"], e["args"]) for e in done] == [(call["call_id"], {"order_id": "A1", "amount": 5})]
    audit = await client.audit(run_id=run["id"])
    assert [(a["action"], a["decision"], a["outcome"]) for a in audit] == [("decision", "approve", "accepted"), ("tool_executed", None, "ok")]
    for entry in audit:
        assert (entry["interrupt_id"], entry["call_id"], entry["tool"], entry["thread_id"]) == (interrupt["id"], call["call_id"], "refund", run["thread_id"])
    assert audit[0]["actor"] == "local"
    assert audit[1]["args_digest"].startswith("sha256:")


async def test_a_hundred_concurrent_approvals_of_one_interrupt_execute_the_tool_once(client: AsyncClient, http: httpx.AsyncClient) -> None:
    run = await start(client, *REFUND_THEN_WRAP_UP)
    interrupt = await interrupt_of(client, run["id"])
    body = {"interrupt_id": interrupt["id"], "decisions": [{"decision": "approve"}]}
    url = f"/v1/threads/{run['thread_id']}/resume"
    limits = httpx.Limits(max_connections=100, max_keepalive_connections=100)
    async with httpx.AsyncClient(base_url=str(http.base_url), timeout=60, limits=limits) as racers:
        responses = await asyncio.gather(*(racers.post(url, json=body) for _ in range(100)))
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [200] + [409] * 99, statuses
    assert {r.json()["error"]["code"] for r in responses if r.status_code == 409} == {"interrupt_resolved"}

    log = await finished_log(client, http, run["id"])
    assert len(of_type(log, "resumed")) == 1
    assert [e["data"]["status"] for e in of_type(log, "tool_result")] == ["ok"]
    assert len(await effects(http, tool="refund")) == 1  # executions, not responses
    audit = await client.audit(run_id=run["id"])
    assert sorted(a["action"] for a in audit) == ["decision", "tool_executed"]


async def test_read_only_results_arrive_before_the_interrupt_and_each_decision_applies_to_its_own_call(
    shop: tuple[RecordingShop, LiveServer],
) -> None:
    recording, live = shop
    calls = [
        {"id": "call_refund", "name": "refund", "args": {"order_id": "A1", "amount": 500}},
        {"id": "call_lookup", "name": "get_order", "args": {"order_id": "A1"}},
        {"id": "call_email", "name": "send_email", "args": {"to": "bob@example.com", "subject": "Refund", "body": "We refunded 500."}},
    ]
    async with AsyncClient(live.url) as client, httpx.AsyncClient(base_url=live.url, timeout=30) as http:
        run = await start(client, {"text": "Three things.", "tool_calls": calls}, {"text": "Understood."})
        interrupt = await interrupt_of(client, run["id"])
        before = await read_log(http, run["id"])
        assert [(e["data"]["call_id"], e["data"]["gated"]) for e in of_type(before, "tool_call")] == [
            ("call_refund", True),
            ("call_lookup", False),
            ("call_email", True),
        ]
        # The read-only call ran at once; its result is in before the interrupt.
        assert [(e["data"]["call_id"], e["data"]["status"]) for e in of_type(before, "tool_result")] == [("call_lookup", "ok")]
        assert before[-1]["type"] == "interrupt"
        # One interrupt for both gated calls, in the model's order.
        assert [a["call_id"] for a in interrupt["action_requests"]] == ["call_refund", "call_email"]
        assert len(interrupt["review_configs"]) == 2
        with pytest.raises(APIError) as too_few:  # one decision per action, no fewer
            await client.resume(run["thread_id"], interrupt["id"], [{"decision": "approve"}])
        assert too_few.value.status == 422 and too_few.value.code == "decision_count_mismatch"
        assert too_few.value.details == [{"loc": ["body", "decisions"], "msg": "expected 2 items", "type": "length"}]
        await assert_still_pending(client, interrupt)

        await client.resume(run["thread_id"], interrupt["id"], [{"decision": "approve"}, {"decision": "reject", "reason": "too much"}])
        log = await finished_log(client, http, run["id"])
        results = {e["data"]["call_id"]: e["data"] for e in of_type(log, "tool_result")}
        assert results["call_refund"]["status"] == "ok"
        assert results["call_email"]["status"] == "rejected" and results["call_email"]["reason"] == "too much"
        assert [(e["tool"], e["call_id"]) for e in await effects(http)] == [("refund", "call_refund")]

        # The history holds one tool message per call, in the model's order ...
        path = await client.messages(run["thread_id"])
        tools = [m for m in path if m["role"] == "tool"]
        assert [m["tool_call_id"] for m in tools] == ["call_refund", "call_lookup", "call_email"]
        assert json.loads(tools[2]["content"]) == {"status": "rejected", "reason": "too much"}
        # ... and the model's next call was actually given the reason.
        assert len(recording.model.requests) == 2
        seen = [m for m in recording.model.requests[1] if m.role == "tool"]
        assert [m.tool_call_id for m in seen] == ["call_refund", "call_lookup", "call_email"]
        assert json.loads(seen[2].content) == {"status": "rejected", "reason": "too much"}
        assert json.loads(seen[0].content)["status"] == "issued"
        audit = await client.audit(run_id=run["id"])
        assert [(a["action"], a["call_id"], a["decision"], a["reason"]) for a in audit if a["action"] == "decision"] == [
            ("decision", "call_refund", "approve", None),
            ("decision", "call_email", "reject", "too much"),
        ]
        assert [(a["call_id"], a["outcome"]) for a in audit if a["action"] == "tool_executed"] == [("call_refund", "ok")]


async def test_an_invalid_edit_is_422_naming_the_field_and_a_valid_edit_runs_with_the_new_args(client: AsyncClient, http: httpx.AsyncClient) -> None:
    run = await start(client, *REFUND_THEN_WRAP_UP)
    interrupt = await interrupt_of(client, run["id"])

    with pytest.raises(APIError) as refused:
        await client.edit(interrupt, {"order_id": "A1", "amount": -5})
    assert refused.value.status == 422 and refused.value.code == "invalid_edited_args"
    assert [d["loc"] for d in refused.value.details] == [["body", "decisions", 0, "args", "amount"]]
    await assert_still_pending(client, interrupt)
    with pytest.raises(APIError) as unknown_field:
        await client.edit(interrupt, {"order_id": "A1", "amount": 3, "currency": "EUR"})
    assert unknown_field.value.status == 422
    assert [d["loc"][-1] for d in unknown_field.value.details] == ["currency"]
    await assert_still_pending(client, interrupt)
    assert await effects(http) == []

    await client.edit(interrupt, {"order_id": "A1", "amount": 3})
    log = await finished_log(client, http, run["id"])
    resumed = of_type(log, "resumed")[0]["data"]
    assert resumed["decisions"][0]["decision"] == "edit" and resumed["decisions"][0]["args"] == {"order_id": "A1", "amount": 3}
    result = of_type(log, "tool_result")[0]["data"]
    assert result["status"] == "ok" and result["result"]["amount"] == 3
    assert [e["args"] for e in await effects(http, tool="refund")] == [{"order_id": "A1", "amount": 3}]  # the tool got 3
    decision = [a for a in await client.audit(run_id=run["id"]) if a["action"] == "decision"]
    assert len(decision) == 1 and decision[0]["decision"] == "edit"
    assert decision[0]["details"] == {"original_args": {"order_id": "A1", "amount": 5}, "edited_args": {"order_id": "A1", "amount": 3}}


async def test_a_response_to_ask_user_becomes_its_result_and_the_tool_never_runs(shop: tuple[RecordingShop, LiveServer]) -> None:
    recording, live = shop
    ask = {"id": "call_ask", "name": "ask_user", "args": {"question": "Which colour?"}}
    async with AsyncClient(live.url) as client, httpx.AsyncClient(base_url=live.url, timeout=30) as http:
        run = await start(client, {"text": "Let me ask.", "tool_calls": [ask]}, {"text": "Blue it is."})
        interrupt = await interrupt_of(client, run["id"])
        assert interrupt["review_configs"] == [{"allowed_decisions": ["respond"]}]
        assert interrupt["action_requests"][0]["description"] == "Question for you: Which colour?"

        # Only `respond` is allowed: approving would run the tool, so it is refused.
        for decision in ({"decision": "approve"}, {"decision": "edit", "args": {"question": "Which size?"}}, {"decision": "reject"}):
            with pytest.raises(APIError) as refused:
                await client.resume(run["thread_id"], interrupt["id"], [decision])
            assert refused.value.status == 403 and refused.value.code == "decision_not_allowed"
            await assert_still_pending(client, interrupt)

        await client.respond(interrupt, "blue, please")
        log = await finished_log(client, http, run["id"])
        result = of_type(log, "tool_result")[0]["data"]
        assert (result["call_id"], result["status"], result["result"]) == ("call_ask", "responded", "blue, please")
        assert recording.asked == []  # the tool function never ran
        tool_messages = [m for m in await client.messages(run["thread_id"]) if m["role"] == "tool"]
        assert [m["content"] for m in tool_messages] == ["blue, please"]
        assert [m.content for m in recording.model.requests[1] if m.role == "tool"] == ["blue, please"]
        assert not [a for a in await client.audit(run_id=run["id"]) if a["action"] == "tool_executed"]


async def test_approve_on_a_tool_that_only_allows_respond_is_403_and_respond_on_a_refund_too(client: AsyncClient, http: httpx.AsyncClient) -> None:
    run = await start(client, *REFUND_THEN_WRAP_UP)
    interrupt = await interrupt_of(client, run["id"])
    with pytest.raises(APIError) as refused:
        await client.respond(interrupt, "pretend it happened")
    assert refused.value.status == 403 and refused.value.code == "decision_not_allowed"
    assert refused.value.details[0]["loc"] == ["body", "decisions", 0, "decision"]
    await assert_still_pending(client, interrupt)
    await client.approve(interrupt)
    await finished_log(client, http, run["id"])
    assert len(await effects(http, tool="refund")) == 1


async def test_wrong_counts_and_malformed_decisions_are_refused_and_leave_the_interrupt_pending(client: AsyncClient, http: httpx.AsyncClient) -> None:
    run = await start(client, *REFUND_THEN_WRAP_UP)
    interrupt = await interrupt_of(client, run["id"])
    url = f"/v1/threads/{run['thread_id']}/resume"
    iid = interrupt["id"]
    refused: list[tuple[dict[str, Any], int, str]] = [
        ({"interrupt_id": iid, "decisions": [{"decision": "approve"}, {"decision": "approve"}]}, 422, "decision_count_mismatch"),
        ({"interrupt_id": iid, "decisions": []}, 422, "validation_error"),
        ({"interrupt_id": iid, "decisions": [{"decision": "maybe"}]}, 422, "validation_error"),
        ({"interrupt_id": iid, "decisions": [{}]}, 422, "validation_error"),
        ({"interrupt_id": iid, "decisions": [{"decision": "edit"}]}, 422, "validation_error"),
        ({"interrupt_id": iid, "decisions": [{"decision": "edit", "args": [1, 2]}]}, 422, "validation_error"),
        ({"interrupt_id": iid, "decisions": [{"decision": "respond", "message": ""}]}, 422, "validation_error"),
        ({"interrupt_id": iid, "decisions": [{"decision": "approve", "args": {"amount": 1}}]}, 422, "validation_error"),
        ({"interrupt_id": iid, "decisions": [{"decision": "reject", "reason": 42}]}, 422, "validation_error"),
        ({"interrupt_id": iid, "decisions": {"decision": "approve"}}, 422, "validation_error"),
        ({"interrupt_id": iid, "decisions": ["approve"]}, 422, "validation_error"),
        ({"decisions": [{"decision": "approve"}]}, 422, "validation_error"),
        ({"interrupt_id": iid}, 422, "validation_error"),
        ({"interrupt_id": "int_nope", "decisions": [{"decision": "approve"}]}, 404, "interrupt_not_found"),
    ]
    for body, status, code in refused:
        response = await http.post(url, json=body)
        assert (response.status_code, response.json()["error"]["code"]) == (status, code), (body, response.text)
        await assert_still_pending(client, interrupt)
    for raw in (b"", b"{", b"null", b"[]"):
        response = await http.post(url, content=raw, headers={"Content-Type": "application/json"})
        assert 400 <= response.status_code < 500, (raw, response.text)
        await assert_still_pending(client, interrupt)
    # The interrupt belongs to its own thread only.
    other = await client.create_thread()
    response = await http.post(f"/v1/threads/{other['id']}/resume", json={"interrupt_id": iid, "decisions": [{"decision": "approve"}]})
    assert response.status_code == 404
    await assert_still_pending(client, interrupt)
    assert await effects(http) == []
    assert await client.audit(run_id=run["id"]) == []  # refused decisions are not decisions

    await client.approve(interrupt)  # a valid decision still works
    log = await finished_log(client, http, run["id"])
    assert [e["data"]["status"] for e in of_type(log, "tool_result")] == ["ok"]
    assert len(await effects(http, tool="refund")) == 1


async def test_several_interrupts_in_one_run_are_each_handled_on_their_own(client: AsyncClient, http: httpx.AsyncClient) -> None:
    run = await start(
        client,
        {"text": "First the refund.", "tool_calls": [{"id": "call_1", "name": "refund", "args": {"order_id": "A1", "amount": 5}}]},
        {
            "text": "Now the email.",
            "tool_calls": [{"id": "call_2", "name": "send_email", "args": {"to": "bob@example.com", "subject": "Hi", "body": "Refunded."}}],
        },
        {"text": "Done with both."},
    )
    first = await interrupt_of(client, run["id"])
    assert [a["call_id"] for a in first["action_requests"]] == ["call_1"]
    first_seq = len(await read_log(http, run["id"]))
    await client.approve(first)

    second = await interrupt_of(client, run["id"], after_seq=first_seq)
    assert second["id"] != first["id"]
    assert [a["call_id"] for a in second["action_requests"]] == ["call_2"]
    await assert_still_pending(client, second)
    # The first interrupt is settled for good: deciding it again changes nothing.
    with pytest.raises(APIError) as again:
        await client.approve(first)
    assert again.value.status == 409 and again.value.code == "interrupt_resolved"
    await assert_still_pending(client, second)
    assert [e["call_id"] for e in await effects(http)] == ["call_1"]

    await client.reject(second, "not today")
    log = await finished_log(client, http, run["id"])
    assert [e["data"]["interrupt_id"] for e in of_type(log, "interrupt")] == [first["id"], second["id"]]
    assert [(e["data"]["interrupt_id"], e["data"]["resolution"]) for e in of_type(log, "resumed")] == [
        (first["id"], "decided"),
        (second["id"], "decided"),
    ]
    assert [(e["data"]["call_id"], e["data"]["status"]) for e in of_type(log, "tool_result")] == [("call_1", "ok"), ("call_2", "rejected")]
    assert log[-1]["type"] == "done"
    assert [e["call_id"] for e in await effects(http)] == ["call_1"]
    assert (await client.get_run(run["id"]))["status"] == "completed"


async def test_invalid_args_from_the_model_become_an_error_result_and_no_interrupt(client: AsyncClient, http: httpx.AsyncClient) -> None:
    run = await start(
        client,
        {"text": "Refund.", "tool_calls": [{"id": "call_bad", "name": "refund", "args": {"order_id": "A1", "amount": "abc"}}]},
        {"text": "That did not work."},
    )
    log = await finished_log(client, http, run["id"])
    assert "interrupt" not in [e["type"] for e in log]
    result = of_type(log, "tool_result")[0]["data"]
    assert result["call_id"] == "call_bad" and result["status"] == "error" and "amount" in result["error"]
    assert log[-1]["type"] == "done"
    assert await effects(http) == []

    # Next to a valid gated call, only the valid one is put up for review.
    run = await start(
        client,
        {
            "text": "Two refunds.",
            "tool_calls": [
                {"id": "call_bad", "name": "refund", "args": {"order_id": "A1", "amount": "abc"}},
                {"id": "call_good", "name": "refund", "args": {"order_id": "A2", "amount": 7}},
            ],
        },
        {"text": "One of them went through."},
    )
    interrupt = await interrupt_of(client, run["id"])
    assert [a["call_id"] for a in interrupt["action_requests"]] == ["call_good"]
    await client.approve(interrupt)
    log = await finished_log(client, http, run["id"])
    assert [(e["data"]["call_id"], e["data"]["status"]) for e in of_type(log, "tool_result")] == [("call_bad", "error"), ("call_good", "ok")]
    assert [e["args"] for e in await effects(http)] == [{"order_id": "A2", "amount": 7}]


# -- expiry and cancel -----------------------------------------------------------------------


async def test_an_unanswered_interrupt_expires_with_no_client_and_a_late_approval_gets_410(client: AsyncClient, http: httpx.AsyncClient) -> None:
    run = await start(client, *REFUND_THEN_WRAP_UP, config={"approval_ttl_s": 1})
    # No stream is open: the server alone has to notice the deadline.
    deadline = time.monotonic() + 5
    while (interrupt := (await client.get_run(run["id"]))["pending_interrupt"]) is None:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    # The window is the server's own (its stamps), whenever this client happened to look.
    assert window_s(interrupt) == 1.0 and interrupt["expires_in_s"] <= 1
    finished = await wait_until_terminal(client, run["id"])
    assert finished["status"] == "completed" and finished["pending_interrupt"] is None

    log = await read_log(http, run["id"])
    assert_well_formed(log)
    resumed = of_type(log, "resumed")
    assert len(resumed) == 1 and resumed[0]["data"]["resolution"] == "expired"
    result = of_type(log, "tool_result")[0]["data"]
    assert result["status"] == "expired" and result["reason"]
    assert log[-1]["type"] == "done"
    tool_messages = [m for m in await client.messages(run["thread_id"]) if m["role"] == "tool"]
    assert json.loads(tool_messages[0]["content"])["status"] == "expired"  # the model was told

    with pytest.raises(APIError) as late:
        await client.approve(interrupt)
    assert late.value.status == 410 and late.value.code == "interrupt_expired"
    await asyncio.sleep(0.2)
    assert await effects(http) == []  # an old approval can never execute anything
    assert len(await read_log(http, run["id"])) == len(log)
    audit = await client.audit(run_id=run["id"])
    assert [(a["action"], a["actor"], a["outcome"]) for a in audit] == [("expired", "system", "not_executed")]


async def test_cancelling_a_waiting_run_cancels_its_interrupt_and_nothing_executes(client: AsyncClient, http: httpx.AsyncClient) -> None:
    run = await start(client, *REFUND_THEN_WRAP_UP)
    interrupt = await interrupt_of(client, run["id"])
    cancelled = await client.cancel(run["id"], reason="changed my mind")
    assert cancelled["status"] == "cancelled" and cancelled["pending_interrupt"] is None
    log = await finished_log(client, http, run["id"])
    assert log[-1]["type"] == "cancelled" and log[-1]["data"]["reason"] == "changed my mind"
    assert [e["data"]["status"] for e in of_type(log, "tool_result")] == ["cancelled"]
    thread = await client.get_thread(run["thread_id"])
    assert thread["pending_interrupt"] is None and thread["active_run_id"] is None

    for decide in (client.approve(interrupt), client.reject(interrupt, "late")):
        with pytest.raises(APIError) as late:
            await decide
        assert late.value.status in (409, 410)
    await asyncio.sleep(0.2)
    assert await effects(http) == []
    assert len(await read_log(http, run["id"])) == len(log)
    assert [a["action"] for a in await client.audit(run_id=run["id"])] == ["cancel"]


async def test_approve_racing_cancel_either_executes_before_the_cancel_or_not_at_all(client: AsyncClient, http: httpx.AsyncClient) -> None:
    for attempt in range(40):
        run = await start(client, *REFUND_THEN_WRAP_UP)
        interrupt = await interrupt_of(client, run["id"])
        url = f"/v1/threads/{run['thread_id']}/resume"
        body = {"interrupt_id": interrupt["id"], "decisions": [{"decision": "approve"}]}

        async def cancel_after(delay: float, run_id: str) -> httpx.Response:
            await asyncio.sleep(delay)
            return await http.post(f"/v1/runs/{run_id}/cancel", json={"mode": "soft"})

        # Sweep the cancel across the approval's writes, 0.2 ms further each attempt.
        approve, cancel = await asyncio.gather(http.post(url, json=body), cancel_after(0.0002 * attempt, run["id"]))
        assert approve.status_code in (200, 409), approve.text
        log = await finished_log(client, http, run["id"])
        final = await client.get_run(run["id"])
        executed = await effects(http, run_id=run["id"])
        results = of_type(log, "tool_result")
        assert len(results) == 1, [e["type"] for e in log]  # one answer for the one call
        if cancel.status_code == 202:
            assert final["status"] == "cancelled"
        else:
            assert cancel.status_code == 409 and final["status"] == "completed"
        if approve.status_code == 409:
            assert executed == [] and results[0]["data"]["status"] == "cancelled"
        else:
            # Approved first: the refund ran (a soft cancel lets it finish) or the cancel
            # stopped it before it started; never after the run ended.
            assert len(executed) == (results[0]["data"]["status"] == "ok")
        # Whatever happened, the stored history answers the call exactly once.
        tool_messages = [m for m in await client.messages(run["thread_id"]) if m["role"] == "tool"]
        assert [m["tool_call_id"] for m in tool_messages] == [results[0]["data"]["call_id"]]


async def test_a_tools_own_approval_ttl_sets_the_deadline_unless_the_run_config_overrides_it(
    shop: tuple[RecordingShop, LiveServer],
) -> None:
    recording, live = shop
    close = ({"text": "Closing.", "tool_calls": [{"name": "close_account", "args": {"customer": "bob"}}]}, {"text": "Ok."})
    async with AsyncClient(live.url) as client, httpx.AsyncClient(base_url=live.url, timeout=30) as http:
        run = await start(client, *close)
        interrupt = await interrupt_of(client, run["id"])
        assert window_s(interrupt) == 0.5 and interrupt["expires_in_s"] <= 0.5
        finished = await wait_until_terminal(client, run["id"])
        assert finished["status"] == "completed"
        log = await read_log(http, run["id"])
        assert_well_formed(log)
        assert [e["data"]["status"] for e in of_type(log, "tool_result")] == ["expired"]

        run = await start(client, *close, config={"approval_ttl_s": 30})
        interrupt = await interrupt_of(client, run["id"])
        assert window_s(interrupt) == 30.0 and 0 < interrupt["expires_in_s"] <= 30
        await asyncio.sleep(0.7)  # past the tool's own deadline
        await assert_still_pending(client, interrupt)
        await client.approve(interrupt)
        await finished_log(client, http, run["id"])
        assert recording.closed == ["bob"]  # once, for the approved run only


# -- the threshold ---------------------------------------------------------------------------


async def test_approval_threshold_reversible_gates_write_note_and_the_default_does_not(client: AsyncClient, http: httpx.AsyncClient) -> None:
    note = ({"text": "Noting.", "tool_calls": [{"id": "call_note", "name": "write_note", "args": {"text": "remember the milk"}}]}, {"text": "Noted."})
    run = await start(client, *note)
    log = await finished_log(client, http, run["id"])
    assert "interrupt" not in [e["type"] for e in log]
    assert of_type(log, "tool_call")[0]["data"]["gated"] is False
    assert of_type(log, "tool_call")[0]["data"]["risk"] == "reversible"
    assert [e["run_id"] for e in await effects(http, tool="write_note")] == [run["id"]]

    gated = await start(client, *note, config={"approval_threshold": "reversible"})
    interrupt = await interrupt_of(client, gated["id"])
    assert interrupt["action_requests"][0]["action"] == "write_note"
    assert of_type(await read_log(http, gated["id"]), "tool_call")[0]["data"]["gated"] is True
    assert await effects(http, run_id=gated["id"]) == []
    await client.approve(interrupt)
    await finished_log(client, http, gated["id"])
    assert len(await effects(http, run_id=gated["id"])) == 1


# -- sensitive arguments ---------------------------------------------------------------------

CARD = "4929123456781234"


def escaped(text: str) -> str:
    """``text`` with every character of the card number as a JSON ``\\u`` escape.

    The scripted model reads the card number from the user's (script) message; escaped, the
    digits are not in that message's stored text, so any occurrence of them anywhere else can
    only come from the server handling the tool call.
    """
    return text.replace(CARD, "".join(f"\\u{ord(c):04x}" for c in CARD))


async def start_escaped(client: AsyncClient, *steps: dict[str, Any]) -> dict[str, Any]:
    """Like :func:`start`, with the card number written as escapes in the user's message."""
    thread = await client.create_thread()
    return await client.start_run(thread["id"], escaped(script(*steps)))


class VerboseServerProcess(ServerProcess):
    """``tether demo`` in a child process logging at ``info`` (access log included)."""

    def start(self) -> ServerProcess:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tether.cli", "demo", "--port", str(self.port), "--db", self.db_url, "--log-level", "info"],
                stdout=log,
                stderr=log,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log_path.read_text()
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise RuntimeError("server process did not become healthy")


@pytest.fixture
def process(tmp_path: Path) -> Iterator[ServerProcess]:
    child = VerboseServerProcess(sqlite_url(tmp_path), tmp_path / "server.log")
    try:
        yield child.start()
    finally:
        child.stop()


async def test_a_sensitive_card_number_reaches_the_tool_and_nothing_else(process: ServerProcess) -> None:
    calls = [
        {"id": "call_charge", "name": "charge_card", "args": {"card_number": CARD, "amount": 10}},
        {"id": "call_other", "name": "charge_card", "args": {"card_number": CARD, "amount": 20}},
    ]
    content = escaped(script({"text": "Charging your card.", "tool_calls": calls}, {"text": "Charged."}))
    assert CARD not in content and json.loads(content)["script"][0]["tool_calls"][0]["args"]["card_number"] == CARD
    seen: list[bytes] = []
    async with httpx.AsyncClient(base_url=process.url, timeout=30) as http, AsyncClient(process.url) as client:
        thread = await client.create_thread()

        async def follow_live(run_id: str) -> None:
            async with http.stream("GET", f"/v1/runs/{run_id}/events", headers=SSE) as response:
                async for chunk in response.aiter_raw():
                    seen.append(chunk)

        response = await http.post(f"/v1/threads/{thread['id']}/runs", json={"input": {"content": content}})
        seen.append(response.content)
        run_id = response.json()["id"]
        live = asyncio.create_task(follow_live(run_id))
        interrupt = await interrupt_of(client, run_id)
        assert [a["args"]["card_number"] for a in interrupt["action_requests"]] == ["****1234", "****1234"]
        assert interrupt["action_requests"][0]["description"] == "Charge 10 to card ****1234"
        for path in (f"/v1/runs/{run_id}", f"/v1/threads/{thread['id']}", "/v1/threads", f"/v1/runs/{run_id}/events"):
            seen.append((await http.get(path)).content)

        # An edit cannot change the card number ...
        url = f"/v1/threads/{thread['id']}/resume"
        changed = {"card_number": "5555444433331111", "amount": 10}
        response = await http.post(url, json={"interrupt_id": interrupt["id"], "decisions": [{"decision": "edit", "args": changed}, {"decision": "approve"}]})
        assert response.status_code == 422, response.text
        assert response.json()["error"]["code"] == "sensitive_arg_locked"
        assert response.json()["error"]["details"][0]["loc"] == ["body", "decisions", 0, "args", "card_number"]
        seen.append(response.content)
        await assert_still_pending(client, interrupt)
        # ... while sending the masked value back (as a reviewer's form would) keeps the real one.
        masked = {"card_number": "****1234", "amount": 7}
        response = await http.post(url, json={"interrupt_id": interrupt["id"], "decisions": [{"decision": "edit", "args": masked}, {"decision": "approve"}]})
        assert response.status_code == 200, response.text
        seen.append(response.content)
        await client.wait_for_run(run_id)
        await asyncio.wait_for(live, 10)

        log = await read_log(http, run_id)
        assert_well_formed(log)
        results = {e["data"]["call_id"]: e["data"] for e in of_type(log, "tool_result")}
        assert results["call_charge"]["status"] == "ok" and results["call_charge"]["result"] == {"charged": 7, "card": "****1234"}
        assert results["call_other"]["result"] == {"charged": 20, "card": "****1234"}
        # The tool got the real number: the mask of the mask would be "****", not "****1234".
        rows = await effects(http, tool="charge_card")
        assert [(r["call_id"], r["args"]) for r in rows] == [
            ("call_charge", {"card_number": "****1234", "amount": 7}),
            ("call_other", {"card_number": "****1234", "amount": 20}),
        ]
        audit = await client.audit(run_id=run_id)
        assert audit[0]["details"]["original_args"] == {"card_number": "****1234", "amount": 10}

        for path, params in (
            (f"/v1/runs/{run_id}/events", {"limit": "1000"}),
            (f"/v1/threads/{thread['id']}/messages", {"view": "path"}),
            (f"/v1/threads/{thread['id']}/messages", {"view": "tree"}),
            (f"/v1/runs/{run_id}", {}),
            (f"/v1/threads/{thread['id']}", {}),
            ("/v1/threads", {}),
            ("/v1/audit", {"run_id": run_id}),
            ("/v1/audit", {"thread_id": thread["id"]}),
            ("/v1/demo/effects", {}),
        ):
            response = await http.get(path, params=params)
            assert response.status_code == 200, (path, response.text)
            seen.append(response.content)
        seen.append((await http.get(f"/v1/runs/{run_id}/events", headers=SSE)).content)  # the replay

    everything = b"".join(seen)
    assert b"****1234" in everything and b"charge_card" in everything  # we looked at the right things
    assert b"event: interrupt" in everything and b"event: done" in everything
    server_log = process.log_path.read_bytes()
    assert b"/resume" in server_log  # the access log is on
    for needle in (CARD, CARD[:12], "5555444433331111"):
        assert needle.encode() not in everything
        assert needle.encode() not in server_log


async def test_sensitive_args_the_model_sent_as_json_text_are_masked_too(client: AsyncClient, http: httpx.AsyncClient) -> None:
    # A model may hand over its arguments as JSON text instead of an object; the runtime parses
    # them, so it must mask them as well, and text it cannot parse is shown to no one.
    as_text = json.dumps({"card_number": CARD, "amount": 10})
    unparsable = f'{{"card_number": "{CARD}", "amount": 1'
    run = await start_escaped(
        client,
        {
            "text": "Charging.",
            "tool_calls": [
                {"id": "call_text", "name": "charge_card", "args": as_text},
                {"id": "call_broken", "name": "charge_card", "args": unparsable},
            ],
        },
        {"text": "Charged."},
    )
    interrupt = await interrupt_of(client, run["id"])
    assert [a["call_id"] for a in interrupt["action_requests"]] == ["call_text"]
    assert interrupt["action_requests"][0]["args"] == {"card_number": "****1234", "amount": 10}
    await client.approve(interrupt)
    log = await finished_log(client, http, run["id"])
    calls = {e["data"]["call_id"]: e["data"] for e in of_type(log, "tool_call")}
    assert calls["call_text"]["args"] == {"card_number": "****1234", "amount": 10}
    results = {e["data"]["call_id"]: e["data"] for e in of_type(log, "tool_result")}
    assert results["call_text"]["result"] == {"charged": 10, "card": "****1234"}
    assert results["call_broken"]["status"] == "error"
    assert [r["args"] for r in await effects(http, tool="charge_card")] == [{"card_number": "****1234", "amount": 10}]
    everything = b"".join(
        [
            (await http.get(f"/v1/runs/{run['id']}/events", params={"limit": "1000"})).content,
            (await http.get(f"/v1/runs/{run['id']}/events", headers=SSE)).content,
            (await http.get(f"/v1/threads/{run['thread_id']}/messages", params={"view": "tree"})).content,
            (await http.get("/v1/audit", params={"run_id": run["id"]})).content,
        ]
    )
    assert CARD[:12].encode() not in everything
