"""Run usage: the tokens a run's model calls consumed, per call and in total.

Revision ID: 0008
Revises: 0007
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("usage", sa.JSON(), nullable=True))  # json, not jsonb, like the others (0004)


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("usage")
