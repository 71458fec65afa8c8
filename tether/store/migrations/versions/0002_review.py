"""Human review: interrupts and the audit log.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

JSONType = sa.JSON().with_variant(JSONB(), "postgresql")
Timestamp = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "interrupts",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("run_id", sa.String(64), sa.ForeignKey("runs.id"), nullable=False),
        sa.Column("thread_id", sa.String(64), sa.ForeignKey("threads.id"), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("action_requests", JSONType, nullable=False),
        sa.Column("review_configs", JSONType, nullable=False),
        sa.Column("turn", JSONType, nullable=False),
        sa.Column("decisions", JSONType, nullable=True),
        sa.Column("resolved_by", sa.String(200), nullable=True),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.Column("expires_at", Timestamp, nullable=False),
        sa.Column("resolved_at", Timestamp, nullable=True),
    )
    op.create_index("ix_interrupts_run", "interrupts", ["run_id"])
    op.create_index("ix_interrupts_status_expires", "interrupts", ["status", "expires_at"])
    op.create_table(
        "audit",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("ts", Timestamp, nullable=False),
        sa.Column("actor", sa.String(200), nullable=False),
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
    )
    op.create_index("ix_audit_thread", "audit", ["thread_id", "ts"])
    op.create_index("ix_audit_run", "audit", ["run_id", "ts"])


def downgrade() -> None:
    op.drop_table("audit")
    op.drop_table("interrupts")
