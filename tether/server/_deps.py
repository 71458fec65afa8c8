"""Request-scoped access to the application's store, runtime and caller."""

from __future__ import annotations

from fastapi import Request

from ..runtime import Runtime
from ..store import Store

#: The actor of every request until authentication lands.
ANONYMOUS = "anonymous"


def store_of(request: Request) -> Store:
    """The application's store."""
    return request.app.state.store  # type: ignore[no-any-return]


def runtime_of(request: Request) -> Runtime:
    """The application's runtime."""
    return request.app.state.runtime  # type: ignore[no-any-return]


def sse_ping_s_of(request: Request) -> float:
    """The longest an event stream stays silent before a ``: ping`` comment."""
    return request.app.state.sse_ping_s  # type: ignore[no-any-return]


def actor_of(request: Request) -> str:
    """Who is calling (``anonymous`` until API keys are configured)."""
    return ANONYMOUS

