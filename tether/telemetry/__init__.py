"""Telemetry: OpenTelemetry traces by the GenAI semantic conventions, latency histograms for
``/metrics``, and log lines that say which run and trace they belong to.

:class:`Telemetry` is the runtime's observer (:class:`~tether.runtime.RunObserver`): the runtime
tells it when a stretch of a run begins here, that a batch of a run's events is durable, and
that a model call ended with its token counts. Spans and histograms are derived from those
events, which carry the times they were emitted, so every span has explicit start and end
times and nothing in the run loop waits for telemetry.

Spans (semantic conventions 1.37, ``gen_ai.provider.name``):

- ``invoke_agent {agent}`` (INTERNAL) per *stretch* of a run: from its start, its resume or its
  takeover until it parks on an interrupt or ends. No span stays open across a human wait.
- ``chat {model}`` (CLIENT) per model call, with usage and ``gen_ai.response.time_to_first_chunk``.
- ``execute_tool {tool}`` (INTERNAL) per tool execution, with ``gen_ai.tool.call.id`` and the tier.
- ``human_review`` (INTERNAL) per human wait, made when the wait ends: from the interrupt's
  creation to its decision, expiry or cancel.

A run's *trace context* (a ``traceparent``) is stored with the run: the caller's, when the
request that started the run carried one, else the first stretch's. Every later stretch and
every wait is its child, so a resume hours later, in another process, is the same trace.

When the environment asks for no traces (:mod:`._setup`), no span is made and the
OpenTelemetry SDK is never imported; the histograms are kept either way.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..runtime._observer import RunObserver
from ._context import current_run, incoming_trace, outbound_headers, parse_traceparent
from ._histograms import Histograms
from ._outbound import OutboundSpan
from ._setup import tracer_provider_from_environment
from ._trace import ModelInfo, RunTrace, datetime_ns, ts_ns

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import TracerProvider as ApiTracerProvider

    from ..agent import Agent
    from ..events import StoredEvent
    from ..models import Usage
    from ..store import InterruptRecord, RunRecord, Store
    from ._spans import SpanMaker

__all__ = ["Telemetry", "Histograms", "OutboundSpan", "outbound_headers", "incoming_trace", "describe_model"]

log = logging.getLogger("tether.telemetry")

_DELTAS = frozenset({"token", "thinking"})
_TERMINAL = frozenset({"done", "error", "cancelled"})
_PROVIDERS = {"OpenAIModel": "openai", "AnthropicModel": "anthropic", "LlamaCppModel": "llama_cpp", "ScriptedModel": "tether.scripted"}


def describe_model(model: Any) -> tuple[str, str]:
    """(``gen_ai.provider.name``, ``gen_ai.request.model``) of a model."""
    kind = type(model).__name__
    provider = getattr(model, "provider_name", None) or _PROVIDERS.get(kind, kind)
    name = getattr(model, "model", None)
    return str(provider), str(name) if isinstance(name, str) and name else kind


class Telemetry(RunObserver):
    """Spans and histograms of the runs of one runtime (see the module docs)."""

    def __init__(self, agent: Agent, store: Store, *, tracer_provider: ApiTracerProvider | None = None, contents: bool = False) -> None:
        provider, model = describe_model(agent.model)
        tiers = {name: str(tool.risk) for name, tool in agent.tools.items()}
        self.info = ModelInfo(agent.name, provider, model, tiers, contents)
        self.histograms = Histograms()
        self.store = store
        self._maker: SpanMaker | None = None
        if tracer_provider is not None:
            from ._spans import SpanMaker

            self._maker = SpanMaker(tracer_provider)
        self._own_provider: TracerProvider | None = None
        self._runs: dict[str, RunTrace] = {}
        self._aside: set[asyncio.Task[None]] = set()

    @classmethod
    def from_environment(cls, agent: Agent, store: Store, *, tracer_provider: ApiTracerProvider | None = None, contents: bool = False) -> Telemetry:
        """Telemetry whose spans go to ``tracer_provider``, else where ``OTEL_*`` says (if anywhere)."""
        import os

        # The variable OpenTelemetry's GenAI instrumentations read for the same opt-in.
        contents = contents or os.environ.get("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "").strip().lower() == "true"
        own = None
        if tracer_provider is None:
            own = tracer_provider_from_environment()
        telemetry = cls(agent, store, tracer_provider=tracer_provider or own, contents=contents)
        if own is not None and own is not _global_provider():
            telemetry._own_provider = own
        return telemetry

    @property
    def tracing(self) -> bool:
        """True when spans are made."""
        return self._maker is not None

    async def aclose(self) -> None:
        """Finish the writes under way, and flush and stop the exporter this made."""
        if self._aside:
            await asyncio.wait(list(self._aside), timeout=5)
        for trace in self._runs.values():
            trace.abandon()
        self._runs.clear()
        if self._own_provider is not None:
            await asyncio.to_thread(self._own_provider.shutdown)

    # -- the runtime's observer ------------------------------------------------------------

    def launched(self, run: RunRecord, *, resume: InterruptRecord | None, takeover: bool) -> None:
        trace = self._runs.get(run.id)
        if trace is not None and resume is None and not takeover:
            trace.created_ns = datetime_ns(run.created_at)  # begun by its run_started event
            return
        if trace is not None:
            trace.abandon()
        parent = self._maker.remote(run.trace_context) if self._maker is not None else None
        if resume is not None:
            self._review_ended(run, resume)
        kind = "resume" if resume is not None else "takeover" if takeover else "start"
        trace = self._runs[run.id] = RunTrace(run.id, run.thread_id, self.info, self.histograms, self._maker, parent, kind, time.time_ns())
        trace.created_ns = datetime_ns(run.created_at)
        if run.trace_context is None and self._maker is not None:
            self._store_context(run.id, trace.stretch_traceparent())

    def executing(self, run: RunRecord) -> contextlib.AbstractContextManager[None]:
        trace = self._runs.get(run.id)
        return _bound(trace.labels if trace is not None else None)

    def committed(self, run_id: str, batch: Sequence[StoredEvent]) -> None:
        if not batch:
            return
        now = time.time_ns()
        self.histograms.commit.observe(max(now - ts_ns(batch[0].envelope), 0) / 1e9)
        trace = self._runs.get(run_id)
        for stored in batch:
            kind = stored.type
            if kind in _DELTAS:
                if trace is not None:
                    trace.delta(kind, stored.envelope)
            elif trace is not None:
                if not trace.event(kind, stored.envelope):
                    del self._runs[run_id]
                    if kind == "cancelled":
                        self._aside_task(self._cancel_latency(run_id, stored.envelope, now))
                    trace = None
            elif kind == "run_started":
                trace = self._first_stretch(run_id, stored.envelope)
            elif kind in _TERMINAL:
                self._aside_task(self._ended_elsewhere(run_id, kind, stored.envelope, now))

    def outbound_span(self, name: str, *, traceparent: str | None, attributes: Mapping[str, Any]) -> OutboundSpan:
        """A CLIENT span of a request Tether sends itself (a webhook), begun now under a run's
        stored ``traceparent``; its :attr:`~OutboundSpan.traceparent` goes with the request."""
        return OutboundSpan(self._maker, name, traceparent, attributes)

    def model_call_ended(self, run_id: str, usage: Usage) -> None:
        trace = self._runs.get(run_id)
        if trace is not None:
            trace.model_call_ended(usage.input_tokens, usage.output_tokens)

    # -- stretches, waits, contexts --------------------------------------------------------

    def _first_stretch(self, run_id: str, envelope: str) -> RunTrace:
        """A run's ``run_started`` committed here: its first stretch, under the caller's trace."""
        thread_id = json.loads(envelope)["data"]["thread_id"]
        incoming = incoming_trace.get()
        parent = None
        if self._maker is not None:
            # An instrumented server's request span (itself the caller's child), else the caller's.
            parent = self._maker.current() or self._maker.remote(incoming)
        trace = self._runs[run_id] = RunTrace(run_id, thread_id, self.info, self.histograms, self._maker, parent, "start", ts_ns(envelope))
        if self._maker is not None:
            self._store_context(run_id, trace.stretch_traceparent() if parent is None else _traceparent_of(parent))
        elif parse_traceparent(incoming) is not None:  # kept for the processes that do trace
            self._store_context(run_id, incoming)
        return trace

    def _review_ended(
        self, run: RunRecord, interrupt: InterruptRecord, *, outcome: str | None = None, end_ns: int | None = None, actor: str | None = None
    ) -> None:
        outcome = outcome or ("expired" if interrupt.status == "expired" else "decided")
        start = datetime_ns(interrupt.created_at)
        end = end_ns or (datetime_ns(interrupt.resolved_at) if interrupt.resolved_at is not None else time.time_ns())
        self.histograms.review.observe(max(end - start, 0) / 1e9, outcome)
        if self._maker is None:
            return
        decisions = [d.decision for d in interrupt.decisions or []] if outcome != "cancelled" else ["cancel"]
        attributes = {
            "gen_ai.conversation.id": run.thread_id,
            "tether.run.id": run.id,
            "tether.interrupt.id": interrupt.id,
            "tether.review.tools": [a.action for a in interrupt.action_requests],
            "tether.review.decisions": decisions,
            "tether.review.actor": actor or interrupt.resolved_by or "",
            "tether.review.outcome": outcome,
        }
        span = self._maker.start("human_review", client=False, parent=self._maker.remote(run.trace_context), start_ns=start, attributes=attributes)
        self._maker.end(span, end)

    def _store_context(self, run_id: str, traceparent: str | None) -> None:
        if traceparent:
            self._aside_task(self.store.set_trace_context(run_id, traceparent))

    async def _ended_elsewhere(self, run_id: str, kind: str, envelope: str, committed_ns: int) -> None:
        """A run ended here that no stretch of this process executed (a cancel while it waited
        for a human): its duration, its cancel's latency, and the wait the cancel ended."""
        run = await self.store.get_run(run_id)
        at = ts_ns(envelope)
        outcome = {"done": "completed", "error": "failed", "cancelled": "cancelled"}[kind]
        self.histograms.run.observe(max(at - datetime_ns(run.created_at), 0) / 1e9, outcome)
        if kind != "cancelled":
            return
        await self._cancel_latency(run_id, envelope, committed_ns)
        interrupt = await self.store.latest_interrupt(run_id)
        if interrupt is not None and interrupt.status == "cancelled":
            self._review_ended(run, interrupt, outcome="cancelled", end_ns=at, actor=run.cancel_actor)

    async def _cancel_latency(self, run_id: str, envelope: str, committed_ns: int) -> None:
        """From the cancel request (its audit entry, written as it came) to the commit of ``cancelled``."""
        requested = [e.ts for e in await self.store.list_audit(run_id=run_id) if e.action == "cancel" and e.ts is not None]
        if requested:
            mode = str(json.loads(envelope)["data"].get("mode") or "soft")
            self.histograms.cancel.observe(max(committed_ns - datetime_ns(requested[0]), 0) / 1e9, mode)

    def _aside_task(self, work: Any) -> None:
        task = asyncio.get_running_loop().create_task(_logged(work), name="telemetry")
        self._aside.add(task)
        task.add_done_callback(self._aside.discard)


async def _logged(work: Any) -> None:
    try:
        await work
    except Exception:
        log.warning("telemetry could not record a run's trace context or timings", exc_info=True)


@contextlib.contextmanager
def _bound(labels: Any) -> Iterator[None]:
    if labels is None:
        yield
        return
    token = current_run.set(labels)
    try:
        yield
    finally:
        current_run.reset(token)


def _global_provider() -> Any:
    import sys

    if "opentelemetry.trace" not in sys.modules:
        return None
    from opentelemetry import trace

    return trace.get_tracer_provider()


def _traceparent_of(context: Any) -> str | None:
    from opentelemetry import trace

    from ._context import format_traceparent

    span_context = trace.get_current_span(context).get_span_context()
    return format_traceparent(span_context.trace_id, span_context.span_id, int(span_context.trace_flags)) if span_context.is_valid else None
