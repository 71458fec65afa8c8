"""The delivery worker: claims due deliveries with a lease (one sender at a time across
processes; a killed sender's lease lapses), signs them by the Standard Webhooks spec, sends each
in its own task with the run's ``traceparent`` (and a span of its own), and records every
attempt. An endpoint disabled by a 410 is skipped by every process (``_endpoints``); the
outbox's upkeep runs on a timer (``_maintenance``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import httpx
import sqlalchemy as sa

from .._ids import utcnow
from ..store._tables import interrupts, runs
from ._client import Refused, SafeClient
from ._config import Endpoint, WebhookSettings
from ._endpoints import disable, disabled_reason, park_pending
from ._maintenance import STALE_ERROR, fail_stale, purge_finished
from ._tables import webhook_attempts, webhook_outbox

if TYPE_CHECKING:
    from ..store import Store
    from ..telemetry import OutboundSpan, Telemetry

__all__ = ["Sender"]

log = logging.getLogger("tether.webhooks")


class Sender:
    """Sends the outbox's deliveries for every configured endpoint, one task per endpoint."""

    def __init__(self, store: Store, settings: WebhookSettings, *, allow_private: bool, telemetry: Telemetry | None = None) -> None:
        from standardwebhooks import Webhook  # only when webhooks are configured

        self.store = store
        self.settings = settings
        self.telemetry = telemetry
        self._signer = Webhook(settings.secret)
        self._client = SafeClient(settings, allow_private=allow_private)
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._in_flight: set[asyncio.Task[None]] = set()
        #: Finished attempts not yet written; one writer task records them together.
        self._attempts: list[_Attempt] = []
        self._attempts_ready = asyncio.Event()
        #: Attempts of this process by outcome (``ok``, ``retry``, ``failed``, ``disabled``).
        self.outcomes: dict[str, int] = {}

    def wake(self) -> None:
        self._wake.set()

    def start(self) -> None:
        for endpoint in self.settings.endpoints:
            self._tasks.append(asyncio.create_task(self._serve(endpoint), name=f"webhooks {endpoint.id}"))
        self._tasks.append(asyncio.create_task(self._write_attempts(), name="webhooks attempts"))
        self._tasks.append(asyncio.create_task(self._maintain(), name="webhooks upkeep"))

    async def aclose(self) -> None:
        for task in [*self._tasks, *self._in_flight]:
            task.cancel()
        for task in [*self._tasks, *self._in_flight]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        try:  # what finished before the stop; anything lost here is sent again when its lease lapses
            await self._record(self._take_attempts())
        except Exception:
            log.exception("webhooks: recording the last attempts failed")
        finally:
            await self._client.aclose()

    async def _serve(self, endpoint: Endpoint) -> None:
        slots = asyncio.Semaphore(self.settings.concurrency)
        while True:
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
                # Idle (nothing of this endpoint in flight or unrecorded): the change that wakes
                # it is likely the first of a burst, so it lets the burst gather first.
                idle = free == self.settings.concurrency and not self._attempts
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.settings.poll_s)
                    if idle:
                        await asyncio.sleep(self.settings.coalesce_s)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._in_flight.discard(task)
        self._wake.set()  # a thread's next delivery may now be due

    async def _maintain(self) -> None:
        """Fail what is past its retry period and purge what is past its retention: at start
        (after an outage nothing is sent days late), then every ``maintenance_s``."""
        while True:
            try:
                stale = await fail_stale(self.store, self.settings.retry_period_s)
                purged = await purge_finished(self.store, self.settings.retention_s)
                if stale or purged:
                    log.info("webhooks: %d deliveries past their retry period failed, %d past their retention purged", stale, purged)
            except Exception as exc:  # the database is away: the next round does it
                log.warning("webhooks: the outbox's upkeep failed (%s: %s); trying again later", type(exc).__name__, exc)
            await asyncio.sleep(self.settings.maintenance_s)

    async def _claim(self, endpoint: Endpoint, limit: int) -> list[_Claimed]:
        """The due heads of their threads (the oldest pending delivery of each thread), leased to this process."""
        now = utcnow()
        o, p = webhook_outbox, webhook_outbox.alias("earlier")
        # The head of each thread: its oldest pending delivery that is due or was tried (a notice
        # not yet due, ``interrupt.expiring``, holds nothing up). A grouped scan, not a
        # correlated NOT EXISTS: its plan stays linear when the table's statistics are stale,
        # as they are in the burst that filled it.
        heads = (
            sa.select(sa.func.min(p.c.seq))
            .where(p.c.endpoint == endpoint.id, p.c.status == "pending", sa.or_(p.c.attempts > 0, p.c.next_attempt_at <= now))
            .group_by(p.c.thread_id)
        )
        free = sa.or_(o.c.lease_expires_at.is_(None), o.c.lease_expires_at < now)
        query = (
            sa.select(o.c.seq, o.c.id, o.c.body, o.c.attempts, o.c.created_at, o.c.event_type, o.c.interrupt_id, o.c.run_id)
            .where(o.c.seq.in_(heads), o.c.next_attempt_at <= now, free)
            .order_by(o.c.seq)
            .limit(limit)
        )
        if not self.store.is_sqlite:
            query = query.with_for_update(skip_locked=True, of=o)
        period_start = now - timedelta(seconds=self.settings.retry_period_s)
        async with self.store._writing() as conn:
            # Disabled (a 410, here or in another process): nothing is sent until an admin
            # enables it; deliveries made meanwhile are parked as ``disabled`` too.
            reason = await disabled_reason(conn, endpoint.id)
            if reason is not None:
                await park_pending(conn, endpoint.id, reason)
                return []
            rows = list(await conn.execute(query))
            # Past its retry period (the process was down, or the thread's earlier deliveries
            # kept it waiting): failed, not sent late.
            stale = [r for r in rows if r.created_at < period_start]
            if stale:
                await conn.execute(o.update().where(o.c.seq.in_([r.seq for r in stale]), free).values(status="failed", finished_at=now, last_error=STALE_ERROR))
                self._wake.set()  # each thread's next delivery may now be due
                rows = [r for r in rows if r.created_at >= period_start]
            if not rows:
                return []
            until = now + timedelta(seconds=self.settings.lease_s)
            await conn.execute(o.update().where(o.c.seq.in_([r.seq for r in rows]), free).values(lease_owner=self.store.instance_id, lease_expires_at=until))
            claimed = []
            contexts = await self._trace_contexts(conn, [r.run_id for r in rows if r.run_id])
            for row in rows:
                if row.event_type == "interrupt.expiring" and row.interrupt_id:
                    status = (await conn.execute(sa.select(interrupts.c.status).where(interrupts.c.id == row.interrupt_id))).scalar()
                    if status != "pending":  # decided or expired before the lead: nothing to warn of
                        await conn.execute(
                            o.update().where(o.c.seq == row.seq).values(status="skipped", finished_at=now, lease_owner=None, lease_expires_at=None)
                        )
                        continue
                claimed.append(_Claimed(row, contexts.get(row.run_id)))
            return claimed

    @staticmethod
    async def _trace_contexts(conn: Any, run_ids: list[str]) -> dict[str, str]:
        """The stored trace context of each run that has one."""
        if not run_ids:
            return {}
        found = await conn.execute(sa.select(runs.c.id, runs.c.trace_context).where(runs.c.id.in_(sorted(set(run_ids))), runs.c.trace_context.is_not(None)))
        return {r.id: r.trace_context for r in found}

    async def _deliver(self, endpoint: Endpoint, claimed: _Claimed, slots: asyncio.Semaphore) -> None:
        row = claimed.row
        async with slots:
            started = utcnow()
            t0 = time.monotonic()
            attempt = int(row.attempts) + 1
            status_code: int | None = None
            retry_after: float | None = None
            error: str | None = None
            refused = False
            span = self._span(endpoint, row, attempt, claimed.traceparent)
            try:
                signature = self._signer.sign(row.id, started, row.body)
                headers = {"webhook-id": row.id, "webhook-timestamp": str(int(started.timestamp())), "webhook-signature": signature}
                traceparent = span.traceparent if span is not None else claimed.traceparent
                if traceparent:
                    headers["traceparent"] = traceparent
                answer = await self._client.post(endpoint.url, row.body, headers)
                status_code, retry_after = answer.status, answer.retry_after
            except Refused as exc:
                error, refused = str(exc), True
            except Exception as exc:  # timeouts, refused connections, resets
                error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            finally:
                if span is not None:
                    span.end(status_code=status_code, error=_error_type(status_code, refused))
            duration_ms = int((time.monotonic() - t0) * 1000)
            try:
                outcome, next_at = self._judge(row, attempt, status_code, retry_after, refused=refused)
            except Exception:  # never lose the attempt: it is recorded, and retried on the schedule
                log.warning("webhooks: judging attempt %s of %s failed; retrying it", attempt, row.id)
                outcome, next_at = "retry", utcnow() + timedelta(seconds=self.settings.lease_s)
            if status_code is not None and not 200 <= status_code < 300 and error is None:
                error = f"HTTP {status_code}"
            self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
            # Recorded by the writer task; until then the row stays leased to this process, so
            # nothing sends it again (and if the process dies first, its lease lapses: resent).
            self._attempts.append(_Attempt(row.seq, row.id, endpoint.id, attempt, started, duration_ms, status_code, outcome, error, next_at))
            self._attempts_ready.set()

    def _span(self, endpoint: Endpoint, row: Any, attempt: int, traceparent: str | None) -> OutboundSpan | None:
        """This attempt's span, in the trace of the run the delivery tells of."""
        if self.telemetry is None or not self.telemetry.tracing:
            return None
        url = httpx.URL(endpoint.url)
        attributes = {
            "http.request.method": "POST",
            "url.full": str(url.copy_with(query=None, fragment=None, username=None, password=None)),
            "server.address": url.host,
            "server.port": url.port or (443 if url.scheme == "https" else 80),
            "tether.webhook.id": row.id,
            "tether.webhook.type": row.event_type,
            "tether.webhook.attempt": attempt,
            "tether.run.id": row.run_id or "",
        }
        return self.telemetry.outbound_span(f"webhook {row.event_type}", traceparent=traceparent, attributes=attributes)

    def _judge(self, row: Any, attempt: int, status: int | None, retry_after: float | None, *, refused: bool) -> tuple[str, Any]:
        if status is not None and 200 <= status < 300:
            return "ok", None
        if status == 410:
            return "disabled", None
        # Standard Webhooks retries every other answer: a receiver answering 404 or 401 for a
        # minute during its own deploy must not lose the notification. A redirect is never
        # followed (it could lead anywhere), so it fails; so does a refused target.
        redirect = status is not None and 300 <= status < 400
        if refused or redirect or attempt >= len(self.settings.schedule):
            return "failed", None
        delay = self.settings.schedule[attempt] * random.uniform(0.9, 1.1)  # jitter, not a secret
        if retry_after is not None:
            delay = max(delay, retry_after)
        # Past the period it fails anyway: a delay beyond it (a huge Retry-After) cannot overflow.
        delay = min(delay, self.settings.retry_period_s)
        next_at = utcnow() + timedelta(seconds=delay)
        if next_at > row.created_at + timedelta(seconds=self.settings.retry_period_s):
            return "failed", None
        return "retry", next_at

    def _take_attempts(self) -> list[_Attempt]:
        taken, self._attempts = self._attempts, []
        self._attempts_ready.clear()
        return taken

    async def _write_attempts(self) -> None:
        """Record finished attempts, all that finished meanwhile in one transaction."""
        while True:
            await self._attempts_ready.wait()
            taken = self._take_attempts()
            try:
                await self._record(taken)
            except Exception:  # the database is away: keep them for the next try
                log.exception("webhooks: recording attempts failed")
                self._attempts[:0] = taken
                await asyncio.sleep(self.settings.poll_s)
                self._attempts_ready.set()
                continue
            self._wake.set()  # a thread's next delivery may now be due

    async def _record(self, attempts: list[_Attempt]) -> None:
        if not attempts:
            return
        o = webhook_outbox
        now = utcnow()
        async with self.store._writing() as conn:
            await conn.execute(
                webhook_attempts.insert(),
                [
                    {
                        "outbox_id": a.outbox_id,
                        "attempt": a.attempt,
                        "sender": self.store.instance_id,
                        "started_at": a.started_at,
                        "duration_ms": a.duration_ms,
                        "status_code": a.status_code,
                        "outcome": a.outcome,
                        "error": a.error,
                    }
                    for a in attempts
                ],
            )
            for a in attempts:
                mine = [o.c.seq == a.seq, o.c.lease_owner == self.store.instance_id, o.c.status == "pending"]
                done = {"lease_owner": None, "lease_expires_at": None, "attempts": a.attempt, "last_error": a.error}
                if a.outcome == "ok":
                    await conn.execute(o.update().where(*mine).values(status="delivered", finished_at=now, **done))
                elif a.outcome == "retry":
                    await conn.execute(o.update().where(*mine).values(next_attempt_at=a.next_at, **done))
                elif a.outcome == "failed":
                    await conn.execute(o.update().where(*mine).values(status="failed", finished_at=now, **done))
                else:  # 410 Gone: the receiver asks for no more deliveries, from any process
                    await conn.execute(o.update().where(*mine).values(status="disabled", finished_at=now, **done))
                    await disable(conn, self.store.is_sqlite, a.endpoint, f"endpoint answered 410 Gone (delivery {a.outbox_id})")
                    log.warning("webhooks: endpoint %s answered 410 Gone: disabled for every process until an admin enables it", a.endpoint)


def _error_type(status_code: int | None, refused: bool) -> str | None:
    """A failed attempt's ``error.type`` (its status code, or what stood for an answer)."""
    if status_code is not None:
        return None if 200 <= status_code < 300 else str(status_code)
    return "refused" if refused else "no_answer"


@dataclass(frozen=True, slots=True)
class _Claimed:
    """A claimed delivery and its run's stored trace context."""

    row: Any
    traceparent: str | None


@dataclass(frozen=True, slots=True)
class _Attempt:
    """One finished attempt, to be recorded."""

    seq: int
    outbox_id: str
    endpoint: str
    attempt: int
    started_at: datetime
    duration_ms: int
    status_code: int | None
    outcome: str
    error: str | None
    next_at: datetime | None
