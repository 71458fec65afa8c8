"""Core schema: threads, messages, runs, events.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

JSONType = sa.JSON().with_variant(JSONB(), "postgresql")
Timestamp = sa.DateTime(timezone=True)
ACTIVE_RUN_SQL = "status IN ('queued', 'running', 'waiting_human', 'cancelling')"


def upgrade() -> None:
    op.create_table(
        "threads",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("owner", sa.String(200), nullable=False),
        sa.Column("metadata", JSONType, nullable=False),
        sa.Column("active_leaf_id", sa.String(64), nullable=True),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.Column("updated_at", Timestamp, nullable=False),
    )
    op.create_index("ix_threads_owner_created", "threads", ["owner", "created_at"])
    op.create_table(
        "messages",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("thread_id", sa.String(64), sa.ForeignKey("threads.id"), nullable=False),
        sa.Column("parent_id", sa.String(64), sa.ForeignKey("messages.id"), nullable=True),
        sa.Column("run_id", sa.String(64), nullable=True),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("content", sa.Text, nullable=False),
        sa.Column("tool_calls", JSONType, nullable=True),
        sa.Column("tool_call_id", sa.String(128), nullable=True),
        sa.Column("name", sa.String(200), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("created_at", Timestamp, nullable=False),
    )
    op.create_index("ix_messages_thread", "messages", ["thread_id", "created_at"])
    op.create_index("ix_messages_parent", "messages", ["parent_id"])
    op.create_table(
        "runs",
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
    )
    op.create_index("ix_runs_thread", "runs", ["thread_id", "created_at"])
    op.create_index(
        "uq_runs_one_active_per_thread",
        "runs",
        ["thread_id"],
        unique=True,
        sqlite_where=sa.text(ACTIVE_RUN_SQL),
        postgresql_where=sa.text(ACTIVE_RUN_SQL),
    )
    op.create_table(
        "events",
        sa.Column("run_id", sa.String(64), sa.ForeignKey("runs.id"), primary_key=True),
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("type", sa.String(32), nullable=False),
        sa.Column("envelope", sa.Text, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("events")
    op.drop_index("uq_runs_one_active_per_thread", table_name="runs")
    op.drop_table("runs")
    op.drop_table("messages")
    op.drop_table("threads")
