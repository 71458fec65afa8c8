"""Pending reviews across a crash: a run waiting for a human lives in the store.

The server runs as a child process (``tether demo``) that the test SIGKILLs while a run waits
for review, so no shutdown code runs. The started server must show the same pending interrupt
(with how long it has waited), accept exactly one decision and execute the tool once; an
interrupt that fell due while no server was running expires as soon as one starts, and a late
approval of it executes nothing.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from tether.client import APIError, AsyncClient
from tether.events import TERMINAL_TYPES

from .conftest import ServerProcess, script, start_server

pytestmark = pytest.mark.anyio

LOOKUP_AND_REFUND = script(
    {
        "text": "Checking, then refunding.",
        "tool_calls": [
            {"id": "call_lookup", "name": "get_order", "args": {"order_id": "A1"}},
            {"id": "call_refund", "name": "refund", "args": {"order_id": "A1", "amount": 5}},
        ],
    },
    {"text": "All settled."},
)


async def read_log(http: httpx.AsyncClient, run_id: str) -> list[dict[str, Any]]:
    response = await http.get(f"/v1/runs/{run_id}/events", params={"limit": 1000})
    assert response.status_code == 200, response.text
    log: list[dict[str, Any]] = response.json()["items"]
    assert [e["seq"] for e in log] == list(range(1, len(log) + 1))
    return log


def assert_ends_once(log: list[dict[str, Any]]) -> None:
    terminals = [e for e in log if e["type"] in TERMINAL_TYPES]
    assert len(terminals) == 1 and terminals[0] is log[-1], [e["type"] for e in log]


async def effects(http: httpx.AsyncClient, run_id: str) -> list[dict[str, Any]]:
    response = await http.get("/v1/demo/effects", params={"run_id": run_id})
    assert response.status_code == 200, response.text
    return response.json()["items"]  # type: ignore[no-any-return]


def parse_ts(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


async def test_a_pending_interrupt_survives_a_kill_and_is_approved_exactly_once_after_restart(processes: list[ServerProcess], tmp_path: Path) -> None:
    first = start_server(processes, tmp_path)
    async with AsyncClient(first.url) as client:
        thread = await client.create_thread()
        run = await client.start_run(thread["id"], LOOKUP_AND_REFUND)
        interrupt = await client.wait_for_interrupt(run["id"])
        assert interrupt is not None
        seq_before = (await client.events(run["id"]))[-1].seq
    await asyncio.sleep(0.3)  # let it wait a little, so the wait is visible
    first.kill()

    second = start_server(processes, tmp_path)
    async with AsyncClient(second.url) as client, httpx.AsyncClient(base_url=second.url, timeout=30) as http:
        # Still pending, and visible where a reloaded page looks: the thread and the run.
        shown = await client.get_thread(thread["id"])
        assert shown["active_run_id"] == run["id"]
        pending = shown["pending_interrupt"]
        assert pending["id"] == interrupt["id"] and pending["status"] == "pending"
        assert pending["action_requests"] == interrupt["action_requests"]
        assert pending["expires_at"] == interrupt["expires_at"]
        assert pending["waited_s"] >= 0.3 and pending["waited_s"] > interrupt["waited_s"]
        after_restart = await client.get_run(run["id"])
        assert after_restart["status"] == "waiting_human"
        assert after_restart["pending_interrupt"]["id"] == interrupt["id"]
        assert after_restart["pending_interrupt"]["expires_at"] == interrupt["expires_at"]
        assert after_restart["pending_interrupt"]["waited_s"] >= pending["waited_s"]
        log = await read_log(http, run["id"])
        assert len(log) == seq_before and log[-1]["type"] == "interrupt"  # recovery left it alone
        assert await effects(http, run["id"]) == []

        approved = await client.approve(interrupt)
        assert approved["id"] == run["id"]
        with pytest.raises(APIError) as again:
            await client.approve(interrupt)
        assert again.value.status == 409
        finished = await client.wait_for_run(run["id"])
        assert finished["status"] == "completed" and finished["pending_interrupt"] is None

        log = await read_log(http, run["id"])
        assert_ends_once(log)
        assert [(e["data"]["call_id"], e["data"]["status"]) for e in log if e["type"] == "tool_result"] == [
            ("call_lookup", "ok"),
            ("call_refund", "ok"),
        ]
        assert [e["data"]["resolution"] for e in log if e["type"] == "resumed"] == ["decided"]
        assert [(e["tool"], e["call_id"]) for e in await effects(http, run["id"])] == [("refund", "call_refund")]
        # The read-only result obtained before the crash is kept, in the model's order.
        tools = [m for m in await client.messages(thread["id"]) if m["role"] == "tool"]
        assert [m["tool_call_id"] for m in tools] == ["call_lookup", "call_refund"]
        assert [a["action"] for a in await client.audit(run_id=run["id"])] == ["decision", "tool_executed"]


async def test_an_interrupt_that_fell_due_while_the_server_was_down_expires_on_start(processes: list[ServerProcess], tmp_path: Path) -> None:
    first = start_server(processes, tmp_path)
    async with AsyncClient(first.url) as client:
        thread = await client.create_thread()
        run = await client.start_run(thread["id"], LOOKUP_AND_REFUND, config={"approval_ttl_s": 1.5})
        interrupt = await client.wait_for_interrupt(run["id"])
        assert interrupt is not None
    first.kill()
    killed_at = datetime.now(UTC)
    expires_at = parse_ts(interrupt["expires_at"])
    assert killed_at < expires_at, "the server was killed too late for this test to mean anything"
    await asyncio.sleep((expires_at - killed_at).total_seconds() + 0.2)

    second = start_server(processes, tmp_path)
    async with AsyncClient(second.url) as client, httpx.AsyncClient(base_url=second.url, timeout=30) as http:
        deadline = time.monotonic() + 3
        while (current := await client.get_run(run["id"]))["status"] not in ("completed", "failed", "cancelled"):
            assert time.monotonic() < deadline, f"still {current['status']} after the restart"
            await asyncio.sleep(0.05)
        assert current["status"] == "completed" and current["pending_interrupt"] is None
        assert (await client.get_thread(thread["id"]))["pending_interrupt"] is None

        log = await read_log(http, run["id"])
        assert_ends_once(log)
        resumed = [e for e in log if e["type"] == "resumed"]
        assert len(resumed) == 1 and resumed[0]["data"]["resolution"] == "expired"
        assert parse_ts(resumed[0]["ts"]) > killed_at  # expired by the new server, not the old one
        assert [(e["data"]["call_id"], e["data"]["status"]) for e in log if e["type"] == "tool_result"] == [
            ("call_lookup", "ok"),
            ("call_refund", "expired"),
        ]
        assert log[-1]["type"] == "done"

        with pytest.raises(APIError) as late:
            await client.approve(interrupt)
        assert late.value.status == 410 and late.value.code == "interrupt_expired"
        await asyncio.sleep(0.2)
        assert await effects(http, run["id"]) == []
        assert len(await read_log(http, run["id"])) == len(log)
        audit = await client.audit(run_id=run["id"])
        assert [(a["action"], a["call_id"], a["outcome"]) for a in audit] == [("expired", "call_refund", "not_executed")]
