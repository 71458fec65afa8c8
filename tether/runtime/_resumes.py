"""Resumes committing right now in this process, and a cancel that arrives meanwhile.

A resume launches its run's executor as soon as its write returns; on PostgreSQL the write is
visible to other connections a moment before that. A cancel arriving in between finds no
executor to tell, and must not finish the run itself (the executor would then write the same
seqs): it leaves the run to the resume. The executor finds the recorded cancel when it starts;
a resume that loses its write finishes the run the cancel left to it.
"""

from __future__ import annotations

from ..store import RunRecord

__all__ = ["ResumesUnderWay"]


class ResumesUnderWay:
    """How many resumes of each run are committing, and the cancel that came meanwhile."""

    def __init__(self) -> None:
        self._count: dict[str, int] = {}
        self._cancels: dict[str, RunRecord] = {}

    def __contains__(self, run_id: object) -> bool:
        return run_id in self._count

    def begin(self, run_id: str) -> None:
        self._count[run_id] = self._count.get(run_id, 0) + 1

    def cancel_came(self, run_id: str, record: RunRecord) -> None:
        """A cancel of a run being resumed was recorded; the resume deals with it."""
        self._cancels[run_id] = record

    def end(self, run_id: str) -> RunRecord | None:
        """One resume's write is over. When it was the last one under way: the cancel that came
        meanwhile (forgotten here), else None."""
        left = self._count[run_id] - 1
        if left:
            self._count[run_id] = left
            return None
        del self._count[run_id]
        return self._cancels.pop(run_id, None)
