"""``FakeProvider``: a test double of a model provider that speaks OpenAI's Chat Completions API.

It is a real HTTP server (Starlette under uvicorn, on an ephemeral port of 127.0.0.1, in a
background thread), so the code under test talks HTTP through the real ``openai`` client and
its connection pool, and a closed connection is a real closed socket. In-process ASGI test
clients buffer the whole body and cannot show whether a cancelled consumer closed the upstream
request; this server can.

Program it with :class:`Turn`\\ s, one per request, in order; each streams reasoning, then text,
then tool calls (split into argument fragments, interleaved across calls, so the client has to
assemble them by ``index``), or answers with an HTTP error (with ``Retry-After`` if asked), or
fails mid-stream: the connection dropped after ``drop_after`` chunks, or silence after
``stall_after`` chunks. When the turns run out it answers ``"ok"``. Every request body is kept
in :attr:`FakeProvider.requests`.

It records disconnects: when the client closes the connection before the stream ended, the
server notices (by checking ``request.is_disconnected()`` between chunks, or by its streaming
body being cancelled when Starlette sees ``http.disconnect``) and records a :class:`Disconnect`
with the time and the number of chunks it had sent. :meth:`FakeProvider.wait_for_disconnect`
waits for one from any thread.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Self, TypeVar

import anyio
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

__all__ = ["Disconnect", "FakeProvider", "FakeToolCall", "ServedDouble", "Turn", "long_turn"]

TurnT = TypeVar("TurnT")


@dataclass(frozen=True)
class FakeToolCall:
    """A tool call the fake model asks for; ``arguments`` is streamed in ``fragments`` pieces."""

    id: str | None
    name: str
    arguments: str
    fragments: int = 3


@dataclass(frozen=True)
class Turn:
    """What the fake model answers to one request."""

    text: Sequence[str] = ()
    reasoning: Sequence[str] = ()
    #: The delta field reasoning is streamed in (``reasoning_content`` like DeepSeek, or ``reasoning``).
    reasoning_field: str = "reasoning_content"
    tool_calls: Sequence[FakeToolCall] = ()
    #: Pause before each chunk, in seconds.
    delay_s: float = 0.0
    #: Answer with this HTTP error status instead of a stream.
    error_status: int | None = None
    error_message: str = "fake provider error"
    #: Sent as the ``retry-after`` header of an error response.
    retry_after: str | None = None
    #: Close the connection after this many chunks (0: before the first).
    drop_after: int | None = None
    #: Send nothing more after this many chunks (until the client goes away).
    stall_after: int | None = None
    #: The trailing usage chunk (sent when the client asks with ``stream_options``).
    usage: tuple[int, int] = (11, 7)
    #: The last chunk's ``finish_reason`` (default: ``tool_calls`` with calls, else ``stop``);
    #: ``"length"`` plays a turn cut off by the token limit.
    finish_reason: str | None = None


def long_turn(chunks: int = 10_000, delay_s: float = 0.005) -> Turn:
    """A text turn long enough (about 50 s by default) that a cancel always cuts it mid-way."""
    return Turn(text=[f"t{n} " for n in range(1, chunks + 1)], delay_s=delay_s)


@dataclass(frozen=True)
class Disconnect:
    """The client closed the connection before the stream ended."""

    at: float  # time.monotonic() when the server noticed
    chunks_sent: int  # chunks handed to the server before it noticed
    chunks_total: int  # chunks the whole stream would have had
    request_index: int  # position of the request in FakeProvider.requests


@dataclass
class _State(Generic[TurnT]):
    turns: list[TurnT] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)
    disconnects: list[Disconnect] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    disconnected: threading.Condition = field(init=False)

    def __post_init__(self) -> None:
        self.disconnected = threading.Condition(self.lock)


class ServedDouble(Generic[TurnT]):
    """What every provider double shares: a real HTTP server in a background thread, a queue
    of programmed turns, and the record of requests, arrival times and client disconnects.

    A subclass names its ``path``, the ``url_suffix`` its clients put after the host, its
    ``default_turn`` (when the programmed turns run out), and serves requests in ``_endpoint``,
    taking each request's turn with :meth:`_receive`.
    """

    path: ClassVar[str]
    url_suffix: ClassVar[str] = ""
    thread_name: ClassVar[str] = "fake-provider"

    def __init__(self, turns: Sequence[TurnT] = ()) -> None:
        self._state: _State[TurnT] = _State(turns=list(turns))
        app = Starlette(routes=[Route(self.path, self._endpoint, methods=["POST"])])
        config = uvicorn.Config(
            app,
            host="127.0.0.1",
            port=0,
            log_level="critical",  # a dropped connection (a fault it plays) is not an error here
            lifespan="off",
            # Do not wait for a long stream nobody reads when the test is over.
            timeout_graceful_shutdown=1,
        )
        self._server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None
        self.base_url = ""

    def default_turn(self) -> TurnT:
        raise NotImplementedError

    async def _endpoint(self, request: Request) -> Response:
        raise NotImplementedError

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> Self:
        """Start serving in a background thread; returns once the port is known."""
        self._thread = threading.Thread(target=self._server.run, name=self.thread_name, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("fake provider did not start")
            time.sleep(0.005)  # a thread's start-up, polled from the test's thread
        port = self._server.servers[0].sockets[0].getsockname()[1]
        self.base_url = f"http://127.0.0.1:{port}{self.url_suffix}"
        return self

    def stop(self) -> None:
        """Stop the server and wait for its thread."""
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- programming and inspecting ----------------------------------------------------

    def add(self, *turns: TurnT) -> None:
        """Queue answers for the next requests."""
        with self._state.lock:
            self._state.turns.extend(turns)

    @property
    def requests(self) -> list[dict[str, Any]]:
        """The JSON bodies received so far, oldest first."""
        with self._state.lock:
            return list(self._state.requests)

    @property
    def arrivals(self) -> list[float]:
        """``time.monotonic()`` at each request's arrival, oldest first."""
        with self._state.lock:
            return list(self._state.arrivals)

    @property
    def disconnects(self) -> list[Disconnect]:
        """The disconnects noticed so far, oldest first."""
        with self._state.lock:
            return list(self._state.disconnects)

    def wait_for_disconnect(self, timeout: float) -> Disconnect:
        """Block until a client disconnect mid-stream is noticed; the first one. Raises on timeout."""
        with self._state.disconnected:
            if not self._state.disconnected.wait_for(lambda: self._state.disconnects, timeout=timeout):
                raise TimeoutError(f"the fake provider saw no disconnect within {timeout} s")
            return self._state.disconnects[0]

    def _receive(self, body: dict[str, Any]) -> tuple[int, TurnT]:
        """Record a request; its index and the turn that answers it."""
        with self._state.lock:
            self._state.requests.append(body)
            self._state.arrivals.append(time.monotonic())
            turn = self._state.turns.pop(0) if self._state.turns else self.default_turn()
            return len(self._state.requests) - 1, turn

    def _disconnected(self, sent: int, total: int, request_index: int) -> None:
        """Record that the client went away after ``sent`` of ``total`` chunks."""
        with self._state.disconnected:
            self._state.disconnects.append(Disconnect(time.monotonic(), sent, total, request_index))
            self._state.disconnected.notify_all()


class FakeProvider(ServedDouble[Turn]):
    """An OpenAI-compatible HTTP server for tests: ``with FakeProvider() as provider: ...``."""

    path = "/v1/chat/completions"
    url_suffix = "/v1"
    thread_name = "fake-openai-provider"

    def default_turn(self) -> Turn:
        return Turn(text=["ok"])

    # -- the endpoint ------------------------------------------------------------------

    async def _endpoint(self, request: Request) -> Response:
        body = await request.json()
        request_index, turn = self._receive(body)
        if turn.error_status is not None:
            error = {"message": turn.error_message, "type": "fake_error", "code": str(turn.error_status)}
            headers = {"retry-after": turn.retry_after} if turn.retry_after is not None else None
            return JSONResponse({"error": error}, status_code=turn.error_status, headers=headers)
        chunks = _chunks(turn, model=str(body.get("model", "fake")), usage=bool((body.get("stream_options") or {}).get("include_usage")))
        return StreamingResponse(
            self._stream(request, chunks, turn, request_index),
            media_type="text/event-stream",
        )

    async def _stream(self, request: Request, chunks: list[str], turn: Turn, request_index: int) -> AsyncIterator[str]:
        sent = 0
        finished = False
        try:
            for chunk in chunks:
                if turn.drop_after is not None and sent >= turn.drop_after:
                    finished = True  # the provider's own doing, not a client disconnect
                    raise _DropConnection
                if turn.stall_after is not None and sent >= turn.stall_after:
                    await anyio.sleep(3600)  # cancelled when the client goes away
                await anyio.sleep(turn.delay_s)
                if await request.is_disconnected():
                    return
                yield chunk
                sent += 1
            finished = True
        finally:
            # Reached by return above, or by cancellation when Starlette's disconnect listener
            # hears http.disconnect first.
            if not finished:
                self._disconnected(sent, len(chunks), request_index)


class _DropConnection(Exception):
    """Raised inside a streaming body: uvicorn then closes the connection mid-response."""


def _chunks(turn: Turn, *, model: str, usage: bool = False) -> list[str]:
    """The SSE frames of one streamed answer, ending with ``data: [DONE]``."""
    created = int(time.time())

    def frame(delta: dict[str, Any], finish_reason: str | None = None) -> str:
        chunk = {
            "id": "chatcmpl-fake",
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
        }
        return f"data: {json.dumps(chunk)}\n\n"

    frames = [frame({"role": "assistant", "content": ""})]
    frames += [frame({turn.reasoning_field: piece}) for piece in turn.reasoning]
    frames += [frame({"content": piece}) for piece in turn.text]
    # Every call opens with its id and name; then argument fragments, interleaved across calls.
    for index, call in enumerate(turn.tool_calls):
        opening: dict[str, Any] = {"index": index, "type": "function", "function": {"name": call.name, "arguments": ""}}
        if call.id is not None:
            opening["id"] = call.id
        frames.append(frame({"tool_calls": [opening]}))
    pieces = [_split(call.arguments, call.fragments) for call in turn.tool_calls]
    for round_ in range(max((len(p) for p in pieces), default=0)):
        for index, fragments in enumerate(pieces):
            if round_ < len(fragments):
                frames.append(frame({"tool_calls": [{"index": index, "function": {"arguments": fragments[round_]}}]}))
    frames.append(frame({}, finish_reason=turn.finish_reason or ("tool_calls" if turn.tool_calls else "stop")))
    if usage:
        prompt, completion = turn.usage
        usage_chunk = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": created, "model": model, "choices": []}
        usage_chunk["usage"] = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
        frames.append(f"data: {json.dumps(usage_chunk)}\n\n")
    frames.append("data: [DONE]\n\n")
    return frames


def _split(text: str, parts: int) -> list[str]:
    size = max(1, -(-len(text) // max(1, parts)))
    return [text[i : i + size] for i in range(0, len(text), size)]
