"""Taking over a run whose process died, from its last checkpoint.

**The event log is the truth; nothing that clients have not been able to see is ever treated as
done.** The executor stores a step's outcome only after the events announcing it are durable,
so a crash leaves the store *behind* the log, never ahead of it; recovery repairs the store
toward the log. Checkpoints are the step boundaries both agree on: complete messages whose text
equals their logged tokens and whose tool calls were all announced, and logged tool results.

- A tool message of the run whose ``tool_result`` was never logged is cut off the path; its call
  counts as unanswered.
- The last model turn, when the store is not sure it ended (``partial``, ``failed``, or
  ``complete`` but ahead of the log): if its ``tool_call`` events were logged, its stream had
  ended (they are emitted after it, all at once), so it is rebuilt from the log as ``complete``.
  Otherwise it is half-finished: kept as a ``failed`` sibling off the active path and announced
  with a ``status: recovering`` event naming it, so clients discard its tokens; in a cancelling
  run it stays, flagged ``cancelled``.
- A final answer stored and announced, with only its ``done`` lost, is not asked for again.
- Unanswered calls of the last turn: read-only ones run again; a gated one never put to a human
  never ran, so it goes to one as usual; any other one may have had its effect, so it is never
  re-run on its own: it goes back to a human as a new interrupt marked ``outcome_unknown``.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Literal

from ..events import Done, Status, ToolCall, ToolResult
from ..models import ChatMessage
from ..review import Approve, Edit, Expired, Reject, Respond
from ..store import MessageRecord, Store, StoredCall
from ..tools import Risk
from ._end import Stop
from ._turn import CallItem

if TYPE_CHECKING:
    from ._segment import Segment
    from ._tools import ToolCalls

__all__ = ["CheckpointRecovery", "LoggedRun"]


class LoggedRun:
    """What a run's event log announced: the ground truth that recovery repairs the store to."""

    def __init__(self) -> None:
        #: Token texts per assistant message.
        self.tokens: dict[str, list[str]] = {}
        #: ``tool_call`` events per assistant message (in order) and per call id.
        self.calls: dict[str, list[ToolCall]] = {}
        self.announced: dict[str, ToolCall] = {}
        #: ``tool_result`` events per call id.
        self.results: dict[str, ToolResult] = {}

    @classmethod
    async def read(cls, store: Store, run_id: str) -> LoggedRun:
        """Read a run's whole log."""
        logged = cls()
        after = 0
        while page := await store.read_events(run_id, after_seq=after, limit=5000):
            after = page[-1].seq
            for stored in page:
                if stored.type not in ("token", "tool_call", "tool_result"):
                    continue
                data = json.loads(stored.envelope)["data"]
                if stored.type == "token":
                    logged.tokens.setdefault(data["message_id"], []).append(data["text"])
                elif stored.type == "tool_call":
                    call = ToolCall.model_validate(data)
                    logged.announced[call.call_id] = call
                    if call.message_id:
                        logged.calls.setdefault(call.message_id, []).append(call)
                else:
                    result = ToolResult.model_validate(data)
                    logged.results[result.call_id] = result
        return logged

    def text_of(self, message_id: str) -> str:
        """The text announced for a message."""
        return "".join(self.tokens.get(message_id, ()))

    def agrees_with(self, message: MessageRecord) -> bool:
        """True if a stored turn ended and everything in it was announced."""
        return (
            message.status in ("complete", "cancelled")
            and message.content == self.text_of(message.id)
            and all(c.id in self.announced for c in message.tool_calls or ())
        )


class CheckpointRecovery:
    """Takes a run over from its last checkpoint (for a run's executor whose process died)."""

    def __init__(self, segment: Segment, tools: ToolCalls) -> None:
        self._segment = segment
        self._tools = tools

    async def recover(self) -> list[ChatMessage] | Done | Literal[Stop.WAITING]:
        """Repair the store toward the log; return the history to go on with, the outcome
        (``done`` of an answer that only lacked it), or WAITING when a call went to review."""
        seg = self._segment
        logged = await LoggedRun.read(seg.store, seg.run.id)
        thread = await seg.store.get_thread(seg.run.thread_id)
        path = await seg.store.path_to(seg.run.thread_id, thread.active_leaf_id)
        cut = next((i for i, m in enumerate(path) if m.run_id == seg.run.id and m.role == "tool" and m.tool_call_id not in logged.results), None)
        if cut is not None:
            path = path[:cut]
            await seg.store.move_active_leaf(seg.run.thread_id, path[-1].id if path else None)
        discarded = await self._repair_last_turn(path, logged)
        seg.events.emit(Status(stage="recovering", detail="continuing from the last checkpoint after the server stopped", discard_message_id=discarded))
        seg.leaf_id = path[-1].id if path else None
        path = await seg.store.path_to(seg.run.thread_id, seg.leaf_id)
        last = path[-1] if path else None
        if last is not None and last.role == "assistant" and last.run_id == seg.run.id and last.status == "complete" and not last.tool_calls:
            seg.accepting_messages = False
            return Done(message_id=last.id, usage=seg.usage.to_json(), finish_reason=last.finish_reason)
        turn = next(
            (i for i in range(len(path) - 1, -1, -1) if path[i].role == "assistant" and path[i].tool_calls and path[i].run_id == seg.run.id),
            None,
        )
        if turn is not None:
            answered = {m.tool_call_id for m in path[turn + 1 :] if m.role == "tool"}
            missing = [c for c in path[turn].tool_calls or () if c.id not in answered]
            if missing and await self._recover_calls(missing, logged):
                return Stop.WAITING
        return await seg.history_at(seg.leaf_id)

    async def _repair_last_turn(self, path: list[MessageRecord], logged: LoggedRun) -> str | None:
        """Make the last model turn on ``path`` agree with the log (``path`` is updated in
        place); return the id of a half-finished message taken off the path, if any."""
        seg = self._segment
        last = path[-1] if path else None
        if last is None or last.role != "assistant" or last.run_id != seg.run.id or logged.agrees_with(last):
            return None
        text = logged.text_of(last.id)
        announced = logged.calls.get(last.id)
        if announced:  # its stream had ended and its calls were announced: complete per the log
            calls = tuple(StoredCall(id=c.call_id, name=c.name, args=c.args) for c in announced)
            await seg.store.update_message(last.id, content=text, status="complete", tool_calls=calls)
            return None
        if seg.cancel.requested:  # the run ends here: its partial answer stays, flagged
            await seg.store.update_message(last.id, content=text, status="cancelled")
            seg.partial_message_id = last.id
            return None
        path.pop()
        await seg.store.update_message(last.id, content=text, status="failed")
        await seg.store.move_active_leaf(seg.run.thread_id, path[-1].id if path else None)
        return last.id

    async def _recover_calls(self, missing: list[StoredCall], logged: LoggedRun) -> bool:
        """Settle the calls a dead process left without a stored result; True if parked."""
        seg = self._segment
        latest = await seg.store.latest_interrupt(seg.run.id)
        known = {c.id: CallItem.from_parked(c) for c in (latest.turn.calls if latest is not None else ())}
        calls: list[CallItem] = []
        to_run: list[CallItem] = []
        to_review: list[CallItem] = []
        for missed in missing:
            tool = seg.agent.tools.get(missed.name)
            real = known.get(missed.id)
            call = CallItem(missed.id, missed.name, real.args if real else missed.args, decision=real.decision if real else None)
            call.risk = (real.risk if real else None) or announced_tier(logged.announced.get(call.id))
            calls.append(call)
            args_known = real is not None or (tool is not None and not tool.sensitive_args)
            announced = logged.announced.get(call.id)
            if call.id in logged.results:  # finished and announced before the crash
                done = logged.results[call.id]
                call.settle(done.status, result=done.result, error=done.error, reason=done.reason)
                continue
            may_have_run = isinstance(call.decision, Approve | Edit) or announced is None or not announced.gated
            if tool is None and announced is not None and announced.risk != "read_only" and may_have_run:
                # Its tool is gone now (an MCP server not up again after the restart), and it may
                # have run: its outcome is unknown, and it is never run again on its own.
                call.settle("unknown", reason=f"the server stopped while this ran, and {call.name!r} is not available now; its outcome is unknown")
            elif tool is None:
                call.settle("error", error=f"unknown tool {call.name!r}")
            elif isinstance(call.decision, Reject | Respond | Expired):
                call.apply_decision()  # decided, never run
            elif ((call.risk if tool.risk_per_call else None) or tool.risk) == "read_only" and args_known:
                to_run.append(call)
                continue
            elif args_known:
                call.gated = True
                # Gated and never put to a human: it never ran, so it goes to review as usual.
                call.outcome_unknown = not (real is None and announced is not None and announced.gated)
                to_review.append(call)
                continue
            else:  # its real arguments were never stored (sensitive, ungated): cannot be re-run
                call.settle("unknown", reason="the server stopped while this ran; its outcome is unknown")
            seg.events.emit(call.result_event())
        await self._tools.execute(to_run, audited=False)
        if to_review and not seg.cancel.requested and await self._tools.park(calls, to_review):
            return True
        await self._tools.settle(calls)
        return False


def announced_tier(announced: ToolCall | None) -> Risk | None:
    """The tier a call's ``tool_call`` event gave it (computed then from its arguments)."""
    return announced.risk if announced is not None else None
