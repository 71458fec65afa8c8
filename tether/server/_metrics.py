"""``GET /metrics``: Prometheus metrics of this server process and its database.

Counts that live in the database (runs by status, pending interrupts) are read at scrape
time; in-process figures (executing runs, open event streams, events published and the transactions
that committed them, model tokens consumed, runs taken over) come from the runtime, and the
latency histograms from the telemetry (:mod:`tether.telemetry._histograms`). Each application has its own registry, so several apps in one process do not clash.
``prometheus_client`` is imported at the first scrape (``_prometheus``).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from ._deps import access_of, runtime_of, store_of, telemetry_of

router = APIRouter(tags=["ops"])


@router.get("/metrics", include_in_schema=False)
async def metrics(request: Request) -> Response:
    """Prometheus text exposition (needs the ``admin`` role)."""
    access_of(request).require("admin")
    from . import _prometheus

    store, runtime = store_of(request), runtime_of(request)
    state = request.app.state
    if not hasattr(state, "metrics"):
        state.metrics = _prometheus.Exposition()
    exposition: _prometheus.Exposition = state.metrics
    snapshot = _prometheus.Snapshot(
        runs=await store.count_runs_by_status(),
        pending_interrupts=await store.count_pending_interrupts(),
        executing=runtime.executing_count(),
        streams=runtime.bus.total_subscribers(),
        published=runtime.bus.published,
        event_commits=runtime.writer.transactions,
        input_tokens=runtime.tokens.input_tokens,
        output_tokens=runtime.tokens.output_tokens,
        taken_over=runtime.taken_over,
        histograms=telemetry_of(request).histograms.all(),
    )
    return Response(exposition.render(snapshot), media_type=_prometheus.CONTENT_TYPE_LATEST)
