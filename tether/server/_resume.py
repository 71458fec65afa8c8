"""Human review routes: resume an interrupted run with decisions, and read the audit log."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request

from ._deps import access_of, actor_of, runtime_of
from ._schemas import ResumeThread, decision_of
from ._views import audit_entry_view, load_run_view

router = APIRouter(tags=["review"])


@router.post("/v1/threads/{thread_id}/resume")
async def resume_thread(request: Request, thread_id: str, body: ResumeThread) -> dict[str, Any]:
    """Decide every action of a pending interrupt; the run continues (same run, next seqs).

    409 ``interrupt_resolved`` if someone decided first, 410 ``interrupt_expired`` after
    expiry, 422 for a wrong number of decisions or invalid edited args, 403 for a decision
    the tool does not allow, for a caller who may not decide (``not_an_approver``), or for the
    requester's own approval of a four-eyes call (``four_eyes_required``). All or nothing: on
    any error the interrupt stays as it was.
    """
    access = access_of(request)
    await access.interrupt_to_decide(thread_id, body.interrupt_id)
    decisions = [decision_of(d) for d in body.decisions]
    run = await runtime_of(request).resume(thread_id, body.interrupt_id, decisions, actor=actor_of(request))
    return await load_run_view(access.store, run)


@router.get("/v1/audit")
async def list_audit(
    request: Request,
    thread_id: str | None = Query(default=None, max_length=64),
    run_id: str | None = Query(default=None, max_length=64),
    limit: int = Query(default=1000, ge=1, le=10_000),
) -> dict[str, Any]:
    """Audit entries (decisions, expiries, cancels, gated tool executions, keys), oldest first.

    Of a thread or run the caller may read; admins may leave both filters out (every entry).
    """
    entries = await access_of(request).audit(thread_id=thread_id, run_id=run_id, limit=limit)
    return {"items": [audit_entry_view(entry) for entry in entries]}
