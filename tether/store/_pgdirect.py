"""The store's PostgreSQL connections: its SQLAlchemy Core statements executed on asyncpg.

SQLAlchemy's asyncio layer costs the event loop 0.3–0.6 ms of CPU per statement on PostgreSQL
(the greenlet hop into its synchronous core, the pool's checkout and checkin with their events,
the execution context, result processing), several times what asyncpg takes for the statement
itself (``docs/benchmarks.md``, "Eighth stage: PostgreSQL on asyncpg directly"). A run's start makes about
ten statements, every commit of events and every request's access check one or two: on
PostgreSQL that layer was most of the server's work.

So the store's own operations run their statements here: still built with SQLAlchemy Core,
compiled by SQLAlchemy's PostgreSQL dialect for asyncpg once per statement shape (``_plans``),
executed by asyncpg on a pool of this process's. :class:`DirectConnection` has the part of
``AsyncConnection`` the store uses (``execute``, ``exec_driver_sql``; a result's ``first``,
``scalar``, ``all``, ``rowcount`` …), so an operation reads the same on every backend.
Migrations and agents' own tables (``Store.transaction()``) keep SQLAlchemy's engine.

The pool opens connections as they are needed and keeps them (reopening one for every burst
costs a handshake, asyncpg's type introspection and every statement prepared anew); one that
the server closed is replaced when it is next acquired (asyncpg sees the closed socket first).
Nothing is sent at a release: asyncpg's default reset (``RESET ALL`` and more) would be a round
trip per operation, and an open transaction is rolled back either way. A pool that stays
exhausted past its timeout is :class:`~tether.errors.Overloaded`; so is a server that refused a
new connection for want of room (``max_connections``) for as long (``_refused``).

The commits of the runs' events (the group commit) have a pool of their own, of one
connection: when hundreds of runs start or end at once, their transactions queue for the
shared pool's connections, and an event commit queued behind them would hold the tokens of
every run still streaming (``docs/benchmarks.md``, the sixteenth stage: the paced p99 gap on
PostgreSQL 132 -> 77 ms).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from ._plans import DirectResult, Plans
from ._refused import database_busy, patiently
from ._tables import Hot

if TYPE_CHECKING:
    import asyncpg
    from sqlalchemy.sql.elements import ClauseElement

__all__ = ["DirectPool", "DirectConnection", "DIRECT_CONNECTIONS", "EVENT_WRITER_CONNECTIONS"]

#: Connections of the direct pool (within the process's budget: with the event writer's,
#: SQLAlchemy's pool, ``_engine.POOL_CONNECTIONS``, and the bus's ``LISTEN`` connection, 16).
DIRECT_CONNECTIONS = 9
#: Connections of the event writer's own pool: the group commit of every run's events, one
#: transaction at a time, which must not queue behind the other operations for a connection.
EVENT_WRITER_CONNECTIONS = 1

#: How long an acquire waits for a free connection before the process is overloaded.
_ACQUIRE_TIMEOUT_S = 30.0

#: How long closing waits for connections still in use before it closes them at once.
_CLOSE_WAIT_S = 2.0


class DirectConnection:
    """A connection of the direct pool, with the part of SQLAlchemy's ``AsyncConnection`` that
    the store's operations use. A refused write raises SQLAlchemy's ``IntegrityError``, as on
    every other path."""

    def __init__(self, conn: asyncpg.Connection, plans: Plans) -> None:
        self._conn = conn
        self._plans = plans

    async def execute(self, statement: ClauseElement, parameters: Any = None) -> DirectResult:
        """Run a Core statement with a dict of values, or a list of dicts (a batch)."""
        plan, sql, args, batch = self._plans.prepare(statement, parameters)
        with _integrity_errors():
            if batch is not None:
                await self._conn.executemany(sql, batch)
                return DirectResult([], -1)
            if plan.returns_rows:
                rows = plan.rows(await self._conn.fetch(sql, *(args or ())))
                return DirectResult(rows, len(rows))
            return DirectResult([], _row_count(await self._conn.execute(sql, *(args or ()))))

    async def exec_driver_sql(self, sql: str, parameters: Sequence[Any] = ()) -> DirectResult:
        """Run SQL with ``$n`` parameters as it is; rows as asyncpg gives them."""
        with _integrity_errors():
            rows = list(await self._conn.fetch(sql, *parameters))
        return DirectResult(rows, len(rows))


@contextlib.contextmanager
def _integrity_errors() -> Iterator[None]:
    """asyncpg's refusal of a write (a duplicate key, a violated constraint) as SQLAlchemy's
    ``IntegrityError``: the store's one vocabulary for it, whichever path wrote."""
    import asyncpg  # loaded with the pool: only a lookup here

    try:
        yield
    except asyncpg.IntegrityConstraintViolationError as exc:
        raise sa.exc.IntegrityError(None, None, exc) from exc


def _row_count(status: str) -> int:
    """The row count in a command's status (``UPDATE 3``, ``INSERT 0 1``), or -1."""
    last = status.rsplit(" ", 1)[-1]
    return int(last) if last.isdigit() else -1


def _decode_json(raw: bytes) -> Any:
    return json.loads(raw.decode())


async def _json_codec(conn: asyncpg.Connection) -> None:
    """``json`` columns as SQLAlchemy's asyncpg dialect reads and writes them: it decodes them in
    a codec of the connection (not in its result processing) and serialises them itself."""
    encode: Callable[[str], bytes] = str.encode
    await conn.set_type_codec("json", encoder=encode, decoder=_decode_json, schema="pg_catalog", format="binary")


async def _keep_session(_conn: asyncpg.Connection) -> None:
    """Nothing to reset at a release (see the module docstring)."""


class DirectPool:
    """This process's asyncpg pool for the store's operations (see the module docstring)."""

    def __init__(self, dsn: str, *, size: int = DIRECT_CONNECTIONS) -> None:
        self._dsn = dsn
        self._size = size
        self._pool: asyncpg.Pool | None = None
        self._plans: Plans | None = None
        self._opening = asyncio.Lock()

    async def _opened(self) -> tuple[asyncpg.Pool, Plans]:
        if self._pool is None or self._plans is None:
            async with self._opening:
                if self._pool is None or self._plans is None:
                    import asyncpg

                    # min_size=0: nothing is opened before the first operation; no idle lifetime:
                    # a connection opened for a burst stays for the next one.
                    self._pool = await asyncpg.create_pool(
                        self._dsn, min_size=0, max_size=self._size, max_inactive_connection_lifetime=0, reset=_keep_session, init=_json_codec
                    )
                    from sqlalchemy.dialects.postgresql.asyncpg import dialect

                    self._plans = Plans(dialect(), hot=Hot.statements())  # type: ignore[no-untyped-call]  # SQLAlchemy leaves this constructor untyped
        return self._pool, self._plans

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[DirectConnection]:
        """A connection on which each statement is its own transaction (autocommit)."""
        pool, plans = await self._opened()
        try:
            # A connection the pool must open may be refused while the server has no room for
            # it: that waits too, within the same timeout (``_refused``).
            conn = await patiently(lambda left: pool.acquire(timeout=left), timeout_s=_ACQUIRE_TIMEOUT_S)
        except TimeoutError as exc:
            raise database_busy() from exc
        try:
            yield DirectConnection(conn, plans)
        finally:
            await pool.release(conn)

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[DirectConnection]:
        """A connection in a transaction: committed when the block ends, rolled back if it raises."""
        async with self.connection() as conn:
            async with conn._conn.transaction():
                yield conn

    async def aclose(self) -> None:
        """Close every connection: gracefully once the operations under way are done, at once
        after ``_CLOSE_WAIT_S`` (a connection that is never given back, say its task was
        interrupted, must not hold the process's exit)."""
        if self._pool is None:
            return
        try:
            await asyncio.wait_for(self._pool.close(), _CLOSE_WAIT_S)
        except TimeoutError:
            self._pool.terminate()
