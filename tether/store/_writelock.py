"""The lock around SQLite's one write connection: a release wakes every waiter at once.

Most holders of the store's write lock keep it for a few synchronous statements (a run's start
or end: no ``await`` inside); the group commit keeps it across its hop to the writer's thread.
With a first-in-first-out lock (``asyncio.Lock``) each release wakes one waiter, which runs on
the event loop's next pass, and so on: when the loop is busy (hundreds of streams, a pass taking
tens of milliseconds) eight starts waiting behind one commit take eight passes to get through,
and the group commit, taking the lock back each time, keeps them in that line. Here a release
wakes every waiter for the same pass: they run one after another, each taking the lock if it
is free (those that hold it for synchronous statements give it back before the next runs), and
the ones that find it taken wait again.
"""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Any

__all__ = ["WriteLock"]


class WriteLock:
    """An asyncio lock whose release wakes all waiters (see the module's docstring).

    It is fair to those woken: until each of them has run, nobody else may take the lock (a
    holder that takes it again at once, as the group commit does, cannot keep them out).
    """

    def __init__(self) -> None:
        self._locked = False
        self._waiters: list[tuple[asyncio.Task[Any], asyncio.Future[None]]] = []
        #: Tasks woken by a release that have not run yet: the lock is theirs first.
        self._woken: set[asyncio.Task[Any]] = set()

    def locked(self) -> bool:
        """True while someone holds the lock."""
        return self._locked

    async def acquire(self) -> None:
        """Take the lock, waiting for releases while someone else holds it or is owed it."""
        task = asyncio.current_task()
        assert task is not None
        while self._locked or (self._woken and task not in self._woken):
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append((task, waiter))
            try:
                await waiter
            except asyncio.CancelledError:
                self._waiters = [(t, w) for t, w in self._waiters if w is not waiter]
                self._woken.discard(task)
                if not self._locked and not self._woken:
                    self._wake()  # the lock was owed to this task alone: pass it on
                raise
        self._woken.discard(task)
        self._locked = True

    def release(self) -> None:
        """Give the lock back and wake every waiter."""
        if not self._locked:
            raise RuntimeError("the write lock is not held")
        self._locked = False
        self._wake()

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for task, waiter in waiters:
            if not waiter.done():
                self._woken.add(task)
                waiter.set_result(None)

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.release()
