"""One writer for the events of every run in the process: group commit across runs.

Each run's :class:`~._eventlog.EventLog` hands its batches here instead of opening its own
transaction. The writer commits everything that is waiting, from every run, in one
transaction, then wakes each log, which publishes its batch (so an event is still durable
before anyone sees it). While a commit is in flight, new batches wait and go together in the
next one; the first batch after an idle moment is committed at once. With hundreds of runs
streaming, that is one transaction per commit latency instead of one per run per token, and on
SQLite one turn of the write lock instead of hundreds.

A commit that fails is retried run by run, so one run's bad batch (a seq another process took
first) fails only that run's log, not every run that shared the transaction.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from ..errors import EventLogFailed
from ..events import StoredEvent
from ..store import Store

__all__ = ["GroupCommit"]

log = logging.getLogger("tether.runtime")

_Waiting = tuple[str, Sequence[StoredEvent], "asyncio.Future[None]"]


class GroupCommit:
    """Commits the batches of all runs' event logs, many runs per transaction."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._waiting: list[_Waiting] = []
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        #: Transactions committed and batches they carried (counters for ``/metrics``).
        self.transactions = 0
        self.batches = 0

    def start(self) -> None:
        """Start the writer task (owned by this object; stopped by :meth:`aclose`)."""
        self._task = asyncio.create_task(self._write_loop(), name="group-commit")

    async def append(self, run_id: str, batch: Sequence[StoredEvent]) -> None:
        """Return once ``batch`` is committed; raise what the commit raised if it failed.

        Cancelling the caller does not take the batch back: like a cancelled database call,
        it may still be committed.
        """
        if self._task is None or self._task.done():
            await self._store.append_events(run_id, batch)  # no writer running: commit alone
            return
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append((run_id, batch, done))
        self._wakeup.set()
        await done

    async def _write_loop(self) -> None:
        try:
            while True:
                await self._wakeup.wait()
                self._wakeup.clear()
                waiting, self._waiting = self._waiting, []
                if waiting:
                    await self._commit(waiting)
        finally:
            # Stopped (the runtime is closing): nobody will commit what still waits.
            for _run_id, _batch, done in [*self._waiting]:
                _settle(done, EventLogFailed("the event writer stopped"))
            self._waiting = []

    async def _commit(self, waiting: list[_Waiting]) -> None:
        try:
            await self._store.append_event_batches([(run_id, batch) for run_id, batch, _ in waiting])
        except asyncio.CancelledError:
            for _run_id, _batch, done in waiting:
                _settle(done, EventLogFailed("the event writer stopped"))
            raise
        except Exception:
            if len(waiting) > 1:
                log.info("a commit of %d runs' events failed; committing them one run at a time", len(waiting))
            for run_id, batch, done in waiting:
                try:
                    await self._store.append_events(run_id, batch)
                except Exception as exc:
                    _settle(done, exc)
                else:
                    _settle(done, None)
            return
        self.transactions += 1
        self.batches += len(waiting)
        for _run_id, _batch, done in waiting:
            _settle(done, None)

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


def _settle(done: asyncio.Future[None], error: BaseException | None) -> None:
    if done.done():
        return  # its waiter was cancelled
    if error is None:
        done.set_result(None)
    else:
        done.set_exception(error)
