"""Human review in AG-UI's words: a Tether interrupt as AG-UI interrupts, and AG-UI resume
entries as Tether decisions.

A Tether interrupt holds every gated call of one model turn; AG-UI wants one interrupt per thing
to answer, so each gated call becomes one AG-UI interrupt whose id is
``<tether interrupt id>:<call id>`` (Tether's ids hold no ``:``). Its ``responseSchema`` says
which answers the tool allows, in the shape AG-UI recommends for tool approvals
(``{approved, editedArgs}``), plus ``reason`` for a rejection and ``message`` for tools that are
answered instead of run (``respond``), and ``allow`` (a standing approval) where one may be
given. Deciding stays Tether's: the entries become the decisions
of ``POST /v1/threads/{id}/resume`` and go through the same validation, the same single winner
and the same expiry.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import FieldError, InvalidRequest
from ..events import Interrupt
from ..review import ActionRequest
from ..tools import Tool

__all__ = ["agui_interrupt_id", "tether_interrupt_id", "agui_interrupts", "response_schema", "decisions_for"]

#: The reason AG-UI's taxonomy gives an interrupt bound to a tool call.
TOOL_CALL_REASON = "tool_call"

#: The ``reason`` a rejection carries when the client cancelled the interrupt.
CANCELLED_REASON = "cancelled in the client"


def agui_interrupt_id(interrupt_id: str, call_id: str) -> str:
    """The AG-UI id of the interrupt asking about ``call_id``."""
    return f"{interrupt_id}:{call_id}"


def tether_interrupt_id(agui_id: str) -> str:
    """The Tether interrupt an AG-UI interrupt id belongs to."""
    return agui_id.split(":", 1)[0]


def response_schema(allowed: Sequence[str], args_schema: Mapping[str, Any] | None, allow_args: Sequence[str] = ()) -> dict[str, Any]:
    """The JSON schema of the ``resume`` payload a call with these allowed decisions accepts
    (with ``allow``, a standing approval, when ``allow_args`` says one may be given)."""
    properties: dict[str, Any] = {}
    alternatives: list[dict[str, Any]] = []
    if any(kind in allowed for kind in ("approve", "reject", "edit")):
        properties["approved"] = {"type": "boolean", "description": "true: run the tool (with editedArgs when given); false: do not run it"}
        alternatives.append({"required": ["approved"]})
        if "reject" in allowed:
            properties["reason"] = {"type": "string", "maxLength": 4000, "description": "why not (with approved: false); goes back to the model"}
        if "approve" in allowed and allow_args:
            properties["allow"] = {
                "type": "object",
                "description": "with approved: true (no editedArgs): also allow calls like this one, for ttl_s seconds",
                "properties": {
                    "scope": {"enum": ["run", "thread"], "default": "run"},
                    "args": {"enum": list(allow_args), "default": "same"},
                    "ttl_s": {"type": "integer", "minimum": 1},
                },
                "required": ["ttl_s"],
                "additionalProperties": False,
            }
        if "edit" in allowed:
            properties["editedArgs"] = {
                **(dict(args_schema) if args_schema else {"type": "object"}),
                "description": "Full replacement of the tool args. Not merged.",
            }
    if "respond" in allowed:
        properties["message"] = {"type": "string", "minLength": 1, "maxLength": 100_000, "description": "the answer; the tool does not run"}
        alternatives.append({"required": ["message"]})
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if len(alternatives) == 1:
        schema["required"] = alternatives[0]["required"]
    elif alternatives:
        schema["anyOf"] = alternatives
    return schema


def agui_interrupts(event: Interrupt, tools: Mapping[str, Tool]) -> list[dict[str, Any]]:
    """The AG-UI interrupts (one per action request) of an ``interrupt`` event."""
    interrupts = []
    for request, config in zip(event.action_requests, event.review_configs, strict=True):
        tool = tools.get(request.action)
        allowed = list(config.allowed_decisions)
        tether: dict[str, Any] = {
            "interrupt_id": event.interrupt_id,
            "action": request.action,
            "args": request.args,
            "risk": request.risk,
            "allowed_decisions": allowed,
        }
        if request.outcome_unknown:
            tether["outcome_unknown"] = True
        if config.allow_args:
            tether["allow_args"] = list(config.allow_args)
        interrupts.append(
            {
                "id": agui_interrupt_id(event.interrupt_id, request.call_id),
                "reason": TOOL_CALL_REASON,
                "message": request.description or request.action,
                "toolCallId": request.call_id,
                "responseSchema": response_schema(allowed, tool.json_schema() if tool is not None else None, config.allow_args or ()),
                "expiresAt": event.expires_at,
                "metadata": {"tether": tether},
            }
        )
    return interrupts


def _decision(entry: Mapping[str, Any], index: int) -> dict[str, Any]:
    def invalid(message: str, *loc: str | int) -> InvalidRequest:
        return InvalidRequest(message, code="invalid_resume_payload", fields=[FieldError(("resume", index, *loc), message, "invalid")])

    if entry["status"] == "cancelled":
        return {"decision": "reject", "reason": CANCELLED_REASON}
    payload = entry.get("payload")
    if not isinstance(payload, dict):
        raise invalid("a resolved resume entry needs a payload object: {approved, editedArgs?, reason?} or {message}", "payload")
    approved = payload.get("approved")
    if approved is None and "message" in payload:
        if not isinstance(payload["message"], str):
            raise invalid("message must be a string", "payload", "message")
        return {"decision": "respond", "message": payload["message"]}
    allow = payload.get("allow")
    if allow is not None and (approved is not True or payload.get("editedArgs") is not None):
        raise invalid("allow goes with approved: true and no editedArgs", "payload", "allow")
    if approved is True:
        edited = payload.get("editedArgs")
        if edited is None:
            return {"decision": "approve", **({"allow": allow} if allow is not None else {})}
        if not isinstance(edited, dict):
            raise invalid("editedArgs must be an object (the full replacement of the tool args)", "payload", "editedArgs")
        return {"decision": "edit", "args": edited}
    if approved is False:
        reason = payload.get("reason")
        if reason is not None and not isinstance(reason, str):
            raise invalid("reason must be a string", "payload", "reason")
        return {"decision": "reject", "reason": reason}
    raise invalid("payload.approved must be true or false (or give a message)", "payload", "approved")


def decisions_for(action_requests: Sequence[ActionRequest], interrupt_id: str, entries: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One decision per action request, in order, in the shape of ``POST /resume``'s body (to be
    validated as that body is), from AG-UI resume entries (``{interruptId, status, payload?}``)
    that must answer each of them exactly once."""
    wanted = [agui_interrupt_id(interrupt_id, r.call_id) for r in action_requests]
    by_id: dict[str, tuple[int, Mapping[str, Any]]] = {}
    for index, entry in enumerate(entries):
        if entry["interruptId"] in by_id:
            raise InvalidRequest(
                f"interrupt {entry['interruptId']!r} is answered twice",
                code="invalid_resume",
                fields=[FieldError(("resume", index, "interruptId"), "answered twice", "duplicate")],
            )
        by_id[entry["interruptId"]] = (index, entry)
    missing = [w for w in wanted if w not in by_id]
    unknown = [i for i in by_id if i not in wanted]
    if missing or unknown:
        raise InvalidRequest(
            "the resume must answer every open interrupt of the run, and only those",
            code="invalid_resume",
            details={"missing": missing, "unknown": unknown},
        )
    return [_decision(by_id[w][1], by_id[w][0]) for w in wanted]
