"""Webhooks and idempotency: the outbox of notifications, their delivery attempts, and the
stored answers of requests sent with an ``Idempotency-Key``.

Revision ID: 0009
Revises: 0008
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    ts = sa.DateTime(timezone=True)
    op.create_table(
        "webhook_outbox",
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("id", sa.String(64), nullable=False, unique=True),
        sa.Column("endpoint", sa.String(64), nullable=False),
        sa.Column("event_type", sa.String(40), nullable=False),
        sa.Column("thread_id", sa.String(64), nullable=False),
        sa.Column("interrupt_id", sa.String(64), nullable=True),
        sa.Column("body", sa.Text, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("created_at", ts, nullable=False),
        sa.Column("next_attempt_at", ts, nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("lease_owner", sa.String(64), nullable=True),
        sa.Column("lease_expires_at", ts, nullable=True),
        sa.Column("last_error", sa.Text, nullable=True),
        sa.Column("finished_at", ts, nullable=True),
    )
    op.create_index("ix_webhook_outbox_due", "webhook_outbox", ["status", "next_attempt_at"])
    op.create_index("ix_webhook_outbox_order", "webhook_outbox", ["endpoint", "thread_id", "status", "seq"])
    op.create_table(
        "webhook_attempts",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("outbox_id", sa.String(64), nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("sender", sa.String(64), nullable=False),
        sa.Column("started_at", ts, nullable=False),
        sa.Column("duration_ms", sa.Integer, nullable=False),
        sa.Column("status_code", sa.Integer, nullable=True),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("error", sa.Text, nullable=True),
    )
    op.create_index("ix_webhook_attempts_outbox", "webhook_attempts", ["outbox_id", "attempt"])
    op.create_table(
        "idempotency_keys",
        sa.Column("principal", sa.String(200), primary_key=True),
        sa.Column("route", sa.String(300), primary_key=True),
        sa.Column("key", sa.String(255), primary_key=True),
        sa.Column("body_hash", sa.String(64), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("status_code", sa.Integer, nullable=True),
        sa.Column("content_type", sa.String(100), nullable=True),
        sa.Column("response", sa.Text, nullable=True),
        sa.Column("created_at", ts, nullable=False),
        sa.Column("expires_at", ts, nullable=False),
    )
    op.create_index("ix_idempotency_keys_expires", "idempotency_keys", ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_idempotency_keys_expires", table_name="idempotency_keys")
    op.drop_table("idempotency_keys")
    op.drop_index("ix_webhook_attempts_outbox", table_name="webhook_attempts")
    op.drop_table("webhook_attempts")
    op.drop_index("ix_webhook_outbox_order", table_name="webhook_outbox")
    op.drop_index("ix_webhook_outbox_due", table_name="webhook_outbox")
    op.drop_table("webhook_outbox")
