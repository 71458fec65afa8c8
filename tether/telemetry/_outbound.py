"""A span of a request Tether sends on its own (a webhook delivery), in the trace of the run it
tells of, and the ``traceparent`` that request carries."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from ._spans import SpanMaker

__all__ = ["OutboundSpan"]


class OutboundSpan:
    """A CLIENT span begun now under the run's stored trace context (no span when not tracing:
    the request then carries the run's context itself)."""

    def __init__(self, maker: SpanMaker | None, name: str, parent: str | None, attributes: Mapping[str, Any]) -> None:
        self._maker = maker
        self._span: Span | None = None
        #: What the request sends as ``traceparent`` (None: the run has no trace context).
        self.traceparent = parent
        if maker is not None:
            self._span = maker.start(name, client=True, parent=maker.remote(parent), start_ns=time.time_ns(), attributes=attributes)
            self.traceparent = maker.traceparent(self._span)

    def end(self, *, status_code: int | None, error: str | None) -> None:
        """End the span with the answer's status (or the error that stood for one)."""
        if self._maker is None or self._span is None:
            return
        attributes = {"http.response.status_code": status_code} if status_code is not None else {}
        self._maker.end(self._span, time.time_ns(), error=error, attributes=attributes)
        self._span = None
