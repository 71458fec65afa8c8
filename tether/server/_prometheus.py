"""The Prometheus exposition of ``GET /metrics`` (``_metrics``), imported at the first scrape:
``prometheus_client`` brings ``http.server``, ``wsgiref`` and ``urllib.request`` (about 1.3 MiB)
into a process, which one that is never scraped does without."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from ..store import RunStatus
from ..telemetry._histograms import Histogram

__all__ = ["CONTENT_TYPE_LATEST", "Exposition", "Snapshot"]

_STATUSES = tuple(RunStatus)


@dataclass
class Snapshot:
    """The values one scrape gathered."""

    runs: dict[str, int] = field(default_factory=dict)
    pending_interrupts: int = 0
    executing: int = 0
    streams: int = 0
    published: int = 0
    event_commits: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    taken_over: int = 0
    histograms: list[Histogram] = field(default_factory=list)


class _Collector(Collector):
    """Reports the values of the exposition's latest snapshot."""

    def __init__(self) -> None:
        self.snapshot = Snapshot()

    def collect(self) -> Iterator[Metric]:
        s = self.snapshot
        runs = GaugeMetricFamily("tether_runs", "Runs in the database by status.", labels=["status"])
        for status in _STATUSES:
            runs.add_metric([status], s.runs.get(status, 0))
        yield runs
        yield GaugeMetricFamily("tether_pending_interrupts", "Interrupts waiting for a human decision.", value=s.pending_interrupts)
        yield GaugeMetricFamily("tether_executing_runs", "Runs executing in this process.", value=s.executing)
        yield GaugeMetricFamily("tether_event_streams", "Open event streams (SSE followers) in this process.", value=s.streams)
        yield CounterMetricFamily("tether_events_published", "Events committed and published by this process.", value=s.published)
        yield CounterMetricFamily(
            "tether_event_commits", "Transactions that committed runs' events in this process (many runs' events share one).", value=s.event_commits
        )
        tokens = CounterMetricFamily("tether_model_tokens", "Tokens consumed by the model calls of this process, by kind.", labels=["kind"])
        tokens.add_metric(["input"], s.input_tokens)
        tokens.add_metric(["output"], s.output_tokens)
        yield tokens
        yield CounterMetricFamily(
            "tether_runs_taken_over",
            "Runs this process took over: from a process that died or was stopped, or left unfinished by the previous start.",
            value=s.taken_over,
        )
        for histogram in s.histograms:
            family = HistogramMetricFamily(histogram.name, histogram.help, labels=list(histogram.labels))
            for labels, (_, total) in sorted(histogram.series.items()):
                family.add_metric(list(labels), histogram.cumulative(labels), sum_value=total[0])
            yield family


class Exposition:
    """One application's registry (several apps in one process do not clash)."""

    def __init__(self) -> None:
        self._registry = CollectorRegistry()
        self._collector = _Collector()
        self._registry.register(self._collector)

    def render(self, snapshot: Snapshot) -> bytes:
        """The text exposition of ``snapshot``."""
        self._collector.snapshot = snapshot
        return generate_latest(self._registry)
