"""One ``/metrics`` for a ``--workers`` server: every worker's counts, summed by the worker scraped.

**Why.** Behind one port the kernel hands each scrape to any worker. A worker that serves only
its own counts makes every counter jump between the workers' values from one scrape to the next:
Prometheus reads each drop as a restart of the process, and ``rate()`` is wrong.

**How.** The supervisor makes a directory (:meth:`WorkerMetrics.create`); each worker writes its
process's counts there, one small JSON file replaced atomically (:class:`ProcessCounts`), once a
second when they changed (:data:`PUBLISH_S`), when it stops, and before it answers a scrape; the
scraped worker answers with the sum of every file (:meth:`WorkerMetrics.total`).

- Counters and histograms sum every worker this supervisor ran, the ended ones too: when the
  supervisor reaps a worker it renames its file ``ended-…`` (:meth:`WorkerMetrics.worker_ended`),
  and the file keeps counting. A worker's death or replacement never makes a counter go down
  (a worker killed by ``SIGKILL`` loses what it counted in its last second, as an unscraped
  process would lose everything).
- Gauges (runs executing, open streams) sum the live workers' files only.
- Never down: a worker writes its file before it reports its own counts, so whatever a scrape
  showed is in the files that the next scrape reads, whichever worker answers it. The other
  workers' counts are at most :data:`PUBLISH_S` old.
- The database's figures (runs by status, pending interrupts) are the same from any worker and
  are read once, as before.

**Why not prometheus_client's multiprocess mode.** It keeps every metric in a memory-mapped file
per process, written at every increment, and needs every metric to be one of its own objects
with ``PROMETHEUS_MULTIPROC_DIR`` set before it is imported. Tether's counts are plain integers
of the runtime and the telemetry's histograms, read only at a scrape: that mode would put a file
write in the path of every token and ``prometheus_client`` into every process, which it is kept
out of until scraped. A supervisor serving the sum itself would need a port of its own (the
workers own the served one), so scrapers would need to know about workers after all.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from fastapi import FastAPI

from ..telemetry._histograms import Histogram

__all__ = ["PUBLISH_S", "ProcessCounts", "WorkerMetrics", "process_counts", "share_counts"]

log = logging.getLogger("tether.server")

#: How often a worker writes its counts when they changed (the most the others' lag at a scrape).
PUBLISH_S = 1.0

#: The fields of :class:`ProcessCounts` that are gauges: summed over the live workers only.
GAUGES = frozenset({"executing", "streams"})

#: A read that found a file renamed under it (a worker just reaped) reads the directory again.
_READ_ATTEMPTS = 5


@dataclass
class ProcessCounts:
    """What one process counts of itself for ``/metrics`` (or, summed, a whole server)."""

    executing: int = 0
    streams: int = 0
    published: int = 0
    event_commits: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    taken_over: int = 0
    histograms: list[Histogram] = field(default_factory=list)

    def to_json(self) -> str:
        """The counts as one JSON document (a worker's file)."""
        numbers = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "histograms"}
        histograms = {h.name: [[list(labels), counts, total[0]] for labels, (counts, total) in h.series.items()] for h in self.histograms}
        return json.dumps({"counts": numbers, "histograms": histograms}, separators=(",", ":"))


def process_counts(app: FastAPI) -> ProcessCounts:
    """This process's counts, read from ``app``'s runtime and telemetry."""
    runtime, telemetry = app.state.runtime, app.state.telemetry
    return ProcessCounts(
        executing=runtime.executing_count(),
        streams=runtime.bus.total_subscribers(),
        published=runtime.bus.published,
        event_commits=runtime.writer.transactions,
        input_tokens=runtime.tokens.input_tokens,
        output_tokens=runtime.tokens.output_tokens,
        taken_over=runtime.taken_over,
        histograms=telemetry.histograms.all(),
    )


class WorkerMetrics:
    """The directory where a ``--workers`` server's processes leave their counts (see the module)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    @classmethod
    def create(cls) -> WorkerMetrics:
        """A new, empty directory: a server's counts start at zero, as a single process's do."""
        import tempfile  # the supervisor's alone

        return cls(Path(tempfile.mkdtemp(prefix="tether-metrics-")))

    def remove(self) -> None:
        """Remove the directory (the supervisor, when it exits)."""
        import shutil

        shutil.rmtree(self.directory, ignore_errors=True)

    def publish(self, counts: ProcessCounts, pid: int | None = None) -> None:
        """Write this process's counts (replacing its file at once: a reader sees old or new)."""
        self.write(counts.to_json(), pid)

    def write(self, document: str, pid: int | None = None) -> None:
        """Write a document of :meth:`ProcessCounts.to_json` as this process's file."""
        pid = os.getpid() if pid is None else pid
        temporary = self.directory / f".tmp-{pid}"
        temporary.write_text(document)
        os.replace(temporary, self.directory / f"live-{pid}.json")

    def worker_ended(self, pid: int) -> None:
        """The supervisor reaped ``pid``: its counters keep counting, its gauges no more."""
        with contextlib.suppress(FileNotFoundError):  # it ended before it wrote any
            os.replace(self.directory / f"live-{pid}.json", self.directory / f"ended-{pid}-{os.urandom(4).hex()}.json")

    def total(self, own: ProcessCounts) -> ProcessCounts:
        """The whole server's counts: ``own`` written first, then every worker's file summed."""
        self.publish(own)
        for _ in range(_READ_ATTEMPTS):
            try:
                return self._sum(own)
            except FileNotFoundError:
                continue  # renamed while read: the supervisor just reaped a worker
        return self._sum(own)

    def _sum(self, own: ProcessCounts) -> ProcessCounts:
        total = ProcessCounts(histograms=[Histogram(h.name, h.help, h.buckets, h.labels) for h in own.histograms])
        by_name = {h.name: h for h in total.histograms}
        for path in sorted(self.directory.glob("*.json")):
            document = json.loads(path.read_text())
            live = path.name.startswith("live-")
            for name, value in document["counts"].items():
                if hasattr(total, name) and (live or name not in GAUGES):
                    setattr(total, name, getattr(total, name) + value)
            for name, series in document["histograms"].items():
                histogram = by_name.get(name)
                if histogram is not None:
                    _add(histogram, series)
        return total


def _add(histogram: Histogram, series: list[Any]) -> None:
    """Add one worker's series of ``histogram`` (as :meth:`ProcessCounts.to_json` wrote them)."""
    for labels, counts, value in series:
        key = tuple(labels)
        entry = histogram.series.get(key)
        if entry is None:
            entry = histogram.series[key] = ([0] * (len(histogram.buckets) + 1), [0.0])
        mine, total = entry
        for i, count in enumerate(counts[: len(mine)]):
            mine[i] += count
        total[0] += value


def share_counts(app: FastAPI, shared: WorkerMetrics) -> None:
    """Make ``app`` (a worker's) write its counts to ``shared`` while it serves, and its
    ``/metrics`` answer with the sum of every worker's."""
    app.state.worker_metrics = shared
    inner = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(app_: Any) -> AsyncIterator[Any]:
        async with inner(app_) as state:
            publishing = asyncio.create_task(_publish_forever(app, shared), name="metrics publish")
            try:
                yield state
            finally:
                publishing.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await publishing
        # After the drain and the hand-over: what the last runs counted.
        shared.publish(process_counts(app))

    app.router.lifespan_context = lifespan


async def _publish_forever(app: FastAPI, shared: WorkerMetrics) -> None:
    written = None
    while True:
        try:
            document = process_counts(app).to_json()
            if document != written:
                shared.write(document)
                written = document
        except OSError as exc:  # a full disk, the directory gone: the next round tries again
            log.warning("could not write this worker's counts for /metrics: %s", exc)
        await asyncio.sleep(PUBLISH_S)
