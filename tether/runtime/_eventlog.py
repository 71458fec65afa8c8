"""A run's event log writer: durable before sent, with group commit.

The executor calls :meth:`EventLog.emit` synchronously for every event; seqs are assigned here,
contiguous from the run's next seq. A single flusher task commits whatever has accumulated in
one transaction and only then publishes the batch to live followers. The first event after an
idle period is committed at once (nothing to wait for); events that arrive while a commit is in
flight ride along with the next one. So a token stream costs one transaction per commit
latency, not one per token, and no one ever sees an event the store does not have. The commit
itself goes through the runtime's :class:`~._groupcommit.GroupCommit`, which puts the batches
of every run of the process into one transaction.

Under a burst (events arrived during each of the last two commits) a small batch waits up to
``_BURST_LINGER_S`` for more before committing, as PostgreSQL's ``commit_delay`` does: a
transaction costs the event loop far more than an event does, so committing a burst a dozen
events at a time would spend the loop on transactions instead of on the stream
(``benchmarks/stream_throughput.py``). An event after an idle period never waits, nor does
the batch right after it (a run's first tokens, arriving while its ``status`` event commits).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from ..errors import EventLogFailed
from ..events import Envelope, Event, StoredEvent, now_ts
from ..store import Store

if TYPE_CHECKING:
    from ._bus import LocalBus
    from ._groupcommit import GroupCommit

__all__ = ["EventLog"]

#: How long a small batch waits for more during a burst, and what counts as small.
_BURST_LINGER_S = 0.001
_BURST_BATCH = 256


class EventLog:
    """Appends one run's events to the store in batches, then publishes them."""

    def __init__(self, store: Store, bus: LocalBus, run_id: str, *, next_seq: int, writer: GroupCommit | None = None) -> None:
        self._store = store
        #: Commits for many runs at once; without one, each batch is its own transaction.
        self._writer = writer
        self._bus = bus
        self.run_id = run_id
        self._next_seq = next_seq
        self._pending: list[StoredEvent] = []
        self._has_pending = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._failure: BaseException | None = None
        self._flusher: asyncio.Task[None] | None = None

    @property
    def next_seq(self) -> int:
        """The seq the next event will get."""
        return self._next_seq

    def start(self) -> None:
        """Start the flusher task (owned by this log; stopped by :meth:`aclose`)."""
        self._flusher = asyncio.create_task(self._flush_loop(), name=f"eventlog-{self.run_id}")

    def emit(self, event: Event) -> int:
        """Queue ``event`` for the next commit and return its seq."""
        seq = self._claim()
        self._queue(StoredEvent(seq, event.type, Envelope.encode(self.run_id, seq, event, now_ts())))
        return seq

    def emit_delta(self, event_type: str, message_id: str, text: str) -> int:
        """``emit(Token(…))`` / ``emit(Thinking(…))`` on the hot path (same bytes, less work)."""
        seq = self._claim()
        self._queue(StoredEvent(seq, event_type, Envelope.encode_delta(self.run_id, seq, event_type, message_id, text, now_ts())))
        return seq

    def _claim(self) -> int:
        if self._failure is not None:
            raise EventLogFailed("event log failed") from self._failure
        seq = self._next_seq
        self._next_seq += 1
        return seq

    def _queue(self, stored: StoredEvent) -> None:
        self._pending.append(stored)
        self._idle.clear()
        self._has_pending.set()

    def seal(self, event: Event) -> StoredEvent:
        """Build the terminal event with the next seq, without queueing it.

        The caller writes it together with the run's final status (``Store.finish_run``) and
        then calls :meth:`publish_final`.
        """
        seq = self._next_seq
        self._next_seq += 1
        return StoredEvent(seq, event.type, Envelope.encode(self.run_id, seq, event, now_ts()))

    def restart_at(self, seq: int) -> None:
        """After a failed commit: drop what was not written and continue at ``seq``."""
        self._pending.clear()
        self._next_seq = seq
        self._idle.set()

    def unseal(self, final: StoredEvent) -> None:
        """Give back the seq of a sealed event that was not written."""
        if final.seq == self._next_seq - 1:
            self._next_seq -= 1

    def publish_final(self, final: StoredEvent) -> None:
        """Publish the committed terminal event."""
        self._bus.publish(self.run_id, [final])

    async def wait_for_idle(self) -> None:
        """Wait until everything emitted so far is committed and published."""
        await self._idle.wait()
        if self._failure is not None:
            raise EventLogFailed("event log failed") from self._failure

    async def _flush_loop(self) -> None:
        busy = 0  # how many commits in a row had events arriving while they were in flight
        while True:
            await self._has_pending.wait()
            if busy >= 2 and len(self._pending) < _BURST_BATCH:
                await asyncio.sleep(_BURST_LINGER_S)
            self._has_pending.clear()
            batch, self._pending = self._pending, []
            try:
                if self._writer is not None:
                    await self._writer.append(self.run_id, batch)
                else:
                    await self._store.append_events(self.run_id, batch)
            except Exception as exc:  # a store failure: surface it to the executor
                self._failure = exc
                self._idle.set()
                return
            self._bus.publish(self.run_id, batch)
            busy = busy + 1 if self._pending else 0
            if not busy:
                self._idle.set()

    async def aclose(self) -> None:
        """Commit what is pending, then stop the flusher."""
        try:
            if self._flusher is not None and not self._flusher.done():
                await self.wait_for_idle()
        finally:
            if self._flusher is not None:
                self._flusher.cancel()
                try:
                    await self._flusher
                except asyncio.CancelledError:
                    if (task := asyncio.current_task()) is not None and task.cancelling():
                        raise
