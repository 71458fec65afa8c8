"""The schema, as SQLAlchemy Core tables (migrations in ``migrations/`` create it).

Plain portable SQL only: the same tables and queries serve SQLite and PostgreSQL. The rule "one
non-terminal run per thread" is a partial unique index, so the database enforces it for every
process that shares it.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB

metadata = sa.MetaData()

JSONType = sa.JSON().with_variant(JSONB(), "postgresql")
Timestamp = sa.DateTime(timezone=True)

#: Run statuses that are not terminal: at most one run per thread may be in one of these.
ACTIVE_RUN_STATUSES = ("queued", "running", "waiting_human", "cancelling")
ACTIVE_RUN_SQL = "status IN ('queued', 'running', 'waiting_human', 'cancelling')"

threads = sa.Table(
    "threads",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("owner", sa.String(200), nullable=False),
    sa.Column("metadata", JSONType, nullable=False),
    sa.Column("active_leaf_id", sa.String(64), nullable=True),
    sa.Column("created_at", Timestamp, nullable=False),
    sa.Column("updated_at", Timestamp, nullable=False),
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
    sa.Index("ix_runs_thread", "thread_id", "created_at"),
    sa.Index(
        "uq_runs_one_active_per_thread",
        "thread_id",
        unique=True,
        sqlite_where=sa.text(ACTIVE_RUN_SQL),
        postgresql_where=sa.text(ACTIVE_RUN_SQL),
    ),
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
