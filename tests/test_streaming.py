"""Streaming guarantees, proven through a real server socket.

Every test talks to a real uvicorn server over TCP. Disconnects are real: leaving an httpx
``client.follow(...)`` block before the body ended closes the connection, exactly what a closed
browser tab, a proxy timeout or a network drop does to the server. The reference every stream is
compared with is the run's stored log, read page by page with the JSON form of
``GET /v1/runs/{id}/events``.

A ``{"tokens": N}`` script step gives a run of exactly ``N + 3`` events: ``run_started``, one
``status``, ``N`` tokens ``"t1 "`` … ``"tN "``, and ``done``. With ``delay_ms`` the run is still
streaming while the clients read, so cuts land in the live tail; without it, after the run has
finished, a stream is a pure replay.
"""

from __future__ import annotations

import contextlib
import json
import random
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from datetime import UTC, datetime
from functools import partial
from itertools import pairwise
from pathlib import Path
from typing import Any, Literal, TypeVar

import anyio
import httpx
import pytest

from tether.client import AsyncClient
from tether.demo import build_demo_agent
from tether.store import StoredEvent

from .conftest import LiveServer, script

pytestmark = pytest.mark.anyio

Envelope = dict[str, Any]
Resume = Literal["header", "query"]
T = TypeVar("T")

TERMINAL_TYPES = {"done", "error", "cancelled"}
TERMINAL_STATUSES = {"completed", "failed", "cancelled"}
ENVELOPE_KEYS = {"run_id", "seq", "type", "ts", "data"}
ERROR_KEYS = {"code", "message", "details"}
TS_FORMAT = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")


# -- helpers --------------------------------------------------------------------------------


def token_run_length(tokens: int) -> int:
    """How many events a ``{"tokens": N}`` run has: run_started, status, N tokens, done."""
    return tokens + 3


class SSEReader:
    """Reads one SSE response line by line, so a test can cut the connection at any point.

    It checks the framing as it goes: every event has ``id`` = the envelope's ``seq`` and
    ``event`` = the envelope's ``type``. ``trace`` records, in arrival order, each event's seq
    and each comment, with the arrival time.
    """

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self._lines = response.aiter_lines()
        self.retry: list[int] = []
        self.comments: list[str] = []
        self.trace: list[tuple[int | str, float]] = []
        self.ended = False

    async def line(self) -> str | None:
        """The next line, or None when the server closed the stream."""
        try:
            return await self._lines.__anext__()
        except StopAsyncIteration:
            self.ended = True
            return None

    async def event(self) -> Envelope | None:
        """The next event's envelope, or None when the stream ended."""
        fields: dict[str, str] = {}
        while True:
            line = await self.line()
            if line is None:
                assert not fields, f"the stream ended inside a frame: {fields}"
                return None
            if line == "":
                if "data" in fields:
                    envelope: Envelope = json.loads(fields["data"])
                    assert fields.get("id") == str(envelope["seq"]), fields
                    assert fields.get("event") == envelope["type"], fields
                    self.trace.append((envelope["seq"], time.monotonic()))
                    return envelope
                assert not fields, f"a frame without data: {fields}"
                continue
            if line.startswith(":"):
                self.comments.append(line[1:].strip())
                self.trace.append((line, time.monotonic()))
                continue
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "retry":
                self.retry.append(int(value))
                continue
            assert name not in fields, f"field {name!r} twice in one frame"
            fields[name] = value

    async def rest(self) -> list[Envelope]:
        """Every event until the server closes the stream."""
        events: list[Envelope] = []
        while (envelope := await self.event()) is not None:
            events.append(envelope)
        return events

    async def aclose(self) -> None:
        await self._lines.aclose()


@contextlib.asynccontextmanager
async def open_stream(http: httpx.AsyncClient, run_id: str, *, after: int | None = None, resume: Resume = "header") -> AsyncIterator[SSEReader]:
    """Open the run's SSE stream (resuming after ``after`` by header or query); leaving the block
    before the stream ended closes the TCP connection."""
    headers = {"Accept": "text/event-stream"}
    params: dict[str, int] = {}
    if after is not None:
        if resume == "header":
            headers["Last-Event-ID"] = str(after)
        else:
            params["after_seq"] = after
    async with http.stream("GET", f"/v1/runs/{run_id}/events", headers=headers, params=params) as response:
        if response.status_code != 200:
            await response.aread()
            raise AssertionError(f"stream of {run_id} answered {response.status_code}: {response.text}")
        assert response.headers["content-type"].startswith("text/event-stream")
        reader = SSEReader(response)
        try:
            yield reader
        finally:
            await reader.aclose()


async def stored_log(http: httpx.AsyncClient, run_id: str) -> list[Envelope]:
    """The run's whole stored log, through the JSON page form (``limit=1000`` pages)."""
    items: list[Envelope] = []
    after = 0
    while True:
        response = await http.get(f"/v1/runs/{run_id}/events", params={"after_seq": after, "limit": 1000})
        assert response.status_code == 200, response.text
        page = response.json()["items"]
        if not page:
            return items
        items.extend(page)
        after = page[-1]["seq"]


def assert_complete_log(log: list[Envelope], run_id: str) -> None:
    """seq gapless from 1, ``run_started`` first, exactly one terminal event and it is last."""
    assert [e["seq"] for e in log] == list(range(1, len(log) + 1))
    assert all(e["run_id"] == run_id for e in log)
    assert log[0]["type"] == "run_started"
    assert [e["type"] in TERMINAL_TYPES for e in log].count(True) == 1
    assert log[-1]["type"] in TERMINAL_TYPES


async def wait_for_terminal(http: httpx.AsyncClient, run_id: str, timeout: float = 15.0) -> dict[str, Any]:
    """Poll ``GET /v1/runs/{id}`` until the run is terminal."""
    with anyio.fail_after(timeout):
        while True:
            run = (await http.get(f"/v1/runs/{run_id}")).json()
            if run["status"] in TERMINAL_STATUSES:
                return run  # type: ignore[no-any-return]
            await anyio.sleep(0.02)


async def wait_for_no_followers(server: LiveServer, run_id: str, timeout: float = 5.0) -> None:
    """Wait until the server holds no live subscription for ``run_id`` (closed streams let go)."""
    bus = server.app.state.runtime.bus
    with anyio.fail_after(timeout):
        while bus.subscriber_count(run_id):
            await anyio.sleep(0.02)


async def start_run(client: AsyncClient, content: str, thread_id: str | None = None) -> str:
    """Start a run (on a new thread unless one is given) and return its id."""
    if thread_id is None:
        thread_id = (await client.create_thread())["id"]
    return (await client.start_run(thread_id, content))["id"]  # type: ignore[no-any-return]


async def gather(*calls: Callable[[], Awaitable[T]]) -> list[T]:
    """Run ``calls`` concurrently in one task group; their results in order."""
    results: list[Any] = [None] * len(calls)

    async def run(index: int, call: Callable[[], Awaitable[T]]) -> None:
        results[index] = await call()

    async with anyio.create_task_group() as tg:
        for index, call in enumerate(calls):
            tg.start_soon(run, index, call)
    return results


def parse_ts(value: str) -> datetime:
    return datetime.strptime(value, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)


@contextlib.asynccontextmanager
async def clients(server: LiveServer, *, connections: int = 20) -> AsyncIterator[tuple[AsyncClient, httpx.AsyncClient]]:
    """Tether's client for set-up and a raw httpx client for streams and pages."""
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    async with AsyncClient(server.url) as client, httpx.AsyncClient(base_url=server.url, timeout=10.0, limits=limits) as http:
        yield client, http


async def follow_with_cuts(http: httpx.AsyncClient, run_id: str, cuts: list[int], *, resume: Resume, rng: random.Random) -> tuple[list[Envelope], list[str]]:
    """Follow a run from its start, dropping connection *i* once it has seen seq ``cuts[i]``,
    each time resuming from the last seq seen; the last connection reads to the end.

    Sometimes a cut also reads one more line first, so it lands inside the next frame. Returns
    everything received, and the run's status observed right after each cut (``running`` then
    means the cut happened during the live tail).
    """
    received: list[Envelope] = []
    statuses: list[str] = []
    last = 0
    for index, cut in enumerate([*cuts, None]):
        async with open_stream(http, run_id, after=last if index else None, resume=resume) as stream:
            while cut is None or last < cut:
                envelope = await stream.event()
                if envelope is None:
                    break
                received.append(envelope)
                last = envelope["seq"]
            if cut is not None and rng.random() < 0.5:
                await stream.line()  # the cut lands in the middle of the next frame
        if cut is not None:
            statuses.append((await http.get(f"/v1/runs/{run_id}")).json()["status"])
    return received, statuses


# -- a complete stream ------------------------------------------------------------------------


async def test_a_streamed_run_of_two_thousand_tokens_arrives_complete_and_in_order(server: LiveServer) -> None:
    with anyio.fail_after(30):
        async with clients(server) as (client, http):
            run_id = await start_run(client, script({"tokens": 2000}))
            async with open_stream(http, run_id) as stream:
                events = await stream.rest()
                assert stream.ended

            assert_complete_log(events, run_id)
            assert len(events) == token_run_length(2000)
            assert events[-1]["type"] == "done"
            texts = [e["data"]["text"] for e in events if e["type"] == "token"]
            assert texts == [f"t{n} " for n in range(1, 2001)]
            assert events == await stored_log(http, run_id)


# -- disconnect and resume --------------------------------------------------------------------


async def test_a_stream_cut_at_random_seqs_and_resumed_from_the_last_seen_seq_has_no_gap_and_no_duplicate(
    server: LiveServer,
) -> None:
    rng = random.Random(20261130)
    with anyio.fail_after(30):
        async with clients(server) as (client, http):
            # Live tail: the run streams for 1.5 s or more while two followers keep cutting and
            # resuming, one with Last-Event-ID, the other with ?after_seq. A repeated cut point is
            # a reconnect that is dropped again before it delivers anything; 0 cuts before seq 1.
            tokens = 500
            total = token_run_length(tokens)
            live_run = await start_run(client, script({"tokens": tokens, "delay_ms": 3}))
            plans: dict[Resume, list[int]] = {
                "header": sorted(rng.choices(range(total), k=7)),
                "query": sorted(rng.choices(range(total), k=7)),
            }
            plans["header"][1] = plans["header"][0]  # at least one back-to-back cut
            live = await gather(
                *(partial(follow_with_cuts, http, live_run, cuts, resume=resume, rng=random.Random(rng.random())) for resume, cuts in plans.items())
            )
            await wait_for_terminal(http, live_run)
            log = await stored_log(http, live_run)
            assert_complete_log(log, live_run)
            assert len(log) == total
            live_cuts = 0
            for (received, statuses), resume in zip(live, plans, strict=True):
                assert received == log, f"resume by {resume}"
                live_cuts += statuses.count("running")
            # The cuts really happened while the run was streaming (not after it finished).
            assert live_cuts >= 7, live_cuts

            # Pure replay: the same after the run has finished.
            tokens = 300
            total = token_run_length(tokens)
            done_run = await start_run(client, script({"tokens": tokens}))
            await wait_for_terminal(http, done_run)
            log = await stored_log(http, done_run)
            assert_complete_log(log, done_run)
            assert len(log) == total
            for resume in ("header", "query"):
                cuts = sorted(rng.choices(range(total), k=6))
                received, statuses = await follow_with_cuts(http, done_run, cuts, resume=resume, rng=rng)
                assert received == log, f"resume by {resume} after cuts {cuts}"
                assert set(statuses) == {"completed"}

            # One cut, resumed both ways: each resume is exactly the rest of the log.
            for cut in rng.sample(range(total), 8):
                for resume in ("header", "query"):
                    async with open_stream(http, done_run, after=cut, resume=resume) as stream:
                        assert await stream.rest() == log[cut:], f"resume by {resume} after seq {cut}"


async def test_fifty_clients_following_the_same_live_run_all_receive_the_identical_sequence(server: LiveServer) -> None:
    # The run's tokens are held back inside the server until all 50 clients follow it (a
    # condition, not the run's length: on a slow, busy machine 50 streams take longer to open
    # than 300 paced tokens take to stream), so every client gets its tokens live, from the bus.
    store, bus = server.app.state.store, server.app.state.runtime.bus
    append_event_batches = store.append_event_batches

    async def tokens_once_all_follow(batches: Sequence[tuple[str, Sequence[StoredEvent]]]) -> frozenset[str]:
        for run_id, batch in batches:
            if any(e.type == "token" for e in batch):
                with anyio.fail_after(20):
                    while bus.subscriber_count(run_id) < 50:
                        await anyio.sleep(0.005)
        return await append_event_batches(batches)

    store.append_event_batches = tokens_once_all_follow
    try:
        with anyio.fail_after(30):
            async with clients(server, connections=60) as (client, http):
                run_id = await start_run(client, script({"tokens": 300, "delay_ms": 4}))

                async def follow() -> list[Envelope]:
                    async with open_stream(http, run_id) as stream:
                        return await stream.rest()

                streams = await gather(*([follow] * 50))
                run = await wait_for_terminal(http, run_id)
                log = await stored_log(http, run_id)

                assert run["status"] == "completed"
                assert_complete_log(log, run_id)
                assert len(log) == token_run_length(300)
                assert len(streams) == 50
                for events in streams:
                    assert events == log
                await wait_for_no_followers(server, run_id)
    finally:
        store.append_event_batches = append_event_batches


async def test_closing_the_stream_mid_run_does_not_cancel_the_run(server: LiveServer) -> None:
    with anyio.fail_after(30):
        async with clients(server) as (client, http):
            thread_id = (await client.create_thread())["id"]
            run_id = await start_run(client, script({"tokens": 200, "delay_ms": 5}), thread_id)
            async with open_stream(http, run_id) as stream:
                seen = [await stream.event() for _ in range(10)]
            # The connection is gone; the run is not.
            assert (await client.get_run(run_id))["status"] == "running"
            await wait_for_no_followers(server, run_id)

            run = await wait_for_terminal(http, run_id)
            assert run["status"] == "completed"
            assert run["error"] is None
            log = await stored_log(http, run_id)
            assert_complete_log(log, run_id)
            assert log[-1]["type"] == "done"
            assert seen == log[:10]
            text = "".join(f"t{n} " for n in range(1, 201))
            assert "".join(e["data"]["text"] for e in log if e["type"] == "token") == text
            answer = (await client.messages(thread_id))[-1]
            assert (answer["id"], answer["role"], answer["status"], answer["content"]) == (
                log[-1]["data"]["message_id"],
                "assistant",
                "complete",
                text,
            )


# -- the wire format --------------------------------------------------------------------------


async def test_the_sse_response_has_the_documented_headers_framing_and_envelopes(server: LiveServer) -> None:
    with anyio.fail_after(30):
        async with clients(server) as (client, http):
            run_id = await start_run(client, script({"thinking": "let me see", "text": "hello wire format", "delay_ms": 2}))
            async with http.stream("GET", f"/v1/runs/{run_id}/events", headers={"Accept": "text/event-stream"}) as response:
                assert response.status_code == 200
                assert response.headers["content-type"].split(";")[0].strip() == "text/event-stream"
                assert response.headers["cache-control"] == "no-cache"
                assert response.headers["x-accel-buffering"] == "no"
                body = (await response.aread()).decode()

            assert re.match(r"retry: \d+\n\n", body), body[:40]
            assert body.endswith("\n\n")
            frames = body.split("\n\n")[1:-1]
            envelopes = []
            for frame in frames:
                if frame.startswith(":"):
                    continue  # a keep-alive comment (not expected here, but allowed)
                lines = frame.split("\n")
                assert [line.split(": ", 1)[0] for line in lines] == ["id", "event", "data"], frame
                envelope = json.loads(lines[2][len("data: ") :])
                assert set(envelope) == ENVELOPE_KEYS
                assert lines[0] == f"id: {envelope['seq']}"
                assert lines[1] == f"event: {envelope['type']}"
                assert envelope["run_id"] == run_id
                assert TS_FORMAT.match(envelope["ts"]), envelope["ts"]
                assert isinstance(envelope["data"], dict)
                # One line of canonical compact JSON: what the store keeps, byte for byte.
                assert lines[2] == "data: " + json.dumps(envelope, separators=(",", ":"), ensure_ascii=False)
                envelopes.append(envelope)

            assert_complete_log(envelopes, run_id)
            assert [e["type"] for e in envelopes] == (["run_started", "status"] + ["thinking"] * 3 + ["token"] * 3 + ["done"])
            assert envelopes[0]["data"]["thread_id"] and envelopes[0]["data"]["input_message_id"]
            assert [parse_ts(e["ts"]) for e in envelopes] == sorted(parse_ts(e["ts"]) for e in envelopes)
            assert envelopes == await stored_log(http, run_id)


async def test_the_json_page_form_returns_the_very_same_envelopes_with_after_seq_and_limit_paging(server: LiveServer) -> None:
    with anyio.fail_after(30):
        async with clients(server) as (client, http):
            run_id = await start_run(client, script({"tokens": 240}))
            await wait_for_terminal(http, run_id)
            async with http.stream("GET", f"/v1/runs/{run_id}/events", headers={"Accept": "text/event-stream"}) as response:
                body = (await response.aread()).decode()
            data_lines = [line[len("data: ") :] for line in body.split("\n") if line.startswith("data: ")]
            total = token_run_length(240)
            assert len(data_lines) == total

            # Without an SSE Accept: {"items": [...]}, byte for byte the envelopes the stream sent.
            for headers in ({}, {"Accept": "application/json"}):
                page = await http.get(f"/v1/runs/{run_id}/events", params={"after_seq": 0, "limit": 1000}, headers=headers)
                assert page.status_code == 200
                assert page.headers["content-type"].startswith("application/json")
                assert page.text == '{"items":[' + ",".join(data_lines) + "]}"
                assert set(page.json()) == {"items"}
                assert page.json()["items"] == [json.loads(line) for line in data_lines]
            log = [json.loads(line) for line in data_lines]

            # The default page is the first 100 events.
            assert (await http.get(f"/v1/runs/{run_id}/events")).json()["items"] == log[:100]
            # after_seq + limit pages concatenate to the whole log.
            for limit in (1, 7, 100, 242, 243, 1000):
                pages: list[Envelope] = []
                while True:
                    after = pages[-1]["seq"] if pages else 0
                    items = (await http.get(f"/v1/runs/{run_id}/events", params={"after_seq": after, "limit": limit})).json()["items"]
                    assert len(items) <= limit
                    if not items:
                        break
                    pages.extend(items)
                assert pages == log, f"limit={limit}"
            for after, limit in ((0, 5), (17, 3), (total - 2, 10), (total, 10), (total + 50, 10)):
                items = (await http.get(f"/v1/runs/{run_id}/events", params={"after_seq": after, "limit": limit})).json()["items"]
                assert items == log[after : after + limit]


async def test_starting_a_run_with_an_event_stream_accept_streams_the_new_run_from_seq_one_to_its_end(server: LiveServer) -> None:
    with anyio.fail_after(30):
        async with clients(server) as (client, http):
            thread_id = (await client.create_thread())["id"]
            body = {"input": {"content": script({"tokens": 80, "delay_ms": 2})}}
            async with http.stream("POST", f"/v1/threads/{thread_id}/runs", json=body, headers={"Accept": "text/event-stream"}) as response:
                assert response.is_success, await response.aread()
                assert response.headers["content-type"].startswith("text/event-stream")
                assert response.headers["cache-control"] == "no-cache"
                assert response.headers["x-accel-buffering"] == "no"
                run_id = response.headers["x-run-id"]
                assert response.headers["location"] == f"/v1/runs/{run_id}"
                stream = SSEReader(response)
                events = await stream.rest()
                assert stream.retry, "the stream starts with retry:"
                await stream.aclose()

            assert_complete_log(events, run_id)
            assert events[0]["type"] == "run_started" and events[0]["data"]["thread_id"] == thread_id
            assert events[-1]["type"] == "done"
            assert len(events) == token_run_length(80)
            assert events == await stored_log(http, run_id)
            assert (await client.get_run(run_id))["status"] == "completed"


async def test_a_run_streamed_by_the_request_that_starts_it_never_reads_its_log_back(server: LiveServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """The stream of a run started with ``Accept: text/event-stream`` subscribes before the run
    exists, so every event from ``run_started`` on reaches it live and the log is not read
    back: also for a run that ends at once (its model fails), whose terminal event may be
    published before the response has begun. A stream resumed later does read the log."""
    store = server.app.state.store
    reads: list[str] = []
    read_events = store.read_events

    async def counted(run_id: str, **kwargs: Any) -> list[StoredEvent]:
        reads.append(run_id)
        return await read_events(run_id, **kwargs)

    monkeypatch.setattr(store, "read_events", counted)
    with anyio.fail_after(30):
        async with clients(server) as (client, http):
            for step, terminal in (({"tokens": 30}, "done"), ({"fail": "the provider is down"}, "error")):
                thread_id = (await client.create_thread())["id"]
                body = {"input": {"content": script(step)}}
                async with http.stream("POST", f"/v1/threads/{thread_id}/runs", json=body, headers={"Accept": "text/event-stream"}) as response:
                    assert response.is_success, await response.aread()
                    run_id = response.headers["x-run-id"]
                    stream = SSEReader(response)
                    events = await stream.rest()
                    await stream.aclose()
                assert_complete_log(events, run_id)
                assert events[-1]["type"] == terminal
                assert run_id not in reads, "the stream of a run it started read the run's log"
                assert server.app.state.runtime.bus.subscriber_count(run_id) == 0
                async with http.stream("GET", f"/v1/runs/{run_id}/events", headers={"Accept": "text/event-stream"}) as response:
                    replayed = await SSEReader(response).rest()
                assert replayed == events
                assert run_id in reads  # a stream that did not start the run reads the log


@pytest.fixture
def quick_ping_server(tmp_path: Path) -> Iterator[LiveServer]:
    """The demo server with a 0.2 s keep-alive interval (15 s in production)."""
    live = LiveServer(build_demo_agent(), f"sqlite:///{tmp_path / 'ping.db'}", sse_ping_s=0.2).start()
    try:
        yield live
    finally:
        live.stop()


async def test_an_idle_stream_gets_ping_comments_while_it_waits(quick_ping_server: LiveServer) -> None:
    server = quick_ping_server
    with anyio.fail_after(30):
        async with clients(server) as (client, http):
            # The model is silent for 1.5 s before its one word.
            run_id = await start_run(client, script({"text": "slow", "delay_ms": 1500}))
            async with open_stream(http, run_id) as stream:
                events = await stream.rest()

            assert [e["type"] for e in events] == ["run_started", "status", "token", "done"]
            assert events == await stored_log(http, run_id)
            assert set(stream.comments) == {"ping"}
            # The pings come while the stream is idle: between the status and the token.
            order = [item for item, _ in stream.trace]
            pings_in_the_gap = order[order.index(2) + 1 : order.index(3)]
            assert len(pings_in_the_gap) >= 4, order
            assert all(item == ": ping" for item in pings_in_the_gap)
            # Never silent much longer than the interval.
            arrivals = [at for _, at in stream.trace]
            assert max(b - a for a, b in pairwise(arrivals)) < 0.8


# -- the ends of a stream ---------------------------------------------------------------------


async def test_resuming_after_the_terminal_event_returns_no_events_and_closes(server: LiveServer) -> None:
    with anyio.fail_after(20):
        async with clients(server) as (client, http):
            run_id = await start_run(client, script({"text": "short and done"}))
            await wait_for_terminal(http, run_id)
            log = await stored_log(http, run_id)
            terminal = log[-1]["seq"]
            assert log[-1]["type"] == "done"

            for after in (terminal, terminal + 100):
                for resume in ("header", "query"):
                    with anyio.fail_after(5):
                        async with open_stream(http, run_id, after=after, resume=resume) as stream:
                            assert await stream.rest() == []
                            assert stream.ended and stream.retry
            # One before the terminal: exactly the terminal event, then the end.
            async with open_stream(http, run_id, after=terminal - 1) as stream:
                assert await stream.rest() == [log[-1]]


async def test_a_live_stream_resumed_past_the_end_closes_when_the_run_ends(server: LiveServer) -> None:
    with anyio.fail_after(20):
        async with clients(server) as (client, http):
            run_id = await start_run(client, script({"tokens": 50, "delay_ms": 5}))
            # A cursor beyond anything the run will write (a stale or foreign Last-Event-ID).
            async with open_stream(http, run_id, after=10_000) as stream:
                assert await stream.rest() == []
            assert (await client.get_run(run_id))["status"] == "completed"


def assert_error_shape(response: httpx.Response, status: int | None = None) -> dict[str, Any]:
    """A 4xx with the documented JSON error body; returns its ``error``."""
    assert 400 <= response.status_code < 500, (response.status_code, response.text)
    if status is not None:
        assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == ERROR_KEYS
    assert isinstance(body["error"]["code"], str) and body["error"]["code"]
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    return body["error"]  # type: ignore[no-any-return]


async def test_an_unknown_run_or_a_bad_resume_cursor_gets_a_json_error(server: LiveServer) -> None:
    with anyio.fail_after(20):
        async with clients(server) as (client, http):
            sse = {"Accept": "text/event-stream"}
            for headers in (sse, {}):
                error = assert_error_shape(await http.get("/v1/runs/run_doesnotexist/events", headers=headers), 404)
                assert error["code"] == "run_not_found"
            assert_error_shape(await http.get("/v1/runs/run_doesnotexist"), 404)

            run_id = await start_run(client, script({"text": "fine"}))
            await wait_for_terminal(http, run_id)
            for bad in ("abc", "1.5", "-1", "0x10"):
                for headers in ({**sse, "Last-Event-ID": bad}, {"Last-Event-ID": bad}):
                    assert_error_shape(await http.get(f"/v1/runs/{run_id}/events", headers=headers))
            for bad in ("abc", "-1"):
                assert_error_shape(await http.get(f"/v1/runs/{run_id}/events", params={"after_seq": bad}, headers=sse))
            # After all that, the stream still works.
            async with open_stream(http, run_id) as stream:
                assert await stream.rest() == await stored_log(http, run_id)


# -- stress -----------------------------------------------------------------------------------


async def follow_erratically(http: httpx.AsyncClient, run_id: str, rng: random.Random) -> tuple[list[Envelope], int]:
    """A flaky client: drops the connection at random moments (after a random number of events,
    or after a random time, possibly mid-frame) and resumes from the last seq it saw, until it has
    seen the terminal event. Returns what it received and how many connections it used."""
    received: list[Envelope] = []
    connections = 0
    while not received or received[-1]["type"] not in TERMINAL_TYPES:
        connections += 1
        resume: Resume = rng.choice(("header", "query"))
        after = received[-1]["seq"] if received else None
        budget = rng.choice((0, 1, rng.randint(2, 20), rng.randint(20, 120)))
        with anyio.move_on_after(rng.uniform(0.005, 0.25) if rng.random() < 0.4 else 60):
            async with open_stream(http, run_id, after=after, resume=resume) as stream:
                for _ in range(budget):
                    envelope = await stream.event()
                    if envelope is None:
                        break
                    received.append(envelope)
                else:
                    if rng.random() < 0.3:
                        await stream.line()  # cut inside the next frame
        assert connections < 500, "the client makes no progress"
    return received, connections


async def test_many_flaky_clients_on_many_concurrent_runs_each_reconstruct_exactly_the_log(server: LiveServer) -> None:
    rng = random.Random(424242)
    with anyio.fail_after(40):
        async with clients(server, connections=80) as (client, http):
            threads = [(await client.create_thread())["id"] for _ in range(4)]
            for _round in range(2):
                runs = []
                for thread_id in threads:
                    tokens = rng.randint(150, 300)
                    runs.append((await start_run(client, script({"tokens": tokens, "delay_ms": 2}), thread_id), tokens))
                followers = [(run_id, random.Random(rng.random())) for run_id, _ in runs for _ in range(5)]
                results = await gather(*(partial(follow_erratically, http, run_id, own) for run_id, own in followers))
                for run_id, tokens in runs:
                    run = await wait_for_terminal(http, run_id)
                    assert run["status"] == "completed"
                    log = await stored_log(http, run_id)
                    assert_complete_log(log, run_id)
                    assert len(log) == token_run_length(tokens)
                for (run_id, _), (received, _connections) in zip(followers, results, strict=True):
                    assert received == await stored_log(http, run_id)
                assert sum(connections for _, connections in results) > 3 * len(results)
                for run_id, _ in runs:
                    await wait_for_no_followers(server, run_id)


async def test_a_run_that_ends_before_its_first_model_call_leaves_no_partial_answer(tmp_path: Path) -> None:
    # The run's start stores its first turn's empty answer; an agent allowed no model call at
    # all ends the run before that turn: the answer is closed as failed, not left partial.
    from tether import Agent
    from tether.models.scripted import ScriptedModel

    from .conftest import sqlite_url

    live = LiveServer(Agent(ScriptedModel(), name="no-steps", max_steps=0), sqlite_url(tmp_path)).start()
    try:
        async with AsyncClient(live.url) as client:
            thread = await client.create_thread()
            run = await client.start_run(thread["id"], "hello")
            with anyio.fail_after(20):
                events = [e async for e in client.follow(run["id"])]
            assert events[-1].type == "error" and events[-1].data["code"] == "max_steps_exceeded"
            messages = await client.messages(thread["id"], view="tree")
            assert [(m["role"], m["status"]) for m in messages if m["role"] == "assistant"] == [("assistant", "failed")]
            assert all(m["status"] != "partial" for m in messages)
    finally:
        live.stop()
