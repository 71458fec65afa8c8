"""The OpenTelemetry calls: spans with explicit start and end times, and trace contexts to and
from W3C ``traceparent``. Imported only by a process that traces."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, Span, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from .. import __version__
from ._context import format_traceparent, parse_traceparent

__all__ = ["SpanMaker", "SCHEMA_URL"]

#: The semantic conventions Tether's spans follow (the GenAI names of this version).
SCHEMA_URL = "https://opentelemetry.io/schemas/1.37.0"

Attributes = Mapping[str, Any]


class SpanMaker:
    """Makes Tether's spans on one tracer provider."""

    def __init__(self, provider: trace.TracerProvider) -> None:
        self._tracer = provider.get_tracer("tether", __version__, schema_url=SCHEMA_URL)

    def start(self, name: str, *, client: bool, parent: otel_context.Context | None, start_ns: int, attributes: Attributes) -> Span:
        """A span begun at ``start_ns`` (ns since the epoch) under ``parent`` (None: a new trace)."""
        return self._tracer.start_span(
            name,
            context=parent if parent is not None else otel_context.Context(),
            kind=SpanKind.CLIENT if client else SpanKind.INTERNAL,
            attributes=dict(attributes),
            start_time=start_ns,
        )

    @staticmethod
    def end(span: Span, end_ns: int, *, error: str | None = None, attributes: Attributes | None = None) -> None:
        """End ``span`` at ``end_ns``; ``error`` (an ``error.type``) marks it failed."""
        if attributes:
            span.set_attributes(dict(attributes))
        if error is not None:
            span.set_attribute("error.type", error)
            span.set_status(Status(StatusCode.ERROR))
        span.end(end_time=max(end_ns, _start_of(span)))

    @staticmethod
    def event(span: Span, name: str, at_ns: int, attributes: Attributes) -> None:
        span.add_event(name, dict(attributes), timestamp=at_ns)

    @staticmethod
    def under(span: Span) -> otel_context.Context:
        """A context whose spans are children of ``span``."""
        return trace.set_span_in_context(span, otel_context.Context())

    @staticmethod
    def remote(traceparent: str | None) -> otel_context.Context | None:
        """The context of a ``traceparent`` from elsewhere (a caller, the store), or None."""
        parsed = parse_traceparent(traceparent)
        if parsed is None:
            return None
        trace_id, span_id, flags = parsed
        remote = SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(flags & 0x01))
        return trace.set_span_in_context(NonRecordingSpan(remote), otel_context.Context())

    @staticmethod
    def current() -> otel_context.Context | None:
        """The context of the span current here (an instrumented server's request span), or None."""
        span = trace.get_current_span()
        return trace.set_span_in_context(span, otel_context.Context()) if span.get_span_context().is_valid else None

    @staticmethod
    def traceparent(span: Span) -> str:
        ctx = span.get_span_context()
        return format_traceparent(ctx.trace_id, ctx.span_id, int(ctx.trace_flags))

    @staticmethod
    def trace_id(span: Span) -> str:
        return f"{span.get_span_context().trace_id:032x}"


def _start_of(span: Span) -> int:
    start = getattr(span, "start_time", None)  # the SDK's spans have it; an end never precedes the start
    return start if isinstance(start, int) else 0
