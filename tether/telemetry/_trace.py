"""One run's spans and timings in this process, from its events as they commit.

A :class:`RunTrace` lives for one *stretch* of a run: from its start (or its resume, or its
takeover) until it parks on an interrupt or ends. It holds the open ``invoke_agent`` span, the
``chat`` span of the model call under way, when the tools of the current step started, and the
risk of each call, and nothing after the stretch (a waiting run holds no memory here either).

Every time comes from the events (their ``ts``, set when the runtime emitted them) or, for the
end of a model call, from the runtime's word that it ended; so spans carry explicit start and
end times, and a span is made only once what it describes is over and durable.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from ..events import EVENT_TYPES, Cancelled, Done, Interrupt, RunError, Status, ToolCall, ToolResult
from ._context import RunLabels
from ._histograms import Histograms

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span

    from ._spans import SpanMaker

__all__ = ["RunTrace", "ModelInfo", "ts_ns", "datetime_ns"]

#: ``tool_result`` statuses of a tool that ran (the others never executed it).
EXECUTED = frozenset({"ok", "error", "cancelled"})


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """What the spans and metrics say about the agent and its model."""

    agent: str
    provider: str
    model: str
    #: tool name → risk tier
    tiers: dict[str, str]
    #: Record message contents, tool arguments and results (opt-in).
    contents: bool


@dataclass(slots=True)
class _Chat:
    start_ns: int
    span: Span | None
    #: False while only an outbound request made it (its ``status`` event not yet committed).
    announced: bool
    first_ns: int | None = None
    ended_ns: int | None = None
    usage: tuple[int, int] | None = None
    error: str | None = None
    text: list[str] = field(default_factory=list)
    calls: list[ToolCall] = field(default_factory=list)


def ts_ns(envelope: str) -> int:
    """The ``ts`` of an encoded envelope, in ns since the epoch (no JSON parse)."""
    at = envelope.find('"ts":"') + 6
    return _parse(envelope[at : at + 27])


#: (text up to the seconds, its seconds since the epoch): events of one second share it.
_last_second: tuple[str, int] = ("", 0)


def _parse(text: str) -> int:
    # "2026-11-30T20:00:00.123456Z": the seconds through datetime (once a second), the
    # microseconds exactly.
    global _last_second
    head, seconds = _last_second
    if text[:19] != head:
        seconds = int(datetime.fromisoformat(text[:19]).replace(tzinfo=UTC).timestamp())
        _last_second = (text[:19], seconds)
    return seconds * 1_000_000_000 + int(text[20:26]) * 1000


def datetime_ns(moment: datetime) -> int:
    """``moment`` in ns since the epoch."""
    return int(moment.timestamp()) * 1_000_000_000 + moment.microsecond * 1000


class RunTrace:
    """The spans and timings of one stretch of one run (see the module docs)."""

    def __init__(
        self, run_id: str, thread_id: str, info: ModelInfo, histograms: Histograms, maker: SpanMaker | None, parent: Context | None, kind: str, start_ns: int
    ) -> None:
        self.run_id = run_id
        self.thread_id = thread_id
        self.info = info
        self.h = histograms
        self.maker = maker
        #: When the run was created (for its duration), if known here.
        self.created_ns: int | None = None
        self.labels = RunLabels(run_id, thread_id)
        self._chat: _Chat | None = None
        #: The end and usage of a model call whose ``status`` event has not committed yet.
        self._ended_early: tuple[int, tuple[int, int]] | None = None
        self._tools_ns = 0
        self._tool_names: list[str] = []
        self._calls: dict[str, ToolCall] = {}
        self.stretch: Span | None = None
        self._under: Context | None = None
        if maker is not None:
            self.stretch = maker.start(
                f"invoke_agent {info.agent}",
                client=False,
                parent=parent,
                start_ns=start_ns,
                attributes={**self._common(), "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": info.agent, "tether.run.stretch": kind},
            )
            self._under = maker.under(self.stretch)
            self.labels.trace_id = maker.trace_id(self.stretch)
            self.labels.traceparent = self.traceparent_for_request

    def _common(self) -> dict[str, Any]:
        return {
            "gen_ai.conversation.id": self.thread_id,
            "gen_ai.provider.name": self.info.provider,
            "gen_ai.request.model": self.info.model,
            "tether.run.id": self.run_id,
        }

    def stretch_traceparent(self) -> str | None:
        """The ``traceparent`` of this stretch's span (None when not tracing)."""
        return self.maker.traceparent(self.stretch) if self.maker is not None and self.stretch is not None else None

    # -- the model call --------------------------------------------------------------------

    def traceparent_for_request(self) -> str | None:
        """For an outbound request of the model call under way: its ``chat`` span's context
        (begun here if the call's ``status`` event has not committed yet)."""
        if self.maker is None:
            return None
        chat = self._chat
        if chat is None or chat.ended_ns is not None:
            chat = self._begin_chat(time.time_ns(), announced=False)
        return self.maker.traceparent(chat.span) if chat.span is not None else None

    def _begin_chat(self, start_ns: int, *, announced: bool) -> _Chat:
        chat = self._chat
        if chat is not None and chat.ended_ns is None and not chat.announced and announced:
            chat.announced = True  # begun by its request: this is its ``status`` event
            return chat
        if chat is not None:
            self._close_chat(start_ns)
        span = None
        if self.maker is not None:
            attributes = {**self._common(), "gen_ai.operation.name": "chat"}
            span = self.maker.start(f"chat {self.info.model}", client=True, parent=self._under, start_ns=start_ns, attributes=attributes)
        self._chat = _Chat(start_ns, span, announced)
        if announced and self._ended_early is not None:
            self._chat.ended_ns, self._chat.usage = self._ended_early
            self._ended_early = None
        return self._chat

    def model_call_ended(self, input_tokens: int, output_tokens: int) -> None:
        chat = self._chat
        if chat is not None and chat.ended_ns is None:
            chat.ended_ns = time.time_ns()
            chat.usage = (input_tokens, output_tokens)
        else:  # a quick call can end before its ``status`` event commits: that event's chat ended
            self._ended_early = (time.time_ns(), (input_tokens, output_tokens))

    def delta(self, event_type: str, envelope: str) -> None:
        """A ``token`` or ``thinking`` event committed."""
        chat = self._chat
        if chat is None:
            return
        if chat.first_ns is None:
            chat.first_ns = ts_ns(envelope)
        if self.info.contents and event_type == "token":
            chat.text.append(json.loads(envelope)["data"]["text"])

    def _close_chat(self, fallback_ns: int) -> None:
        chat, self._chat = self._chat, None
        if chat is None:
            return
        end = chat.ended_ns or fallback_ns
        labels = ("chat", self.info.provider, self.info.model)
        self.h.operation.observe((end - chat.start_ns) / 1e9, *labels, chat.error or "")
        if chat.usage is not None:
            self.h.tokens.observe(chat.usage[0], *labels, "input")
            self.h.tokens.observe(chat.usage[1], *labels, "output")
        if chat.first_ns is not None:
            self.h.first_token.observe(max(chat.first_ns - chat.start_ns, 0) / 1e9)
        if self.maker is None or chat.span is None:
            return
        attributes: dict[str, Any] = {}
        if chat.usage is not None:
            attributes["gen_ai.usage.input_tokens"], attributes["gen_ai.usage.output_tokens"] = chat.usage
        if chat.first_ns is not None:
            attributes["gen_ai.response.time_to_first_chunk"] = max(chat.first_ns - chat.start_ns, 0) / 1e9
        if self.info.contents:
            parts: list[dict[str, Any]] = [{"type": "text", "content": "".join(chat.text)}] if chat.text else []
            parts += [{"type": "tool_call", "id": c.call_id, "name": c.name, "arguments": c.args} for c in chat.calls]
            attributes["gen_ai.output.messages"] = json.dumps([{"role": "assistant", "parts": parts}], ensure_ascii=False)
        self.maker.end(chat.span, end, error=chat.error, attributes=attributes)

    # -- events ----------------------------------------------------------------------------

    def event(self, event_type: str, envelope: str) -> bool:
        """A committed event other than a delta; False once the stretch is over."""
        at = ts_ns(envelope)
        # Parsed into its typed event (they are few: a status, a call, a result, an end); the
        # deltas, the many, take the path of :meth:`delta`.
        event = EVENT_TYPES[event_type].model_validate(json.loads(envelope)["data"])
        if isinstance(event, Status):
            if event.stage == "model":
                if event.detail is None:
                    self._begin_chat(at, announced=True)
                elif self._chat is not None and self._chat.span is not None and self.maker is not None:
                    self.maker.event(self._chat.span, "tether.model.retry", at, {"tether.detail": event.detail})
            elif event.stage == "tool":  # the model call is over: tools run
                self._close_chat(at)
                self._tools_ns, self._tool_names = at, str(event.detail or "").split(", ")
        elif isinstance(event, ToolCall):
            self._calls[event.call_id] = event
            if self._chat is not None:
                self._chat.calls.append(event)
        elif isinstance(event, ToolResult):
            self._tool_result(event, at)
        elif isinstance(event, Interrupt):
            self._close_chat(at)
            self._end_stretch(at, "waiting_human", {"tether.interrupt.id": event.interrupt_id})
            return False
        elif isinstance(event, Done | RunError | Cancelled):
            self._ended(event, at)
            return False
        return True

    def _tool_result(self, result: ToolResult, at: int) -> None:
        name, status = result.name, result.status
        if status not in EXECUTED or name not in self._tool_names:
            return  # never ran (rejected, expired, answered, cancelled before it ran, invalid)
        self._tool_names.remove(name)
        call = self._calls.get(result.call_id)
        tier = str((call.risk if call is not None else None) or self.info.tiers.get(name, "destructive"))
        self.h.tool.observe(max(at - self._tools_ns, 0) / 1e9, name, tier)
        if self.maker is None:
            return
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": name,
            "gen_ai.tool.call.id": result.call_id,
            "gen_ai.tool.type": "function",
            "gen_ai.conversation.id": self.thread_id,
            "tether.run.id": self.run_id,
            "tether.tool.risk": tier,
            "tether.tool.status": status,
        }
        if self.info.contents:
            if call is not None:
                attributes["gen_ai.tool.call.arguments"] = json.dumps(call.args, ensure_ascii=False)
            if result.result is not None:
                attributes["gen_ai.tool.call.result"] = json.dumps(result.result, ensure_ascii=False)
        span = self.maker.start(f"execute_tool {name}", client=False, parent=self._under, start_ns=self._tools_ns, attributes=attributes)
        self.maker.end(span, at, error={"error": "tool_error", "cancelled": "cancelled"}.get(status))

    def _ended(self, event: Done | RunError | Cancelled, at: int) -> None:
        outcome = "completed" if isinstance(event, Done) else "failed" if isinstance(event, RunError) else "cancelled"
        chat = self._chat
        if chat is not None and not chat.calls and not isinstance(event, Done):
            # The run ended with its model call: that call failed, or a cancel stopped it.
            chat.error = (event.code or "model_error") if isinstance(event, RunError) else "cancelled"
        self._close_chat(at)
        if self.created_ns is not None:
            self.h.run.observe(max(at - self.created_ns, 0) / 1e9, outcome)
        if isinstance(event, Cancelled) and self.maker is not None and self.stretch is not None:
            cancel = {"tether.cancel.mode": event.mode, "tether.cancel.actor": event.actor or ""}
            if self.info.contents and event.reason:
                cancel["tether.cancel.reason"] = event.reason
            self.maker.event(self.stretch, "tether.cancelled", at, cancel)
        self._end_stretch(at, outcome, {}, error=event.code if isinstance(event, RunError) else None)

    def _end_stretch(self, at: int, outcome: str, attributes: dict[str, Any], *, error: str | None = None) -> None:
        if self.maker is not None and self.stretch is not None:
            self.maker.end(self.stretch, at, error=error, attributes={**attributes, "tether.run.outcome": outcome})
            self.stretch = None

    def abandon(self) -> None:
        """The stretch stops here without an outcome (taken over, or the process stops)."""
        now = time.time_ns()
        self._close_chat(now)
        self._end_stretch(now, "interrupted", {})
