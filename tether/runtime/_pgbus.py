"""Cross-process fan-out and control through PostgreSQL ``LISTEN``/``NOTIFY``.

With several server processes on one PostgreSQL, a run executes in one process while its
followers may be connected to any other. Every transaction that appends events also sends
``NOTIFY tether_events, '<origin> <run_id> <seq>'`` (the channels and payloads are defined once,
in ``store/_notify.py``); PostgreSQL delivers it on commit, so a notification never announces an
event that is not durable. Each process listens on one dedicated connection and, for runs it
has followers of, marks their subscriptions *stale*: they catch up from the store (the same
gapless path as any reconnect). Its own notifications it ignores: local followers already got
those events directly.

``tether_control`` carries small JSON commands to the process executing a run (a cancel sent to
another process). Notifications are not stored: a listener that reconnects marks every
follower stale, so nothing is missed, and a control message that finds no listener is covered
by the executor's own periodic check of the run's status in the store.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import asyncpg

from ..store._notify import CONTROL_CHANNEL, EVENTS_CHANNEL, parse_control_payload, parse_events_payload
from ._bus import LocalBus

__all__ = ["PostgresBus"]

log = logging.getLogger("tether.runtime")


class PostgresBus(LocalBus):
    """A :class:`LocalBus` that also hears what other processes commit and command."""

    def __init__(self, dsn: str, origin: str, *, max_pending_bytes: int = 1024 * 1024) -> None:
        super().__init__(max_pending_bytes=max_pending_bytes)
        self._dsn = dsn
        self.origin = origin
        #: Called with each control message from another process.
        self.on_control: Callable[[dict[str, Any]], None] | None = None
        self._conn: asyncpg.Connection | None = None
        self._supervisor: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Connect and listen (then keep the connection up in an owned task)."""
        await self._connect()
        self._supervisor = asyncio.create_task(self._supervise(), name="pgbus-supervisor")

    async def _connect(self) -> None:
        conn = await asyncpg.connect(self._dsn)
        await conn.add_listener(EVENTS_CHANNEL, self._on_events)
        await conn.add_listener(CONTROL_CHANNEL, self._on_control)
        self._conn = conn

    async def _supervise(self) -> None:
        backoff = 0.1
        while True:
            await asyncio.sleep(0.5)
            if self._conn is not None and not self._conn.is_closed():
                backoff = 0.1
                continue
            try:
                await self._connect()
            except (OSError, asyncpg.PostgresError) as exc:
                log.warning("LISTEN connection lost, retrying in %.1fs: %r", backoff, exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            # Notifications sent while we were away are gone: every follower catches up.
            for followers in list(self._subscribers.values()):
                for subscription in followers:
                    subscription.mark_stale()

    def _on_events(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        notice = parse_events_payload(payload)
        if notice.origin == self.origin:
            return
        for subscription in list(self._subscribers.get(notice.run_id, ())):
            subscription.mark_stale()

    def _on_control(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        message = parse_control_payload(payload)
        if message is not None and message.get("origin") != self.origin and self.on_control is not None:
            self.on_control(message)

    async def aclose(self) -> None:
        """Stop listening."""
        if self._supervisor is not None:
            self._supervisor.cancel()
            try:
                await self._supervisor
            except asyncio.CancelledError:
                if (task := asyncio.current_task()) is not None and task.cancelling():
                    raise  # we are being cancelled ourselves, not just our supervisor
        if self._conn is not None and not self._conn.is_closed():
            await self._conn.close()
