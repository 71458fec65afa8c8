"""Tether's errors: one hierarchy, each with a stable machine-readable ``code``.

::

    TetherError
    ├── NotFound            a thread, run, message or interrupt does not exist (for you)
    ├── InvalidRequest      input that fails validation (``details`` says where)
    │   └── ToolArgsError       a tool's arguments do not match its schema
    ├── Conflict            the request does not fit the current state
    │   ├── ThreadBusy          another run of the thread is not terminal
    │   ├── RunNotActive        the run is already terminal
    │   └── InterruptResolved   someone else already decided
    ├── Gone
    │   └── InterruptExpired    the approval window closed; nothing can execute now
    ├── Unauthorized        no valid API key: missing, malformed, unknown, expired or revoked
    ├── Forbidden           the caller may not do this (a role, four-eyes, a decision the tool forbids)
    ├── PayloadTooLarge     a request body over the server's size cap
    ├── LimitExceeded       a rate limit or a cap of the caller was reached (``retry_after_s``)
    ├── Overloaded          this server process is at capacity (try another, or later)
    ├── ModelError          the model provider failed (``code`` says how; see docs/models.md)
    ├── ModelConfigError    a model string names no model, or its adapter is not installed
    ├── EventLogFailed      a run's event log could not be committed (the run fails)
    ├── APIError            (clients) the server answered with an error: ``status``, ``code``
    └── ServerUnreachable   (clients) the server could not be reached within the retry budget

The HTTP status for each lives in one place, the server's error handler; the core never speaks
HTTP. An error about particular fields of the input names them with :class:`FieldError`s, whose
``loc`` is a path into the input (``("decisions", 0, "args", "amount")``); the server adds where
that input came from (``body``, ``path``). A rejected approval is an event, not an exception.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "FieldError",
    "TetherError",
    "NotFound",
    "InvalidRequest",
    "Conflict",
    "ThreadBusy",
    "RunNotActive",
    "InterruptResolved",
    "Gone",
    "InterruptExpired",
    "Unauthorized",
    "Forbidden",
    "PayloadTooLarge",
    "LimitExceeded",
    "Overloaded",
    "ModelError",
    "ModelConfigError",
    "ToolArgsError",
    "EventLogFailed",
    "APIError",
    "ServerUnreachable",
]


@dataclass(frozen=True, slots=True)
class FieldError:
    """One wrong field of a request's input: where it is, what is wrong, and a machine-readable kind."""

    #: The path from the input's root to the field: names of fields, indexes of list items.
    loc: tuple[str | int, ...]
    msg: str
    type: str


class TetherError(Exception):
    """Base of every error Tether raises on purpose."""

    code = "tether_error"

    def __init__(self, message: str, *, code: str | None = None, details: Any = None, fields: Sequence[FieldError] = ()) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.details = details
        #: The fields of the input that are wrong (an error about the request as a whole has none).
        self.fields = tuple(fields)


class NotFound(TetherError):
    """A resource does not exist, or is not visible to the caller."""

    code = "not_found"


class InvalidRequest(TetherError):
    """The request is well-formed JSON but its content is not acceptable."""

    code = "invalid_request"


class Conflict(TetherError):
    """The request conflicts with the current state of a resource."""

    code = "conflict"


class ThreadBusy(Conflict):
    """The thread already has a run that is not terminal."""

    code = "thread_busy"


class RunNotActive(Conflict):
    """The run is terminal (or not in the state the request needs)."""

    code = "run_not_active"


class InterruptResolved(Conflict):
    """The interrupt was already resolved or cancelled."""

    code = "interrupt_resolved"


class Gone(TetherError):
    """The resource existed but can no longer be acted on."""

    code = "gone"


class InterruptExpired(Gone):
    """The interrupt expired; its actions were rejected and can never run."""

    code = "interrupt_expired"


class Unauthorized(TetherError):
    """The request carries no valid API key (the server runs in ``keys`` mode)."""

    code = "unauthorized"


class Forbidden(TetherError):
    """The caller is not allowed to do this."""

    code = "forbidden"


class PayloadTooLarge(TetherError):
    """The request body is larger than the server accepts; nothing was parsed or stored."""

    code = "payload_too_large"


class LimitExceeded(TetherError):
    """A rate limit or a cap of the caller was reached; ``retry_after_s`` says when to try again."""

    code = "rate_limited"

    def __init__(self, message: str, *, code: str | None = None, retry_after_s: float | None = None, details: Any = None) -> None:
        super().__init__(message, code=code, details=details)
        #: Seconds after which the same request may succeed (``None``: once something else ends).
        self.retry_after_s = retry_after_s


class Overloaded(TetherError):
    """This server process is at capacity; another process, or a later try, may serve it."""

    code = "server_busy"

    def __init__(self, message: str, *, code: str | None = None, retry_after_s: float | None = None) -> None:
        super().__init__(message, code=code)
        #: Seconds after which trying again makes sense.
        self.retry_after_s = retry_after_s


class ModelError(TetherError):
    """The model provider failed (network, HTTP error, overload, silence, malformed stream)."""

    code = "model_error"

    def __init__(self, message: str, *, retryable: bool = False, code: str | None = None, retry_after: float | None = None) -> None:
        super().__init__(message, code=code)
        #: True when a later attempt may not hit the same failure (network, 429, 5xx, overload).
        self.retryable = retryable
        #: Seconds the provider asked us to wait before trying again (``Retry-After``), if it did.
        self.retry_after = retry_after


class ModelConfigError(TetherError):
    """A model string or setting names no usable model (unknown prefix, missing file or extra)."""

    code = "model_config_error"


class ToolArgsError(InvalidRequest):
    """Tool arguments do not match the tool's schema; ``errors`` names the fields."""

    code = "invalid_tool_args"

    def __init__(self, tool: str, errors: list[dict[str, Any]]) -> None:
        summary = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '(args)'}: {e['msg']}" for e in errors)
        super().__init__(f"invalid arguments for {tool}: {summary}")
        self.errors = errors


class EventLogFailed(TetherError):
    """A run's event log could not be committed; what was not written is not published."""

    code = "event_log_failed"


class APIError(TetherError):
    """An error response from a Tether server, as the clients raise it (``status``, ``code``)."""

    def __init__(self, status: int, code: str, message: str, details: Any = None) -> None:
        super().__init__(message, code=code, details=details)
        self.status = status


class ServerUnreachable(TetherError):
    """The client gave up: the server could not be reached (or kept failing) within its retry budget."""

    code = "server_unreachable"
