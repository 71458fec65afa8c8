"""The durable store: threads, the message tree, runs, their event logs, interrupts and audit.

One code path for SQLite (the embedded default) and PostgreSQL: SQLAlchemy Core over an async
driver, schema created by Alembic migrations at open. State changes that must not race are
single conditional writes (``UPDATE … WHERE status IN (…)``) or database constraints, never
in-memory bookkeeping, so they hold across processes.

The store returns records (plain dataclasses); it knows nothing of HTTP. One module per concern,
each a part of :class:`Store` (which ``_store`` puts together); this module only re-exports:

- ``records``: the records and :class:`RunStatus`;
- ``_engine``: URLs, connections, SQLite settings, migrations at open;
- ``_tree``: threads and their message trees;
- ``_runs``: run creation, transitions and leases;
- ``_events``: the event log and its notifications (channel names and payloads in ``notify``);
- ``_interrupts``: interrupts, the approvals inbox and the audit log;
- ``_allowances``: standing approvals, given with a decision, read at the gate, revoked;
- ``_keys``: API keys and the principals they stand for;
- ``_idempotency``: ``Idempotency-Key`` records (claimed under a lease, answered, released,
  purged) and what a keyed request created;
- ``_lookup``: a resource with its thread's owner, in one query (for access checks).
"""

from __future__ import annotations

from ..events import StoredEvent
from ._allowances import AllowanceRecord, args_match
from ._engine import normalize_db_url
from ._idempotency import KEY_RETENTION, KeyClaim, KeyIdent, SeenKey, creating_under
from ._lookup import Found
from ._notify import CancelControl, ControlMessage, ReleasedControl
from ._records import (
    ACTIVE_RUN_STATUSES,
    EXECUTOR_RUN_STATUSES,
    ROLES,
    TERMINAL_RUN_STATUSES,
    AtLeaf,
    Attach,
    AuditEntry,
    CancelRequest,
    Fork,
    InterruptRecord,
    KeyRecord,
    MessageRecord,
    Principal,
    Regenerate,
    RunFailure,
    RunRecord,
    RunStatus,
    RunUsage,
    StoredCall,
    ThreadRecord,
    TurnOutcome,
    args_digest,
    run_record,
)
from ._runs import CreatedRun
from ._store import Store
from ._tree import MAX_TITLE_CHARS, clean_title, title_from_message

__all__ = [
    "Store",
    "Found",
    "Attach",
    "AtLeaf",
    "Fork",
    "Regenerate",
    "ThreadRecord",
    "RunRecord",
    "RunUsage",
    "RunFailure",
    "MessageRecord",
    "StoredCall",
    "InterruptRecord",
    "AuditEntry",
    "TurnOutcome",
    "CancelRequest",
    "CancelControl",
    "ReleasedControl",
    "ControlMessage",
    "CreatedRun",
    "Principal",
    "KeyRecord",
    "ROLES",
    "RunStatus",
    "ACTIVE_RUN_STATUSES",
    "TERMINAL_RUN_STATUSES",
    "EXECUTOR_RUN_STATUSES",
    "StoredEvent",
    "args_digest",
    "run_record",
    "normalize_db_url",
    "KeyIdent",
    "KeyClaim",
    "SeenKey",
    "KEY_RETENTION",
    "creating_under",
    "MAX_TITLE_CHARS",
    "clean_title",
    "title_from_message",
    "AllowanceRecord",
    "args_match",
]
