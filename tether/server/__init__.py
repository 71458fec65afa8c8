"""The HTTP server: a FastAPI application around one agent, one store and one runtime.

``create_app`` builds it; its lifespan opens the runtime (which opens the store, running
migrations, and its bus), starts it (the agent's ``on_startup``, then recovering what a previous
process left) and, on shutdown, closes it and the model's connections (``aclose``, if it has
one). ``end_event_streams`` ends its open event streams when the process begins to stop.
Routes live one module per resource, response shapes in ``views``; the error mapping lives
in ``_errors``. Who is calling is settled once per request by ``_auth`` (a middleware in front of
every route); what they may see and do, by ``_access``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any, get_args

from fastapi import Depends, FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.routing import APIRoute

from .. import __version__
from ..agent import Agent
from ..runtime import FourEyesPolicy, Runtime
from ..store import Principal
from ..telemetry import Telemetry
from ..webhooks import WebhookSettings, start_webhooks
from ..webhooks import _routes as webhook_routes
from . import _agent, _agui, _allowances, _auth, _inbox, _metrics, _resume, _runs, _threads, _timeline
from ._auth import Authenticate, AuthMode, principal_of
from ._deps import caller_of, request_buckets_of
from ._errors import install_error_handlers
from ._guard import RefuseNul
from ._idempotency import Idempotency, purge_keys_forever
from ._limits import RUN_ADMISSION, BodyLimit, Limits, StreamSlots, TokenBuckets, check_rate
from ._openapi import ERROR_RESPONSES
from ._ui import install_ui

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

__all__ = ["create_app", "end_event_streams", "stop_draining", "principal_of", "Principal", "Limits"]


async def _count_request(request: Request) -> None:
    """Every ``/v1`` request takes a token from its caller's bucket (429 ``rate_limited``)."""
    check_rate(request_buckets_of(request), caller_of(request), "requests")


def create_app(
    agent: Agent,
    db_url: str,
    *,
    sse_ping_s: float = 15.0,
    lease_s: float = 10.0,
    drain_s: float = 0.0,
    auth: AuthMode = "open",
    four_eyes: FourEyesPolicy = "off",
    cors_origins: Sequence[str] = (),
    limits: Limits | None = None,
    webhooks: WebhookSettings | None = None,
    tracer_provider: TracerProvider | None = None,
    trace_contents: bool = False,
) -> FastAPI:
    """Build the application serving ``agent`` on the database at ``db_url``.

    ``sse_ping_s`` is the longest an event stream stays silent: an idle stream gets a
    ``: ping`` comment that often, so proxies and browsers do not time it out. ``lease_s`` is
    how long a process's claim on a run it executes lasts without renewal: after that long
    without a heartbeat (the process died), another process sharing the PostgreSQL database
    takes the run over. ``drain_s`` is how long the application's shutdown lets the runs under
    way finish (or park on a human decision) before it stops them and hands them over: on
    PostgreSQL another process takes each over at once, from its last checkpoint; on SQLite the
    next start does. Call :func:`end_event_streams` when the process is told to stop, so that
    open streams do not hold the server's shutdown (``tether serve`` does both).

    ``auth`` is ``open`` (every request is the principal ``local`` with every role; loopback
    clients only) or ``keys`` (a bearer API key on every request but ``/healthz`` and the UI
    shell). ``four_eyes="destructive"`` makes every destructive call need an approver other
    than the run's requester. ``cors_origins`` are the browser origins allowed to call the API
    from other sites (none by default). ``limits`` bounds what callers may ask (:class:`Limits`;
    the defaults are never reached by a single user). ``webhooks`` sends signed notifications
    of interrupts and finished runs to the endpoints it names (docs/webhooks.md).

    Spans of the runs (OpenTelemetry, docs/observability.md) go to ``tracer_provider``, else
    where the ``OTEL_*`` environment variables say, else nowhere. ``trace_contents`` puts
    message contents, tool arguments (masked as everywhere) and results into them.
    """
    limits = limits or Limits()
    if auth not in get_args(AuthMode):
        raise ValueError(f"auth must be one of {get_args(AuthMode)}")
    if four_eyes not in get_args(FourEyesPolicy):
        raise ValueError(f"four_eyes must be one of {get_args(FourEyesPolicy)}")
    if sse_ping_s <= 0:
        raise ValueError("sse_ping_s must be positive")
    if lease_s <= 0:
        raise ValueError("lease_s must be positive")
    if drain_s < 0:
        raise ValueError("drain_s must not be negative")

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        runtime = await Runtime.open(
            db_url,
            agent,
            lease_s=lease_s,
            four_eyes=four_eyes,
            max_queued_messages=limits.max_queued_messages,
            stream_buffer_bytes=limits.stream_buffer_bytes,
            max_allowance_ttl_s=limits.max_allowance_ttl_s,
        )
        app.state.runtime = runtime
        app.state.store = runtime.store
        telemetry = Telemetry.from_environment(agent, runtime.store, tracer_provider=tracer_provider, contents=trace_contents)
        runtime.observer = app.state.telemetry = telemetry
        sender = await start_webhooks(runtime.store, webhooks, auth=auth, telemetry=telemetry) if webhooks is not None else None
        app.state.webhooks = sender
        purging = asyncio.create_task(purge_keys_forever(runtime.store), name="idempotency purge")  # old keys, off the request path
        try:
            await runtime.start()
            yield
        finally:
            purging.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await purging
            if sender is not None:
                await sender.aclose()
            await runtime.drain(drain_s)
            try:
                await runtime.aclose()
            finally:
                await telemetry.aclose()
            # A hosted model's connection pool belongs to this event loop, which ends here.
            aclose = getattr(agent.model, "aclose", None)
            if aclose is not None:
                await aclose()

    app = FastAPI(title="Tether", version=__version__, lifespan=lifespan, responses=ERROR_RESPONSES)
    app.state.sse_ping_s = sse_ping_s
    app.state.auth = auth
    app.state.limits = limits
    app.state.request_buckets = TokenBuckets(limits.requests_per_minute)
    app.state.run_start_buckets = TokenBuckets(limits.run_starts_per_minute)
    app.state.stream_slots = StreamSlots(limits.max_streams_per_caller, limits.max_streams)
    app.state.run_admission = asyncio.Semaphore(RUN_ADMISSION)
    install_error_handlers(app)
    # The last added runs first: CORS (answers preflights, which carry no key), then NUL, then who.
    app.add_middleware(Idempotency)  # inside authentication: a key belongs to its principal
    app.add_middleware(Authenticate, mode=auth)
    app.add_middleware(RefuseNul)
    if cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(cors_origins),
            allow_methods=["GET", "POST", "PUT", "PATCH", "DELETE"],
            allow_headers=["Authorization", "Content-Type", "Accept", "Last-Event-ID", "Idempotency-Key"],
            expose_headers=["Location", "X-Run-Id"],
        )
    app.add_middleware(BodyLimit, max_bytes=limits.max_body_bytes)  # outermost: before anything reads the body
    # Rate limits run after authentication (a middleware), so they count per principal.
    counted = [Depends(_count_request)]
    app.include_router(_auth.router, dependencies=counted)
    app.include_router(_agent.router, dependencies=counted)
    app.include_router(_threads.router, dependencies=counted)
    app.include_router(_threads.messages_router, dependencies=counted)
    app.include_router(_runs.router, dependencies=counted)
    app.include_router(_timeline.router, dependencies=counted)
    app.include_router(_resume.router, dependencies=counted)
    app.include_router(_inbox.router, dependencies=counted)
    app.include_router(_allowances.router, dependencies=counted)
    app.include_router(_metrics.router)
    app.include_router(_agui.router, dependencies=counted)
    app.include_router(webhook_routes.router, dependencies=counted)
    for route in agent.routes:
        if isinstance(route, APIRoute):  # its errors have the standard shape too: say so
            route.responses = {**ERROR_RESPONSES, **route.responses}
        app.router.routes.append(route)

    @app.get("/healthz", tags=["ops"])
    async def healthz() -> dict[str, Any]:
        """Liveness."""
        return {"status": "ok"}

    install_ui(app)  # the web UI at "/" and its files at "/static"

    return app


def end_event_streams(app: FastAPI) -> None:
    """End every open event stream of ``app`` (and any opened from now on) with a comment
    telling its client to reconnect with its ``Last-Event-ID``: call it when the process
    begins to shut down, before the server waits for open requests to finish.

    Without it an open stream holds the server's graceful shutdown until its timeout and is then
    cut. ``tether serve`` and ``tether demo`` call it as soon as they are told to stop; the runs
    go on until the application's shutdown, which hands them to another process (PostgreSQL) or
    to the next start (SQLite). Does nothing before the application has started.
    """
    runtime: Runtime | None = getattr(app.state, "runtime", None)
    if runtime is not None:
        runtime.end_streams()


def stop_draining(app: FastAPI) -> None:
    """Stop the application's shutdown from waiting for the runs under way (``drain_s``): they
    are handed over at once. Does nothing before the application has started."""
    runtime: Runtime | None = getattr(app.state, "runtime", None)
    if runtime is not None:
        runtime.stop_draining()
