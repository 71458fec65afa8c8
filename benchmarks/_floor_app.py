"""The floor for ``stream_throughput.py``: a bare Starlette SSE endpoint with no store.

``POST /v1/stream?tokens=N`` streams the same events a Tether run of ``{"tokens": N}`` sends
(``retry:``, ``run_started``, ``status``, N ``token`` events, ``done``), with envelopes of the
same shape and size, one chunk per event, from a plain async generator. Everything is encoded
before the response starts, so what is left is the cost of Starlette + uvicorn moving the
bytes: no model, no database, no fan-out.

Served with the uvicorn settings ``tether demo`` uses (see ``tether/cli.py``)::

    python benchmarks/_floor_app.py --port 8001
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from functools import lru_cache

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", "Connection": "keep-alive"}


def _id(prefix: str) -> str:
    # Same length and alphabet as tether._ids.new_id.
    return f"{prefix}_{time.time_ns() // 1000:014x}{os.urandom(6).hex()}"


def _event(run_id: str, seq: int, event_type: str, data: dict[str, object]) -> bytes:
    ts = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    envelope = json.dumps(
        {"run_id": run_id, "seq": seq, "type": event_type, "ts": ts, "data": data},
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return f"id: {seq}\nevent: {event_type}\ndata: {envelope}\n\n".encode()


@lru_cache(maxsize=4)
def _chunks(tokens: int) -> tuple[bytes, ...]:
    """Every chunk of one stream, encoded ahead of time."""
    run_id, message_id = _id("run"), _id("msg")
    chunks = [b"retry: 1000\n\n"]
    chunks.append(_event(run_id, 1, "run_started", {"thread_id": _id("thr"), "input_message_id": _id("msg")}))
    chunks.append(_event(run_id, 2, "status", {"stage": "model", "detail": None}))
    for n in range(1, tokens + 1):
        chunks.append(_event(run_id, n + 2, "token", {"message_id": message_id, "text": f"t{n} "}))
    chunks.append(_event(run_id, tokens + 3, "done", {"message_id": message_id}))
    return tuple(chunks)


async def stream(request: Request) -> StreamingResponse:
    chunks = _chunks(int(request.query_params.get("tokens", "20000")))

    async def body() -> AsyncIterator[bytes]:
        for chunk in chunks:
            yield chunk

    return StreamingResponse(body(), media_type="text/event-stream", headers=SSE_HEADERS)


async def prepare(request: Request) -> JSONResponse:
    """Encode a stream ahead of time, so the timed request only moves bytes."""
    chunks = _chunks(int(request.query_params.get("tokens", "20000")))
    return JSONResponse({"events": len(chunks) - 1, "bytes": sum(map(len, chunks))})


async def healthz(request: Request) -> JSONResponse:
    return JSONResponse({"status": "ok"})


app = Starlette(
    routes=[
        Route("/v1/stream", stream, methods=["POST"]),
        Route("/v1/prepare", prepare, methods=["POST"]),
        Route("/healthz", healthz),
    ]
)


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args()
    # The same call as tether.cli._run_server.
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, timeout_graceful_shutdown=3)


if __name__ == "__main__":
    main()
