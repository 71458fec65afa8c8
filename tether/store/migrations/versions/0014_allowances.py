"""Standing approvals: ``allowances``, each an approval that also allows calls like it in one
thread (the rest of a run, or any run of the thread) until it expires or is revoked.

Revision ID: 0014
Revises: 0013
"""

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    ts = sa.DateTime(timezone=True)
    op.create_table(
        "allowances",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("thread_id", sa.String(64), sa.ForeignKey("threads.id"), nullable=False),
        sa.Column("run_id", sa.String(64), nullable=True),
        sa.Column("scope", sa.String(8), nullable=False),
        sa.Column("tool", sa.String(200), nullable=False),
        sa.Column("args", sa.String(8), nullable=False),
        sa.Column("args_digest", sa.String(80), nullable=True),
        sa.Column("args_match", sa.String(80), nullable=True),
        sa.Column("risk", sa.String(16), nullable=False),
        sa.Column("principal", sa.String(200), nullable=True),
        sa.Column("interrupt_id", sa.String(64), nullable=False),
        sa.Column("call_id", sa.String(128), nullable=False),
        sa.Column("created_by", sa.String(200), nullable=False),
        sa.Column("created_at", ts, nullable=False),
        sa.Column("expires_at", ts, nullable=False),
        sa.Column("revoked_at", ts, nullable=True),
        sa.Column("revoked_by", sa.String(200), nullable=True),
    )
    op.create_index("ix_allowances_gate", "allowances", ["thread_id", "tool", "expires_at"])
    op.create_index("ix_allowances_thread", "allowances", ["thread_id", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_allowances_thread", table_name="allowances")
    op.drop_index("ix_allowances_gate", table_name="allowances")
    op.drop_table("allowances")
