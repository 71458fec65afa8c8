"""The cross-process notifications of a PostgreSQL deployment: channel names and payloads.

Defined once, here, because two sides must agree on them: the store sends (in the transaction
that commits events, so PostgreSQL delivers the notification on commit and it never announces
an event that is not durable) and the runtime's ``PostgresBus`` listens. Notifications are hints,
never data: a listener that misses some catches up from the store.

- ``tether_events``: ``"<origin> <run_id> <seq>"`` — the process ``origin`` committed events of
  ``run_id`` up to ``seq``.
- ``tether_control``: a JSON object with ``origin`` and ``kind`` (e.g. ``{"kind": "cancel",
  "run_id": …, "mode": …}``) — a command for the process executing a run.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

__all__ = [
    "EVENTS_CHANNEL",
    "CONTROL_CHANNEL",
    "EventsNotice",
    "events_payload",
    "parse_events_payload",
    "control_payload",
    "parse_control_payload",
]

EVENTS_CHANNEL = "tether_events"
CONTROL_CHANNEL = "tether_control"


class EventsNotice(NamedTuple):
    """What a ``tether_events`` notification says."""

    origin: str
    run_id: str
    seq: str


def events_payload(origin: str, run_id: str, seq: int) -> str:
    """The payload announcing that ``origin`` committed ``run_id``'s events up to ``seq``."""
    return f"{origin} {run_id} {seq}"


def parse_events_payload(payload: str) -> EventsNotice:
    """Read an ``events_payload`` (missing parts come back empty)."""
    origin, _, rest = payload.partition(" ")
    run_id, _, seq = rest.partition(" ")
    return EventsNotice(origin, run_id, seq)


def control_payload(message: dict[str, Any], origin: str) -> str:
    """The payload of a control ``message`` sent by ``origin``."""
    return json.dumps({**message, "origin": origin})


def parse_control_payload(payload: str) -> dict[str, Any] | None:
    """Read a ``control_payload``; None if it is not a JSON object."""
    try:
        message = json.loads(payload)
    except ValueError:
        return None
    return message if isinstance(message, dict) else None
