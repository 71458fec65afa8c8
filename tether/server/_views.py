"""Every resource as the HTTP API shows it: records in, JSON-ready dicts out.

The store and the runtime return records; only this module decides what a response looks like
(field names and order, timestamps as wire text, what stays internal, such as an interrupt's
parked turn). The ``load_*`` helpers read what a view shows beside its record (a run's pending
interrupt, a thread's active run).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from .._ids import utcnow
from ..events import format_ts
from ..store import AuditEntry, InterruptRecord, MessageRecord, RunRecord, RunStatus, RunUsage, Store, ThreadRecord
from ..store._records import calls_json

__all__ = [
    "thread_view",
    "run_view",
    "message_view",
    "queued_message_view",
    "interrupt_view",
    "audit_entry_view",
    "load_run_view",
    "load_thread_views",
]


def _ts(moment: datetime | None) -> str | None:
    return format_ts(moment) if moment is not None else None


def thread_view(thread: ThreadRecord, *, active_run_id: str | None, pending_interrupt: dict[str, Any] | None = None) -> dict[str, Any]:
    """A thread, with the id of its active run and its pending interrupt's view."""
    return {
        "id": thread.id,
        "owner": thread.owner,
        "title": thread.title,
        "metadata": thread.metadata,
        "active_leaf_id": thread.active_leaf_id,
        "active_run_id": active_run_id,
        "pending_interrupt": pending_interrupt,
        "created_at": _ts(thread.created_at),
    }


def run_view(run: RunRecord, *, pending_interrupt: dict[str, Any] | None = None) -> dict[str, Any]:
    """A run, with its pending interrupt's view."""
    return {
        "id": run.id,
        "thread_id": run.thread_id,
        "status": str(run.status),
        "config": run.config,
        "input_message_id": run.input_message_id,
        "created_at": _ts(run.created_at),
        "started_at": _ts(run.started_at),
        "ended_at": _ts(run.ended_at),
        "error": run.error.to_json() if run.error is not None else None,
        "requested_by": run.requested_by,
        "usage": run_usage_view(run.usage),
        "cancel": ({"mode": run.cancel_mode, "reason": run.cancel_reason, "actor": run.cancel_actor} if run.cancel_mode else None),
        "pending_interrupt": pending_interrupt,
    }


def run_usage_view(usage: RunUsage | None) -> dict[str, Any]:
    """A run's token usage: totals, and the model calls that made them (zeros before the first)."""
    return (usage or RunUsage()).to_json()


def message_view(message: MessageRecord, *, sibling_ids: Sequence[str] | None = None) -> dict[str, Any]:
    """A message, with the ids of its siblings (itself included) and its place among them."""
    siblings = list(sibling_ids) if sibling_ids is not None else [message.id]
    return {
        "id": message.id,
        "thread_id": message.thread_id,
        "parent_id": message.parent_id,
        "run_id": message.run_id,
        "role": message.role,
        "content": message.content,
        "tool_calls": calls_json(message.tool_calls),
        "tool_call_id": message.tool_call_id,
        "name": message.name,
        "status": message.status,
        "finish_reason": message.finish_reason,
        "created_at": _ts(message.created_at),
        "edited_by_user": message.edited_from_id is not None,
        "edited_from_id": message.edited_from_id,
        "sibling_ids": siblings,
        "sibling_index": siblings.index(message.id) if message.id in siblings else 0,
    }


def queued_message_view(message_id: str, run: RunRecord, content: str) -> dict[str, Any]:
    """A steering message sent into a running run: queued until the run's next model call."""
    return {"id": message_id, "run_id": run.id, "thread_id": run.thread_id, "role": "user", "content": content, "status": "queued"}


def interrupt_view(interrupt: InterruptRecord, now: datetime | None = None) -> dict[str, Any]:
    """An interrupt (sensitive args already masked in the record; the parked turn stays internal)."""
    now = now or utcnow()
    end = interrupt.resolved_at or now
    return {
        "id": interrupt.id,
        "run_id": interrupt.run_id,
        "thread_id": interrupt.thread_id,
        "requested_by": interrupt.requested_by,
        "status": interrupt.status,
        **{k: v for k, v in interrupt.columns().items() if k != "turn"},
        "resolved_by": interrupt.resolved_by,
        "created_at": format_ts(interrupt.created_at),
        "expires_at": format_ts(interrupt.expires_at),
        "resolved_at": _ts(interrupt.resolved_at),
        "waited_s": round(max(0.0, (end - interrupt.created_at).total_seconds()), 3),
        "expires_in_s": round((interrupt.expires_at - now).total_seconds(), 3) if interrupt.status == "pending" else None,
    }


def audit_entry_view(entry: AuditEntry) -> dict[str, Any]:
    """An audit log entry (read back from the store, so with its ``id`` and ``ts``)."""
    return {
        "id": entry.id,
        "ts": _ts(entry.ts),
        "actor": entry.actor,
        "action": entry.action,
        "thread_id": entry.thread_id,
        "run_id": entry.run_id,
        "interrupt_id": entry.interrupt_id,
        "call_id": entry.call_id,
        "tool": entry.tool,
        "args_digest": entry.args_digest,
        "decision": entry.decision,
        "reason": entry.reason,
        "outcome": entry.outcome,
        "details": entry.details,
    }


async def load_run_view(store: Store, run: RunRecord) -> dict[str, Any]:
    """:func:`run_view` with the run's pending interrupt read from the store (if it waits)."""
    pending = await store.pending_interrupts(run_ids=[run.id]) if run.status == RunStatus.WAITING_HUMAN else []
    return run_view(run, pending_interrupt=interrupt_view(pending[0]) if pending else None)


async def load_thread_views(store: Store, threads: list[ThreadRecord]) -> list[dict[str, Any]]:
    """:func:`thread_view` of each thread, with its active run and pending interrupt read from the store."""
    ids = [t.id for t in threads]
    active = await store.active_run_ids(ids)
    pending = {i.thread_id: interrupt_view(i) for i in await store.pending_interrupts(thread_ids=ids)}
    return [thread_view(t, active_run_id=active.get(t.id), pending_interrupt=pending.get(t.id)) for t in threads]
