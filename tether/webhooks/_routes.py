"""Admin routes of webhook deliveries: list them with their attempts, and redeliver one."""

from __future__ import annotations

from typing import Any, Literal

import sqlalchemy as sa
from fastapi import APIRouter, Query, Request

from .._ids import utcnow
from ..errors import Conflict, NotFound
from ..events import format_ts
from ..server._deps import access_of

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
