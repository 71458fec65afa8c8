"""Following a run: replay from the log, then the live tail, with no gap and no duplicate.

The follower subscribes to the bus *before* reading the store, so every event committed after
the read is also in its queue; it then skips what it already has by ``seq``. When the live queue
shows a gap (or is stale: it overflowed, or another process committed), it reads the missing range back from the store. It stops after
the terminal event, also when the cursor is already at or past it (a client resuming after the
end gets an empty stream that closes, not one that waits forever). Closing the generator (a
client went away) only unsubscribes: the run is not touched.

A follower that does not keep up (its subscription overflowed: a slow network reader whose
sends block) either catches up from the store, or, with ``stop_when_behind``, raises
:class:`FellBehind` so that its stream can end and the client resume from its last seq at its
own pace (the log has everything): catching up would only fall behind again while holding
memory for it.

When the process is about to stop (:meth:`~._bus.LocalBus.end_streams`), a follower raises
:class:`StreamEnded` at its next step: its client resumes from its last seq elsewhere.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

from ..events import TERMINAL_TYPES, StoredEvent
from ..store import Store
from ._bus import LocalBus, Subscription

__all__ = ["follow_run", "FellBehind", "StreamEnded", "RunFeed"]

#: About how many bytes of events a follower reads from the store at a time: what it holds while
#: catching up. Page sizes adapt to the size of the events, from one event up to ``_MAX_PAGE``
#: (token events are small: long replays go in large pages; large events in small ones).
_PAGE_BYTES = 64 * 1024
_FIRST_PAGE = 100
_MAX_PAGE = 2000


class FellBehind(Exception):
    """The follower fell further behind the run than its buffer holds (``stop_when_behind``)."""

    def __init__(self, last_seq: int) -> None:
        super().__init__(f"fell behind after seq {last_seq}")
        #: The last seq the follower yielded: where its reader resumes.
        self.last_seq = last_seq


class StreamEnded(Exception):
    """The process is stopping: the follower stopped before the run's end."""

    def __init__(self, last_seq: int) -> None:
        super().__init__(f"the process is stopping; stopped after seq {last_seq}")
        #: The last seq the follower yielded: where its reader resumes.
        self.last_seq = last_seq


async def follow_run(
    store: Store,
    bus: LocalBus,
    run_id: str,
    *,
    after_seq: int = 0,
    idle_timeout: float = 15.0,
    stop_when_behind: bool = False,
    live: Subscription | None = None,
) -> AsyncIterator[list[StoredEvent]]:
    """Yield batches of events with ``seq > after_seq`` in order; an empty batch after
    ``idle_timeout`` seconds without events (time for a keep-alive). With ``stop_when_behind``,
    raise :class:`FellBehind` once the live queue overflowed instead of catching up. Raises
    :class:`StreamEnded` once the bus ends its streams (the process is stopping).

    ``live``: a subscription to the run opened (:meth:`~._bus.LocalBus.open`) before the run's
    first event was published, i.e. before the run was started; the follower takes it over and
    closes it. Everything then comes through it, so the store is read only if the follower
    falls behind (a stream of a run it just started begins without a read). ``after_seq`` must
    be 0 with it.
    """
    if live is not None and after_seq != 0:
        raise ValueError("a subscription opened before the run started follows it from its first event")
    last = after_seq
    from_start = live is not None
    with _taken_over(bus, live) if live is not None else bus.subscribe(run_id) as live:
        if live.ended:
            raise StreamEnded(last)
        page_size = _FIRST_PAGE

        def sent() -> None:
            """The consumer took everything up to ``last``: stop if it fell behind meanwhile."""
            live.delivered(last)
            if live.overflowed and stop_when_behind:
                raise FellBehind(last)  # slower than the run, even reading the store

        async def catch_up() -> AsyncIterator[list[StoredEvent]]:
            nonlocal last, page_size
            while True:
                asked = page_size
                page = await store.read_events(run_id, after_seq=last, limit=asked)
                size = sum(len(e.envelope) for e in page)
                if size > _PAGE_BYTES:
                    page_size = max(1, asked * _PAGE_BYTES // size)
                elif size < _PAGE_BYTES // 2:
                    page_size = min(_MAX_PAGE, asked * 2)
                if page:
                    last = page[-1].seq
                    yield page
                    sent()
                if len(page) < asked:
                    return

        if not from_start:
            replayed = False
            async for page in catch_up():
                replayed = True
                yield page
                if page[-1].type in TERMINAL_TYPES:
                    return
                if live.ended:
                    raise StreamEnded(last)
            # The log had events and none was terminal: the run was not over when it was read,
            # and its terminal event, committed later, comes through the subscription taken
            # before. Only a read that found nothing new needs the run itself.
            if not replayed and (await store.get_run(run_id)).terminal:
                # The cursor is at or past the terminal event. A terminal status commits
                # together with its terminal event, so the store holds the whole log: read
                # what is left, end.
                async for page in catch_up():
                    yield page
                return
        while True:
            batch = await live.wait_for_events(idle_timeout)
            if live.ended:
                raise StreamEnded(last)
            if batch is None:
                yield []
                continue
            if live.overflowed and stop_when_behind:
                raise FellBehind(last)
            if live.stale or (batch and batch[0].seq > last + 1):
                # Published events are already committed, so the store has the missing range.
                live.stale = False
                live.overflowed = False
                async for page in catch_up():
                    yield page
                    if page[-1].type in TERMINAL_TYPES:
                        return
            fresh = [e for e in batch if e.seq > last]
            if not fresh:
                if any(e.type in TERMINAL_TYPES for e in batch):
                    return  # the run ended at or before the cursor
                continue
            last = fresh[-1].seq
            yield fresh
            if fresh[-1].type in TERMINAL_TYPES:
                return
            sent()


@contextlib.contextmanager
def _taken_over(bus: LocalBus, live: Subscription) -> Iterator[Subscription]:
    """A subscription someone else opened, closed at the end like one of ``subscribe``."""
    try:
        yield live
    finally:
        bus.close(live)


@dataclass(frozen=True, slots=True)
class RunFeed:
    """One run's events for a stream to follow: where to read them and where to hear them.

    What the runtime hands the HTTP layer (:meth:`~tether.runtime.Runtime.feed`,
    :meth:`~tether.runtime.Runtime.start_followed_run`), so that it never deals with the store
    or the bus itself. :meth:`close` it once the stream is over (closing twice is harmless).
    """

    store: Store
    bus: LocalBus
    run_id: str
    after_seq: int = 0
    #: A subscription opened before the run started (its first events are there at once).
    live: Subscription | None = None

    @property
    def starts_live(self) -> bool:
        """True for a run this feed was subscribed to before it started."""
        return self.live is not None

    def follow(self, *, idle_timeout: float = 15.0, stop_when_behind: bool = False, after_seq: int | None = None) -> AsyncIterator[list[StoredEvent]]:
        """:func:`follow_run` over this feed (from ``after_seq``, by default the feed's own)."""
        start = self.after_seq if after_seq is None else after_seq
        return follow_run(self.store, self.bus, self.run_id, after_seq=start, idle_timeout=idle_timeout, stop_when_behind=stop_when_behind, live=self.live)

    def close(self) -> None:
        """Give up the subscription taken before the run started (a follower that ran closed it already)."""
        if self.live is not None:
            self.bus.close(self.live)
