"""The approvals inbox: pending interrupts the caller may decide, and deciding several at once."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Query, Request

from ..errors import NotFound, TetherError
from ..review import Approve, Decision, Reject
from ._deps import access_of, actor_of, runtime_of
from ._errors import status_for
from ._schemas import DecideMany
from ._views import interrupt_view, load_run_view

router = APIRouter(tags=["review"])


@router.get("/v1/interrupts")
async def inbox(
    request: Request,
    status: Literal["pending"] = Query(default="pending", description="Only pending interrupts are listed."),
    limit: int = Query(default=100, ge=1, le=1000),
) -> dict[str, Any]:
    """Pending interrupts the caller may decide (theirs; every one for approvers and admins),
    soonest expiry first."""
    items = await access_of(request).inbox(limit=limit)
    return {"items": [interrupt_view(i) for i in items]}


@router.post("/v1/interrupts/decide")
async def decide_many(request: Request, body: DecideMany) -> dict[str, Any]:
    """Approve or reject every action of each listed interrupt (one reason for all; with
    ``allow``, each approval also gives that standing approval).

    Each interrupt is decided on its own, exactly as ``POST /v1/threads/{id}/resume`` would,
    in the order given: one failing (already decided, expired, not yours) does not stop the
    others. The answer has one item per interrupt: its status code and the run, or the error.
    """
    access = access_of(request)
    runtime = runtime_of(request)
    results: list[dict[str, Any]] = []
    for interrupt_id in body.interrupt_ids:
        try:
            try:
                found = await access.store.get_interrupt(interrupt_id)
                interrupt = await access.interrupt_to_decide(found.thread_id, interrupt_id)
            except NotFound:  # missing, or not the caller's to see: the same answer
                raise NotFound(f"interrupt {interrupt_id!r} not found", code="interrupt_not_found") from None
            decision: Decision = Reject(reason=body.reason) if body.decision == "reject" else Approve(allow=body.allow)
            decisions = [decision for _ in interrupt.action_requests]
            run = await runtime.resume(interrupt.thread_id, interrupt_id, decisions, actor=actor_of(request))
            results.append({"interrupt_id": interrupt_id, "status": 200, "run": await load_run_view(access.store, run), "error": None})
        except TetherError as exc:
            error = {"code": exc.code, "message": exc.message, "details": exc.details}
            results.append({"interrupt_id": interrupt_id, "status": status_for(exc), "run": None, "error": error})
    return {"items": results}
