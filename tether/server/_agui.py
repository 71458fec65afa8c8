"""AG-UI routes: ``POST /v1/agui``, ``POST /v1/agui/connect``, ``GET /v1/agui/capabilities``.

HTTP only: which Tether operation a ``RunAgentInput`` asks for (start a run on the matched
history, or resume an interrupt), and the stream that follows the run through
:class:`~tether.agui.EventMapper` (the mapping itself lives in :mod:`tether.agui`). A request
whose body is not a ``RunAgentInput`` gets the usual error response; anything the conversation's
state refuses (a history that does not match, a busy thread, an interrupt already decided or
expired) is an AG-UI ``RUN_ERROR`` carrying Tether's error code, as AG-UI clients expect it.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from typing import Any

from fastapi import APIRouter, Header, Request
from pydantic import ValidationError

from .. import __version__
from ..agui import (
    PROTOCOL_VERSION,
    Cursor,
    EventMapper,
    Frame,
    agui_interrupt_id,
    agui_messages,
    decisions_for,
    parked_messages,
    path_before_run,
    plan_run,
    speaks_cancelled_outcome,
    tether_interrupt_id,
)
from ..errors import Conflict, FieldError, InvalidRequest, NotFound, TetherError
from ..runtime import Runtime, StreamEnded
from ..sse import PING
from ..store import RunRecord, Store, ThreadRecord
from ._access import Access
from ._deps import access_of, actor_of, runtime_of, sse_ping_s_of
from ._errors import status_for
from ._openapi import AGUI_STREAM
from ._schemas import AguiRunInput, AguiTetherProps, ResumeThread, decision_of
from ._sse import SSE_HEADERS, EventStreamResponse, stopping_comment


class EventStream(EventStreamResponse):
    """How the OpenAPI document learns that a route answers with an event stream, not JSON."""


router = APIRouter(tags=["ag-ui"])

#: The largest seq a run can have (as for ``GET /v1/runs/{id}/events``).
MAX_SEQ = 2**31 - 1


# -- helpers -----------------------------------------------------------------------------------


def _props(body: AguiRunInput) -> AguiTetherProps:
    try:
        return body.tether_props()
    except ValidationError as exc:
        fields = [FieldError(("forwardedProps", "tether", *e["loc"]), e["msg"], e["type"]) for e in exc.errors(include_url=False, include_input=False)]
        raise InvalidRequest("invalid forwardedProps.tether", code="validation_error", fields=fields) from None


def _mapper(request: Request, body: AguiRunInput) -> EventMapper:
    return EventMapper(
        thread_id=body.thread_id,
        agui_run_id=body.run_id,
        tools=runtime_of(request).agent.tools,
        cancelled_outcome=speaks_cancelled_outcome(body.protocol_version),
    )


def _response(body: AsyncGenerator[str, None], run_id: str | None = None) -> EventStreamResponse:
    headers = dict(SSE_HEADERS)
    if run_id is not None:
        headers["X-Tether-Run-Id"] = run_id
    return EventStreamResponse(body, headers=headers)


async def _frames(frames: Sequence[Frame]) -> AsyncGenerator[str, None]:
    yield "".join(f.encode() for f in frames)


def _error_frames(body: AguiRunInput, exc: TetherError) -> list[Frame]:
    """A refused request as an AG-UI run: ``RUN_STARTED``, then ``RUN_ERROR`` with the code."""
    tether: dict[str, Any] = {"status": status_for(exc)}
    if exc.fields:
        tether["details"] = [{"loc": ["body", *f.loc], "msg": f.msg, "type": f.type} for f in exc.fields]
    elif exc.details is not None:
        tether["details"] = exc.details
    base = {"run_id": None, "seq": 0, "type": "refused"}
    started = {
        "type": "RUN_STARTED",
        "threadId": body.thread_id,
        "runId": body.run_id,
        "protocolVersion": PROTOCOL_VERSION,
        "metadata": {"tether": {**base, "event_id": "0.1"}},
    }
    error = {"type": "RUN_ERROR", "message": exc.message, "code": exc.code, "metadata": {"tether": {**base, "event_id": "0", **tether}}}
    return [Frame("0.1", started), Frame("0", error)]


def _sync_frames(body: AguiRunInput, messages: list[dict[str, Any]], run: RunRecord | None, last_seq: int) -> list[Frame]:
    """``connect`` with nothing running: the conversation as one short AG-UI run."""
    tether = {"run_id": run.id if run else None, "seq": last_seq, "event_id": str(last_seq), "type": "sync"}
    meta = {"tether": tether}
    ident = {"threadId": body.thread_id, "runId": body.run_id}
    return [
        Frame(str(last_seq), {"type": "RUN_STARTED", **ident, "protocolVersion": PROTOCOL_VERSION, "metadata": meta}),
        Frame(str(last_seq), {"type": "MESSAGES_SNAPSHOT", "messages": messages, "metadata": meta}),
        Frame(str(last_seq), {"type": "RUN_FINISHED", **ident, "outcome": {"type": "success"}, "metadata": meta}),
    ]


async def _thread_for_run(access: Access, thread_id: str) -> ThreadRecord:
    """The thread ``thread_id`` the caller may start runs on, created (under that id, owned by
    the caller) when it does not exist yet."""
    try:
        return await access.thread(thread_id, to="write")
    except NotFound:
        pass
    try:
        return await access.store.create_thread(owner=access.principal.name, metadata={"agui": True}, thread_id=thread_id)
    except Conflict:  # someone else's (or created a moment ago by a racing request)
        return await access.thread(thread_id, to="write")


async def _stream(
    store: Store,
    runtime: Runtime,
    mapper: EventMapper,
    run_id: str,
    *,
    cursor: Cursor,
    catch_up: bool,
    snapshot: list[dict[str, Any]] | None,
    ping_s: float,
) -> AsyncGenerator[str, None]:
    """Frames of ``run_id`` after ``cursor``, live, until the AG-UI run the client is in ends:
    the run's terminal event, or an interrupt that nothing has answered yet.

    With ``catch_up`` the mapper first reads the log up to the cursor silently (its state is then
    the client's), and the stream opens with :meth:`EventMapper.reopen`. ``snapshot`` (the
    messages before the run) goes out as ``MESSAGES_SNAPSHOT`` right after the first
    ``RUN_STARTED``, followed by what the run's frames built up to there.
    """
    out: list[str] = []
    last = cursor.done_seq

    def emit(frames: Sequence[Frame]) -> None:
        nonlocal snapshot
        for frame in frames:
            mapper.apply(frame)
            out.append(frame.encode())
            if snapshot is not None and frame.type == "RUN_STARTED":
                tether = {**frame.event["metadata"]["tether"], "type": "snapshot"}
                messages = snapshot + mapper.transcript.messages()
                out.append(Frame(frame.id, {"type": "MESSAGES_SNAPSHOT", "messages": messages, "metadata": {"tether": tether}}).encode())
                snapshot = None

    async def paused() -> bool:
        """True when the client's AG-UI run is over: terminal, or an interrupt with nothing after it."""
        if mapper.terminal:
            return True
        return not mapper.in_segment and mapper.ended == "interrupt" and await store.last_seq(run_id) <= last

    if catch_up and cursor.seq > 0:
        mapper.live = False
        after = 0
        while after < cursor.seq:
            page = await store.read_events(run_id, after_seq=after, limit=min(1000, cursor.seq - after))
            if not page:
                break
            for stored in page:
                if stored.seq <= cursor.done_seq:
                    mapper.feed(stored)
                else:  # the event the client has only the first frames of
                    frames = mapper.frames_for(stored)
                    assert cursor.frames is not None
                    for frame in frames[: cursor.frames]:
                        mapper.apply(frame)
                    mapper.live = True
                    emit(mapper.reopen(cursor))
                    emit(frames[cursor.frames :])
                    last = stored.seq
            after = page[-1].seq
        if not mapper.live:
            mapper.live = True
            emit(mapper.reopen(cursor))
        if out:
            yield "".join(out)
            out.clear()
    if await paused():
        return
    try:
        async for batch in runtime.feed(run_id).follow(after_seq=max(last, cursor.seq), idle_timeout=ping_s):
            if not batch:
                yield PING
                continue
            for stored in batch:
                emit(mapper.frames_for(stored))
                last = stored.seq
            if out:
                yield "".join(out)
                out.clear()
            if await paused():
                return
    except StreamEnded:
        # This process is stopping: the client reconnects (``/v1/agui/connect``) from its last event id.
        yield stopping_comment(last)


# -- routes ------------------------------------------------------------------------------------


@router.get("/v1/agui/capabilities")
async def capabilities(request: Request) -> dict[str, Any]:
    """What this agent supports, as AG-UI's ``AgentCapabilities``."""
    tools = runtime_of(request).agent.tools
    return {
        "identity": {"name": "Tether", "type": "tether", "version": __version__},
        "transport": {"streaming": True, "resumable": True},
        "tools": {
            "supported": True,
            "items": [{"name": t.name, "description": t.description, "parameters": t.json_schema()} for t in tools.values()],
            "parallelCalls": True,
            "clientProvided": False,
        },
        "reasoning": {"supported": True, "streaming": True},
        "humanInTheLoop": {"supported": True, "approvals": True, "interrupts": True, "approveWithEdits": True, "interventions": True},
        "custom": {
            "tether": {
                "protocolVersion": PROTOCOL_VERSION,
                "connect": "/v1/agui/connect",
                "cancel": "/v1/runs/{run_id}/cancel",
                "eventIds": "<seq> or <seq>.<k>; also in metadata.tether.event_id",
            }
        },
    }


@router.post("/v1/agui", response_model=None, response_class=EventStream, responses=AGUI_STREAM)
async def run_agent(request: Request, body: AguiRunInput) -> EventStreamResponse:
    """Run the agent on an AG-UI ``RunAgentInput``: a new run on the matched history, or — with
    ``resume`` — the interrupted run continued with the answers; its AG-UI events stream back."""
    access, runtime, actor = access_of(request), runtime_of(request), actor_of(request)
    store = access.store
    props = _props(body)
    mapper = _mapper(request, body)
    try:
        if body.resume:
            run_id, after, snapshot = await _resume(access, runtime, body, actor)
            stream = _stream(store, runtime, mapper, run_id, cursor=Cursor(after), catch_up=False, snapshot=snapshot, ping_s=sse_ping_s_of(request))
            return _response(stream, run_id)
        run, snapshot = await _start(access, runtime, body, props, actor)
    except TetherError as exc:
        return _response(_frames(_error_frames(body, exc)))
    stream = _stream(store, runtime, mapper, run.id, cursor=Cursor(0), catch_up=False, snapshot=snapshot, ping_s=sse_ping_s_of(request))
    return _response(stream, run.id)


async def _start(access: Access, runtime: Runtime, body: AguiRunInput, props: AguiTetherProps, actor: str) -> tuple[RunRecord, list[dict[str, Any]]]:
    """Start the run the client's message list asks for; the messages it starts from."""
    store = access.store
    thread = await _thread_for_run(access, body.thread_id)
    pending = await store.pending_interrupts(thread_ids=[thread.id])
    if pending:
        ids = [agui_interrupt_id(i.id, r.call_id) for i in pending for r in i.action_requests]
        raise Conflict("the thread waits for answers to its interrupts: send them as resume", code="interrupt_pending", details={"interrupts": ids})
    attach = plan_run([m.model_dump(by_alias=True) for m in body.messages], await store.thread_messages(thread.id), thread.active_leaf_id)
    run = await runtime.start_run(thread.id, attach=attach, config=props.config, requester=actor)
    return run, agui_messages(await store.path_to(thread.id, run.input_message_id))


async def _resume(access: Access, runtime: Runtime, body: AguiRunInput, actor: str) -> tuple[str, int, list[dict[str, Any]]]:
    """Decide the interrupt the resume entries answer; the run, the seq to stream after, and the
    messages as they were at the pause (the resumed run sends results of calls the client saw in
    the interrupted one)."""
    assert body.resume
    store = access.store
    thread = await access.thread(body.thread_id)
    interrupt_ids = {tether_interrupt_id(e.interrupt_id) for e in body.resume}
    if len(interrupt_ids) != 1:
        raise InvalidRequest("the resume entries answer interrupts of different pauses", code="invalid_resume", details={"interrupts": sorted(interrupt_ids)})
    interrupt = await access.interrupt_to_decide(thread.id, interrupt_ids.pop())
    decisions = decisions_for(interrupt.action_requests, interrupt.id, [e.model_dump(by_alias=True) for e in body.resume])
    try:
        checked = ResumeThread.model_validate({"interrupt_id": interrupt.id, "decisions": decisions})
    except ValidationError as exc:
        fields = [FieldError(tuple(e["loc"]), e["msg"], e["type"]) for e in exc.errors(include_url=False, include_input=False)]
        raise InvalidRequest("invalid resume payload", code="invalid_resume_payload", fields=fields) from None
    after = await store.last_seq(interrupt.run_id)  # the run is parked: nothing is appended until the resume
    snapshot = parked_messages(await store.path_to(thread.id, thread.active_leaf_id), interrupt)
    await runtime.resume(thread.id, interrupt.id, [decision_of(d) for d in checked.decisions], actor=actor)
    return interrupt.run_id, after, snapshot


@router.post("/v1/agui/connect", response_model=None, response_class=EventStream, responses=AGUI_STREAM)
async def connect(request: Request, body: AguiRunInput, last_event_id: str | None = Header(default=None, alias="Last-Event-ID")) -> EventStreamResponse:
    """Reattach to a thread: with ``Last-Event-ID``, the frames after it (open messages reopened
    first); without, the messages so far as a snapshot and the latest run's events, live."""
    access, runtime = access_of(request), runtime_of(request)
    store = access.store
    cursor = _cursor(last_event_id)
    props = _props(body)
    mapper = _mapper(request, body)
    try:
        thread = await access.thread(body.thread_id)
        runs = await store.list_runs(thread.id)
        if props.run_id is not None:
            run = next((r for r in runs if r.id == props.run_id), None)
            if run is None:
                raise NotFound(f"run {props.run_id!r} not found in thread {thread.id!r}", code="run_not_found")
        else:
            run = runs[-1] if runs else None
    except TetherError as exc:
        return _response(_frames(_error_frames(body, exc)))
    ping_s = sse_ping_s_of(request)
    if cursor is not None and run is not None:
        before = agui_messages(await store.path_to(thread.id, run.input_message_id))
        stream = _stream(store, runtime, mapper, run.id, cursor=cursor, catch_up=True, snapshot=before, ping_s=ping_s)
        return _response(stream, run.id)
    path = await store.path_to(thread.id, thread.active_leaf_id)
    if run is None or run.terminal:
        last_seq = await store.last_seq(run.id) if run is not None else 0
        return _response(_frames(_sync_frames(body, agui_messages(path), run, last_seq)), run.id if run else None)
    snapshot = agui_messages(path_before_run(path, run))
    stream = _stream(store, runtime, mapper, run.id, cursor=Cursor(0), catch_up=False, snapshot=snapshot, ping_s=ping_s)
    return _response(stream, run.id)


def _cursor(last_event_id: str | None) -> Cursor | None:
    if last_event_id is None or not last_event_id.strip():
        return None
    try:
        cursor = Cursor.parse(last_event_id)
    except ValueError:
        raise InvalidRequest(
            "Last-Event-ID must be an event id of this stream: <seq> or <seq>.<k>",
            code="invalid_last_event_id",
            details=[{"loc": ["header", "Last-Event-ID"], "msg": "not an event id", "type": "value_error"}],
        ) from None
    if cursor.seq > MAX_SEQ or (cursor.frames or 0) > 1000:
        raise InvalidRequest(
            f"Last-Event-ID must be an event id with a seq between 0 and {MAX_SEQ}",
            code="invalid_last_event_id",
            details=[{"loc": ["header", "Last-Event-ID"], "msg": "out of range", "type": "less_than_equal"}],
        )
    return cursor
