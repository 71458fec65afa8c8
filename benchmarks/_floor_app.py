"""The floor: a bare Starlette SSE endpoint with no model, no store and no fan-out.

With ``--db sqlite:///PATH`` or ``--db postgresql://…`` it is the *durable floor*: every event
is written to that database (``benchmarks/_durable.py``: group commit, WAL and
``synchronous=NORMAL`` on SQLite) and sent only once its commit returned.

``POST /v1/stream?tokens=N`` streams the events a Tether run of the script
``{"tokens": N}`` sends (``retry:``, ``run_started``, ``status``, N ``token`` events, ``done``),
with envelopes of the same shape and size (ids of the same length and alphabet, timestamps of
the same format), from a plain async generator. The envelopes are encoded before the response
starts, so what is left is the cost of Starlette + uvicorn moving the bytes. Query parameters:

- ``batch=1`` writes the way Tether's SSE does (``tether/server/_sse.py``, ``_chunks``): the
  events that are ready are joined into sends of about 64 KiB, whole events only. ``batch=0``
  (the default, what ``stream_throughput.py`` measures) writes one send per event. For a
  zero-delay stream every event is ready at once, so the batched floor sends
  ``retry:`` and then sends of ≥ 64 KiB; with a delay each token is ready alone and both modes
  write one send per token.
- ``delay_ms=D`` paces the tokens D ms apart as the scripted model's ``delay_ms`` does: on the
  stream's own clock (token n due n × D ms after the first token's wait began; one already due
  goes at once), or with ``pace=gap`` D ms after each token was sent.
- ``id=X`` names the stream, so that ``POST /v1/signal?id=X&kind=cancel`` can end it: the
  stream stops before its next token and sends a ``cancelled`` event (the shape of Tether's),
  and ``kind=resume`` wakes a parked stream. That request's round trip to the terminal
  event is the floor of Tether's cancel and approve latencies.
- ``park=1`` makes the stream send a ``tool_call`` and an ``interrupt`` event after ``status``
  and wait for ``kind=resume``; it then sends ``resumed``, the tokens and ``done``.

Served with the uvicorn settings ``tether demo`` uses (see ``tether/cli.py``)::

    python benchmarks/_floor_app.py --port 8001
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import signal as signals_module
import socket
import sys
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Iterator
from contextlib import aclosing, asynccontextmanager
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

if TYPE_CHECKING:
    from _durable import DurableWriter

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", "Connection": "keep-alive"}

#: About how much one send carries when batching, as in ``tether/server/_sse.py``.
SEND_BYTES = 64 * 1024


def _id(prefix: str) -> str:
    # Same length and alphabet as tether._ids.new_id.
    return f"{prefix}_{time.time_ns() // 1000:014x}{os.urandom(6).hex()}"


def _ts() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _event(run_id: str, seq: int, event_type: str, data: dict[str, object]) -> bytes:
    envelope = json.dumps({"run_id": run_id, "seq": seq, "type": event_type, "ts": _ts(), "data": data}, separators=(",", ":"), ensure_ascii=False)
    return f"id: {seq}\nevent: {event_type}\ndata: {envelope}\n\n".encode()


class _Events:
    """Every event of one stream, encoded ahead of time (shared by the streams of one size:
    the floor moves bytes, it does not need fresh ids)."""

    def __init__(self, tokens: int, park: bool) -> None:
        self.run_id, self.message_id = _id("run"), _id("msg")
        run_id = self.run_id
        self.head = [_event(run_id, 1, "run_started", {"thread_id": _id("thr"), "input_message_id": _id("msg")})]
        self.head.append(_event(run_id, 2, "status", {"stage": "model", "detail": None, "discard_message_id": None}))
        seq = 3
        self.parked: list[bytes] = []
        self.resumed: list[bytes] = []
        if park:
            call = {"call_id": "call_" + os.urandom(8).hex(), "name": "refund", "args": {"order_id": "A1", "amount": 1.0}, "risk": "destructive"}
            interrupt_id = _id("int")
            self.parked.append(_event(run_id, seq, "tool_call", {**call, "gated": True, "message_id": self.message_id}))
            action = {"call_id": call["call_id"], "action": "refund", "args": call["args"], "description": "Refund 1.0 on order A1", "risk": "destructive"}
            self.parked.append(
                _event(
                    run_id,
                    seq + 1,
                    "interrupt",
                    {
                        "interrupt_id": interrupt_id,
                        "action_requests": [action],
                        "review_configs": [{"allowed_decisions": ["approve", "reject", "edit"]}],
                        "expires_at": _ts(),
                    },
                )
            )
            decision = {"call_id": call["call_id"], "decision": "approve"}
            self.resumed.append(
                _event(run_id, seq + 2, "resumed", {"interrupt_id": interrupt_id, "resolution": "decided", "decisions": [decision], "actor": "local"})
            )
            seq += 3
        self.tokens = [_event(run_id, seq + n, "token", {"message_id": self.message_id, "text": f"t{n + 1} "}) for n in range(tokens)]
        self.next_seq = seq + tokens
        # As Tether's: the scripted model reports no token counts, so its usage is zero.
        self.done = _event(run_id, self.next_seq, "done", {"message_id": self.message_id, "usage": {"input_tokens": 0, "output_tokens": 0}})

    def cancelled(self, seq: int) -> bytes:
        return _event(self.run_id, seq, "cancelled", {"mode": "soft", "reason": None, "actor": "local", "partial_message_id": self.message_id})


@lru_cache(maxsize=16)
def _events(tokens: int, park: bool = False) -> _Events:
    return _Events(tokens, park)


def _groups(events: Iterable[bytes]) -> Iterator[list[bytes]]:
    """Events in groups of about ``SEND_BYTES`` (whole events only), as Tether's SSE sends them."""
    part: list[bytes] = []
    size = 0
    for event in events:
        part.append(event)
        size += len(event)
        if size >= SEND_BYTES:
            yield part
            part, size = [], 0
    if part:
        yield part


def _meta(event: bytes) -> tuple[int, str, bytes]:
    """``(seq, type, event)`` of an encoded SSE event (``id: SEQ\nevent: TYPE\n…``)."""
    head = event.split(b"\n", 2)
    return int(head[0][4:]), head[1][7:].decode(), event


#: The durable floor's writer (``--db``), None for the floor that only moves bytes.
WRITER: DurableWriter | None = None


class _Signals:
    """The named streams a ``/v1/signal`` request can reach."""

    def __init__(self) -> None:
        self.cancelled = False
        self.resumed = False
        self._waiter: asyncio.Future[None] | None = None

    def wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def wait(self, seconds: float | None) -> None:
        """Wait ``seconds`` (forever with None), or less if woken."""
        loop = asyncio.get_running_loop()
        self._waiter = loop.create_future()
        handle = loop.call_later(seconds, self.wake) if seconds is not None else None
        try:
            await self._waiter
        finally:
            if handle is not None:
                handle.cancel()
            self._waiter = None


STREAMS: dict[str, _Signals] = {}


class EventStream(Response):
    """Sends what ``body`` yields, as Tether's event streams are sent
    (``tether/server/_sse.py``, ``EventStreamResponse``): one task per stream waits for the
    client's disconnect and cancels the stream's task, instead of Starlette's
    ``StreamingResponse`` with its task group per stream, which Tether does not pay either."""

    media_type = "text/event-stream"

    def __init__(self, body: AsyncGenerator[bytes, None]) -> None:
        self.body_iterator = body
        self.status_code = 200
        self.background = None
        self.init_headers(SSE_HEADERS)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        task = asyncio.current_task()
        assert task is not None
        gone = False

        async def watch() -> None:
            nonlocal gone
            while (await receive())["type"] != "http.disconnect":
                pass
            gone = True
            task.cancel()

        watcher = asyncio.create_task(watch())
        try:
            async with aclosing(self.body_iterator) as body:
                await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
                async for chunk in body:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if not gone or task.uncancel() > 0:
                raise
        finally:
            watcher.cancel()


async def stream(request: Request) -> EventStream:
    q = request.query_params
    tokens = int(q.get("tokens", "20000"))
    delay = float(q.get("delay_ms", "0")) / 1000
    batch = q.get("batch", "0") == "1"
    park = q.get("park", "0") == "1"
    gap = q.get("pace", "clock") == "gap"
    name = q.get("id") or _id("floor")
    events = _events(tokens, park)
    # Durable: the rows of each stream under a key of its own (the envelopes stay the shared,
    # pre-encoded ones, of the same size: the floor moves and stores bytes, it does not encode).
    row_key = _id("run")
    signals = STREAMS[name] = _Signals()

    async def sends(ready: list[bytes]) -> AsyncIterator[bytes]:
        groups = list(_groups(ready)) if batch or WRITER is not None else [[e] for e in ready]
        if WRITER is None:
            for group in groups:
                yield b"".join(group)
            return
        # Durable before sent; the next group's commit is queued before this one's is awaited.
        writer = WRITER
        durable = writer.write(row_key, [_meta(e) for e in groups[0]])
        for i, group in enumerate(groups):
            following = writer.write(row_key, [_meta(e) for e in groups[i + 1]]) if i + 1 < len(groups) else None
            await durable
            if batch:
                yield b"".join(group)
            else:
                for event in group:
                    yield event
            if following is not None:
                durable = following

    async def body() -> AsyncGenerator[bytes, None]:
        try:
            yield b"retry: 1000\n\n"
            if not delay and not park and WRITER is None:
                async for chunk in sends([*events.head, *events.tokens, events.done]):
                    yield chunk
                return
            if not delay and not park:  # durable: the start commits alone, as a run's start does
                async for chunk in sends(events.head):
                    yield chunk
                async for chunk in sends([*events.tokens, events.done]):
                    yield chunk
                return
            async for chunk in sends(events.head):
                yield chunk
            if park:
                async for chunk in sends(events.parked):
                    yield chunk
                while not (signals.resumed or signals.cancelled):
                    await signals.wait(None)
                if signals.cancelled:
                    async for chunk in sends([events.cancelled(events.next_seq - tokens - 1)]):  # in place of ``resumed``
                        yield chunk
                    return
                async for chunk in sends(events.resumed):
                    yield chunk
            loop = asyncio.get_running_loop()
            start = loop.time()
            if WRITER is not None:
                # Durable and paced: tokens are written at their due time whatever the commits
                # are doing (as Tether's model produces while its event log commits), each sent
                # once durable, in order.
                writer = WRITER
                queued: asyncio.Queue[tuple[asyncio.Future[None], bytes] | None] = asyncio.Queue()

                def put(event: bytes) -> None:
                    queued.put_nowait((writer.write(row_key, [_meta(event)]), event))

                async def produce() -> None:
                    for n, token in enumerate(events.tokens):
                        if delay:
                            await signals.wait(delay if gap else max(0.0, start + (n + 1) * delay - loop.time()))
                        if signals.cancelled:
                            put(events.cancelled(events.next_seq - tokens + n))
                            break
                        put(token)
                    else:
                        put(events.done)
                    queued.put_nowait(None)

                producer = asyncio.create_task(produce())
                try:
                    while (item := await queued.get()) is not None:
                        await item[0]
                        yield item[1]
                finally:
                    producer.cancel()
                return
            for n, token in enumerate(events.tokens):
                if delay:
                    await signals.wait(delay if gap else max(0.0, start + (n + 1) * delay - loop.time()))
                if signals.cancelled:
                    async for chunk in sends([events.cancelled(events.next_seq - tokens + n)]):
                        yield chunk
                    return
                async for chunk in sends([token]):
                    yield chunk
            async for chunk in sends([events.done]):
                yield chunk
        finally:
            STREAMS.pop(name, None)

    return EventStream(body())


async def signal(request: Request) -> JSONResponse:
    """Cancel (``kind=cancel``) or resume (``kind=resume``) the stream ``id``."""
    signals = STREAMS.get(request.query_params.get("id", ""))
    if signals is None:
        return JSONResponse({"error": {"code": "not_found"}}, status_code=404)
    if request.query_params.get("kind") == "resume":
        signals.resumed = True
    else:
        signals.cancelled = True
    signals.wake()
    return JSONResponse({"status": "ok"}, status_code=202)


async def prepare(request: Request) -> JSONResponse:
    """Encode a stream ahead of time, so the timed request only moves bytes."""
    events = _events(int(request.query_params.get("tokens", "20000")))
    return JSONResponse({"events": len(events.head) + len(events.tokens) + 1, "bytes": sum(map(len, [*events.head, *events.tokens, events.done])) + 13})


async def healthz(request: Request) -> JSONResponse:
    return JSONResponse({"status": "ok"})


@asynccontextmanager
async def lifespan(_app: Starlette) -> AsyncIterator[None]:
    if WRITER is not None:
        await WRITER.open()
    try:
        yield
    finally:
        if WRITER is not None:
            await WRITER.aclose()


app = Starlette(
    lifespan=lifespan,
    routes=[
        Route("/v1/stream", stream, methods=["POST"]),
        Route("/v1/signal", signal, methods=["POST"]),
        Route("/v1/prepare", prepare, methods=["POST"]),
        Route("/healthz", healthz),
    ],
)


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--db", default=None, help="the durable floor: write every event to this sqlite:///PATH or postgresql:// database before sending it")
    parser.add_argument("--workers", type=int, default=1, help="processes on the port, each listening with SO_REUSEPORT (as tether serve --workers)")
    args = parser.parse_args()
    if args.db:
        global WRITER
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from _durable import DurableWriter

        WRITER = DurableWriter(args.db)
    # The same call as tether._launch.serve_agent (the limits Tether adds do not bind here), on the
    # same event loop: uvloop accepting a burst of connections at once (tether/server/_loop.py,
    # loaded from its file: it needs only uvloop, and the floor imports nothing of Tether's).
    spec = importlib.util.spec_from_file_location("_tether_loop", Path(__file__).resolve().parents[1] / "tether" / "server" / "_loop.py")
    assert spec is not None and spec.loader is not None
    sys.modules["_tether_loop"] = module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    settings: dict[str, Any] = {
        "log_level": args.log_level,
        "timeout_graceful_shutdown": 3,
        "timeout_keep_alive": 5,
        "backlog": 2048,
        "loop": "_tether_loop:new_event_loop",
    }
    if args.workers <= 1:
        uvicorn.run(app, host=args.host, port=args.port, **settings)
        return
    _serve_workers(args.workers, args.host, args.port, lambda sock: uvicorn.Server(uvicorn.Config(app, **settings)).run(sockets=[sock]))


def _serve_workers(count: int, host: str, port: int, serve: Callable[[socket.socket], None]) -> None:
    """``count`` forked processes, each serving its own ``SO_REUSEPORT`` socket on ``host:port``
    (as ``tether/_workers.py`` does, without its restarts); SIGTERM or SIGINT is passed on."""

    def listening() -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        return sock

    held = listening()  # holds the port; never listens
    children: list[int] = []
    for _ in range(count):
        pid = os.fork()
        if pid == 0:
            held.close()
            sock = listening()
            sock.listen(2048)
            code = 0
            try:
                serve(sock)
            except BaseException:
                code = 1
            os._exit(code)
        children.append(pid)

    def forward(sig: int, _frame: object) -> None:
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signals_module.SIGTERM)

    signals_module.signal(signals_module.SIGTERM, forward)
    signals_module.signal(signals_module.SIGINT, forward)
    for pid in children:
        os.waitpid(pid, 0)


if __name__ == "__main__":
    main()
