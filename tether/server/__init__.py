"""The HTTP server: a FastAPI application around one agent, one store and one runtime.

``create_app`` builds it; its lifespan opens the runtime (which opens the store, running
migrations, and its bus), starts it (the agent's ``on_startup``, then recovering what a previous
process left) and, on shutdown, closes it. Routes live one module per resource, response shapes
in ``views``; the error mapping lives in ``_errors``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI

from .. import __version__
from ..agent import Agent
from ..runtime import Runtime
from . import _agui, _metrics, _resume, _runs, _threads
from ._errors import install_error_handlers
from ._guard import RefuseNul
from ._ui import install_ui

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
        runtime = await Runtime.open(db_url, agent, lease_s=lease_s)
        app.state.runtime = runtime
        app.state.store = runtime.store
        try:
            await runtime.start()
            yield
        finally:
            await runtime.aclose()

    app = FastAPI(title="Tether", version=__version__, lifespan=lifespan)
    app.state.sse_ping_s = sse_ping_s
    install_error_handlers(app)
    app.add_middleware(RefuseNul)
    app.include_router(_threads.router)
    app.include_router(_threads.messages_router)
    app.include_router(_runs.router)
    app.include_router(_resume.router)
    app.include_router(_metrics.router)
    app.include_router(_agui.router)
    for route in agent.routes:
        app.router.routes.append(route)

    @app.get("/healthz", tags=["ops"])
    async def healthz() -> dict[str, Any]:
        """Liveness."""
        return {"status": "ok"}

    install_ui(app)  # the web UI at "/" and its files at "/static"

    return app
