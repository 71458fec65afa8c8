"""Webhooks: notifications written to a durable outbox in the transaction of their change, and
sent to the configured endpoints by the Standard Webhooks spec (see docs/webhooks.md).

``_config`` holds the settings, ``_tables`` the outbox, ``_outbox`` writes its rows from the
store's transactions, ``_sender`` delivers them (imported, with ``standardwebhooks`` and
``httpx``, only when webhooks are configured), ``_client`` is the outbound HTTP client and
``_routes`` the admin routes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._config import EVENT_TYPES, Endpoint, WebhookSettings, check_secret, parse_endpoint

if TYPE_CHECKING:
    from ..store import Store
    from ..telemetry import Telemetry
    from ._sender import Sender

__all__ = ["EVENT_TYPES", "Endpoint", "WebhookSettings", "check_secret", "parse_endpoint", "start_webhooks"]


async def start_webhooks(store: Store, settings: WebhookSettings, *, auth: str = "open", telemetry: Telemetry | None = None) -> Sender:
    """Give ``store`` its outbox writer and start this process's sender (close it with ``aclose``).

    ``auth`` is the server's auth mode: it decides whether loopback and private addresses may be
    delivered to when ``settings.allow_private_targets`` does not say. ``telemetry`` gives each
    attempt a span in its run's trace."""
    from . import _tables  # noqa: F401  # the outbox's tables, on the store's metadata
    from ._outbox import Outbox
    from ._sender import Sender

    allow_private = settings.allow_private_targets if settings.allow_private_targets is not None else auth == "open"
    sender = Sender(store, settings, allow_private=allow_private, telemetry=telemetry)
    store.outbox = Outbox(settings, wake=sender.wake)
    sender.start()
    return sender
