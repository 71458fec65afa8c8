"""Typed run events: the one vocabulary shared by the store, SSE, clients and the UI.

Every event a run produces is one of the classes below. An event's fields are the ``data`` of
its envelope; the envelope adds ``run_id``, the run-local ``seq`` (1, 2, 3, … with no gaps),
the ``type`` and a UTC timestamp ``ts``::

    {"run_id": "run_…", "seq": 42, "type": "token", "ts": "2026-11-30T20:00:00.123456Z",
     "data": {"message_id": "msg_…", "text": "Hello"}}

``Done``, ``RunError`` and ``Cancelled`` are *terminal*: exactly one of them ends every run
and it carries the last ``seq``. The encoded envelope is what the store keeps, byte for byte,
so a replay sends exactly what the live stream sent.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from .review import ActionRequest, Decision, ReviewConfig, ToolStatus

__all__ = [
    "Event",
    "RunStarted",
    "Token",
    "Thinking",
    "ToolCall",
    "ToolResult",
    "Interrupt",
    "Resumed",
    "UserMessage",
    "Status",
    "Done",
    "FinishReason",
    "RunError",
    "Cancelled",
    "CancelMode",
    "Envelope",
    "StoredEvent",
    "DeltaEncoder",
    "EVENT_TYPES",
    "TERMINAL_TYPES",
    "format_ts",
    "now_ts",
]


class Event(BaseModel):
    """Base of all run events; ``type`` is the wire name."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    type: ClassVar[str]
    terminal: ClassVar[bool] = False


class RunStarted(Event):
    """The run began; always ``seq`` 1."""

    type: ClassVar[str] = "run_started"
    thread_id: str
    input_message_id: str | None


class Token(Event):
    """A delta of assistant text."""

    type: ClassVar[str] = "token"
    message_id: str
    text: str


class Thinking(Event):
    """A delta of the model's reasoning, where the model gives one."""

    type: ClassVar[str] = "thinking"
    message_id: str
    text: str


class ToolCall(Event):
    """The model asked for a tool call; it has not been executed yet."""

    type: ClassVar[str] = "tool_call"
    call_id: str
    name: str
    args: dict[str, Any]
    risk: Literal["read_only", "reversible", "destructive"]
    gated: bool
    #: The assistant message (model turn) that asked for the call.
    message_id: str | None = None
    #: The standing approval (allowance) under which the call runs without asking; present only then.
    allowed_by: str | None = Field(default=None, exclude_if=lambda value: value is None)


class ToolResult(Event):
    """The outcome of one tool call (exactly one per ``tool_call``)."""

    type: ClassVar[str] = "tool_result"
    call_id: str
    name: str
    status: ToolStatus
    result: Any = None
    error: str | None = None
    reason: str | None = None


class Interrupt(Event):
    """The run waits for a human decision on one or more gated tool calls."""

    type: ClassVar[str] = "interrupt"
    interrupt_id: str
    action_requests: list[ActionRequest]
    review_configs: list[ReviewConfig]
    expires_at: str


class Resumed(Event):
    """An interrupt was resolved (by decisions or by expiry) and execution continues."""

    type: ClassVar[str] = "resumed"
    interrupt_id: str
    resolution: Literal["decided", "expired"]
    #: The decisions as shown (an edit's arguments masked); ``expired`` entries for an expiry.
    decisions: list[Decision]
    #: Who decided: the principal's name, or ``system`` for an expiry.
    actor: str | None = None


class UserMessage(Event):
    """A steering message sent into the running run; it joins the history before the next model call."""

    type: ClassVar[str] = "user_message"
    message_id: str
    content: str


class Status(Event):
    """What the run is doing now (``model``, ``tool``, ``recovering``, …)."""

    type: ClassVar[str] = "status"
    stage: str
    detail: str | None = None
    #: With ``stage: "recovering"``: the partial message of the half-finished step, which
    #: clients drop (the step is done again from the last checkpoint).
    discard_message_id: str | None = None


#: Why an answer ended before the model ended it: ``length``, the output limit (``max_tokens``,
#: or a local model's context window); ``repetition``, a local model's repetition stop.
FinishReason = Literal["length", "repetition"]


class Done(Event):
    """Terminal: the run completed (a refusal is still ``done``)."""

    type: ClassVar[str] = "done"
    terminal: ClassVar[bool] = True
    message_id: str | None
    #: Tokens the run's model calls consumed: ``{"input_tokens": …, "output_tokens": …}``.
    usage: dict[str, int] | None = None
    #: Set only when the answer was cut short, not ended by the model (as the message's own
    #: ``finish_reason``): ``length`` (the output limit) or ``repetition`` (a repetition stop).
    #: Left out of the event otherwise, so an answer the model ended has the shape it always had.
    finish_reason: FinishReason | None = Field(default=None, exclude_if=lambda value: value is None)


class RunError(Event):
    """Terminal: the run failed."""

    type: ClassVar[str] = "error"
    terminal: ClassVar[bool] = True
    code: str
    message: str
    retryable: bool = False
    #: The assistant message that was streaming when the model failed (kept, status ``failed``).
    partial_message_id: str | None = None


#: How a cancel stops a run: ``soft`` lets executing tools finish, ``hard`` cancels them too
#: (both stop the model at once).
CancelMode = Literal["soft", "hard"]


class Cancelled(Event):
    """Terminal: the run was cancelled by an explicit cancel request."""

    type: ClassVar[str] = "cancelled"
    terminal: ClassVar[bool] = True
    mode: CancelMode
    reason: str | None = None
    actor: str | None = None
    partial_message_id: str | None = None


EVENT_TYPES: dict[str, type[Event]] = {
    cls.type: cls
    for cls in (
        RunStarted,
        Token,
        Thinking,
        ToolCall,
        ToolResult,
        Interrupt,
        Resumed,
        UserMessage,
        Status,
        Done,
        RunError,
        Cancelled,
    )
}
TERMINAL_TYPES = frozenset(name for name, cls in EVENT_TYPES.items() if cls.terminal)


def format_ts(moment: datetime) -> str:
    """Format a timestamp as the wire does: UTC, microseconds, ``Z``."""
    # The text of strftime("%Y-%m-%dT%H:%M:%S.%fZ") for every four-digit year, at a third of
    # the cost (this runs once per event).
    if moment.tzinfo is not UTC:
        moment = moment.astimezone(UTC)
    return moment.isoformat(timespec="microseconds")[:-6] + "Z"  # "+00:00" → "Z"


# (second since the epoch, its text up to the seconds): the part of now_ts that changes once a
# second. One tuple, so a reader never pairs one second with another's text.
_now_second: tuple[int, str] = (-1, "")


def now_ts() -> str:
    """``format_ts(utcnow())``, for the one timestamp every event gets, at a third of the cost."""
    global _now_second
    # The clock datetime.now() reads, truncated to microseconds the same way.
    second, micro = divmod(time.time_ns() // 1000, 1_000_000)
    cached, text = _now_second
    if second != cached:
        text = datetime.fromtimestamp(second, UTC).isoformat()[:-6]  # drop "+00:00"
        _now_second = (second, text)
    return f"{text}.{micro:06d}Z"


# One encoder for every envelope (json.dumps with options builds a new one per call). Event data
# is pydantic's JSON-mode output, which cannot be circular: no need to check.
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, check_circular=False)


def _dumps(value: Any) -> str:
    return _ENCODER.encode(value)


class Envelope(BaseModel):
    """One entry of a run's event log, as stored and as sent."""

    model_config = ConfigDict(frozen=True)
    run_id: str
    seq: int
    type: str
    ts: str
    data: dict[str, Any]

    @property
    def terminal(self) -> bool:
        """True for ``done``, ``error`` and ``cancelled``."""
        return self.type in TERMINAL_TYPES

    @classmethod
    def wrap(cls, run_id: str, seq: int, event: Event, ts: datetime) -> Envelope:
        """Put ``event`` into an envelope."""
        return cls(run_id=run_id, seq=seq, type=event.type, ts=format_ts(ts), data=event.model_dump(mode="json"))

    @staticmethod
    def encode(run_id: str, seq: int, event: Event, ts: str) -> str:
        """``wrap(run_id, seq, event, moment).to_json()`` where ``ts`` is ``format_ts(moment)``,
        without building the model (the hot path: the event log encodes every event it appends).
        """
        # The same text as _dumps of the envelope dict, assembled around the one non-trivial part.
        data = _dumps(event.model_dump(mode="json"))
        return f'{{"run_id":{_dumps(run_id)},"seq":{seq:d},"type":{_dumps(event.type)},"ts":{_dumps(ts)},"data":{data}}}'

    @staticmethod
    def encode_delta(run_id: str, seq: int, event_type: str, message_id: str, text: str, ts: str) -> str:
        """``encode`` of a ``Token`` or ``Thinking`` event, byte for byte, without building the
        event (a run's event log encodes its deltas with a :class:`DeltaEncoder`, the same bytes
        again with less work)."""
        return (
            f'{{"run_id":{_dumps(run_id)},"seq":{seq:d},"type":"{event_type}","ts":"{ts}","data":{{"message_id":{_dumps(message_id)},"text":{_dumps(text)}}}}}'
        )

    def to_json(self) -> str:
        """The canonical encoding: what the store keeps and SSE sends."""
        return _dumps({"run_id": self.run_id, "seq": self.seq, "type": self.type, "ts": self.ts, "data": self.data})

    @classmethod
    def from_json(cls, text: str | bytes) -> Envelope:
        """Parse the canonical encoding."""
        return cls.model_validate_json(text)

    def event(self) -> Event:
        """The typed event inside (raises ``KeyError`` for an unknown type)."""
        return EVENT_TYPES[self.type].model_validate(self.data)


class DeltaEncoder:
    """:meth:`Envelope.encode_delta` for the events of one run, byte for byte, with the JSON of
    the run's id and of the current message's id written once instead of at every delta."""

    __slots__ = ("_head", "_message_id", "_data_head")

    def __init__(self, run_id: str) -> None:
        self._head = f'{{"run_id":{_dumps(run_id)},"seq":'
        self._message_id: str | None = None
        self._data_head = ""

    def encode(self, seq: int, event_type: str, message_id: str, text: str, ts: str) -> str:
        """The envelope of a ``Token`` or ``Thinking`` event (``event_type``) of this run."""
        if message_id != self._message_id:
            self._message_id = message_id
            self._data_head = f'{{"message_id":{_dumps(message_id)},"text":'
        return f'{self._head}{seq:d},"type":"{event_type}","ts":"{ts}","data":{self._data_head}{_dumps(text)}}}}}'


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """One entry of a run's log as the store keeps it: its seq, type and canonical envelope JSON.

    The envelope text is what SSE sends byte for byte, so the log is handed around in this form
    (store → bus → stream) and never re-encoded.
    """

    seq: int
    type: str
    envelope: str
