"""What one execution segment of a run knows, shared by the parts of its executor.

A :class:`~tether.runtime._runner.RunExecutor` is composed of parts that each own one concern
(:class:`~._modelcall.ModelCalls`, :class:`~._tools.ToolCalls`, :class:`~._end.RunEnd`,
:class:`~._recovery.CheckpointRecovery`, the run's :class:`~._cancel.RunCancel`). What they
share is this one :class:`Segment`: the run, where its tree stands, the turns kept for its end,
the steering messages waiting. Each field is declared here and nowhere else, and so are the
few operations every part needs (the history, the steering messages, storing a turn).
"""

from __future__ import annotations

from ..agent import Agent
from ..models import ChatMessage, Usage
from ..store import MessageRecord, RunRecord, Store, TurnOutcome
from ._cancel import RunCancel
from ._config import RunConfig
from ._eventlog import EventLog
from ._history import HistoryPolicy, to_chat_messages

__all__ = ["Segment"]


class Segment:
    """One execution segment of a run (new, resumed or taken over): its state and shared writes."""

    def __init__(self, store: Store, agent: Agent, run: RunRecord, cancel: RunCancel, *, started_turn: MessageRecord | None) -> None:
        self.store = store
        self.agent = agent
        self.run = run
        self.config = RunConfig.model_validate(run.config)
        self.history_policy = agent.history or HistoryPolicy()
        #: The run's cancel as this executor carries it out (:mod:`._cancel`).
        self.cancel = cancel
        self._events: EventLog | None = None  # set by the executor when it starts
        #: The current leaf of the run's branch: what the next message is a child of.
        self.leaf_id: str | None = run.input_message_id
        #: The assistant message being streamed (or the answer a cancel overtook), for the run's end.
        self.partial_message_id: str | None = None
        #: The first model turn's assistant message, committed with the run's start together
        #: with the turn's ``status`` event; None once that turn has begun (and in a resumed or
        #: taken-over segment).
        self.started_turn = started_turn
        #: A model turn a cancel stopped, to be stored with the run's end.
        self.cancelled_turn: TurnOutcome | None = None
        #: The last model turn when it answered without calls, to be stored with the run's end
        #: (or before the next model call).
        self.answer_turn: TurnOutcome | None = None
        #: Steering messages sent into the run, announced but not yet in the history.
        self.steering: list[tuple[str, str]] = []
        #: False once the run is about to end: a steering message then gets 409 instead of being lost.
        self.accepting_messages = True
        #: True once the run is parked on an interrupt: this executor is done with it, and a
        #: resume may start the next one even before this task has finished closing.
        self.parked = False
        #: Tokens consumed by the run so far (earlier segments included), for ``done``.
        self.usage = Usage(run.usage.input_tokens, run.usage.output_tokens) if run.usage is not None else Usage()

    @property
    def events(self) -> EventLog:
        """The run's event log (exists while the executor runs)."""
        assert self._events is not None, "the event log exists once execute() has started"
        return self._events

    @property
    def has_events(self) -> bool:
        """True once the event log exists."""
        return self._events is not None

    def attach(self, events: EventLog) -> None:
        """Give the segment its event log (the executor's first step)."""
        self._events = events

    async def history_at(self, leaf_id: str | None) -> list[ChatMessage]:
        """The model's history up to ``leaf_id``: only as much of the path as the agent's
        history policy can keep is read."""
        path = await self.store.path_to(self.run.thread_id, leaf_id, limit=self.history_policy.max_messages + 1)
        return self.history_policy.apply(to_chat_messages(path))

    async def take_steering(self, history: list[ChatMessage]) -> None:
        """Attach queued steering messages to the tree (after the current leaf) and the history."""
        if self.steering:
            await self.events.wait_for_idle()  # their ``user_message`` events first
        while self.steering:
            message_id, content = self.steering.pop(0)
            record = MessageRecord(id=message_id, thread_id=self.run.thread_id, parent_id=self.leaf_id, run_id=self.run.id, role="user", content=content)
            await self.store.add_message(record)
            self.leaf_id = record.id
            history.append(ChatMessage("user", content))

    async def store_turn(self, turn: TurnOutcome) -> None:
        """Store a model turn's final state, with the tokens its call consumed, once the events
        announcing it are durable.

        A crash between the two writes leaves a ``partial`` message whose announced part
        recovery reads back from the log, never a stored turn that clients were not shown.
        """
        await self.events.wait_for_idle()
        await self.store.store_turn(self.run.id, turn)
