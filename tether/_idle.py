"""A timer for "nothing happened for N seconds" that costs a clock read per event.

``asyncio.timeout`` around every wait creates a timer handle, and cancels it, each time: on a
stream of thousands of events per second (each token a wait) that is a visible share of the
event loop. An :class:`IdleTimer` keeps one timer handle instead: an event only records the time
(:meth:`IdleTimer.touch`), and when the handle fires early it re-arms for the time still left.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

__all__ = ["IdleTimer"]


class IdleTimer:
    """Calls ``on_idle`` once ``seconds`` passed without a :meth:`touch`, then again after each
    further ``seconds`` of idleness, until :meth:`cancel`."""

    __slots__ = ("seconds", "_on_idle", "_loop", "_last", "_handle")

    def __init__(self, seconds: float, on_idle: Callable[[], None]) -> None:
        self.seconds = seconds
        self._on_idle = on_idle
        self._loop = asyncio.get_running_loop()
        self._last = self._loop.time()
        self._handle: asyncio.TimerHandle | None = self._loop.call_at(self._last + seconds, self._check)

    def touch(self) -> None:
        """Something happened: the idle time starts again from now."""
        self._last = self._loop.time()

    def _check(self) -> None:
        now = self._loop.time()
        due = self._last + self.seconds
        if now >= due:
            self._last = now
            due = now + self.seconds
            self._on_idle()
        if self._handle is not None:  # on_idle may have cancelled it
            self._handle = self._loop.call_at(due, self._check)

    def cancel(self) -> None:
        """Stop; ``on_idle`` is not called again."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
