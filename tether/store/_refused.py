"""Waiting while PostgreSQL refuses new connections for want of room.

A server at ``max_connections`` (or a role at its ``CONNECTION LIMIT``) refuses a new connection
with SQLSTATE 53300 ("sorry, too many clients already"); one starting up or in recovery, with
57P03. Both pass: another process's connections are closed, the server finishes starting. So a
pool that must open a connection and is refused for either reason is treated as a pool with no
free connection: the operation waits, retrying with backoff, up to the pool's own timeout, and
only then is :class:`~tether.errors.Overloaded` (503 ``database_busy`` with ``Retry-After``),
never an internal error, and never a run failed at the first refusal. Any other failure to
connect (a wrong password, a database that does not exist) is raised at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from ..errors import Overloaded

__all__ = ["database_busy", "patiently", "refused_for_room"]

log = logging.getLogger("tether.store")

T = TypeVar("T")

#: too_many_connections, cannot_connect_now.
_REFUSED_FOR_ROOM = frozenset({"53300", "57P03"})
#: The first wait after a refusal, and the longest.
_FIRST_WAIT_S = 0.02
_LONGEST_WAIT_S = 0.5
#: At most one warning in this long (a burst of refusals is one operator problem, not hundreds).
_WARN_EVERY_S = 10.0
_last_warning = -_WARN_EVERY_S


def database_busy() -> Overloaded:
    """What an operation gets when no connection came within its pool's timeout: every one of
    the process's was busy, or the server had no room for a new one."""
    return Overloaded(
        "every database connection of this process is busy, or the database has no room for another; try again shortly",
        code="database_busy",
        retry_after_s=1.0,
    )


def refused_for_room(exc: BaseException) -> bool:
    """Whether ``exc`` (asyncpg's, or SQLAlchemy's wrapping of it) is PostgreSQL refusing a
    connection for want of room (see the module docstring)."""
    seen: BaseException | None = exc
    for _ in range(4):  # SQLAlchemy's error -> its adapted DB-API error -> asyncpg's
        if seen is None:
            return False
        if getattr(seen, "sqlstate", None) in _REFUSED_FOR_ROOM:
            return True
        seen = getattr(seen, "orig", None) or seen.__cause__
    return False


async def patiently(open_one: Callable[[float], Awaitable[T]], *, timeout_s: float) -> T:
    """``open_one(seconds_left)``, again with backoff while the server refuses for want of room,
    for up to ``timeout_s`` in all; then :func:`database_busy`."""
    global _last_warning
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    wait = _FIRST_WAIT_S
    while True:
        try:
            return await open_one(max(deadline - loop.time(), 0.0))
        except Exception as exc:
            if not refused_for_room(exc):
                raise
            if loop.time() + wait > deadline:
                log.warning("PostgreSQL still refused a new connection after %.0f s: %s", timeout_s, exc)
                raise database_busy() from exc
            if time.monotonic() - _last_warning >= _WARN_EVERY_S:
                _last_warning = time.monotonic()
                log.warning(
                    "PostgreSQL refused a new connection (%s); operations wait for room, up to %.0f s each. "
                    "Its max_connections must cover every process's pools (docs/deployment.md)",
                    exc,
                    timeout_s,
                )
            await asyncio.sleep(wait)
            wait = min(wait * 2, _LONGEST_WAIT_S)
