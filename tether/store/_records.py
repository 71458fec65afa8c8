"""What the store returns: one plain dataclass per row, and the run status enum.

Records are domain values with no HTTP in them: the server's ``views`` turn them into the JSON
the API shows. The functions at the bottom build records from rows and rows from records; they
are the only code that knows both the column names and the record fields.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import TypeAdapter

from .._ids import as_utc, new_id, utcnow
from ..events import CancelMode, FinishReason
from ..review import DECISIONS, ActionRequest, Decision, ParkedTurn, ReviewConfig
from ._values import AtLeaf, Attach, CallUsage, Fork, Regenerate, RunFailure, RunUsage, StoredCall, calls_json, calls_of

__all__ = [
    "Attach",
    "AtLeaf",
    "Fork",
    "Regenerate",
    "RunStatus",
    "ACTIVE_RUN_STATUSES",
    "TERMINAL_RUN_STATUSES",
    "EXECUTOR_RUN_STATUSES",
    "ThreadRecord",
    "RunRecord",
    "RunUsage",
    "CallUsage",
    "RunFailure",
    "MessageRecord",
    "StoredCall",
    "calls_of",
    "calls_json",
    "InterruptRecord",
    "AuditEntry",
    "Principal",
    "ROLES",
    "KeyRecord",
    "args_digest",
    "thread_record",
    "run_record",
    "cancel_mode_of",
    "message_record",
    "message_values",
    "interrupt_record",
    "audit_entry",
    "key_record",
]


class RunStatus(StrEnum):
    """Where a run is in its life; the values are what the ``runs.status`` column stores."""

    #: Created with its input and ``run_started``; no process has begun executing it.
    QUEUED = "queued"
    #: A process executes it (model calls, tools), holding a lease on it.
    RUNNING = "running"
    #: Parked on a pending interrupt: it lives in the store only, no process holds it.
    WAITING_HUMAN = "waiting_human"
    #: An explicit cancel was recorded; its executor (or the canceller) is finishing it.
    CANCELLING = "cancelling"
    #: Terminal: ended with ``done``.
    COMPLETED = "completed"
    #: Terminal: ended with ``error``.
    FAILED = "failed"
    #: Terminal: ended with ``cancelled``.
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        """True for ``completed``, ``failed`` and ``cancelled``."""
        return self in TERMINAL_RUN_STATUSES


#: Terminal statuses: a run in one of these never changes again.
TERMINAL_RUN_STATUSES = (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED)
#: Every other status: at most one run per thread may be in one of these (a partial unique index).
ACTIVE_RUN_STATUSES = tuple(status for status in RunStatus if status not in TERMINAL_RUN_STATUSES)
#: Active statuses that need a process to execute the run (a waiting run needs a human instead).
EXECUTOR_RUN_STATUSES = tuple(status for status in ACTIVE_RUN_STATUSES if status is not RunStatus.WAITING_HUMAN)


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnOutcome:
    """A model turn's final state: its assistant message's content and status, its tool calls,
    and the tokens its call consumed (added to the run's usage)."""

    message_id: str
    content: str
    status: str
    input_tokens: int
    output_tokens: int
    tool_calls: tuple[StoredCall, ...] | None = None
    #: An answer cut short: why (stored as the message's ``finish_reason``).
    finish_reason: FinishReason | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CancelRequest:
    """A cancel request as the run records it: its mode, why, who asked, and when."""

    mode: CancelMode
    reason: str | None
    actor: str
    #: When it was asked for: its audit entry's time, also when that entry is written later, with
    #: the run's end (a run's timeline measures how long the cancel took to land from it).
    requested_at: datetime = field(default_factory=utcnow)

    def audit_entry(self, thread_id: str, run_id: str, *, outcome: str) -> AuditEntry:
        """The request's ``cancel`` audit entry; ``outcome`` is what it did to the run."""
        return AuditEntry(
            action="cancel",
            actor=self.actor,
            thread_id=thread_id,
            run_id=run_id,
            reason=self.reason,
            outcome=outcome,
            details={"mode": self.mode},
            ts=self.requested_at,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ThreadRecord:
    """A thread row."""

    id: str
    owner: str
    metadata: dict[str, Any]
    active_leaf_id: str | None
    created_at: datetime
    #: Given, renamed, or taken from the first message; None until one of these.
    title: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RunRecord:
    """A run row."""

    id: str
    thread_id: str
    status: RunStatus
    config: dict[str, Any]
    input_message_id: str | None
    created_at: datetime
    started_at: datetime | None
    ended_at: datetime | None
    #: Why it failed (``failed`` runs).
    error: RunFailure | None
    cancel_mode: CancelMode | None
    cancel_reason: str | None
    cancel_actor: str | None
    #: The process executing the run (None while it waits for a human, or once it ended).
    executor_id: str | None = None
    lease_expires_at: datetime | None = None
    #: The principal who started the run (None for runs from before identity existed).
    requested_by: str | None = None
    #: Tokens its model calls consumed (None before the first).
    usage: RunUsage | None = None
    #: The W3C ``traceparent`` the run's spans continue (None until tracing gave it one).
    trace_context: str | None = None

    @property
    def terminal(self) -> bool:
        """True once the run is completed, failed or cancelled."""
        return self.status in TERMINAL_RUN_STATUSES


@dataclass(frozen=True, slots=True, kw_only=True)
class MessageRecord:
    """A message row (a node of the thread's message tree)."""

    id: str
    thread_id: str
    parent_id: str | None
    run_id: str | None
    role: str
    content: str
    #: The tool calls an assistant message asked for.
    tool_calls: tuple[StoredCall, ...] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    status: str = "complete"
    created_at: datetime = field(default_factory=utcnow)
    #: Set on a user's edited version of an assistant message: the message it replaces.
    edited_from_id: str | None = None
    #: An answer cut short, not ended by the model: ``length`` or ``repetition``.
    finish_reason: FinishReason | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class InterruptRecord:
    """An interrupt row, its JSON columns parsed once into review records."""

    id: str
    run_id: str
    thread_id: str
    status: str
    action_requests: list[ActionRequest]
    review_configs: list[ReviewConfig]
    #: The turn waiting for the decisions (with them, once decided).
    turn: ParkedTurn
    #: The decisions as shown (an edit's arguments masked); None until decided.
    decisions: list[Decision] | None
    resolved_by: str | None
    created_at: datetime
    expires_at: datetime
    resolved_at: datetime | None
    #: The principal who started the interrupted run (read from the run).
    requested_by: str | None = None

    def columns(self) -> dict[str, Any]:
        """The JSON columns of the row (``action_requests``, ``review_configs``, ``turn``, ``decisions``)."""
        return {
            "action_requests": [a.model_dump(mode="json") for a in self.action_requests],
            "review_configs": [c.model_dump(mode="json") for c in self.review_configs],
            "turn": self.turn.model_dump(mode="json"),
            "decisions": DECISIONS.dump_python(self.decisions, mode="json") if self.decisions is not None else None,
        }


#: The roles a principal may have: ``user`` works in their own threads, ``approver`` may read
#: threads with interrupts and decide them, ``admin`` may do everything.
ROLES = ("user", "approver", "admin")


@dataclass(frozen=True, slots=True, kw_only=True)
class Principal:
    """Who is calling: a name and roles."""

    name: str
    roles: frozenset[str]

    def has(self, role: str) -> bool:
        """True when the principal holds ``role`` (``admin`` holds every role)."""
        return role in self.roles or "admin" in self.roles

    @property
    def is_admin(self) -> bool:
        """True for an ``admin``."""
        return "admin" in self.roles

    @property
    def is_approver(self) -> bool:
        """True for an ``approver`` or an ``admin``."""
        return self.has("approver")


@dataclass(frozen=True, slots=True, kw_only=True)
class KeyRecord:
    """An API key as stored: everything but the key (only its hash is kept, and never returned)."""

    id: str
    name: str
    roles: tuple[str, ...]
    prefix: str
    created_at: datetime
    last_used_at: datetime | None
    expires_at: datetime | None
    revoked_at: datetime | None

    @property
    def principal(self) -> Principal:
        """The principal the key stands for."""
        return Principal(name=self.name, roles=frozenset(self.roles))

    def usable(self, now: datetime) -> bool:
        """True unless revoked or expired at ``now``."""
        return self.revoked_at is None and (self.expires_at is None or self.expires_at > now)


@dataclass(frozen=True, slots=True, kw_only=True)
class AuditEntry:
    """One audit log entry (fields that do not apply are None).

    Built without ``id`` and ``ts`` to be written (the store gives both at the write); read back
    with both.
    """

    action: str
    actor: str
    thread_id: str | None = None
    run_id: str | None = None
    interrupt_id: str | None = None
    call_id: str | None = None
    tool: str | None = None
    args_digest: str | None = None
    decision: str | None = None
    reason: str | None = None
    outcome: str | None = None
    details: Any = None
    id: str | None = None
    ts: datetime | None = None

    def values(self) -> dict[str, Any]:
        """The row to insert (a new id and the time of the write unless already given)."""
        return {
            "id": self.id or new_id("aud"),
            "ts": self.ts or utcnow(),
            "actor": self.actor,
            "action": self.action,
            "thread_id": self.thread_id,
            "run_id": self.run_id,
            "interrupt_id": self.interrupt_id,
            "call_id": self.call_id,
            "tool": self.tool,
            "args_digest": self.args_digest,
            "decision": self.decision,
            "reason": self.reason,
            "outcome": self.outcome,
            "details": self.details,
        }


def args_digest(args: Any) -> str:
    """A digest of (already masked) tool arguments, for the audit log."""
    canonical = json.dumps(args, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()[:32]


# -- rows → records ---------------------------------------------------------------------------


def thread_record(row: Any) -> ThreadRecord:
    """A :class:`ThreadRecord` from a ``threads`` row."""
    return ThreadRecord(
        id=row.id, owner=row.owner, metadata=row.metadata or {}, active_leaf_id=row.active_leaf_id, created_at=as_utc(row.created_at), title=row.title
    )


def cancel_mode_of(value: str | None) -> CancelMode | None:
    """A cancel mode as stored (a column, a notification): ``hard``, ``soft`` or none."""
    if value is None:
        return None
    return "hard" if value == "hard" else "soft"


def run_record(row: Any) -> RunRecord:
    """A :class:`RunRecord` from a ``runs`` row."""
    return RunRecord(
        id=row.id,
        thread_id=row.thread_id,
        status=RunStatus(row.status),
        config=row.config or {},
        input_message_id=row.input_message_id,
        created_at=as_utc(row.created_at),
        started_at=as_utc(row.started_at),
        ended_at=as_utc(row.ended_at),
        error=RunFailure.from_json(row.error),
        cancel_mode=cancel_mode_of(row.cancel_mode),
        cancel_reason=row.cancel_reason,
        cancel_actor=row.cancel_actor,
        executor_id=row.executor_id,
        lease_expires_at=row.lease_expires_at,
        requested_by=row.requested_by,
        usage=RunUsage.from_json(row.usage),
        trace_context=row.trace_context,
    )


def message_record(row: Any) -> MessageRecord:
    """A :class:`MessageRecord` from a ``messages`` row."""
    return MessageRecord(
        id=row.id,
        thread_id=row.thread_id,
        parent_id=row.parent_id,
        run_id=row.run_id,
        role=row.role,
        content=row.content,
        tool_calls=calls_of(row.tool_calls),
        tool_call_id=row.tool_call_id,
        name=row.name,
        status=row.status,
        created_at=as_utc(row.created_at),
        edited_from_id=row.edited_from_id,
        finish_reason=row.finish_reason,
    )


def message_values(message: MessageRecord) -> dict[str, Any]:
    """The ``messages`` row of a record, to insert."""
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
        "created_at": message.created_at,
        "edited_from_id": message.edited_from_id,
        "finish_reason": message.finish_reason,
    }


_ACTION_REQUESTS: TypeAdapter[list[ActionRequest]] = TypeAdapter(list[ActionRequest])
_REVIEW_CONFIGS: TypeAdapter[list[ReviewConfig]] = TypeAdapter(list[ReviewConfig])


def interrupt_record(row: Any) -> InterruptRecord:
    """An :class:`InterruptRecord` from an ``interrupts`` row: its JSON parsed here, once."""
    return InterruptRecord(
        id=row.id,
        run_id=row.run_id,
        thread_id=row.thread_id,
        status=row.status,
        action_requests=_ACTION_REQUESTS.validate_python(row.action_requests),
        review_configs=_REVIEW_CONFIGS.validate_python(row.review_configs),
        turn=ParkedTurn.model_validate(row.turn),
        decisions=DECISIONS.validate_python(row.decisions) if row.decisions is not None else None,
        resolved_by=row.resolved_by,
        created_at=as_utc(row.created_at),
        expires_at=as_utc(row.expires_at),
        resolved_at=as_utc(row.resolved_at),
        requested_by=getattr(row, "requested_by", None),
    )


def audit_entry(row: Any) -> AuditEntry:
    """An :class:`AuditEntry` (with its ``id`` and ``ts``) from an ``audit`` row."""
    return AuditEntry(
        action=row.action,
        actor=row.actor,
        thread_id=row.thread_id,
        run_id=row.run_id,
        interrupt_id=row.interrupt_id,
        call_id=row.call_id,
        tool=row.tool,
        args_digest=row.args_digest,
        decision=row.decision,
        reason=row.reason,
        outcome=row.outcome,
        details=row.details,
        id=row.id,
        ts=as_utc(row.ts),
    )


def key_record(row: Any) -> KeyRecord:
    """A :class:`KeyRecord` from an ``api_keys`` row (the hash stays behind)."""
    return KeyRecord(
        id=row.id,
        name=row.name,
        roles=tuple(row.roles or ()),
        prefix=row.prefix,
        created_at=as_utc(row.created_at),
        last_used_at=as_utc(row.last_used_at),
        expires_at=as_utc(row.expires_at),
        revoked_at=as_utc(row.revoked_at),
    )
