"""Webhooks and idempotency under faults: an endpoint's stored state (disabled by a 410, for
every process, until an admin enables it), each delivery's run (its trace context), an index for
purging finished deliveries; an ``Idempotency-Key``'s short in-flight lease, its holder and what
the request created (a run, a thread), so a retry after a crash takes the key over or replays
what was created.

Revision ID: 0011
Revises: 0010
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    ts = sa.DateTime(timezone=True)
    op.create_table(
        "webhook_endpoints",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("disabled_at", ts, nullable=True),
        sa.Column("disabled_reason", sa.Text, nullable=True),
        sa.Column("updated_at", ts, nullable=False),
        sa.Column("updated_by", sa.String(200), nullable=True),
    )
    op.add_column("webhook_outbox", sa.Column("run_id", sa.String(64), nullable=True))
    op.create_index("ix_webhook_outbox_finished", "webhook_outbox", ["finished_at"])
    op.add_column("idempotency_keys", sa.Column("holder", sa.String(64), nullable=True))
    op.add_column("idempotency_keys", sa.Column("lease_expires_at", ts, nullable=True))
    op.add_column("idempotency_keys", sa.Column("resource", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("idempotency_keys") as batch:
        batch.drop_column("resource")
        batch.drop_column("lease_expires_at")
        batch.drop_column("holder")
    op.drop_index("ix_webhook_outbox_finished", table_name="webhook_outbox")
    with op.batch_alter_table("webhook_outbox") as batch:
        batch.drop_column("run_id")
    op.drop_table("webhook_endpoints")
