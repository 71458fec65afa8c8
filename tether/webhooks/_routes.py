"""Admin routes of webhooks: list deliveries with their attempts, redeliver one; list the
endpoints with their stored state, and enable one a 410 disabled."""

from __future__ import annotations

from typing import Any, Literal

import sqlalchemy as sa
from fastapi import APIRouter, Query, Request

from .._ids import utcnow
from ..errors import Conflict, NotFound
from ..events import format_ts
from ..server._deps import access_of, actor_of

__all__ = ["router"]

router = APIRouter(tags=["webhooks"])

Status = Literal["pending", "delivered", "failed", "skipped", "disabled"]


def _ts(value: Any) -> str | None:
    return format_ts(value) if value is not None else None


def _delivery(row: Any) -> dict[str, Any]:
    return {
        "id": row.id,
        "endpoint": row.endpoint,
        "type": row.event_type,
        "thread_id": row.thread_id,
        "status": row.status,
        "attempts": row.attempts,
        "created_at": _ts(row.created_at),
        "next_attempt_at": _ts(row.next_attempt_at) if row.status == "pending" else None,
        "finished_at": _ts(row.finished_at),
        "last_error": row.last_error,
    }


@router.get("/v1/webhooks/deliveries")
async def list_deliveries(request: Request, status: Status | None = None, limit: int = Query(100, ge=1, le=1000)) -> dict[str, Any]:
    """Webhook deliveries, newest first (admin)."""
    access_of(request).require("admin")
    from ._tables import webhook_outbox as o

    query = sa.select(o).order_by(o.c.seq.desc()).limit(limit)
    if status is not None:
        query = query.where(o.c.status == status)
    async with request.app.state.store._reading() as conn:
        rows = list(await conn.execute(query))
    return {"deliveries": [_delivery(r) for r in rows]}


@router.get("/v1/webhooks/deliveries/{delivery_id}")
async def get_delivery(request: Request, delivery_id: str) -> dict[str, Any]:
    """One delivery with its attempts, oldest first (admin)."""
    access_of(request).require("admin")
    from ._tables import webhook_attempts as a
    from ._tables import webhook_outbox as o

    async with request.app.state.store._reading() as conn:
        row = (await conn.execute(sa.select(o).where(o.c.id == delivery_id[:64]))).first()
        if row is None:
            raise NotFound(f"webhook delivery {delivery_id[:64]!r} not found", code="delivery_not_found")
        attempts = list(await conn.execute(sa.select(a).where(a.c.outbox_id == row.id).order_by(a.c.attempt, a.c.id)))
    view = _delivery(row)
    view["body"] = row.body
    view["attempt_log"] = [
        {
            "attempt": t.attempt,
            "sender": t.sender,
            "started_at": _ts(t.started_at),
            "duration_ms": t.duration_ms,
            "status_code": t.status_code,
            "outcome": t.outcome,
            "error": t.error,
        }
        for t in attempts
    ]
    return view


@router.post("/v1/webhooks/deliveries/{delivery_id}/redeliver")
async def redeliver(request: Request, delivery_id: str) -> dict[str, Any]:
    """Send a delivery again, with the same ``webhook-id`` (admin): it is pending, due now.

    409 ``delivery_in_flight`` while a sender holds it (its lease is live): clearing that lease
    would send the same ``webhook-id`` twice at once."""
    access_of(request).require("admin")
    from ._tables import webhook_outbox as o

    now = utcnow()
    store = request.app.state.store
    async with store._writing() as conn:
        row = (await conn.execute(sa.select(o.c.seq).where(o.c.id == delivery_id[:64]))).first()
        if row is None:
            raise NotFound(f"webhook delivery {delivery_id[:64]!r} not found", code="delivery_not_found")
        # created_at restarts too: the retry period counts from the redelivery.
        free = sa.or_(o.c.lease_expires_at.is_(None), o.c.lease_expires_at < now)
        changed = await conn.execute(
            o.update()
            .where(o.c.seq == row.seq, free)
            .values(status="pending", next_attempt_at=now, created_at=now, attempts=0, lease_owner=None, lease_expires_at=None, finished_at=None)
        )
        if changed.rowcount != 1:
            raise Conflict(
                f"webhook delivery {delivery_id[:64]!r} is being sent right now; redeliver it once that attempt is recorded", code="delivery_in_flight"
            )
        found = (await conn.execute(sa.select(o).where(o.c.seq == row.seq))).first()
    sender = getattr(request.app.state, "webhooks", None)
    if sender is not None:
        sender.wake()
    return _delivery(found)


def _endpoints_of(request: Request) -> list[Any]:
    """The endpoints this process is configured with (none without webhooks)."""
    sender = getattr(request.app.state, "webhooks", None)
    return list(sender.settings.endpoints) if sender is not None else []


def _endpoint(endpoint: Any, state: Any) -> dict[str, Any]:
    import httpx  # a server with webhooks has it loaded already

    # The URL without credentials or query (either may hold a token).
    url = httpx.URL(endpoint.url).copy_with(username=None, password=None, query=None, fragment=None)
    disabled = state is not None and state.disabled_at is not None
    return {
        "id": endpoint.id,
        "url": str(url),
        "events": sorted(endpoint.events) if endpoint.events is not None else None,
        "status": "disabled" if disabled else "enabled",
        "disabled_at": _ts(state.disabled_at) if disabled else None,
        "disabled_reason": state.disabled_reason if disabled else None,
        "updated_at": _ts(state.updated_at) if state is not None else None,
        "updated_by": state.updated_by if state is not None else None,
    }


@router.get("/v1/webhooks/endpoints")
async def list_endpoints(request: Request) -> dict[str, Any]:
    """The configured endpoints with their state, shared by every process (admin)."""
    access_of(request).require("admin")
    from ._endpoints import states

    endpoints = _endpoints_of(request)
    known = await states(request.app.state.store, [e.id for e in endpoints])
    return {"endpoints": [_endpoint(e, known.get(e.id)) for e in endpoints]}


@router.post("/v1/webhooks/endpoints/{endpoint_id}/enable")
async def enable_endpoint(request: Request, endpoint_id: str) -> dict[str, Any]:
    """Enable an endpoint again, in every process (admin); its ``disabled`` deliveries stay so."""
    access_of(request).require("admin")
    from ._endpoints import enable

    endpoint = next((e for e in _endpoints_of(request) if e.id == endpoint_id), None)
    if endpoint is None:
        raise NotFound(f"webhook endpoint {endpoint_id[:64]!r} not found", code="endpoint_not_found")
    state = await enable(request.app.state.store, endpoint.id, actor_of(request))
    request.app.state.webhooks.wake()
    return _endpoint(endpoint, state)
