"""Request-scoped access to the application's store, runtime and caller."""

from __future__ import annotations

from typing import Any

from fastapi import Request

from ..runtime import Runtime
from ..store import RunRecord, Store, ThreadRecord

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


async def run_view(store: Store, run: RunRecord) -> dict[str, Any]:
    """A run as the API shows it, with its pending interrupt (if any)."""
    pending = await store.pending_interrupts(run_ids=[run.id]) if run.status == "waiting_human" else []
    return run.to_api(pending_interrupt=pending[0].to_api() if pending else None)


async def thread_views(store: Store, threads: list[ThreadRecord]) -> list[dict[str, Any]]:
    """Threads as the API shows them, with their active run and pending interrupt."""
    ids = [t.id for t in threads]
    active = await store.active_run_ids(ids)
    pending = {i.thread_id: i.to_api() for i in await store.pending_interrupts(thread_ids=ids)}
    return [t.to_api(active_run_id=active.get(t.id), pending_interrupt=pending.get(t.id)) for t in threads]
