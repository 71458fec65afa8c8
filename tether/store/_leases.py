"""Which process executes each run: its claim (a *lease*) on it, renewed, released, taken over.

A process executing a run holds a lease on it (``runs.executor_id``, ``lease_expires_at``) and
renews it while it runs; a run whose lease lapsed (its process died) or was released (its
process stopped) is claimed by another process, by one conditional write, so exactly one wins it.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import sqlalchemy as sa

from .._ids import as_utc, utcnow
from ..events import CancelMode
from ._engine import StoreBase
from ._records import EXECUTOR_RUN_STATUSES, RunRecord, cancel_mode_of, run_record
from ._tables import runs

__all__ = ["LeaseStore"]


class LeaseStore(StoreBase):
    """Lease operations of :class:`~tether.store.Store`."""

    async def renew_leases(self, run_ids: Sequence[str]) -> dict[str, CancelMode | None]:
        """Extend this process's claim on the runs it executes. Returns the runs it still holds
        (a run missing from the answer was taken over by another process), each with the cancel
        mode recorded for it if it is ``cancelling`` (else None): what the lease keeper checks
        for a cancel whose notification was lost, in the same statement."""
        if not run_ids:
            return {}
        async with self._writing() as conn:
            result = await conn.execute(
                runs.update()
                .where(runs.c.id.in_(list(run_ids)), runs.c.executor_id == self.instance_id)
                .values(lease_expires_at=self._lease_values()["lease_expires_at"])
                .returning(runs.c.id, runs.c.status, runs.c.cancel_mode)
            )
            return {run_id: cancel_mode_of(cancel_mode) if status == "cancelling" else None for run_id, status, cancel_mode in result}

    async def release_runs(self, run_ids: Sequence[str]) -> list[str]:
        """Give up this process's claim on runs it stopped executing (it is shutting down), so
        that another process may take them over at once instead of when the lease lapses.
        Returns the runs released: those this process still held, needing an executor."""
        if not run_ids:
            return []
        async with self._writing() as conn:
            result = await conn.execute(
                runs.update()
                .where(
                    runs.c.id.in_(list(run_ids)),
                    runs.c.executor_id == self.instance_id,
                    runs.c.status.in_(_EXECUTOR_STATUSES),
                )
                .values(executor_id=None, lease_expires_at=None)
                .returning(runs.c.id)
            )
            return [row[0] for row in result]

    async def next_lease_lapse(self) -> datetime | None:
        """When the earliest claim another process holds on a run needing an executor runs out
        (None if there is none): the moment to look for an abandoned run next."""
        query = sa.select(sa.func.min(runs.c.lease_expires_at)).where(
            runs.c.status.in_(_EXECUTOR_STATUSES),
            runs.c.executor_id != self.instance_id,
        )
        async with self._point_reading() as conn:
            earliest: datetime | None = (await conn.execute(query)).scalar()
        return as_utc(earliest)

    async def claim_abandoned(self, *, limit: int = 20) -> list[RunRecord]:
        """Claim runs that need an executor and whose claim has lapsed (the process that
        executed them died). Each is claimed by one conditional write: exactly one process
        wins it."""
        now = utcnow()
        query = (
            runs.select()
            .where(
                runs.c.status.in_(_EXECUTOR_STATUSES),
                sa.or_(runs.c.lease_expires_at.is_(None), runs.c.lease_expires_at < now),
            )
            .limit(limit)
        )
        async with self._reading() as conn:
            candidates = (await conn.execute(query)).all()
        claimed: list[RunRecord] = []
        for row in candidates:
            async with self._writing() as conn:
                result = await conn.execute(
                    runs.update()
                    .where(
                        runs.c.id == row.id,
                        runs.c.status.in_(_EXECUTOR_STATUSES),
                        sa.or_(runs.c.lease_expires_at.is_(None), runs.c.lease_expires_at < now),
                    )
                    .values(**self._lease_values())
                )
                if result.rowcount == 1:
                    fresh = (await conn.execute(runs.select().where(runs.c.id == row.id))).first()
                    claimed.append(run_record(fresh))
        return claimed

    async def claim_all_active(self) -> list[RunRecord]:
        """Single-process start-up (SQLite): every run that needs an executor is ours."""
        needs_executor = runs.c.status.in_(_EXECUTOR_STATUSES)
        async with self._writing() as conn:
            await conn.execute(runs.update().where(needs_executor).values(**self._lease_values()))
            rows = (await conn.execute(runs.select().where(needs_executor))).all()
        return [run_record(r) for r in rows]


#: The statuses of a run that needs an executor, as the column holds them.
_EXECUTOR_STATUSES = [status.value for status in EXECUTOR_RUN_STATUSES]
