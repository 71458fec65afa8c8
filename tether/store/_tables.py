"""The schema, as SQLAlchemy Core tables (migrations in ``migrations/`` create it).

Plain portable SQL only: the same tables and queries serve SQLite and PostgreSQL. The rule "one
non-terminal run per thread" is a partial unique index, so the database enforces it for every
process that shares it.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa

from ._records import ACTIVE_RUN_STATUSES, EXECUTOR_RUN_STATUSES, RunStatus

__all__ = [
    "metadata",
    "threads",
    "messages",
    "runs",
    "events",
    "interrupts",
    "audit",
    "api_keys",
    "idempotency_keys",
    "allowances",
    "ACTIVE_RUN_STATUSES",
    "ACTIVE_RUN_SQL",
    "ONE_ACTIVE_RUN_INDEX",
    "add_partial_indexes",
    "has_active_run",
    "Hot",
]

metadata = sa.MetaData()

#: ``json``, not ``jsonb``, on PostgreSQL: jsonb reorders keys and rewrites numbers (``1e300``
#: comes back as an int), so values would not round-trip as they do on SQLite. Nothing queries
#: inside these columns, so jsonb buys nothing here (migration 0004).
JSONType = sa.JSON()


class UTCDateTime(sa.TypeDecorator[datetime]):
    """A timezone-aware timestamp stored as UTC and read back as aware UTC on every backend.

    SQLite keeps no offset: a ``+02:00`` datetime would be stored as its wall time and come back
    two hours off (and compare wrongly in ``WHERE expires_at <= :now``). Converting at the bind
    makes both backends store and compare the same instant. Naive datetimes are taken as UTC.
    """

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


Timestamp = UTCDateTime()

#: The condition of the partial unique index "at most one active run per thread" (migration 0001
#: wrote it with this very text: ``status IN ('queued', 'running', 'waiting_human', 'cancelling')``).
ACTIVE_RUN_SQL = "status IN (" + ", ".join(f"'{status.value}'" for status in ACTIVE_RUN_STATUSES) + ")"

threads = sa.Table(
    "threads",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("owner", sa.String(200), nullable=False),
    sa.Column("metadata", JSONType, nullable=False),
    sa.Column("active_leaf_id", sa.String(64), nullable=True),
    sa.Column("created_at", Timestamp, nullable=False),
    sa.Column("updated_at", Timestamp, nullable=False),
    # Given, renamed, or taken from the first message (migration 0012); null until then.
    sa.Column("title", sa.String(200), nullable=True),
    sa.Index("ix_threads_owner_created", "owner", "created_at"),
)

messages = sa.Table(
    "messages",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("thread_id", sa.String(64), sa.ForeignKey("threads.id"), nullable=False),
    sa.Column("parent_id", sa.String(64), sa.ForeignKey("messages.id"), nullable=True),
    sa.Column("run_id", sa.String(64), nullable=True),
    sa.Column("role", sa.String(16), nullable=False),
    sa.Column("content", sa.Text, nullable=False),
    sa.Column("tool_calls", JSONType, nullable=True),
    sa.Column("tool_call_id", sa.String(128), nullable=True),
    sa.Column("name", sa.String(200), nullable=True),
    # complete | partial | cancelled | failed
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("created_at", Timestamp, nullable=False),
    # A user's edited version of an assistant message points at the message it replaces.
    sa.Column("edited_from_id", sa.String(64), nullable=True),
    # An answer cut short (migration 0013): length | repetition; null when the model ended it.
    sa.Column("finish_reason", sa.String(16), nullable=True),
    sa.Index("ix_messages_thread", "thread_id", "created_at"),
    sa.Index("ix_messages_parent", "parent_id"),
)

runs = sa.Table(
    "runs",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("thread_id", sa.String(64), sa.ForeignKey("threads.id"), nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("config", JSONType, nullable=False),
    sa.Column("input_message_id", sa.String(64), nullable=True),
    sa.Column("created_at", Timestamp, nullable=False),
    sa.Column("started_at", Timestamp, nullable=True),
    sa.Column("ended_at", Timestamp, nullable=True),
    sa.Column("error", JSONType, nullable=True),
    sa.Column("cancel_mode", sa.String(8), nullable=True),
    sa.Column("cancel_reason", sa.Text, nullable=True),
    sa.Column("cancel_actor", sa.String(200), nullable=True),
    # The process executing the run and until when its claim holds (renewed while it runs);
    # a lapsed claim lets another process take the run over.
    sa.Column("executor_id", sa.String(64), nullable=True),
    sa.Column("lease_expires_at", Timestamp, nullable=True),
    # The principal who started the run: may decide its interrupts (unless four-eyes applies).
    sa.Column("requested_by", sa.String(200), nullable=True),
    # Tokens the run's model calls consumed: totals and one entry per call (see RunStore.add_usage).
    sa.Column("usage", JSONType, nullable=True),
    # The W3C traceparent that every stretch of the run continues (tether.telemetry).
    sa.Column("trace_context", sa.String(64), nullable=True),
    sa.Index("ix_runs_thread", "thread_id", "created_at"),
    sa.Index("ix_runs_requested_by_status", "requested_by", "status"),
    sa.Index("ix_runs_status_lease", "status", "lease_expires_at"),
    # And the partial unique index ONE_ACTIVE_RUN_INDEX: see add_partial_indexes.
)

#: The partial unique index that keeps one non-terminal run per thread (the store recognises
#: its refusals by this name).
ONE_ACTIVE_RUN_INDEX = "uq_runs_one_active_per_thread"


def add_partial_indexes() -> None:
    """Add :data:`ONE_ACTIVE_RUN_INDEX` to ``runs`` as the migrations create it (once).

    Only the migrations' environment needs its definition: the store knows it by name. Its
    PostgreSQL option loads SQLAlchemy's PostgreSQL dialect (about 2.4 MiB), which a server on
    SQLite otherwise never imports.
    """
    if any(index.name == ONE_ACTIVE_RUN_INDEX for index in runs.indexes):
        return
    sa.Index(
        ONE_ACTIVE_RUN_INDEX,
        runs.c.thread_id,
        unique=True,
        sqlite_where=sa.text(ACTIVE_RUN_SQL),
        postgresql_where=sa.text(ACTIVE_RUN_SQL),
    )


events = sa.Table(
    "events",
    metadata,
    sa.Column("run_id", sa.String(64), sa.ForeignKey("runs.id"), primary_key=True),
    sa.Column("seq", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("type", sa.String(32), nullable=False),
    # The canonical envelope JSON, byte for byte what SSE sends.
    sa.Column("envelope", sa.Text, nullable=False),
)

interrupts = sa.Table(
    "interrupts",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("run_id", sa.String(64), sa.ForeignKey("runs.id"), nullable=False),
    sa.Column("thread_id", sa.String(64), sa.ForeignKey("threads.id"), nullable=False),
    # pending | resolved | expired | cancelled; exactly one transition ever leaves pending.
    sa.Column("status", sa.String(16), nullable=False),
    # What reviewers see (sensitive args masked).
    sa.Column("action_requests", JSONType, nullable=False),
    sa.Column("review_configs", JSONType, nullable=False),
    # The parked model turn: its assistant message id and every tool call in the model's order,
    # with real args, decisions and the results already obtained. Never shown through the API.
    sa.Column("turn", JSONType, nullable=False),
    sa.Column("decisions", JSONType, nullable=True),
    sa.Column("resolved_by", sa.String(200), nullable=True),
    sa.Column("created_at", Timestamp, nullable=False),
    sa.Column("expires_at", Timestamp, nullable=False),
    sa.Column("resolved_at", Timestamp, nullable=True),
    sa.Index("ix_interrupts_run", "run_id"),
    sa.Index("ix_interrupts_status_expires", "status", "expires_at"),
)

audit = sa.Table(
    "audit",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("ts", Timestamp, nullable=False),
    sa.Column("actor", sa.String(200), nullable=False),
    # decision | expired | cancel | tool_executed
    sa.Column("action", sa.String(32), nullable=False),
    sa.Column("thread_id", sa.String(64), nullable=True),
    sa.Column("run_id", sa.String(64), nullable=True),
    sa.Column("interrupt_id", sa.String(64), nullable=True),
    sa.Column("call_id", sa.String(128), nullable=True),
    sa.Column("tool", sa.String(200), nullable=True),
    sa.Column("args_digest", sa.String(80), nullable=True),
    sa.Column("decision", sa.String(16), nullable=True),
    sa.Column("reason", sa.Text, nullable=True),
    sa.Column("outcome", sa.String(32), nullable=True),
    sa.Column("details", JSONType, nullable=True),
    sa.Index("ix_audit_thread", "thread_id", "ts"),
    sa.Index("ix_audit_run", "run_id", "ts"),
)


api_keys = sa.Table(
    "api_keys",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    # The principal the key stands for, and its roles (``user``, ``approver``, ``admin``).
    sa.Column("name", sa.String(200), nullable=False),
    sa.Column("roles", JSONType, nullable=False),
    # The key's first characters, to tell keys apart in listings (never enough to use it).
    sa.Column("prefix", sa.String(32), nullable=False),
    # SHA-256 of the whole key, hex: the key itself is never stored.
    sa.Column("key_hash", sa.String(64), nullable=False),
    sa.Column("created_at", Timestamp, nullable=False),
    sa.Column("last_used_at", Timestamp, nullable=True),
    sa.Column("expires_at", Timestamp, nullable=True),
    sa.Column("revoked_at", Timestamp, nullable=True),
    sa.Index("uq_api_keys_hash", "key_hash", unique=True),
    sa.Index("ix_api_keys_name", "name"),
)


#: ``Idempotency-Key`` records (migrations 0009, 0011): one per principal, route and key, kept
#: 24 h; in flight under a short lease held by one request, then its kept answer.
idempotency_keys = sa.Table(
    "idempotency_keys",
    metadata,
    sa.Column("principal", sa.String(200), primary_key=True),
    sa.Column("route", sa.String(300), primary_key=True),
    sa.Column("key", sa.String(255), primary_key=True),
    sa.Column("body_hash", sa.String(64), nullable=False),
    # in_flight | done
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("status_code", sa.Integer, nullable=True),
    sa.Column("content_type", sa.String(100), nullable=True),
    sa.Column("response", sa.Text, nullable=True),
    sa.Column("created_at", Timestamp, nullable=False),
    sa.Column("expires_at", Timestamp, nullable=False),
    # In flight: the request holding the key, and until when (renewed while it runs).
    sa.Column("holder", sa.String(64), nullable=True),
    sa.Column("lease_expires_at", Timestamp, nullable=True),
    # What the holder created (a run or thread id), in the transaction that created it.
    sa.Column("resource", sa.String(64), nullable=True),
    sa.Index("ix_idempotency_keys_expires", "expires_at"),
)


#: Standing approvals (migration 0014): an approval that also allows calls like it, in one
#: thread, for a while. Read at every gate that could use one (never cached), so an expiry or a
#: revocation holds at once in every process.
allowances = sa.Table(
    "allowances",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("thread_id", sa.String(64), sa.ForeignKey("threads.id"), nullable=False),
    # The run it covers (scope run); null for scope thread.
    sa.Column("run_id", sa.String(64), nullable=True),
    # run | thread
    sa.Column("scope", sa.String(8), nullable=False),
    sa.Column("tool", sa.String(200), nullable=False),
    # same | any
    sa.Column("args", sa.String(8), nullable=False),
    # As the audit shows a call's arguments (masked); null for args any.
    sa.Column("args_digest", sa.String(80), nullable=True),
    # What a call's real, validated arguments must hash to (args same); never shown.
    sa.Column("args_match", sa.String(80), nullable=True),
    # The tier of the approved call: the calls it covers are at most this tier.
    sa.Column("risk", sa.String(16), nullable=False),
    # Whose runs it covers: the requester of the run it was given in.
    sa.Column("principal", sa.String(200), nullable=True),
    # The decision that created it.
    sa.Column("interrupt_id", sa.String(64), nullable=False),
    sa.Column("call_id", sa.String(128), nullable=False),
    sa.Column("created_by", sa.String(200), nullable=False),
    sa.Column("created_at", Timestamp, nullable=False),
    sa.Column("expires_at", Timestamp, nullable=False),
    sa.Column("revoked_at", Timestamp, nullable=True),
    sa.Column("revoked_by", sa.String(200), nullable=True),
    sa.Index("ix_allowances_gate", "thread_id", "tool", "expires_at"),
    sa.Index("ix_allowances_thread", "thread_id", "created_at"),
)


def has_active_run(thread_id: str) -> sa.Exists:
    """``EXISTS`` a run of the thread that is not terminal (for conditional writes)."""
    return sa.exists().where(runs.c.thread_id == thread_id, runs.c.status.in_(ACTIVE_RUN_STATUSES))


class Hot:
    """Statements of the hot paths (a run's start, its first model call), built once.

    Building a SQLAlchemy statement and its cache key costs more than SQLite takes to run a
    small one, so the statements every run start makes are made here, with bound parameters,
    and executed with a dict of values. The store's plans know them (:meth:`statements`) and
    bind each once (``_plans.BoundPlan``).
    """

    @classmethod
    def statements(cls) -> list[sa.ClauseElement]:
        """Every statement defined here."""
        return [value for value in vars(cls).values() if isinstance(value, sa.ClauseElement)]

    thread_by_id = threads.select().where(threads.c.id == sa.bindparam("thread_id"))
    message_by_id = messages.select().where(messages.c.id == sa.bindparam("message_id"))
    run_by_id = runs.select().where(runs.c.id == sa.bindparam("run_id"))
    insert_run = runs.insert()
    insert_message = messages.insert()
    set_active_leaf = (
        threads.update().where(threads.c.id == sa.bindparam("of_thread")).values(active_leaf_id=sa.bindparam("leaf_id"), updated_at=sa.bindparam("now"))
    )
    #: The same, and the thread's title from its first message when it has none yet.
    set_active_leaf_and_title = (
        threads.update()
        .where(threads.c.id == sa.bindparam("of_thread"))
        .values(
            active_leaf_id=sa.bindparam("leaf_id"),
            updated_at=sa.bindparam("now"),
            title=sa.func.coalesce(threads.c.title, sa.bindparam("title", type_=sa.String)),
        )
    )
    mark_running = runs.update().where(runs.c.id == sa.bindparam("run_id"), runs.c.status == "queued").values(status="running", started_at=sa.bindparam("now"))
    insert_event = events.insert()
    #: A run's terminal write: only from one of ``from_statuses`` (and, for ``…_as_executor``,
    #: only while this process holds the run).
    #: ``from_status_0`` … one per status (a shorter list repeats its first): a fixed ``IN``
    #: list, not an expanding one, whose SQL would be rebuilt at every call (40 µs).
    finish_run = (
        runs.update()
        .where(runs.c.id == sa.bindparam("run_id"), runs.c.status.in_([sa.bindparam(f"from_status_{i}") for i in range(len(RunStatus))]))
        .values(status=sa.bindparam("status"), ended_at=sa.bindparam("now"), error=sa.bindparam("error", type_=runs.c.error.type))
    )
    finish_run_as_executor = finish_run.where(runs.c.executor_id == sa.bindparam("held_by"))
    #: The ``cancelled`` end of a ``cancelling`` run, as long as the request's mode is the one
    #: its terminal event says (a ``hard`` upgrade in between makes it match no row).
    finish_cancelling_as_executor = finish_run_as_executor.where(runs.c.cancel_mode == sa.bindparam("expected_cancel_mode"))
    #: The end of a run that records the cancel request which ended it, in the same write.
    finish_run_cancelled_as_executor = finish_run_as_executor.values(
        cancel_mode=sa.bindparam("cancel_mode_value"), cancel_reason=sa.bindparam("cancel_reason_value"), cancel_actor=sa.bindparam("cancel_actor_value")
    )
    cancel_pending_interrupts = (
        interrupts.update()
        .where(interrupts.c.run_id == sa.bindparam("of_run"), interrupts.c.status == "pending")
        .values(status="cancelled", resolved_at=sa.bindparam("now"))
    )
    run_usage = sa.select(runs.c.usage).where(runs.c.id == sa.bindparam("run_id"))
    set_run_usage = runs.update().where(runs.c.id == sa.bindparam("run_id")).values(usage=sa.bindparam("usage", type_=runs.c.usage.type))
    #: A model turn's final state (``…_with_calls`` also sets its tool calls).
    store_turn = (
        messages.update()
        .where(messages.c.id == sa.bindparam("message_id"))
        .values(content=sa.bindparam("content"), status=sa.bindparam("status"), finish_reason=sa.bindparam("finish_reason"))
    )
    store_turn_with_calls = store_turn.values(tool_calls=sa.bindparam("tool_calls", type_=messages.c.tool_calls.type))
    #: Runs of ``requested_by`` that hold a process (queued, running, cancelling). The statuses
    #: are SQL literals in the statement: a list of values would be expanded into the SQL at
    #: every call (10 µs of a run start's).
    count_busy_runs = (
        sa.select(sa.func.count())
        .select_from(runs)
        .where(
            runs.c.requested_by == sa.bindparam("requested_by"),
            runs.c.status.in_([sa.literal_column(f"'{status.value}'") for status in EXECUTOR_RUN_STATUSES]),
        )
    )
