"""Cross-process fan-out and control through PostgreSQL ``LISTEN``/``NOTIFY``.

With several server processes on one PostgreSQL, a run executes in one process while its
followers may be connected to any other. Every transaction that appends events also sends
``NOTIFY tether_events, '<origin> <run_id> <seq> …'`` (the channels and payloads are defined once,
in ``store/_notify.py``); PostgreSQL delivers it on commit, so a notification never announces an
event that is not durable. Each process listens on one dedicated connection and, for runs it
has followers of, reads the new events from the store *once per run* (notifications that
arrive during that read are folded into the next one) and publishes them to every local
follower, as if they had been committed here. The first notification for a run only marks its
followers *stale*: each catches up from the store itself (the same gapless path as any
reconnect), and from then on the bus knows where the run's log stands. Its own notifications
it ignores: local followers already got those events directly.

``tether_control`` carries small typed commands (:data:`~tether.store.ControlMessage`) to the process executing a run (a cancel sent to
another process). Notifications are not stored: a listener that reconnects marks every
follower stale, so nothing is missed, and a control message that finds no listener is covered
by the executor's own periodic check of the run's status in the store.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from ..events import StoredEvent
from ..store._notify import CONTROL_CHANNEL, EVENTS_CHANNEL, ControlMessage, parse_control_payload, parse_events_payload
from ._bus import LocalBus

if TYPE_CHECKING:
    import asyncpg

    from ..store import Store

__all__ = ["PostgresBus", "open_bus"]

#: Reads a run's events after a seq, up to a limit: ``Store.read_events``.
EventReader = Callable[[str, int, int], Awaitable[list[StoredEvent]]]

#: Events read per query when fetching what another process committed.
_FETCH_PAGE = 1000

log = logging.getLogger("tether.runtime")


class PostgresBus(LocalBus):
    """A :class:`LocalBus` that also hears what other processes commit and command."""

    def __init__(self, dsn: str, origin: str, *, read_events: EventReader | None = None, max_pending_bytes: int = 1024 * 1024) -> None:
        super().__init__(max_pending_bytes=max_pending_bytes)
        self._dsn = dsn
        self.origin = origin
        #: Without a reader, followers of remote runs are only marked stale (each reads itself).
        self._read_events = read_events
        #: Per remote run with local followers: the seq up to which its events were published
        #: here, and the highest seq announced.
        self._published_to: dict[str, int] = {}
        self._announced: dict[str, int] = {}
        self._fetchers: dict[str, asyncio.Task[None]] = {}
        #: Called with each control message from another process.
        self.on_control: Callable[[ControlMessage], None] | None = None
        self._conn: asyncpg.Connection | None = None
        self._supervisor: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Connect and listen (then keep the connection up in an owned task)."""
        await self._connect()
        self._supervisor = asyncio.create_task(self._supervise(), name="pgbus-supervisor")

    async def _connect(self) -> None:
        import asyncpg  # here, not at the top: a SQLite server never loads the PostgreSQL driver

        conn = await asyncpg.connect(self._dsn)
        await conn.add_listener(EVENTS_CHANNEL, self._on_events)
        await conn.add_listener(CONTROL_CHANNEL, self._on_control)
        self._conn = conn

    async def _supervise(self) -> None:
        import asyncpg

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
            # Notifications sent while we were away are gone: every follower catches up, and
            # where each run's log stands here is unknown again.
            self._published_to.clear()
            for followers in list(self._subscribers.values()):
                for subscription in followers:
                    subscription.mark_stale()

    def _on_events(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        notice = parse_events_payload(payload)
        if notice.origin == self.origin:
            return
        for run_id, seq in notice.runs:
            if run_id in self._subscribers:
                self._on_run_events(run_id, seq)

    def _on_run_events(self, run_id: str, seq: int) -> None:
        if self._read_events is None or seq < 0 or run_id not in self._published_to:
            # Where its log stands here is unknown: every follower catches up itself, once.
            self._mark_all_stale(run_id)
            if seq >= 0:
                self._published_to[run_id] = seq
            return
        self._announced[run_id] = max(seq, self._announced.get(run_id, 0))
        if run_id not in self._fetchers:
            self._fetchers[run_id] = asyncio.create_task(self._fetch(run_id), name=f"pgbus-fetch-{run_id}")

    async def _fetch(self, run_id: str) -> None:
        """Read what was announced for ``run_id`` once and publish it to the local followers."""
        assert self._read_events is not None
        try:
            while run_id in self._subscribers and self._announced.get(run_id, 0) > self._published_to.get(run_id, 0):
                after = self._published_to[run_id]
                page = await self._read_events(run_id, after, _FETCH_PAGE)
                if not page:
                    break
                self._published_to[run_id] = page[-1].seq
                self.deliver(run_id, page)  # another process committed them
        except Exception as exc:
            log.warning("reading run %s's events for its followers failed; they catch up themselves: %r", run_id, exc)
            self._mark_all_stale(run_id)
        finally:
            del self._fetchers[run_id]
            if run_id not in self._subscribers:  # its last follower left
                self._published_to.pop(run_id, None)
                self._announced.pop(run_id, None)

    def _mark_all_stale(self, run_id: str) -> None:
        for subscription in list(self._subscribers.get(run_id, ())):
            subscription.mark_stale()

    def _on_control(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        notice = parse_control_payload(payload)
        if notice is not None and notice.origin != self.origin and self.on_control is not None:
            self.on_control(notice.message)

    async def aclose(self) -> None:
        """Stop listening."""
        fetchers = list(self._fetchers.values())
        for fetcher in fetchers:
            fetcher.cancel()
        await asyncio.gather(*fetchers, return_exceptions=True)
        if self._supervisor is not None:
            self._supervisor.cancel()
            try:
                await self._supervisor
            except asyncio.CancelledError:
                if (task := asyncio.current_task()) is not None and task.cancelling():
                    raise  # we are being cancelled ourselves, not just our supervisor
        if self._conn is not None and not self._conn.is_closed():
            await self._conn.close()


async def open_bus(store: Store, max_pending_bytes: int) -> LocalBus:
    """The bus for ``store``: in-process on SQLite (one process); on PostgreSQL, other processes
    may share the database, so also hear what they commit and command (started here)."""
    if store.is_sqlite:
        return LocalBus(max_pending_bytes=max_pending_bytes)
    bus = PostgresBus(store.pg_dsn, store.instance_id, read_events=_event_reader(store), max_pending_bytes=max_pending_bytes)
    await bus.start()
    return bus


def _event_reader(store: Store) -> EventReader:
    async def read(run_id: str, after_seq: int, limit: int) -> list[StoredEvent]:
        return await store.read_events(run_id, after_seq=after_seq, limit=limit)

    return read
