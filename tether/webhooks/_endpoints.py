"""An endpoint's state, stored so that every process shares it: a receiver that answered
``410 Gone`` is disabled everywhere (and after a restart) until an admin enables it again."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from .._ids import utcnow
from ._tables import webhook_endpoints, webhook_outbox

if TYPE_CHECKING:
    from ..store import Store
    from ..store._engine import Writing

__all__ = ["EndpointState", "disabled_reason", "disable", "enable", "states", "park_pending"]


@dataclass(frozen=True, slots=True)
class EndpointState:
    """What the store holds of an endpoint (no row: enabled, never changed)."""

    id: str
    disabled_at: datetime | None
    disabled_reason: str | None
    updated_at: datetime | None
    updated_by: str | None


def _state(row: Any) -> EndpointState:
    return EndpointState(row.id, row.disabled_at, row.disabled_reason, row.updated_at, row.updated_by)


async def disabled_reason(conn: Writing, endpoint_id: str) -> str | None:
    """Why the endpoint is disabled (None: it is enabled)."""
    e = webhook_endpoints
    row = (await conn.execute(sa.select(e.c.disabled_at, e.c.disabled_reason).where(e.c.id == endpoint_id))).first()
    if row is None or row.disabled_at is None:
        return None
    return str(row.disabled_reason or "disabled")


async def _upsert(conn: Writing, is_sqlite: bool, values: dict[str, Any]) -> None:
    insert = (sqlite.insert if is_sqlite else postgresql.insert)(webhook_endpoints).values(**values)
    await conn.execute(insert.on_conflict_do_update(index_elements=["id"], set_={k: v for k, v in values.items() if k != "id"}))


async def disable(conn: Writing, is_sqlite: bool, endpoint_id: str, reason: str) -> None:
    """Disable the endpoint for every process, and park its pending deliveries."""
    now = utcnow()
    await _upsert(conn, is_sqlite, {"id": endpoint_id, "disabled_at": now, "disabled_reason": reason, "updated_at": now, "updated_by": None})
    await park_pending(conn, endpoint_id, reason)


async def park_pending(conn: Writing, endpoint_id: str, reason: str) -> int:
    """Mark the endpoint's pending deliveries ``disabled`` (not one a sender holds right now:
    its attempt is recorded when it ends)."""
    o = webhook_outbox
    now = utcnow()
    free = sa.or_(o.c.lease_expires_at.is_(None), o.c.lease_expires_at < now)
    parked = await conn.execute(
        o.update().where(o.c.endpoint == endpoint_id, o.c.status == "pending", free).values(status="disabled", finished_at=now, last_error=reason)
    )
    return int(parked.rowcount or 0)


async def enable(store: Store, endpoint_id: str, actor: str) -> EndpointState:
    """Enable the endpoint again (its ``disabled`` deliveries stay so: each can be redelivered)."""
    now = utcnow()
    async with store._writing() as conn:
        await _upsert(conn, store.is_sqlite, {"id": endpoint_id, "disabled_at": None, "disabled_reason": None, "updated_at": now, "updated_by": actor})
    return EndpointState(endpoint_id, None, None, now, actor)


async def states(store: Store, endpoint_ids: list[str]) -> dict[str, EndpointState]:
    """The stored state of each of ``endpoint_ids`` that has one."""
    if not endpoint_ids:
        return {}
    e = webhook_endpoints
    async with store._reading() as conn:
        rows = await conn.execute(sa.select(e).where(e.c.id.in_(endpoint_ids)))
        return {row.id: _state(row) for row in rows}
