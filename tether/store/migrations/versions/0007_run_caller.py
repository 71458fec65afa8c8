"""An index for the cap on active runs per caller: runs by requester and status.

Revision ID: 0007
Revises: 0006
"""

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_runs_requested_by_status", "runs", ["requested_by", "status"])


def downgrade() -> None:
    op.drop_index("ix_runs_requested_by_status", table_name="runs")
