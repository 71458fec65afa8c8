"""The run's own cancellation: its two modes, and the ``cancelled`` event that ends a run.

A cancel is requested through :meth:`~tether.runtime.Runtime.cancel` (recorded in the store
first) and carried out by the run's executor, or, when nothing executes the run, by the runtime
itself; both end the run with the event built here.
"""

from __future__ import annotations

from typing import Literal

from ..events import Cancelled
from ..store import RunRecord

__all__ = ["CancelMode", "as_cancel_mode", "cancelled_event"]

CancelMode = Literal["soft", "hard"]


def as_cancel_mode(value: str | None) -> CancelMode:
    """A stored or sent cancel mode as the executor takes it (anything but ``hard`` is soft)."""
    return "hard" if value == "hard" else "soft"


def cancelled_event(run: RunRecord, *, mode: CancelMode | None = None, partial_message_id: str | None = None) -> Cancelled:
    """The ``cancelled`` event that ends ``run``, from its recorded cancel request."""
    return Cancelled(
        mode=as_cancel_mode(run.cancel_mode or mode),
        reason=run.cancel_reason,
        actor=run.cancel_actor,
        partial_message_id=partial_message_id,
    )
