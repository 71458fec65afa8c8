"""The step loop of one run: model call → tool calls → (human review) → results → … → done.

A :class:`RunExecutor` is created per execution segment of a run and driven by
:class:`~tether.runtime.Runtime`, which owns its task. Every event goes through the run's
:class:`~tether.runtime._eventlog.EventLog` (durable before sent). The run ends with exactly one
terminal event, written in the same transaction as the run's final status.

**The event log is the truth.** A step's outcome is stored only once the events announcing it
are durable (a turn's message after its tokens and ``tool_call`` events, tool messages after
their ``tool_result`` events), so a crash leaves the store behind the log, never ahead of it,
and recovery (:mod:`._recovery`) repairs the store toward the log.

**Human review.** Per model turn, arguments are validated first (invalid ones become an
``error`` result for the model); calls below the review gate run at once, concurrently; the
gated ones go into one interrupt. Parking the run (``running → waiting_human``, the interrupt
row and its event) is one transaction, after which the executor simply returns: a waiting run
holds no task and no memory. The parked turn (:class:`~._turn.ParkedTurn`: every call in the
model's order, real args, results already obtained) lives in the interrupt row. A resume starts
a new executor that applies the decisions, records one result per call in the model's order,
and goes on.

**Cancellation** is the run's own, kept apart from an outside ``CancelledError`` (server
shutdown): the executor's :class:`~._cancel.RunCancel` (:attr:`RunExecutor.cancel`) holds the
*model* scope (cancelled in both modes) and the *tools* scope (``hard`` only), and carries a
request from signalled to the ``cancelled`` end; the loop only asks whether one was requested.
An outside cancellation propagates untouched and leaves the run for recovery.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Literal

from .._ids import new_id
from ..agent import Agent
from ..errors import LimitExceeded, RunNotActive
from ..events import Done, RunError, Status, UserMessage
from ..models import ChatMessage, ModelRequest, Usage
from ..store import CreatedRun, InterruptRecord, RunRecord, Store
from ._allowances import AllowanceGate
from ._cancel import RunCancel
from ._end import Outcome, RunEnd, Stop
from ._eventlog import EventLog
from ._gate import FourEyesPolicy
from ._groupcommit import GroupCommit
from ._history import to_chat_messages
from ._modelcall import ModelCalls
from ._recovery import CheckpointRecovery
from ._segment import Segment
from ._storable import describe_exception
from ._tools import ToolCalls

__all__ = ["RunExecutor"]

logger = logging.getLogger("tether.runtime")


class RunExecutor:
    """Executes one run from its current state to a terminal event or a human pause.

    It holds the loop; its parts hold the rest, each over the one :class:`~._segment.Segment`
    they share: :attr:`cancel` (the run's cancel), model calls, tool calls, the run's end, and
    the recovery of a run taken over.
    """

    def __init__(
        self,
        store: Store,
        bus: Any,
        agent: Agent,
        run: RunRecord,
        *,
        resume: InterruptRecord | None = None,
        takeover: bool = False,
        four_eyes: FourEyesPolicy = "off",
        max_queued_messages: int = 100,
        on_usage: Callable[[Usage], None] | None = None,
        writer: GroupCommit | None = None,
        started: CreatedRun | None = None,
    ) -> None:
        #: The run's cancel as this executor carries it out (:mod:`._cancel`). A run taken over
        #: while it was stopping starts signalled: the dead process was already stopping it.
        self.cancel = RunCancel.for_executor(store, run, takeover=takeover)
        # Given when the run was created running (``Store.create_run(running=True)``): then its
        # start, with its first turn's message, is written already.
        self._segment = seg = Segment(store, agent, run, self.cancel, started_turn=started.first_turn if started is not None else None)
        self._model = ModelCalls(seg, on_usage, allowances=AllowanceGate(seg, four_eyes))
        self._tools = ToolCalls(seg, four_eyes=four_eyes, resume=resume)
        self._end = RunEnd(seg)
        self._recovery = CheckpointRecovery(seg, self._tools)
        self.run = run
        self._resume = resume
        #: True when continuing a run whose process died (from its last checkpoint).
        self._takeover = takeover
        #: The run as created running, if it was (its start is written already).
        self._created = started
        #: The most steering messages waiting for the next model call (429 beyond it).
        self._max_queued_messages = max_queued_messages
        self._bus = bus
        self._writer = writer

    @property
    def events(self) -> EventLog:
        """The run's event log (exists while :meth:`execute` runs)."""
        return self._segment.events

    @property
    def parked(self) -> bool:
        """True once the run is parked on an interrupt: this executor is done with it, and a
        resume may start the next one even before this task has finished closing."""
        return self._segment.parked

    # -- control ---------------------------------------------------------------------------

    def steer(self, content: str) -> str:
        """Queue a steering message: announced now, in the history before the next model call."""
        seg = self._segment
        if not seg.accepting_messages or self.cancel.requested:
            raise RunNotActive(f"run {self.run.id!r} is finishing and takes no more messages")
        if len(seg.steering) >= self._max_queued_messages:
            raise LimitExceeded(
                f"run {self.run.id!r} already has {len(seg.steering)} steering messages waiting for its next model call",
                code="too_many_queued_messages",
                retry_after_s=1.0,
                details={"limit": self._max_queued_messages},
            )
        message_id = new_id("msg")
        seg.steering.append((message_id, content))
        if seg.has_events:  # else announced as soon as execution starts
            seg.events.emit(UserMessage(message_id=message_id, content=content))
        return message_id

    # -- the loop ----------------------------------------------------------------------------

    async def execute(self) -> None:
        """Run to a terminal state or a pause. Outside cancellation propagates, leaving the run as is."""
        seg = self._segment
        # A run just created knows what it wrote; any other reads where its log stands.
        next_seq = self._created.events[-1].seq + 1 if self._created is not None else await seg.store.last_seq(self.run.id) + 1
        events = EventLog(seg.store, self._bus, self.run.id, next_seq=next_seq, writer=self._writer)
        events.start()
        for message_id, content in seg.steering:  # steering messages that came before the log
            events.emit(UserMessage(message_id=message_id, content=content))
        seg.attach(events)
        try:
            outcome = await self._run_segment()
            if outcome is not Stop.WAITING:
                await self._end.finish(outcome)
        except Exception as exc:  # an internal fault: the run fails, the server does not
            logger.exception("run %s failed", self.run.id)
            await self._end.finish(RunError(code="internal_error", message=describe_exception(exc)))
        finally:
            self.cancel.answer_hand_over(False)  # the run did not end here with the request
            await events.aclose()

    async def _run_segment(self) -> Outcome | Literal[Stop.WAITING]:
        """From where this segment starts (new, resumed, taken over) to an outcome, or WAITING
        when this executor has nothing (more) to finish."""
        seg = self._segment
        if self._takeover:
            if (await seg.store.get_run(self.run.id)).terminal:
                # Claimed just as its previous executor in this process ended it: that one was
                # gone when this one was launched, so its final write is committed. Nothing to do.
                return Stop.WAITING
            recovered = await self._recovery.recover()
            if isinstance(recovered, list):
                return await self._loop(recovered)
            return recovered
        if self._resume is not None:
            # A cancel recorded while the resume was committing found no executor to tell.
            self.cancel.adopt(await seg.store.get_run(self.run.id))
            return await self._loop(await self._tools.apply_review(self._resume))
        if self._created is not None:  # created running, with its first status and turn's message
            if self._created.input.parent_id is None:  # a new conversation: its input is the whole path
                return await self._loop(seg.history_policy.apply(to_chat_messages([self._created.input])))
            return await self._loop(await seg.history_at(self.run.input_message_id))
        # The run starts, says it is calling the model and stores the (empty, partial) answer of
        # its first turn in one transaction: two commits less before the first token. (No
        # steering message can be waiting: a run takes them only once it is running.)
        await seg.events.wait_for_idle()  # nothing queued ahead of the sealed event
        first_turn = self._model.new_answer()
        announce = seg.events.seal(Status(stage="model", detail=None))
        if await seg.store.mark_running(self.run.id, announce=announce, message=first_turn):
            seg.events.publish_final(announce)
            seg.started_turn = first_turn
        else:
            seg.events.unseal(announce)
            if not self.cancel.adopt(await seg.store.get_run(self.run.id)):
                return Stop.WAITING  # someone else owns it, or it is terminal: nothing to finish here
        return await self._loop(await seg.history_at(self.run.input_message_id))

    async def _loop(self, history: list[ChatMessage]) -> Outcome | Literal[Stop.WAITING]:
        seg = self._segment
        agent = seg.agent
        max_steps = seg.config.max_steps or agent.max_steps
        tool_specs = agent.tool_specs()
        system = [ChatMessage("system", agent.system_prompt)] if agent.system_prompt else []
        for _ in range(max_steps):
            if seg.started_turn is None:
                if self.cancel.requested:
                    return Stop.CANCELLED
                await seg.take_steering(history)
            # else the first turn began with the run's start: it goes on (a cancel stops its
            # model call at once and stores its answer as cancelled; a steering message that came
            # meanwhile goes into the history after it, like one sent during the model call).
            history[:] = seg.history_policy.apply(history)
            turn = await self._model.turn(ModelRequest(system + history, tool_specs))
            if turn.failure is not None:
                return turn.failure
            if self.cancel.requested and not turn.calls:
                if seg.partial_message_id is None:
                    # The answer finished just as the cancel came: a cancelled run has no
                    # finished answer, so it is kept flagged like any partial one.
                    await self._end.flag_answer_cancelled(turn.message_id)
                return Stop.CANCELLED
            history.append(ChatMessage("assistant", turn.text, tuple(turn.requests)))
            # Calls that were stored always get their results, even after a cancel request
            # (then ``cancelled``, and nothing new starts): no tool call is left dangling.
            if not turn.calls:
                if seg.steering:  # a steering message arrived during the last turn: one more model call
                    await self._end.store_answer()
                    continue
                seg.accepting_messages = False
                return Done(message_id=turn.message_id, usage=seg.usage.to_json(), finish_reason=turn.finish_reason)
            results = await self._tools.handle(turn.calls)
            if results is Stop.WAITING:
                return Stop.WAITING
            history.extend(results)
            if self.cancel.requested:
                return Stop.CANCELLED
        return RunError(code="max_steps_exceeded", message=f"the run made {max_steps} model calls without finishing")
