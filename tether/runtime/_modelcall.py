"""One model call of a run: stream its deltas as events, then store the turn behind them.

A part of :class:`~tether.runtime._runner.RunExecutor`, over its :class:`~._segment.Segment`. Model output is
made storable here (:mod:`._storable`), before anything sees it; provider faults are retried
before the first delta only (:mod:`tether.models._retry`); the tokens each call consumed are
recorded on the run, a cancelled or failed call's too. An output that is neither an answer nor a
call is asked for once more, then fails the run with ``model_output_invalid``
(:mod:`tether.models._output`); a tool call being generated is announced with a ``status``; an
answer cut short (:class:`~tether.models.AnswerCut`) is stored with its ``finish_reason``. The
turn's message is stored as ``complete`` only once the events announcing it are durable (the
event log is the truth).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import aclosing
from typing import TYPE_CHECKING

from .._ids import new_id
from ..errors import ModelError
from ..events import RunError, Status
from ..models import AnswerCut, FinishReason, ModelRequest, TextDelta, ThinkingDelta, ToolCallRequest, ToolCallStart, Usage
from ..models._output import ATTEMPTS, stream_checked
from ..store import MessageRecord, StoredCall, TurnOutcome
from ._storable import describe_exception, storable_request, storable_text
from ._turn import ModelTurn, announcements, gate_calls, json_safe, masked_args

if TYPE_CHECKING:
    from ._allowances import AllowanceGate
    from ._segment import Segment

__all__ = ["ModelCalls"]

logger = logging.getLogger("tether.runtime")


class ModelCalls:
    """Model turns of a run's executor: streamed, announced, stored behind their events."""

    def __init__(self, segment: Segment, on_usage: Callable[[Usage], None] | None = None, *, allowances: AllowanceGate | None = None) -> None:
        self._segment = segment
        self._on_usage = on_usage
        #: The gate's check of standing approvals (none: every gated call waits for a human).
        self._allowances = allowances

    async def turn(self, request: ModelRequest) -> ModelTurn:
        """One model call: stream deltas as events, announce the calls, store the assistant message.

        The message's final state is stored only once every event announcing it (its tokens and
        its ``tool_call`` events) is durable, so a crash can never leave a stored turn ahead of
        what clients were shown (see :meth:`_store_turn`).
        """
        seg = self._segment
        message, seg.started_turn = seg.started_turn, None
        if message is None:
            message = self.new_answer()
            await seg.store.add_message(message)
            seg.events.emit(Status(stage="model", detail=None))
        # else the message and its status event were committed with the run's start
        seg.leaf_id = message.id
        seg.partial_message_id = message.id
        parts: list[str] = []
        requests: list[ToolCallRequest] = []
        cut: FinishReason | None = None  # the answer was cut short (the model said so, last)
        failure: RunError | None = None
        emit_delta = seg.events.emit_delta  # once, not at every delta
        with seg.cancel.model_scope() as scope:
            try:
                checked = stream_checked(seg.agent.model, request, seg.agent.retry, on_retry=self._announce_retry, on_invalid=self._announce_invalid)
                async with aclosing(checked) as stream:
                    async for delta in stream:
                        # Model output is made storable here, before anything sees it.
                        if isinstance(delta, TextDelta):
                            if delta.text:
                                text = storable_text(delta.text)
                                parts.append(text)
                                emit_delta("token", message.id, text)
                        elif isinstance(delta, ThinkingDelta):
                            if delta.text:
                                emit_delta("thinking", message.id, storable_text(delta.text))
                        elif isinstance(delta, ToolCallRequest):
                            requests.append(storable_request(delta))
                        elif isinstance(delta, ToolCallStart):
                            seg.events.emit(Status(stage="model", detail=storable_text(delta.detail)))
                        elif isinstance(delta, AnswerCut):
                            cut = delta.reason
            except ModelError as exc:
                partial = message.id if parts else None
                failure = RunError(code=exc.code, message=storable_text(exc.message), retryable=exc.retryable, partial_message_id=partial)
            except Exception as exc:
                logger.warning("model call of run %s failed: %r", seg.run.id, exc)
                failure = RunError(code="model_error", message=describe_exception(exc), retryable=True, partial_message_id=message.id if parts else None)
        self._count_usage(request.usage)
        text = "".join(parts)
        if scope.cancel_called and failure is None:
            # A cancel stopped it: the run ends next, and this turn is stored with its end
            # (``finish_run(last_turn=…)``): one commit less between the cancel and ``cancelled``.
            seg.cancelled_turn = self._outcome(message.id, request.usage, content=text, status="cancelled")
            return ModelTurn(message.id, text, [], [])
        if failure is not None:
            await seg.store_turn(self._outcome(message.id, request.usage, content=text, status="failed"))
            return ModelTurn(message.id, text, [], [], failure)
        calls = gate_calls(seg.agent.tools, seg.config.approval_threshold, requests)
        if self._allowances is not None:
            await self._allowances.cover(calls)  # standing approvals, read from the store now
        for announcement in announcements(seg.agent.tools, message.id, requests, calls):
            seg.events.emit(announcement)
        stored_calls = tuple(StoredCall(id=r.id, name=r.name, args=json_safe(masked_args(seg.agent.tools.get(r.name), r.args))) for r in requests)
        # An answer cut short is still the answer (what the user read), marked as cut; a turn with
        # calls is no cut answer (a call cut short never arrives: ``model_output_invalid``).
        finish_reason = None if requests else cut
        outcome = self._outcome(message.id, request.usage, content=text, status="complete", tool_calls=stored_calls or None, finish_reason=finish_reason)
        if requests:
            await seg.store_turn(outcome)
        else:
            # An answer without calls usually ends the run: it is stored in the transaction that
            # ends it (``finish_run(last_turn=…)``), one commit less; or before the next model
            # call, should a steering message have come meanwhile.
            seg.answer_turn = outcome
        seg.partial_message_id = None
        return ModelTurn(message.id, text, requests, calls, finish_reason=finish_reason)

    def new_answer(self) -> MessageRecord:
        """The (empty, partial) assistant message of the next model turn, child of the leaf."""
        seg = self._segment
        return MessageRecord(
            id=new_id("msg"), thread_id=seg.run.thread_id, parent_id=seg.leaf_id, run_id=seg.run.id, role="assistant", content="", status="partial"
        )

    def _announce_retry(self, attempt: int, delay: float, error: ModelError) -> None:
        seg = self._segment
        detail = f"retrying in {delay:.1f} s after {error.code} (attempt {attempt + 1} of {seg.agent.retry.attempts})"
        logger.info("run %s: model call failed (%s), %s", seg.run.id, error.message, detail)
        seg.events.emit(Status(stage="model", detail=detail))

    def _announce_invalid(self, error: ModelError) -> None:
        seg = self._segment
        detail = f"asking the model again (attempt 2 of {ATTEMPTS}): its reply was {error.message}"
        logger.info("run %s: %s", seg.run.id, detail)
        seg.events.emit(Status(stage="model", detail=storable_text(detail)))

    def _count_usage(self, usage: Usage) -> None:
        """Count one model call's tokens (also a cancelled or failed call's) for ``done`` and
        ``/metrics``; they are stored with the turn."""
        self._segment.usage.add(usage)
        if self._on_usage is not None:
            self._on_usage(usage)

    @staticmethod
    def _outcome(
        message_id: str, usage: Usage, *, content: str, status: str, tool_calls: tuple[StoredCall, ...] | None = None, finish_reason: FinishReason | None = None
    ) -> TurnOutcome:
        return TurnOutcome(
            message_id=message_id,
            content=content,
            status=status,
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            tool_calls=tool_calls,
            finish_reason=finish_reason,
        )
