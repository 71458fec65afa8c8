"""Several server processes on one PostgreSQL: any process serves any run.

Three real ``tether demo`` processes share a fresh PostgreSQL database. A run created through
one is streamed through another and cancelled through the third; a waiting run is resumed
through one process and streamed from another; racing resumes spread over all three execute
the tool once; a process killed mid-run loses the run to another process once its lease
lapses. Live events cross processes through LISTEN/NOTIFY.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tether.client import AsyncClient

from .conftest import ServerProcess, script

pytestmark = pytest.mark.anyio

LEASE_S = 1.5


@pytest.fixture
async def trio_of_servers(pg_db_url: str, tmp_path: Path) -> AsyncIterator[list[ServerProcess]]:
    servers = [ServerProcess(pg_db_url, tmp_path / f"server-{name}.log", extra_args=("--lease-seconds", str(LEASE_S))) for name in "abc"]
    try:
        # Started together, as a deployment would: they race to migrate the fresh database.
        await asyncio.gather(*(asyncio.to_thread(proc.start) for proc in servers))
        yield servers
    finally:
        for proc in servers:
            await asyncio.to_thread(proc.stop)


async def _log(client: AsyncClient, run_id: str) -> list[dict[str, Any]]:
    return [e.model_dump() for e in await client.events(run_id, after_seq=0, limit=1000)]


async def _stream_all(url: str, run_id: str) -> list[dict[str, Any]]:
    async with AsyncClient(url) as client:
        return [e.model_dump() async for e in client.follow(run_id)]


def _assert_gapless_with_one_terminal(log: list[dict[str, Any]]) -> None:
    assert [e["seq"] for e in log] == list(range(1, len(log) + 1))
    terminals = [e for e in log if e["type"] in ("done", "error", "cancelled")]
    assert len(terminals) == 1 and terminals[0] is log[-1]


async def test_a_run_created_on_one_process_streams_from_another_and_is_cancelled_from_a_third(
    trio_of_servers: list[ServerProcess],
) -> None:
    a, b, c = trio_of_servers
    async with AsyncClient(a.url) as on_a, AsyncClient(b.url) as on_b, AsyncClient(c.url) as on_c:
        thread = await on_a.create_thread()
        run = await on_a.start_run(thread["id"], script({"tokens": 3000, "delay_ms": 5}))
        received: list[dict[str, Any]] = []

        async def follow_on_b() -> None:
            async for event in on_b.follow(run["id"]):
                received.append(event.model_dump())

        follower = asyncio.create_task(follow_on_b())
        async with asyncio.timeout(20):
            while sum(1 for e in received if e["type"] == "token") < 20:
                await asyncio.sleep(0.02)
        response = await on_c.cancel(run["id"], mode="hard", reason="from process c")
        assert response["status"] in ("cancelling", "cancelled")
        async with asyncio.timeout(20):
            await follower
        final = await on_b.get_run(run["id"])
        assert final["status"] == "cancelled"
        log = await _log(on_a, run["id"])
        assert received == log  # process b relayed process a's run gaplessly, live
        _assert_gapless_with_one_terminal(log)
        assert log[-1]["type"] == "cancelled" and log[-1]["data"]["reason"] == "from process c"
        tokens = sum(1 for e in log if e["type"] == "token")
        assert tokens < 1500, "the executing process kept streaming after the cancel"


async def test_a_run_resumed_through_one_process_executes_once_and_streams_to_another(
    trio_of_servers: list[ServerProcess],
) -> None:
    a, b, c = trio_of_servers
    async with AsyncClient(a.url) as on_a, AsyncClient(c.url) as on_c:
        thread = await on_b_create(b)
        run = await on_a.start_run(thread, "refund 12 on order MP1")
        interrupt = await on_a.wait_for_interrupt(run["id"])
        assert interrupt is not None
        streamed = asyncio.create_task(_stream_all(a.url, run["id"]))
        await asyncio.sleep(0.2)
        await on_c.approve(interrupt)
        async with asyncio.timeout(20):
            events = await streamed
        assert events[-1]["type"] == "done"
        results = [e for e in events if e["type"] == "tool_result"]
        assert [r["data"]["status"] for r in results] == ["ok"]
        assert events == await _log(on_c, run["id"])
        effects = httpx.get(f"{b.url}/v1/demo/effects", params={"run_id": run["id"]}).json()["items"]
        assert [e["tool"] for e in effects] == ["refund"]


async def on_b_create(b: ServerProcess) -> str:
    async with AsyncClient(b.url) as on_b:
        return (await on_b.create_thread())["id"]


async def test_a_hundred_resumes_racing_over_three_processes_have_one_winner(trio_of_servers: list[ServerProcess]) -> None:
    servers = trio_of_servers
    async with AsyncClient(servers[0].url) as client:
        thread = await client.create_thread()
        run = await client.start_run(thread["id"], "refund 7 on order RACE")
        interrupt = await client.wait_for_interrupt(run["id"])
        assert interrupt is not None
    body = {"interrupt_id": interrupt["id"], "decisions": [{"decision": "approve"}]}
    clients = [httpx.AsyncClient(base_url=s.url, timeout=30) for s in servers]
    try:
        responses = await asyncio.gather(*(clients[i % 3].post(f"/v1/threads/{thread['id']}/resume", json=body) for i in range(100)))
    finally:
        for http in clients:
            await http.aclose()
    codes = sorted(r.status_code for r in responses)
    assert codes.count(200) == 1 and codes.count(409) == 99, codes
    async with AsyncClient(servers[1].url) as client:
        final = await client.wait_for_run(run["id"])
        assert final["status"] == "completed"
        log = await _log(client, run["id"])
    _assert_gapless_with_one_terminal(log)
    assert sum(1 for e in log if e["type"] == "resumed") == 1
    effects = httpx.get(f"{servers[2].url}/v1/demo/effects", params={"run_id": run["id"]}).json()["items"]
    assert len(effects) == 1


async def test_a_run_whose_process_is_killed_is_taken_over_after_its_lease_lapses(
    trio_of_servers: list[ServerProcess],
) -> None:
    a, b, _c = trio_of_servers
    async with AsyncClient(a.url) as on_a:
        thread = await on_a.create_thread()
        run = await on_a.start_run(thread["id"], script({"tokens": 300, "delay_ms": 5}))
        async with asyncio.timeout(20):
            while sum(1 for e in await _log(on_a, run["id"]) if e["type"] == "token") < 10:
                await asyncio.sleep(0.05)
    following = asyncio.create_task(_stream_all(b.url, run["id"]))
    await asyncio.sleep(0.2)
    await asyncio.to_thread(a.kill)
    async with asyncio.timeout(LEASE_S * 10 + 20):
        events = await following  # process b's follower sees the run finish without process a
    async with AsyncClient(b.url) as on_b:
        final = await on_b.get_run(run["id"])
        log = await _log(on_b, run["id"])
        path = await on_b.messages(thread["id"])
    assert final["status"] == "completed"
    assert events == log
    _assert_gapless_with_one_terminal(log)
    [recovering] = [e for e in log if e["type"] == "status" and e["data"]["stage"] == "recovering"]
    answer = [e["data"]["text"] for e in log[log.index(recovering) :] if e["type"] == "token"]
    assert "".join(answer) == "".join(f"t{n} " for n in range(1, 301))
    assert path[-1]["content"] == "".join(answer) and recovering["data"]["discard_message_id"] not in {m["id"] for m in path}
