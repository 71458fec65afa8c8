"""The HTTP server: a FastAPI application around one agent, one store and one runtime.

``create_app`` builds it; its lifespan opens the store (running migrations), starts the
runtime (recovering what a previous process left) and, on shutdown, stops executing tasks and
closes the store. Routes live one module per resource; the error mapping lives in ``_errors``.
"""

from __future__ import annotations

import contextlib
from typing import Any, AsyncIterator

from fastapi import FastAPI
from fastapi.responses import HTMLResponse

from .. import __version__
from ..agent import Agent
from ..runtime import Runtime
from ..store import Store
from . import review, runs, threads
from ._errors import install_error_handlers

__all__ = ["create_app"]

_INDEX = """<!doctype html><html lang="en"><meta charset="utf-8"><title>Tether</title>
<body style="font-family:system-ui;max-width:40rem;margin:3rem auto">
<h1>Tether</h1><p>The server is running. The API is documented at <a href="/docs">/docs</a>
(OpenAPI: <a href="/openapi.json">/openapi.json</a>).</p></body></html>"""


def create_app(agent: Agent, db_url: str, *, sse_ping_s: float = 15.0) -> FastAPI:
    """Build the application serving ``agent`` on the database at ``db_url``.

    ``sse_ping_s`` is the longest an event stream stays silent: an idle stream gets a
    ``: ping`` comment that often, so proxies and browsers do not time it out.
    """
    if sse_ping_s <= 0:
        raise ValueError("sse_ping_s must be positive")

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        store = await Store.open(db_url)
        runtime = Runtime(store, agent)
        app.state.store = store
        app.state.runtime = runtime
        try:
            if agent.on_startup is not None:
                await agent.on_startup(store)
            await runtime.start()
            yield
        finally:
            try:
                await runtime.aclose()
            finally:
                await store.aclose()

    app = FastAPI(title="Tether", version=__version__, lifespan=lifespan)
    app.state.sse_ping_s = sse_ping_s
    install_error_handlers(app)
    app.include_router(threads.router)
    app.include_router(threads.messages_router)
    app.include_router(runs.router)
    app.include_router(review.router)
    for route in agent.routes:
        app.router.routes.append(route)

    @app.get("/healthz", tags=["ops"])
    async def healthz() -> dict[str, Any]:
        """Liveness."""
        return {"status": "ok"}

    @app.get("/", include_in_schema=False)
    async def index() -> HTMLResponse:
        return HTMLResponse(_INDEX)

    return app
