"""The runtime: owns every executing run, routes cancels, recovers after a restart.

Runs are executed by tasks that belong to the :class:`Runtime` (which lives as long as the
server's lifespan), never to an HTTP request, so a client that disconnects cannot stop a run.
A task's failure is contained to its own run.
"""

from __future__ import annotations

import asyncio
import logging

from ..agent import Agent
from ..events import Cancelled, Envelope, RunError
from ..store import RunRecord, Store, StoredEvent
from .._ids import utcnow
from .bus import LocalBus, Subscription
from .config import RunConfig
from .follow import follow_run
from .runner import RunExecutor

__all__ = ["Runtime", "RunConfig", "LocalBus", "Subscription", "follow_run"]

log = logging.getLogger("tether.runtime")


class Runtime:
    """Starts, cancels and recovers runs of one agent on one store."""

    def __init__(self, store: Store, agent: Agent, bus: LocalBus | None = None) -> None:
        self.store = store
        self.agent = agent
        self.bus = bus or LocalBus()
        self._executors: dict[str, RunExecutor] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False

    async def start(self) -> None:
        """Recover what a previous process left behind."""
        await self._recover()

    async def aclose(self) -> None:
        """Stop every executing task (their runs are recovered on the next start)."""
        self._closing = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    # -- runs ------------------------------------------------------------------------------

    def launch(self, run: RunRecord) -> None:
        """Start executing a queued run in a task owned by the runtime."""
        if self._closing or run.id in self._executors:
            return
        executor = RunExecutor(self.store, self.bus, self.agent, run)
        self._executors[run.id] = executor  # registered before the task runs: cancel finds it
        task = asyncio.create_task(self._drive(executor), name=f"run-{run.id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _drive(self, executor: RunExecutor) -> None:
        try:
            await executor.execute()
        except Exception:
            log.exception("executor of run %s crashed", executor.run.id)
        finally:
            self._executors.pop(executor.run.id, None)

    def is_executing(self, run_id: str) -> bool:
        """True while this process executes ``run_id``."""
        return run_id in self._executors

    async def cancel(self, run_id: str, *, mode: str = "soft", reason: str | None = None, actor: str = "anonymous") -> RunRecord:
        """Explicitly cancel a run (the only way a run becomes ``cancelled``).

        Idempotent while cancelling; a ``hard`` request upgrades an earlier ``soft`` one.
        Raises :class:`RunNotActive` once the run is terminal.
        """
        record = await self.store.request_cancel(run_id, mode=mode, reason=reason, actor=actor)
        executor = self._executors.get(run_id)
        if executor is not None:
            executor.request_cancel(record.cancel_mode or mode)
        else:
            # Nothing executes it here (queued elsewhere, waiting for a human, or orphaned):
            # finish it directly. The conditional write makes a racing finisher harmless.
            await self._finish_without_executor(record)
        return await self.store.get_run(run_id)

    async def _finish_without_executor(self, record: RunRecord) -> None:
        seq = await self.store.last_seq(record.id) + 1
        event = Cancelled(mode=record.cancel_mode or "soft", reason=record.cancel_reason, actor=record.cancel_actor, partial_message_id=None)  # type: ignore[arg-type]
        await self._write_final(record.id, seq, event, "cancelled", ("cancelling",), None)

    async def _write_final(self, run_id: str, seq: int, event: Cancelled | RunError, status: str, allowed: tuple[str, ...], error: dict | None) -> bool:
        envelope = Envelope.wrap(run_id, seq, event, utcnow())
        final = StoredEvent(seq, envelope.type, envelope.to_json())
        written = await self.store.finish_run(run_id, status=status, final_event=final, from_statuses=allowed, error=error)
        if written:
            self.bus.publish(run_id, [final])
        return written

    # -- recovery --------------------------------------------------------------------------

    async def _recover(self) -> None:
        """Finish what a dead process left: ``running`` → failed (``server_restarted``),
        ``cancelling`` → cancelled, ``queued`` → executed now."""
        for run in await self.store.runs_in_status(("running", "cancelling", "queued")):
            if run.status == "queued":
                self.launch(run)
                continue
            await self._settle_partial_messages(run)
            if run.status == "cancelling":
                await self._finish_without_executor(run)
            else:
                seq = await self.store.last_seq(run.id) + 1
                error = RunError(code="server_restarted", message="the server stopped while this run was executing", retryable=True)
                await self._write_final(run.id, seq, error, "failed", ("running",), {"code": error.code, "message": error.message})
            log.info("recovered run %s (was %s)", run.id, run.status)

    async def _settle_partial_messages(self, run: RunRecord) -> None:
        """Give a dead run's half-written assistant messages their streamed text, flagged."""
        texts: dict[str, list[str]] = {}
        after = 0
        while True:
            page = await self.store.read_events(run.id, after_seq=after, limit=5000)
            if not page:
                break
            after = page[-1].seq
            for stored in page:
                if stored.type == "token":
                    data = Envelope.from_json(stored.envelope).data
                    texts.setdefault(data["message_id"], []).append(data["text"])
        for message in await self.store.thread_messages(run.thread_id):
            if message.run_id == run.id and message.status == "partial":
                status = "cancelled" if run.status == "cancelling" else "failed"
                await self.store.update_message(message.id, content="".join(texts.get(message.id, [])), status=status)

