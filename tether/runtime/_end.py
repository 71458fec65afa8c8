"""The end of a run: its terminal event and final status, committed together.

A part of :class:`~tether.runtime._runner.RunExecutor`, over its :class:`~._segment.Segment`. Whatever the
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
from ..store import RunFailure

if TYPE_CHECKING:
    from ._segment import Segment

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
    """How a run's executor ends the run: one conditional write, a requested cancel winning."""

    def __init__(self, segment: Segment) -> None:
        self._segment = segment

    async def store_answer(self) -> None:
        """Store the answer kept for the run's end now (the run goes on after it)."""
        seg = self._segment
        if seg.answer_turn is not None:
            turn, seg.answer_turn = seg.answer_turn, None
            await seg.store_turn(turn)

    async def flag_answer_cancelled(self, message_id: str) -> None:
        """A finished answer that a cancel overtook: stored flagged ``cancelled`` (with the run's
        end when it is still kept for it), as the run's partial answer."""
        seg = self._segment
        seg.partial_message_id = message_id
        if seg.answer_turn is not None and seg.answer_turn.message_id == message_id:
            seg.cancelled_turn, seg.answer_turn = replace(seg.answer_turn, status="cancelled"), None
        else:
            await seg.store.update_message(message_id, status="cancelled")

    async def finish(self, outcome: Outcome) -> None:
        """Commit the terminal event with the final status; a requested cancel always wins."""
        seg = self._segment
        seg.accepting_messages = False
        await self._commit_end(outcome)
        for leftover in (seg.cancelled_turn, seg.answer_turn):  # the run's end was not written here
            if leftover is not None:
                await seg.store_turn(leftover)
        seg.cancelled_turn = seg.answer_turn = None
        if seg.started_turn is not None:  # the run ended before its first model call (an internal error)
            unused, seg.started_turn = seg.started_turn, None
            await seg.store.update_message(unused.id, status="failed")

    async def _commit_end(self, outcome: Outcome) -> None:
        seg = self._segment
        events = seg.events
        try:
            await events.wait_for_idle()
            if seg.steering:  # announced steering messages are never dropped: they join the tree
                await seg.take_steering([])
        except EventLogFailed:
            # The log could not commit: end the run right after what *is* stored, so followers
            # still get a terminal event and seq stays gapless.
            events.restart_at(await seg.store.last_seq(seg.run.id) + 1)
            outcome = RunError(code="event_log_failed", message="the event log could not be written", retryable=True)
            seg.answer_turn = None  # its tokens may not be stored: the store never runs ahead of the log
        if seg.cancel.handed_over and seg.answer_turn is not None:
            # A cancel handed over while the run streamed wins over whatever outcome the loop
            # reached: a finished answer it overtook is kept flagged.
            await self.flag_answer_cancelled(seg.answer_turn.message_id)
        if await seg.cancel.end_run(events, partial_message_id=seg.partial_message_id, last_turn=seg.cancelled_turn):
            seg.cancelled_turn = None
            return
        if outcome is not Stop.CANCELLED:
            status = "completed" if isinstance(outcome, Done) else "failed"
            final = events.seal(outcome)
            error = RunFailure(code=outcome.code, message=outcome.message) if isinstance(outcome, RunError) else None
            if await seg.store.finish_run(
                seg.run.id, status=status, final_event=final, from_statuses=("running",), error=error, last_turn=seg.answer_turn, as_executor=True
            ):
                seg.answer_turn = None
                events.publish_final(final)
                return
            events.unseal(final)  # not written: its seq is still free
            # The run is no longer `running`: a cancel was committed first. It wins.
            if seg.partial_message_id is None and isinstance(outcome, Done) and outcome.message_id:
                await self.flag_answer_cancelled(outcome.message_id)
        if await seg.cancel.end(events, partial_message_id=seg.partial_message_id, last_turn=seg.cancelled_turn):
            seg.cancelled_turn = None
