"""Wiring run events into an SSE response (the encoding itself is :mod:`tether.sse`)."""

from __future__ import annotations

from collections.abc import AsyncIterator

from starlette.responses import StreamingResponse

from ..runtime import LocalBus, follow_run
from ..sse import PING, encode_event, encode_retry
from ..store import Store

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", "Connection": "keep-alive"}

#: How long a client should wait before reconnecting (sent as ``retry:``).
RETRY_MS = 1000


async def _sse_body(store: Store, bus: LocalBus, run_id: str, after_seq: int, ping_s: float) -> AsyncIterator[str]:
    yield encode_retry(RETRY_MS)
    async for batch in follow_run(store, bus, run_id, after_seq=after_seq, idle_timeout=ping_s):
        if not batch:
            yield PING
            continue
        yield "".join(encode_event(e.seq, e.type, e.envelope) for e in batch)


def sse_response(
    store: Store, bus: LocalBus, run_id: str, *, after_seq: int, ping_s: float = 15.0, status_code: int = 200, headers: dict[str, str] | None = None
) -> StreamingResponse:
    """Stream ``run_id`` from ``after_seq``: replay, live tail, close after the terminal event.

    Starlette ends the body when the client disconnects; that only unsubscribes, the run goes on.
    """
    return StreamingResponse(
        _sse_body(store, bus, run_id, after_seq, ping_s),
        status_code=status_code,
        media_type="text/event-stream",
        headers={**SSE_HEADERS, **(headers or {})},
    )
