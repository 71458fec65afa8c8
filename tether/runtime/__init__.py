"""The runtime: owns every executing run, routes cancels and resumes, expires interrupts,
recovers after a restart.

Runs are executed by tasks that belong to the :class:`Runtime` (which lives as long as the
server's lifespan), never to an HTTP request, so a client that disconnects cannot stop a run.
A task's failure is contained to its own run. The expiry sweeper is one more owned task: it
expires due interrupts with no client connected, including ones that fell due while the
server was down.

:meth:`Runtime.open` is the one way in for a server: it opens the store and picks the bus (an
in-process one on SQLite; on PostgreSQL one that also hears other processes through
``LISTEN``), so the HTTP layer never deals with either: the runtime makes run ids, and a stream
gets a :class:`RunFeed` (:meth:`Runtime.feed`, :meth:`Runtime.start_followed_run`) to follow.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Sequence
from typing import Any, Required, TypedDict, Unpack

from .._ids import new_id, utcnow
from ..agent import Agent
from ..errors import Forbidden, InterruptExpired, InterruptResolved, NotFound, RunNotActive
from ..events import CancelMode, Resumed, format_ts
from ..models import Usage
from ..review import Decision, Expired
from ..store import Attach, CancelControl, ControlMessage, CreatedRun, InterruptRecord, RunRecord, RunStatus, Store
from ._allowances import DEFAULT_MAX_ALLOWANCE_TTL_S, grants
from ._bus import LocalBus, Subscription
from ._cancel import Cancels
from ._config import RunConfig
from ._decisions import decided, expired_entries, refused_entries
from ._eventlog import stored_event
from ._follow import FellBehind, RunFeed, StreamEnded, follow_run
from ._gate import FourEyesPolicy, check_decisions, check_four_eyes
from ._groupcommit import GroupCommit
from ._history import HistoryPolicy
from ._observer import RunObserver
from ._pgbus import open_bus
from ._runner import RunExecutor
from ._takeover import Takeover
from ._turn import TurnCalls, tool_message_content

__all__ = [
    "Runtime",
    "RunConfig",
    "RunFeed",
    "RunStart",
    "HistoryPolicy",
    "FourEyesPolicy",
    "TurnCalls",
    "tool_message_content",
    "LocalBus",
    "Subscription",
    "follow_run",
    "FellBehind",
    "StreamEnded",
    "RunObserver",
]

log = logging.getLogger("tether.runtime")


class RunStart(TypedDict, total=False):
    """What a run starts with (:meth:`Runtime.start_run`'s arguments after the thread)."""

    attach: Required[Attach]
    config: RunConfig | None
    owner: str | None
    requester: str | None


class Runtime:
    """Starts, resumes, cancels and recovers runs of one agent on one store.

    It owns the executing tasks; two parts own the rest: :attr:`takeover` (claims on runs:
    the lease keeper, the lapse watcher, taking runs over, draining and handing them over) and
    the cancels (:mod:`._cancel`: every cancel request, whoever executes its run).
    """

    def __init__(
        self,
        store: Store,
        agent: Agent,
        bus: LocalBus | None = None,
        *,
        sweep_interval_s: float = 0.25,
        four_eyes: FourEyesPolicy = "off",
        max_queued_messages: int = 100,
        max_allowance_ttl_s: float = DEFAULT_MAX_ALLOWANCE_TTL_S,
    ) -> None:
        self.store = store
        self.agent = agent
        #: ``destructive``: every destructive call needs an approver other than the run's requester.
        self.four_eyes: FourEyesPolicy = four_eyes
        self.bus = bus or LocalBus()
        #: Commits the events of every run of this process, many runs per transaction.
        self.writer = GroupCommit(store)
        self.sweep_interval_s = sweep_interval_s
        #: The most steering messages a run holds for its next model call.
        self.max_queued_messages = max_queued_messages
        #: The longest a standing approval may hold (``ttl_s`` above it: 422).
        self.max_allowance_ttl_s = max_allowance_ttl_s
        self._executors: dict[str, RunExecutor] = {}
        self._run_tasks: dict[str, asyncio.Task[None]] = {}
        #: Every cancel request, whoever executes its run (:mod:`._cancel`).
        self._cancels = Cancels(store, self.bus, self._executors)
        #: Which process executes which run (:mod:`._takeover`).
        self.takeover = Takeover(store, self._executors, self._run_tasks, launch=self.launch, cancels=self._cancels)
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False
        #: Set by :meth:`open`: then :meth:`aclose` also closes the bus and the store.
        self._owns_store = False
        #: Tokens consumed by the model calls this process made (a counter for ``/metrics``).
        self.tokens = Usage()
        #: Told where runs stand (telemetry: :mod:`tether.telemetry`); set it before :meth:`start`.
        self.observer = RunObserver()

    @classmethod
    async def open(
        cls,
        db_url: str,
        agent: Agent,
        *,
        lease_s: float = 10.0,
        sweep_interval_s: float = 0.25,
        four_eyes: FourEyesPolicy = "off",
        max_queued_messages: int = 100,
        stream_buffer_bytes: int = 1024 * 1024,
        max_allowance_ttl_s: float = DEFAULT_MAX_ALLOWANCE_TTL_S,
    ) -> Runtime:
        """Open the store at ``db_url`` (running migrations) and the bus that suits it; call
        :meth:`start` next, and :meth:`aclose` to close all of it.

        ``lease_s`` is how long this process's claim on a run it executes lasts without renewal:
        after that long without a heartbeat (the process died), another process sharing the
        PostgreSQL database takes the run over. ``max_queued_messages`` bounds the steering
        messages a run holds for its next model call; ``stream_buffer_bytes`` the events a stream
        that does not keep up may have waiting (:class:`~._bus.LocalBus`).
        """
        store = await Store.open(db_url)
        store.lease_s = lease_s
        try:
            bus = await open_bus(store, stream_buffer_bytes)
        except BaseException:
            await store.aclose()
            raise
        runtime = cls(
            store,
            agent,
            bus,
            sweep_interval_s=sweep_interval_s,
            four_eyes=four_eyes,
            max_queued_messages=max_queued_messages,
            max_allowance_ttl_s=max_allowance_ttl_s,
        )
        runtime._owns_store = True
        return runtime

    async def start(self) -> None:
        """Let the agent set up (``on_startup``), recover what a previous process left behind,
        then start the expiry sweeper, the lease keeper and (PostgreSQL) the lapse watcher."""
        if hasattr(self.bus, "on_control"):
            self.bus.on_control = self._on_control
        if type(self.observer) is not RunObserver:
            self.bus.on_committed = self.observer.committed
        self.writer.start()
        if self.agent.on_startup is not None:
            await self.agent.on_startup(self.store)
        # Mounted MCP servers first (bounded): the runs recovered next find their tools.
        await self.agent.open_tools()
        await self.takeover.recover()
        self._spawn(self._sweep_forever(), "interrupt-sweeper")
        self._spawn(self.takeover.keep_leases(), "lease-keeper")
        if not self.store.is_sqlite:
            self._spawn(self.takeover.watch_lapses(), "lapse-watcher")

    def end_streams(self) -> None:
        """End every stream following a run, now and from now on (the process is about to
        stop): each client resumes from its last seq, on another process or after the restart.
        The runs themselves go on until :meth:`aclose`."""
        self.bus.end_streams()

    async def drain(self, seconds: float) -> None:
        """Wait up to ``seconds`` for the runs this process executes to end or park (the process
        is about to stop; :meth:`aclose` hands the rest over): :meth:`Takeover.drain`."""
        await self.takeover.drain(seconds)

    def stop_draining(self) -> None:
        """Stop :meth:`drain` waiting: the runs still executing are handed over now."""
        self.takeover.stop_draining()

    @property
    def taken_over(self) -> int:
        """Runs this process took over since it started (a counter for ``/metrics``)."""
        return self.takeover.taken_over

    async def aclose(self) -> None:
        """Stop every owned task, then give up this process's claim on the runs it was
        executing and tell the other processes, so that one of them takes each over at once
        (from its last checkpoint, as after a crash; on SQLite the next start does). After
        :meth:`open`, close the bus and the store too."""
        self._closing = True
        executing = [run_id for run_id, executor in self._executors.items() if not executor.parked]
        try:
            tasks = list(self._tasks)
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
            await self.writer.aclose()  # after the runs: their logs commit through it
            await self.takeover.release(executing)
        finally:
            await self.agent.close_tools()
            if self._owns_store:
                try:
                    await self.bus.aclose()
                finally:
                    await self.store.aclose()

    def _spawn(self, coro: Any, name: str) -> asyncio.Task[None]:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # -- runs ------------------------------------------------------------------------------

    async def start_run(
        self,
        thread_id: str,
        *,
        attach: Attach,
        config: RunConfig | None = None,
        owner: str | None = None,
        requester: str | None = None,
    ) -> RunRecord:
        """Start a run on a thread: store it with its input, already ``running`` (its
        ``run_started`` and first ``status`` events and its first model turn's empty answer, one
        transaction), then execute it in a task of the runtime. Returns the run as created.

        ``attach`` says where the input goes (:class:`~tether.store.AtLeaf`, a new message after
        the active leaf; :class:`~tether.store.Fork`, under another message; or
        :class:`~tether.store.Regenerate`, the answer to a user message again).
        :class:`~tether.errors.NotFound` if the thread does not exist or is not ``owner``'s;
        :class:`~tether.errors.ThreadBusy` while another run of the thread is not terminal.
        ``requester`` is the principal starting it: it may decide the run's interrupts (unless
        four-eyes applies), and the server caps the runs of one requester that are active at
        once (:meth:`~tether.store.Store.count_active_runs`).
        """
        start = RunStart(attach=attach, config=config, owner=owner, requester=requester)
        return await self._start(thread_id, new_id("run"), start)

    async def start_followed_run(self, thread_id: str, **start: Unpack[RunStart]) -> tuple[RunRecord, RunFeed]:
        """:meth:`start_run` (with its arguments), and a feed of the new run's events subscribed
        before it started: it gets every event from ``run_started`` on, and its follower begins
        without reading the store back. :meth:`RunFeed.close` it when the stream is over."""
        run_id = new_id("run")
        live = self.bus.open(run_id)
        try:
            run = await self._start(thread_id, run_id, start)
        except BaseException:
            self.bus.close(live)
            raise
        return run, RunFeed(self.store, self.bus, run.id, live=live)

    def feed(self, run_id: str, *, after_seq: int = 0) -> RunFeed:
        """A feed of ``run_id``'s events after ``after_seq`` (replay, then the live tail)."""
        return RunFeed(self.store, self.bus, run_id, after_seq=after_seq)

    async def _start(self, thread_id: str, run_id: str, start: RunStart) -> RunRecord:
        config = start.get("config")
        created = await self.store.create_run(
            thread_id=thread_id,
            attach=start["attach"],
            config=(config or RunConfig()).model_dump(),
            owner=start.get("owner"),
            requested_by=start.get("requester"),
            running=True,
            run_id=run_id,
        )
        self.bus.publish(created.run.id, created.events)
        self.launch(created.run, started=created)
        return created.run

    def launch(
        self,
        run: RunRecord,
        *,
        resume: InterruptRecord | None = None,
        takeover: bool = False,
        started: CreatedRun | None = None,
    ) -> None:
        """Execute a run (queued, created running as ``started``, or resumed after ``resume``)
        in a task owned by the runtime."""
        existing = self._executors.get(run.id)
        if self._closing or (existing is not None and not existing.parked):
            return
        executor = RunExecutor(
            self.store,
            self.bus,
            self.agent,
            run,
            resume=resume,
            takeover=takeover,
            four_eyes=self.four_eyes,
            max_queued_messages=self.max_queued_messages,
            on_usage=functools.partial(self._model_call_ended, run.id),
            writer=self.writer,
            started=started,
        )
        self.observer.launched(run, resume=resume, takeover=takeover)
        self._executors[run.id] = executor  # registered before the task runs: cancel finds it
        self._run_tasks[run.id] = self._spawn(self._drive(executor), f"run-{run.id}")

    def _model_call_ended(self, run_id: str, usage: Usage) -> None:
        self.tokens.add(usage)
        self.observer.model_call_ended(run_id, usage)

    async def _drive(self, executor: RunExecutor) -> None:
        try:
            with self.observer.executing(executor.run):
                await executor.execute()
        except Exception:
            log.exception("executor of run %s crashed", executor.run.id)
        finally:
            if self._executors.get(executor.run.id) is executor:
                del self._executors[executor.run.id]
                self._run_tasks.pop(executor.run.id, None)

    def executing_count(self) -> int:
        """How many runs this process is executing now."""
        return sum(1 for executor in self._executors.values() if not executor.parked)

    async def cancel(self, run_id: str, *, mode: CancelMode = "soft", reason: str | None = None, actor: str = "anonymous") -> RunRecord:
        """Explicitly cancel a run (the only way a run becomes ``cancelled``; how, in one
        file: :mod:`._cancel`). Idempotent while cancelling; a ``hard`` request upgrades an
        earlier ``soft`` one. :class:`~tether.errors.RunNotActive` once the run is terminal."""
        return await self._cancels.cancel(run_id, mode=mode, reason=reason, actor=actor)

    def _on_control(self, message: ControlMessage) -> None:
        """A command from another process (through the bus)."""
        if isinstance(message, CancelControl):
            self._cancels.recorded_elsewhere(message.run_id, message.mode)
        elif not self._closing and not self.takeover.draining:
            # A process stopped and gave up its runs: take them over now, not at the next look.
            self._spawn(self.takeover.claim_released(), "claim-released")

    async def steer(self, run_id: str, content: str) -> str:
        """Steer a running run: send it a message (``user_message`` now, history before the next
        model call); returns the id its user message will have.
        :class:`~tether.errors.RunNotActive` unless the run is ``running``."""
        run = await self.store.get_run(run_id)
        executor = self._executors.get(run_id)
        if run.status != RunStatus.RUNNING or executor is None or executor.parked:
            raise RunNotActive(f"run {run_id!r} is {run.status}; steering messages go into running runs only", details={"status": run.status})
        return executor.steer(content)

    # -- human review ----------------------------------------------------------------------

    async def resume(self, thread_id: str, interrupt_id: str, decisions: Sequence[Decision], *, actor: str) -> RunRecord:
        """Apply a human's decisions to a pending interrupt and continue its run.

        All or nothing: the decisions are validated first (422/403 leave the interrupt
        pending), four-eyes included: ``actor`` may not approve a call that needs a second
        person if ``actor`` started the run, nor give a standing approval (an ``allow``) that
        the call does not permit. Then one conditional write decides the winner, so of racing
        resumes exactly one succeeds, the gated tools run once, and only the winner's standing
        approvals exist.
        """
        interrupt = await self.store.get_interrupt(interrupt_id)
        if interrupt.thread_id != thread_id:
            raise NotFound(f"interrupt {interrupt_id!r} not found in thread {thread_id!r}", code="interrupt_not_found")
        now = utcnow()
        if interrupt.status == "expired" or (interrupt.status == "pending" and interrupt.expires_at <= now):
            raise InterruptExpired(
                f"interrupt {interrupt_id!r} expired; its actions were rejected and can never run",
                details={"expires_at": format_ts(interrupt.expires_at)},
            )
        if interrupt.status != "pending":
            raise InterruptResolved(f"interrupt {interrupt_id!r} is already {interrupt.status}", details={"status": interrupt.status})
        turn = TurnCalls.from_parked(interrupt.turn)
        gated = turn.undecided
        normalised = check_decisions(self.agent.tools, gated, decisions)
        try:
            check_four_eyes(self.agent.tools, self.four_eyes, interrupt.action_requests, normalised, decider=actor, requester=interrupt.requested_by)
        except Forbidden:
            # The interrupt stays pending; the attempt itself is on record.
            await self.store.add_audit(refused_entries(interrupt, gated, normalised, actor=actor))
            raise
        # Standing approvals asked for with approvals: checked with the rest (422 changes nothing),
        # written by the transaction that resolves the interrupt.
        allowances = grants(self.agent.tools, self.four_eyes, interrupt, gated, normalised, actor=actor, now=now, max_ttl_s=self.max_allowance_ttl_s)
        public, entries = decided(self.agent.tools, interrupt, gated, normalised, actor=actor)
        run_id = interrupt.run_id
        self._cancels.resumes.begin(run_id)
        try:
            resolved, event, run = await self.store.leave_pending(
                interrupt_id,
                to_status="resolved",
                now=now,
                decisions=public,
                turn=turn.parked(),
                actor=actor,
                make_event=lambda run_id, seq: stored_event(
                    run_id, seq, Resumed(interrupt_id=interrupt_id, resolution="decided", decisions=public, actor=actor)
                ),
                audit_entries=entries,
                allowances=allowances,
            )
        except BaseException:
            await self._cancels.resume_lost(run_id)  # a cancel meanwhile left the run to us
            raise
        self._cancels.resumes.end(run_id)  # a cancel meanwhile: the executor finds it in the store
        # No await between the winning write and launch: a cancel arriving now finds the
        # executor; one that arrived during the write is found by the executor in the store.
        self.bus.publish(resolved.run_id, [event])
        self.launch(run, resume=resolved)
        return run

    async def expire(self, interrupt: InterruptRecord) -> bool:
        """Expire a due interrupt: its gated actions are rejected as ``expired`` and the run
        goes on so the model can wrap up. False if someone else settled it first."""
        turn = TurnCalls.from_parked(interrupt.turn)
        gated = turn.undecided
        public: list[Decision] = [Expired(call_id=c.id) for c in gated]
        for call, decision in zip(gated, public, strict=True):
            call.decision = decision
        try:
            resolved, event, run = await self.store.leave_pending(
                interrupt.id,
                to_status="expired",
                now=utcnow(),
                decisions=public,
                turn=turn.parked(),
                actor="system",
                make_event=lambda run_id, seq: stored_event(
                    run_id, seq, Resumed(interrupt_id=interrupt.id, resolution="expired", decisions=public, actor="system")
                ),
                audit_entries=expired_entries(interrupt, gated),
            )
        except (InterruptResolved, InterruptExpired):
            return False
        self.bus.publish(resolved.run_id, [event])
        self.launch(run, resume=resolved)  # no await since the winning write
        return True

    async def _sweep_forever(self) -> None:
        while True:
            try:
                for interrupt in await self.store.due_interrupts(utcnow()):
                    await self.expire(interrupt)
            except Exception:
                log.exception("interrupt sweeper failed; retrying")
            await asyncio.sleep(self.sweep_interval_s)
