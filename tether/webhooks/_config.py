"""What an operator configures: the endpoints, their secret and how deliveries are retried."""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

__all__ = ["EVENT_TYPES", "DEFAULT_SCHEDULE", "Endpoint", "WebhookSettings", "parse_endpoint", "check_secret"]

#: Every event a webhook announces.
EVENT_TYPES = (
    "interrupt.created",
    "interrupt.expiring",
    "interrupt.decided",
    "interrupt.expired",
    "run.completed",
    "run.failed",
    "run.cancelled",
    "allowance.created",
)

#: Seconds before each attempt, counted from the previous one: immediately, 5 s, 5 min, 30 min,
#: 2 h, 5 h, 10 h, 14 h, 20 h, 24 h (cut at the retry period).
DEFAULT_SCHEDULE = (0.0, 5.0, 300.0, 1800.0, 7200.0, 18000.0, 36000.0, 50400.0, 72000.0, 86400.0)


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A receiver: its URL and the events it wants (``None``: every one)."""

    url: str
    events: frozenset[str] | None = None

    @property
    def id(self) -> str:
        """A stable name of the endpoint, stored with each of its deliveries."""
        return "ep_" + hashlib.sha256(self.url.encode()).hexdigest()[:16]

    def wants(self, event_type: str) -> bool:
        return self.events is None or event_type in self.events


def parse_endpoint(value: str) -> Endpoint:
    """``URL`` or ``URL#event,event`` (the fragment is never sent): ValueError when malformed."""
    url, _, filter_text = value.partition("#")
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"a webhook URL must start with http:// or https://: {url!r}")
    if not filter_text:
        return Endpoint(url)
    events = frozenset(e.strip() for e in filter_text.split(",") if e.strip())
    unknown = sorted(events - set(EVENT_TYPES))
    if unknown or not events:
        raise ValueError(f"unknown webhook event(s) {unknown}; known: {', '.join(EVENT_TYPES)}")
    return Endpoint(url, events)


def check_secret(secret: str) -> str:
    """A Standard Webhooks secret, ``whsec_`` + base64 of 24-64 bytes; ValueError otherwise."""
    secret = secret.strip()
    if not secret.startswith("whsec_"):
        raise ValueError("a webhook secret starts with 'whsec_'")
    try:
        raw = base64.b64decode(secret[6:], validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("a webhook secret is 'whsec_' followed by base64") from None
    if not 24 <= len(raw) <= 64:
        raise ValueError("a webhook secret holds 24 to 64 random bytes")
    return secret


@dataclass(frozen=True, slots=True)
class WebhookSettings:
    """Webhook delivery, for :func:`tether.server.create_app` (``webhooks=``)."""

    endpoints: tuple[Endpoint, ...]
    #: ``whsec_…``; never logged, never shown.
    secret: str = field(repr=False)
    #: The base URL of the web UI, for the link in each payload (``None``: no link).
    public_url: str | None = None
    schedule: tuple[float, ...] = DEFAULT_SCHEDULE
    #: After this long since its change a delivery that still fails is ``failed``.
    retry_period_s: float = 86400.0
    #: ``interrupt.expiring`` is sent this long before an interrupt expires.
    expiring_lead_s: float = 120.0
    #: A 2xx must arrive within this long.
    timeout_s: float = 15.0
    #: At most this much of a response is read.
    max_response_bytes: int = 65536
    #: Hosts deliveries may go to (empty: any host but the refused addresses).
    allow_hosts: tuple[str, ...] = ()
    #: Check the addresses a host resolves to: never link-local or cloud metadata ones
    #: (169.254.0.0/16, fe80::/10, …, also embedded in IPv6), private ones only when allowed.
    refuse_link_local: bool = True
    #: Whether loopback and private addresses (127.0.0.0/8, 10.0.0.0/8, fc00::/7, …) may be
    #: delivered to. ``None``: allowed when the server's auth mode is ``open`` (loopback clients
    #: only, a developer's machine), refused in ``keys`` mode.
    allow_private_targets: bool | None = None
    #: Resolves a host to its addresses (``None``: the system's resolver). A delivery connects
    #: to the first address this answers, after checking every one.
    resolver: Callable[[str], Awaitable[Sequence[str]]] | None = field(default=None, repr=False, compare=False)
    #: A sender's claim on a delivery; a sender killed mid-delivery loses it after this long.
    lease_s: float = 60.0
    #: How often a sender looks for due deliveries when nothing woke it.
    poll_s: float = 1.0
    #: Deliveries in flight at once per endpoint (each to a different thread).
    concurrency: int = 8
    #: An idle sender woken by a change waits this long before it claims, so that a burst of
    #: changes goes out from one claim and the requests that made them are answered first.
    coalesce_s: float = 0.25
    #: Delivered, failed, skipped and disabled deliveries (and their attempts) are deleted this
    #: long after they finished.
    retention_s: float = 30 * 86400.0
    #: How often a sender purges what is past its retention and fails what is past its retry
    #: period (also once at start).
    maintenance_s: float = 600.0

    def __post_init__(self) -> None:
        check_secret(self.secret)
        if not self.endpoints:
            raise ValueError("configure at least one webhook endpoint")
        if not self.schedule or self.retry_period_s <= 0 or self.timeout_s <= 0 or self.lease_s <= self.timeout_s:
            raise ValueError("webhook schedule, period and timeout must be positive, the lease longer than the timeout")
        if self.retention_s <= 0 or self.maintenance_s <= 0:
            raise ValueError("webhook retention and maintenance period must be positive")
