"""Request-scoped access to the application's store, runtime and caller."""

from __future__ import annotations

from fastapi import Request

from ..runtime import Runtime
from ..store import Store

#: The actor of every request until authentication lands.
ANONYMOUS = "anonymous"


def store_of(request: Request) -> Store:
    """The application's store."""
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
    """Who is calling (``anonymous`` until API keys are configured)."""
    return ANONYMOUS
