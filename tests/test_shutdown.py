"""A server told to stop (SIGTERM) while runs stream: its streams end at once, nothing is lost.

``tether demo`` runs as a child process that the test stops with SIGTERM, as a deployment does.
Every open event stream then ends with a comment naming the last seq it sent (no stream is left
for uvicorn to cut after its graceful timeout, which it would log as an error). The runs under
way get ``--drain-seconds`` to finish: a client that moved to another process follows a run to
its end there while the stopping process still executes it. What is still running after that is
released: on PostgreSQL another process takes each over at once, long before its lease would
have lapsed; on SQLite the next start does. Either way a client that resumes from the seq in the
comment gets the rest of the log with no gap and no repeat.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tether.client import AsyncClient
from tether.runtime import LocalBus, StreamEnded, follow_run
from tether.store import AtLeaf, Store

from .conftest import ServerProcess, script, start_server

pytestmark = pytest.mark.anyio

SSE = {"Accept": "text/event-stream"}
STOPPING = re.compile(r"^: disconnected: this server is shutting down; reconnect with Last-Event-ID: (\d+)$")
#: Long enough that a run taken over before the test's deadline was released, not abandoned.
LONG_LEASE_S = 600


async def _read_until_cut(http: httpx.AsyncClient, url: str, *, stop: asyncio.Event, tokens_first: int, body: Any = None) -> tuple[list[int], list[str]]:
    """Follow a stream; once ``tokens_first`` tokens arrived, set ``stop`` (the test then stops
    the server) and read on to the stream's end. Returns the seqs received and every line."""
    seqs: list[int] = []
    lines: list[str] = []
    tokens = 0
    request = http.stream("POST", url, json=body, headers=SSE) if body is not None else http.stream("GET", url, headers=SSE)
    async with request as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            lines.append(line)
            if line.startswith("id: "):
                seqs.append(int(line[4:].split(".")[0]))
            if line == "event: token" or '"type":"TEXT_MESSAGE_CONTENT"' in line:
                tokens += 1
                if tokens == tokens_first:
                    stop.set()
    return seqs, lines


async def _start_run(http: httpx.AsyncClient, tokens: int) -> tuple[str, str]:
    """A new thread and a run on it streaming ``tokens`` tokens 5 ms apart: (thread, run)."""
    thread_id = (await http.post("/v1/threads", json={})).json()["id"]
    response = await http.post(f"/v1/threads/{thread_id}/runs", json={"input": {"content": script({"tokens": tokens, "delay_ms": 5})}})
    assert response.status_code == 202, response.text
    return thread_id, response.json()["id"]


def _stopping_seq(lines: list[str]) -> int:
    comments = [m for m in (STOPPING.match(line) for line in lines) if m]
    assert len(comments) == 1, f"expected one shutdown comment, got the stream's tail: {lines[-6:]}"
    assert lines[-2:] == [comments[0].group(0), ""] or lines[-1] == comments[0].group(0), "the comment ends the stream"
    return int(comments[0].group(1))


async def _terminate(process: ServerProcess) -> None:
    """SIGTERM, and wait for the process to exit: after its graceful shutdown uvicorn ends it
    by the signal it was told to stop with (exit status -SIGTERM)."""
    assert process.proc is not None
    process.proc.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(process.proc.wait, 30) in (0, -signal.SIGTERM)


async def test_sigterm_ends_every_stream_with_its_last_seq_and_the_restart_finishes_the_run(processes: list[ServerProcess], tmp_path: Path) -> None:
    first = start_server(processes, tmp_path, "--drain-seconds", "0")
    async with httpx.AsyncClient(base_url=first.url, timeout=30) as http:
        thread_id, run_id = await _start_run(http, 600)
        stop = asyncio.Event()
        # Three followers: two SSE streams of the run, one AG-UI stream of its thread.
        followers = [
            asyncio.create_task(_read_until_cut(http, f"/v1/runs/{run_id}/events", stop=stop, tokens_first=20)),
            asyncio.create_task(_read_until_cut(http, f"/v1/runs/{run_id}/events", stop=stop, tokens_first=20)),
            asyncio.create_task(
                _read_until_cut(
                    http,
                    "/v1/agui/connect",
                    stop=stop,
                    tokens_first=20,
                    body={"threadId": thread_id, "runId": "agui-1", "messages": [], "tools": [], "context": [], "state": {}, "forwardedProps": {}},
                )
            ),
        ]
        async with asyncio.timeout(60):
            await stop.wait()
            await _terminate(first)
            results = await asyncio.gather(*followers)
    for seqs, lines in results[:2]:
        assert seqs == list(range(1, len(seqs) + 1))
        assert _stopping_seq(lines) == seqs[-1]  # the comment names exactly where to resume
        assert not any(line in ("event: done", "event: cancelled", "event: error") for line in lines)
    _stopping_seq(results[2][1])  # the AG-UI stream ends the same way

    second = start_server(processes, tmp_path)
    async with AsyncClient(second.url) as client:
        resumed_from = results[0][0][-1]
        async with asyncio.timeout(60):
            rest = [e async for e in client.follow(run_id, after_seq=resumed_from)]
        log = [e.seq for e in await client.events(run_id, after_seq=0, limit=1000)]
        final = await client.get_run(run_id)
    assert [e.seq for e in rest] == list(range(resumed_from + 1, resumed_from + 1 + len(rest)))
    assert log == list(range(1, len(log) + 1)) and rest[-1].seq == log[-1]
    assert rest[-1].type == "done" and final["status"] == "completed"
    assert any(e.type == "status" and e.data["stage"] == "recovering" for e in rest)


@contextlib.asynccontextmanager
async def _two_processes(pg_db_url: str, tmp_path: Path, *, drain_s: float) -> AsyncIterator[tuple[ServerProcess, ServerProcess]]:
    """Processes A and B on one PostgreSQL database, with a lease far longer than the test."""
    args = ("--lease-seconds", str(LONG_LEASE_S), "--drain-seconds", str(drain_s))
    a, b = (ServerProcess(pg_db_url, tmp_path / f"server-{name}.log", extra_args=args) for name in "ab")
    try:
        await asyncio.gather(asyncio.to_thread(a.start), asyncio.to_thread(b.start))
        yield a, b
    finally:
        for process in (a, b):
            await asyncio.to_thread(process.stop)


async def _stop_mid_stream(a: ServerProcess, *, wait_for_exit: bool) -> tuple[str, str, int]:
    """Start a run of 600 tokens on A, follow it there, SIGTERM A after 20 tokens (and wait for
    A to exit, with ``wait_for_exit``). Returns the thread, the run and the seq A's stream ended
    at, checked: every seq up to it, then the shutdown comment naming it."""
    assert a.proc is not None
    async with httpx.AsyncClient(base_url=a.url, timeout=30) as http:
        thread_id, run_id = await _start_run(http, 600)
        stop = asyncio.Event()
        following = asyncio.create_task(_read_until_cut(http, f"/v1/runs/{run_id}/events", stop=stop, tokens_first=20))
        async with asyncio.timeout(60):
            await stop.wait()
            if wait_for_exit:
                await _terminate(a)
            else:
                a.proc.send_signal(signal.SIGTERM)
            seqs, lines = await following  # ends at once; the run goes on until A's shutdown
    resumed_from = _stopping_seq(lines)
    assert seqs == list(range(1, resumed_from + 1))
    return thread_id, run_id, resumed_from


async def test_a_process_stopped_mid_run_hands_it_to_another_at_once_not_when_its_lease_lapses(pg_db_url: str, tmp_path: Path) -> None:
    async with _two_processes(pg_db_url, tmp_path, drain_s=0) as (a, b):
        thread_id, run_id, resumed_from = await _stop_mid_stream(a, wait_for_exit=True)
        async with AsyncClient(b.url) as on_b:
            # Well inside the lease: only a released run can be taken over by now.
            async with asyncio.timeout(LONG_LEASE_S / 10):
                rest = [e async for e in on_b.follow(run_id, after_seq=resumed_from)]
            final = await on_b.get_run(run_id)
            log = await on_b.events(run_id, after_seq=0, limit=1000)
            path = await on_b.messages(thread_id)
        async with httpx.AsyncClient(base_url=b.url, timeout=10) as http:
            metrics = (await http.get("/metrics")).text
    assert "tether_runs_taken_over_total 1.0" in metrics.splitlines()  # operators see the hand-over
    assert [e.seq for e in log] == list(range(1, len(log) + 1)) and [e.seq for e in rest] == [e.seq for e in log[resumed_from:]]
    assert rest[-1].type == "done" and final["status"] == "completed"
    [recovering] = [e for e in log if e.type == "status" and e.data["stage"] == "recovering"]
    answer = "".join(e.data["text"] for e in log[log.index(recovering) :] if e.type == "token")
    assert answer == "".join(f"t{n} " for n in range(1, 601)) and path[-1]["content"] == answer


async def test_a_stopping_process_finishes_its_run_while_the_client_follows_it_on_another(pg_db_url: str, tmp_path: Path) -> None:
    async with _two_processes(pg_db_url, tmp_path, drain_s=120) as (a, b):
        _thread_id, run_id, resumed_from = await _stop_mid_stream(a, wait_for_exit=False)
        async with AsyncClient(b.url) as on_b:
            async with asyncio.timeout(60):
                rest = [e async for e in on_b.follow(run_id, after_seq=resumed_from)]
            final = await on_b.get_run(run_id)
            log = await on_b.events(run_id, after_seq=0, limit=1000)
        assert a.proc is not None
        assert await asyncio.to_thread(a.proc.wait, 30) in (0, -signal.SIGTERM)  # it exits once its run is over
    assert [e.seq for e in log] == list(range(1, len(log) + 1)) and [e.seq for e in rest] == [e.seq for e in log[resumed_from:]]
    assert rest[-1].type == "done" and final["status"] == "completed"
    assert not any(e.type == "status" and e.data["stage"] == "recovering" for e in log)  # finished where it began
    assert "".join(e.data["text"] for e in log if e.type == "token") == "".join(f"t{n} " for n in range(1, 601))


async def test_runs_released_by_a_stopped_process_are_each_taken_over_by_exactly_one_of_the_others(pg_db_url: str, tmp_path: Path) -> None:
    runs = 24  # more than one claim round (claim_abandoned takes 20 at a time)
    args = ("--lease-seconds", str(LONG_LEASE_S), "--drain-seconds", "0")
    a, b, c = (ServerProcess(pg_db_url, tmp_path / f"server-{name}.log", extra_args=args) for name in "abc")
    try:
        await asyncio.gather(*(asyncio.to_thread(p.start) for p in (a, b, c)))
        async with AsyncClient(a.url) as on_a:
            threads = [await on_a.create_thread() for _ in range(runs)]
            started = [await on_a.start_run(t["id"], script({"tokens": 300, "delay_ms": 10})) for t in threads]
            async with asyncio.timeout(60):
                for run in started:  # every run under way on A
                    while not any(e.type == "token" for e in await on_a.events(run["id"])):
                        await asyncio.sleep(0.02)
        await _terminate(a)
        # B and C both hear of the release and race for every run; each follows half of them.
        async with AsyncClient(b.url) as on_b, AsyncClient(c.url) as on_c:
            async with asyncio.timeout(LONG_LEASE_S / 10):
                logs = await asyncio.gather(*(_follow_all(on_b if i % 2 else on_c, run["id"]) for i, run in enumerate(started)))
            finals = [await on_b.get_run(run["id"]) for run in started]
    finally:
        for process in (a, b, c):
            await asyncio.to_thread(process.stop)
    expected = "".join(f"t{n} " for n in range(1, 301))
    for log, final in zip(logs, finals, strict=True):
        assert [e.seq for e in log] == list(range(1, len(log) + 1)) and log[-1].type == "done" and final["status"] == "completed"
        # Executed by one process after the hand-over: a second executor would have logged a
        # second ``recovering`` (or collided on a seq).
        [recovering] = [e for e in log if e.type == "status" and e.data["stage"] == "recovering"]
        assert "".join(e.data["text"] for e in log[log.index(recovering) :] if e.type == "token") == expected


async def _follow_all(client: AsyncClient, run_id: str) -> list[Any]:
    return [e async for e in client.follow(run_id)]


async def test_ending_the_streams_stops_a_waiting_follower_and_every_later_one(tmp_path: Path) -> None:
    store = await Store.open(f"sqlite:///{tmp_path / 'bus.db'}")
    try:
        bus = LocalBus()
        thread = await store.create_thread(owner="local")
        created = await store.create_run(thread_id=thread.id, attach=AtLeaf(content="hi"), config={}, running=True)
        run_id = created.run.id

        async def follow() -> list[int]:
            seqs: list[int] = []
            async for batch in follow_run(store, bus, run_id, idle_timeout=30):  # ends by raising
                seqs += [e.seq for e in batch]
            return seqs

        waiting = asyncio.create_task(follow())
        async with asyncio.timeout(10):
            while bus.subscriber_count(run_id) == 0:  # a condition on the bus, polled
                await asyncio.sleep(0.01)
            bus.end_streams()
            with pytest.raises(StreamEnded) as ended:
                await waiting
            assert ended.value.last_seq == max(e.seq for e in created.events)
            with pytest.raises(StreamEnded):  # a stream opened from now on ends at once
                await follow()
        assert bus.total_subscribers() == 0
    finally:
        await store.aclose()


async def test_a_second_ctrl_c_stops_waiting_for_the_runs_and_hands_them_over(processes: list[ServerProcess], tmp_path: Path) -> None:
    server = start_server(processes, tmp_path, "--drain-seconds", "600", "--log-level", "info")
    assert server.proc is not None
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        _thread_id, run_id = await _start_run(http, 100_000)
        stop = asyncio.Event()
        following = asyncio.create_task(_read_until_cut(http, f"/v1/runs/{run_id}/events", stop=stop, tokens_first=5))
        async with asyncio.timeout(60):
            await stop.wait()
            server.proc.send_signal(signal.SIGINT)
            _stopping_seq((await following)[1])
            while "waiting up to 600 s for 1 run(s) to finish" not in server.log_path.read_text():  # the drain began
                await asyncio.sleep(0.05)
            server.proc.send_signal(signal.SIGINT)
            assert await asyncio.to_thread(server.proc.wait, 30) in (0, -signal.SIGINT)
    assert "released 1 run(s) for another process, or the next start, to take over" in server.log_path.read_text()
