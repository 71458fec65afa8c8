"""The step loop of one run: model call → tool calls → results → next model call → done.

A :class:`RunExecutor` is created per run and driven by :class:`~tether.runtime.Runtime`, which
owns its task. Every event goes through the run's :class:`~tether.runtime.eventlog.EventLog`
(durable before sent). The run ends with exactly one terminal event, written in the same
transaction as the run's final status.

Cancellation is the run's own, kept apart from an outside ``CancelledError`` (server
shutdown): :meth:`RunExecutor.request_cancel` cancels the *model* scope at once (both modes)
and, for ``hard``, the *tools* scope too; ``soft`` lets executing tools finish and record their
results. Only at the run's edge does a requested cancel become the ``cancelled`` outcome. An
outside cancellation propagates untouched and leaves the run for recovery.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import anyio
from contextlib import aclosing

from .._ids import new_id
from ..agent import Agent
from ..errors import ModelError
from ..events import Cancelled, Done, Event, RunError, Status, Thinking, Token, ToolCall, ToolResult
from ..models import ChatMessage, ModelRequest, TextDelta, ThinkingDelta, ToolCallRequest
from ..store import MessageRecord, RunRecord, Store
from ..tools import Tool, ToolArgsError, ToolContext
from .config import RunConfig
from .eventlog import EventLog

__all__ = ["RunExecutor", "to_chat_messages"]

log = logging.getLogger("tether.runtime")


def to_chat_messages(path: list[MessageRecord]) -> list[ChatMessage]:
    """The history a model sees for a message path.

    Assistant turns that were cancelled or failed before producing anything are left out: they
    carry no content and would only confuse the model.
    """
    history: list[ChatMessage] = []
    for m in path:
        if m.role == "assistant" and m.status in ("cancelled", "failed", "partial") and not m.content and not m.tool_calls:
            continue
        calls = tuple(ToolCallRequest(c["id"], c["name"], c.get("args", {})) for c in (m.tool_calls or ()))
        history.append(ChatMessage(m.role, m.content, calls, m.tool_call_id, m.name))  # type: ignore[arg-type]
    return history


def _json_result(value: Any) -> Any:
    """Make a tool's return value JSON-safe (the event log and the model need JSON)."""
    try:
        return json.loads(json.dumps(value, default=str))
    except (TypeError, ValueError):
        return str(value)


class _Finished(Exception):
    """Internal: the loop reached its end; carries the terminal event."""


class RunExecutor:
    """Executes one run from its current state to a terminal event."""

    def __init__(self, store: Store, bus: Any, agent: Agent, run: RunRecord) -> None:
        self.store = store
        self.agent = agent
        self.run = run
        self.config = RunConfig.model_validate(run.config)
        self._bus = bus
        self.log: EventLog = None  # type: ignore[assignment]  # created by execute()
        #: The requested cancel mode (``soft``/``hard``), or None. "Requested", not "done".
        self.cancel_mode: str | None = None
        self._model_scope: anyio.CancelScope | None = None
        self._tools_scope: anyio.CancelScope | None = None
        self._partial_message_id: str | None = None
        self._leaf_id: str | None = run.input_message_id

    # -- control ---------------------------------------------------------------------------

    def request_cancel(self, mode: str) -> None:
        """Stop the model stream now; with ``hard`` also cancel executing tools. Idempotent."""
        if self.cancel_mode != "hard":
            self.cancel_mode = mode
        if self._model_scope is not None:
            self._model_scope.cancel()
        if mode == "hard" and self._tools_scope is not None:
            self._tools_scope.cancel()

    # -- the loop ----------------------------------------------------------------------------

    async def execute(self) -> None:
        """Run to a terminal state. Outside cancellation propagates and leaves the run as is."""
        self.log = EventLog(self.store, self._bus, self.run.id, next_seq=await self.store.last_seq(self.run.id) + 1)
        self.log.start()
        try:
            if not await self.store.mark_running(self.run.id):
                current = await self.store.get_run(self.run.id)
                if current.status != "cancelling":
                    return  # someone else owns it, or it is terminal
                self.cancel_mode = current.cancel_mode or "soft"
            outcome = await self._loop()
            await self._finish(outcome)
        except Exception as exc:  # an internal fault: the run fails, the server does not
            log.exception("run %s failed", self.run.id)
            await self._finish(RunError(code="internal_error", message=f"{type(exc).__name__}: {exc}"))
        finally:
            await self.log.aclose()

    async def _loop(self) -> Event:
        path = await self.store.path_to(self.run.thread_id, self.run.input_message_id)
        history = to_chat_messages(path)
        max_steps = self.config.max_steps or self.agent.max_steps
        tool_specs = self.agent.tool_specs()
        for _ in range(max_steps):
            if self.cancel_mode:
                return self._cancelled_event()
            message_id, text, calls, failure = await self._model_turn(ModelRequest(list(history), tool_specs))
            if failure is not None:
                return failure
            if self.cancel_mode:
                return self._cancelled_event()
            history.append(ChatMessage("assistant", text, tuple(calls)))
            if not calls:
                return Done(message_id=message_id)
            results = await self._run_tools(calls)
            history.extend(results)
            if self.cancel_mode:
                return self._cancelled_event()
        return RunError(code="max_steps_exceeded", message=f"the run made {max_steps} model calls without finishing")

    async def _model_turn(self, request: ModelRequest) -> tuple[str, str, list[ToolCallRequest], Event | None]:
        """One model call: stream deltas as events, store the assistant message."""
        message = MessageRecord(new_id("msg"), self.run.thread_id, self._leaf_id, self.run.id, "assistant", "", status="partial")
        await self.store.add_message(message)
        self._leaf_id = message.id
        self._partial_message_id = message.id
        self.log.emit(Status(stage="model", detail=None))
        parts: list[str] = []
        calls: list[ToolCallRequest] = []
        failure: Event | None = None
        with anyio.CancelScope() as scope:
            self._model_scope = scope
            if self.cancel_mode:
                scope.cancel()
            try:
                async with aclosing(self.agent.model.stream(request)) as stream:
                    async for delta in stream:
                        if isinstance(delta, TextDelta):
                            if delta.text:
                                parts.append(delta.text)
                                self.log.emit(Token(message_id=message.id, text=delta.text))
                        elif isinstance(delta, ThinkingDelta):
                            if delta.text:
                                self.log.emit(Thinking(message_id=message.id, text=delta.text))
                        elif isinstance(delta, ToolCallRequest):
                            calls.append(delta)
            except ModelError as exc:
                failure = RunError(code=exc.code, message=exc.message, retryable=exc.retryable)
            except Exception as exc:
                log.warning("model call of run %s failed: %r", self.run.id, exc)
                failure = RunError(code="model_error", message=f"{type(exc).__name__}: {exc}", retryable=True)
            finally:
                self._model_scope = None
        text = "".join(parts)
        if scope.cancelled_caught or (self.cancel_mode and failure is None and scope.cancel_called):
            await self.store.update_message(message.id, content=text, status="cancelled")
            return message.id, text, [], None
        if failure is not None:
            await self.store.update_message(message.id, content=text, status="failed")
            return message.id, text, [], failure
        stored_calls = [self._stored_call(c) for c in calls]
        await self.store.update_message(message.id, content=text, status="complete", tool_calls=stored_calls or None)
        self._partial_message_id = None
        return message.id, text, calls, None

    def _stored_call(self, call: ToolCallRequest) -> dict[str, Any]:
        tool = self.agent.tools.get(call.name)
        args = call.args
        if tool is not None and isinstance(args, dict):
            args = tool.mask(args)
        return {"id": call.id, "name": call.name, "args": args}

    # -- tools -------------------------------------------------------------------------------

    async def _run_tools(self, calls: list[ToolCallRequest]) -> list[ChatMessage]:
        """Announce every call, run them concurrently, record one result per call (model order)."""
        results: dict[str, tuple[str, Any, str | None]] = {}
        for call in calls:
            tool = self.agent.tools.get(call.name)
            risk = tool.risk if tool else "read_only"
            args = tool.mask(call.args) if tool and isinstance(call.args, dict) else call.args
            self.log.emit(
                ToolCall(call_id=call.id, name=call.name, args=args if isinstance(args, dict) else {"_raw": args}, risk=risk, gated=False)
            )

        async def run_one(call: ToolCallRequest) -> None:
            status, result, error = await self._run_tool(call)
            results[call.id] = (status, result, error)

        self.log.emit(Status(stage="tool", detail=", ".join(c.name for c in calls)))
        with anyio.CancelScope() as scope:
            self._tools_scope = scope
            if self.cancel_mode == "hard":
                scope.cancel()
            try:
                async with anyio.create_task_group() as tg:
                    for call in calls:
                        tg.start_soon(run_one, call)
            finally:
                self._tools_scope = None

        messages: list[ChatMessage] = []
        for call in calls:
            status, result, error = results.get(call.id, ("cancelled", None, "cancelled before it started"))
            if call.id not in results:
                self.log.emit(ToolResult(call_id=call.id, name=call.name, status="cancelled", reason="run cancelled"))
            content = json.dumps(result, ensure_ascii=False) if status == "ok" else json.dumps({"status": status, "error": error})
            record = MessageRecord(
                new_id("msg"), self.run.thread_id, self._leaf_id, self.run.id, "tool", content,
                tool_call_id=call.id, name=call.name, status="cancelled" if status == "cancelled" else "complete",
            )
            await self.store.add_message(record)
            self._leaf_id = record.id
            messages.append(ChatMessage("tool", content, (), call.id, call.name))
        return messages

    async def _run_tool(self, call: ToolCallRequest) -> tuple[str, Any, str | None]:
        tool: Tool | None = self.agent.tools.get(call.name)
        if tool is None:
            error = f"unknown tool {call.name!r}; available: {', '.join(self.agent.tools) or 'none'}"
            self.log.emit(ToolResult(call_id=call.id, name=call.name, status="error", error=error))
            return "error", None, error
        try:
            args = tool.validate(call.args if isinstance(call.args, dict) else _parse_args(call.args))
        except ToolArgsError as exc:
            self.log.emit(ToolResult(call_id=call.id, name=call.name, status="error", error=str(exc)))
            return "error", None, str(exc)
        ctx = ToolContext(run_id=self.run.id, thread_id=self.run.thread_id, call_id=call.id)
        try:
            value = await tool.call(args, ctx)
        except anyio.get_cancelled_exc_class():
            self.log.emit(ToolResult(call_id=call.id, name=call.name, status="cancelled", reason="run cancelled (hard)"))
            raise
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            self.log.emit(ToolResult(call_id=call.id, name=call.name, status="error", error=error))
            return "error", None, error
        result = _json_result(value)
        self.log.emit(ToolResult(call_id=call.id, name=call.name, status="ok", result=result))
        return "ok", result, None

    # -- the end -----------------------------------------------------------------------------

    def _cancelled_event(self) -> Event:
        return Cancelled(mode=self.cancel_mode or "soft", partial_message_id=self._partial_message_id)  # type: ignore[arg-type]

    async def _finish(self, outcome: Event) -> None:
        """Commit the terminal event with the final status; a requested cancel always wins."""
        await self.log.wait_for_idle()
        if isinstance(outcome, Done):
            status, allowed = "completed", ("running",)
        elif isinstance(outcome, RunError):
            status, allowed = "failed", ("running",)
        else:
            status, allowed = "cancelled", ("cancelling",)
        if status != "cancelled":
            final = self.log.seal(outcome)
            error = {"code": outcome.code, "message": outcome.message} if isinstance(outcome, RunError) else None
            if await self.store.finish_run(self.run.id, status=status, final_event=final, from_statuses=allowed, error=error):
                self.log.publish_final(final)
                return
            self.log.unseal(final)  # not written: its seq is still free
            # The run is no longer `running`: a cancel was committed first. It wins.
            if self._partial_message_id is None and isinstance(outcome, Done):
                self._partial_message_id = outcome.message_id
                await self.store.update_message(outcome.message_id, status="cancelled")  # type: ignore[arg-type]
        current = await self.store.get_run(self.run.id)
        if current.status != "cancelling":
            log.warning("run %s: cannot finish, status is %s", self.run.id, current.status)
            return
        event = Cancelled(
            mode=current.cancel_mode or self.cancel_mode or "soft",  # type: ignore[arg-type]
            reason=current.cancel_reason,
            actor=current.cancel_actor,
            partial_message_id=self._partial_message_id,
        )
        final = self.log.seal(event)
        if await self.store.finish_run(self.run.id, status="cancelled", final_event=final, from_statuses=("cancelling",)):
            self.log.publish_final(final)


def _parse_args(raw: str) -> Any:
    try:
        return json.loads(raw) if raw.strip() else {}
    except ValueError:
        return raw

