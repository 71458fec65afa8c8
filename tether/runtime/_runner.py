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
from datetime import timedelta
from typing import Any, Literal

import anyio

from .._ids import new_id, utcnow
from ..agent import Agent
from ..errors import LimitExceeded, RunNotActive
from ..events import Done, Interrupt, RunError, Status, UserMessage, format_ts
from ..models import ChatMessage, ModelRequest, Usage
from ..store import AuditEntry, CreatedRun, InterruptRecord, MessageRecord, RunRecord, Store, TurnOutcome, args_digest
from ..tools import Tool, ToolContext
from ._cancel import RunCancel
from ._config import RunConfig
from ._end import Outcome, RunEnd, Stop
from ._eventlog import EventLog
from ._gate import FourEyesPolicy, action_request, needs_four_eyes, review_config
from ._groupcommit import GroupCommit
from ._history import HistoryPolicy, to_chat_messages
from ._modelcall import ModelCalls
from ._recovery import CheckpointRecovery
from ._storable import describe_exception
from ._turn import CallItem, ParkedTurn, json_safe, turn_messages

__all__ = ["RunExecutor"]

logger = logging.getLogger("tether.runtime")


class RunExecutor(ModelCalls, RunEnd, CheckpointRecovery):
    """Executes one run from its current state to a terminal event or a human pause."""

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
        self.store = store
        #: The server's four-eyes policy: which parked calls need an approver other than the requester.
        self.four_eyes = four_eyes
        self.agent = agent
        self.run = run
        self.resume = resume
        #: True when continuing a run whose process died (from its last checkpoint).
        self.takeover = takeover
        self.config = RunConfig.model_validate(run.config)
        self.history_policy = agent.history or HistoryPolicy()
        #: The most steering messages waiting for the next model call (429 beyond it).
        self.max_queued_messages = max_queued_messages
        self._bus = bus
        self._events: EventLog | None = None  # created by execute()
        #: The run's cancel as this executor carries it out (:mod:`._cancel`). A run taken over
        #: while it was stopping starts signalled: the dead process was already stopping it.
        self.cancel = RunCancel(store, run, mode=run.cancel_mode if takeover and run.status == "cancelling" else None)
        self._partial_message_id: str | None = None
        self._leaf_id: str | None = run.input_message_id
        #: The first model turn's assistant message, committed with the run's start together
        #: with the turn's ``status`` event; None once that turn has begun (and in a resumed or
        #: taken-over segment). Given when the run was created running
        #: (``Store.create_run(running=True)``): then the start is written already.
        self._started_turn: MessageRecord | None = started.first_turn if started is not None else None
        #: The run as created running, if it was (its start is written already).
        self._created = started
        #: A model turn a cancel stopped, to be stored with the run's end.
        self._cancelled_turn: TurnOutcome | None = None
        #: The last model turn when it answered without calls, to be stored with the run's end
        #: (or before the next model call).
        self._answer_turn: TurnOutcome | None = None
        #: Steering messages sent into the run, announced but not yet in the history.
        self._steering: list[tuple[str, str]] = []
        #: False once the run is about to end: a steering message then gets 409 instead of being lost.
        self.accepting_messages = True
        #: True once the run is parked on an interrupt: this executor is done with it, and a
        #: resume may start the next one even before this task has finished closing.
        self.parked = False
        #: Tokens consumed by the run so far (earlier segments included), for ``done``.
        self.usage = Usage(int((run.usage or {}).get("input_tokens", 0)), int((run.usage or {}).get("output_tokens", 0)))
        self._on_usage = on_usage
        self._writer = writer

    @property
    def events(self) -> EventLog:
        """The run's event log (exists while :meth:`execute` runs)."""
        assert self._events is not None, "the event log exists once execute() has started"
        return self._events

    # -- control ---------------------------------------------------------------------------

    def steer(self, content: str) -> str:
        """Queue a steering message: announced now, in the history before the next model call."""
        if not self.accepting_messages or self.cancel.requested:
            raise RunNotActive(f"run {self.run.id!r} is finishing and takes no more messages")
        if len(self._steering) >= self.max_queued_messages:
            raise LimitExceeded(
                f"run {self.run.id!r} already has {len(self._steering)} steering messages waiting for its next model call",
                code="too_many_queued_messages",
                retry_after_s=1.0,
                details={"limit": self.max_queued_messages},
            )
        message_id = new_id("msg")
        self._steering.append((message_id, content))
        if self._events is not None:  # else announced as soon as execution starts
            self._events.emit(UserMessage(message_id=message_id, content=content))
        return message_id

    async def _take_steering(self, history: list[ChatMessage]) -> None:
        """Attach queued steering messages to the tree (after the current leaf) and the history."""
        if self._steering:
            await self.events.wait_for_idle()  # their ``user_message`` events first
        while self._steering:
            message_id, content = self._steering.pop(0)
            record = MessageRecord(message_id, self.run.thread_id, self._leaf_id, self.run.id, "user", content)
            await self.store.add_message(record)
            self._leaf_id = record.id
            history.append(ChatMessage("user", content))

    # -- the loop ----------------------------------------------------------------------------

    async def execute(self) -> None:
        """Run to a terminal state or a pause. Outside cancellation propagates, leaving the run as is."""
        # A run just created knows what it wrote; any other reads where its log stands.
        next_seq = self._created.events[-1].seq + 1 if self._created is not None else await self.store.last_seq(self.run.id) + 1
        events = EventLog(self.store, self._bus, self.run.id, next_seq=next_seq, writer=self._writer)
        events.start()
        for message_id, content in self._steering:  # steering messages that came before the log
            events.emit(UserMessage(message_id=message_id, content=content))
        self._events = events
        try:
            outcome = await self._run_segment()
            if outcome is not Stop.WAITING:
                await self._finish(outcome)
        except Exception as exc:  # an internal fault: the run fails, the server does not
            logger.exception("run %s failed", self.run.id)
            await self._finish(RunError(code="internal_error", message=describe_exception(exc)))
        finally:
            self.cancel.answer_hand_over(False)  # the run did not end here with the request
            await events.aclose()

    async def _run_segment(self) -> Outcome | Literal[Stop.WAITING]:
        """From where this segment starts (new, resumed, taken over) to an outcome, or WAITING
        when this executor has nothing (more) to finish."""
        if self.takeover:
            if (await self.store.get_run(self.run.id)).terminal:
                # Claimed just as its previous executor in this process ended it: that one was
                # gone when this one was launched, so its final write is committed. Nothing to do.
                return Stop.WAITING
            recovered = await self.recover_checkpoint()
            if isinstance(recovered, list):
                return await self._loop(recovered)
            return recovered
        if self.resume is not None:
            # A cancel recorded while the resume was committing found no executor to tell.
            current = await self.store.get_run(self.run.id)
            if current.status == "cancelling":
                self.cancel.signal(current.cancel_mode or "soft")
            return await self._loop(await self._apply_review(self.resume))
        if self._created is not None:  # created running, with its first status and turn's message
            if self._created.input.parent_id is None:  # a new conversation: its input is the whole path
                return await self._loop(self.history_policy.apply(to_chat_messages([self._created.input])))
            return await self._loop(await self.history_at(self.run.input_message_id))
        # The run starts, says it is calling the model and stores the (empty, partial) answer of
        # its first turn in one transaction: two commits less before the first token. (No
        # steering message can be waiting: a run takes them only once it is running.)
        await self.events.wait_for_idle()  # nothing queued ahead of the sealed event
        first_turn = self._new_answer()
        announce = self.events.seal(Status(stage="model", detail=None))
        if await self.store.mark_running(self.run.id, announce=announce, message=first_turn):
            self.events.publish_final(announce)
            self._started_turn = first_turn
        else:
            self.events.unseal(announce)
            current = await self.store.get_run(self.run.id)
            if current.status != "cancelling":
                return Stop.WAITING  # someone else owns it, or it is terminal: nothing to finish here
            self.cancel.signal(current.cancel_mode or "soft")
        return await self._loop(await self.history_at(self.run.input_message_id))

    async def history_at(self, leaf_id: str | None) -> list[ChatMessage]:
        """The model's history up to ``leaf_id``: only as much of the path as the agent's
        history policy can keep is read."""
        path = await self.store.path_to(self.run.thread_id, leaf_id, limit=self.history_policy.max_messages + 1)
        return self.history_policy.apply(to_chat_messages(path))

    async def _loop(self, history: list[ChatMessage]) -> Outcome | Literal[Stop.WAITING]:
        max_steps = self.config.max_steps or self.agent.max_steps
        tool_specs = self.agent.tool_specs()
        system = [ChatMessage("system", self.agent.system_prompt)] if self.agent.system_prompt else []
        for _ in range(max_steps):
            if self._started_turn is None:
                if self.cancel.requested:
                    return Stop.CANCELLED
                await self._take_steering(history)
            # else the first turn began with the run's start: it goes on (a cancel stops its
            # model call at once and stores its answer as cancelled; a steering message that came
            # meanwhile goes into the history after it, like one sent during the model call).
            history[:] = self.history_policy.apply(history)
            turn = await self._model_turn(ModelRequest(system + history, tool_specs))
            if turn.failure is not None:
                return turn.failure
            if self.cancel.requested and not turn.calls:
                if self._partial_message_id is None:
                    # The answer finished just as the cancel came: a cancelled run has no
                    # finished answer, so it is kept flagged like any partial one.
                    await self._flag_answer_cancelled(turn.message_id)
                return Stop.CANCELLED
            history.append(ChatMessage("assistant", turn.text, tuple(turn.requests)))
            # Calls that were stored always get their results, even after a cancel request
            # (then ``cancelled``, and nothing new starts): no tool call is left dangling.
            if not turn.calls:
                if self._steering:  # a steering message arrived during the last turn: one more model call
                    await self._store_answer()
                    continue
                self.accepting_messages = False
                return Done(message_id=turn.message_id, usage=self.usage.to_json())
            results = await self._handle_calls(turn.calls)
            if results is Stop.WAITING:
                return Stop.WAITING
            history.extend(results)
            if self.cancel.requested:
                return Stop.CANCELLED
        return RunError(code="max_steps_exceeded", message=f"the run made {max_steps} model calls without finishing")

    # -- tools -------------------------------------------------------------------------------

    async def _handle_calls(self, calls: list[CallItem]) -> list[ChatMessage] | Literal[Stop.WAITING]:
        """Answer the invalid calls; run the ungated ones; park on the gated ones."""
        for call in calls:
            if call.settled:  # unknown tool or invalid args
                self.events.emit(call.result_event())
        await self._execute([c for c in calls if not c.settled and not c.gated], audited=False)
        gated = [c for c in calls if not c.settled and c.gated]
        if gated and not self.cancel.requested:
            if await self._park(calls, gated):
                return Stop.WAITING
        return await self._settle(calls)

    async def _execute(self, calls: list[CallItem], *, audited: bool) -> None:
        """Run ``calls`` concurrently (each gets a status and a ``tool_result``)."""
        if not calls or self.cancel.requested:
            return  # after a cancel request nothing new starts; _settle marks them cancelled
        self.events.emit(Status(stage="tool", detail=", ".join(c.name for c in calls)))
        with self.cancel.tools_scope():
            async with anyio.create_task_group() as tg:
                for call in calls:
                    tg.start_soon(self._run_tool, call)
        if audited:
            await self.store.add_audit(
                [
                    AuditEntry(
                        "tool_executed",
                        # Executed on the word of whoever approved it.
                        (self.resume.resolved_by if self.resume else None) or "system",
                        self.run.thread_id,
                        self.run.id,
                        self.resume.id if self.resume else None,
                        c.id,
                        c.name,
                        args_digest(self.agent.tools[c.name].mask(c.args)),
                        outcome=c.status or "cancelled",
                    )
                    for c in calls
                ]
            )

    async def _run_tool(self, call: CallItem) -> None:
        tool: Tool = self.agent.tools[call.name]
        ctx = ToolContext(run_id=self.run.id, thread_id=self.run.thread_id, call_id=call.id)
        try:
            value = await tool.call(tool.validate(call.args), ctx)
        except anyio.get_cancelled_exc_class():
            call.settle("cancelled", reason="run cancelled (hard)")
            self.events.emit(call.result_event())
            raise
        except Exception as exc:
            call.settle("error", error=describe_exception(exc))
        else:
            call.settle("ok", result=json_safe(value))
        self.events.emit(call.result_event())

    async def _park(self, calls: list[CallItem], gated: list[CallItem]) -> bool:
        """Open one interrupt for the gated calls; False if a cancel came first.

        Steering messages queued so far travel with the parked turn and join the history after the
        tool results when the run resumes; from here on, new ones get 409 (the run waits).
        """
        self.accepting_messages = False
        tools = [self.agent.tools[c.name] for c in gated]
        ttl = self.config.approval_ttl_s or min(t.approval_ttl_s for t in tools)
        now = utcnow()
        expires = now + timedelta(seconds=ttl)
        interrupt_id = new_id("int")
        requests = [action_request(t, c.id, c.args, four_eyes=needs_four_eyes(t, self.four_eyes)) for t, c in zip(tools, gated, strict=True)]
        for request, call in zip(requests, gated, strict=True):
            if call.outcome_unknown:
                request["outcome_unknown"] = True
                request["description"] = "Outcome unknown — the server stopped while this ran. Run it again? " + request["description"]
        configs = [review_config(t) for t in tools]
        await self.events.wait_for_idle()
        event = self.events.seal(Interrupt(interrupt_id=interrupt_id, action_requests=requests, review_configs=configs, expires_at=format_ts(expires)))
        turn = ParkedTurn(self._leaf_id, calls, list(self._steering))
        record = InterruptRecord(
            interrupt_id,
            self.run.id,
            self.run.thread_id,
            "pending",
            requests,
            configs,
            turn.to_json(),
            None,
            None,
            now,
            expires,
            None,
        )
        if await self.store.open_interrupt(record, event):
            self.parked = True
            self.events.publish_final(event)
            self._steering = []
            return True
        self.events.unseal(event)
        return False

    async def _settle(self, calls: list[CallItem]) -> list[ChatMessage]:
        """Give every unsettled call the ``cancelled`` result, store one tool message per call
        in the model's order (once the results are durable), and return them as history."""
        for call in ParkedTurn(self._leaf_id, calls).settle_unrun("run cancelled before it ran"):
            self.events.emit(call.result_event())
        await self.events.wait_for_idle()  # results are stored only once they are announced
        history: list[ChatMessage] = []
        for record in turn_messages(calls, [], thread_id=self.run.thread_id, run_id=self.run.id, parent_id=self._leaf_id):
            await self.store.add_message(record)
            self._leaf_id = record.id
            history.append(ChatMessage("tool", record.content, (), record.tool_call_id, record.name))
        return history

    async def _apply_review(self, interrupt: InterruptRecord) -> list[ChatMessage]:
        """Carry out the decisions (or the expiry) of a resolved interrupt, then rebuild history."""
        turn = ParkedTurn.from_json(interrupt.turn)
        self._leaf_id = turn.assistant_message_id
        to_run: list[CallItem] = []
        for call in turn.undecided:
            if call.apply_decision():
                to_run.append(call)
            else:
                self.events.emit(call.result_event())
        await self._execute(to_run, audited=True)
        await self._settle(turn.calls)
        self._steering = turn.steering
        return await self.history_at(self._leaf_id)
