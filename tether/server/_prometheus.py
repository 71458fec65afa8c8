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
from ._worker_metrics import ProcessCounts

__all__ = ["CONTENT_TYPE_LATEST", "Exposition", "Snapshot"]

_STATUSES = tuple(RunStatus)


@dataclass
class Snapshot:
    """The values one scrape gathered: the database's, and the process's (or, in a
    ``--workers`` server, every worker's summed)."""

    runs: dict[str, int] = field(default_factory=dict)
    pending_interrupts: int = 0
    process: ProcessCounts = field(default_factory=ProcessCounts)


class _Collector(Collector):
    """Reports the values of the exposition's latest snapshot."""

    def __init__(self) -> None:
        self.snapshot = Snapshot()

    def collect(self) -> Iterator[Metric]:
        s, p = self.snapshot, self.snapshot.process
        runs = GaugeMetricFamily("tether_runs", "Runs in the database by status.", labels=["status"])
        for status in _STATUSES:
            runs.add_metric([status], s.runs.get(status, 0))
        yield runs
        yield GaugeMetricFamily("tether_pending_interrupts", "Interrupts waiting for a human decision.", value=s.pending_interrupts)
        # "This server": one process, or every worker of a --workers server (summed).
        yield GaugeMetricFamily("tether_executing_runs", "Runs executing in this server.", value=p.executing)
        yield GaugeMetricFamily("tether_event_streams", "Open event streams (SSE followers) in this server.", value=p.streams)
        yield CounterMetricFamily("tether_events_published", "Events committed and published by this server.", value=p.published)
        yield CounterMetricFamily(
            "tether_event_commits", "Transactions that committed runs' events in this server (many runs' events share one).", value=p.event_commits
        )
        tokens = CounterMetricFamily("tether_model_tokens", "Tokens consumed by the model calls of this server, by kind.", labels=["kind"])
        tokens.add_metric(["input"], p.input_tokens)
        tokens.add_metric(["output"], p.output_tokens)
        yield tokens
        yield CounterMetricFamily(
            "tether_runs_taken_over",
            "Runs this server took over: from a process that died or was stopped, or left unfinished by the previous start.",
            value=p.taken_over,
        )
        for histogram in p.histograms:
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
