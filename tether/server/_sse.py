"""Wiring run events into an SSE response (the encoding itself is :mod:`tether.sse`).

Each stream takes a slot (per caller and per process, :class:`~._limits.StreamSlots`) before it
starts and gives it back when it ends, however it ends. Its send buffer is bounded: the live
events waiting for a reader that does not keep up are capped by the bus
(``Limits.stream_buffer_bytes``); a reader that falls further behind gets a final comment
saying so and the stream ends, and the client resumes from its ``Last-Event-ID`` (the log has
every event, so nothing is lost). When the process begins to shut down, every stream ends the
same way, with a comment saying so (:func:`stopping_comment`). Sends are bounded by the
socket's flow control: a reader that does not read holds one chunk, not the run.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Callable, Iterable, Iterator, Mapping
from contextlib import aclosing

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from ..errors import Overloaded
from ..events import TERMINAL_TYPES
from ..runtime import FellBehind, RunFeed, StreamEnded
from ..sse import PING, encode_comment, encode_event, encode_retry
from ..telemetry._histograms import Histogram
from ..telemetry._trace import ts_ns

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", "Connection": "keep-alive"}

#: How long a client should wait before reconnecting (sent as ``retry:``).
RETRY_MS = 1000

#: About how much one send to the socket carries.
_SEND_BYTES = 64 * 1024


def fell_behind_comment(last_seq: int) -> str:
    """The last thing a stream sends to a reader that fell too far behind."""
    return encode_comment(f"disconnected: this reader fell too far behind; reconnect with Last-Event-ID: {last_seq}")


def stopping_comment(last_seq: int) -> str:
    """The last thing a stream sends when its process begins to shut down."""
    return encode_comment(f"disconnected: this server is shutting down; reconnect with Last-Event-ID: {last_seq}")


class _Last(str):
    """The last chunk of a body (its terminal event, or the comment a cut-off stream ends with):
    sent together with the end of the response, in one write to the socket."""

    __slots__ = ()


async def _sse_body(feed: RunFeed, ping_s: float, lag: Histogram | None = None) -> AsyncGenerator[str, None]:
    first = encode_retry(RETRY_MS)
    if not feed.starts_live:
        # A follower's stream: ``retry:`` at once, before anything else is there.
        yield first
        first = ""
    # else a stream of a run this request starts: its first events are there at once, and
    # ``retry:`` goes out with them, one write to the socket less.
    last = feed.after_seq
    try:
        async for batch in feed.follow(idle_timeout=ping_s, stop_when_behind=True):
            ends = bool(batch) and batch[-1].type in TERMINAL_TYPES
            if lag is not None and batch:  # how far behind its run this stream writes
                lag.observe(max(time.time_ns() - ts_ns(batch[-1].envelope), 0) / 1e9)
            if not batch:
                chunks: Iterable[str] = (PING,)
            elif len(batch) == 1:  # a live stream's usual batch: one token
                e = batch[0]
                chunks = (encode_event(e.seq, e.type, e.envelope),)
            else:
                chunks = list(_chunks(encode_event(e.seq, e.type, e.envelope) for e in batch))
            *before, final = chunks
            for chunk in before:
                yield first + chunk
                first = ""
            yield _Last(first + final) if ends else first + final
            first = ""
            last = batch[-1].seq if batch else last
    except FellBehind as behind:
        yield _Last(first + fell_behind_comment(behind.last_seq))
    except StreamEnded as ended:
        yield _Last(first + stopping_comment(ended.last_seq))
    except Overloaded:
        # The store is out of connections: end this stream cleanly; its client comes back.
        yield _Last(first + encode_comment(f"disconnected: the server is busy; reconnect with Last-Event-ID: {last}"))
    if first:  # nothing was sent (the run had ended before the cursor)
        yield first


def _chunks(events: Iterable[str]) -> Iterator[str]:
    """Encoded events joined into sends of about ``_SEND_BYTES`` (whole events only): each send
    adds at most that much to the socket's buffer before flow control makes the next one wait."""
    part: list[str] = []
    size = 0
    for event in events:
        part.append(event)
        size += len(event)
        if size >= _SEND_BYTES:
            yield "".join(part)
            part, size = [], 0
    if part:
        yield "".join(part)


class EventStreamResponse(Response):
    """An event stream: sends what ``content`` yields until it ends or the client goes away.

    What Starlette's ``StreamingResponse`` does for a server that announces ASGI 2.3 (uvicorn),
    with less machinery per stream: one watcher task waits for the client's disconnect and
    cancels the stream's own task, which ends the body at its next ``await`` (a follower then
    only unsubscribes; the run goes on). ``release`` runs when the response ends, however it
    ends. A cancellation from elsewhere (the server stopping) goes on as it came.
    """

    media_type = "text/event-stream"

    def __init__(
        self,
        content: AsyncGenerator[str, None],
        *,
        release: Callable[[], None] | None = None,
        status_code: int = 200,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.body_iterator = content
        self.status_code = status_code
        self.background = None
        self.init_headers(headers)
        self._release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self._stream(receive, send)
        finally:
            if self._release is not None:
                self._release()

    async def _stream(self, receive: Receive, send: Send) -> None:
        task = asyncio.current_task()
        assert task is not None
        gone = False
        broken: Exception | None = None

        async def watch() -> None:
            nonlocal gone, broken
            try:
                while (await receive())["type"] != "http.disconnect":
                    pass  # the rest of a request body nobody reads
            except Exception as exc:  # the server could not tell: the stream cannot go on either
                broken = exc
            gone = True
            task.cancel()

        # Cancelled below before this method returns (no await in between), so it can only
        # cancel the task while the stream is still being sent.
        watcher = asyncio.create_task(watch(), name="tether-sse-disconnect")
        try:
            async with aclosing(self.body_iterator) as body:
                await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
                ended = False
                async for chunk in body:
                    # A body yields nothing after its last chunk (``_Last``), which ends the
                    # response in the same write.
                    assert not ended, "a chunk after the last one"
                    ended = isinstance(chunk, _Last)
                    await send({"type": "http.response.body", "body": chunk.encode(), "more_body": not ended})
                if not ended:
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            # The watcher's cancel, and no one else's: the client went away, the response is over.
            if not gone or task.uncancel() > 0:
                raise
        finally:
            watcher.cancel()
        if broken is not None:
            raise broken


def sse_response(
    feed: RunFeed,
    *,
    release: Callable[[], None],
    ping_s: float = 15.0,
    status_code: int = 200,
    headers: dict[str, str] | None = None,
    lag: Histogram | None = None,
) -> EventStreamResponse:
    """Stream a run's ``feed`` (:meth:`~tether.runtime.Runtime.feed`): replay, live tail, close
    after the terminal event.

    The body ends when the client disconnects; that only unsubscribes, the run goes on.
    ``release`` gives the stream's slot back when the response ends; the feed is closed then
    too (a body that never ran did not close it).
    ``lag`` counts, per written batch, how long after its newest event's emission it is written.
    """

    def release_all() -> None:
        try:
            feed.close()
        finally:
            release()

    return EventStreamResponse(
        _sse_body(feed, ping_s, lag),
        status_code=status_code,
        headers={**SSE_HEADERS, **(headers or {})},
        release=release_all,
    )
