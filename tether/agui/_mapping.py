"""Tether's events as AG-UI 1.0 events: one pure mapping, no web framework.

**Segments.** A Tether run is one log from ``run_started`` to its terminal event, through any
number of human pauses. An AG-UI run ends at a pause (``RUN_FINISHED`` with an ``interrupt``
outcome) and the answer starts a new AG-UI run. So one Tether run is a sequence of AG-UI runs,
*segments*: the first opens at ``run_started``, each later one at the first event after a
pause (normally ``resumed``). Every segment opens with ``RUN_STARTED`` and ends with exactly one
``RUN_FINISHED`` or ``RUN_ERROR``; every ``*_START`` is closed before that, and nothing follows
it but the next segment's ``RUN_STARTED``.

**Frames and their ids.** One Tether event becomes zero or more AG-UI events (a ``tool_call`` is
``TOOL_CALL_START``, ``TOOL_CALL_ARGS``, ``TOOL_CALL_END``; the first token of a message also
opens it). Each goes out as one SSE frame whose ``id`` is the event's ``seq`` — the last frame of
the event carries ``<seq>``, the ones before it ``<seq>.<k>`` (k = 1, 2, …). A client resuming
with ``Last-Event-ID: 42`` has every frame of seq 42; with ``42.2`` the first two frames of it,
and gets the rest: a connection cut between the frames of one event loses and repeats nothing.
The same id, with ``seq`` and Tether's run id, is in every event's ``metadata.tether``
(AG-UI's client reads no SSE ids and keeps ``metadata``).

**State is what the frames opened.** :class:`EventMapper` computes an event's frames from what
is open (a text message, a reasoning message, tool calls, the segment) and :meth:`apply` moves
that state frame by frame. Reconnecting in the middle of an event therefore has the exact state
after the frames the client has, and :meth:`EventMapper.reopen` gives the ``RUN_STARTED`` and
``*_START`` events to send again first, so that a client checking the order of events accepts
the rest of a message it has half of.

**Endings.** ``done`` → ``RUN_FINISHED`` (outcome ``success``); ``error`` → ``RUN_ERROR`` with
Tether's code; ``interrupt`` → ``RUN_FINISHED`` with an ``interrupt`` outcome; ``cancelled`` →
``RUN_FINISHED`` with the ``cancelled`` outcome for clients that declare AG-UI ≥ 1.0 (which
define it), and ``RUN_ERROR`` with code ``cancelled`` for older ones, which would read an
unknown outcome as success. A cancel is never a plain success.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..events import Envelope, Interrupt, StoredEvent
from ..runtime import tool_message_content
from ..tools import Tool
from ._interrupts import agui_interrupts

__all__ = ["PROTOCOL_VERSION", "Frame", "Cursor", "EventMapper", "Transcript", "tool_message_id", "reasoning_id", "speaks_cancelled_outcome", "encode_frame"]

#: The AG-UI protocol version Tether speaks (``RUN_STARTED.protocolVersion``).
PROTOCOL_VERSION = "1.0"

_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


def encode_frame(frame_id: str, event: Mapping[str, Any]) -> str:
    """One AG-UI event as an SSE frame: ``id`` and one ``data`` line (no ``event`` line: AG-UI
    clients dispatch on the event's ``type``)."""
    return f"id: {frame_id}\ndata: {_ENCODER.encode(event)}\n\n"


@dataclass(frozen=True, slots=True)
class Frame:
    """One AG-UI event and the SSE id it goes out with."""

    id: str
    event: dict[str, Any]

    @property
    def type(self) -> str:
        """The AG-UI event type."""
        return str(self.event["type"])

    def encode(self) -> str:
        """The SSE frame."""
        return encode_frame(self.id, self.event)


@dataclass(frozen=True, slots=True)
class Cursor:
    """Where a client is in a run's frames: every frame of events up to ``seq``, or — with
    ``frames`` — of events before ``seq`` and the first ``frames`` frames of ``seq``."""

    seq: int
    frames: int | None = None

    @classmethod
    def parse(cls, text: str) -> Cursor:
        """Read ``<seq>`` or ``<seq>.<k>``; :class:`ValueError` for anything else."""
        head, dot, tail = text.strip().partition(".")
        if not head.isdigit() or (dot and not tail.isdigit()):
            raise ValueError(f"not an event id: {text!r}")
        seq = int(head)
        frames = int(tail) if dot else None
        if frames is not None and frames < 1:
            raise ValueError(f"not an event id: {text!r}")
        return cls(seq, frames)

    @property
    def done_seq(self) -> int:
        """The last seq whose frames the client has all of."""
        return self.seq if self.frames is None else self.seq - 1

    def __str__(self) -> str:
        return str(self.seq) if self.frames is None else f"{self.seq}.{self.frames}"


def tool_message_id(run_id: str | None, call_id: str) -> str:
    """The AG-UI id of the tool message that answers ``call_id`` (stable between the stream and
    snapshots; a call id alone may repeat across runs)."""
    return f"{run_id}.{call_id}" if run_id else call_id


def reasoning_id(message_id: str) -> str:
    """The AG-UI id of the reasoning of assistant message ``message_id`` (AG-UI keeps reasoning
    as a message of its own, so it cannot share the answer's id)."""
    return f"{message_id}.reasoning"


def speaks_cancelled_outcome(protocol_version: str | None) -> bool:
    """True when a client declaring ``protocol_version`` knows ``RUN_FINISHED``'s ``cancelled``
    outcome (AG-UI 1.0 and later; a declaration that is not ``<major>.<minor>`` counts as newer,
    as AG-UI's versioning rules say). No declaration means a client from before 1.0."""
    if protocol_version is None:
        return False
    major, dot, minor = protocol_version.partition(".")
    if not (major.isdigit() and dot and minor.isdigit()):
        return True
    return (int(major), int(minor)) >= (1, 0)


def _timestamp_ms(ts: str) -> int | None:
    try:
        return int(datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp() * 1000)
    except ValueError:
        return None


class Transcript:
    """The messages a run's frames have built so far, as an AG-UI client builds them (text,
    tool calls, results; not reasoning, which Tether does not keep): what a client reattaching
    in the middle of a run is given as ``MESSAGES_SNAPSHOT`` before the rest."""

    def __init__(self) -> None:
        self._messages: dict[str, dict[str, Any]] = {}  # id → message, content as a list of parts
        self._calls: dict[str, dict[str, Any]] = {}  # toolCallId → the call inside its message

    def apply(self, event: Mapping[str, Any]) -> None:
        """Move past one AG-UI event."""
        kind = event["type"]
        if kind == "TEXT_MESSAGE_START":
            self._messages.setdefault(event["messageId"], {"id": event["messageId"], "role": event.get("role", "assistant"), "content": []})
        elif kind == "TEXT_MESSAGE_CONTENT" and event["messageId"] in self._messages:
            self._messages[event["messageId"]]["content"].append(event["delta"])
        elif kind == "TOOL_CALL_START" and event["toolCallId"] not in self._calls:
            parent = event.get("parentMessageId") or event["toolCallId"]
            message = self._messages.setdefault(parent, {"id": parent, "role": "assistant", "content": []})
            call = {"id": event["toolCallId"], "type": "function", "function": {"name": event["toolCallName"], "arguments": []}}
            message.setdefault("toolCalls", []).append(call)
            self._calls[event["toolCallId"]] = call
        elif kind == "TOOL_CALL_ARGS" and event["toolCallId"] in self._calls:
            self._calls[event["toolCallId"]]["function"]["arguments"].append(event["delta"])
        elif kind == "TOOL_CALL_RESULT":
            self._messages[event["messageId"]] = {"id": event["messageId"], "role": "tool", "toolCallId": event["toolCallId"], "content": [event["content"]]}
        elif kind == "CUSTOM" and event.get("name") == "tether.status" and isinstance(event.get("value"), dict):
            discarded = event["value"].get("discard_message_id")
            if discarded is not None:  # a half-finished step, done again: clients drop it
                self._messages.pop(discarded, None)

    def messages(self) -> list[dict[str, Any]]:
        """The messages, in the order they started, content joined."""
        out = []
        for message in self._messages.values():
            copy = {**message, "content": "".join(message["content"])}
            if "toolCalls" in message:
                copy["toolCalls"] = [{**c, "function": {**c["function"], "arguments": "".join(c["function"]["arguments"])}} for c in message["toolCalls"]]
            out.append(copy)
        return out


class EventMapper:
    """Turns one Tether run's events, in ``seq`` order, into AG-UI frames (see the module
    docstring). Pure: it reads nothing and writes nothing."""

    def __init__(self, *, thread_id: str, agui_run_id: str, tools: Mapping[str, Tool], cancelled_outcome: bool) -> None:
        self.thread_id = thread_id
        #: The ``runId`` of the next segment this mapper opens while :attr:`live` (the id the
        #: client's request carried); other segments get ``<Tether run id>.<seq>``.
        self.agui_run_id: str | None = agui_run_id
        self.tools = tools
        self.cancelled_outcome = cancelled_outcome
        #: False while catching up silently to a client's cursor.
        self.live = True
        #: Tether's run id (from the first event).
        self.run_id: str | None = None
        # -- what the frames applied so far have opened --------------------------------------
        self.run_started: dict[str, Any] | None = None  # the open segment's RUN_STARTED
        self.text: dict[str, Any] | None = None  # the open TEXT_MESSAGE_START
        self.reasoning: tuple[dict[str, Any], dict[str, Any]] | None = None  # REASONING_START, REASONING_MESSAGE_START
        self.tool_calls: dict[str, dict[str, Any]] = {}  # toolCallId → open TOOL_CALL_START
        #: How the last segment ended: ``interrupt``, ``success``, ``cancelled`` or ``error``.
        self.ended: str | None = None
        #: True once the run's terminal event is mapped: nothing more will come.
        self.terminal = False
        #: The messages the frames so far built.
        self.transcript = Transcript()

    # -- state -------------------------------------------------------------------------------

    @property
    def in_segment(self) -> bool:
        """True between a segment's ``RUN_STARTED`` and its end."""
        return self.run_started is not None

    def apply(self, frame: Frame) -> None:
        """Move the open state past ``frame``."""
        event = frame.event
        kind = frame.type
        self.transcript.apply(event)
        if kind == "RUN_STARTED":
            self.run_started, self.ended = event, None
        elif kind in ("RUN_FINISHED", "RUN_ERROR"):
            self.run_started = None
            self.text = self.reasoning = None
            self.tool_calls = {}
            outcome = event.get("outcome", {}).get("type", "success") if kind == "RUN_FINISHED" else "error"
            self.ended = outcome
        elif kind == "TEXT_MESSAGE_START":
            self.text = event
        elif kind == "TEXT_MESSAGE_END":
            self.text = None
        elif kind == "REASONING_START":
            self.reasoning = (event, event)
        elif kind == "REASONING_MESSAGE_START" and self.reasoning is not None:
            self.reasoning = (self.reasoning[0], event)
        elif kind == "REASONING_MESSAGE_END" and self.reasoning is not None:
            self.reasoning = (self.reasoning[0], self.reasoning[0])
        elif kind == "REASONING_END":
            self.reasoning = None
        elif kind == "TOOL_CALL_START":
            self.tool_calls[event["toolCallId"]] = event
        elif kind == "TOOL_CALL_END":
            self.tool_calls.pop(event["toolCallId"], None)

    def reopen(self, cursor: Cursor) -> list[Frame]:
        """What a client resuming at ``cursor`` gets first: the open segment's ``RUN_STARTED``
        and the ``*_START`` of everything open (nothing between segments)."""
        if self.run_started is None:
            return []
        events = [self.run_started]
        if self.reasoning is not None:
            span, message = self.reasoning
            events += [span] if span is message else [span, message]
        if self.text is not None:
            events.append(self.text)
        events += self.tool_calls.values()
        tether = {"run_id": self.run_id, "seq": cursor.seq, "event_id": str(cursor), "type": "reopen"}
        return [Frame(str(cursor), {**e, "metadata": {**e.get("metadata", {}), "tether": tether}}) for e in events]

    def feed(self, stored: StoredEvent) -> list[Frame]:
        """The frames of one event; the state moves past all of them."""
        frames = self.frames_for(stored)
        for frame in frames:
            self.apply(frame)
        return frames

    # -- mapping -----------------------------------------------------------------------------

    def frames_for(self, stored: StoredEvent) -> list[Frame]:
        """The frames of one event, from the current state (which this does not move)."""
        envelope = Envelope.from_json(stored.envelope)
        self.run_id = envelope.run_id
        events = _Builder(self, envelope).build()
        if not events:
            return []
        base = {"run_id": envelope.run_id, "seq": envelope.seq, "type": envelope.type}
        timestamp = _timestamp_ms(envelope.ts)
        frames = []
        for k, event in enumerate(events, start=1):
            frame_id = str(envelope.seq) if k == len(events) else f"{envelope.seq}.{k}"
            tether = {**base, "event_id": frame_id, **event.pop("_tether", {})}
            if timestamp is not None:
                event.setdefault("timestamp", timestamp)
            event["metadata"] = {**event.get("metadata", {}), "tether": tether}
            frames.append(Frame(frame_id, event))
        if envelope.terminal:
            self.terminal = True
        return frames


class _Builder:
    """The AG-UI events of one Tether event, simulating the open state as it emits them."""

    def __init__(self, mapper: EventMapper, envelope: Envelope) -> None:
        self.m = mapper
        self.env = envelope
        self.data = envelope.data
        self.out: list[dict[str, Any]] = []
        self.segment = mapper.run_started is not None
        self.text = mapper.text
        self.reasoning = mapper.reasoning
        self.tool_calls = dict(mapper.tool_calls)

    # -- helpers -----------------------------------------------------------------------------

    def emit(self, event: dict[str, Any]) -> None:
        self.out.append(event)

    def open_segment(self) -> None:
        if self.segment:
            return
        if self.m.live and self.m.agui_run_id is not None:
            run_id, self.m.agui_run_id = self.m.agui_run_id, None
        else:
            run_id = f"{self.env.run_id}.{self.env.seq}"
        self.emit({"type": "RUN_STARTED", "threadId": self.m.thread_id, "runId": run_id, "protocolVersion": PROTOCOL_VERSION})
        self.segment = True

    def close_text(self) -> None:
        if self.text is not None:
            self.emit({"type": "TEXT_MESSAGE_END", "messageId": self.text["messageId"]})
            self.text = None

    def close_reasoning(self) -> None:
        if self.reasoning is not None:
            span, message = self.reasoning
            if message is not span:
                self.emit({"type": "REASONING_MESSAGE_END", "messageId": message["messageId"]})
            self.emit({"type": "REASONING_END", "messageId": span["messageId"]})
            self.reasoning = None

    def close_all(self) -> None:
        self.close_reasoning()
        self.close_text()
        for call_id in list(self.tool_calls):
            self.emit({"type": "TOOL_CALL_END", "toolCallId": call_id})
        self.tool_calls = {}

    def end_segment(self, event: dict[str, Any]) -> None:
        self.open_segment()  # a segment never ends without having started
        self.close_all()
        if event["type"] == "RUN_FINISHED":
            event = {"threadId": self.m.thread_id, "runId": self._segment_run_id(), **event}
        self.emit(event)
        self.segment = False

    def _segment_run_id(self) -> str:
        for event in reversed(self.out):
            if event["type"] == "RUN_STARTED":
                return str(event["runId"])
        assert self.m.run_started is not None
        return str(self.m.run_started["runId"])

    def text_message(self, message_id: str, text: str, role: str = "assistant") -> None:
        self.close_reasoning()
        if self.text is not None and (self.text["messageId"] != message_id or self.text.get("role", "assistant") != role):
            self.close_text()
        if self.text is None:
            start = {"type": "TEXT_MESSAGE_START", "messageId": message_id, "role": role}
            self.emit(start)
            self.text = start
        self.emit({"type": "TEXT_MESSAGE_CONTENT", "messageId": message_id, "delta": text})

    # -- the events --------------------------------------------------------------------------

    def build(self) -> list[dict[str, Any]]:
        if self.m.terminal:
            return []  # nothing follows the terminal event (the log has nothing after it either)
        handler = getattr(self, "on_" + self.env.type, None)
        if handler is None:
            self.open_segment()
            self.emit({"type": "CUSTOM", "name": f"tether.{self.env.type}", "value": self.data})
        else:
            handler()
        return self.out

    def on_run_started(self) -> None:
        self.open_segment()
        self.out[-1]["_tether"] = {"input_message_id": self.data.get("input_message_id")}

    def on_token(self) -> None:
        if not self.data["text"]:
            return
        self.open_segment()
        self.text_message(self.data["message_id"], self.data["text"])

    def on_thinking(self) -> None:
        if not self.data["text"]:
            return
        self.open_segment()
        rid = reasoning_id(self.data["message_id"])
        if self.reasoning is not None and self.reasoning[0]["messageId"] != rid:
            self.close_reasoning()
        if self.reasoning is None:
            self.close_text()
            span = {"type": "REASONING_START", "messageId": rid}
            message = {"type": "REASONING_MESSAGE_START", "messageId": rid, "role": "reasoning"}
            self.emit(span)
            self.emit(message)
            self.reasoning = (span, message)
        self.emit({"type": "REASONING_MESSAGE_CONTENT", "messageId": rid, "delta": self.data["text"]})

    def on_tool_call(self) -> None:
        self.open_segment()
        self.close_reasoning()
        self.close_text()
        call_id = self.data["call_id"]
        start: dict[str, Any] = {"type": "TOOL_CALL_START", "toolCallId": call_id, "toolCallName": self.data["name"]}
        if self.data.get("message_id"):
            start["parentMessageId"] = self.data["message_id"]
        args = self.data["args"]
        self.emit({**start, "_tether": {"risk": self.data["risk"], "gated": self.data["gated"]}})
        self.emit({"type": "TOOL_CALL_ARGS", "toolCallId": call_id, "delta": _ENCODER.encode(args) if isinstance(args, dict) else str(args)})
        self.emit({"type": "TOOL_CALL_END", "toolCallId": call_id})

    def on_tool_result(self) -> None:
        self.open_segment()
        self.close_reasoning()
        self.close_text()
        d = self.data
        content = tool_message_content(d["status"], d.get("result"), d.get("error"), d.get("reason"))
        tether = {"status": d["status"], "name": d["name"], **{k: d[k] for k in ("error", "reason") if d.get(k)}}
        self.emit(
            {
                "type": "TOOL_CALL_RESULT",
                "messageId": tool_message_id(self.env.run_id, d["call_id"]),
                "toolCallId": d["call_id"],
                "content": content,
                "role": "tool",
                "_tether": tether,
            }
        )

    def on_user_message(self) -> None:
        self.open_segment()
        self.close_text()
        self.text_message(self.data["message_id"], self.data["content"], role="user")
        self.close_text()

    def on_status(self) -> None:
        self.open_segment()
        discard = self.data.get("discard_message_id")
        if discard and self.text is not None and self.text["messageId"] == discard:
            self.close_text()  # the half-finished step is done again; its message is left as it is
        value = {k: v for k, v in self.data.items() if v is not None}
        self.emit({"type": "CUSTOM", "name": "tether.status", "value": value})

    def on_resumed(self) -> None:
        self.open_segment()
        self.emit({"type": "CUSTOM", "name": "tether.resumed", "value": self.data})

    def on_interrupt(self) -> None:
        interrupts = agui_interrupts(Interrupt.model_validate(self.data), self.m.tools)
        self.end_segment(
            {"type": "RUN_FINISHED", "outcome": {"type": "interrupt", "interrupts": interrupts}, "_tether": {"interrupt_id": self.data["interrupt_id"]}}
        )

    def on_done(self) -> None:
        self.end_segment({"type": "RUN_FINISHED", "outcome": {"type": "success"}, "_tether": {"message_id": self.data.get("message_id")}})

    def on_error(self) -> None:
        self.end_segment(
            {"type": "RUN_ERROR", "message": self.data["message"], "code": self.data["code"], "_tether": {"retryable": self.data.get("retryable", False)}}
        )

    def on_cancelled(self) -> None:
        tether = {k: self.data.get(k) for k in ("mode", "reason", "actor", "partial_message_id")}
        if self.m.cancelled_outcome:
            self.end_segment({"type": "RUN_FINISHED", "outcome": {"type": "cancelled"}, "_tether": tether})
        else:
            reason = self.data.get("reason")
            message = f"the run was cancelled ({reason})" if reason else "the run was cancelled"
            self.end_segment({"type": "RUN_ERROR", "message": message, "code": "cancelled", "_tether": tether})
