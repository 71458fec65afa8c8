"""Live fan-out of committed events to the streams that follow a run.

The bus only carries events that are already durable: the event log publishes a batch after
its commit. A subscriber that falls too far behind is not allowed to hold memory without bound:
each subscription queues at most ``max_pending_bytes`` of envelopes. A batch that would pass that
bound is not queued: the queue is dropped and the subscription marked *stale* (the reader
catches up from the store, which has everything).

How far behind a reader is, is measured in bytes: what was published after the last seq it
says it delivered (:meth:`Subscription.delivered`), whether queued, dropped or still being read
from the store. Past ``max_pending_bytes`` the subscription is *overflowed*: the reader fell
behind, and a network stream then ends so that its client resumes at its own pace. One batch
larger than the bound, published to a reader that had delivered everything before it, only
makes it catch up: a reader that keeps up is never cut off because one commit carried a lot.

A process about to stop ends every stream (:meth:`LocalBus.end_streams`): each reader is woken
and stops at its next step (what it had not sent is in the log), so that its client resumes on
another process at once instead of when the connection is cut.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable, Iterator, Sequence

from .._idle import IdleTimer
from ..events import StoredEvent

__all__ = ["LocalBus", "Subscription"]


class Subscription:
    """One follower of one run's live events."""

    def __init__(self, max_pending_bytes: int, run_id: str) -> None:
        #: The run followed.
        self.run_id = run_id
        self._pending: deque[StoredEvent] = deque()
        self._pending_bytes = 0
        #: Set when there is something for the reader (events, staleness, the end, an idle
        #: moment); ``_waiter`` is the reader's wait for it. An ``asyncio.Event`` without its
        #: machinery: the reader waits once per batch on every live stream.
        self._signalled = False
        self._waiter: asyncio.Future[None] | None = None
        self._max_pending_bytes = max_pending_bytes
        #: True when the store has events this queue lacks (events were dropped, or another
        #: process committed some); the reader must catch up from the store.
        self.stale = False
        #: True once the reader fell more than the bound behind what was published.
        self.overflowed = False
        #: True once the process is stopping: the reader stops at its next step.
        self.ended = False
        #: (last seq, bytes) of each published batch the reader has not delivered yet.
        self._unsent: deque[tuple[int, int]] = deque()
        self._unsent_bytes = 0
        #: Wakes a waiting reader once nothing was published for its wait's timeout (created
        #: by the first wait: one timer for the subscription's life, not one per wait).
        self._idle: IdleTimer | None = None
        self._idle_due = False

    def _push(self, batch: Sequence[StoredEvent]) -> None:
        if not batch:
            return
        size = sum(len(e.envelope) for e in batch)
        if not self.overflowed:
            behind = self._unsent_bytes
            self._unsent.append((batch[-1].seq, size))
            self._unsent_bytes += size
            if behind and self._unsent_bytes > self._max_pending_bytes:
                self.overflowed = True
                self._unsent.clear()  # nothing more to measure: the stream ends
                self._unsent_bytes = 0
        if self.overflowed or self._pending_bytes + size > self._max_pending_bytes:
            # Keep nothing more: the store has it all.
            self._pending.clear()
            self._pending_bytes = 0
            self.stale = True
        else:
            self._pending.extend(batch)
            self._pending_bytes += size
        self._wake()

    def _wake(self) -> None:
        self._signalled = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def delivered(self, seq: int) -> None:
        """The reader has sent everything up to ``seq`` on (it is no longer behind by it)."""
        while self._unsent and self._unsent[0][0] <= seq:
            self._unsent_bytes -= self._unsent.popleft()[1]

    def end(self) -> None:
        """Tell the reader to stop following (the process is stopping)."""
        self.ended = True
        self._wake()

    def mark_stale(self) -> None:
        """Tell the reader to catch up from the store (new events were committed elsewhere)."""
        self.stale = True
        self._wake()

    async def wait_for_events(self, timeout: float) -> list[StoredEvent] | None:  # noqa: ASYNC109  # the follower's ping interval, not a deadline
        """The events published since the last call; ``None`` if ``timeout`` passed with none.

        Check :attr:`stale` after a return: when set, read the store too.
        """
        if self._idle is None or self._idle.seconds != timeout:
            self.close()
            self._idle = IdleTimer(timeout, self._on_idle)
        if not self._pending and not self.stale and not self.ended:
            self._idle_due = False
            self._idle.touch()
            if not self._signalled:
                waiter = self._waiter = asyncio.get_running_loop().create_future()
                try:
                    await waiter
                finally:
                    self._waiter = None
            if self._idle_due and not self._pending and not self.stale and not self.ended:
                self._idle_due = False
                self._signalled = False
                return None
        self._signalled = False
        batch = list(self._pending)
        self._pending.clear()
        self._pending_bytes = 0
        return batch

    def _on_idle(self) -> None:
        self._idle_due = True
        self._wake()

    def close(self) -> None:
        """Stop this subscription's timer (when its reader stops following)."""
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None


class LocalBus:
    """In-process fan-out (one server process; PostgreSQL deployments add a cross-process bus)."""

    def __init__(self, *, max_pending_bytes: int = 1024 * 1024) -> None:
        if max_pending_bytes < 1:
            raise ValueError("max_pending_bytes must be positive")
        self._subscribers: dict[str, set[Subscription]] = {}
        self._max_pending_bytes = max_pending_bytes
        #: Events published since start (a counter for ``/metrics``).
        self.published = 0
        #: True once :meth:`end_streams` was called: every subscription starts ended.
        self.streams_ended = False
        #: Told of every batch this process committed (the runtime's observer), not of the
        #: batches another process committed (:meth:`deliver`).
        self.on_committed: Callable[[str, Sequence[StoredEvent]], None] | None = None

    async def start(self) -> None:
        """Nothing to connect in one process (a cross-process bus connects here)."""

    async def aclose(self) -> None:
        """Nothing to release in one process (a cross-process bus disconnects here)."""

    @contextlib.contextmanager
    def subscribe(self, run_id: str) -> Iterator[Subscription]:
        """Follow ``run_id`` for the duration of the ``with`` block."""
        subscription = self.open(run_id)
        try:
            yield subscription
        finally:
            self.close(subscription)

    def open(self, run_id: str) -> Subscription:
        """Follow ``run_id`` until :meth:`close` (prefer :meth:`subscribe`; this is for a
        subscription taken before the run exists, handed to its follower)."""
        subscription = Subscription(self._max_pending_bytes, run_id)
        subscription.ended = self.streams_ended
        self._subscribers.setdefault(run_id, set()).add(subscription)
        return subscription

    def close(self, subscription: Subscription) -> None:
        """Stop a subscription of :meth:`open` (closing it twice is harmless)."""
        subscription.close()
        followers = self._subscribers.get(subscription.run_id)
        if followers is not None:
            followers.discard(subscription)
            if not followers:
                del self._subscribers[subscription.run_id]

    def publish(self, run_id: str, batch: Sequence[StoredEvent]) -> None:
        """Hand a batch this process committed to every follower of ``run_id``."""
        if self.on_committed is not None:
            self.on_committed(run_id, batch)
        self.deliver(run_id, batch)

    def deliver(self, run_id: str, batch: Sequence[StoredEvent]) -> None:
        """Hand a committed batch (this process's or another's) to every follower of ``run_id``."""
        self.published += len(batch)
        for subscription in self._subscribers.get(run_id, ()):
            subscription._push(batch)

    def end_streams(self) -> None:
        """End every stream following a run, and every stream that starts following one
        later: for a process about to stop. Each reader stops at its next step
        (:func:`~._follow.follow_run` raises :class:`~._follow.StreamEnded`); its client
        resumes from its last seq, on another process or after the restart."""
        self.streams_ended = True
        for followers in self._subscribers.values():
            for subscription in followers:
                subscription.end()

    def total_subscribers(self) -> int:
        """How many streams follow any run right now."""
        return sum(len(followers) for followers in self._subscribers.values())

    def subscriber_count(self, run_id: str) -> int:
        """How many streams follow ``run_id`` right now."""
        return len(self._subscribers.get(run_id, ()))
