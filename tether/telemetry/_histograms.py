"""The latency histograms of ``GET /metrics``: plain counters kept by this process, rendered by
the Prometheus exposition at a scrape (``prometheus_client`` is imported only then).

Names follow the OpenTelemetry GenAI semantic conventions where they define the measurement
(``gen_ai.client.operation.duration`` and ``gen_ai.client.token.usage``, with the conventions'
bucket boundaries), written the Prometheus way (dots as underscores, the unit as a suffix);
the rest are ``tether_*``. Each process counts what it did: the workers of one ``--workers``
server serve their sum (:mod:`tether.server._worker_metrics`); the servers of a PostgreSQL
deployment each serve their own, and a dashboard sums them.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field

__all__ = ["Histogram", "Histograms"]


@dataclass
class Histogram:
    """Counts of observations per bucket (``le``: at most the bound), per label values."""

    name: str
    help: str
    buckets: tuple[float, ...]
    labels: tuple[str, ...] = ()
    #: label values → (count per bucket and one for +Inf, sum of the values)
    series: dict[tuple[str, ...], tuple[list[int], list[float]]] = field(default_factory=dict)

    def observe(self, value: float, *labels: str) -> None:
        """Count one observation of ``value`` (seconds, or tokens) with these label values."""
        entry = self.series.get(labels)
        if entry is None:
            entry = self.series[labels] = ([0] * (len(self.buckets) + 1), [0.0])
        counts, total = entry
        counts[bisect_left(self.buckets, value)] += 1
        total[0] += value

    def cumulative(self, labels: tuple[str, ...]) -> list[tuple[str, int]]:
        """Prometheus's buckets of one series: (``le``, observations at most ``le``), +Inf last."""
        counts, _ = self.series[labels]
        out, running = [], 0
        for bound, count in zip([*map(_le, self.buckets), "+Inf"], counts, strict=True):
            running += count
            out.append((bound, running))
        return out


def _le(bound: float) -> str:
    return repr(float(bound))


#: The conventions' boundaries for gen_ai.client.operation.duration (seconds).
OPERATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)
#: The conventions' boundaries for gen_ai.client.token.usage (tokens).
TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864)
#: Time to the first token: a provider answers in tens of milliseconds to tens of seconds.
FIRST_TOKEN_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)
#: Tools: a lookup takes milliseconds, a call to another service up to minutes.
TOOL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
#: A human's answer: seconds to the default 10-minute expiry, and longer where a tool allows it.
REVIEW_BUCKETS = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 14400.0, 86400.0)
#: Cancel request → ``cancelled``: one commit when it goes well; seconds when a soft cancel waits for a tool.
CANCEL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
#: A whole run, human waits included: a second to a day.
RUN_BUCKETS = (0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 14400.0, 86400.0)
#: Emitted → durable and published (group commit), and committed → written to a stream (lag).
COMMIT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class Histograms:
    """Every histogram one process keeps."""

    def __init__(self) -> None:
        self.operation = Histogram(
            "gen_ai_client_operation_duration_seconds",
            "GenAI operation duration: model calls (chat) of this server.",
            OPERATION_BUCKETS,
            ("gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_request_model", "error_type"),
        )
        self.tokens = Histogram(
            "gen_ai_client_token_usage",
            "Tokens used per model call, by type (input, output).",
            TOKEN_BUCKETS,
            ("gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_request_model", "gen_ai_token_type"),
        )
        self.first_token = Histogram(
            "tether_model_time_to_first_token_seconds", "From a model call's start to its first text or reasoning delta.", FIRST_TOKEN_BUCKETS
        )
        self.tool = Histogram("tether_tool_duration_seconds", "Tool executions, by tool and risk tier.", TOOL_BUCKETS, ("tool", "tier"))
        self.review = Histogram(
            "tether_review_wait_seconds", "From an interrupt's creation to its end, by outcome (decided, expired, cancelled).", REVIEW_BUCKETS, ("outcome",)
        )
        self.cancel = Histogram("tether_cancel_latency_seconds", "From a cancel request to the run's cancelled event, by mode.", CANCEL_BUCKETS, ("mode",))
        self.run = Histogram(
            "tether_run_duration_seconds", "From a run's creation to its terminal event, by outcome (completed, failed, cancelled).", RUN_BUCKETS, ("outcome",)
        )
        self.commit = Histogram(
            "tether_event_commit_seconds", "From an event's emission to its commit and publication (per committed batch of a run).", COMMIT_BUCKETS
        )
        self.stream_lag = Histogram(
            "tether_stream_lag_seconds", "From an event's emission to its write to an event stream (per written batch).", COMMIT_BUCKETS
        )

    def all(self) -> list[Histogram]:
        """Every histogram, in exposition order."""
        return [self.operation, self.tokens, self.first_token, self.tool, self.review, self.cancel, self.run, self.commit, self.stream_lag]
