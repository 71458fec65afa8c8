"""The HTTP server: a FastAPI application around one agent, one store and one runtime.

``create_app`` builds it; its lifespan opens the store (running migrations), starts the
runtime (recovering what a previous process left) and, on shutdown, stops executing tasks and
closes the store. Routes live one module per resource; the error mapping lives in ``_errors``.
"""

from __future__ import annotations

import contextlib
from typing import Any, AsyncIterator

from fastapi import FastAPI

from .. import __version__
from ..agent import Agent
from ..runtime import LocalBus, Runtime
from ..runtime.pgbus import PostgresBus
from ..store import Store
from . import metrics, review, runs, threads
from ._errors import install_error_handlers
from ._guard import RefuseNul
from .ui import install_ui

__all__ = ["create_app"]


def create_app(agent: Agent, db_url: str, *, sse_ping_s: float = 15.0, lease_s: float = 10.0) -> FastAPI:
    """Build the application serving ``agent`` on the database at ``db_url``.

    ``sse_ping_s`` is the longest an event stream stays silent: an idle stream gets a
    ``: ping`` comment that often, so proxies and browsers do not time it out. ``lease_s`` is
    how long a process's claim on a run it executes lasts without renewal: after that long
    without a heartbeat (the process died), another process sharing the PostgreSQL database
    takes the run over.
    """
    if sse_ping_s <= 0:
        raise ValueError("sse_ping_s must be positive")
    if lease_s <= 0:
        raise ValueError("lease_s must be positive")

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        store = await Store.open(db_url)
        store.lease_s = lease_s
        bus: LocalBus
        if store.is_sqlite:
            bus = LocalBus()
        else:  # other processes may share the database: hear what they commit and command
            dsn = store.engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
            bus = PostgresBus(dsn, store.instance_id)
        runtime = Runtime(store, agent, bus)
        app.state.store = store
        app.state.runtime = runtime
        try:
            if isinstance(bus, PostgresBus):
                await bus.start()
            if agent.on_startup is not None:
                await agent.on_startup(store)
            await runtime.start()
            yield
        finally:
            try:
                await runtime.aclose()
            finally:
                try:
                    if isinstance(bus, PostgresBus):
                        await bus.aclose()
                finally:
                    await store.aclose()

    app = FastAPI(title="Tether", version=__version__, lifespan=lifespan)
    app.state.sse_ping_s = sse_ping_s
    install_error_handlers(app)
    app.add_middleware(RefuseNul)
    app.include_router(threads.router)
    app.include_router(threads.messages_router)
    app.include_router(runs.router)
    app.include_router(review.router)
    app.include_router(metrics.router)
    for route in agent.routes:
        app.router.routes.append(route)

    @app.get("/healthz", tags=["ops"])
    async def healthz() -> dict[str, Any]:
        """Liveness."""
        return {"status": "ok"}

    install_ui(app)  # the web UI at "/" and its files at "/static"

    return app
