"""A run's event log: durable before sent, with group commit.

The executor calls :meth:`EventLog.emit` synchronously for every event; seqs are assigned here,
contiguous from the run's next seq, and each envelope is encoded once. The events queue here
until the process's one writer (:class:`~._groupcommit.GroupCommit`) commits them, together
with every other run's, and hands the batch back (:meth:`EventLog.committed`); only then is it
published to live followers. The first events after an idle moment are committed at once;
events that arrive while a commit is in flight ride along with the next one. So a token stream
costs one transaction per commit latency, not one per token, and no one ever sees an event the
store does not have.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from ..errors import EventLogFailed
from ..events import DeltaEncoder, Envelope, Event, StoredEvent, now_ts
from ..store import Store
from ._groupcommit import GroupCommit

if TYPE_CHECKING:
    from ._bus import LocalBus

__all__ = ["EventLog", "RunTakenOver", "stored_event"]

log = logging.getLogger("tether.runtime")


class RunTakenOver(EventLogFailed):
    """A run's events were not written because another process executes it now."""


def stored_event(run_id: str, seq: int, event: Event) -> StoredEvent:
    """``event`` at ``seq`` as the log stores it, for a writer with no :class:`EventLog` of the
    run (a resume, an expiry, a cancel that no executor carries out)."""
    return StoredEvent(seq, event.type, Envelope.encode(run_id, seq, event, now_ts()))


class EventLog:
    """Appends one run's events to the store in batches, then publishes them."""

    def __init__(self, store: Store, bus: LocalBus, run_id: str, *, next_seq: int, writer: GroupCommit | None = None) -> None:
        #: Commits for many runs at once; without one given, this log has a writer of its own.
        self._writer = writer if writer is not None else GroupCommit(store)
        self._own_writer = writer is None
        self._bus = bus
        self.run_id = run_id
        self._next_seq = next_seq
        self._deltas = DeltaEncoder(run_id)
        #: Events emitted and not yet taken by the writer.
        self.pending: list[StoredEvent] = []
        self._idle = asyncio.Event()
        self._idle.set()
        self._failure: BaseException | None = None
        #: The task executing the run (the one that started this log): stopped if the run turns
        #: out to belong to another process.
        self._owner: asyncio.Task[object] | None = None

    @property
    def next_seq(self) -> int:
        """The seq the next event will get."""
        return self._next_seq

    def start(self) -> None:
        """Start this log's own writer, if it has one (else the runtime's writer runs already).
        Called by the task that executes the run."""
        self._owner = asyncio.current_task()
        if self._own_writer:
            self._writer.start()

    def emit(self, event: Event) -> int:
        """Queue ``event`` for the next commit and return its seq."""
        seq = self._claim()
        self._queue(StoredEvent(seq, event.type, Envelope.encode(self.run_id, seq, event, now_ts())))
        return seq

    def emit_delta(self, event_type: str, message_id: str, text: str) -> int:
        """``emit(Token(…))`` / ``emit(Thinking(…))`` on the hot path (same bytes, less work)."""
        seq = self._claim()
        self._queue(StoredEvent(seq, event_type, self._deltas.encode(seq, event_type, message_id, text, now_ts())))
        return seq

    def _claim(self) -> int:
        if self._failure is not None:
            raise EventLogFailed("event log failed") from self._failure
        seq = self._next_seq
        self._next_seq += 1
        return seq

    def _queue(self, stored: StoredEvent) -> None:
        if not self.pending:
            self._writer.schedule(self)
        self.pending.append(stored)
        self._idle.clear()

    # -- called by the writer ---------------------------------------------------------------

    def take(self) -> list[StoredEvent]:
        """Everything queued so far, for the writer's next transaction."""
        batch, self.pending = self.pending, []
        return batch

    def committed(self, batch: list[StoredEvent]) -> None:
        """``batch`` is durable: publish it; idle once nothing more is queued."""
        self._bus.publish(self.run_id, batch)
        if not self.pending:
            self._idle.set()

    def failed(self, error: BaseException) -> None:
        """The writer could not commit this log's events: surface it to the executor."""
        self._failure = error
        self.pending = []
        self._idle.set()

    def taken_over(self) -> None:
        """The run's last batch was not written: another process executes the run now (this one
        stalled past its lease). Stop executing it here, writing nothing more — the outside
        cancellation the lease keeper uses when it finds the same (the run is left as it is)."""
        log.warning("run %s was taken over by another process; stopping here", self.run_id)
        self.failed(RunTakenOver(f"run {self.run_id!r} is executed by another process now"))
        if self._owner is not None and not self._owner.done():
            self._owner.cancel()

    def seal(self, event: Event) -> StoredEvent:
        """Build an event with the next seq, without queueing it (nothing may be queued then).

        The caller writes it together with a change of the run's status (the terminal event
        with ``Store.finish_run``; the first ``status`` with ``Store.mark_running``) and then
        calls :meth:`publish_final`, or :meth:`unseal` if it was not written.
        """
        seq = self._next_seq
        self._next_seq += 1
        return stored_event(self.run_id, seq, event)

    def restart_at(self, seq: int) -> None:
        """After a failed commit: drop what was not written and continue at ``seq``."""
        self.pending = []
        self._next_seq = seq
        self._idle.set()

    def unseal(self, final: StoredEvent) -> None:
        """Give back the seq of a sealed event that was not written."""
        if final.seq == self._next_seq - 1:
            self._next_seq -= 1

    def publish_final(self, final: StoredEvent) -> None:
        """Publish a sealed event once it is committed (the terminal event, or the ``status``
        written with the run's start)."""
        self._bus.publish(self.run_id, [final])

    async def wait_for_idle(self) -> None:
        """Wait until everything emitted so far is committed and published."""
        await self._idle.wait()
        if self._failure is not None:
            raise EventLogFailed("event log failed") from self._failure

    async def aclose(self) -> None:
        """Wait until what was emitted is committed (then stop this log's own writer, if any)."""
        try:
            await self._idle.wait()  # a failure was already raised to whoever emitted
        finally:
            if self._own_writer:
                await self._writer.aclose()
