"""The outbox's upkeep, on a timer and off every request: deliveries past their retry period
are failed (after a long outage they are not sent days late), and finished deliveries past the
retention are deleted with their attempts, in bounded batches."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import TYPE_CHECKING

import sqlalchemy as sa

from .._ids import utcnow
from ._tables import webhook_attempts, webhook_outbox

if TYPE_CHECKING:
    from ..store import Store

__all__ = ["PURGE_BATCH", "STALE_ERROR", "fail_stale", "purge_finished"]

#: Rows deleted per transaction: a purge never holds the (SQLite) write lock for long.
PURGE_BATCH = 500
#: The ``last_error`` of a delivery failed because its retry period ran out before it was sent.
STALE_ERROR = "not delivered within the retry period"

_FINISHED = ("delivered", "failed", "skipped", "disabled")


async def fail_stale(store: Store, retry_period_s: float) -> int:
    """Fail every pending delivery whose retry period is over (none a sender holds)."""
    o = webhook_outbox
    now = utcnow()
    free = sa.or_(o.c.lease_expires_at.is_(None), o.c.lease_expires_at < now)
    stale = o.c.created_at < now - timedelta(seconds=retry_period_s)
    async with store._writing() as conn:
        failed = await conn.execute(o.update().where(o.c.status == "pending", stale, free).values(status="failed", finished_at=now, last_error=STALE_ERROR))
        return int(failed.rowcount or 0)


async def purge_finished(store: Store, retention_s: float, *, batch: int = PURGE_BATCH, pause_s: float = 0.05) -> int:
    """Delete the deliveries that finished more than ``retention_s`` ago, and their attempts,
    ``batch`` at a time; returns how many."""
    o, a = webhook_outbox, webhook_attempts
    cutoff = utcnow() - timedelta(seconds=retention_s)
    purged = 0
    while True:
        async with store._writing() as conn:
            rows = list(
                await conn.execute(sa.select(o.c.seq, o.c.id).where(o.c.finished_at < cutoff, o.c.status.in_(_FINISHED)).order_by(o.c.finished_at).limit(batch))
            )
            if rows:
                await conn.execute(a.delete().where(a.c.outbox_id.in_([r.id for r in rows])))
                await conn.execute(o.delete().where(o.c.seq.in_([r.seq for r in rows])))
        purged += len(rows)
        if len(rows) < batch:
            return purged
        await asyncio.sleep(pause_s)  # let the writes of runs and deliveries through
