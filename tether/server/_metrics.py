"""``GET /metrics``: Prometheus metrics of this server process and its database.

Counts that live in the database (runs by status, pending interrupts) are read at scrape
time; in-process figures (executing runs, open event streams, events published and the transactions
that committed them, model tokens consumed, runs taken over) come from the runtime. Each application has its own registry, so several apps in one process do not clash.
"""

from __future__ import annotations

from collections.abc import Iterator

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..store import RunStatus
from ._deps import access_of, runtime_of, store_of

router = APIRouter(tags=["ops"])

_STATUSES = tuple(RunStatus)


class _Snapshot(Collector):
    """Reports the values gathered by the last scrape."""

    def __init__(self) -> None:
        self.runs: dict[str, int] = {}
        self.pending_interrupts = 0
        self.executing = 0
        self.streams = 0
        self.published = 0
        self.event_commits = 0
        self.input_tokens = 0
        self.output_tokens = 0
        self.taken_over = 0

    def collect(self) -> Iterator[Metric]:
        runs = GaugeMetricFamily("tether_runs", "Runs in the database by status.", labels=["status"])
        for status in _STATUSES:
            runs.add_metric([status], self.runs.get(status, 0))
        yield runs
        yield GaugeMetricFamily("tether_pending_interrupts", "Interrupts waiting for a human decision.", value=self.pending_interrupts)
        yield GaugeMetricFamily("tether_executing_runs", "Runs executing in this process.", value=self.executing)
        yield GaugeMetricFamily("tether_event_streams", "Open event streams (SSE followers) in this process.", value=self.streams)
        yield CounterMetricFamily("tether_events_published", "Events committed and published by this process.", value=self.published)
        yield CounterMetricFamily(
            "tether_event_commits", "Transactions that committed runs' events in this process (many runs' events share one).", value=self.event_commits
        )
        tokens = CounterMetricFamily("tether_model_tokens", "Tokens consumed by the model calls of this process, by kind.", labels=["kind"])
        tokens.add_metric(["input"], self.input_tokens)
        tokens.add_metric(["output"], self.output_tokens)
        yield tokens
        yield CounterMetricFamily(
            "tether_runs_taken_over",
            "Runs this process took over: from a process that died or was stopped, or left unfinished by the previous start.",
            value=self.taken_over,
        )


def _snapshot_of(request: Request) -> tuple[CollectorRegistry, _Snapshot]:
    state = request.app.state
    if not hasattr(state, "metrics"):
        registry = CollectorRegistry()
        snapshot = _Snapshot()
        registry.register(snapshot)
        state.metrics = (registry, snapshot)
    metrics: tuple[CollectorRegistry, _Snapshot] = state.metrics
    return metrics


@router.get("/metrics", include_in_schema=False)
async def metrics(request: Request) -> Response:
    """Prometheus text exposition (needs the ``admin`` role)."""
    access_of(request).require("admin")
    store, runtime = store_of(request), runtime_of(request)
    registry, snapshot = _snapshot_of(request)
    snapshot.runs = await store.count_runs_by_status()
    snapshot.pending_interrupts = await store.count_pending_interrupts()
    snapshot.executing = runtime.executing_count()
    snapshot.streams = runtime.bus.total_subscribers()
    snapshot.published = runtime.bus.published
    snapshot.event_commits = runtime.writer.transactions
    snapshot.input_tokens = runtime.tokens.input_tokens
    snapshot.output_tokens = runtime.tokens.output_tokens
    snapshot.taken_over = runtime.taken_over
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
