"""``Idempotency-Key``: racing retries start one run, a changed body is refused, a retry after
the run ended replays the first answer; across two PostgreSQL processes too."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from tether.demo import build_demo_agent
from tether.store import Store
from tether.store._tables import idempotency_keys

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
        for bad in ('""', '"' + "x" * 256 + '"', '"tab\there"', "x" * 256, "two words", 'half"quoted', "back\\slash"):
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


async def test_a_bare_key_is_the_same_key_as_its_quoted_form(server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        thread = (await http.post("/v1/threads", json={})).json()
        url = f"/v1/threads/{thread['id']}/runs"
        key = "3f2a9c1e-8b7d-4e6f-a5c4-1d2e3f4a5b6c"  # Stripe's convention: a UUID, unquoted
        bare = await http.post(url, json=start_body(), headers={"Idempotency-Key": key})
        assert bare.status_code == 202, bare.text
        quoted = await http.post(url, json=start_body(), headers={"Idempotency-Key": f'"{key}"'})
        assert quoted.status_code == 202 and quoted.json()["id"] == bare.json()["id"]
        assert quoted.headers["idempotent-replayed"] == "true"
        # Any visible ASCII but the quote and the backslash, as sent.
        odd = "order:A1/refund=1;v2"
        first = await http.post("/v1/threads", json={}, headers={"Idempotency-Key": odd})
        second = await http.post("/v1/threads", json={}, headers={"Idempotency-Key": f'"{odd}"'})
        assert first.status_code == second.status_code == 201 and first.json()["id"] == second.json()["id"]
        assert [r.id for r in await runs_of(server.db_url, thread["id"])] == [bare.json()["id"]]


async def expired_keys(db_url: str, count: int, *, live: int = 0) -> None:
    """``count`` keys past their retention and ``live`` keys within it, written as a day-old
    server would have left them."""
    store = await Store.open(db_url)
    now = datetime.now(UTC)
    rows = [
        {
            "principal": "local",
            "route": "/v1/threads",
            "key": f"{'old' if i < count else 'new'}-{i}",
            "body_hash": "0" * 64,
            "state": "done",
            "status_code": 201,
            "content_type": "application/json",
            "response": "{}",
            "created_at": now - timedelta(hours=25 if i < count else 1),
            "expires_at": now - timedelta(hours=1) if i < count else now + timedelta(hours=23),
        }
        for i in range(count + live)
    ]
    try:
        async with store.transaction() as conn:
            await conn.execute(idempotency_keys.insert(), rows)
    finally:
        await store.aclose()


async def keys_left(db_url: str) -> set[str]:
    store = await Store.open(db_url)
    try:
        async with store.connection() as conn:
            return {row.key for row in await conn.execute(sa.select(idempotency_keys.c.key))}
    finally:
        await store.aclose()


async def test_the_purge_deletes_expired_keys_in_bounded_batches(db_url: str) -> None:
    await expired_keys(db_url, 7, live=2)
    store = await Store.open(db_url)
    try:
        assert await store.purge_idempotency_keys(limit=3) == 3
        assert await store.purge_idempotency_keys(limit=3) == 3
        assert await store.purge_idempotency_keys(limit=3) == 1
        assert await store.purge_idempotency_keys(limit=3) == 0
    finally:
        await store.aclose()
    assert await keys_left(db_url) == {"new-7", "new-8"}


async def test_a_server_purges_expired_keys_on_its_own_without_a_request(db_url: str) -> None:
    await expired_keys(db_url, 1200, live=3)  # more than one batch
    server = LiveServer(build_demo_agent(), db_url).start()
    try:
        deadline = time.monotonic() + 20
        while len(await keys_left(db_url)) > 3:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        assert await keys_left(db_url) == {"new-1200", "new-1201", "new-1202"}
    finally:
        server.stop()
