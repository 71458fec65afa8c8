"""Which run the current task works for, and the W3C trace context that goes with it.

A run's executing task carries a :class:`RunLabels` (a context variable set by the telemetry's
:meth:`~tether.telemetry.Telemetry.executing`), so that a log line knows its run and trace
(:mod:`._logging`), and an outbound request of the run carries its ``traceparent``
(:func:`outbound_headers`, called by the model clients). No OpenTelemetry import here.
"""

from __future__ import annotations

import contextlib
import contextvars
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

__all__ = ["RunLabels", "current_run", "incoming_trace", "incoming", "outbound_headers", "parse_traceparent", "format_traceparent"]


@dataclass(slots=True)
class RunLabels:
    """What a log line or an outbound request of a run says about it."""

    run_id: str
    thread_id: str
    #: The run's trace (32 hex digits) once it has one.
    trace_id: str | None = None
    #: The ``traceparent`` of the span an outbound request of the run now belongs to.
    traceparent: Callable[[], str | None] | None = None


#: The run the current task executes (None outside a run).
current_run: contextvars.ContextVar[RunLabels | None] = contextvars.ContextVar("tether_run", default=None)

#: The ``traceparent`` a request that starts a run came with (set by the server around the start).
incoming_trace: contextvars.ContextVar[str | None] = contextvars.ContextVar("tether_incoming_trace", default=None)


@contextlib.contextmanager
def incoming(traceparent: str | None) -> Iterator[None]:
    """Within this block, a run that starts is a child of ``traceparent`` (a caller's)."""
    if not traceparent:
        yield
        return
    token = incoming_trace.set(traceparent)
    try:
        yield
    finally:
        incoming_trace.reset(token)


def outbound_headers() -> dict[str, str]:
    """``{"traceparent": …}`` for a request the current run makes (a model call), or ``{}``."""
    labels = current_run.get()
    if labels is None or labels.traceparent is None:
        return {}
    value = labels.traceparent()
    return {"traceparent": value} if value else {}


_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")


def parse_traceparent(value: str | None) -> tuple[int, int, int] | None:
    """(trace id, span id, flags) of a W3C ``traceparent``, or None if it is not a valid one."""
    if not value:
        return None
    match = _TRACEPARENT.match(value.strip().lower())
    if match is None:
        return None
    version, trace_hex, span_hex, flags_hex, rest = match.groups()
    trace_id, span_id = int(trace_hex, 16), int(span_hex, 16)
    if version == "ff" or trace_id == 0 or span_id == 0 or (version == "00" and rest):
        return None
    return trace_id, span_id, int(flags_hex, 16)


def format_traceparent(trace_id: int, span_id: int, flags: int) -> str:
    """The W3C ``traceparent`` of a span context."""
    return f"00-{trace_id:032x}-{span_id:016x}-{flags & 0xFF:02x}"
