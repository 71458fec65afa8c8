"""``GET /v1/runs/{run_id}/timeline``: where a run's time went, derived from its event log.

Every envelope carries ``ts`` (when it was emitted, microseconds), so the log alone tells when
the run was queued, each model call (and its time to the first token), each tool (its tier,
whether it ran), each wait for a person (who decided, how long it took) and the end; the time
a cancel was *requested* is not an event, so it comes from the run's ``cancel`` audit entries.
No tracing backend is needed.

The rules are those of the web UI's ``static/run-timeline.js`` (the UI derives the same
timeline in the browser from the same two logs; ``tests/test_ui.py`` checks that both give the
same answer for the same run). Times are milliseconds from the run's ``run_started`` (exact to
the microsecond); ``first_token_ms`` counts from the start of its model call. A segment still
under way (the run has not ended) is ``open`` and runs to the time of the request.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi import APIRouter, Request

from .._ids import utcnow
from ..events import format_ts
from ..store import AuditEntry
from ._deps import access_of

__all__ = ["router", "TimelineBuilder", "ts_us"]

router = APIRouter(tags=["runs"])

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_PAGE = 1000
_TERMINAL = {"done": "completed", "error": "failed", "cancelled": "cancelled"}
#: ``status`` details of a model call that tries again (it stays one call).
_RETRY_PREFIXES = ("retrying", "asking the model again")


def ts_us(ts: str) -> int:
    """Microseconds since the epoch of a wire timestamp (``2026-11-30T20:00:00.123456Z``)."""
    return (datetime.fromisoformat(ts.replace("Z", "+00:00")) - _EPOCH) // timedelta(microseconds=1)


class TimelineBuilder:
    """Folds a run's events, in seq order, into its timeline (:meth:`add`, then :meth:`finish`)."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.t0: int | None = None
        self.order = 0
        self.segments: list[dict[str, Any]] = []
        self.queued: dict[str, Any] | None = None
        self.model: dict[str, Any] | None = None
        self.models = 0
        self.calls: dict[str, dict[str, Any]] = {}
        self.released: set[str] = set()
        self.human: dict[str, Any] | None = None
        self.end: tuple[str, int, dict[str, Any]] | None = None

    def wants(self, event_type: str) -> bool:
        """False for an event that cannot change the timeline (a text delta after the first of
        its model call): the route skips reading it."""
        return event_type not in ("token", "thinking") or (self.model is not None and self.model["_first"] is None)

    def _segment(self, kind: str, start: int, **fields: Any) -> dict[str, Any]:
        self.order += 1
        segment = {"kind": kind, "_start": start, "_end": None, "_order": self.order, **fields}
        self.segments.append(segment)
        return segment

    def _close_model(self, at: int, outcome: str | None = None) -> None:
        model = self.model
        if model is None:
            return
        model["_end"] = at
        model["outcome"] = outcome or ("tool_calls" if model["tool_calls"] else "answer")
        self.model = None

    def add(self, event_type: str, ts: str, data: dict[str, Any]) -> None:
        """One event (its ``type``, ``ts`` and ``data``)."""
        at = ts_us(ts)
        if self.t0 is None:
            self.t0 = at
        if event_type == "run_started":
            self.queued = self._segment("queued", at)
            return
        if self.queued is not None:
            self.queued["_end"] = at
            self.queued = None
        if event_type == "status":
            stage = data.get("stage")
            detail = data.get("detail")
            if stage == "model":
                if self.model is not None and detail is not None:
                    if str(detail).startswith(_RETRY_PREFIXES):
                        self.model["retries"] += 1
                    return
                self._close_model(at)
                self.models += 1
                self.model = self._segment(
                    "model", at, index=self.models, message_id=None, first_token_ms=None, tool_calls=0, retries=0, outcome=None, _first=None
                )
            elif stage == "tool":
                self._close_model(at)
                names = {n.strip() for n in str(detail or "").split(",") if n.strip()}
                for call in self.calls.values():
                    eligible = not call["gated"] or call["call_id"] in self.released
                    if call["_start"] is None and call["_end"] is None and eligible and (not names or call["name"] in names):
                        call["_start"] = at
                        call["ran"] = True
            elif stage == "recovering":
                self._close_model(at, "interrupted")
                self._segment("recovering", at)["_end"] = at
        elif event_type in ("token", "thinking", "tool_call"):
            model = self.model
            if model is not None:
                if model["_first"] is None:
                    model["_first"] = at
                if model["message_id"] is None:
                    model["message_id"] = data.get("message_id")
                if event_type == "tool_call":
                    model["tool_calls"] += 1
            if event_type == "tool_call":
                call_id = str(data.get("call_id"))
                self.order += 1
                self.calls[call_id] = call = {
                    "kind": "tool",
                    "call_id": call_id,
                    "name": data.get("name"),
                    "tier": data.get("risk"),
                    "gated": bool(data.get("gated")),
                    "allowed_by": data.get("allowed_by"),
                    "status": None,
                    "ran": False,
                    "_start": None,
                    "_end": None,
                    "_order": self.order,
                }
                self.segments.append(call)
        elif event_type == "tool_result":
            self._close_model(at)
            call_id = str(data.get("call_id"))
            found = self.calls.get(call_id)
            if found is None:  # a result without its call (cut off by a crash): shown as it came
                self.order += 1
                found = {
                    "kind": "tool",
                    "call_id": call_id,
                    "name": data.get("name"),
                    "tier": None,
                    "gated": False,
                    "allowed_by": None,
                    "_start": None,
                    "_order": self.order,
                }
                self.calls[call_id] = found
                self.segments.append(found)
            found["status"] = data.get("status")
            found["ran"] = found["_start"] is not None
            if found["_start"] is None:
                found["_start"] = at
            found["_end"] = at
        elif event_type == "interrupt":
            self._close_model(at)
            actions = [
                {"call_id": a.get("call_id"), "name": a.get("action"), "decision": None} for a in data.get("action_requests") or [] if isinstance(a, dict)
            ]
            self.human = self._segment("human", at, interrupt_id=data.get("interrupt_id"), actor=None, resolution="pending", actions=actions)
        elif event_type == "resumed":
            human = self.human
            decisions = {d.get("call_id"): d.get("decision") for d in data.get("decisions") or [] if isinstance(d, dict)}
            self.released.update(str(call_id) for call_id, decision in decisions.items() if decision in ("approve", "edit"))
            if human is not None and human["interrupt_id"] == data.get("interrupt_id"):
                human["_end"] = at
                human["actor"] = data.get("actor")
                human["resolution"] = data.get("resolution")
                for action in human["actions"]:
                    action["decision"] = decisions.get(action["call_id"])
                self.human = None
        elif event_type == "user_message":
            self._segment("steering", at, message_id=data.get("message_id"))["_end"] = at
        elif event_type in _TERMINAL:
            self._close_model(at, {"done": None, "error": "failed", "cancelled": "cancelled"}[event_type])
            if self.human is not None:
                self.human["_end"] = at
                self.human["resolution"] = "cancelled" if event_type == "cancelled" else "ended"
                self.human = None
            for call in self.calls.values():
                if call["_start"] is not None and call["_end"] is None:
                    call["_end"] = at
            self.end = (event_type, at, data)

    def finish(self, asked: list[tuple[int, str | None, str]], now: int) -> dict[str, Any]:
        """The timeline, given the run's cancel requests (``(at, mode, actor)``, in order) and
        the time of the request (``now``, microseconds) for what is still under way."""
        t0 = self.t0
        if t0 is None:
            return {"run_id": self.run_id, "status": "queued", "started_at": None, "ended_at": None, "duration_ms": 0, "error": None, "segments": []}
        end = self.end
        stop = end[1] if end is not None else max(now, t0)
        if asked:
            first = asked[0]
            cancelled = end is not None and end[0] == "cancelled"
            self._segment(
                "cancel",
                first[0],
                mode=end[2].get("mode") if cancelled and end is not None else asked[-1][1],
                actor=end[2].get("actor") if cancelled and end is not None else first[2],
                reason=end[2].get("reason") if cancelled and end is not None else None,
                landed=cancelled,
                requests=[{"at_ms": max(0, at - t0) / 1000, "mode": mode, "actor": actor} for at, mode, actor in asked],
                _end=end[1] if cancelled and end is not None else None,
            )
        elif end is not None and end[0] == "cancelled":  # when it was asked for is not known
            data = end[2]
            self._segment("cancel", end[1], mode=data.get("mode"), actor=data.get("actor"), reason=data.get("reason"), landed=True, requests=[], _end=end[1])
        if end is not None:
            status = _TERMINAL[end[0]]
        elif self.queued is not None:
            status = "queued"
        elif self.human is not None:
            status = "waiting_human"
        elif asked:
            status = "cancelling"
        else:
            status = "running"
        items = []
        for segment in sorted(self.segments, key=lambda s: (s["_start"] if s["_start"] is not None else stop, s["_order"])):
            start = segment["_start"] if segment["_start"] is not None else stop
            open_ = segment["_end"] is None
            finish = stop if open_ else segment["_end"]
            item = {k: v for k, v in segment.items() if not k.startswith("_")}
            item["start_ms"] = max(0, start - t0) / 1000
            item["duration_ms"] = max(0, finish - start) / 1000
            item["open"] = open_
            if segment["kind"] == "model":
                first_token = segment["_first"]
                item["first_token_ms"] = max(0, first_token - start) / 1000 if first_token is not None else None
                if open_:
                    item["outcome"] = "running"
            if segment["kind"] == "cancel" and not segment["requests"]:
                item["duration_ms"] = None
            items.append(item)
        error = end[2] if end is not None and end[0] == "error" else None
        return {
            "run_id": self.run_id,
            "status": status,
            "started_at": _wire_ts(t0),
            "ended_at": _wire_ts(end[1]) if end is not None else None,
            "duration_ms": max(0, stop - t0) / 1000,
            "error": {"code": error.get("code"), "message": error.get("message")} if error is not None else None,
            "segments": items,
        }


def _wire_ts(us: int) -> str:
    return format_ts(_EPOCH + timedelta(microseconds=us))


def cancel_requests(entries: list[AuditEntry]) -> list[tuple[int, str | None, str]]:
    """``(at, mode, actor)`` of each cancel request of the audit entries, oldest first."""
    found = []
    for entry in entries:
        if entry.action == "cancel" and entry.ts is not None:
            mode = entry.details.get("mode") if isinstance(entry.details, dict) else None
            found.append((ts_us(format_ts(entry.ts)), mode, entry.actor))
    return sorted(found, key=lambda r: r[0])


@router.get("/v1/runs/{run_id}/timeline")
async def run_timeline(request: Request, run_id: str) -> dict[str, Any]:
    """Where the run's time went, from its event log: queued, each model call (time to first
    token, duration), each tool (tier, duration, whether it ran), each wait for a person (who
    decided, how long), a cancel (from its request to the ``cancelled`` event).

    Read like ``GET /v1/runs/{run_id}/events``: whoever may read the run's events may read its
    timeline; 404 ``run_not_found`` otherwise. A run still under way gets the timeline so far.
    """
    access = access_of(request)
    run = await access.run(run_id)
    store = access.store
    builder = TimelineBuilder(run.id)
    after = 0
    while True:
        page = await store.read_events(run.id, after_seq=after, limit=_PAGE)
        for event in page:
            if builder.wants(event.type):
                envelope = json.loads(event.envelope)
                builder.add(envelope["type"], envelope["ts"], envelope.get("data") or {})
        if len(page) < _PAGE:
            break
        after = page[-1].seq
    entries = await store.list_audit(run_id=run.id, limit=10_000)
    now = (utcnow() - _EPOCH) // timedelta(microseconds=1)
    return builder.finish(cancel_requests(entries), now)
