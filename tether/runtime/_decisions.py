"""A resume's decisions (and an expiry) as they are shown and put on record.

:meth:`Runtime.resume <tether.runtime.Runtime.resume>` validates the decisions (:mod:`._gate`),
then writes, in the transaction that resolves the interrupt, each decision as the ``resumed``
event and the interrupt show it (an edit's arguments masked) and one ``decision`` audit entry
per call (an edit's original and edited arguments, masked, in its details). A set refused by
four-eyes changes nothing but is on record too: one ``refused_four_eyes`` entry per call.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..review import Decision, Edit, Reject
from ..store import AuditEntry, InterruptRecord, args_digest
from ..tools import Tool
from ._turn import CallItem

__all__ = ["decided", "refused_entries", "expired_entries"]


def _entry(interrupt: InterruptRecord, call: CallItem, **fields: Any) -> AuditEntry:
    """An audit entry about one call of ``interrupt``."""
    return AuditEntry(thread_id=interrupt.thread_id, run_id=interrupt.run_id, interrupt_id=interrupt.id, call_id=call.id, tool=call.name, **fields)


def decided(
    tools: Mapping[str, Tool], interrupt: InterruptRecord, gated: Sequence[CallItem], normalised: Sequence[Decision], *, actor: str
) -> tuple[list[Decision], list[AuditEntry]]:
    """Record each decision on its call; the decisions as shown and their audit entries."""
    public: list[Decision] = []
    entries: list[AuditEntry] = []
    asked = {r.call_id: r.args for r in interrupt.action_requests}
    for call, decision in zip(gated, normalised, strict=True):
        call.decision = decision
        tool = tools.get(call.name)  # None: gone since it was asked (only reject is allowed)
        shown: Decision = decision
        details: dict[str, Any] | None = None
        if isinstance(decision, Edit) and tool is not None:
            shown = decision.model_copy(update={"args": tool.mask(decision.args)})
            details = {"original_args": tool.mask(call.args), "edited_args": shown.args}
        public.append(shown)
        entries.append(
            _entry(
                interrupt,
                call,
                action="decision",
                actor=actor,
                args_digest=args_digest(tool.mask(call.args) if tool is not None else asked.get(call.id, {})),
                decision=decision.decision,
                reason=decision.reason if isinstance(decision, Reject) else None,
                outcome="accepted",
                details=details,
            )
        )
    return public, entries


def refused_entries(interrupt: InterruptRecord, gated: Sequence[CallItem], normalised: Sequence[Decision], *, actor: str) -> list[AuditEntry]:
    """The record of a set of decisions four-eyes refused: one entry per call."""
    return [
        _entry(interrupt, call, action="decision", actor=actor, decision=decision.decision, outcome="refused_four_eyes")
        for call, decision in zip(gated, normalised, strict=True)
    ]


def expired_entries(interrupt: InterruptRecord, gated: Sequence[CallItem]) -> list[AuditEntry]:
    """The record of an expiry: one entry per call it rejected, on the clock's word."""
    return [_entry(interrupt, call, action="expired", actor="system", decision="expired", outcome="not_executed") for call in gated]
