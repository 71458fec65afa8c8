"""What the OpenAPI document says about responses that FastAPI cannot infer.

Every route may answer with the standard error body (``{"error": {"code", "message",
"details"}}``); each status it can answer is declared with that schema (FastAPI's own
``HTTPValidationError`` is replaced: validation errors use the same shape). Event streams are
declared as ``text/event-stream``. Whole-API fuzzing (``tests/test_fuzz_api.py``) checks every
response against this document.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

__all__ = ["ErrorBody", "ERROR_RESPONSES", "EVENT_STREAM", "AGUI_STREAM"]


class ErrorDetail(BaseModel):
    """What went wrong: a stable ``code``, a sentence, and details (field errors, a status…)."""

    model_config = ConfigDict(extra="forbid")
    code: str
    message: str
    details: Any = None


class ErrorBody(BaseModel):
    """Every error response."""

    model_config = ConfigDict(extra="forbid")
    error: ErrorDetail


_ERRORS = {
    400: "Malformed JSON (`invalid_json`) or another malformed request.",
    403: "Not allowed (`decision_not_allowed`).",
    404: "No such resource (for you), or no such route.",
    405: "Wrong method for this path.",
    406: "Not acceptable.",
    409: "Conflicts with the current state (`thread_busy`, `run_not_active`, `interrupt_resolved`).",
    410: "Gone (`interrupt_expired`).",
    413: "The request body is over the size cap (`payload_too_large`).",
    415: "Unsupported media type.",
    422: "Invalid input: `details` lists each field (`validation_error` and more specific codes).",
    429: "A rate limit or cap of the caller (`rate_limited`, `too_many_active_runs`, `too_many_streams`, `too_many_queued_messages`); see `Retry-After`.",
    500: "An unexpected server error (`internal_error`); never for bad input.",
    503: "This process is at capacity (`stream_capacity`, `database_busy`); see `Retry-After`.",
}

#: The error responses every route declares.
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {status: {"model": ErrorBody, "description": text} for status, text in _ERRORS.items()}

#: One server-sent event, as a parsed stream item (OpenAPI 3.0/3.1 put it in ``schema``).
_SSE_ITEM: dict[str, Any] = {
    "type": "object",
    "required": ["data"],
    "properties": {"data": {"type": "string"}, "event": {"type": "string"}, "id": {"type": "string"}, "retry": {"type": "integer"}},
}

#: A response that is an event stream (with ``Accept: text/event-stream``).
EVENT_STREAM: dict[str, Any] = {
    "description": "With `Accept: text/event-stream`: the run's events as server-sent events (`id` = seq, `event` = type, `data` = the envelope).",
    "content": {"text/event-stream": {"schema": _SSE_ITEM}},
}

#: The answer of the AG-UI routes: always an event stream (refusals are ``RUN_ERROR`` events in it).
#: (Declared per route with the error body under ``application/json`` spelled out: the route's
#: own media type is ``text/event-stream``, which FastAPI would give its error responses too.)
AGUI_STREAM: dict[int | str, dict[str, Any]] = {
    **{
        status: {"description": text, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}}
        for status, text in _ERRORS.items()
    },
    200: {
        "description": "AG-UI events as server-sent events (`id` = the event id, `data` = the AG-UI event as JSON).",
        "content": {"text/event-stream": {"schema": _SSE_ITEM}},
    },
}
