"""Refuse NUL characters in the request line before any route sees them.

A NUL can never be part of an id or a query value Tether stores (PostgreSQL refuses it in
text), so a path or query string holding one gets a clean 4xx here instead of reaching the
database. Body fields are checked by their pydantic types (``schemas.Text``).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote_to_bytes

from starlette.types import ASGIApp, Receive, Scope, Send

from ._errors import error_response


class RefuseNul:
    """ASGI middleware: 404 for a NUL in the path, 422 for a NUL in the query string."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            response: Any = None
            if "\x00" in scope.get("path", ""):
                response = error_response(404, "not_found", "no such resource (the path contains a NUL character)")
            elif b"\x00" in unquote_to_bytes(scope.get("query_string", b"")):
                details = [{"loc": ["query"], "msg": "query values must not contain the NUL character", "type": "value_error"}]
                response = error_response(422, "validation_error", "invalid request: query", details)
            if response is not None:
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
