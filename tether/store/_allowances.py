"""The store's standing approvals ("allowances"): written with the decision that gives them,
read at every gate that could use one, listed, revoked.

An allowance is created in the very transaction that resolves its interrupt
(:meth:`~tether.store.Store.leave_pending` calls :func:`insert_allowances`), so of two racing
approvals that both ask for one, only the winner's exists. Nothing about allowances is cached:
the gate reads the active ones of a thread when a call could use one, so an expiry (compared
with the time of that read) or a revocation (one conditional write) holds at once in every
process that shares the database.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, cast

import sqlalchemy as sa

from .._ids import as_utc
from ..events import format_ts
from ..review import AllowScope
from ..tools import RISK_ORDER, AllowArgs, Risk
from ._engine import StoreBase, Writing
from ._lookup import Found, _reviewable
from ._records import AuditEntry
from ._tables import allowances, audit, threads

if TYPE_CHECKING:
    from ..webhooks._outbox import Outbox

__all__ = ["AllowanceRecord", "AllowanceStore", "insert_allowances", "args_match"]


def args_match(args: Any) -> str:
    """What a call's real, validated arguments hash to for an allowance of ``args: same``: the
    SHA-256 of their canonical JSON (keys sorted, no spaces). Two calls are "the same" exactly
    when these are equal."""
    canonical = json.dumps(args, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True, slots=True, kw_only=True)
class AllowanceRecord:
    """One standing approval: calls of ``tool`` in ``thread_id`` (and ``run_id``, for scope
    ``run``) of runs ``principal`` requested, at most of tier ``risk``, with the approved call's
    arguments (``args: same``) or any (``any``), run without asking until ``expires_at``."""

    id: str
    thread_id: str
    #: The run it covers (scope ``run``); None for scope ``thread``.
    run_id: str | None
    scope: AllowScope
    tool: str
    args: AllowArgs
    #: The approved call's arguments as the audit shows them (masked); None for ``args: any``.
    args_digest: str | None
    #: The tier of the approved call: a call of a higher tier is never covered.
    risk: Risk
    #: Whose runs it covers (the requester of the run it was given in).
    principal: str | None
    #: The decision that created it: its interrupt and call.
    interrupt_id: str
    call_id: str
    created_by: str
    created_at: datetime
    expires_at: datetime
    revoked_at: datetime | None = None
    revoked_by: str | None = None
    #: What a covered call's real arguments hash to (:func:`args_match`); never shown.
    args_match: str | None = field(default=None, repr=False)

    def status(self, now: datetime) -> str:
        """``active``, ``revoked`` or ``expired``."""
        if self.revoked_at is not None:
            return "revoked"
        return "active" if self.expires_at > now else "expired"

    def covers(self, *, tool: str, risk: Risk, match: str) -> bool:
        """Whether a call of ``tool`` of tier ``risk`` whose arguments hash to ``match`` is one
        this allowance covers (its thread, run, principal and time are the store's query)."""
        if tool != self.tool or RISK_ORDER[risk] > RISK_ORDER[self.risk]:
            return False
        return self.args == "any" or match == self.args_match

    def as_json(self, now: datetime) -> dict[str, Any]:
        """The allowance as the API and the ``allowance.created`` webhook show it."""
        return {
            "id": self.id,
            "thread_id": self.thread_id,
            "run_id": self.run_id,
            "tool": self.tool,
            "args": self.args,
            "args_digest": self.args_digest,
            "scope": self.scope,
            "risk": self.risk,
            "status": self.status(now),
            "interrupt_id": self.interrupt_id,
            "call_id": self.call_id,
            "created_by": self.created_by,
            "created_at": format_ts(self.created_at),
            "expires_at": format_ts(self.expires_at),
            "revoked_at": format_ts(self.revoked_at) if self.revoked_at is not None else None,
            "revoked_by": self.revoked_by,
        }

    def values(self) -> dict[str, Any]:
        """The row to insert."""
        return {
            "id": self.id,
            "thread_id": self.thread_id,
            "run_id": self.run_id,
            "scope": self.scope,
            "tool": self.tool,
            "args": self.args,
            "args_digest": self.args_digest,
            "args_match": self.args_match,
            "risk": self.risk,
            "principal": self.principal,
            "interrupt_id": self.interrupt_id,
            "call_id": self.call_id,
            "created_by": self.created_by,
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "revoked_at": self.revoked_at,
            "revoked_by": self.revoked_by,
        }

    def audit_entry(self, action: str, actor: str, *, outcome: str) -> AuditEntry:
        """Its ``allowance_created`` / ``allowance_revoked`` / ``allowed`` entry's common part."""
        return AuditEntry(
            action=action,
            actor=actor,
            thread_id=self.thread_id,
            run_id=self.run_id,
            interrupt_id=self.interrupt_id,
            call_id=self.call_id,
            tool=self.tool,
            args_digest=self.args_digest,
            outcome=outcome,
            details={"allowance_id": self.id, "scope": self.scope, "args": self.args, "risk": self.risk, "expires_at": format_ts(self.expires_at)},
        )


def allowance_record(row: Any) -> AllowanceRecord:
    """An :class:`AllowanceRecord` from an ``allowances`` row."""
    return AllowanceRecord(
        id=row.id,
        thread_id=row.thread_id,
        run_id=row.run_id,
        scope=cast("AllowScope", row.scope),
        tool=row.tool,
        args=cast("AllowArgs", row.args),
        args_digest=row.args_digest,
        risk=cast("Risk", row.risk),
        principal=row.principal,
        interrupt_id=row.interrupt_id,
        call_id=row.call_id,
        created_by=row.created_by,
        created_at=as_utc(row.created_at),
        expires_at=as_utc(row.expires_at),
        revoked_at=as_utc(row.revoked_at) if row.revoked_at is not None else None,
        revoked_by=row.revoked_by,
        args_match=row.args_match,
    )


async def insert_allowances(conn: Writing, records: Sequence[AllowanceRecord], outbox: Outbox | None) -> None:
    """In the transaction of the decision that gives them: the allowances, their
    ``allowance_created`` audit entries and their ``allowance.created`` notifications."""
    if not records:
        return
    await conn.execute(allowances.insert(), [r.values() for r in records])
    await conn.execute(audit.insert(), [r.audit_entry("allowance_created", r.created_by, outcome="created").values() for r in records])
    if outbox is not None:
        for record in records:
            await outbox.allowance_created(conn, record)


def _active(now: datetime) -> list[Any]:
    return [allowances.c.revoked_at.is_(None), allowances.c.expires_at > now]


class AllowanceStore(StoreBase):
    """Standing approval operations of :class:`~tether.store.Store`."""

    async def covering_allowances(self, *, thread_id: str, run_id: str, principal: str | None, tools: Collection[str], now: datetime) -> list[AllowanceRecord]:
        """The allowances active at ``now`` that could cover calls of ``tools`` in ``run_id``
        of ``thread_id``, requested by ``principal``: of that thread, scope ``thread`` or that
        run, not revoked, not expired, oldest first. Read at the gate, every time."""
        t = allowances
        whose = t.c.principal == principal if principal is not None else t.c.principal.is_(None)
        query = (
            sa.select(t)
            .where(t.c.thread_id == thread_id, t.c.tool.in_(sorted(tools)), whose, *_active(now), sa.or_(t.c.scope == "thread", t.c.run_id == run_id))
            .order_by(t.c.created_at, t.c.id)
        )
        async with self._reading() as conn:
            return [allowance_record(row) for row in await conn.execute(query)]

    async def list_allowances(self, thread_id: str, *, now: datetime, limit: int = 200) -> list[AllowanceRecord]:
        """The thread's allowances: the active ones first, then the past ones (expired or
        revoked), each newest first."""
        t = allowances
        past = sa.case((sa.and_(*_active(now)), 0), else_=1)
        query = sa.select(t).where(t.c.thread_id == thread_id).order_by(past, t.c.created_at.desc(), t.c.id.desc()).limit(limit)
        async with self._reading() as conn:
            return [allowance_record(row) for row in await conn.execute(query)]

    async def find_allowance(self, allowance_id: str) -> Found[AllowanceRecord] | None:
        """An allowance, its thread's owner and whether that thread has interrupts; None if missing."""
        query = (
            sa.select(allowances, threads.c.owner.label("tether_owner"), _reviewable(allowances.c.thread_id))
            .join(threads, threads.c.id == allowances.c.thread_id)
            .where(allowances.c.id == allowance_id)
        )
        async with self._point_reading() as conn:
            row = (await conn.execute(query)).first()
        return (
            None
            if row is None
            else Found(record=allowance_record(row), thread_id=row.thread_id, owner=row.tether_owner, reviewable=bool(row.tether_reviewable))
        )

    async def revoke_allowance(self, allowance_id: str, *, actor: str, now: datetime) -> bool:
        """Revoke an active allowance: from this write on, no gate in any process finds it.
        Audited as ``allowance_revoked`` in the same transaction. False (nothing written) when
        it was revoked already, expired or does not exist."""
        t = allowances
        async with self._writing() as conn:
            row = (await conn.execute(sa.select(t).where(t.c.id == allowance_id))).first()
            if row is None:
                return False
            revoked = await conn.execute(t.update().where(t.c.id == allowance_id, *_active(now)).values(revoked_at=now, revoked_by=actor))
            if revoked.rowcount != 1:
                return False
            entry = allowance_record(row).audit_entry("allowance_revoked", actor, outcome="revoked")
            await conn.execute(audit.insert(), [entry.values()])
        return True
