"""Run leases: which process executes a run, and until when its claim holds.

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("executor_id", sa.String(64), nullable=True))
    op.add_column("runs", sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True))
    op.create_index("ix_runs_status_lease", "runs", ["status", "lease_expires_at"])


def downgrade() -> None:
    op.drop_index("ix_runs_status_lease", table_name="runs")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("lease_expires_at")
        batch.drop_column("executor_id")
