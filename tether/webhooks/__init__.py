"""Webhooks: notifications written to a durable outbox in the transaction of their change, and
sent to the configured endpoints by the Standard Webhooks spec (see docs/webhooks.md)."""
