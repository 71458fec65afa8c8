"""Standing approvals' routes: a thread's allowances, and revoking one.

An allowance is created by an approval that carries ``allow`` (``POST
/v1/threads/{id}/resume``, ``POST /v1/interrupts/decide``, an AG-UI resume); these routes read
and end them. A revocation is one conditional write, so from its answer on no gate in any
process lets a call through under it.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request, Response

from .._ids import utcnow
from ._deps import access_of, actor_of

router = APIRouter(tags=["review"])


@router.get("/v1/threads/{thread_id}/allowances")
async def list_allowances(request: Request, thread_id: str, limit: int = Query(default=200, ge=1, le=1000)) -> dict[str, Any]:
    """The thread's standing approvals: the active ones first, then the past ones (expired or
    revoked), each newest first. Whoever may read the thread may list them."""
    now = utcnow()
    items = await access_of(request).allowances(thread_id, limit=limit)
    return {"items": [allowance.as_json(now) for allowance in items]}


@router.delete("/v1/allowances/{allowance_id}", status_code=204, response_class=Response)
async def revoke_allowance(request: Request, allowance_id: str) -> Response:
    """Revoke a standing approval: the next call it would have covered waits for a human again,
    in every process. Whoever may decide its thread's interrupts may revoke it (the requester
    of the runs it covers, an approver, an admin). 204 also when it had expired or was revoked
    already (nothing changes then); 404 ``allowance_not_found``."""
    access = access_of(request)
    await access.allowance_to_revoke(allowance_id)
    await access.store.revoke_allowance(allowance_id, actor=actor_of(request), now=utcnow())
    return Response(status_code=204)
