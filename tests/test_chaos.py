"""Chaos: three processes on one PostgreSQL, runs of every kind, flaky clients, and processes
killed with SIGKILL and restarted at random moments.

Bounded (well under three minutes). At the end: every run is terminal; no run is stuck in
``running``; every client's event sequence is gapless and equals the stored log; and no
destructive tool executed twice or without an approval (executions are counted in the demo's
append-only effects table, approvals in the audit log).
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from .conftest import ServerProcess, script, whole_log

#: The suite's busiest tests (many processes, SIGKILLs, whole-API fuzzing) run one after another
#: in one pytest-xdist worker, so they never compete with each other for the machine's cores.
pytestmark = [pytest.mark.anyio, pytest.mark.xdist_group("heavy")]

LEASE_S = 1.5
TERMINAL = {"done", "error", "cancelled"}


class Cluster:
    """Three server processes; some may be down at any moment."""

    def __init__(self, servers: list[ServerProcess], rng: random.Random) -> None:
        self.servers = servers
        self.rng = rng
        self.down: set[int] = set()
        self.kills = 0

    def any_url(self) -> str:
        alive = [i for i in range(len(self.servers)) if i not in self.down]
        return self.servers[self.rng.choice(alive)].url

    async def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """Send to a random live process; retry on another when one dies under us."""
        for _ in range(200):
            try:
                async with httpx.AsyncClient(base_url=self.any_url(), timeout=10) as http:
                    return await http.request(method, path, **kwargs)
            except httpx.TransportError:
                await asyncio.sleep(0.05)
        raise AssertionError(f"no process answered {method} {path}")


@pytest.fixture
async def cluster(pg_db_url: str, tmp_path: Path) -> AsyncIterator[Cluster]:
    servers = [ServerProcess(pg_db_url, tmp_path / f"server-{i}.log", extra_args=("--lease-seconds", str(LEASE_S))) for i in range(3)]
    try:
        await asyncio.gather(*(asyncio.to_thread(s.start) for s in servers))
        yield Cluster(servers, random.Random(20261130))
    finally:
        for s in servers:
            await asyncio.to_thread(s.stop)


async def follow(cluster: Cluster, run_id: str, rng: random.Random) -> list[dict[str, Any]]:
    """A flaky client: reads the run's stream from random processes, drops the connection at
    random moments, and resumes from the last seq it saw."""
    seen: list[dict[str, Any]] = []
    while not seen or seen[-1]["type"] not in TERMINAL:
        budget = rng.randint(1, 60)  # events to read before dropping the connection
        try:
            async with httpx.AsyncClient(base_url=cluster.any_url(), timeout=httpx.Timeout(10, read=30)) as http:
                headers = {"Accept": "text/event-stream", "Last-Event-ID": str(seen[-1]["seq"] if seen else 0)}
                async with http.stream("GET", f"/v1/runs/{run_id}/events", headers=headers) as response:
                    assert response.status_code == 200
                    async for line in response.aiter_lines():
                        if not line.startswith("data: "):
                            continue
                        event = json.loads(line[len("data: ") :])
                        seen.append(event)
                        budget -= 1
                        if event["type"] in TERMINAL or budget <= 0:
                            break
        except (httpx.TransportError, httpx.RemoteProtocolError):
            pass
        await asyncio.sleep(rng.random() * 0.2)
    return seen


async def review(cluster: Cluster, runs: dict[str, dict[str, Any]], stop: asyncio.Event) -> None:
    """A reviewer: approves pending actions, but never approves re-running a call whose
    outcome is unknown (it rejects those)."""
    while not stop.is_set():
        for run_id, info in list(runs.items()):
            run = (await cluster.request("GET", f"/v1/runs/{run_id}")).json()
            pending = run.get("pending_interrupt")
            if run["status"] != "waiting_human" or not pending:
                continue
            decisions = [
                {"decision": "reject", "reason": "outcome unknown"} if request.get("outcome_unknown") else {"decision": "approve"}
                for request in pending["action_requests"]
            ]
            body = {"interrupt_id": pending["id"], "decisions": decisions}
            await cluster.request("POST", f"/v1/threads/{info['thread_id']}/resume", json=body)
        await asyncio.sleep(0.1)


async def executing_runs(server: ServerProcess) -> float:
    """How many runs ``server`` executes right now (its ``/metrics``); 0 if it does not answer."""
    try:
        async with httpx.AsyncClient(timeout=2) as http:
            text = (await http.get(f"{server.url}/metrics")).text
    except httpx.TransportError:
        return 0
    return next((float(line.split()[-1]) for line in text.splitlines() if line.startswith("tether_executing_runs ")), 0)


async def chaos_monkey(cluster: Cluster, rng: random.Random, rounds: int) -> None:
    """Kill a process with SIGKILL, then bring it back, a few times: one that is executing runs
    at that moment when there is one (so that kills find runs in flight), else a random one."""
    for _ in range(rounds):
        await asyncio.sleep(1.0 + rng.random() * 2.0)
        busy = [(await executing_runs(server), i) for i, server in enumerate(cluster.servers) if i not in cluster.down]
        most, busiest = max(busy)
        victim = busiest if most > 0 else rng.randrange(len(cluster.servers))
        if len(cluster.down) or victim in cluster.down:
            continue
        cluster.down.add(victim)
        await asyncio.to_thread(cluster.servers[victim].kill)
        cluster.kills += 1
        await asyncio.sleep(0.5 + rng.random())
        await asyncio.to_thread(cluster.servers[victim].start)
        cluster.down.discard(victim)


def content_for(kind: str, n: int) -> str:
    if kind == "stream":
        return script({"tokens": 300, "delay_ms": 10})
    if kind == "tools":
        return script(
            {"text": "looking", "tool_calls": [{"name": "get_order", "args": {"order_id": f"C{n}"}}, {"name": "sleep", "args": {"seconds": 0.3}}]},
            {"text": "found it"},
        )
    if kind == "refund":
        return f"refund {n + 1} on order R{n}"
    return script({"text": "purging", "tool_calls": [{"name": "purge_cache", "args": {"seconds": 0.6}}]}, {"text": "purged"})


async def test_runs_survive_killed_processes_and_flaky_clients(cluster: Cluster) -> None:
    rng = random.Random(7)
    kinds = ["stream", "tools", "refund", "purge"]
    runs: dict[str, dict[str, Any]] = {}
    followers: list[asyncio.Task[list[dict[str, Any]]]] = []
    stop_review = asyncio.Event()
    reviewer = asyncio.create_task(review(cluster, runs, stop_review))
    monkey = asyncio.create_task(chaos_monkey(cluster, random.Random(99), rounds=5))
    async with asyncio.timeout(150):
        # Runs start in a stream over several seconds, so kills find some of them in flight.
        for n in range(30):
            kind = kinds[n % len(kinds)]
            thread = (await cluster.request("POST", "/v1/threads", json={})).json()
            response = await cluster.request("POST", f"/v1/threads/{thread['id']}/runs", json={"input": {"content": content_for(kind, n)}})
            assert response.status_code == 202, response.text
            run_id = response.json()["id"]
            runs[run_id] = {"thread_id": thread["id"], "kind": kind}
            followers.append(asyncio.create_task(follow(cluster, run_id, random.Random(rng.random()))))
            await asyncio.sleep(0.3)
        streams = await asyncio.gather(*followers)
        await monkey
    stop_review.set()
    await reviewer

    effects = (await cluster.request("GET", "/v1/demo/effects")).json()["items"]
    taken_over = 0
    summary = []
    for (run_id, info), seen in zip(runs.items(), streams, strict=True):
        run = (await cluster.request("GET", f"/v1/runs/{run_id}")).json()
        assert run["status"] in ("completed", "failed", "cancelled"), (run_id, info, run["status"])
        log = await whole_log(cluster, run_id)
        assert [e["seq"] for e in log] == list(range(1, len(log) + 1)), run_id
        assert [e["type"] for e in log if e["type"] in TERMINAL] == [log[-1]["type"]], run_id
        assert seen == log, f"client of {run_id} saw a different sequence"
        taken_over += any(e["type"] == "status" and e["data"]["stage"] == "recovering" for e in log)
        summary.append((info["kind"], run["status"], (run["error"] or {}).get("code"), len(log)))
        tool_calls = [e["data"]["call_id"] for e in log if e["type"] == "tool_call"]
        results = [e["data"]["call_id"] for e in log if e["type"] == "tool_result"]
        assert sorted(tool_calls) == sorted(results), f"{run_id}: every call exactly one result"
        if info["kind"] in ("refund", "purge"):
            audit = (await cluster.request("GET", "/v1/audit", params={"run_id": run_id})).json()["items"]
            approved = {a["call_id"] for a in audit if a["action"] == "decision" and a["decision"] == "approve"}
            executed = [e["call_id"] for e in effects if e["run_id"] == run_id]
            assert len(executed) == len(set(executed)), f"{run_id}: a destructive tool executed twice"
            assert set(executed) <= approved, f"{run_id}: executed without an approval"
    assert len(cluster.down) == 0
    # The chaos was real: processes died with runs in flight, and others took those runs over.
    assert cluster.kills >= 3 and taken_over >= 1, (cluster.kills, taken_over, summary)
