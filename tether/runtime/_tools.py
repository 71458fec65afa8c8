"""The tool calls of a model turn: run the ungated ones, park the gated ones, settle every one.

A part of :class:`~tether.runtime._runner.RunExecutor`, over its :class:`~._segment.Segment`.
Per model turn, arguments are validated first (invalid ones become an ``error`` result for the
model); calls below the review gate run at once, concurrently, inside the run's *tools* scope
(a ``hard`` cancel cancels it, :mod:`._cancel`); the gated ones go into one interrupt. Parking
the run (``running → waiting_human``, the interrupt row and its event) is one transaction. A
resume applies the decisions of the interrupt (:meth:`ToolCalls.apply_review`), records one
result per call in the model's order, and the run goes on.
"""

from __future__ import annotations

import contextlib
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal

import anyio

from .._ids import new_id, utcnow
from ..events import Interrupt, Status, format_ts
from ..models import ChatMessage
from ..review import Edit
from ..store import AuditEntry, InterruptRecord, args_digest
from ..tools import Tool, ToolArgsError, ToolContext
from ._allowances import permitted_args
from ._end import Stop
from ._gate import FourEyesPolicy, action_request, needs_four_eyes, review_config
from ._storable import describe_exception
from ._turn import CallItem, TurnCalls, json_safe, model_view, turn_messages

if TYPE_CHECKING:
    from ._segment import Segment

__all__ = ["ToolCalls"]


def _masked(tool: Tool | None, args: dict[str, Any]) -> dict[str, Any]:
    """``args`` as the audit may keep them (all masked when the tool, and so what is sensitive, is unknown)."""
    return tool.mask(args) if tool is not None else {k: "****" for k in args}


class ToolCalls:
    """Runs, parks and settles the tool calls of a run's model turns."""

    def __init__(self, segment: Segment, *, four_eyes: FourEyesPolicy = "off", resume: InterruptRecord | None = None) -> None:
        self._segment = segment
        #: The server's four-eyes policy: which parked calls need an approver other than the requester.
        self._four_eyes = four_eyes
        #: The interrupt this segment resumes from (its approver is who executed its calls).
        self._resume = resume

    async def handle(self, calls: list[CallItem]) -> list[ChatMessage] | Literal[Stop.WAITING]:
        """Answer the invalid calls; run the ungated ones; park on the gated ones."""
        seg = self._segment
        for call in calls:
            if call.settled:  # unknown tool or invalid args
                seg.events.emit(call.result_event())
        allowed = [c for c in calls if not c.settled and c.allowance is not None]
        if allowed:  # on the word of whoever gave the standing approval, before it runs
            await seg.store.add_audit([self._allowed(c) for c in allowed])
        await self.execute([c for c in calls if not c.settled and not c.gated], audited=False)
        gated = [c for c in calls if not c.settled and c.gated]
        if gated and not seg.cancel.requested:
            if await self.park(calls, gated):
                return Stop.WAITING
        return await self.settle(calls)

    async def execute(self, calls: list[CallItem], *, audited: bool) -> None:
        """Run ``calls`` concurrently (each gets a status and a ``tool_result``)."""
        seg = self._segment
        if not calls or seg.cancel.requested:
            return  # after a cancel request nothing new starts; settle() marks them cancelled
        seg.events.emit(Status(stage="tool", detail=", ".join(c.name for c in calls)))
        with seg.cancel.tools_scope():
            async with anyio.create_task_group() as tg:
                for call in calls:
                    tg.start_soon(self._run_tool, call)
        # Gated calls ran on the word of whoever approved them; allowed ones on that of whoever
        # gave their standing approval.
        approver = (self._resume.resolved_by if self._resume else None) or "system"
        executed = [self._executed(c, approver) for c in calls if audited or c.allowance is not None]
        if executed:
            await seg.store.add_audit(executed)

    def _executed(self, call: CallItem, approver: str) -> AuditEntry:
        """The ``tool_executed`` entry of a call that ran on a person's word (its tier, and the
        standing approval it ran under, in ``details``)."""
        seg = self._segment
        allowance = call.allowance
        details = {k: v for k, v in (("risk", call.risk), ("allowance_id", allowance.id if allowance else None)) if v}
        return AuditEntry(
            action="tool_executed",
            actor=allowance.created_by if allowance is not None else approver,
            thread_id=seg.run.thread_id,
            run_id=seg.run.id,
            interrupt_id=self._resume.id if self._resume and allowance is None else None,
            call_id=call.id,
            tool=call.name,
            args_digest=args_digest(_masked(seg.agent.tools.get(call.name), call.args)),
            outcome=call.status or "cancelled",
            details=details or None,
        )

    def _allowed(self, call: CallItem) -> AuditEntry:
        """The ``allowed`` entry of a call a standing approval lets through: its creator is the
        actor; ``details`` names the allowance."""
        seg = self._segment
        allowance = call.allowance
        assert allowance is not None
        return AuditEntry(
            action="allowed",
            actor=allowance.created_by,
            thread_id=seg.run.thread_id,
            run_id=seg.run.id,
            call_id=call.id,
            tool=call.name,
            args_digest=args_digest(_masked(seg.agent.tools.get(call.name), call.args)),
            decision="approve",
            outcome="allowed",
            details={"allowance_id": allowance.id, "scope": allowance.scope, "args": allowance.args, "risk": call.risk},
        )

    async def _run_tool(self, call: CallItem) -> None:
        seg = self._segment
        tool: Tool | None = seg.agent.tools.get(call.name)
        ctx = ToolContext(run_id=seg.run.id, thread_id=seg.run.thread_id, call_id=call.id)
        try:
            if tool is None:  # an MCP server's tool its server no longer lists
                raise LookupError(f"tool {call.name!r} is no longer available")
            value = await tool.call(tool.validate(call.args), ctx)
        except anyio.get_cancelled_exc_class():
            call.settle("cancelled", reason="run cancelled (hard)")
            seg.events.emit(call.result_event())
            raise
        except Exception as exc:
            call.settle("error", error=describe_exception(exc))
        else:
            call.settle("ok", result=json_safe(value))
        seg.events.emit(call.result_event())

    async def park(self, calls: list[CallItem], gated: list[CallItem]) -> bool:
        """Open one interrupt for the gated calls; False if a cancel came first.

        Steering messages queued so far travel with the parked turn and join the history after the
        tool results when the run resumes; from here on, new ones get 409 (the run waits).
        """
        seg = self._segment
        seg.accepting_messages = False
        tools = [seg.agent.tools[c.name] for c in gated]
        ttl = seg.config.approval_ttl_s or min(t.approval_ttl_s for t in tools)
        now = utcnow()
        expires = now + timedelta(seconds=ttl)
        interrupt_id = new_id("int")
        requests = [
            action_request(t, c.id, c.args, risk=c.risk, four_eyes=needs_four_eyes(t, self._four_eyes, c.risk), outcome_unknown=c.outcome_unknown)
            for t, c in zip(tools, gated, strict=True)
        ]
        configs = [review_config(t, permitted_args(t, self._four_eyes, c.risk or t.risk)) for t, c in zip(tools, gated, strict=True)]
        await seg.events.wait_for_idle()
        event = seg.events.seal(Interrupt(interrupt_id=interrupt_id, action_requests=requests, review_configs=configs, expires_at=format_ts(expires)))
        record = InterruptRecord(
            id=interrupt_id,
            run_id=seg.run.id,
            thread_id=seg.run.thread_id,
            status="pending",
            action_requests=requests,
            review_configs=configs,
            turn=TurnCalls(seg.leaf_id, calls, list(seg.steering)).parked(),
            decisions=None,
            resolved_by=None,
            created_at=now,
            expires_at=expires,
            resolved_at=None,
        )
        if await seg.store.open_interrupt(record, event):
            seg.parked = True
            seg.events.publish_final(event)
            seg.steering = []
            return True
        seg.events.unseal(event)
        return False

    async def settle(self, calls: list[CallItem]) -> list[ChatMessage]:
        """Give every unsettled call the ``cancelled`` result, store one tool message per call
        in the model's order (once the results are durable), and return them as history."""
        seg = self._segment
        for call in TurnCalls(seg.leaf_id, calls).settle_unrun("run cancelled before it ran"):
            seg.events.emit(call.result_event())
        await seg.events.wait_for_idle()  # results are stored only once they are announced
        history: list[ChatMessage] = []
        for record in turn_messages(calls, [], thread_id=seg.run.thread_id, run_id=seg.run.id, parent_id=seg.leaf_id):
            await seg.store.add_message(record)
            seg.leaf_id = record.id
            history.append(ChatMessage("tool", model_view(record.content), (), record.tool_call_id, record.name))
        return history

    async def apply_review(self, interrupt: InterruptRecord) -> list[ChatMessage]:
        """Carry out the decisions (or the expiry) of a resolved interrupt, then rebuild history."""
        seg = self._segment
        turn = TurnCalls.from_parked(interrupt.turn)
        seg.leaf_id = turn.assistant_message_id
        asked = {r.call_id: r.risk for r in interrupt.action_requests}
        to_run: list[CallItem] = []
        for call in turn.undecided:
            call.risk = call.risk or asked.get(call.id)  # a turn parked before calls kept their tier
            if call.apply_decision():
                tool = seg.agent.tools.get(call.name)
                if isinstance(call.decision, Edit) and tool is not None:
                    with contextlib.suppress(ToolArgsError):  # then running it reports the error
                        call.risk = tool.risk_for(tool.validate(call.args))  # the tier of what runs
                to_run.append(call)
            else:
                seg.events.emit(call.result_event())
        await self.execute(to_run, audited=True)
        await self.settle(turn.calls)
        seg.steering = turn.steering
        return await seg.history_at(seg.leaf_id)
