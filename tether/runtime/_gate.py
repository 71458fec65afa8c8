"""The review gate: which tool calls need a human, and what a valid set of decisions is.

Pure functions over tools and interrupt state; the runtime and the resume endpoint use them.

A call is *gated* when its tier (the tool's, or the one the tool computes from the call's
arguments: :meth:`~tether.tools.Tool.risk_for`) is at or above the run's ``approval_threshold``
(``destructive`` always is), or when its tool cannot be approved at all, only answered
(``ask_user``-style tools allow only ``respond``).

*Four-eyes*: a call of a tool marked ``four_eyes=True`` (or, under the server's
``four_eyes="destructive"`` policy, of any destructive tool) may only be approved, or run with
edited args, by a principal other than the run's requester. The requester may still reject it
or respond: stopping an action never needs a second person.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from ..errors import FieldError, Forbidden, InvalidRequest
from ..review import ActionRequest, Approve, Decision, Edit, ReviewConfig
from ..tools import RISK_ORDER, AllowArgs, Risk, Tool, ToolArgsError, mask_value

if TYPE_CHECKING:  # _turn uses is_gated
    from ._turn import CallItem

__all__ = ["FourEyesPolicy", "is_gated", "needs_four_eyes", "action_request", "review_config", "check_decisions", "check_four_eyes"]

#: The server's four-eyes policy: ``off`` (only tools marked ``four_eyes=True``) or
#: ``destructive`` (every destructive tool too).
FourEyesPolicy = Literal["off", "destructive"]


def is_gated(tool: Tool, threshold: str, risk: Risk | None = None) -> bool:
    """True when a call of ``tool`` whose tier is ``risk`` (default: the tool's) must wait for a
    human in a run with this threshold."""
    if "approve" not in tool.allowed_decisions:
        return True
    tier = risk or tool.risk
    return tier != "read_only" and RISK_ORDER[tier] >= RISK_ORDER[threshold]


def needs_four_eyes(tool: Tool, policy: FourEyesPolicy, risk: Risk | None = None) -> bool:
    """True when approving a call of ``tool`` whose tier is ``risk`` (default: the tool's)
    needs someone other than the run's requester."""
    return tool.four_eyes or (policy == "destructive" and (risk or tool.risk) == "destructive")


def action_request(
    tool: Tool, call_id: str, args: dict[str, Any], *, risk: Risk | None = None, four_eyes: bool = False, outcome_unknown: bool = False
) -> ActionRequest:
    """What a reviewer is shown for one gated call (sensitive args masked) whose tier is
    ``risk`` (default: the tool's); ``four_eyes`` when its approval needs someone other than
    the requester; ``outcome_unknown`` when a crash cut off an earlier execution of it."""
    description = tool.description_for(args)
    if outcome_unknown:
        description = "Outcome unknown — the server stopped while this ran. Run it again? " + description
    mcp = tool.origin is not None  # a tool of an MCP server: where it and its tier come from
    return ActionRequest(
        call_id=call_id,
        action=tool.name,
        args=tool.mask(args),
        description=description,
        risk=risk or tool.risk,
        source=tool.origin if mcp else None,
        risk_source=tool.risk_source if mcp else None,
        four_eyes=four_eyes,
        outcome_unknown=outcome_unknown,
    )


def review_config(tool: Tool, allow_args: Sequence[AllowArgs] = ()) -> ReviewConfig:
    """The decisions a reviewer may take on a call of ``tool``, and what a standing approval
    given with its approval may cover (``allow_args``; none: left out)."""
    return ReviewConfig(allowed_decisions=list(tool.allowed_decisions), allow_args=list(allow_args) or None)


def _edited_args(tool: Tool, index: int, original: dict[str, Any], edited: dict[str, Any]) -> dict[str, Any]:
    merged = dict(edited)
    for name in tool.sensitive_args:
        real = original.get(name)
        if name not in merged or merged[name] == mask_value(real):
            merged[name] = real  # the reviewer saw only the mask: keep the real value
        elif merged[name] != real and not tool.allow_sensitive_edit:
            raise InvalidRequest(
                f"argument {name!r} of {tool.name} is sensitive and cannot be edited",
                code="sensitive_arg_locked",
                fields=[FieldError(("decisions", index, "args", name), "sensitive argument cannot be edited", "sensitive")],
            )
    try:
        return tool.validate(merged)
    except ToolArgsError as exc:
        fields = [FieldError(("decisions", index, "args", *e["loc"]), e["msg"], e["type"]) for e in exc.errors]
        raise InvalidRequest(f"edited arguments are invalid: {exc}", code="invalid_edited_args", fields=fields) from None


def check_decisions(tools: Mapping[str, Tool], gated_calls: Sequence[CallItem], decisions: Sequence[Decision]) -> list[Decision]:
    """Validate one decision per gated call, in order; all or nothing.

    Returns the decisions paired with their calls (``call_id`` set; an :class:`Edit` carrying the
    real, validated args). Raises :class:`InvalidRequest` (422) or :class:`Forbidden` (403);
    nothing changes.
    """
    if len(decisions) != len(gated_calls):
        raise InvalidRequest(
            f"expected {len(gated_calls)} decisions (one per action, in order), got {len(decisions)}",
            code="decision_count_mismatch",
            fields=[FieldError(("decisions",), f"expected {len(gated_calls)} items", "length")],
        )
    normalised: list[Decision] = []
    for index, (call, decision) in enumerate(zip(gated_calls, decisions, strict=True)):
        tool = tools.get(call.name)
        allowed = tool.allowed_decisions if tool else ("reject",)
        if decision.decision not in allowed:  # a tool the agent no longer has can still be rejected
            raise Forbidden(
                f"decision {decision.decision!r} is not allowed for {call.name} (allowed: {', '.join(allowed)})",
                code="decision_not_allowed",
                fields=[FieldError(("decisions", index, "decision"), f"allowed: {list(allowed)}", "not_allowed")],
            )
        if isinstance(decision, Edit):
            assert tool is not None  # a vanished tool allows only reject
            decision = decision.model_copy(update={"args": _edited_args(tool, index, call.args, decision.args)})
        normalised.append(decision.model_copy(update={"call_id": call.id}))
    return normalised


def check_four_eyes(
    tools: Mapping[str, Tool],
    policy: FourEyesPolicy,
    action_requests: Sequence[ActionRequest],
    normalised: Sequence[Decision],
    *,
    decider: str,
    requester: str | None,
) -> None:
    """Refuse (403 ``four_eyes_required``) a set of decisions in which the run's requester
    approves or edits a call that needs a second person. A call needs one if its action request
    was marked so when it was parked, or if its tool or the policy says so now (for the call's
    tier, and for an edit also the tier of the edited arguments)."""
    if requester is None or decider != requester:
        return
    asked = {r.call_id: r for r in action_requests}
    for index, decision in enumerate(normalised):
        if not isinstance(decision, Approve | Edit):
            continue
        request = asked.get(decision.call_id)
        name = request.action if request is not None else None
        tool = tools.get(name) if name is not None else None
        tiers = [request.risk if request is not None else None]
        if isinstance(decision, Edit) and tool is not None:
            tiers.append(tool.risk_for(decision.args))
        if (request is not None and request.four_eyes) or (tool is not None and any(needs_four_eyes(tool, policy, tier) for tier in tiers)):
            raise Forbidden(
                f"{name} needs four eyes: someone other than {requester!r}, who started this run, must approve it (you may still reject it)",
                code="four_eyes_required",
                fields=[FieldError(("decisions", index, "decision"), "needs an approver other than the run's requester", "four_eyes")],
            )
