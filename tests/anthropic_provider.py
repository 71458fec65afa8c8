"""``FakeAnthropic``: a test double of a model provider that speaks Anthropic's Messages API.

Like :mod:`tests.openai_provider`, it is a real HTTP server (Starlette under uvicorn on an
ephemeral port of 127.0.0.1, in a background thread), so the code under test goes through the
real ``anthropic`` SDK, its HTTP client and a real socket, and a closed connection is a real
closed socket.

Program it with :class:`Turn`\\ s, one per request, in order. A turn streams the events the real
API sends (``message_start``, then per content block ``content_block_start`` /
``content_block_delta``… / ``content_block_stop``, then ``message_delta`` with the usage and
``message_stop``): a thinking block (thinking deltas, then a signature delta), a text block, and a
``tool_use`` block per call whose JSON input is split into ``input_json_delta`` fragments.

Faults: an HTTP error (``error_status`` with Anthropic's error body and an optional
``Retry-After``), an ``error`` event in the middle of the stream (how Anthropic reports
``overloaded_error`` once streaming began), a connection dropped after ``drop_after`` frames
(0: before any), and a provider that goes silent after ``stall_after`` frames.

Every request body is kept in :attr:`FakeAnthropic.requests`, with the time it arrived in
:attr:`FakeAnthropic.arrivals`. A client that closes the connection before the stream ended is
recorded as a :class:`~tests.openai_provider.Disconnect` with the frames sent so far.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from .openai_provider import FakeToolCall, ServedDouble, _split

__all__ = ["FakeAnthropic", "Turn", "long_turn"]


class _DropConnection(Exception):
    """Raised inside a streaming body: uvicorn then closes the connection mid-response."""


@dataclass(frozen=True)
class Turn:
    """What the fake model answers to one request."""

    text: Sequence[str] = ()
    thinking: Sequence[str] = ()
    signature: str = "sig-fake"
    tool_calls: Sequence[FakeToolCall] = ()
    #: Pause before each frame, in seconds.
    delay_s: float = 0.0
    input_tokens: int = 42
    #: Answer with this HTTP error status instead of a stream.
    error_status: int | None = None
    error_type: str = "api_error"
    error_message: str = "fake provider error"
    #: Sent as the ``retry-after`` header of an error response.
    retry_after: str | None = None
    #: Send an ``error`` event of ``error_type`` after this many frames.
    error_event_after: int | None = None
    #: Close the connection after this many frames (0: before the first).
    drop_after: int | None = None
    #: Send nothing more after this many frames (until the client goes away).
    stall_after: int | None = None
    #: The ``message_delta``'s ``stop_reason`` (default: ``tool_use`` with calls, else
    #: ``end_turn``); ``"max_tokens"`` plays a message cut off by the token limit.
    stop_reason: str | None = None


def long_turn(chunks: int = 10_000, delay_s: float = 0.005) -> Turn:
    """A text turn long enough (about 50 s by default) that a cancel always cuts it mid-way."""
    return Turn(text=[f"t{n} " for n in range(1, chunks + 1)], delay_s=delay_s)


class FakeAnthropic(ServedDouble[Turn]):
    """An Anthropic Messages API server for tests: ``with FakeAnthropic() as provider: ...``."""

    path = "/v1/messages"
    thread_name = "fake-anthropic"

    def default_turn(self) -> Turn:
        return Turn(text=["ok"])

    async def _endpoint(self, request: Request) -> Response:
        body = await request.json()
        request_index, turn = self._receive(body)
        if turn.error_status is not None:
            headers = {"retry-after": turn.retry_after} if turn.retry_after is not None else None
            error = {"type": "error", "error": {"type": turn.error_type, "message": turn.error_message}}
            return JSONResponse(error, status_code=turn.error_status, headers=headers)
        frames = _frames(turn, model=str(body.get("model", "fake")))
        return StreamingResponse(self._stream(request, turn, frames, request_index), media_type="text/event-stream")

    async def _stream(self, request: Request, turn: Turn, frames: list[str], request_index: int) -> AsyncIterator[str]:
        sent = 0
        finished = False
        try:
            for frame in frames:
                if turn.drop_after is not None and sent >= turn.drop_after:
                    finished = True  # the provider's own doing, not a client disconnect
                    raise _DropConnection
                if turn.error_event_after is not None and sent >= turn.error_event_after:
                    finished = True
                    yield _sse("error", {"type": "error", "error": {"type": turn.error_type, "message": turn.error_message}})
                    return
                if turn.stall_after is not None and sent >= turn.stall_after:
                    await anyio.sleep(3600)  # cancelled when the client goes away
                await anyio.sleep(turn.delay_s)
                if await request.is_disconnected():
                    return
                yield frame
                sent += 1
            finished = True
        finally:
            if not finished:
                self._disconnected(sent, len(frames), request_index)


def _sse(event: str, data: dict[str, Any]) -> str:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n"


def _frames(turn: Turn, *, model: str) -> list[str]:
    """The SSE frames of one streamed message, as the Messages API sends them."""
    frames: list[str] = []
    output_tokens = 0
    message = {
        "id": "msg_fake",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": turn.input_tokens, "output_tokens": 1},
    }
    frames.append(_sse("message_start", {"type": "message_start", "message": message}))
    index = 0

    def block(start: dict[str, Any], deltas: list[dict[str, Any]]) -> None:
        nonlocal index, output_tokens
        frames.append(_sse("content_block_start", {"type": "content_block_start", "index": index, "content_block": start}))
        for delta in deltas:
            frames.append(_sse("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}))
            output_tokens += 1
        frames.append(_sse("content_block_stop", {"type": "content_block_stop", "index": index}))
        index += 1

    if turn.thinking:
        deltas = [{"type": "thinking_delta", "thinking": piece} for piece in turn.thinking]
        block({"type": "thinking", "thinking": "", "signature": ""}, [*deltas, {"type": "signature_delta", "signature": turn.signature}])
    if turn.text:
        block({"type": "text", "text": ""}, [{"type": "text_delta", "text": piece} for piece in turn.text])
    for n, call in enumerate(turn.tool_calls):
        start = {"type": "tool_use", "id": call.id or f"toolu_fake{n}", "name": call.name, "input": {}}
        block(start, [{"type": "input_json_delta", "partial_json": piece} for piece in _split(call.arguments, call.fragments)])
    stop_reason = turn.stop_reason or ("tool_use" if turn.tool_calls else "end_turn")
    frames.append(_sse("ping", {"type": "ping"}))
    frames.append(
        _sse(
            "message_delta", {"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": None}, "usage": {"output_tokens": output_tokens}}
        )
    )
    frames.append(_sse("message_stop", {"type": "message_stop"}))
    return frames
