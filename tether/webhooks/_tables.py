"""The webhook outbox, its delivery attempts and the endpoints' stored state.

On the store's own metadata (migrations 0009 and 0011 create them), so the outbox rows are
written by the very transaction that commits the change they announce.
"""

from __future__ import annotations

import sqlalchemy as sa

from ..store._tables import Timestamp, metadata

__all__ = ["webhook_outbox", "webhook_attempts", "webhook_endpoints"]

webhook_outbox = sa.Table(
    "webhook_outbox",
    metadata,
    # The order of the rows: per endpoint and thread, the lowest pending seq is sent first.
    sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
    # The ``webhook-id``: the same on every attempt, so receivers dedupe on it.
    sa.Column("id", sa.String(64), nullable=False, unique=True),
    sa.Column("endpoint", sa.String(64), nullable=False),
    sa.Column("event_type", sa.String(40), nullable=False),
    sa.Column("thread_id", sa.String(64), nullable=False),
    sa.Column("interrupt_id", sa.String(64), nullable=True),
    # The run it tells of: its stored trace context is sent as ``traceparent``.
    sa.Column("run_id", sa.String(64), nullable=True),
    # The body sent, ``{"type", "timestamp", "data"}``, as its exact JSON text.
    sa.Column("body", sa.Text, nullable=False),
    # pending | delivered | failed | skipped | disabled
    sa.Column("status", sa.String(16), nullable=False),
    # When it became due (``interrupt.expiring``: the lead before the expiry; a redelivery: then):
    # its retry period counts from here.
    sa.Column("created_at", Timestamp, nullable=False),
    # Not sent before (``interrupt.expiring``: the lead before the expiry) and the next retry.
    sa.Column("next_attempt_at", Timestamp, nullable=False),
    sa.Column("attempts", sa.Integer, nullable=False),
    # The process sending it and until when its claim holds (a SIGKILLed sender's claim lapses).
    sa.Column("lease_owner", sa.String(64), nullable=True),
    sa.Column("lease_expires_at", Timestamp, nullable=True),
    sa.Column("last_error", sa.Text, nullable=True),
    sa.Column("finished_at", Timestamp, nullable=True),
    sa.Index("ix_webhook_outbox_due", "status", "next_attempt_at"),
    sa.Index("ix_webhook_outbox_order", "endpoint", "thread_id", "status", "seq"),
    # Finished rows are purged after the retention, oldest first.
    sa.Index("ix_webhook_outbox_finished", "finished_at"),
)

webhook_attempts = sa.Table(
    "webhook_attempts",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("outbox_id", sa.String(64), nullable=False),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("sender", sa.String(64), nullable=False),
    sa.Column("started_at", Timestamp, nullable=False),
    sa.Column("duration_ms", sa.Integer, nullable=False),
    sa.Column("status_code", sa.Integer, nullable=True),
    # ok | retry | failed | disabled
    sa.Column("outcome", sa.String(16), nullable=False),
    sa.Column("error", sa.Text, nullable=True),
    sa.Index("ix_webhook_attempts_outbox", "outbox_id", "attempt"),
)

#: An endpoint's state, shared by every process: a row once it was disabled (a 410) or enabled
#: again by an admin; no row is an enabled endpoint.
webhook_endpoints = sa.Table(
    "webhook_endpoints",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("disabled_at", Timestamp, nullable=True),
    sa.Column("disabled_reason", sa.Text, nullable=True),
    sa.Column("updated_at", Timestamp, nullable=False),
    sa.Column("updated_by", sa.String(200), nullable=True),
)
