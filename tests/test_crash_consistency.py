"""Crash consistency: the event log is the truth (one server process SIGKILLed at random points
of many runs, then started again on the same database, on SQLite and on PostgreSQL).

Many short runs are in flight at every kill — token streams, multi-turn read-only tool calls,
refunds that a reviewer approves as they appear — so kills land everywhere, including between a
turn's last token and the end of the turn. When everything has ended, every run must satisfy:

- the stored text of each ``complete`` assistant message equals the concatenation of the
  ``token`` events logged for it (nothing is stored as done that clients were not shown);
- each tool call of a ``complete`` message was announced by a ``tool_call`` event, and every
  ``tool_result`` and ``interrupt`` in the log comes after the ``tool_call`` of its call id;
- at most one final answer of the run on the thread's active path, and ``done`` names it;
- no refund executed twice or without an approval (the demo's effects table and the audit log).

The workload is seeded; the failures found are collected and reported together.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import httpx
import pytest

from .conftest import ServerProcess, script, whole_log

#: The suite's busiest tests (many processes, SIGKILLs, whole-API fuzzing) run one after another
#: in one pytest-xdist worker, so they never compete with each other for the machine's cores.
pytestmark = [pytest.mark.anyio, pytest.mark.xdist_group("heavy")]

TERMINAL = {"done", "error", "cancelled"}
ROUNDS = 10  # one kill per round
RUNS_PER_ROUND = 14


def content_for(kind: str, n: int) -> str:
    if kind == "stream":
        return script({"tokens": 30, "delay_ms": 2})
    if kind == "lookups":  # several turns, each ending with read-only calls, then an answer
        return script(
            {"text": "checking the order", "tool_calls": [{"name": "get_order", "args": {"order_id": f"A{n}"}}]},
            {"tokens": 12, "delay_ms": 1, "tool_calls": [{"name": "get_order", "args": {"order_id": f"B{n}"}}, {"name": "sleep", "args": {"seconds": 0.02}}]},
            {"tokens": 20, "delay_ms": 1},
        )
    if kind == "refund":
        return script(
            {"tokens": 8, "delay_ms": 1, "tool_calls": [{"name": "refund", "args": {"order_id": f"R{n}", "amount": n + 1}}]},
            {"text": "refund issued, anything else?"},
        )
    # "chain": many short turns, each ending in a read-only call: many turn ends per second
    turn = {"tokens": 6, "delay_ms": 1, "tool_calls": [{"name": "get_order", "args": {"order_id": f"C{n}"}}]}
    return script(*[turn] * 6, {"tokens": 10})


class Server:
    """One server process on one database; requests wait while it is down."""

    def __init__(self, process: ServerProcess) -> None:
        self.process = process
        self.up = asyncio.Event()
        self.up.set()
        self._http: httpx.AsyncClient | None = None

    async def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        for _ in range(400):
            await self.up.wait()
            if self._http is None:
                self._http = httpx.AsyncClient(base_url=self.process.url, timeout=20)
            try:
                return await self._http.request(method, path, **kwargs)
            except httpx.TransportError:
                await self.aclose()  # a new connection next time (the process may be new)
                await asyncio.sleep(0.02)
        raise AssertionError(f"the server did not answer {method} {path}")

    async def threads(self) -> list[dict[str, Any]]:
        """Every thread, with its active run and pending interrupt."""
        items: list[dict[str, Any]] = (await self.request("GET", "/v1/threads", params={"limit": 1000})).json()["items"]
        return items

    async def kill_and_restart(self) -> None:
        self.up.clear()
        await asyncio.to_thread(self.process.kill)
        await asyncio.to_thread(self.process.start)
        self.up.set()

    async def aclose(self) -> None:
        if self._http is not None:
            http, self._http = self._http, None
            await http.aclose()


async def reviewer(server: Server, stop: asyncio.Event) -> None:
    """Approves refunds as they appear; never approves re-running one whose outcome is unknown."""
    while not stop.is_set():
        for thread in await server.threads():
            pending = thread.get("pending_interrupt")
            if not pending or pending["status"] != "pending":
                continue
            decisions = [
                {"decision": "reject", "reason": "outcome unknown"} if r.get("outcome_unknown") else {"decision": "approve"} for r in pending["action_requests"]
            ]
            await server.request("POST", f"/v1/threads/{thread['id']}/resume", json={"interrupt_id": pending["id"], "decisions": decisions})
        await asyncio.sleep(0.05)


async def wait_for_every_run_to_end(server: Server, runs: dict[str, dict[str, Any]]) -> None:
    ours = {info["thread_id"] for info in runs.values()}
    while any(t["active_run_id"] for t in await server.threads() if t["id"] in ours):
        await asyncio.sleep(0.1)


async def violations_of(server: Server, run_id: str, info: dict[str, Any], effects: list[dict[str, Any]]) -> list[str]:
    """What is wrong with one ended run, as read back through the API."""
    found: list[str] = []
    status = (await server.request("GET", f"/v1/runs/{run_id}")).json()["status"]
    if status not in ("completed", "failed", "cancelled"):
        found.append(f"not terminal: {status}")
    log = await whole_log(server, run_id)
    if [e["seq"] for e in log] != list(range(1, len(log) + 1)):
        found.append("seq not gapless")
    terminal = [(e["seq"], e["type"]) for e in log if e["type"] in TERMINAL]
    if len(terminal) != 1 or terminal[0][0] != len(log):
        found.append(f"terminal events {terminal} in a log of {len(log)}, ending {[(e['type'], e['data']) for e in log[-3:]]}")
    tokens: dict[str, str] = {}
    announced: set[str] = set()
    for event in log:
        data = event["data"]
        if event["type"] == "token":
            tokens[data["message_id"]] = tokens.get(data["message_id"], "") + data["text"]
        elif event["type"] == "tool_call":
            announced.add(data["call_id"])
        elif event["type"] == "tool_result" and data["call_id"] not in announced:
            found.append(f"tool_result for unannounced call {data['call_id']}")
        elif event["type"] == "interrupt":
            for request in data["action_requests"]:
                if request["call_id"] not in announced:
                    found.append(f"interrupt for unannounced call {request['call_id']}")
    thread_id = info["thread_id"]
    tree = (await server.request("GET", f"/v1/threads/{thread_id}/messages", params={"view": "tree"})).json()["items"]
    for message in tree:
        if message["run_id"] != run_id or message["role"] != "assistant" or message["status"] != "complete":
            continue
        if message["content"] != tokens.get(message["id"], ""):
            found.append(f"complete message {message['id']} stored {message['content']!r}, logged {tokens.get(message['id'], '')!r}")
        for call in message["tool_calls"] or ():
            if call["id"] not in announced:
                found.append(f"complete message {message['id']} has unannounced call {call['id']}")
    path = (await server.request("GET", f"/v1/threads/{thread_id}/messages")).json()["items"]
    answers = [m["id"] for m in path if m["run_id"] == run_id and m["role"] == "assistant" and m["status"] == "complete" and not m["tool_calls"]]
    if len(answers) > 1:
        found.append(f"{len(answers)} final answers on the active path")
    if log[-1]["type"] == "done" and answers != [log[-1]["data"]["message_id"]]:
        found.append(f"done names {log[-1]['data']['message_id']}, the path's answer is {answers}")
    if info["kind"] == "refund":
        audit = (await server.request("GET", "/v1/audit", params={"run_id": run_id})).json()["items"]
        approved = {a["call_id"] for a in audit if a["action"] == "decision" and a["decision"] == "approve"}
        executed = [e["call_id"] for e in effects if e["run_id"] == run_id]
        if len(executed) != len(set(executed)):
            found.append("a refund executed twice")
        if not set(executed) <= approved:
            found.append("a refund executed without an approval")
    return found


async def test_a_process_killed_at_random_points_leaves_store_and_log_in_agreement(db_url: str, tmp_path: Path) -> None:
    server = Server(ServerProcess(db_url, tmp_path / "server.log", extra_args=("--lease-seconds", "1")).start())
    rng = random.Random(17)
    kinds = ["stream", "lookups", "refund", "chain"]
    runs: dict[str, dict[str, Any]] = {}
    stop = asyncio.Event()
    review = asyncio.create_task(reviewer(server, stop))
    try:
        async with asyncio.timeout(420):
            for _ in range(ROUNDS):
                for _ in range(RUNS_PER_ROUND):
                    n = len(runs)
                    kind = kinds[n % len(kinds)]
                    thread = (await server.request("POST", "/v1/threads", json={})).json()
                    response = await server.request("POST", f"/v1/threads/{thread['id']}/runs", json={"input": {"content": content_for(kind, n)}})
                    assert response.status_code == 202, response.text
                    runs[response.json()["id"]] = {"thread_id": thread["id"], "kind": kind}
                # The kill lands somewhere in the middle of this round's runs (and the rest).
                await asyncio.sleep(rng.uniform(0.01, 0.25))
                await server.kill_and_restart()
            await wait_for_every_run_to_end(server, runs)
            stop.set()
            await review
            effects = (await server.request("GET", "/v1/demo/effects")).json()["items"]
            report = {run_id: await violations_of(server, run_id, info, effects) for run_id, info in runs.items()}
    finally:
        stop.set()
        review.cancel()
        await server.aclose()
        await asyncio.to_thread(server.process.stop)
    broken = {run_id: (runs[run_id]["kind"], found) for run_id, found in report.items() if found}
    assert not broken, f"{len(broken)} of {len(runs)} runs inconsistent after {ROUNDS} kills: {broken}"
