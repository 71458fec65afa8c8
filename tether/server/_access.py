"""Who may see and do what: the one place where ownership and roles are enforced.

Every route reads threads, runs, messages, interrupts, standing approvals and audit entries through an
:class:`Access` bound to the caller, never through the store directly, so a by-id route cannot
skip the check (the failure of aegra#485). The rules:

- A thread belongs to the principal that created it. Its runs, messages, interrupts and audit
  entries belong to it too.
- A ``user`` sees and acts only on their own threads. Anything else answers exactly as a
  missing resource does: the same 404, code and message, after the same single query (the
  store's ``find_*`` read a resource with its thread's owner at once), so neither the status
  nor the body nor the time tells that it exists.
- An ``approver`` may also *read* any thread that has (or had) an interrupt, and decide its
  interrupts; starting, steering or cancelling runs there is 403 ``not_the_owner``.
- The requester of a run may decide its interrupts (four-eyes aside, which the runtime checks);
  anyone else who can read the thread but is no approver gets 403 ``not_an_approver``.
- An ``admin`` may do everything, and read the whole audit log at once.
"""

from __future__ import annotations

from typing import Any, Literal

from .._ids import utcnow
from ..errors import Forbidden, InvalidRequest, NotFound
from ..store import AllowanceRecord, AuditEntry, Found, InterruptRecord, MessageRecord, Principal, RunRecord, Store, ThreadRecord

__all__ = ["Access", "Purpose"]

#: What the caller wants with a resource: ``read`` it, ``write`` (start, steer, cancel, switch
#: branches, edit), or ``decide`` an interrupt.
Purpose = Literal["read", "write", "decide"]


class Access:
    """The caller's view of the store: every read of a resource by a route goes through here."""

    def __init__(self, store: Store, principal: Principal) -> None:
        self.store = store
        self.principal = principal

    # -- the rule --------------------------------------------------------------------------

    def _check(self, found: Found[Any] | None, to: Purpose, missing: NotFound, *, requester: str | None = None) -> None:
        """Raise ``missing`` if the caller may not see ``found`` (or it is None); 403 if they may
        see it but not do ``to`` there."""
        if found is None:
            raise missing
        me = self.principal
        if me.is_admin:
            return
        own = found.owner == me.name
        if not own and not (me.is_approver and found.reviewable):
            raise missing
        if to == "write" and not own:
            raise Forbidden(
                "approvers may read this thread and decide its interrupts; only its owner starts, steers or cancels runs here", code="not_the_owner"
            )
        if to == "decide" and not me.is_approver and (requester or found.owner) != me.name:
            raise Forbidden("only the run's requester or an approver may decide this interrupt", code="not_an_approver")

    # -- resources by id: one lookup each, whether the resource is missing or not the caller's --

    async def thread(self, thread_id: str, *, to: Purpose = "read") -> ThreadRecord:
        """A thread the caller may ``to``; 404 ``thread_not_found`` if they may not see it."""
        found = await self.store.find_thread(thread_id)
        self._check(found, to, NotFound(f"thread {thread_id!r} not found", code="thread_not_found"))
        assert found is not None
        return found.record

    async def thread_to_start(self, thread_id: str, *, requested_by: str) -> tuple[ThreadRecord, int]:
        """A thread the caller may start a run on (as :meth:`thread` with ``to="write"``), and
        how many runs ``requested_by`` has queued, running or cancelling: one lookup."""
        found, busy = await self.store.find_thread_to_start(thread_id, requested_by=requested_by)
        self._check(found, "write", NotFound(f"thread {thread_id!r} not found", code="thread_not_found"))
        assert found is not None
        return found.record, busy

    async def run(self, run_id: str, *, to: Purpose = "read") -> RunRecord:
        """A run the caller may ``to`` (by its thread); 404 ``run_not_found`` if they may not see it."""
        found = await self.store.find_run(run_id)
        self._check(found, to, NotFound(f"run {run_id!r} not found", code="run_not_found"))
        assert found is not None
        return found.record

    async def message(self, message_id: str, *, to: Purpose = "read") -> MessageRecord:
        """A message the caller may ``to`` (by its thread); 404 ``message_not_found`` if they may not see it."""
        found = await self.store.find_message(message_id)
        self._check(found, to, NotFound(f"message {message_id!r} not found", code="message_not_found"))
        assert found is not None
        return found.record

    async def interrupt_to_decide(self, thread_id: str, interrupt_id: str) -> InterruptRecord:
        """An interrupt of ``thread_id`` the caller may decide: 404 for a thread they may not
        see or an interrupt not in it, 403 ``not_an_approver`` when they may see but not decide."""
        found = await self.store.find_thread(thread_id)
        self._check(found, "read", NotFound(f"thread {thread_id!r} not found", code="thread_not_found"))
        try:
            interrupt = await self.store.get_interrupt(interrupt_id)
        except NotFound:
            interrupt = None
        if interrupt is None or interrupt.thread_id != thread_id:
            raise NotFound(f"interrupt {interrupt_id!r} not found in thread {thread_id!r}", code="interrupt_not_found")
        self._check(found, "decide", NotFound("unreachable"), requester=interrupt.requested_by)
        return interrupt

    async def allowance_to_revoke(self, allowance_id: str) -> AllowanceRecord:
        """A standing approval the caller may revoke: whoever may decide the interrupts of its
        thread's runs it covers (their requester, an approver, an admin); 404
        ``allowance_not_found`` if they may not see its thread, 403 ``not_an_approver`` if they
        may see it but not decide."""
        found = await self.store.find_allowance(allowance_id)
        missing = NotFound(f"allowance {allowance_id!r} not found", code="allowance_not_found")
        self._check(found, "decide", missing, requester=found.record.principal if found is not None else None)
        assert found is not None
        return found.record

    # -- lists -----------------------------------------------------------------------------

    async def threads(self, *, limit: int) -> list[ThreadRecord]:
        """The caller's own threads, newest first (approvers find others' through the inbox)."""
        return await self.store.list_threads(owner=self.principal.name, limit=limit)

    async def inbox(self, *, limit: int) -> list[InterruptRecord]:
        """Pending interrupts the caller may decide, soonest expiry first: of the runs they
        started, or every one for approvers and admins."""
        requester = None if self.principal.is_approver else self.principal.name
        return await self.store.inbox(requested_by=requester, limit=limit)

    async def allowances(self, thread_id: str, *, limit: int) -> list[AllowanceRecord]:
        """The standing approvals of a thread the caller may read: active first, then past."""
        await self.thread(thread_id)
        return await self.store.list_allowances(thread_id, now=utcnow(), limit=limit)

    async def audit(self, *, thread_id: str | None, run_id: str | None, limit: int) -> list[AuditEntry]:
        """Audit entries of a thread or run the caller may read; an admin may ask for every entry."""
        if thread_id is None and run_id is None and not self.principal.is_admin:
            raise InvalidRequest("give thread_id or run_id (only admins may read the whole audit log)", code="audit_filter_required")
        if thread_id is not None:
            await self.thread(thread_id)
        if run_id is not None:
            await self.run(run_id)
        return await self.store.list_audit(thread_id=thread_id, run_id=run_id, limit=limit)

    # -- roles -----------------------------------------------------------------------------

    def require(self, role: str) -> None:
        """403 ``role_required`` unless the caller holds ``role``."""
        if not self.principal.has(role):
            raise Forbidden(f"this needs the {role!r} role", code="role_required")
