"""The one place where errors become HTTP responses.

Every error response is ``{"error": {"code", "message", "details"}}`` with a 4xx/5xx status;
never a stack trace, never a 500 for bad input. A core error's :class:`~tether.errors.FieldError`s
become ``details`` items ``{"loc", "msg", "type"}`` whose ``loc`` starts, as FastAPI's own
validation errors do, with where the field came from: ``path`` for a path parameter of the
route, ``query`` for a query parameter, ``body`` otherwise.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import Conflict, FieldError, Forbidden, Gone, InvalidRequest, LimitExceeded, NotFound, Overloaded, PayloadTooLarge, TetherError, Unauthorized

log = logging.getLogger("tether.server")

_STATUS: list[tuple[type[TetherError], int]] = [
    (NotFound, 404),
    (InvalidRequest, 422),
    (Conflict, 409),
    (Gone, 410),
    (Forbidden, 403),
    (Unauthorized, 401),
    (PayloadTooLarge, 413),
    (LimitExceeded, 429),
    (Overloaded, 503),
]

_HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    415: "unsupported_media_type",
    413: "payload_too_large",
}


def error_response(status: int, code: str, message: str, details: Any = None) -> JSONResponse:
    """Build the standard error body."""
    return JSONResponse({"error": {"code": code, "message": message, "details": details}}, status_code=status)


def status_for(exc: TetherError) -> int:
    """The HTTP status of a Tether error."""
    for cls, status in _STATUS:
        if isinstance(exc, cls):
            return status
    return 500


def field_details(request: Request, fields: tuple[FieldError, ...]) -> list[dict[str, Any]]:
    """The ``details`` of an error about ``fields`` of ``request``, each located in the request."""
    return [{"loc": [_source(request, f.loc[0] if f.loc else None), *f.loc], "msg": f.msg, "type": f.type} for f in fields]


def _source(request: Request, name: str | int | None) -> str:
    if name in request.path_params:
        return "path"
    if isinstance(name, str) and name in request.query_params:
        return "query"
    return "body"


def install_error_handlers(app: FastAPI) -> None:
    """Register the handlers that give every error the standard shape."""

    @app.exception_handler(TetherError)
    async def tether_error(request: Request, exc: TetherError) -> JSONResponse:
        details = field_details(request, exc.fields) if exc.fields else exc.details
        response = error_response(status_for(exc), exc.code, exc.message, details)
        if isinstance(exc, Unauthorized):
            response.headers["WWW-Authenticate"] = 'Bearer realm="tether"'
        retry_after = getattr(exc, "retry_after_s", None)
        if retry_after is not None:
            response.headers["Retry-After"] = str(max(1, math.ceil(retry_after)))
        return response

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [{"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")} for e in exc.errors()]
        if any(e["type"] in ("json_invalid", "json_type") for e in errors):
            return error_response(400, "invalid_json", "the request body is not valid JSON", errors)
        fields = ", ".join(".".join(str(p) for p in e["loc"][1:]) or e["loc"][0] if e["loc"] else "body" for e in errors)
        return error_response(422, "validation_error", f"invalid request: {fields}", errors)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400 and isinstance(exc.__cause__, (ValueError, RecursionError)):
            # FastAPI's "error parsing the body" for a body that is not UTF-8 or nests too
            # deeply for the parser: as malformed as any other bad JSON, so the same answer.
            details = [{"loc": ["body"], "msg": str(exc.__cause__)[:200], "type": "json_invalid"}]
            return error_response(400, "invalid_json", "the request body is not valid JSON", details)
        code = _HTTP_CODES.get(exc.status_code, "http_error")
        response = error_response(exc.status_code, code, str(exc.detail))
        if exc.headers:
            response.headers.update(exc.headers)
        return response

    @app.exception_handler(Exception)
    async def internal_error(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error", exc_info=exc)
        return error_response(500, "internal_error", "internal server error")
