"""A run's cancellation, in one file: how a cancel request becomes a ``cancelled`` run.

A cancel is the only way a run becomes ``cancelled``. Whichever way it comes (the API in this
process, a ``tether_control`` notification from another one, the lease keeper's look at the
store, a takeover of a run that was already stopping), it goes through the same four states,
in this order, and the same code moves it from one to the next::

      Cancels.cancel(run_id, mode, reason, actor)           the runtime: REQUESTED
        │
        │   the run's executor is here            (RunCancel, one per executor)
        │   ┌────────────────────────────────────────────────────────────────────┐
        ├──▶│ none ──signal(mode, durable=False)──▶ SIGNALLED ──recorded()──▶ DURABLE ──end()──▶ ENDED
        │   │   │                                     ▲                            ▲
        │   │   ├──signal(mode) (written already: ────┘ (and DURABLE)              │
        │   │   │   control message, lease keeper, takeover)                       │
        │   │   └──hand_over(request) (streaming) ─── SIGNALLED, then DURABLE + ENDED in one write
        │   └────────────────────────────────────────────────────────────────────┘
        │
        ├──▶ executed by another process: Store.request_cancel, then NOTIFY tether_control;
        │    there: Cancels.recorded_elsewhere ──▶ RunCancel.signal (as above, durable)
        ├──▶ a resume committing here: Store.request_cancel; the resume deals with it
        │    (:class:`~._resumes.ResumesUnderWay`: its executor starts SIGNALLED, or, should the
        │    resume lose, Cancels.finish_without_executor)
        └──▶ nothing executes it (queued, waiting for a human, orphaned): Store.request_cancel,
             then Cancels.finish_without_executor: DURABLE ──▶ ENDED with no executor

Why each transition exists:

- **SIGNALLED** (:meth:`RunCancel.signal`): the executor's *model* scope is cancelled in both
  modes, its *tools* scope for ``hard`` too; from then on nothing new starts. The runtime
  signals *before* it writes the request, in the same hop, so the model stops generating
  without waiting for a commit. ``hard`` stays hard; a second request changes nothing else.
- **DURABLE** (:meth:`RunCancel.recorded`): the request is on record (``cancelling``, mode,
  reason, actor, its audit entry: ``Store.request_cancel``). The ``cancelled`` write is
  conditional on that status, so a run never ends ``cancelled`` without its request on record,
  and "cancel wins over completion" is decided by the database: whichever write commits first.
  An executor signalled before the write waits for it (``durable=False``) before it ends the run.
- **hand-over** (:meth:`RunCancel.hand_over`): while the run streams its answer (the usual
  moment to cancel), the end write records the request itself (``finish_run(cancel=…)``):
  DURABLE and ENDED are one commit. If that write does not apply (another request was recorded
  first) the caller records its request the usual way.
- **ENDED** (:meth:`RunCancel.end`, :meth:`Cancels.finish_without_executor`): the ``cancelled``
  event (:func:`cancelled_event`, the one builder: it states the request on record) and the
  status in one transaction, only while the recorded mode is the one the event states: a
  ``hard`` request that upgraded it meanwhile makes the write match no row, and the run ends
  again with ``hard``.

:class:`RunCancel` keeps where it is in one value, :class:`CancelState` (NONE, SIGNALLED,
HANDED_OVER, DURABLE, ENDED, as drawn above); every transition is a method that checks it, and
the runner and the run's end ask it (:meth:`RunCancel.adopt`, :meth:`RunCancel.end_run`) instead
of reading its fields.

A cancel of the run's own is kept apart from an outside ``CancelledError`` (the server
stopping): that one propagates untouched and leaves the run for recovery.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING

import anyio

from ..events import Cancelled, CancelMode, StoredEvent
from ..store import CancelControl, CancelRequest, RunRecord, Store, TurnOutcome
from ._eventlog import EventLog, stored_event
from ._resumes import ResumesUnderWay
from ._takeover import executed_elsewhere
from ._turn import TurnCalls, turn_messages

if TYPE_CHECKING:
    from ._bus import LocalBus
    from ._runner import RunExecutor

__all__ = ["CancelMode", "CancelState", "Cancels", "RunCancel", "cancelled_event"]

log = logging.getLogger("tether.runtime")


def cancelled_event(recorded: RunRecord | CancelRequest, *, partial_message_id: str | None = None) -> Cancelled:
    """The ``cancelled`` event that ends a run: it states the request on record (the run's, or
    the one its end write records)."""
    if isinstance(recorded, CancelRequest):
        return Cancelled(mode=recorded.mode, reason=recorded.reason, actor=recorded.actor, partial_message_id=partial_message_id)
    mode: CancelMode = recorded.cancel_mode or "soft"
    return Cancelled(mode=mode, reason=recorded.cancel_reason, actor=recorded.cancel_actor, partial_message_id=partial_message_id)


class CancelState(enum.Enum):
    """Where one executor's cancel is (:class:`RunCancel`); each transition checks it."""

    #: Nothing signalled: the run goes on.
    NONE = "none"
    #: A request signalled here (the model stopped; with ``hard``, the tools too) whose write the
    #: runtime has under way: the run does not end before it is on record.
    SIGNALLED = "signalled"
    #: Signalled with the request itself while the answer streamed: the run's end write records it
    #: (DURABLE and ENDED in one commit).
    HANDED_OVER = "handed_over"
    #: A request on record (``cancelling``, or, after a failed write, to be recorded by the end):
    #: the run ends ``cancelled``.
    DURABLE = "durable"
    #: The ``cancelled`` event and status are written.
    ENDED = "ended"


class RunCancel:
    """One run's cancel as its executor carries it out: SIGNALLED → DURABLE → ENDED."""

    def __init__(self, store: Store, run: RunRecord) -> None:
        self._store = store
        self._run = run
        #: Where the cancel is (:class:`CancelState`).
        self.state = CancelState.NONE
        #: The mode signalled here, or None: "requested", not "done". ``hard`` stays hard.
        self.mode: CancelMode | None = None
        self._model_scope: anyio.CancelScope | None = None
        self._tools_scope: anyio.CancelScope | None = None
        #: Set unless a request signalled here is being written (SIGNALLED, or the end write of
        #: a handed-over one): what :meth:`end` waits for.
        self._written = asyncio.Event()
        self._written.set()
        #: DURABLE: the run as the runtime's write of the request left it (who asked, why).
        self._record: RunRecord | None = None
        #: HANDED_OVER: the request the run's end records, and the answer its caller awaits.
        self._handed: tuple[CancelRequest, asyncio.Future[bool]] | None = None

    @classmethod
    def for_executor(cls, store: Store, run: RunRecord, *, takeover: bool) -> RunCancel:
        """The cancel of a new executor of ``run``: a run taken over while it was stopping starts
        DURABLE (its request is on record)."""
        cancel = cls(store, run)
        if takeover:
            cancel.adopt(run)
        return cancel

    def _move(self, to: CancelState, *allowed: CancelState) -> None:
        if self.state not in allowed:
            raise RuntimeError(f"run {self._run.id}: cancel cannot go from {self.state.value} to {to.value}")
        self.state = to

    @property
    def requested(self) -> bool:
        """True once a cancel was signalled: nothing new starts."""
        return self.state is not CancelState.NONE

    @property
    def streaming(self) -> bool:
        """True while the model streams and nothing was signalled: a cancel now can end the run
        in one write (:meth:`hand_over`)."""
        return self._model_scope is not None and self.state is CancelState.NONE

    @property
    def handed_over(self) -> bool:
        """True while a handed-over request waits for the run's end."""
        return self.state is CancelState.HANDED_OVER

    # -- the scopes a signal cancels ------------------------------------------------------------

    @contextmanager
    def model_scope(self) -> Iterator[anyio.CancelScope]:
        """The scope of one model call: cancelled by any signal (at once if one came already)."""
        with anyio.CancelScope() as scope:
            self._model_scope = scope
            if self.requested:
                scope.cancel()
            try:
                yield scope
            finally:
                self._model_scope = None

    @contextmanager
    def tools_scope(self) -> Iterator[anyio.CancelScope]:
        """The scope of executing tools: cancelled by a ``hard`` signal only."""
        with anyio.CancelScope() as scope:
            self._tools_scope = scope
            if self.mode == "hard":
                scope.cancel()
            try:
                yield scope
            finally:
                self._tools_scope = None

    # -- the transitions ----------------------------------------------------------------------

    def signal(self, mode: CancelMode, *, durable: bool = True) -> None:
        """SIGNALLED: stop the model stream now; with ``hard`` also cancel executing tools.

        ``durable=False``: the request is not on record yet (the runtime is writing it); the
        run ends only after :meth:`recorded`. A request on record already (``durable``, the
        default) makes the cancel DURABLE at once. A second request changes only the mode
        (``soft`` → ``hard``).
        """
        if self.state is CancelState.ENDED:
            return
        if self.state is CancelState.NONE:
            self.state = CancelState.DURABLE if durable else CancelState.SIGNALLED
            if not durable:
                self._written.clear()
        if self.mode != "hard":
            self.mode = mode
        if self._model_scope is not None:
            self._model_scope.cancel()
        if mode == "hard" and self._tools_scope is not None:
            self._tools_scope.cancel()

    def signal_recorded(self, mode: CancelMode) -> None:
        """SIGNALLED (and DURABLE) by a request recorded without a word here: unless it changes nothing."""
        if self.mode not in ("hard", mode):
            self.signal(mode)

    def adopt(self, record: RunRecord) -> bool:
        """A request found on record (the run read back is ``cancelling``): SIGNALLED and DURABLE
        at once, with the recorded mode. False (nothing changes) when ``record`` is not cancelling."""
        if record.status != "cancelling":
            return False
        self.signal(record.cancel_mode or "soft")
        return True

    async def hand_over(self, request: CancelRequest) -> bool:
        """HANDED_OVER, while :attr:`streaming`: the run's end records the request (DURABLE and
        ENDED in one commit). True once that transaction committed; False when it did not apply
        or did not happen: the caller then records ``request`` as usual, and the run ends once
        that is over (:meth:`recorded`)."""
        answer: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._move(CancelState.HANDED_OVER, CancelState.NONE)
        self._handed = (request, answer)
        self.mode = request.mode
        if self._model_scope is not None:
            self._model_scope.cancel()
        if request.mode == "hard" and self._tools_scope is not None:
            self._tools_scope.cancel()
        # Shielded: a caller that goes away does not stop the run's end (nor its answer).
        return await asyncio.shield(answer)

    def answer_hand_over(self, ended: bool) -> None:
        """Give the :meth:`hand_over` caller its answer: did the run end with its request? If it
        did not, the request is the caller's to record (SIGNALLED until it is)."""
        if self._handed is not None:
            (_request, answer), self._handed = self._handed, None
            if self.state is CancelState.HANDED_OVER:
                self.state = CancelState.SIGNALLED
                self._written.clear()
            if not answer.done():
                answer.set_result(ended)

    def recorded(self, record: RunRecord | None) -> None:
        """DURABLE: the runtime's write of a request signalled here is over: written (``record``,
        the run as it left it), or failed (None: the end records it, actor ``system``)."""
        if record is not None and record.status == "cancelling":
            self._record = record
        if self.state is CancelState.SIGNALLED:
            self.state = CancelState.DURABLE
        self._written.set()

    async def end_run(self, events: EventLog, *, partial_message_id: str | None, last_turn: TurnOutcome | None) -> bool:
        """If a request was handed over, end the run with it (:meth:`end_handed_over`); True when
        that ended the run. False when there was none, or its write did not apply: the run's end
        goes on its way (its outcome's write, or :meth:`end`)."""
        if self.state is not CancelState.HANDED_OVER:
            return False
        return await self.end_handed_over(events, partial_message_id=partial_message_id, last_turn=last_turn)

    async def end_handed_over(self, events: EventLog, *, partial_message_id: str | None, last_turn: TurnOutcome | None) -> bool:
        """ENDED in the transaction that also records the handed-over request (its audit entry
        too): one commit from the request to ``cancelled``. False if the write did not apply
        (the run is no longer ``running``): the caller's record of it then comes first."""
        if self.state is not CancelState.HANDED_OVER or self._handed is None:
            raise RuntimeError(f"run {self._run.id}: no cancel was handed over ({self.state.value})")
        request = self._handed[0]
        # The end says what the request it records says. Another request signalled meanwhile
        # (say a hard one) is not recorded yet: if this write applies, that one finds the run
        # ended and is refused (409), so it must leave no trace here; if it was recorded first,
        # this write does not apply and the run ends with the recorded mode (:meth:`end`).
        self._written.clear()  # should this write not apply, the caller's record comes first
        final = events.seal(cancelled_event(request, partial_message_id=partial_message_id))
        entry = request.audit_entry(self._run.thread_id, self._run.id, outcome="cancelled")
        ended = False
        try:
            ended = await self._store.finish_run(
                self._run.id,
                status="cancelled",
                final_event=final,
                from_statuses=("running",),
                audit_entries=[entry],
                last_turn=last_turn,
                as_executor=True,
                cancel=request,
            )
        finally:
            if ended:
                self.state = CancelState.ENDED
                self._written.set()
            else:
                events.unseal(final)  # not written: its seq is still free
            self.answer_hand_over(ended)
        if ended:
            events.publish_final(final)
        return ended

    async def end(self, events: EventLog, *, partial_message_id: str | None, last_turn: TurnOutcome | None) -> bool:
        """ENDED: once DURABLE, the ``cancelled`` event and status in one conditional write.
        True if it wrote them (with ``last_turn``); False if the run is no longer this
        executor's to end (taken over, or ended)."""
        await self._written.wait()  # a cancel signalled before it was written: its record first
        # The request's record, as this process wrote it (who asked, why); read it otherwise.
        current = self._record or await self._store.get_run(self._run.id)
        if current.status == "running" and self.mode:
            # The runtime could not record the cancel it signalled (a store fault): record it here.
            current = await self._store.request_cancel(self._run.id, mode=self.mode, reason=None, actor="system")
        while current.status == "cancelling":
            event = cancelled_event(current, partial_message_id=partial_message_id)
            final = events.seal(event)
            if await self._store.finish_run(
                self._run.id,
                status="cancelled",
                final_event=final,
                from_statuses=("cancelling",),
                last_turn=last_turn,
                as_executor=True,
                if_cancel_mode=event.mode,
            ):
                self.state = CancelState.ENDED
                events.publish_final(final)
                return True
            events.unseal(final)
            # A hard request upgraded the recorded mode meanwhile: end with it. Otherwise the run
            # is no longer this process's to end (taken over, or ended).
            fresh = await self._store.get_run(self._run.id)
            if fresh.status == "cancelling" and fresh.cancel_mode != current.cancel_mode:
                current = fresh
                continue
            return False
        log.warning("run %s: cannot finish, status is %s", self._run.id, current.status)
        return False


class Cancels:
    """The runtime's side of cancelling: each request goes the one way that ends its run."""

    def __init__(self, store: Store, bus: LocalBus, executors: Mapping[str, RunExecutor]) -> None:
        self._store = store
        self._bus = bus
        #: The runtime's executors (registered before their task runs: a cancel finds them).
        self._executors = executors
        #: Runs that a cancel request of this process is finishing without an executor.
        self._finishing: set[str] = set()
        #: Resumes committing now: a cancel meanwhile leaves the run to them.
        self.resumes = ResumesUnderWay()

    def _executing(self, run_id: str) -> RunExecutor | None:
        executor = self._executors.get(run_id)
        return executor if executor is not None and not executor.parked else None

    async def cancel(self, run_id: str, *, mode: CancelMode, reason: str | None, actor: str) -> RunRecord:
        """REQUESTED: record the request and see it carried out, whoever executes the run.
        Idempotent while cancelling; a ``hard`` request upgrades an earlier ``soft`` one.
        :class:`~tether.errors.RunNotActive` once the run is terminal."""
        signalled = self._executing(run_id)
        if signalled is not None and signalled.cancel.streaming:
            # A run streaming its answer (the usual case) ends in the write that records the
            # request; if that did not apply (a request came first, a fault), record it below.
            if await signalled.cancel.hand_over(CancelRequest(mode=mode, reason=reason, actor=actor)):
                return await self._store.get_run(run_id)
        if signalled is not None and not signalled.parked:
            # One hop: the model stops generating now; the executor ends the run only once the
            # request below is durable.
            signalled.cancel.signal(mode, durable=False)
        written: RunRecord | None = None
        try:  # the request and its audit entry: one transaction
            record = written = await self._store.request_cancel(run_id, mode=mode, reason=reason, actor=actor, audited=True)
        finally:
            if signalled is not None:
                signalled.cancel.recorded(written)
        recorded = record.cancel_mode or mode  # an earlier hard request stays hard
        executor = self._executing(run_id)  # again: it may have parked meanwhile
        if executor is not None:
            executor.cancel.signal(recorded)
        elif executed_elsewhere(self._store, record):
            # Another live process executes it: tell that one (its lease keeper also re-checks the store).
            await self._store.send_control(CancelControl(run_id=run_id, mode=recorded))
        elif run_id in self.resumes:  # a resume here is committing: it deals with the cancel
            self.resumes.cancel_came(run_id, record)
        elif run_id not in self._finishing:
            # Nothing executes it here (queued, waiting for a human, or orphaned): finish it
            # directly. The conditional write makes a racing finisher harmless; a second cancel
            # request meanwhile must not write the results and steering messages a second time.
            self._finishing.add(run_id)
            try:
                await self.finish_without_executor(record)
            finally:
                self._finishing.discard(run_id)
        return await self._store.get_run(run_id)

    def recorded_elsewhere(self, run_id: str, mode: CancelMode) -> None:
        """A cancel recorded without a word to this process's executor (another process wrote it
        and said so, or the lease keeper read it): SIGNALLED and DURABLE at once."""
        executor = self._executing(run_id)
        if executor is not None:
            executor.cancel.signal_recorded(mode)

    async def resume_lost(self, run_id: str) -> None:
        """A resume's write failed: a cancel that came meanwhile was left to it, so end the run
        here unless an executor has it."""
        cancelled = self.resumes.end(run_id)
        if cancelled is not None and run_id not in self._executors:
            await self.finish_without_executor(cancelled)

    async def finish_without_executor(self, record: RunRecord) -> None:
        """ENDED with no executor: a pending interrupt's gated calls get ``cancelled`` results
        and never run. Results, tool messages, queued steering messages and the ``cancelled``
        event are those an executor would write (one copy: ``_turn``)."""
        seq = await self._store.last_seq(record.id) + 1
        before: list[StoredEvent] = []
        pending = await self._store.pending_interrupts(run_ids=[record.id])
        if pending:
            turn = TurnCalls.from_parked(pending[0].turn)
            for call in turn.settle_unrun("run cancelled while waiting for review"):
                before.append(stored_event(record.id, seq, call.result_event()))
                seq += 1
            # Steering messages queued before the pause were announced (``user_message``), so they are
            # never dropped: they join the tree after the results, where a resume puts them.
            for message in turn_messages(turn.calls, turn.steering, thread_id=record.thread_id, run_id=record.id, parent_id=turn.assistant_message_id):
                await self._store.add_message(message)
        final = stored_event(record.id, seq, cancelled_event(record))
        if await self._store.finish_run(record.id, status="cancelled", final_event=final, from_statuses=("cancelling",), events_before=before):
            self._bus.publish(record.id, [*before, final])
