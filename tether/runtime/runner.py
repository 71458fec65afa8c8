"""The step loop of one run: model call → tool calls → (human review) → results → … → done.

A :class:`RunExecutor` is created per execution segment of a run and driven by
:class:`~tether.runtime.Runtime`, which owns its task. Every event goes through the run's
:class:`~tether.runtime.eventlog.EventLog` (durable before sent). The run ends with exactly one
terminal event, written in the same transaction as the run's final status.

**Human review.** Per model turn, arguments are validated first (invalid ones become an
``error`` result for the model); calls below the review gate run at once, concurrently; the
gated ones go into one interrupt. Parking the run (``running → waiting_human``, the interrupt
row and its event) is one transaction, after which the executor simply returns: a waiting run
holds no task and no memory. The parked turn (every call in the model's order, real args,
results already obtained) lives in the interrupt row. A resume starts a new executor that
applies the decisions, records one result per call in the model's order, and goes on.

**Cancellation** is the run's own, kept apart from an outside ``CancelledError`` (server
shutdown): :meth:`RunExecutor.request_cancel` cancels the *model* scope at once (both modes)
and, for ``hard``, the *tools* scope too; ``soft`` lets executing tools finish and record their
results. Only at the run's edge does a requested cancel become the ``cancelled`` outcome. An
outside cancellation propagates untouched and leaves the run for recovery.
"""

from __future__ import annotations

import json
import logging
from contextlib import aclosing
from datetime import timedelta
from typing import Any

import anyio

from .._ids import new_id, utcnow
from ..agent import Agent
from ..errors import ModelError, RunNotActive
from ..events import Cancelled, Done, Event, Interrupt, RunError, Status, ToolCall, ToolResult, UserMessage, format_ts
from ..models import ChatMessage, ModelRequest, TextDelta, ThinkingDelta, ToolCallRequest
from ..store import AuditEntry, InterruptRecord, MessageRecord, RunRecord, Store, args_digest
from ..tools import Tool, ToolArgsError, ToolContext
from .config import RunConfig
from .eventlog import EventLog
from .review import action_request, is_gated, review_config

__all__ = ["RunExecutor", "to_chat_messages", "tool_message", "tool_result_event"]

log = logging.getLogger("tether.runtime")

#: Returned by the loop when the run parked on an interrupt (no terminal event).
WAITING = object()


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


def _json_safe(value: Any) -> Any:
    """Make a value JSON-safe (the event log, the store and the model need JSON)."""
    try:
        return json.loads(json.dumps(value, default=str))
    except (TypeError, ValueError):
        return str(value)


def tool_result_event(item: dict[str, Any]) -> ToolResult:
    """The ``tool_result`` event of a settled call item."""
    return ToolResult(
        call_id=item["id"], name=item["name"], status=item["status"],
        result=item.get("result"), error=item.get("error"), reason=item.get("reason"),
    )


def tool_message(item: dict[str, Any], *, thread_id: str, run_id: str, parent_id: str | None) -> MessageRecord:
    """The tool message (what the model reads next) of a settled call item."""
    status = item["status"]
    if status == "ok":
        content = json.dumps(item.get("result"), ensure_ascii=False)
    elif status == "responded":
        content = str(item.get("result"))
    else:
        detail = {k: item[k] for k in ("error", "reason") if item.get(k)}
        content = json.dumps({"status": status, **detail}, ensure_ascii=False)
    return MessageRecord(
        new_id("msg"), thread_id, parent_id, run_id, "tool", content,
        tool_call_id=item["id"], name=item["name"], status="cancelled" if status == "cancelled" else "complete",
    )


class RunExecutor:
    """Executes one run from its current state to a terminal event or a human pause."""

    def __init__(
        self, store: Store, bus: Any, agent: Agent, run: RunRecord, *, resume: InterruptRecord | None = None, takeover: bool = False
    ) -> None:
        self.store = store
        self.agent = agent
        self.run = run
        self.resume = resume
        #: True when continuing a run whose process died (from its last checkpoint).
        self.takeover = takeover
        self.config = RunConfig.model_validate(run.config)
        self._bus = bus
        self.log: EventLog = None  # type: ignore[assignment]  # created by execute()
        #: The requested cancel mode (``soft``/``hard``), or None. "Requested", not "done".
        self.cancel_mode: str | None = None
        self._model_scope: anyio.CancelScope | None = None
        self._tools_scope: anyio.CancelScope | None = None
        self._partial_message_id: str | None = None
        self._leaf_id: str | None = run.input_message_id
        if takeover and run.status == "cancelling":  # the dead process was already stopping it
            self.cancel_mode = run.cancel_mode or "soft"
        #: Corrections sent into the run, announced but not yet in the history.
        self._steering: list[tuple[str, str]] = []
        #: False once the run is about to end: a correction then gets 409 instead of being lost.
        self.accepting_messages = True
        #: True once the run is parked on an interrupt: this executor is done with it, and a
        #: resume may start the next one even before this task has finished closing.
        self.parked = False

    # -- control ---------------------------------------------------------------------------

    def request_cancel(self, mode: str) -> None:
        """Stop the model stream now; with ``hard`` also cancel executing tools. Idempotent."""
        if self.cancel_mode != "hard":
            self.cancel_mode = mode
        if self._model_scope is not None:
            self._model_scope.cancel()
        if mode == "hard" and self._tools_scope is not None:
            self._tools_scope.cancel()

    def steer(self, content: str) -> str:
        """Queue a user correction: announced now, in the history before the next model call."""
        if not self.accepting_messages or self.cancel_mode:
            raise RunNotActive(f"run {self.run.id!r} is finishing and takes no more messages")
        message_id = new_id("msg")
        self._steering.append((message_id, content))
        if self.log is not None:  # else announced as soon as execution starts
            self.log.emit(UserMessage(message_id=message_id, content=content))
        return message_id

    async def _take_steering(self, history: list[ChatMessage]) -> None:
        """Attach queued corrections to the tree (after the current leaf) and the history."""
        if self._steering:
            await self.log.wait_for_idle()  # their ``user_message`` events first
        while self._steering:
            message_id, content = self._steering.pop(0)
            record = MessageRecord(message_id, self.run.thread_id, self._leaf_id, self.run.id, "user", content)
            await self.store.add_message(record)
            self._leaf_id = record.id
            history.append(ChatMessage("user", content))

    # -- the loop ----------------------------------------------------------------------------

    async def execute(self) -> None:
        """Run to a terminal state or a pause. Outside cancellation propagates, leaving the run as is."""
        log_ = EventLog(self.store, self._bus, self.run.id, next_seq=await self.store.last_seq(self.run.id) + 1)
        log_.start()
        for message_id, content in self._steering:  # corrections that came before the log
            log_.emit(UserMessage(message_id=message_id, content=content))
        self.log = log_
        try:
            if self.resume is None and not self.takeover:
                if not await self.store.mark_running(self.run.id):
                    current = await self.store.get_run(self.run.id)
                    if current.status != "cancelling":
                        return  # someone else owns it, or it is terminal
                    self.cancel_mode = current.cancel_mode or "soft"
                history = to_chat_messages(await self.store.path_to(self.run.thread_id, self.run.input_message_id))
            elif self.resume is not None:
                history = await self._apply_review(self.resume)
            if self.takeover:
                recovered = await self._recover_checkpoint()
                if recovered is WAITING:
                    return
                if isinstance(recovered, Event):
                    await self._finish(recovered)
                    return
                history = recovered  # type: ignore[assignment]
            outcome = await self._loop(history)
            if outcome is not WAITING:
                await self._finish(outcome)  # type: ignore[arg-type]
        except Exception as exc:  # an internal fault: the run fails, the server does not
            log.exception("run %s failed", self.run.id)
            await self._finish(RunError(code="internal_error", message=f"{type(exc).__name__}: {exc}"))
        finally:
            await self.log.aclose()

    async def _loop(self, history: list[ChatMessage]) -> Event | object:
        max_steps = self.config.max_steps or self.agent.max_steps
        tool_specs = self.agent.tool_specs()
        system = [ChatMessage("system", self.agent.system_prompt)] if self.agent.system_prompt else []
        for _ in range(max_steps):
            if self.cancel_mode:
                return self._cancelled_event()
            await self._take_steering(history)
            message_id, text, calls, items, failure = await self._model_turn(ModelRequest(system + history, tool_specs))
            if failure is not None:
                return failure
            if self.cancel_mode and not calls:
                if self._partial_message_id is None:
                    # The answer finished just as the cancel came: a cancelled run has no
                    # finished answer, so it is kept flagged like any partial one.
                    self._partial_message_id = message_id
                    await self.store.update_message(message_id, status="cancelled")
                return self._cancelled_event()
            history.append(ChatMessage("assistant", text, tuple(calls)))
            # Calls that were stored always get their results, even after a cancel request
            # (then ``cancelled``, and nothing new starts): no tool call is left dangling.
            if not calls:
                if self._steering:
                    continue  # a correction arrived during the last turn: one more model call
                self.accepting_messages = False
                return Done(message_id=message_id)
            results = await self._handle_calls(items)
            if results is WAITING:
                return WAITING
            history.extend(results)  # type: ignore[arg-type]
            if self.cancel_mode:
                return self._cancelled_event()
        return RunError(code="max_steps_exceeded", message=f"the run made {max_steps} model calls without finishing")

    async def _model_turn(self, request: ModelRequest) -> tuple[str, str, list[ToolCallRequest], list[dict[str, Any]], Event | None]:
        """One model call: stream deltas as events, announce the calls, store the assistant message.

        The message's final state is stored only once every event announcing it (its tokens and
        its ``tool_call`` events) is durable, so a crash can never leave a stored turn ahead of
        what clients were shown (see :meth:`_store_turn`).
        """
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
                async with aclosing(self.agent.model.stream(request)) as stream:  # type: ignore[type-var]
                    async for delta in stream:
                        if isinstance(delta, TextDelta):
                            if delta.text:
                                parts.append(delta.text)
                                self.log.emit_delta("token", message.id, delta.text)
                        elif isinstance(delta, ThinkingDelta):
                            if delta.text:
                                self.log.emit_delta("thinking", message.id, delta.text)
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
        if scope.cancel_called and failure is None:
            await self._store_turn(message.id, content=text, status="cancelled")
            return message.id, text, [], [], None
        if failure is not None:
            await self._store_turn(message.id, content=text, status="failed")
            return message.id, text, [], [], failure
        items = self._announce_calls(message.id, calls)
        stored_calls = [self._stored_call(c) for c in calls]
        await self._store_turn(message.id, content=text, status="complete", tool_calls=stored_calls or None)
        self._partial_message_id = None
        return message.id, text, calls, items, None

    async def _store_turn(self, message_id: str, **values: Any) -> None:
        """Store a model turn's final state once the events announcing it are durable.

        The event log is the truth: a crash between the two writes leaves a ``partial`` message
        whose announced part recovery reads back from the log, never a stored turn that clients
        were not shown.
        """
        await self.log.wait_for_idle()
        await self.store.update_message(message_id, **values)

    def _stored_call(self, call: ToolCallRequest) -> dict[str, Any]:
        return {"id": call.id, "name": call.name, "args": _json_safe(_masked_args(self.agent.tools.get(call.name), call.args))}

    # -- tools -------------------------------------------------------------------------------

    def _announce_calls(self, message_id: str, calls: list[ToolCallRequest]) -> list[dict[str, Any]]:
        """Validate every call of a turn and emit its ``tool_call`` event; return the call items."""
        threshold = self.config.approval_threshold
        items: list[dict[str, Any]] = []
        for call in calls:
            tool = self.agent.tools.get(call.name)
            item: dict[str, Any] = {"id": call.id, "name": call.name, "args": call.args, "gated": False, "status": None}
            if tool is None:
                item.update(status="error", error=f"unknown tool {call.name!r}; available: {', '.join(self.agent.tools) or 'none'}")
            else:
                try:
                    item["args"] = _json_safe(tool.validate(call.args if isinstance(call.args, dict) else _parse_args(call.args)))
                    item["gated"] = is_gated(tool, threshold)
                except ToolArgsError as exc:
                    item.update(status="error", error=str(exc))
            items.append(item)
            shown = _masked_args(tool, call.args)
            self.log.emit(
                ToolCall(
                    call_id=call.id, name=call.name, args=_json_safe(shown) if isinstance(shown, dict) else {"_raw": shown},
                    risk=tool.risk if tool else "read_only", gated=item["gated"], message_id=message_id,
                )
            )
        return items

    async def _handle_calls(self, items: list[dict[str, Any]]) -> list[ChatMessage] | object:
        """Answer the invalid calls; run the ungated ones; park on the gated ones."""
        for item in items:
            if item["status"] == "error":
                self.log.emit(tool_result_event(item))
        await self._execute([i for i in items if i["status"] is None and not i["gated"]], audited=False)
        gated = [i for i in items if i["status"] is None and i["gated"]]
        if gated and not self.cancel_mode:
            if await self._park(items, gated):
                return WAITING
        return await self._settle(items)

    async def _execute(self, items: list[dict[str, Any]], *, audited: bool) -> None:
        """Run the calls of ``items`` concurrently (each gets a status and a ``tool_result``)."""
        if not items or self.cancel_mode:
            return  # after a cancel request nothing new starts; _settle marks them cancelled
        self.log.emit(Status(stage="tool", detail=", ".join(i["name"] for i in items)))
        with anyio.CancelScope() as scope:
            self._tools_scope = scope
            if self.cancel_mode == "hard":
                scope.cancel()
            try:
                async with anyio.create_task_group() as tg:
                    for item in items:
                        tg.start_soon(self._run_tool, item)
            finally:
                self._tools_scope = None
        if audited:
            await self.store.add_audit(
                [
                    AuditEntry(
                        "tool_executed", "system", self.run.thread_id, self.run.id, self.resume.id if self.resume else None,
                        i["id"], i["name"], args_digest(self.agent.tools[i["name"]].mask(i["args"])), outcome=i["status"] or "cancelled",
                    )
                    for i in items
                ]
            )

    async def _run_tool(self, item: dict[str, Any]) -> None:
        tool: Tool = self.agent.tools[item["name"]]
        ctx = ToolContext(run_id=self.run.id, thread_id=self.run.thread_id, call_id=item["id"])
        try:
            value = await tool.call(tool.validate(item["args"]), ctx)
        except anyio.get_cancelled_exc_class():
            item.update(status="cancelled", reason="run cancelled (hard)")
            self.log.emit(tool_result_event(item))
            raise
        except Exception as exc:
            item.update(status="error", error=f"{type(exc).__name__}: {exc}")
        else:
            item.update(status="ok", result=_json_safe(value))
        self.log.emit(tool_result_event(item))

    async def _park(self, items: list[dict[str, Any]], gated: list[dict[str, Any]]) -> bool:
        """Open one interrupt for the gated calls; False if a cancel came first.

        Corrections queued so far travel with the parked turn and join the history after the
        tool results when the run resumes; from here on, new ones get 409 (the run waits).
        """
        self.accepting_messages = False
        tools = [self.agent.tools[i["name"]] for i in gated]
        ttl = self.config.approval_ttl_s or min(t.approval_ttl_s for t in tools)
        now = utcnow()
        expires = now + timedelta(seconds=ttl)
        interrupt_id = new_id("int")
        requests = [action_request(t, i["id"], i["args"]) for t, i in zip(tools, gated)]
        for request, item in zip(requests, gated):
            if item.get("outcome_unknown"):
                request["outcome_unknown"] = True
                request["description"] = "Outcome unknown — the server stopped while this ran. Run it again? " + request["description"]
        configs = [review_config(t) for t in tools]
        await self.log.wait_for_idle()
        event = self.log.seal(Interrupt(interrupt_id=interrupt_id, action_requests=requests, review_configs=configs, expires_at=format_ts(expires)))
        record = InterruptRecord(
            interrupt_id, self.run.id, self.run.thread_id, "pending", requests, configs,
            {"assistant_message_id": self._leaf_id, "calls": items, "steering": self._steering}, None, None, now, expires, None,
        )
        if await self.store.open_interrupt(record, event):
            self.parked = True
            self.log.publish_final(event)
            self._steering = []
            return True
        self.log.unseal(event)
        return False

    async def _settle(self, items: list[dict[str, Any]]) -> list[ChatMessage]:
        """Give every unsettled call the ``cancelled`` result, store one tool message per call
        in the model's order, and return them as history."""
        for item in items:
            if item["status"] is None:
                item.update(status="cancelled", reason="run cancelled before it ran")
                self.log.emit(tool_result_event(item))
        await self.log.wait_for_idle()  # results are stored only once they are announced
        history: list[ChatMessage] = []
        for item in items:
            record = tool_message(item, thread_id=self.run.thread_id, run_id=self.run.id, parent_id=self._leaf_id)
            await self.store.add_message(record)
            self._leaf_id = record.id
            history.append(ChatMessage("tool", record.content, (), item["id"], item["name"]))
        return history

    async def _apply_review(self, interrupt: InterruptRecord) -> list[ChatMessage]:
        """Carry out the decisions (or the expiry) of a resolved interrupt, then rebuild history."""
        self._leaf_id = interrupt.turn["assistant_message_id"]
        items: list[dict[str, Any]] = interrupt.turn["calls"]
        to_run: list[dict[str, Any]] = []
        for item in items:
            if item["status"] is not None or not item["gated"]:
                continue
            decision = item.get("decision") or {"decision": "expired"}
            kind = decision["decision"]
            if kind in ("approve", "edit"):
                if kind == "edit":
                    item["args"] = decision["args"]
                to_run.append(item)
                continue
            if item.get("outcome_unknown") and kind in ("reject", "expired"):
                # Not run again; whether its first run had an effect stays unknown.
                item.update(status="unknown", reason=decision.get("reason") or "outcome unknown after a crash; not run again")
            elif kind == "reject":
                item.update(status="rejected", reason=decision.get("reason") or "rejected by reviewer")
            elif kind == "respond":
                item.update(status="responded", result=decision["message"])
            else:
                item.update(status="expired", reason="the approval window closed; the action was not executed")
            self.log.emit(tool_result_event(item))
        await self._execute(to_run, audited=True)
        await self._settle(items)
        self._steering = [tuple(m) for m in interrupt.turn.get("steering", [])]  # type: ignore[misc]
        return to_chat_messages(await self.store.path_to(self.run.thread_id, self._leaf_id))

    # -- takeover ----------------------------------------------------------------------------

    async def _recover_checkpoint(self) -> list[ChatMessage] | Event | object:
        """Continue a run whose process died, from its last checkpoint.

        The event log is the truth: what the store holds is repaired toward what was logged
        (what clients could see), never the other way round. Checkpoints are the step
        boundaries the store and the log agree on: complete messages whose text and tool calls
        were all announced, and tool results that were logged.

        - A tool message of this run whose ``tool_result`` was never logged is cut off the path;
          its call counts as unanswered.
        - The last model turn, if the store is not sure it ended (``partial``, ``failed``, or
          ``complete`` but ahead of the log): when its ``tool_call`` events were logged, its
          stream had ended, so it is rebuilt from the log (text and calls) as ``complete``.
          Otherwise it is half-finished: dropped (kept as a ``failed`` sibling, off the active
          path) and announced with a ``status: recovering`` event naming it, so clients discard
          its tokens; in a cancelling run it is kept, flagged ``cancelled``.
        - Unanswered calls of the last turn: read-only ones run again; a gated one that was
          never put to a human is put to one now; any other one may have had its effect, so it
          is never re-run on its own: it goes back to a human as a new interrupt marked
          ``outcome_unknown``.
        - A final answer that was stored and announced, with only its ``done`` lost, is not
          asked for again: the run ends with ``done`` naming it.
        """
        logged = await _LoggedRun.read(self.store, self.run.id)
        thread = await self.store.get_thread(self.run.thread_id)
        path = await self.store.path_to(self.run.thread_id, thread.active_leaf_id)
        cut = next((i for i, m in enumerate(path) if m.run_id == self.run.id and m.role == "tool" and m.tool_call_id not in logged.results), None)
        if cut is not None:
            path = path[:cut]
            await self.store.move_active_leaf(self.run.thread_id, path[-1].id if path else None)
        discarded: str | None = None
        last = path[-1] if path else None
        if last is not None and last.role == "assistant" and last.run_id == self.run.id and not logged.agrees_with(last):
            text = logged.text_of(last.id)
            announced = logged.calls.get(last.id)
            if announced:
                calls = [{"id": c["call_id"], "name": c["name"], "args": c["args"]} for c in announced]
                await self.store.update_message(last.id, content=text, status="complete", tool_calls=calls)
            elif self.cancel_mode:  # the run ends here: its partial answer stays, flagged
                await self.store.update_message(last.id, content=text, status="cancelled")
                self._partial_message_id = last.id
            else:
                path.pop()
                await self.store.update_message(last.id, content=text, status="failed")
                await self.store.move_active_leaf(self.run.thread_id, path[-1].id if path else None)
                discarded = last.id
        self.log.emit(
            Status(stage="recovering", detail="continuing from the last checkpoint after the server stopped", discard_message_id=discarded)
        )
        self._leaf_id = path[-1].id if path else None
        path = await self.store.path_to(self.run.thread_id, self._leaf_id)
        last = path[-1] if path else None
        if last is not None and last.role == "assistant" and last.run_id == self.run.id and last.status == "complete" and not last.tool_calls:
            # The final answer was stored and announced; only its ``done`` was lost.
            self.accepting_messages = False
            return Done(message_id=last.id)
        turn = next(
            (i for i in range(len(path) - 1, -1, -1) if path[i].role == "assistant" and path[i].tool_calls and path[i].run_id == self.run.id),
            None,
        )
        if turn is not None:
            answered = {m.tool_call_id for m in path[turn + 1 :] if m.role == "tool"}
            missing = [c for c in path[turn].tool_calls or () if c["id"] not in answered]
            if missing:
                parked = await self._recover_calls(missing, logged)
                if parked:
                    return WAITING
        return to_chat_messages(await self.store.path_to(self.run.thread_id, self._leaf_id))

    async def _recover_calls(self, missing: list[dict[str, Any]], logged: _LoggedRun) -> bool:
        """Settle the calls a dead process left without a stored result; True if parked."""
        latest = await self.store.latest_interrupt(self.run.id)
        known = {c["id"]: c for c in (latest.turn["calls"] if latest is not None else [])}
        items: list[dict[str, Any]] = []
        to_run: list[dict[str, Any]] = []
        to_review: list[dict[str, Any]] = []
        for call in missing:
            tool = self.agent.tools.get(call["name"])
            real = known.get(call["id"])
            item: dict[str, Any] = {"id": call["id"], "name": call["name"], "args": real["args"] if real else call["args"], "gated": False, "status": None}
            items.append(item)
            decision = (real or {}).get("decision") or {}
            args_known = real is not None or (tool is not None and not tool.sensitive_args)
            announced = logged.announced.get(call["id"])
            if call["id"] in logged.results:  # finished and announced before the crash
                data = logged.results[call["id"]]
                item.update(status=data["status"], result=data.get("result"), error=data.get("error"), reason=data.get("reason"))
            elif tool is None:
                item.update(status="error", error=f"unknown tool {call['name']!r}")
                self.log.emit(tool_result_event(item))
            elif decision.get("decision") in ("reject", "respond", "expired"):  # decided, never run
                status = {"reject": "rejected", "respond": "responded", "expired": "expired"}[decision["decision"]]
                item.update(status=status, result=decision.get("message"), reason=decision.get("reason"))
                self.log.emit(tool_result_event(item))
            elif tool.risk == "read_only" and args_known:
                to_run.append(item)
            elif real is None and announced is not None and announced.get("gated") and args_known:
                # Gated and never put to a human, so it never ran: it goes to review as usual.
                item.update(gated=True)
                to_review.append(item)
            elif args_known:
                item.update(gated=True, outcome_unknown=True)
                to_review.append(item)
            else:  # its real arguments were never stored (sensitive, ungated): cannot be re-run
                item.update(status="unknown", reason="the server stopped while this ran; its outcome is unknown")
                self.log.emit(tool_result_event(item))
        await self._execute(to_run, audited=False)
        if to_review and not self.cancel_mode and await self._park(items, to_review):
            return True
        await self._settle(items)
        return False

    # -- the end -----------------------------------------------------------------------------

    def _cancelled_event(self) -> Event:
        return Cancelled(mode=self.cancel_mode or "soft", partial_message_id=self._partial_message_id)  # type: ignore[arg-type]

    async def _finish(self, outcome: Event) -> None:
        """Commit the terminal event with the final status; a requested cancel always wins."""
        self.accepting_messages = False
        try:
            await self.log.wait_for_idle()
            if self._steering:  # announced corrections are never dropped: they join the tree
                await self._take_steering([])
        except RuntimeError:
            # The log could not commit: end the run right after what *is* stored, so followers
            # still get a terminal event and seq stays gapless.
            self.log.restart_at(await self.store.last_seq(self.run.id) + 1)
            outcome = RunError(code="event_log_failed", message="the event log could not be written", retryable=True)
        if isinstance(outcome, Done):
            status, allowed = "completed", ("running",)
        elif isinstance(outcome, RunError):
            status, allowed = "failed", ("running",)
        else:
            status, allowed = "cancelled", ("cancelling",)
        if status != "cancelled":
            final = self.log.seal(outcome)
            error = {"code": outcome.code, "message": outcome.message} if isinstance(outcome, RunError) else None
            if await self.store.finish_run(self.run.id, status=status, final_event=final, from_statuses=allowed, error=error, as_executor=True):
                self.log.publish_final(final)
                return
            self.log.unseal(final)  # not written: its seq is still free
            # The run is no longer `running`: a cancel was committed first. It wins.
            if self._partial_message_id is None and isinstance(outcome, Done) and outcome.message_id:
                self._partial_message_id = outcome.message_id
                await self.store.update_message(outcome.message_id, status="cancelled")
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
        if await self.store.finish_run(self.run.id, status="cancelled", final_event=final, from_statuses=("cancelling",), as_executor=True):
            self.log.publish_final(final)


class _LoggedRun:
    """What a run's event log announced: the ground truth that recovery repairs the store to."""

    def __init__(self) -> None:
        #: Token texts per assistant message.
        self.tokens: dict[str, list[str]] = {}
        #: ``tool_call`` data per assistant message, in order, and per call id.
        self.calls: dict[str, list[dict[str, Any]]] = {}
        self.announced: dict[str, dict[str, Any]] = {}
        #: ``tool_result`` data per call id.
        self.results: dict[str, dict[str, Any]] = {}

    @classmethod
    async def read(cls, store: Store, run_id: str) -> _LoggedRun:
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
                    logged.announced[data["call_id"]] = data
                    if data.get("message_id"):
                        logged.calls.setdefault(data["message_id"], []).append(data)
                else:
                    logged.results[data["call_id"]] = data
        return logged

    def text_of(self, message_id: str) -> str:
        """The text announced for a message."""
        return "".join(self.tokens.get(message_id, ()))

    def agrees_with(self, message: MessageRecord) -> bool:
        """True if a stored turn is ``complete`` and everything in it was announced."""
        return (
            message.status in ("complete", "cancelled")
            and message.content == self.text_of(message.id)
            and all(c["id"] in self.announced for c in message.tool_calls or ())
        )


def _masked_args(tool: Tool | None, args: dict[str, Any] | str) -> Any:
    """The call's args as events and the stored history show them: sensitive values masked.

    Args given as JSON text are parsed first (they are what the tool will get); text that does
    not parse is shown as is, unless the tool has sensitive args: then it may hold one, unmasked.
    """
    if isinstance(args, str):
        parsed = _parse_args(args)
        if not isinstance(parsed, dict):
            return "****" if tool is not None and tool.sensitive_args else args
        args = parsed
    return tool.mask(args) if tool is not None else args


def _parse_args(raw: str) -> Any:
    try:
        return json.loads(raw) if raw.strip() else {}
    except ValueError:
        return raw
