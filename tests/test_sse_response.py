"""EventStreamResponse's task semantics, driven as an ASGI server drives it.

The network side (a real client closing its socket, idle or mid-run, and the stream's slot and
subscription coming back) is tested through a real server in test_streaming.py and
test_bounds.py. These tests pin down what only an in-process call can: that a client going away
ends the response without leaving a cancellation behind in the server's task, and that every
other cancellation or failure still comes out as it went in.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncGenerator
from typing import Any

import pytest

from tether.events import Done, Envelope, Event, RunStarted, Status, StoredEvent, Token, now_ts
from tether.runtime import LocalBus, RunFeed
from tether.server._sse import EventStreamResponse, sse_response

pytestmark = pytest.mark.anyio


class Client:
    """The ASGI server's side of one response: what was sent, and a disconnect to deliver."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.gone = asyncio.Event()
        self.chunk_sent = asyncio.Event()

    async def receive(self) -> dict[str, Any]:
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        await asyncio.sleep(0)  # a socket write gives the loop a turn
        self.sent.append(message)
        if message["type"] == "http.response.body" and message.get("more_body"):
            self.chunk_sent.set()

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body")

    @property
    def finished(self) -> bool:
        return any(m["type"] == "http.response.body" and not m.get("more_body") for m in self.sent)


class Body:
    """A stream body that yields ``first`` and then waits on a latch, recording how it ended."""

    def __init__(self, first: str = "retry: 1000\n\n", then: list[str] | None = None) -> None:
        self.first, self.then = first, then
        self.latch = asyncio.Event()
        self.started = self.closed = False
        self.exited_with: BaseException | None = None

    async def __call__(self) -> AsyncGenerator[str, None]:
        self.started = True
        try:
            yield self.first
            if self.then is None:
                await self.latch.wait()  # a stream with nothing to send (a parked run)
            else:
                for chunk in self.then:
                    yield chunk
        except BaseException as exc:
            self.exited_with = exc
            raise
        finally:
            self.closed = True


def response(body: Body, releases: list[int]) -> EventStreamResponse:
    return EventStreamResponse(body(), release=lambda: releases.append(1), headers={"X-Test": "1"})


async def serve(resp: EventStreamResponse, client: Client) -> None:
    """Run the response as uvicorn does: in a task of its own, then go on in that task."""
    await resp({"type": "http"}, client.receive, client.send)
    await asyncio.sleep(0)  # a cancellation left behind would land here


async def test_a_client_going_away_while_the_stream_waits_ends_it_without_a_cancellation_left_behind() -> None:
    async with asyncio.timeout(10):
        client, body, releases = Client(), Body(), []
        task = asyncio.create_task(serve(response(body, releases), client))
        await client.chunk_sent.wait()
        client.gone.set()
        await task  # returns normally: the cancellation was the response's own, and consumed
        assert not task.cancelled()
        assert task.cancelling() == 0
        assert body.closed and isinstance(body.exited_with, asyncio.CancelledError)
        assert releases == [1]
        assert client.body == b"retry: 1000\n\n"
        assert not client.finished  # nobody to finish it for
        start = client.sent[0]
        assert start["type"] == "http.response.start" and start["status"] == 200
        assert (b"content-type", b"text/event-stream; charset=utf-8") in start["headers"]
        assert (b"x-test", b"1") in start["headers"]


async def test_a_cancellation_from_elsewhere_comes_out_of_the_response() -> None:
    async with asyncio.timeout(10):
        client, body, releases = Client(), Body(), []
        task = asyncio.create_task(serve(response(body, releases), client))
        await client.chunk_sent.wait()
        task.cancel()  # the server stopping, say
        with pytest.raises(asyncio.CancelledError):
            await task
        assert task.cancelled()
        assert body.closed
        assert releases == [1]


async def test_a_cancellation_from_elsewhere_is_kept_when_the_client_goes_away_at_the_same_moment() -> None:
    async with asyncio.timeout(10):
        client, body, releases = Client(), Body(), []
        task = asyncio.create_task(serve(response(body, releases), client))
        await client.chunk_sent.wait()
        client.gone.set()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert task.cancelled()
        assert body.closed
        assert releases == [1]


async def test_a_client_going_away_after_the_body_ended_cancels_nothing() -> None:
    class LeavesAtTheEnd(Client):
        async def send(self, message: dict[str, Any]) -> None:
            await super().send(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                self.gone.set()  # hangs up as soon as the response is complete
                for _ in range(3):
                    await asyncio.sleep(0)  # the watcher sees it while the response is finishing

    async with asyncio.timeout(10):
        client, releases = LeavesAtTheEnd(), []
        body = Body(then=["id: 1\nevent: done\ndata: {}\n\n"])
        resp = response(body, releases)

        async def serve_and_keep_going() -> str:
            await resp({"type": "http"}, client.receive, client.send)
            for _ in range(5):
                await asyncio.sleep(0)
            return "went on"

        assert await asyncio.create_task(serve_and_keep_going()) == "went on"
        assert client.finished
        assert body.closed and body.exited_with is None
        assert releases == [1]


async def test_a_client_gone_before_the_first_chunk_ends_the_response_quietly() -> None:
    async with asyncio.timeout(10):
        client, body, releases = Client(), Body(), []
        client.gone.set()
        await asyncio.create_task(serve(response(body, releases), client))
        assert not body.started or body.closed
        assert releases == [1]


async def test_a_whole_body_is_sent_and_finished() -> None:
    async with asyncio.timeout(10):
        client, releases = Client(), []
        body = Body(then=["a", "bc"])
        await asyncio.create_task(serve(response(body, releases), client))
        assert client.body == b"retry: 1000\n\nabc"
        assert client.finished
        assert body.closed and body.exited_with is None
        assert releases == [1]
        await asyncio.sleep(0)  # the watcher's cancellation is processed
        assert "tether-sse-disconnect" not in {t.get_name() for t in asyncio.all_tasks()}


async def test_a_failing_body_fails_the_response_and_still_gives_the_slot_back() -> None:
    async with asyncio.timeout(10):
        client, releases = Client(), []

        async def failing() -> AsyncGenerator[str, None]:
            yield "retry: 1000\n\n"
            raise RuntimeError("the store went away")

        resp = EventStreamResponse(failing(), release=lambda: releases.append(1))
        with pytest.raises(RuntimeError, match="the store went away"):
            await asyncio.create_task(serve(resp, client))
        assert releases == [1]


async def test_many_streams_cut_at_random_moments_all_end_cleanly() -> None:
    rng = random.Random(20261203)
    async with asyncio.timeout(30):
        runs = []
        for _ in range(200):
            client, releases = Client(), []
            body = Body(then=[f"id: {n}\n\n" for n in range(rng.randrange(0, 30))])
            runs.append((client, body, releases, asyncio.create_task(serve(response(body, releases), client))))
        # Cut each one after a random number of loop passes: before, during and after its body.
        for _ in range(40):
            for client, *_ in runs:
                if not client.gone.is_set() and rng.random() < 0.1:
                    client.gone.set()
            await asyncio.sleep(0)
        for client, *_ in runs:
            client.gone.set()
        cut_short = 0
        for client, body, releases, task in runs:
            await task
            cut_short += not client.finished
            assert not task.cancelled()
            assert body.closed or not body.started  # cut before its first chunk: it never ran
            assert releases == [1]
        # The cuts really landed both mid-body and after the end.
        assert 0 < cut_short < len(runs), cut_short


async def test_a_receive_that_fails_ends_the_stream_with_its_error() -> None:
    class Broken(Client):
        async def receive(self) -> dict[str, Any]:
            await self.chunk_sent.wait()
            raise RuntimeError("the connection is in a state nobody expected")

    async with asyncio.timeout(10):
        client, body, releases = Broken(), Body(), []
        with pytest.raises(RuntimeError, match="nobody expected"):
            await asyncio.create_task(serve(response(body, releases), client))
        assert body.closed
        assert releases == [1]


async def test_a_run_stream_sends_retry_with_its_first_events_and_ends_with_its_terminal_event() -> None:
    """A live run's stream, as ``sse_response`` builds it (the store is never read: the
    subscription was open before the first event): ``retry:`` goes out in the same send as the
    run's first events, and the terminal event in the send that ends the response."""
    bus = LocalBus()
    live = bus.open("run_1")
    releases: list[int] = []
    feed = RunFeed(None, bus, "run_1", live=live)  # type: ignore[arg-type]  # a live stream does not read the store
    resp = sse_response(feed, release=lambda: releases.append(1))
    client = Client()
    async with asyncio.timeout(10):
        serving = asyncio.create_task(serve(resp, client))
        bus.publish("run_1", [stored(1, RunStarted(thread_id="thr_1", input_message_id=None)), stored(2, Status(stage="model"))])
        await client.chunk_sent.wait()
        client.chunk_sent.clear()
        bus.publish("run_1", [stored(3, Token(message_id="msg_1", text="hi"))])
        await client.chunk_sent.wait()
        bus.publish("run_1", [stored(4, Done(message_id="msg_1"))])
        await serving
    bodies = [(m["body"].decode(), m["more_body"]) for m in client.sent if m["type"] == "http.response.body"]
    assert [more for _, more in bodies] == [True, True, False]
    first, token, last = (body for body, _ in bodies)
    assert first.startswith("retry: 1000\n\n") and "event: run_started" in first and "event: status" in first
    assert "event: token" in token and last.startswith("id: 4\nevent: done\n")
    assert releases == [1] and bus.subscriber_count("run_1") == 0


def stored(seq: int, event: Event) -> StoredEvent:
    return StoredEvent(seq, event.type, Envelope.encode("run_1", seq, event, now_ts()))
