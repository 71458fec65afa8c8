"""A model turn's tool calls as the runtime tracks them, and the parked turn an interrupt keeps.

Each call the model asks for becomes a :class:`CallItem`: validated, maybe gated, then settled
with exactly one :data:`~tether.events.ToolStatus`. Everything that follows from a settled call
is built here, once: its ``tool_result`` event (:meth:`CallItem.result_event`) and the tool
message the model reads next (:meth:`CallItem.message`). A human's decision becomes a status in
one place too (:meth:`CallItem.apply_decision`).

When a turn waits for a human, the executor keeps nothing in memory: the turn is a
:class:`ParkedTurn` whose JSON form (:meth:`ParkedTurn.to_json`) is stored in the interrupt row
and read back by whichever process resumes, expires or cancels the run.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .._ids import new_id
from ..events import RunError, ToolCall, ToolResult
from ..models import FinishReason, ToolCallRequest
from ..review import Approve, Decision, Edit, ParkedCall, ParkedTurn, Reject, Respond, ToolStatus
from ..store import AllowanceRecord, MessageRecord
from ..tools import Risk, Tool, ToolArgsError
from ._gate import is_gated
from ._storable import storable_json, storable_text

__all__ = [
    "CallItem",
    "ModelTurn",
    "TurnCalls",
    "announce_calls",
    "announcements",
    "gate_calls",
    "json_safe",
    "masked_args",
    "model_view",
    "parse_args",
    "tool_message_content",
    "turn_messages",
]

#: What a call that is not run records, by why: a rejection, a response, or an expired window.
_NOT_RUN: dict[str, tuple[ToolStatus, str]] = {
    "reject": ("rejected", "rejected by reviewer"),
    "respond": ("responded", ""),
    "expired": ("expired", "the approval window closed; the action was not executed"),
}


def tool_message_content(status: ToolStatus, result: Any, error: str | None, reason: str | None) -> str:
    """What the model reads as a call's result: the result as JSON (``ok``), the reviewer's
    answer (``responded``), else the status with its error or reason as JSON. Also what AG-UI's
    ``TOOL_CALL_RESULT`` carries (:mod:`tether.agui`), so a streamed result and a stored one read
    the same."""
    if status == "ok":
        return json.dumps(result, ensure_ascii=False)
    if status == "responded":
        return str(result)
    detail = {k: v for k, v in (("error", error), ("reason", reason)) if v}
    return json.dumps({"status": status, **detail}, ensure_ascii=False)


def model_view(content: str) -> str:
    """A stored tool message as the model reads it: binary content (an MCP tool's image, audio or
    resource blob, in base64) described in words instead of pasted into its context. The stored
    message keeps it whole, for people (the UI shows the image)."""
    if '"mimeType"' not in content:
        return content
    try:
        value = json.loads(content)
    except ValueError:
        return content
    return json.dumps(_described(value), ensure_ascii=False)


def _described(value: Any) -> Any:
    if isinstance(value, list):
        return [_described(item) for item in value]
    if not isinstance(value, dict):
        return value
    binary = "data" if value.get("type") in ("image", "audio") else "blob" if "blob" in value and "uri" in value else None
    described = {k: _described(v) for k, v in value.items() if k != binary}
    if binary is not None and isinstance(value.get(binary), str):
        described[binary] = f"[{len(value[binary]) * 3 // 4:,} bytes of {value.get('mimeType', 'binary data')}, shown to the user, not here]"
    return described


@dataclass(slots=True)
class CallItem:
    """One tool call of a model turn, from the model's request to its one result."""

    id: str
    name: str
    #: The validated arguments (the model's raw arguments when they did not validate).
    args: Any
    #: True when it waits for a human decision.
    gated: bool = False
    #: The call's tier, computed from its validated arguments (None when they did not validate).
    risk: Risk | None = None
    #: The standing approval that lets it run without asking (then it is not gated).
    allowance: AllowanceRecord | None = None
    #: None until settled.
    status: ToolStatus | None = None
    result: Any = None
    error: str | None = None
    reason: str | None = None
    #: The human's decision once decided (an :class:`~tether.review.Edit` carries the real
    #: arguments), or None (undecided; at the end of the window, expired).
    decision: Decision | None = None
    #: True when a crash cut off an earlier execution: whether it had an effect is unknown.
    outcome_unknown: bool = False

    @property
    def settled(self) -> bool:
        """True once the call has its result."""
        return self.status is not None

    def settle(self, status: ToolStatus, *, result: Any = None, error: str | None = None, reason: str | None = None) -> None:
        """Record the call's one result."""
        self.status, self.result, self.error, self.reason = status, result, error, reason

    def apply_decision(self) -> bool:
        """Turn the recorded decision (none means expired) into a result; True if the tool
        is to run (``approve``, or ``edit`` with the edited args)."""
        decision = self.decision
        match decision:
            case Approve():
                return True
            case Edit(args=args):
                self.args = args
                return True
        reason = decision.reason if isinstance(decision, Reject) else None
        if self.outcome_unknown and not isinstance(decision, Respond):
            # Rejected or expired: not run again; whether its first run had an effect stays unknown.
            self.settle("unknown", reason=reason or "outcome unknown after a crash; not run again")
            return False
        if isinstance(decision, Respond):
            self.settle("responded", result=decision.message)
            return False
        status, default_reason = _NOT_RUN["reject" if isinstance(decision, Reject) else "expired"]
        self.settle(status, reason=reason or default_reason)
        return False

    def result_event(self) -> ToolResult:
        """The ``tool_result`` event of the settled call."""
        assert self.status is not None, "an unsettled call has no result"
        return ToolResult(call_id=self.id, name=self.name, status=self.status, result=self.result, error=self.error, reason=self.reason)

    def message(self, *, thread_id: str, run_id: str, parent_id: str | None) -> MessageRecord:
        """The tool message (what the model reads next) of the settled call."""
        assert self.status is not None, "an unsettled call has no message"
        return MessageRecord(
            id=new_id("msg"),
            thread_id=thread_id,
            parent_id=parent_id,
            run_id=run_id,
            role="tool",
            content=tool_message_content(self.status, self.result, self.error, self.reason),
            tool_call_id=self.id,
            name=self.name,
            status="cancelled" if self.status == "cancelled" else "complete",
        )

    def parked(self) -> ParkedCall:
        """The call as the interrupt row keeps it."""
        return ParkedCall(
            id=self.id,
            name=self.name,
            args=self.args,
            risk=self.risk,
            gated=self.gated,
            status=self.status,
            result=self.result,
            error=self.error,
            reason=self.reason,
            decision=self.decision,
            outcome_unknown=self.outcome_unknown,
        )

    @classmethod
    def from_parked(cls, call: ParkedCall) -> CallItem:
        """The call of a parked turn, to work on."""
        return cls(
            id=call.id,
            name=call.name,
            args=call.args,
            gated=call.gated,
            risk=call.risk,
            status=call.status,
            result=call.result,
            error=call.error,
            reason=call.reason,
            decision=call.decision,
            outcome_unknown=call.outcome_unknown,
        )


@dataclass(slots=True)
class TurnCalls:
    """A parked turn as the runtime works on it (its calls settled one by one): made from the
    :class:`~tether.review.ParkedTurn` the store read, and made back into one to store."""

    #: The assistant message that asked for the calls (the tool messages follow it).
    assistant_message_id: str | None
    calls: list[CallItem]
    #: ``(message_id, content)`` of announced steering messages not yet in the tree.
    steering: list[tuple[str, str]] = field(default_factory=list)

    @property
    def undecided(self) -> list[CallItem]:
        """The gated calls that still need a decision, in order."""
        return [c for c in self.calls if c.gated and not c.settled]

    def settle_unrun(self, reason: str) -> list[CallItem]:
        """Give every unsettled call the ``cancelled`` result; return those calls."""
        unrun = [c for c in self.calls if not c.settled]
        for call in unrun:
            call.settle("cancelled", reason=reason)
        return unrun

    def parked(self) -> ParkedTurn:
        """The turn as the interrupt row keeps it."""
        return ParkedTurn(assistant_message_id=self.assistant_message_id, calls=tuple(c.parked() for c in self.calls), steering=tuple(self.steering))

    @classmethod
    def from_parked(cls, turn: ParkedTurn) -> TurnCalls:
        """The turn the store read, to work on."""
        return cls(turn.assistant_message_id, [CallItem.from_parked(c) for c in turn.calls], list(turn.steering))


@dataclass(slots=True)
class ModelTurn:
    """What one model call produced."""

    message_id: str
    text: str
    requests: list[ToolCallRequest]
    calls: list[CallItem]
    failure: RunError | None = None
    #: An answer cut short: why (``length``, ``repetition``); None when the model ended it.
    finish_reason: FinishReason | None = None


def turn_messages(calls: list[CallItem], steering: list[tuple[str, str]], *, thread_id: str, run_id: str, parent_id: str | None) -> list[MessageRecord]:
    """What a settled turn adds to the tree, chained from ``parent_id``: one tool message per
    call in the model's order, then the steering messages that were waiting for the results."""
    records: list[MessageRecord] = []
    for call in calls:
        records.append(call.message(thread_id=thread_id, run_id=run_id, parent_id=parent_id))
        parent_id = records[-1].id
    for message_id, content in steering:
        records.append(MessageRecord(id=message_id, thread_id=thread_id, parent_id=parent_id, run_id=run_id, role="user", content=content))
        parent_id = message_id
    return records


def json_safe(value: Any) -> Any:
    """Make a value JSON-safe and storable (the event log, the store and the model need JSON)."""
    try:
        return storable_json(json.loads(json.dumps(value, default=str)))
    except (TypeError, ValueError):
        return storable_text(str(value))


def masked_args(tool: Tool | None, args: dict[str, Any] | str) -> Any:
    """The call's args as events and the stored history show them: sensitive values masked.

    Args given as JSON text are parsed first (they are what the tool will get); text that does
    not parse is shown as is, unless the tool has sensitive args: then it may hold one, unmasked.
    """
    if isinstance(args, str):
        parsed = parse_args(args)
        if not isinstance(parsed, dict):
            return "****" if tool is not None and tool.sensitive_args else args
        args = parsed
    return tool.mask(args) if tool is not None else args


def parse_args(raw: str) -> Any:
    try:
        return json.loads(raw) if raw.strip() else {}
    except ValueError:
        return raw


def gate_calls(tools: Mapping[str, Tool], threshold: str, requests: list[ToolCallRequest]) -> list[CallItem]:
    """Validate every call of a turn and decide which wait for a human: an unknown tool or
    invalid args settle the call as ``error`` (for the model to read); a valid call gets its tier
    (computed from its arguments when the tool says so) and whether the run's threshold gates it."""
    calls: list[CallItem] = []
    for request in requests:
        tool = tools.get(request.name)
        call = CallItem(request.id, request.name, request.args)
        if tool is None:
            call.settle("error", error=f"unknown tool {request.name!r}; available: {', '.join(tools) or 'none'}")
        else:
            try:
                validated = tool.validate(request.args if isinstance(request.args, dict) else parse_args(request.args))
            except ToolArgsError as exc:
                call.settle("error", error=str(exc))
            else:
                call.args = json_safe(validated)
                call.risk = tool.risk_for(validated)
                call.gated = is_gated(tool, threshold, call.risk)
        calls.append(call)
    return calls


def announcements(tools: Mapping[str, Tool], message_id: str, requests: list[ToolCallRequest], calls: list[CallItem]) -> list[ToolCall]:
    """The ``tool_call`` event announcing each call of :func:`gate_calls`, args masked."""
    events: list[ToolCall] = []
    for request, call in zip(requests, calls, strict=True):
        tool = tools.get(request.name)
        shown = masked_args(tool, request.args)
        events.append(
            ToolCall(
                call_id=request.id,
                name=request.name,
                args=json_safe(shown) if isinstance(shown, dict) else {"_raw": shown},
                risk=call.risk or (tool.risk if tool else "read_only"),
                gated=call.gated,
                message_id=message_id,
                allowed_by=call.allowance.id if call.allowance is not None else None,
            )
        )
    return events


def announce_calls(tools: Mapping[str, Tool], threshold: str, message_id: str, requests: list[ToolCallRequest]) -> tuple[list[CallItem], list[ToolCall]]:
    """:func:`gate_calls`, then :func:`announcements`: a turn's calls validated, gated, each with
    its ``tool_call`` event."""
    calls = gate_calls(tools, threshold, requests)
    return calls, announcements(tools, message_id, requests, calls)
