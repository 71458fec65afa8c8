"""An answer cut short: ``messages.finish_reason`` (``length``, the output limit; ``repetition``,
a repetition stop), null for every other message and for every message stored before.

Revision ID: 0013
Revises: 0012
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("messages", sa.Column("finish_reason", sa.String(16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("messages") as batch:
        batch.drop_column("finish_reason")
