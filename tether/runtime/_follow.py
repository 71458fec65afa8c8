"""Following a run: replay from the log, then the live tail, with no gap and no duplicate.

The follower subscribes to the bus *before* reading the store, so every event committed after
the read is also in its queue; it then skips what it already has by ``seq``. When the live queue
shows a gap (or is stale: it overflowed, or another process committed), it reads the missing range back from the store. It stops after
the terminal event, also when the cursor is already at or past it (a client resuming after the
end gets an empty stream that closes, not one that waits forever). Closing the generator (a
client went away) only unsubscribes: the run is not touched.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from ..events import TERMINAL_TYPES, StoredEvent
from ..store import Store
from ._bus import LocalBus

__all__ = ["follow_run"]

_PAGE = 2000


async def follow_run(store: Store, bus: LocalBus, run_id: str, *, after_seq: int = 0, idle_timeout: float = 15.0) -> AsyncIterator[list[StoredEvent]]:
    """Yield batches of events with ``seq > after_seq`` in order; an empty batch after
    ``idle_timeout`` seconds without events (time for a keep-alive)."""
    last = after_seq
    with bus.subscribe(run_id) as live:

        async def catch_up() -> AsyncIterator[list[StoredEvent]]:
            nonlocal last
            while True:
                page = await store.read_events(run_id, after_seq=last, limit=_PAGE)
                if page:
                    last = page[-1].seq
                    yield page
                if len(page) < _PAGE:
                    return

        async for page in catch_up():
            yield page
            if page[-1].type in TERMINAL_TYPES:
                return
        if (await store.get_run(run_id)).terminal:
            # The cursor is at or past the terminal event. A terminal status commits together
            # with its terminal event, so the store holds the whole log: read what is left, end.
            async for page in catch_up():
                yield page
            return
        while True:
            batch = await live.wait_for_events(idle_timeout)
            if batch is None:
                yield []
                continue
            if live.stale or (batch and batch[0].seq > last + 1):
                # Published events are already committed, so the store has the missing range.
                live.stale = False
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
