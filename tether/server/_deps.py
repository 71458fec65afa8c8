"""Request-scoped access to the application's store, runtime, caller and the caller's view of the store."""

from __future__ import annotations

import asyncio
import contextlib

from fastapi import Request

from ..runtime import Runtime
from ..store import Store
from ..telemetry import Telemetry
from ..telemetry._context import incoming
from ._access import Access
from ._auth import principal_of
from ._limits import Limits, StreamSlots, TokenBuckets


def store_of(request: Request) -> Store:
    """The application's store (routes read resources through :func:`access_of` instead)."""
    store: Store = request.app.state.store
    return store


def runtime_of(request: Request) -> Runtime:
    """The application's runtime."""
    runtime: Runtime = request.app.state.runtime
    return runtime


def sse_ping_s_of(request: Request) -> float:
    """The longest an event stream stays silent before a ``: ping`` comment."""
    seconds: float = request.app.state.sse_ping_s
    return seconds


def actor_of(request: Request) -> str:
    """The caller's name: the ``actor`` of what they do, the ``owner`` of what they create."""
    return principal_of(request).name


def access_of(request: Request) -> Access:
    """The caller's view of the store: the one way routes read threads, runs, messages,
    interrupts and audit entries (see ``_access.py``)."""
    return Access(store_of(request), principal_of(request))


def caller_of(request: Request) -> str:
    """Whom the limits count against: the principal (every request has one: a key's, or
    ``local`` in open mode). The one place that says who a caller is."""
    return actor_of(request)


def limits_of(request: Request) -> Limits:
    """The application's limits."""
    limits: Limits = request.app.state.limits
    return limits


def request_buckets_of(request: Request) -> TokenBuckets:
    """Requests per caller."""
    buckets: TokenBuckets = request.app.state.request_buckets
    return buckets


def run_start_buckets_of(request: Request) -> TokenBuckets:
    """Run starts per caller."""
    buckets: TokenBuckets = request.app.state.run_start_buckets
    return buckets


def stream_slots_of(request: Request) -> StreamSlots:
    """Open event streams, per caller and in total."""
    slots: StreamSlots = request.app.state.stream_slots
    return slots


def run_admission_of(request: Request) -> asyncio.Semaphore:
    """How many run starts may be under way at once in this process (``RUN_ADMISSION``)."""
    admission: asyncio.Semaphore = request.app.state.run_admission
    return admission


def telemetry_of(request: Request) -> Telemetry:
    """The application's telemetry (spans, histograms)."""
    telemetry: Telemetry = request.app.state.telemetry
    return telemetry


def incoming_trace_of(request: Request) -> contextlib.AbstractContextManager[None]:
    """While a run starts: the request's W3C ``traceparent`` becomes the run's parent."""
    return incoming(request.headers.get("traceparent"))
