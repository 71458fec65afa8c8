"""Standing approvals in the runtime: which ones a decision may give, and which calls they cover.

An ``approve`` may carry :class:`~tether.review.Allow` (``scope``, ``args``, ``ttl_s``): the
decision then also creates an *allowance*, and later calls it covers run without asking
(``docs/review.md``). Both halves of that rule live here:

- :func:`grants`: checked with the rest of a set of decisions (all or nothing), the allowances
  they give, written by the transaction that resolves the interrupt;
- :class:`AllowanceGate`: at the gate, for the calls of a model turn that would wait for a human,
  the active allowances of the thread read from the store (every time, never cached, so an
  expiry or a revocation holds at once in every process) and the calls they cover let through.

What an allowance may cover (:func:`permitted_args`): by default ``same`` arguments for a
destructive call and ``same`` or ``any`` for a reversible one; a tool may narrow that
(``allow_args``); a call that needs four eyes permits none. It never crosses its thread, its run
(scope ``run``), the principal whose runs it covers, or the tier of the call it was given on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from .._ids import new_id, utcnow
from ..errors import FieldError, InvalidRequest
from ..review import ActionRequest, Approve, Decision
from ..store import AllowanceRecord, InterruptRecord, args_digest, args_match
from ..tools import AllowArgs, Risk, Tool
from ._gate import FourEyesPolicy, needs_four_eyes

if TYPE_CHECKING:
    from ._segment import Segment
    from ._turn import CallItem

__all__ = ["DEFAULT_MAX_ALLOWANCE_TTL_S", "permitted_args", "grants", "AllowanceGate"]

#: The longest an allowance may hold unless the server says otherwise (24 h).
DEFAULT_MAX_ALLOWANCE_TTL_S = 24 * 3600


def permitted_args(tool: Tool, policy: FourEyesPolicy, risk: Risk, *, four_eyes: bool = False) -> tuple[AllowArgs, ...]:
    """What an allowance given with the approval of a call of ``tool`` of tier ``risk`` may
    cover: the tool's choice for that tier (:meth:`~tether.tools.Tool.allow_args`), nothing when
    the call needs four eyes (``four_eyes``: it was marked so when asked)."""
    if four_eyes or needs_four_eyes(tool, policy, risk):
        return ()
    return tool.allow_args(risk)


def grants(
    tools: Mapping[str, Tool],
    policy: FourEyesPolicy,
    interrupt: InterruptRecord,
    calls: Sequence[CallItem],
    decisions: Sequence[Decision],
    *,
    actor: str,
    now: datetime,
    max_ttl_s: float,
) -> list[AllowanceRecord]:
    """The allowances a checked set of decisions (one per gated call, in order) gives.

    Raises :class:`~tether.errors.InvalidRequest` (422), so nothing changes: ``allow_not_permitted``
    when the call's tool (or four-eyes) does not permit what is asked, ``allow_ttl_too_long`` above
    ``max_ttl_s``.
    """
    asked: dict[str, ActionRequest] = {r.call_id: r for r in interrupt.action_requests}
    given: list[AllowanceRecord] = []
    for index, (call, decision) in enumerate(zip(calls, decisions, strict=True)):
        if not isinstance(decision, Approve) or decision.allow is None:
            continue
        allow, tool, request = decision.allow, tools.get(call.name), asked.get(call.id)
        assert tool is not None, "a tool the agent no longer has can only be rejected"
        risk: Risk = request.risk if request is not None else call.risk or tool.risk
        permitted = permitted_args(tool, policy, risk, four_eyes=request is not None and request.four_eyes)
        if allow.args not in permitted:
            raise InvalidRequest(
                f"{call.name} permits no standing approval here" + (" (approving it needs four eyes)" if not permitted and tool.allow_args(risk) else "")
                if not permitted
                else f"{call.name} permits a standing approval for {' or '.join(permitted)} arguments only, not {allow.args!r}",
                code="allow_not_permitted",
                fields=[FieldError(("decisions", index, "allow", "args"), f"permitted: {list(permitted)}", "not_permitted")],
            )
        if allow.ttl_s > max_ttl_s:
            raise InvalidRequest(
                f"a standing approval lasts at most {max_ttl_s:g} s on this server, not {allow.ttl_s} s",
                code="allow_ttl_too_long",
                fields=[FieldError(("decisions", index, "allow", "ttl_s"), f"at most {max_ttl_s:g}", "less_than_equal")],
            )
        same = allow.args == "same"
        given.append(
            AllowanceRecord(
                id=new_id("alw"),
                thread_id=interrupt.thread_id,
                run_id=interrupt.run_id if allow.scope == "run" else None,
                scope=allow.scope,
                tool=call.name,
                args=allow.args,
                args_digest=args_digest(tool.mask(call.args)) if same else None,
                args_match=args_match(call.args) if same else None,
                risk=risk,
                principal=interrupt.requested_by,
                interrupt_id=interrupt.id,
                call_id=call.id,
                created_by=actor,
                created_at=now,
                expires_at=now + timedelta(seconds=allow.ttl_s),
            )
        )
    return given


class AllowanceGate:
    """The gate's check of standing approvals, for one run's executor."""

    def __init__(self, segment: Segment, four_eyes: FourEyesPolicy) -> None:
        self._segment = segment
        self._four_eyes = four_eyes

    async def cover(self, calls: Sequence[CallItem]) -> None:
        """Let through the gated calls an active allowance covers: each such call is no longer
        gated and carries the allowance (its ``tool_call`` says ``allowed_by``). One read of the
        store, only when some gated call could be covered at all."""
        seg = self._segment
        candidates: list[tuple[CallItem, tuple[AllowArgs, ...]]] = []
        for call in calls:
            tool = seg.agent.tools.get(call.name)
            if call.gated and not call.settled and tool is not None and call.risk is not None:
                permitted = permitted_args(tool, self._four_eyes, call.risk)
                if permitted:
                    candidates.append((call, permitted))
        if not candidates:
            return
        run = seg.run
        found = await seg.store.covering_allowances(
            thread_id=run.thread_id, run_id=run.id, principal=run.requested_by, tools={c.name for c, _ in candidates}, now=utcnow()
        )
        for call, permitted in candidates:
            assert call.risk is not None
            match = args_match(call.args)
            allowance = next((a for a in found if a.args in permitted and a.covers(tool=call.name, risk=call.risk, match=match)), None)
            if allowance is not None:
                call.gated = False
                call.allowance = allowance
