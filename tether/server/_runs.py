"""Run routes: start (JSON or streamed), read, events (SSE or JSON page), cancel."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import JSONResponse, Response

from ..errors import InvalidRequest, LimitExceeded
from ._deps import (
    access_of,
    actor_of,
    caller_of,
    incoming_trace_of,
    limits_of,
    run_admission_of,
    run_start_buckets_of,
    runtime_of,
    sse_ping_s_of,
    store_of,
    stream_slots_of,
    telemetry_of,
)
from ._limits import check_rate
from ._openapi import EVENT_STREAM
from ._schemas import CancelRun, CreateRun, SteeringMessage
from ._sse import sse_response
from ._views import load_run_view, queued_message_view, run_view

router = APIRouter(tags=["runs"])

#: The largest seq a run can have (the column is a 32-bit INTEGER on PostgreSQL). Bounding the
#: cursor here keeps an absurd ``after_seq`` a 422 instead of a database overflow (a 500).
MAX_SEQ = 2**31 - 1


def wants_event_stream(request: Request) -> bool:
    """True when the client asked for ``text/event-stream``."""
    return "text/event-stream" in request.headers.get("accept", "")


@router.post("/v1/threads/{thread_id}/runs", status_code=202, response_model=None, responses={200: EVENT_STREAM})
async def create_run(request: Request, thread_id: str, body: CreateRun) -> Response:
    """Start a run on a thread: 202 with the run, or its event stream with ``Accept: text/event-stream``.

    429 ``rate_limited`` past the run starts per minute of the caller, 429
    ``too_many_active_runs`` while the caller has as many runs active as allowed.
    """
    runtime = runtime_of(request)
    # A few run starts at a time: a crowd of new runs must not queue the runs already under
    # way (their writes and connections) behind all of its own.
    async with run_admission_of(request):
        caller = caller_of(request)
        # The access check and the caller's active runs: one read.
        _thread, active = await access_of(request).thread_to_start(thread_id, requested_by=caller)
        check_rate(run_start_buckets_of(request), caller, "run starts")
        limit = limits_of(request).max_active_runs_per_caller
        if active >= limit:
            raise LimitExceeded(
                f"you already have {active} runs queued or running; at most {limit} at once",
                code="too_many_active_runs",
                retry_after_s=5.0,
                details={"limit": limit},
            )
        attach = body.attach()
        if not wants_event_stream(request):
            with incoming_trace_of(request):  # the caller's traceparent: the run's parent
                run = await runtime.start_run(thread_id, attach=attach, config=body.config, requester=caller)
            return JSONResponse(run_view(run), status_code=202, headers=_started_headers(run.id))
        release = stream_slots_of(request).acquire(caller)
        try:
            # The stream follows the run from before it exists: it gets every event, and
            # begins without reading the store back.
            with incoming_trace_of(request):  # the caller's traceparent: the run's parent
                run, feed = await runtime.start_followed_run(thread_id, attach=attach, config=body.config, requester=caller)
        except BaseException:
            release()
            raise
    lag = telemetry_of(request).histograms.stream_lag
    return sse_response(feed, release=release, ping_s=sse_ping_s_of(request), headers=_started_headers(run.id), lag=lag)


def _started_headers(run_id: str) -> dict[str, str]:
    return {"Location": f"/v1/runs/{run_id}", "X-Run-Id": run_id}


@router.get("/v1/runs/{run_id}")
async def get_run(request: Request, run_id: str) -> dict[str, Any]:
    """A run with its status and outcome."""
    return await load_run_view(store_of(request), await access_of(request).run(run_id))


@router.get("/v1/runs/{run_id}/events", response_model=None, responses={200: EVENT_STREAM})
async def run_events(
    request: Request,
    run_id: str,
    after_seq: int | None = Query(default=None, ge=0, le=MAX_SEQ, description="Return events with seq > after_seq."),
    limit: int = Query(default=100, ge=1, le=1000, description="Page size of the JSON form."),
    last_event_id: str | None = Header(default=None, alias="Last-Event-ID"),
) -> Response:
    """The run's events: SSE (replay, live tail, close after terminal) or a JSON page.

    An SSE request takes one of the caller's stream slots: 429 ``too_many_streams`` when the
    caller has as many open as allowed, 503 ``stream_capacity`` when this process does.
    """
    run = await access_of(request).run(run_id)
    start = after_seq or 0
    if last_event_id is not None and last_event_id.strip():
        try:
            start = int(last_event_id)
        except ValueError:
            raise InvalidRequest(
                "Last-Event-ID must be an event seq (an integer)",
                code="invalid_last_event_id",
                details=[{"loc": ["header", "Last-Event-ID"], "msg": "not an integer", "type": "int_parsing"}],
            ) from None
        if not 0 <= start <= MAX_SEQ:
            raise InvalidRequest(
                f"Last-Event-ID must be an event seq between 0 and {MAX_SEQ}",
                code="invalid_last_event_id",
                details=[{"loc": ["header", "Last-Event-ID"], "msg": "out of range", "type": "less_than_equal"}],
            )
    store = store_of(request)
    if wants_event_stream(request):
        release = stream_slots_of(request).acquire(caller_of(request))
        lag = telemetry_of(request).histograms.stream_lag
        return sse_response(runtime_of(request).feed(run.id, after_seq=start), release=release, ping_s=sse_ping_s_of(request), lag=lag)
    page = await store.read_events(run.id, after_seq=start, limit=limit)
    # The stored envelopes verbatim: the very same bytes the stream sends.
    body = '{"items":[' + ",".join(e.envelope for e in page) + "]}"
    return Response(body, media_type="application/json")


@router.post("/v1/runs/{run_id}/messages", status_code=202)
async def steer_run(request: Request, run_id: str, body: SteeringMessage) -> dict[str, Any]:
    """Steer a running run: send it a message; 409 ``run_not_active`` unless it is ``running``,
    429 ``too_many_queued_messages`` when the run already holds as many as allowed."""
    run = await access_of(request).run(run_id, to="write")
    message_id = await runtime_of(request).steer(run_id, body.content)
    return queued_message_view(message_id, run, body.content)


@router.post("/v1/runs/{run_id}/cancel", status_code=202)
async def cancel_run(request: Request, run_id: str, body: CancelRun | None = None) -> JSONResponse:
    """Explicitly cancel a run (``soft`` by default). Idempotent while cancelling."""
    await access_of(request).run(run_id, to="write")
    body = body or CancelRun()
    run = await runtime_of(request).cancel(run_id, mode=body.mode, reason=body.reason, actor=actor_of(request))
    return JSONResponse(await load_run_view(store_of(request), run), status_code=202)
