"""Live fan-out of committed events to the streams that follow a run.

The bus only carries events that are already durable: the event log publishes a batch after
its commit. A subscriber that falls too far behind is not allowed to hold memory without bound:
its queue is dropped and it is told to catch up from the store, which has everything.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Iterator, Sequence

from ..events import StoredEvent

__all__ = ["LocalBus", "Subscription"]


class Subscription:
    """One follower of one run's live events."""

    def __init__(self, max_pending: int) -> None:
        self._pending: deque[StoredEvent] = deque()
        self._wakeup = asyncio.Event()
        self._max_pending = max_pending
        #: True when the store has events this queue lacks (events were dropped, or another
        #: process committed some); the reader must catch up from the store.
        self.stale = False

    def _push(self, batch: Sequence[StoredEvent]) -> None:
        if len(self._pending) + len(batch) > self._max_pending:
            self._pending.clear()
            self.stale = True
        else:
            self._pending.extend(batch)
        self._wakeup.set()

    def mark_stale(self) -> None:
        """Tell the reader to catch up from the store (new events were committed elsewhere)."""
        self.stale = True
        self._wakeup.set()

    async def wait_for_events(self, timeout: float) -> list[StoredEvent] | None:  # noqa: ASYNC109  # the follower's ping interval, not a deadline
        """The events published since the last call; ``None`` if ``timeout`` passed with none.

        Check :attr:`stale` after a return: when set, read the store too.
        """
        if not self._pending and not self.stale:
            try:
                await asyncio.wait_for(self._wakeup.wait(), timeout)
            except TimeoutError:
                return None
        self._wakeup.clear()
        batch = list(self._pending)
        self._pending.clear()
        return batch


class LocalBus:
    """In-process fan-out (one server process; PostgreSQL deployments add a cross-process bus)."""

    def __init__(self, *, max_pending: int = 50_000) -> None:
        self._subscribers: dict[str, set[Subscription]] = {}
        self._max_pending = max_pending
        #: Events published since start (a counter for ``/metrics``).
        self.published = 0

    async def start(self) -> None:
        """Nothing to connect in one process (a cross-process bus connects here)."""

    async def aclose(self) -> None:
        """Nothing to release in one process (a cross-process bus disconnects here)."""

    @contextlib.contextmanager
    def subscribe(self, run_id: str) -> Iterator[Subscription]:
        """Follow ``run_id`` for the duration of the ``with`` block."""
        subscription = Subscription(self._max_pending)
        self._subscribers.setdefault(run_id, set()).add(subscription)
        try:
            yield subscription
        finally:
            followers = self._subscribers.get(run_id)
            if followers is not None:
                followers.discard(subscription)
                if not followers:
                    del self._subscribers[run_id]

    def publish(self, run_id: str, batch: Sequence[StoredEvent]) -> None:
        """Hand a committed batch to every follower of ``run_id``."""
        self.published += len(batch)
        for subscription in self._subscribers.get(run_id, ()):
            subscription._push(batch)

    def total_subscribers(self) -> int:
        """How many streams follow any run right now."""
        return sum(len(followers) for followers in self._subscribers.values())

    def subscriber_count(self, run_id: str) -> int:
        """How many streams follow ``run_id`` right now."""
        return len(self._subscribers.get(run_id, ()))
