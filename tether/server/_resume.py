"""Human review routes: resume an interrupted run with decisions, and read the audit log."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request

from ..errors import InvalidRequest
from ._deps import actor_of, runtime_of, store_of
from ._schemas import ResumeThread
from ._views import audit_entry_view, load_run_view

router = APIRouter(tags=["review"])


@router.post("/v1/threads/{thread_id}/resume")
async def resume_thread(request: Request, thread_id: str, body: ResumeThread) -> dict[str, Any]:
    """Decide every action of a pending interrupt; the run continues (same run, next seqs).

    409 ``interrupt_resolved`` if someone decided first, 410 ``interrupt_expired`` after
    expiry, 422 for a wrong number of decisions or invalid edited args, 403 for a decision
    the tool does not allow. All or nothing: on any error the interrupt stays as it was.
    """
    await store_of(request).get_thread(thread_id, owner=actor_of(request))
    decisions = [d.model_dump() for d in body.decisions]
    run = await runtime_of(request).resume(thread_id, body.interrupt_id, decisions, actor=actor_of(request))
    return await load_run_view(store_of(request), run)


@router.get("/v1/audit")
async def list_audit(
    request: Request,
    thread_id: str | None = Query(default=None, max_length=64),
    run_id: str | None = Query(default=None, max_length=64),
    limit: int = Query(default=1000, ge=1, le=10_000),
) -> dict[str, Any]:
    """Audit entries (decisions, expiries, cancels, gated tool executions), oldest first."""
    store = store_of(request)
    if thread_id is None and run_id is None:
        raise InvalidRequest("give thread_id or run_id", code="audit_filter_required")
    if thread_id is not None:
        await store.get_thread(thread_id, owner=actor_of(request))
    if run_id is not None:
        run = await store.get_run(run_id)
        await store.get_thread(run.thread_id, owner=actor_of(request))
    entries = await store.list_audit(thread_id=thread_id, run_id=run_id, limit=limit)
    return {"items": [audit_entry_view(entry) for entry in entries]}
