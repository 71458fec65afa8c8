"""The end of a run: its terminal event and final status, committed together.

The ending half of :class:`~tether.runtime._runner.RunExecutor` (mixed into it). Whatever the
loop reached (an answer, an error, a cancel), the run ends with one transaction
(``Store.finish_run``) that writes the terminal event with the status it implies, after
everything before it is durable, and stores with it the last model turn when it was kept for
the end (a final answer, or the turn a cancel stopped). That write is conditional on the
status the run must still have, which is what makes a requested cancel always win: a run is
never recorded ``completed`` once a cancel was recorded. The ``cancelled`` end itself (and a
cancel handed over while the run streamed its answer, recorded by that same write) is
:class:`~._cancel.RunCancel`'s.
"""

from __future__ import annotations

import enum
from dataclasses import replace
from typing import TYPE_CHECKING, Literal

from ..errors import EventLogFailed
from ..events import Done, RunError
from ..store import MessageRecord, RunRecord, Store, TurnOutcome
from ._cancel import RunCancel

if TYPE_CHECKING:
    from ..models import ChatMessage
    from ._eventlog import EventLog

__all__ = ["RunEnd", "Stop", "Outcome"]


class Stop(enum.Enum):
    """How a segment of a run stops without an outcome of its own."""

    #: Parked on an interrupt, or not this executor's run to end: no terminal event here.
    WAITING = "waiting"
    #: Stopped for a requested cancel: the run ends ``cancelled``, as its request on record says.
    CANCELLED = "cancelled"


#: What a run's loop reaches: the outcome its end writes.
Outcome = Done | RunError | Literal[Stop.CANCELLED]


class RunEnd:
    """How :class:`~tether.runtime._runner.RunExecutor` ends a run (mixed into it)."""

    store: Store
    run: RunRecord
    cancel: RunCancel
    accepting_messages: bool
    _steering: list[tuple[str, str]]
    _partial_message_id: str | None
    _started_turn: MessageRecord | None
    _cancelled_turn: TurnOutcome | None
    _answer_turn: TurnOutcome | None

    if TYPE_CHECKING:

        @property
        def events(self) -> EventLog: ...

        async def _take_steering(self, history: list[ChatMessage]) -> None: ...

        async def _store_turn(self, turn: TurnOutcome) -> None: ...

    async def _store_answer(self) -> None:
        """Store the answer kept for the run's end now (the run goes on after it)."""
        if self._answer_turn is not None:
            turn, self._answer_turn = self._answer_turn, None
            await self._store_turn(turn)

    async def _flag_answer_cancelled(self, message_id: str) -> None:
        """A finished answer that a cancel overtook: stored flagged ``cancelled`` (with the run's
        end when it is still kept for it), as the run's partial answer."""
        self._partial_message_id = message_id
        if self._answer_turn is not None and self._answer_turn.message_id == message_id:
            self._cancelled_turn, self._answer_turn = replace(self._answer_turn, status="cancelled"), None
        else:
            await self.store.update_message(message_id, status="cancelled")

    async def _finish(self, outcome: Outcome) -> None:
        """Commit the terminal event with the final status; a requested cancel always wins."""
        self.accepting_messages = False
        await self._commit_end(outcome)
        for leftover in (self._cancelled_turn, self._answer_turn):  # the run's end was not written here
            if leftover is not None:
                await self._store_turn(leftover)
        self._cancelled_turn = self._answer_turn = None
        if self._started_turn is not None:  # the run ended before its first model call (an internal error)
            unused, self._started_turn = self._started_turn, None
            await self.store.update_message(unused.id, status="failed")

    async def _commit_end(self, outcome: Outcome) -> None:
        try:
            await self.events.wait_for_idle()
            if self._steering:  # announced steering messages are never dropped: they join the tree
                await self._take_steering([])
        except EventLogFailed:
            # The log could not commit: end the run right after what *is* stored, so followers
            # still get a terminal event and seq stays gapless.
            self.events.restart_at(await self.store.last_seq(self.run.id) + 1)
            outcome = RunError(code="event_log_failed", message="the event log could not be written", retryable=True)
            self._answer_turn = None  # its tokens may not be stored: the store never runs ahead of the log
        if self.cancel.handed_over:
            # A cancel handed over while the run streamed: recorded by the run's end, whatever
            # outcome the loop reached (a requested cancel wins).
            if self._answer_turn is not None:  # a finished answer the cancel overtook
                await self._flag_answer_cancelled(self._answer_turn.message_id)
            if await self.cancel.end_handed_over(self.events, partial_message_id=self._partial_message_id, last_turn=self._cancelled_turn):
                self._cancelled_turn = None
                return
        if outcome is not Stop.CANCELLED:
            status = "completed" if isinstance(outcome, Done) else "failed"
            final = self.events.seal(outcome)
            error = {"code": outcome.code, "message": outcome.message} if isinstance(outcome, RunError) else None
            if await self.store.finish_run(
                self.run.id, status=status, final_event=final, from_statuses=("running",), error=error, last_turn=self._answer_turn, as_executor=True
            ):
                self._answer_turn = None
                self.events.publish_final(final)
                return
            self.events.unseal(final)  # not written: its seq is still free
            # The run is no longer `running`: a cancel was committed first. It wins.
            if self._partial_message_id is None and isinstance(outcome, Done) and outcome.message_id:
                await self._flag_answer_cancelled(outcome.message_id)
        if await self.cancel.end(self.events, partial_message_id=self._partial_message_id, last_turn=self._cancelled_turn):
            self._cancelled_turn = None
