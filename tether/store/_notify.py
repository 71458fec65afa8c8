"""The cross-process notifications of a PostgreSQL deployment: channel names and payloads.

Defined once, here, because two sides must agree on them: the store sends (in the transaction
that commits events, so PostgreSQL delivers the notification on commit and it never announces
an event that is not durable) and the runtime's ``PostgresBus`` listens. Notifications are hints,
never data: a listener that misses some catches up from the store.

- ``tether_events``: ``"<origin> <run_id> <seq> [<run_id> <seq> …]"`` — the process ``origin``
  committed events of each ``run_id`` up to its ``seq``. One notification per commit (more only
  when the runs of a commit would not fit in one payload), not one per run: a process ignores
  its own with one comparison, and PostgreSQL queues one instead of hundreds.
- ``tether_control``: a JSON object with ``origin`` and ``kind``, read into a
  :data:`ControlMessage`: ``{"kind": "cancel", "run_id": …, "mode": …}`` (:class:`CancelControl`,
  for the process executing the run) or ``{"kind": "released", "run_ids": […]}``
  (:class:`ReleasedControl`: a stopping process gave those runs up).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import NamedTuple

from ..events import CancelMode
from ._records import cancel_mode_of

__all__ = [
    "EVENTS_CHANNEL",
    "CONTROL_CHANNEL",
    "EventsNotice",
    "events_payloads",
    "MAX_PAYLOAD_BYTES",
    "parse_events_payload",
    "CancelControl",
    "ReleasedControl",
    "ControlMessage",
    "ControlNotice",
    "control_payload",
    "parse_control_payload",
]

EVENTS_CHANNEL = "tether_events"
CONTROL_CHANNEL = "tether_control"


#: The longest payload sent (PostgreSQL refuses 8,000 bytes and more).
MAX_PAYLOAD_BYTES = 7900


class EventsNotice(NamedTuple):
    """What a ``tether_events`` notification says: ``origin`` committed each run's events up to
    its seq (a seq that is not a number comes back as -1)."""

    origin: str
    runs: list[tuple[str, int]]


def events_payloads(origin: str, runs: list[tuple[str, int]]) -> list[str]:
    """The payloads announcing that ``origin`` committed each of ``runs`` (``(run_id, last
    seq)``) up to its seq: one, or as many as keep each under :data:`MAX_PAYLOAD_BYTES`."""
    payloads: list[str] = []
    parts = [origin]
    size = len(origin)
    for run_id, seq in runs:
        part = f"{run_id} {seq}"
        if len(parts) > 1 and size + 1 + len(part) > MAX_PAYLOAD_BYTES:
            payloads.append(" ".join(parts))
            parts, size = [origin], len(origin)
        parts.append(part)
        size += 1 + len(part)
    if len(parts) > 1:
        payloads.append(" ".join(parts))
    return payloads


def parse_events_payload(payload: str) -> EventsNotice:
    """Read an ``events_payloads`` payload (a run without its seq is dropped)."""
    origin, *words = payload.split(" ")
    runs = [(run_id, int(seq) if seq.isdigit() else -1) for run_id, seq in zip(words[0::2], words[1::2], strict=False)]
    return EventsNotice(origin, runs)


@dataclass(frozen=True, slots=True, kw_only=True)
class CancelControl:
    """A cancel of ``run_id``, recorded already: for the process executing the run."""

    run_id: str
    mode: CancelMode


@dataclass(frozen=True, slots=True, kw_only=True)
class ReleasedControl:
    """A stopping process gave up its claims on ``run_ids``: take them over now."""

    run_ids: tuple[str, ...]


#: A command between processes (``tether_control``).
ControlMessage = CancelControl | ReleasedControl


class ControlNotice(NamedTuple):
    """A ``tether_control`` notification: who sent it (None if it does not say) and what."""

    origin: str | None
    message: ControlMessage


def control_payload(message: ControlMessage, origin: str) -> str:
    """The payload of a control ``message`` sent by ``origin``."""
    if isinstance(message, CancelControl):
        return json.dumps({"kind": "cancel", "run_id": message.run_id, "mode": message.mode, "origin": origin})
    return json.dumps({"kind": "released", "run_ids": list(message.run_ids), "origin": origin})


def parse_control_payload(payload: str) -> ControlNotice | None:
    """Read a ``control_payload``; None if it is not one."""
    try:
        data = json.loads(payload)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    origin = data.get("origin")
    origin = origin if isinstance(origin, str) else None
    if data.get("kind") == "cancel" and isinstance(data.get("run_id"), str):
        return ControlNotice(origin, CancelControl(run_id=data["run_id"], mode=cancel_mode_of(str(data.get("mode"))) or "soft"))
    if data.get("kind") == "released" and isinstance(data.get("run_ids"), list):
        return ControlNotice(origin, ReleasedControl(run_ids=tuple(str(r) for r in data["run_ids"])))
    return None
