"""``GET /metrics``: Prometheus metrics of this server and its database.

Counts that live in the database (runs by status, pending interrupts) are read at scrape
time; in-process figures (executing runs, open event streams, events published and the transactions
that committed them, model tokens consumed, runs taken over) come from the runtime, and the
latency histograms from the telemetry (:mod:`tether.telemetry._histograms`). In a ``--workers``
server those are every worker's, summed (:mod:`._worker_metrics`), so each scrape sees the
whole server whichever worker answers it. Each application has its own registry, so several
apps in one process do not clash. ``prometheus_client`` is imported at the first scrape
(``_prometheus``).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from ._deps import access_of, store_of
from ._worker_metrics import WorkerMetrics, process_counts

router = APIRouter(tags=["ops"])


@router.get("/metrics", include_in_schema=False)
async def metrics(request: Request) -> Response:
    """Prometheus text exposition (needs the ``admin`` role)."""
    access_of(request).require("admin")
    from . import _prometheus

    store = store_of(request)
    state = request.app.state
    if not hasattr(state, "metrics"):
        state.metrics = _prometheus.Exposition()
    exposition: _prometheus.Exposition = state.metrics
    counts = process_counts(request.app)
    shared: WorkerMetrics | None = getattr(state, "worker_metrics", None)
    if shared is not None:
        counts = shared.total(counts)
    snapshot = _prometheus.Snapshot(runs=await store.count_runs_by_status(), pending_interrupts=await store.count_pending_interrupts(), process=counts)
    return Response(exposition.render(snapshot), media_type=_prometheus.CONTENT_TYPE_LATEST)
