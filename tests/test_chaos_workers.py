"""Chaos under ``--workers 3`` on PostgreSQL: a worker SIGKILLed every one to three seconds while
200 runs start with ``Idempotency-Key`` retries, approvals are decided, and a webhook receiver
fails one delivery in five.

What must hold at the end, read from the receiver and the database rather than from answers:

- exactly one thread and one run per key (a retry after a worker died under it finds what the
  first attempt created, or creates it once), and no key stuck in flight;
- every run completed, its refund executed once after its approval;
- every notification of a committed change (``interrupt.created``, ``interrupt.decided``,
  ``run.completed``) delivered at least once, under the one ``webhook-id`` its outbox row has,
  the receiver's first success for each thread in the order of the changes; none for a change
  that rolled back (one ``interrupt.decided`` per interrupt), and nothing the outbox never had.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import signal
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from .conftest import ServerProcess, script
from .test_webhooks import SECRET, Receiver

pytestmark = [pytest.mark.anyio, pytest.mark.xdist_group("heavy")]

RUNS = 200
CONCURRENCY = 16
REFUND = ({"text": "Refunding.", "tool_calls": [{"name": "refund", "args": {"order_id": "A1", "amount": 5}}]}, {"text": "Done."})
LIFTED = ("--max-active-runs", "100000", "--run-starts-per-minute", "100000", "--requests-per-minute", "1000000")


def workers_of(supervisor: int) -> list[int]:
    """The live worker processes of the supervisor ``supervisor``."""
    try:
        children = Path(f"/proc/{supervisor}/task/{supervisor}/children").read_text().split()
    except OSError:
        return []
    return [int(pid) for pid in children]


async def kill_workers(supervisor: int, rng: random.Random, stop: asyncio.Event, killed: list[int]) -> None:
    """SIGKILL a random worker every 1–3 s (the supervisor replaces it)."""
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), rng.uniform(1.0, 3.0))
            return
        except TimeoutError:
            pass
        workers = workers_of(supervisor)
        if workers:
            victim = rng.choice(workers)
            try:
                os.kill(victim, signal.SIGKILL)
                killed.append(victim)
            except ProcessLookupError:
                pass


async def keyed(
    http: httpx.AsyncClient, method: str, path: str, key: str, *, ok: tuple[int, ...], also: tuple[tuple[int, str], ...] = (), **kwargs: Any
) -> httpx.Response:
    """Send one request with ``Idempotency-Key: key`` until it gets an answer in ``ok`` (or one of
    ``also``: a status and error code a retry may get once an earlier attempt won), retrying the
    same key through dead workers, 5xx and ``idempotency_key_in_use``."""
    headers = {"Idempotency-Key": key, **kwargs.pop("headers", {})}
    for _ in range(600):
        try:
            response = await http.request(method, path, headers=headers, **kwargs)
        except httpx.TransportError:
            await asyncio.sleep(0.05)
            continue
        if response.status_code in ok:
            return response
        code = response.json().get("error", {}).get("code") if response.headers.get("content-type", "").startswith("application/json") else None
        if (response.status_code, code) in also:
            return response
        if response.status_code >= 500 or code == "idempotency_key_in_use":
            await asyncio.sleep(0.1)
            continue
        raise AssertionError(f"{method} {path}: {response.status_code} {response.text}")
    raise AssertionError(f"{method} {path} with key {key} never got an answer: the key is stuck")


async def status_of(http: httpx.AsyncClient, run_id: str, *wanted: str) -> dict[str, Any]:
    for _ in range(2000):
        try:
            response = await http.get(f"/v1/runs/{run_id}")
            if response.status_code == 200 and response.json()["status"] in wanted:
                return response.json()  # type: ignore[no-any-return]
        except httpx.TransportError:
            pass
        await asyncio.sleep(0.05)
    last = (await http.get(f"/v1/runs/{run_id}")).json()
    events = (await http.get(f"/v1/runs/{run_id}/events", params={"limit": 1000})).json()["items"]
    raise AssertionError(f"run {run_id} never reached {wanted}: {last} {[(e['seq'], e['type'], e['ts']) for e in events]}")


async def one_job(http: httpx.AsyncClient, n: int, done: dict[str, dict[str, Any]]) -> None:
    thread_key, run_key, decide_key = (str(uuid.uuid4()) for _ in range(3))
    thread = (await keyed(http, "POST", "/v1/threads", thread_key, ok=(200, 201), json={"metadata": {"job": n}})).json()
    body = {"input": {"content": script(*REFUND)}}
    run = (await keyed(http, "POST", f"/v1/threads/{thread['id']}/runs", run_key, ok=(200, 202), json=body)).json()
    again = (await keyed(http, "POST", f"/v1/threads/{thread['id']}/runs", run_key, ok=(200, 202), json=body)).json()
    assert again["id"] == run["id"], "a retry of the same key started another run"
    decided: set[str] = set()
    while True:
        current = await status_of(http, run["id"], "waiting_human", "completed", "failed", "cancelled")
        if current["status"] != "waiting_human":
            break
        interrupt = current["pending_interrupt"]
        if interrupt["id"] in decided:  # our decision is committing: wait for the run to move on
            await asyncio.sleep(0.05)
            continue
        # A worker killed while the approved refund ran: it comes back as outcome unknown, and a
        # person who cannot know whether it ran rejects it rather than pay twice.
        unknown = interrupt["action_requests"][0].get("outcome_unknown", False)
        verdict = {"decision": "reject", "reason": "it may have run"} if unknown else {"decision": "approve"}
        decision = {"interrupt_id": interrupt["id"], "decisions": [verdict]}
        await keyed(
            http,
            "POST",
            f"/v1/threads/{thread['id']}/resume",
            decide_key if not decided else str(uuid.uuid4()),
            ok=(200,),
            also=((409, "interrupt_resolved"),),
            json=decision,
        )
        decided.add(interrupt["id"])
    done[thread["id"]] = {"run": current, "keys": (thread_key, run_key, decide_key), "unknown": len(decided) > 1}


@pytest.mark.timeout(600)
async def test_workers_killed_at_random_lose_no_run_key_or_notification(pg_db_url: str, tmp_path: Path, processes: list[ServerProcess]) -> None:
    rng = random.Random(20261207)
    requests = itertools.count(1)
    lock = threading.Lock()
    first_success: dict[str, float] = {}

    def answer(webhook_id: str, attempt: int) -> tuple[int, dict[str, str], float]:
        with lock:
            if next(requests) % 5 == 0:
                return 500, {}, 0.0  # one delivery in five fails, and is retried
            first_success.setdefault(webhook_id, time.monotonic())
        return 200, {}, 0.0

    receiver = Receiver(answer).start()
    try:
        server = ServerProcess(
            pg_db_url,
            tmp_path / "server.log",
            extra_args=(
                "--workers",
                "3",
                "--lease-seconds",
                "1.5",
                "--drain-seconds",
                "0",
                "--webhook",
                receiver.url,
                "--webhook-allow-private",
                "--webhook-schedule",
                "0,0.2,0.5,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1",
                "--webhook-timeout-seconds",
                "2",
                "--webhook-lease-seconds",
                "3",
                *LIFTED,
            ),
            env={"TETHER_WEBHOOK_SECRET": SECRET},
        )
        processes.append(server)
        server.start()
        assert server.proc is not None
        stop = asyncio.Event()
        killed: list[int] = []
        monkey = asyncio.create_task(kill_workers(server.proc.pid, rng, stop, killed))
        done: dict[str, dict[str, Any]] = {}
        gate = asyncio.Semaphore(CONCURRENCY)
        try:
            async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:

                async def job(n: int) -> None:
                    async with gate:
                        await one_job(http, n, done)

                await asyncio.gather(*(job(n) for n in range(RUNS)))
        finally:
            stop.set()
            await monkey
        assert len(killed) >= 3, f"only {len(killed)} workers were killed: not much chaos"
        assert len(done) == RUNS and all(d["run"]["status"] == "completed" for d in done.values())

        conn = await asyncpg.connect(pg_db_url)
        try:
            threads = await conn.fetch("SELECT id FROM threads")
            runs_per_thread = await conn.fetch("SELECT thread_id, count(*) AS n FROM runs GROUP BY thread_id")
            stuck = await conn.fetchval("SELECT count(*) FROM idempotency_keys WHERE state <> 'done'")
            refunds = {r["run_id"]: r["n"] for r in await conn.fetch("SELECT run_id, count(*) AS n FROM demo_effects WHERE tool = 'refund' GROUP BY run_id")}

            async def outbox() -> list[asyncpg.Record]:
                return await conn.fetch(
                    "SELECT seq, id, event_type, thread_id, interrupt_id, status FROM webhook_outbox "
                    "WHERE event_type IN ('interrupt.created', 'interrupt.decided', 'run.completed') ORDER BY seq"
                )

            rows = await outbox()
            expected = {r["id"] for r in rows}
            deadline = time.monotonic() + 120
            while not expected <= set(first_success):
                assert time.monotonic() < deadline, f"{len(expected - set(first_success))} notifications never delivered"
                await asyncio.sleep(0.2)
            rows = await outbox()
        finally:
            await conn.close()
    finally:
        receiver.stop()

    # Exactly one thread and one run per key, nothing in flight for ever.
    assert {r["id"] for r in threads} == set(done)
    assert sorted(r["n"] for r in runs_per_thread) == [1] * RUNS
    assert stuck == 0
    # No refund ran twice; each ran once unless a worker died under it (then it may have, once).
    assert max(refunds.values()) == 1
    certain = [d["run"]["id"] for d in done.values() if not d["unknown"]]
    assert all(refunds.get(run_id) == 1 for run_id in certain)
    # Every committed change's notification arrived, under its outbox row's webhook-id.
    assert receiver.bad_signatures == 0
    received_ids = {r["id"] for r in receiver.received}
    assert received_ids <= {r["id"] for r in rows}, "the receiver got a notification the outbox never had"
    by_thread: dict[str, list[asyncpg.Record]] = {}
    for row in rows:
        by_thread.setdefault(row["thread_id"], []).append(row)
    assert set(by_thread) == set(done)
    for thread_id, changes in by_thread.items():
        kinds = [c["event_type"] for c in changes]
        assert kinds[-1] == "run.completed" and kinds[:-1] == ["interrupt.created", "interrupt.decided"] * (len(kinds) // 2), (thread_id, kinds)
        times = [first_success[c["id"]] for c in changes]
        assert times == sorted(times), f"thread {thread_id}: delivered out of order"
