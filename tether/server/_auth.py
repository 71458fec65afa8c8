"""Who is calling: the authentication gate every request passes, and ``GET /v1/me``.

One ASGI middleware sits in front of every route (including an agent's own routes and any
route added later), so no handler can forget it. It resolves the caller to a
:class:`~tether.store.Principal` and leaves it in the request scope, or answers 401 itself:

- ``open`` mode: every request is the principal ``local``, with every role. It exists for the
  demo and local development, so it only answers clients on the loopback interface (the CLI
  also refuses to start it on another host).
- ``keys`` mode: ``Authorization: Bearer tk_…`` must carry a usable key (see
  ``store/_keys.py``); the key is read from that header only, never from a URL, and never
  appears in a response or a log line.

A few paths hold nothing about anyone and stay open in both modes: ``/healthz``, the web UI
shell (``/``, ``/static/…``; it asks for a key itself) and the OpenAPI reference. What each
principal may *see* and *do* once known is decided in one other place, ``_access.py``.
"""

from __future__ import annotations

import ipaddress
from typing import Any, Literal

from fastapi import APIRouter, Request
from starlette.types import ASGIApp, Receive, Scope, Send

from ..errors import Unauthorized
from ..store import ROLES, Principal, Store
from ._errors import error_response

__all__ = ["AuthMode", "Authenticate", "LOCAL", "PUBLIC_PATHS", "principal_of", "router"]

AuthMode = Literal["open", "keys"]

#: The one principal of ``open`` mode.
LOCAL = Principal(name="local", roles=frozenset(ROLES))

#: Paths any client may fetch without a key (nothing in them is about anyone).
PUBLIC_PATHS = frozenset({"/healthz", "/", "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"})
_PUBLIC_PREFIXES = ("/static/",)

#: Where the principal of a request is kept in its ASGI scope.
_SCOPE_KEY = "tether.principal"

_MISSING = "an API key is required: send it as 'Authorization: Bearer tk_…'"
_INVALID = "the API key is not valid (malformed, unknown, expired or revoked)"


def _is_public(path: str) -> bool:
    return path in PUBLIC_PATHS or path.startswith(_PUBLIC_PREFIXES)


def is_loopback(host: str | None) -> bool:
    """True for a loopback address (``127.0.0.0/8``, ``::1``) or ``localhost``."""
    if host is None:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _bearer(scope: Scope) -> str | None:
    """The token of an ``Authorization: Bearer …`` header; ``""`` for another scheme."""
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return token.strip() if scheme.lower() == "bearer" else ""
    return None


class Authenticate:
    """ASGI middleware: resolve the caller, or answer 401 ``unauthorized`` with ``WWW-Authenticate: Bearer``."""

    def __init__(self, app: ASGIApp, mode: AuthMode) -> None:
        self.app = app
        self.mode = mode

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.mode == "open":
            client = scope.get("client")
            if not is_loopback(client[0] if client else None):
                response = error_response(
                    403, "loopback_only", "this server runs without authentication (--auth open) and answers clients on this machine only"
                )
                await response(scope, receive, send)
                return
            scope[_SCOPE_KEY] = LOCAL
        elif not _is_public(scope.get("path", "")):
            token = _bearer(scope)
            store: Store = scope["app"].state.store
            principal = await store.authenticate(token) if token else None
            if principal is None:
                response = error_response(401, "unauthorized", _MISSING if token is None else _INVALID)
                response.headers["WWW-Authenticate"] = 'Bearer realm="tether"'
                await response(scope, receive, send)
                return
            scope[_SCOPE_KEY] = principal
        await self.app(scope, receive, send)


def principal_of(request: Request) -> Principal:
    """The caller of ``request`` (for an agent's own routes too).

    Raises :class:`~tether.errors.Unauthorized` on a public path in ``keys`` mode, where
    nobody was asked for a key."""
    principal: Any = request.scope.get(_SCOPE_KEY)
    if not isinstance(principal, Principal):
        raise Unauthorized(_MISSING)
    return principal


router = APIRouter(tags=["identity"])


@router.get("/v1/me")
async def me(request: Request) -> dict[str, Any]:
    """Who the caller is: ``{"name", "roles"}`` (``local`` with every role in ``open`` mode)."""
    principal = principal_of(request)
    return {"name": principal.name, "roles": [role for role in ROLES if role in principal.roles], "auth": request.app.state.auth}
