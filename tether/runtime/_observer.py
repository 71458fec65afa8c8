"""What the runtime tells an observer of its runs (telemetry): the one seam between the two.

The runtime calls a :class:`RunObserver` at four points, all synchronously and on the event
loop, so an observer must be quick and must not raise:

- :meth:`~RunObserver.launched`: a stretch of a run begins in this process (a new run, a run
  resumed after a human decision, a run taken over), with the run as the store has it;
- :meth:`~RunObserver.executing`: wraps the task that executes that stretch (a context of its
  own: log lines and outbound requests of the run know which run they belong to);
- :meth:`~RunObserver.committed`: a batch of a run's events this process made durable (never
  events another process committed);
- :meth:`~RunObserver.model_call_ended`: a model call ended, with the tokens it consumed.

Everything else an observer wants (timings, tools, waits, outcomes) it reads from the events,
which carry their timestamps. The base class observes nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..events import StoredEvent
    from ..models import Usage
    from ..store import InterruptRecord, RunRecord

__all__ = ["RunObserver"]


class RunObserver:
    """Observes nothing; subclass it to observe runs (see the module docs)."""

    def launched(self, run: RunRecord, *, resume: InterruptRecord | None, takeover: bool) -> None:
        """A stretch of ``run`` begins in this process."""

    def executing(self, run: RunRecord) -> contextlib.AbstractContextManager[None]:
        """The context the task executing ``run`` runs in."""
        return contextlib.nullcontext()

    def committed(self, run_id: str, batch: Sequence[StoredEvent]) -> None:
        """``batch`` of the run's events is durable (committed by this process)."""

    def model_call_ended(self, run_id: str, usage: Usage) -> None:
        """A model call of the run ended (completed, failed or cancelled), having used ``usage``."""
