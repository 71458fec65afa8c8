"""The delivery worker: claims due deliveries with a lease (one sender at a time across
processes; a killed sender's lease lapses), signs them by the Standard Webhooks spec, sends each
in its own task, and records every attempt."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from .._ids import utcnow
from ..store._tables import interrupts
from ._client import Refused, SafeClient
from ._config import Endpoint, WebhookSettings
from ._tables import webhook_attempts, webhook_outbox

if TYPE_CHECKING:
    from ..store import Store

__all__ = ["Sender"]

log = logging.getLogger("tether.webhooks")


class Sender:
    """Sends the outbox's deliveries for every configured endpoint, one task per endpoint."""

    def __init__(self, store: Store, settings: WebhookSettings) -> None:
        from standardwebhooks import Webhook  # only when webhooks are configured

        self.store = store
        self.settings = settings
        self._signer = Webhook(settings.secret)
        self._client = SafeClient(settings)
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._in_flight: set[asyncio.Task[None]] = set()
        #: Attempts of this process by outcome (``ok``, ``retry``, ``failed``, ``disabled``).
        self.outcomes: dict[str, int] = {}
        #: Endpoints that answered 410 Gone: this process sends them nothing more.
        self.disabled: set[str] = set()

    def wake(self) -> None:
        self._wake.set()

    def start(self) -> None:
        for endpoint in self.settings.endpoints:
            self._tasks.append(asyncio.create_task(self._serve(endpoint), name=f"webhooks {endpoint.id}"))

    async def aclose(self) -> None:
        for task in [*self._tasks, *self._in_flight]:
            task.cancel()
        for task in [*self._tasks, *self._in_flight]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self._client.aclose()

    async def _serve(self, endpoint: Endpoint) -> None:
        slots = asyncio.Semaphore(self.settings.concurrency)
        while endpoint.id not in self.disabled:
            try:
                free = self.settings.concurrency - len([t for t in self._in_flight if t.get_name() == endpoint.id])
                rows = await self._claim(endpoint, free) if free > 0 else []
            except Exception:  # the database is away: try again later
                log.exception("webhooks: claiming deliveries failed")
                rows = []
            for row in rows:
                task = asyncio.create_task(self._deliver(endpoint, row, slots), name=endpoint.id)
                self._in_flight.add(task)
                task.add_done_callback(self._done)
            if not rows:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.settings.poll_s)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._in_flight.discard(task)
        self._wake.set()  # a thread's next delivery may now be due

    async def _claim(self, endpoint: Endpoint, limit: int) -> list[Any]:
        """The due heads of their threads (the oldest pending delivery of each thread), leased to this process."""
        now = utcnow()
        o, p = webhook_outbox, webhook_outbox.alias("earlier")
        earlier_pending = (
            sa.exists()
            .where(p.c.endpoint == o.c.endpoint, p.c.thread_id == o.c.thread_id, p.c.status == "pending", p.c.seq < o.c.seq)
            # A notice not yet due (``interrupt.expiring``) holds nothing up; one that was tried does.
            .where(sa.or_(p.c.attempts > 0, p.c.next_attempt_at <= now))
        )
        free = sa.or_(o.c.lease_expires_at.is_(None), o.c.lease_expires_at < now)
        query = (
            sa.select(o.c.seq, o.c.id, o.c.body, o.c.attempts, o.c.created_at, o.c.event_type, o.c.interrupt_id)
            .where(o.c.endpoint == endpoint.id, o.c.status == "pending", o.c.next_attempt_at <= now, free, ~earlier_pending)
            .order_by(o.c.seq)
            .limit(limit)
        )
        if not self.store.is_sqlite:
            query = query.with_for_update(skip_locked=True, of=o)
        async with self.store._writing() as conn:
            rows = list(await conn.execute(query))
            if not rows:
                return []
            until = now + timedelta(seconds=self.settings.lease_s)
            await conn.execute(o.update().where(o.c.seq.in_([r.seq for r in rows]), free).values(lease_owner=self.store.instance_id, lease_expires_at=until))
            claimed = []
            for row in rows:
                if row.event_type == "interrupt.expiring" and row.interrupt_id:
                    status = (await conn.execute(sa.select(interrupts.c.status).where(interrupts.c.id == row.interrupt_id))).scalar()
                    if status != "pending":  # decided or expired before the lead: nothing to warn of
                        await conn.execute(
                            o.update().where(o.c.seq == row.seq).values(status="skipped", finished_at=now, lease_owner=None, lease_expires_at=None)
                        )
                        continue
                claimed.append(row)
            return claimed

    async def _deliver(self, endpoint: Endpoint, row: Any, slots: asyncio.Semaphore) -> None:
        async with slots:
            started = utcnow()
            t0 = time.monotonic()
            attempt = int(row.attempts) + 1
            status_code: int | None = None
            retry_after: float | None = None
            error: str | None = None
            refused = False
            try:
                signature = self._signer.sign(row.id, started, row.body)
                headers = {"webhook-id": row.id, "webhook-timestamp": str(int(started.timestamp())), "webhook-signature": signature}
                answer = await self._client.post(endpoint.url, row.body, headers)
                status_code, retry_after = answer.status, answer.retry_after
            except Refused as exc:
                error, refused = str(exc), True
            except Exception as exc:  # timeouts, refused connections, resets
                error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            duration_ms = int((time.monotonic() - t0) * 1000)
            outcome, next_at = self._judge(row, attempt, status_code, retry_after, refused=refused)
            if status_code is not None and not 200 <= status_code < 300 and error is None:
                error = f"HTTP {status_code}"
            self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
            if outcome == "disabled":
                self.disabled.add(endpoint.id)
            await self._record(row, endpoint, attempt, started, duration_ms, status_code, outcome, error, next_at)

    def _judge(self, row: Any, attempt: int, status: int | None, retry_after: float | None, *, refused: bool) -> tuple[str, Any]:
        if status is not None and 200 <= status < 300:
            return "ok", None
        if status == 410:
            return "disabled", None
        # Redirects and other 4xx are failures; 429, 5xx, timeouts and connection errors retry.
        retryable = status is None or status == 429 or status >= 500
        if refused or not retryable or attempt >= len(self.settings.schedule):
            return "failed", None
        delay = self.settings.schedule[attempt] * random.uniform(0.9, 1.1)  # jitter, not a secret
        if retry_after is not None:
            delay = max(delay, retry_after)
        next_at = utcnow() + timedelta(seconds=delay)
        if next_at > row.created_at + timedelta(seconds=self.settings.retry_period_s):
            return "failed", None
        return "retry", next_at

    async def _record(
        self, row: Any, endpoint: Endpoint, attempt: int, started: Any, duration_ms: int, status_code: int | None, outcome: str, error: str | None, next_at: Any
    ) -> None:
        o = webhook_outbox
        now = utcnow()
        mine = [o.c.seq == row.seq, o.c.lease_owner == self.store.instance_id, o.c.status == "pending"]
        async with self.store._writing() as conn:
            await conn.execute(
                webhook_attempts.insert().values(
                    outbox_id=row.id,
                    attempt=attempt,
                    sender=self.store.instance_id,
                    started_at=started,
                    duration_ms=duration_ms,
                    status_code=status_code,
                    outcome=outcome,
                    error=error,
                )
            )
            done = {"lease_owner": None, "lease_expires_at": None, "attempts": attempt, "last_error": error}
            if outcome == "ok":
                await conn.execute(o.update().where(*mine).values(status="delivered", finished_at=now, **done))
            elif outcome == "retry":
                await conn.execute(o.update().where(*mine).values(next_attempt_at=next_at, **done))
            elif outcome == "failed":
                await conn.execute(o.update().where(*mine).values(status="failed", finished_at=now, **done))
            else:  # 410 Gone: the receiver asks for no more deliveries
                await conn.execute(o.update().where(*mine).values(status="disabled", finished_at=now, **done))
                await conn.execute(
                    o.update()
                    .where(o.c.endpoint == endpoint.id, o.c.status == "pending")
                    .values(status="disabled", finished_at=now, last_error="endpoint answered 410 Gone")
                )
