"""Identity: API keys (stored as hashes) and the principal who requested each run.

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("roles", sa.JSON(), nullable=False),
        sa.Column("prefix", sa.String(32), nullable=False),
        sa.Column("key_hash", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index("uq_api_keys_hash", "api_keys", ["key_hash"], unique=True)
    op.create_index("ix_api_keys_name", "api_keys", ["name"])
    op.add_column("runs", sa.Column("requested_by", sa.String(200), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("requested_by")
    op.drop_index("ix_api_keys_name", table_name="api_keys")
    op.drop_index("uq_api_keys_hash", table_name="api_keys")
    op.drop_table("api_keys")
