"""One writer for the events of every run in the process: group commit across runs.

A run's :class:`~._eventlog.EventLog` queues its events and asks this writer to commit them
(:meth:`GroupCommit.schedule`); it has no task of its own. The writer's one task takes what
every waiting log has queued, commits all of it in one transaction, and only then hands each
log its batch back to publish (so an event is still durable before anyone sees it). While a
commit is in flight, new events wait and go together in the next one; the first events after
an idle moment are committed at once. With hundreds of runs streaming, that is one
transaction and one task wake-up per commit latency, instead of one per run per token, and on
SQLite one turn of the write lock instead of hundreds.

Under sustained load (events arrived during each of the last two commits) the writer paces
itself, as PostgreSQL's ``commit_delay`` does: a transaction costs far more than an event does
(its round trips and fsync, and on SQLite every page it touches: with hundreds of runs
streaming, each run's newest events sit on a page of their own, so a commit writes a page per
run whether it carries one event of that run or five), so committing as fast as possible spends
the process on transactions instead of on the streams. Two rules:

- after a slow commit (one that took ``_SLOW_COMMIT_S`` or more), while the runs waiting have
  about one event each (many runs streaming at a model's pace), the writer rests as long as that
  commit took before it takes the next batch: the store works at most half the time, and each
  commit carries about twice the events per run. An event waits at most one commit's time more;
  with commits this slow, the streams were already that far behind. Runs that have many events
  queued each (a model faster than the store) gain nothing from a rest, and get none;
- a small transaction (under ``_BURST_EVENTS``) after a quick commit waits ``_BURST_LINGER_S``
  for more.

Events after an idle moment never wait, nor do the ones right after them (a run's first tokens,
arriving while its ``status`` event commits): a single stream, or a few, never trigger either
rule (``benchmarks/scale.py`` measures both, many runs at once and one alone).

A commit that fails is retried log by log, so one run's bad batch (a seq another process took
first) fails only that run's log, not every run that shared the transaction. A run this process
no longer executes (another process took it over while this one stalled past its lease) has
nothing written: its log is told (:meth:`~._eventlog.EventLog.taken_over`) and stops its run.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from ..errors import EventLogFailed
from ..store import Store

if TYPE_CHECKING:
    from ..events import StoredEvent
    from ._eventlog import EventLog

__all__ = ["GroupCommit"]

log = logging.getLogger("tether.runtime")

#: How long a small transaction waits for more during a sustained burst, and what counts as small.
_BURST_LINGER_S = 0.001
_BURST_EVENTS = 256
#: A commit at least this slow, under sustained load, is followed by a rest as long as it took
#: while the runs waiting have fewer than ``_FEW_EVENTS_PER_RUN`` events queued on average.
_SLOW_COMMIT_S = 0.002
_FEW_EVENTS_PER_RUN = 2


class GroupCommit:
    """Commits the queued events of all runs' event logs, many runs per transaction."""

    def __init__(self, store: Store) -> None:
        self._store = store
        #: Logs with queued events, in the order they asked (a dict as an ordered set).
        self._waiting: dict[EventLog, None] = {}
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        #: Transactions committed, the run batches they carried, and the rests the writer took
        #: after slow commits (counters for tests and benchmarks).
        self.transactions = 0
        self.batches = 0
        self.rests = 0

    def start(self) -> None:
        """Start the writer task (owned by this object; stopped by :meth:`aclose`)."""
        if self._task is None:
            self._task = asyncio.create_task(self._write_loop(), name="group-commit")

    def schedule(self, event_log: EventLog) -> None:
        """``event_log`` has queued events: commit them with the next transaction."""
        if self._task is None:
            self.start()  # first use, e.g. a runtime driven without start()
        elif self._task.done():
            event_log.failed(EventLogFailed("the event writer has stopped"))
            return
        self._waiting[event_log] = None
        self._wakeup.set()

    async def _write_loop(self) -> None:
        busy = 0  # how many commits in a row had events arriving while they were in flight
        took = 0.0  # how long the last commit took
        loop = asyncio.get_running_loop()
        try:
            while True:
                await self._wakeup.wait()
                if busy >= 2:
                    queued = sum(len(waiting.pending) for waiting in self._waiting)
                    if took >= _SLOW_COMMIT_S and queued < _FEW_EVENTS_PER_RUN * len(self._waiting):
                        self.rests += 1
                        await asyncio.sleep(took)
                    elif queued < _BURST_EVENTS:
                        await asyncio.sleep(_BURST_LINGER_S)
                self._wakeup.clear()
                logs, self._waiting = list(self._waiting), {}
                work = [(event_log, batch) for event_log in logs if (batch := event_log.take())]
                if work:
                    began = loop.time()
                    await self._commit(work)
                    took = loop.time() - began
                busy = busy + 1 if self._waiting else 0
        finally:
            # Stopped (the runtime is closing): nobody will commit what still waits.
            for event_log in self._waiting:
                event_log.failed(EventLogFailed("the event writer stopped"))
            self._waiting = {}

    async def _commit(self, work: list[tuple[EventLog, list[StoredEvent]]]) -> None:
        try:
            lost = await self._store.append_event_batches([(event_log.run_id, batch) for event_log, batch in work])
        except asyncio.CancelledError:
            for event_log, _batch in work:
                event_log.failed(EventLogFailed("the event writer stopped"))
            raise
        except Exception:
            if len(work) > 1:
                log.info("a commit of %d runs' events failed; committing them one run at a time", len(work))
            await self._commit_one_by_one(work)
            return
        self.transactions += 1
        self.batches += len(work)
        for event_log, batch in work:
            if event_log.run_id in lost:
                event_log.taken_over()
            else:
                event_log.committed(batch)

    async def _commit_one_by_one(self, work: list[tuple[EventLog, list[StoredEvent]]]) -> None:
        for done, (event_log, batch) in enumerate(work):
            try:
                lost = await self._store.append_events(event_log.run_id, batch)
            except asyncio.CancelledError:
                for rest, _batch in work[done:]:
                    rest.failed(EventLogFailed("the event writer stopped"))
                raise
            except Exception as exc:
                event_log.failed(exc)
            else:
                self.transactions += 1
                self.batches += 1
                if lost:
                    event_log.taken_over()
                else:
                    event_log.committed(batch)

    async def aclose(self) -> None:
        """Stop the writer; call it after every event log using it has closed."""
        if self._task is None:
            return
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            if (task := asyncio.current_task()) is not None and task.cancelling():
                raise
