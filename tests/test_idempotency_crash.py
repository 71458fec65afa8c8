"""``Idempotency-Key`` across a crash: the server process is SIGKILLed between claiming a key and
storing its answer (after the run was created, or before), on SQLite and PostgreSQL. The retry
on the next process is answered once the dead request's short lease lapses — never 409 for the
24 h the key is kept — with the run the first request started, never a second run."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from tether.store import Store
from tether.store._tables import idempotency_keys

from .conftest import ServerProcess, script

pytestmark = [pytest.mark.anyio, pytest.mark.xdist_group("heavy")]

#: A server whose keyed requests hang at one point until the process is killed: after the run
#: is created (the answer is never stored), or before anything is created.
_HANG = """
import asyncio, sys
from tether.store import Store

async def hang(*args, **kwargs):
    await asyncio.Event().wait()

setattr(Store, {method!r}, hang)
from tether.cli import main
main()
"""


def hanging(method: str) -> tuple[str, ...]:
    return ("-c", _HANG.format(method=method))


async def key_row(db_url: str) -> Any:
    store = await Store.open(db_url)
    try:
        async with store.connection() as conn:
            return (await conn.execute(sa.select(idempotency_keys))).first()
    finally:
        await store.aclose()


async def thread_runs(db_url: str, thread_id: str) -> list[str]:
    store = await Store.open(db_url)
    try:
        return [r.id for r in await store.list_runs(thread_id)]
    finally:
        await store.aclose()


async def until(check: Any, timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := await check()):
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.05)
    return value


@pytest.mark.parametrize(
    ("dies", "retry"),
    [("after_creating", "json"), ("after_creating", "stream"), ("before_creating", "json")],
)
async def test_a_retry_after_the_server_died_mid_request_gets_the_first_run_never_409_never_a_second_run(
    db_url: str, tmp_path: Path, dies: str, retry: str
) -> None:
    hang_at = "keep_idempotent_answer" if dies == "after_creating" else "create_run"
    first = ServerProcess(db_url, tmp_path / "first.log", python_args=hanging(hang_at)).start()
    second: ServerProcess | None = None
    headers = {"Idempotency-Key": '"crash-1"'}
    body = {"input": {"content": script({"text": "hello after a crash"})}}
    try:
        async with httpx.AsyncClient(timeout=60) as http:
            thread = (await http.post(first.url + "/v1/threads", json={})).json()["id"]
            path = f"/v1/threads/{thread}/runs"
            held = asyncio.create_task(http.post(first.url + path, json=body, headers=headers))

            async def claimed() -> Any:
                row = await key_row(db_url)
                # after_creating: the run is recorded on the key, in the transaction that created it.
                return row if row is not None and (dies == "before_creating" or row.resource) else None

            row = await until(claimed)
            assert row.state == "in_flight" and not held.done()
            first.kill()  # between the claim and the answer
            with pytest.raises(httpx.TransportError):
                await held
            created = row.resource
            assert (created is not None) == (dies == "after_creating")
            assert await thread_runs(db_url, thread) == ([created] if created else [])

            second = ServerProcess(db_url, tmp_path / "second.log").start()
            # Its lease is seconds (renewed until the kill), not the key's day: once the stored
            # lease lapsed, the key is free.
            lapses = (await key_row(db_url)).lease_expires_at
            assert (lapses - row.created_at).total_seconds() < 60
            while datetime.now(UTC) < lapses:  # a stored stamp, not an event to wait on
                await asyncio.sleep(0.05)
            retry_headers = {**headers, "Accept": "text/event-stream"} if retry == "stream" else headers
            answers = [await http.post(second.url + path, json=body, headers=retry_headers) for _ in range(2)]
            for answer in answers:  # the first retry, and one after it: the same answer
                if retry == "stream":
                    assert answer.status_code == 200, answer.text
                    events = [json.loads(line[5:]) for line in answer.text.splitlines() if line.startswith("data:")]
                    assert {e["run_id"] for e in events} == {created} and events[0]["seq"] == 1
                    assert events[-1]["type"] == "done"
                    continue
                assert answer.status_code == 202, answer.text
                run_id = answer.json()["id"]
                assert answer.headers["x-run-id"] == run_id and answer.headers["location"] == f"/v1/runs/{run_id}"
                if created:
                    assert run_id == created and answer.headers["idempotent-replayed"] == "true"
                created = run_id
            assert await thread_runs(db_url, thread) == [created]  # one run, never a second

            async def finished() -> bool:
                run = (await http.get(f"{second.url}/v1/runs/{created}")).json()
                return bool(run["status"] == "completed")

            await until(finished, timeout=60)
    finally:
        first.stop()
        if second is not None:
            second.stop()
