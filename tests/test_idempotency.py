"""``Idempotency-Key``: racing retries start one run, a changed body is refused, a retry after
the run ended replays the first answer; across two PostgreSQL processes too."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tether.store import Store

from .conftest import LiveServer, ServerProcess, script

pytestmark = pytest.mark.anyio


def start_body(text: str = "hello") -> dict[str, Any]:
    return {"input": {"content": script({"text": text})}}


async def runs_of(db_url: str, thread_id: str) -> list[Any]:
    """The thread's runs as the database holds them."""
    store = await Store.open(db_url)
    try:
        return await store.list_runs(thread_id)
    finally:
        await store.aclose()


async def test_racing_retries_start_one_run_and_a_later_retry_replays_it(server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        thread = (await http.post("/v1/threads", json={})).json()
        url = f"/v1/threads/{thread['id']}/runs"
        headers = {"Idempotency-Key": '"start-1"'}
        answers = await asyncio.gather(*(http.post(url, json=start_body(), headers=headers) for _ in range(30)))
        ok = [a for a in answers if a.status_code == 202]
        busy = [a for a in answers if a.status_code == 409]
        assert len(ok) + len(busy) == 30 and ok, [a.text for a in answers]
        assert {a.json()["error"]["code"] for a in busy} <= {"idempotency_key_in_use"}
        run_ids = {a.json()["id"] for a in ok}
        assert len(run_ids) == 1
        (run_id,) = run_ids
        for _ in range(100):  # until the run has ended
            if (await http.get(f"/v1/runs/{run_id}")).json()["status"] == "completed":
                break
            await asyncio.sleep(0.05)
        again = await http.post(url, json=start_body(), headers=headers)
        assert again.status_code == 202 and again.json()["id"] == run_id
        assert again.headers["idempotent-replayed"] == "true" and again.headers["x-run-id"] == run_id
        assert [r.id for r in await runs_of(server.db_url, thread["id"])] == [run_id]
        # The same key with another body.
        changed = await http.post(url, json=start_body("something else"), headers=headers)
        assert changed.status_code == 422 and changed.json()["error"]["code"] == "idempotency_key_reused"
        # Scoped to the route: the same key creates a thread once.
        made = [await http.post("/v1/threads", json={}, headers=headers) for _ in range(2)]
        assert made[0].status_code in (200, 201), made[0].text
        assert made[1].status_code == made[0].status_code, made[1].text
        assert made[0].json()["id"] == made[1].json()["id"] != thread["id"]


async def test_malformed_keys_and_refused_requests_are_not_stored(server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        thread = (await http.post("/v1/threads", json={})).json()
        url = f"/v1/threads/{thread['id']}/runs"
        for bad in ("no-quotes", '""', '"' + "x" * 256 + '"', '"tab\there"'):
            answer = await http.post(url, json=start_body(), headers={"Idempotency-Key": bad})
            assert answer.status_code == 400 and answer.json()["error"]["code"] == "invalid_idempotency_key", bad
        headers = {"Idempotency-Key": '"k-2"'}
        refused = await http.post(url, json={"input": {}}, headers=headers)  # invalid: never stored
        assert refused.status_code == 422 and refused.json()["error"]["code"] != "idempotency_key_reused"
        started = await http.post(url, json=start_body(), headers=headers)
        assert started.status_code == 202, started.text


async def test_a_streamed_start_replays_the_same_runs_stream(server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        thread = (await http.post("/v1/threads", json={})).json()
        url = f"/v1/threads/{thread['id']}/runs"
        headers = {"Idempotency-Key": '"stream-1"', "Accept": "text/event-stream"}
        first = await http.post(url, json=start_body(), headers=headers)
        second = await http.post(url, json=start_body(), headers=headers)
        assert first.status_code == second.status_code == 200
        run_id = first.headers["x-run-id"]

        def events(text: str) -> list[dict[str, Any]]:
            return [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:")]

        assert [e["seq"] for e in events(second.text)] == [e["seq"] for e in events(first.text)]
        assert {e["run_id"] for e in events(second.text)} == {run_id}
        assert len(await runs_of(server.db_url, thread["id"])) == 1


async def test_fifty_racing_retries_across_two_postgres_processes_start_one_run(pg_db_url: str, tmp_path: Path) -> None:
    servers = [ServerProcess(pg_db_url, tmp_path / f"server-{i}.log").start() for i in range(2)]
    try:
        async with httpx.AsyncClient(timeout=60) as http:
            thread = (await http.post(servers[0].url + "/v1/threads", json={})).json()
            path = f"/v1/threads/{thread['id']}/runs"
            headers = {"Idempotency-Key": '"across-processes"'}
            answers = await asyncio.gather(*(http.post(servers[i % 2].url + path, json=start_body(), headers=headers) for i in range(50)))
            codes = {a.status_code for a in answers}
            assert codes <= {202, 409}, [a.text for a in answers if a.status_code not in (202, 409)]
            assert {a.json()["error"]["code"] for a in answers if a.status_code == 409} <= {"idempotency_key_in_use"}
            assert len({a.json()["id"] for a in answers if a.status_code == 202}) == 1
            assert len(await runs_of(pg_db_url, thread["id"])) == 1
    finally:
        for s in servers:
            s.stop()
