"""Which process executes which run: claims and their leases, taking runs over, handing them
over when the process stops.

Each run that needs an executor carries a claim (``runs.executor_id``, ``lease_expires_at``):
the lease keeper renews this process's claims every ``lease_s / 3``; on PostgreSQL the lapse
watcher sleeps until the earliest claim another process holds runs out and takes that run over
(its process died). A process that is told to stop lets its runs finish for a while
(:meth:`Takeover.drain`), then releases the rest (``Store.release_runs``) and says so (a
``released`` control message): the other processes take them over at once, from their last
checkpoint, instead of when the lease lapses. On SQLite (one process) the next start claims
every unfinished run.

:class:`~tether.runtime.Runtime` holds a :class:`Takeover` (its ``takeover``) for all of this.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from .._ids import utcnow
from ..store import ReleasedControl, RunRecord, Store

if TYPE_CHECKING:
    from ._cancel import Cancels
    from ._runner import RunExecutor

__all__ = ["Launch", "Takeover", "executed_elsewhere"]

log = logging.getLogger("tether.runtime")

#: How long after a claim's expiry the lapse watcher claims it: a little, so that the claim has
#: run out by the database's clock too when the conditional write compares it.
_LAPSE_MARGIN_S = 0.05


class Launch(Protocol):
    """How the takeover starts an executor for a run it claimed (``Runtime.launch``)."""

    def __call__(self, run: RunRecord, *, takeover: bool) -> None: ...


def executed_elsewhere(store: Store, record: RunRecord) -> bool:
    """True while another process holds a live claim on the run."""
    return (
        record.executor_id is not None
        and record.executor_id != store.instance_id
        and record.lease_expires_at is not None
        and record.lease_expires_at > utcnow()
    )


class Takeover:
    """A :class:`~tether.runtime.Runtime`'s claims on runs: keeping, taking, handing over."""

    def __init__(
        self,
        store: Store,
        executors: Mapping[str, RunExecutor],
        run_tasks: Mapping[str, asyncio.Task[None]],
        *,
        launch: Launch,
        cancels: Cancels,
    ) -> None:
        self._store = store
        #: The runtime's executors and their tasks (this part reads them, the runtime keeps them).
        self._executors = executors
        self._run_tasks = run_tasks
        self._launch = launch
        self._cancels = cancels
        #: Runs this process took over since it started (a counter for ``/metrics``).
        self.taken_over = 0
        #: True once the process is stopping (:meth:`drain`): it takes over no more runs.
        self.draining = False
        #: Set to stop :meth:`drain` waiting (the process was told to stop at once).
        self._drain_cut = asyncio.Event()

    async def drain(self, seconds: float) -> None:
        """Wait up to ``seconds`` for the runs this process executes to end or to park
        on a human decision (the process is about to stop; call :meth:`aclose` next, which
        hands the rest over). Meanwhile it takes over no runs of other processes. Returns early
        when :meth:`stop_draining` is called."""
        self.draining = True
        waiting: set[asyncio.Future[Any]] = {
            task for run_id, task in self._run_tasks.items() if (executor := self._executors.get(run_id)) is not None and not executor.parked
        }
        if not waiting or seconds <= 0:
            return
        log.info("stopping: waiting up to %g s for %d run(s) to finish (Ctrl-C again stops them now)", seconds, len(waiting))
        cut = asyncio.ensure_future(self._drain_cut.wait())
        try:
            async with asyncio.timeout(seconds):
                while waiting and not cut.done():
                    _done, waiting = await asyncio.wait({*waiting, cut}, return_when=asyncio.FIRST_COMPLETED)
                    waiting.discard(cut)
        except TimeoutError:
            pass
        finally:
            cut.cancel()

    def stop_draining(self) -> None:
        """Stop :meth:`drain` waiting: the runs still executing are handed over now."""
        self._drain_cut.set()

    async def release(self, run_ids: list[str]) -> None:
        """Give up the claims on ``run_ids`` (their executors have stopped) and announce it."""
        if not run_ids:
            return
        try:
            released = await self._store.release_runs(run_ids)
            if released:
                await self._store.send_control(ReleasedControl(run_ids=tuple(released)))
                log.info("released %d run(s) for another process, or the next start, to take over", len(released))
        except Exception as exc:
            # Their leases then lapse as if this process had died: the takeover only waits longer.
            log.warning("could not release the runs this process executed (%s); they are taken over when their leases lapse", exc)

    async def keep_leases(self) -> None:
        """Renew this process's claims; pick up cancels another process recorded (a backstop
        for a lost notification)."""
        interval = self._store.lease_s / 3
        while True:
            await asyncio.sleep(interval)
            try:
                local = [rid for rid, ex in self._executors.items() if not ex.parked]
                # One statement, however many runs: each run's own read here was a stall of
                # the loop every few seconds under hundreds of runs.
                held = await self._store.renew_leases(local)
                for run_id in set(local) - held.keys():
                    # Taken over while we stalled: stop executing it, write nothing more
                    # (an outside cancellation; the run now belongs to another process).
                    task = self._run_tasks.get(run_id)
                    if task is not None:
                        log.warning("run %s was taken over by another process; stopping here", run_id)
                        task.cancel()
                for run_id, cancel_mode in held.items():
                    if cancel_mode is not None:
                        self._cancels.recorded_elsewhere(run_id, cancel_mode)
            except Exception:
                log.exception("lease keeper failed; retrying")

    async def watch_lapses(self) -> None:
        """PostgreSQL: take over the runs of a process that died as soon as its claim runs out.
        Sleeps until the earliest claim another process holds lapses (at most ``lease_s / 3``:
        a run may also be waiting with no claim), then claims what lapsed meanwhile."""
        interval = self._store.lease_s / 3
        while True:
            wait = interval
            try:
                due = await self._store.next_lease_lapse()
                if due is not None:
                    wait = min(interval, max(_LAPSE_MARGIN_S, (due - utcnow()).total_seconds() + _LAPSE_MARGIN_S))
            except Exception:
                log.exception("reading the next lease lapse failed; looking again later")
            await asyncio.sleep(wait)
            if self.draining:
                continue
            try:
                await self._recover_runs(await self._store.claim_abandoned())
            except Exception:
                log.exception("taking over abandoned runs failed; retrying")
                await asyncio.sleep(interval)

    async def claim_released(self) -> None:
        """Claim runs another process released (or whose claim lapsed), in rounds until none
        is left: the processes that heard the same notification share them, one winner each."""
        try:
            while claimed := await self._store.claim_abandoned():
                await self._recover_runs(claimed)
        except Exception:
            log.exception("taking over released runs failed; the lapse watcher retries")

    async def recover(self) -> None:
        """At start-up, take the runs a dead process left. On SQLite (one process) that is
        every run needing an executor; on PostgreSQL, only those whose claim has lapsed (other
        live processes keep theirs), and the lapse watcher goes on looking."""
        claimed = await (self._store.claim_all_active() if self._store.is_sqlite else self._store.claim_abandoned())
        await self._recover_runs(claimed)

    async def _recover_runs(self, claimed: list[RunRecord]) -> None:
        """Take over runs claimed from a dead process: ``queued`` ones start; ``running`` and
        ``cancelling`` ones continue from their last checkpoint (a cancelling one straight to
        its ``cancelled`` end). ``waiting_human`` runs need nothing: they live in the store."""
        for run in claimed:
            self._launch(run, takeover=run.status != "queued")
            self.taken_over += 1
            log.info("took over run %s (was %s)", run.id, run.status)
