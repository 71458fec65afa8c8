"""The outbox writer: the store calls it inside the transaction of each notable change, so a
notification exists exactly when its change committed."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import sqlalchemy as sa

from .._ids import new_id, utcnow
from ..events import format_ts
from ..review import Decision, Reject
from ..store._records import RunFailure
from ..store._tables import runs
from ._config import WebhookSettings
from ._tables import webhook_outbox

if TYPE_CHECKING:
    from ..store._allowances import AllowanceRecord
    from ..store._engine import Writing
    from ..store._records import InterruptRecord

__all__ = ["Outbox"]

_RUN_EVENTS = {"completed": "run.completed", "failed": "run.failed", "cancelled": "run.cancelled"}


@dataclass(slots=True)
class Outbox:
    """Builds the outbox rows of a change and inserts them on the change's own connection."""

    settings: WebhookSettings
    #: Set after each write; the sender waits on it (it never gates correctness: it polls too).
    wake: Any = None

    def _link(self, thread_id: str) -> str | None:
        base = self.settings.public_url
        return f"{base.rstrip('/')}/?thread={quote(thread_id)}" if base else None

    async def _insert(
        self, conn: Writing, event_type: str, thread_id: str, data: dict[str, Any], *, interrupt_id: str | None = None, not_before: datetime | None = None
    ) -> None:
        now = utcnow()
        rows = []
        for endpoint in self.settings.endpoints:
            if not endpoint.wants(event_type):
                continue
            body = json.dumps({"type": event_type, "timestamp": format_ts(now), "data": data}, separators=(",", ":"), ensure_ascii=False)
            rows.append(
                {
                    "id": new_id("msg"),
                    "endpoint": endpoint.id,
                    "event_type": event_type,
                    "thread_id": thread_id,
                    "interrupt_id": interrupt_id,
                    # Every payload names its run: its trace context goes with the delivery.
                    "run_id": data.get("run_id"),
                    "body": body,
                    "status": "pending",
                    # The retry period counts from when it is due, not from the change.
                    "created_at": not_before or now,
                    "next_attempt_at": not_before or now,
                    "attempts": 0,
                }
            )
        if rows:
            await conn.execute(webhook_outbox.insert(), rows)
            if self.wake is not None:
                self.wake()

    async def _requester(self, conn: Writing, run_id: str) -> tuple[str, str | None, Any]:
        row = (await conn.execute(sa.select(runs.c.thread_id, runs.c.requested_by, runs.c.error).where(runs.c.id == run_id))).first()
        if row is None:
            return "", None, None
        return str(row[0]), row[1], row[2]

    def _interrupt_data(self, interrupt: InterruptRecord, requested_by: str | None) -> dict[str, Any]:
        return {
            "interrupt_id": interrupt.id,
            "run_id": interrupt.run_id,
            "thread_id": interrupt.thread_id,
            "requested_by": requested_by,
            "status": interrupt.status,
            # Sensitive arguments are masked in the record already, as reviewers see them.
            "actions": [a.model_dump(mode="json") for a in interrupt.action_requests],
            "created_at": format_ts(interrupt.created_at),
            "expires_at": format_ts(interrupt.expires_at),
            "url": self._link(interrupt.thread_id),
        }

    async def interrupt_created(self, conn: Writing, interrupt: InterruptRecord) -> None:
        """``interrupt.created``, and ``interrupt.expiring`` due the lead before the expiry."""
        _, requested_by, _ = await self._requester(conn, interrupt.run_id)
        data = self._interrupt_data(interrupt, requested_by)
        await self._insert(conn, "interrupt.created", interrupt.thread_id, data, interrupt_id=interrupt.id)
        due = interrupt.expires_at - timedelta(seconds=self.settings.expiring_lead_s)
        if due > interrupt.created_at:
            await self._insert(conn, "interrupt.expiring", interrupt.thread_id, data, interrupt_id=interrupt.id, not_before=due)

    async def interrupt_left(self, conn: Writing, interrupt: InterruptRecord) -> None:
        """``interrupt.decided`` (decisions without their arguments, and the actor) or ``interrupt.expired``."""
        _, requested_by, _ = await self._requester(conn, interrupt.run_id)
        data = self._interrupt_data(interrupt, requested_by)
        data["resolved_at"] = format_ts(interrupt.resolved_at) if interrupt.resolved_at else None
        if interrupt.status == "expired":
            await self._insert(conn, "interrupt.expired", interrupt.thread_id, data, interrupt_id=interrupt.id)
            return
        # An edit's arguments may hold what masking hides, a response may be long: each decision
        # goes out as its call, its kind and, for a rejection, the reason given.
        data["decisions"] = [_decision_payload(d) for d in interrupt.decisions or []]
        data["decided_by"] = interrupt.resolved_by
        await self._insert(conn, "interrupt.decided", interrupt.thread_id, data, interrupt_id=interrupt.id)

    async def run_finished(self, conn: Writing, run_id: str, status: str) -> None:
        """``run.completed`` / ``run.failed`` / ``run.cancelled``."""
        event_type = _RUN_EVENTS.get(str(status))
        if event_type is None:
            return
        thread_id, requested_by, error = await self._requester(conn, run_id)
        data: dict[str, Any] = {"run_id": run_id, "thread_id": thread_id, "requested_by": requested_by, "status": str(status), "url": self._link(thread_id)}
        failure = RunFailure.from_json(error)
        if event_type == "run.failed" and failure is not None:
            data["error"] = failure.to_json()
        await self._insert(conn, event_type, thread_id, data)

    async def allowance_created(self, conn: Writing, allowance: AllowanceRecord) -> None:
        """``allowance.created``: the allowance as the API shows it (from its record), and a link."""
        data: dict[str, Any] = {**allowance.as_json(allowance.created_at), "url": self._link(allowance.thread_id)}
        await self._insert(conn, "allowance.created", allowance.thread_id, data, interrupt_id=allowance.interrupt_id)


def _decision_payload(decision: Decision) -> dict[str, Any]:
    """One decision as ``interrupt.decided`` carries it: ``{call_id, type, reason?}``."""
    payload: dict[str, Any] = {"call_id": decision.call_id, "type": decision.decision}
    if isinstance(decision, Reject):
        payload["reason"] = decision.reason
    return payload
