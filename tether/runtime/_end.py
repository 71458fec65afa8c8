"""The end of a run: its terminal event and final status, committed together.

The ending half of :class:`~tether.runtime._runner.RunExecutor` (mixed into it). Whatever the
loop reached (an answer, an error, a cancel), the run ends with one transaction
(``Store.finish_run``) that writes the terminal event with the status it implies, after
everything before it is durable, and stores with it the last model turn when it was kept for
the end (a final answer, or the turn a cancel stopped). That write is conditional on the
status the run must still have, which is what makes a requested cancel always win: a run is
never recorded ``completed`` once a cancel was recorded. A cancel handed over while the run
streamed its answer is recorded by that same write (one commit from the request to the end).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from typing import TYPE_CHECKING

from ..errors import EventLogFailed
from ..events import Cancelled, Done, Event, RunError
from ..store import CancelRequest, MessageRecord, RunRecord, Store, TurnOutcome
from ._cancel import CancelMode, as_cancel_mode, cancelled_event

if TYPE_CHECKING:
    from ..models import ChatMessage
    from ._eventlog import EventLog

__all__ = ["RunEnd"]

logger = logging.getLogger("tether.runtime")


class RunEnd:
    """How :class:`~tether.runtime._runner.RunExecutor` ends a run (mixed into it)."""

    store: Store
    run: RunRecord
    cancel_mode: CancelMode | None
    accepting_messages: bool
    _steering: list[tuple[str, str]]
    _partial_message_id: str | None
    _started_turn: MessageRecord | None
    _cancelled_turn: TurnOutcome | None
    _answer_turn: TurnOutcome | None
    _cancel_durable: asyncio.Event
    _cancel_record: RunRecord | None
    _ending_cancel: tuple[CancelRequest, asyncio.Future[bool]] | None

    if TYPE_CHECKING:

        @property
        def events(self) -> EventLog: ...

        async def _take_steering(self, history: list[ChatMessage]) -> None: ...

        async def _store_turn(self, turn: TurnOutcome) -> None: ...

    def _cancelled_event(self) -> Event:
        return Cancelled(mode=self.cancel_mode or "soft", partial_message_id=self._partial_message_id)

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

    async def _finish(self, outcome: Event) -> None:
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

    def _answer_ending_cancel(self, ended: bool) -> None:
        """Give the :meth:`cancel_and_end` caller its answer: did the run end with its request?"""
        if self._ending_cancel is not None:
            (_request, answer), self._ending_cancel = self._ending_cancel, None
            if not answer.done():
                answer.set_result(ended)

    async def _commit_end(self, outcome: Event) -> None:
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
        if self._ending_cancel is not None and await self._end_with_its_cancel():
            return
        if isinstance(outcome, Done):
            status, allowed = "completed", ("running",)
        elif isinstance(outcome, RunError):
            status, allowed = "failed", ("running",)
        else:
            status, allowed = "cancelled", ("cancelling",)
        if status != "cancelled":
            final = self.events.seal(outcome)
            error = {"code": outcome.code, "message": outcome.message} if isinstance(outcome, RunError) else None
            if await self.store.finish_run(
                self.run.id, status=status, final_event=final, from_statuses=allowed, error=error, last_turn=self._answer_turn, as_executor=True
            ):
                self._answer_turn = None
                self.events.publish_final(final)
                return
            self.events.unseal(final)  # not written: its seq is still free
            # The run is no longer `running`: a cancel was committed first. It wins.
            if self._partial_message_id is None and isinstance(outcome, Done) and outcome.message_id:
                await self._flag_answer_cancelled(outcome.message_id)
        await self._cancel_durable.wait()  # a cancel signalled before it was written: its record first
        # The request's record, as this process wrote it (who asked, why); read it otherwise.
        current = self._cancel_record or await self.store.get_run(self.run.id)
        if current.status == "running" and self.cancel_mode:
            # The runtime could not record the cancel it signalled (a store fault): record it here.
            current = await self.store.request_cancel(self.run.id, mode=self.cancel_mode, reason=None, actor="system")
        while current.status == "cancelling":
            event = cancelled_event(current, mode=self.cancel_mode, partial_message_id=self._partial_message_id)
            final = self.events.seal(event)
            if await self.store.finish_run(
                self.run.id,
                status="cancelled",
                final_event=final,
                from_statuses=("cancelling",),
                last_turn=self._cancelled_turn,
                as_executor=True,
                if_cancel_mode=event.mode,
            ):
                self._cancelled_turn = None
                self.events.publish_final(final)
                return
            self.events.unseal(final)
            # A hard request upgraded the recorded mode meanwhile: end with it. Otherwise the run
            # is no longer this process's to end (taken over, or ended).
            fresh = await self.store.get_run(self.run.id)
            if fresh.status == "cancelling" and fresh.cancel_mode != current.cancel_mode:
                current = fresh
                continue
            return
        logger.warning("run %s: cannot finish, status is %s", self.run.id, current.status)

    async def _end_with_its_cancel(self) -> bool:
        """End the run ``cancelled`` in the transaction that also records the cancel request
        handed over by :meth:`cancel_and_end` (its audit entry too): one commit from the request
        to ``cancelled``. A requested cancel wins over whatever outcome the loop reached.

        False if the write did not apply (the run is no longer ``running``): then the caller
        records its request as usual, and the run's end waits for that.
        """
        assert self._ending_cancel is not None
        request = self._ending_cancel[0]
        if self._answer_turn is not None:  # a finished answer the cancel overtook
            await self._flag_answer_cancelled(self._answer_turn.message_id)
        # The end says what the request it records says. Another request signalled meanwhile
        # (say a hard one) is not recorded yet: if this write applies, that one finds the run
        # ended and is refused (409), so it must leave no trace here; if it was recorded first,
        # this write does not apply and the run ends with the recorded mode below.
        mode = as_cancel_mode(request.mode)
        self._cancel_durable.clear()  # should this write not apply, the caller's record comes first
        final = self.events.seal(Cancelled(mode=mode, reason=request.reason, actor=request.actor, partial_message_id=self._partial_message_id))
        entry = request.audit_entry(self.run.thread_id, self.run.id, outcome="cancelled")
        ended = False
        try:
            ended = await self.store.finish_run(
                self.run.id,
                status="cancelled",
                final_event=final,
                from_statuses=("running",),
                audit_entries=[entry],
                last_turn=self._cancelled_turn,
                as_executor=True,
                cancel=request,
            )
        finally:
            if ended:
                self._cancelled_turn = None
                self._cancel_durable.set()
            else:
                self.events.unseal(final)  # not written: its seq is still free
            self._answer_ending_cancel(ended)
        if ended:
            self.events.publish_final(final)
        return ended
