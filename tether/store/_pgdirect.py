"""PostgreSQL's per-token statements on asyncpg directly, beside SQLAlchemy.

SQLAlchemy's asyncio layer costs the event loop 0.3–0.5 ms of CPU per statement on PostgreSQL
(the greenlet hop into its synchronous core, the pool's events and bookkeeping, result
processing): five to seven times what asyncpg itself takes for the same prepared statement
(``docs/benchmarks.md``, "A direct path for the event log"). Most statements can afford that;
three run for every commit of events or every follower's catch-up, and there it is most of the
server's work per token on PostgreSQL:

- the group commit's insert of every waiting run's events, with their ``NOTIFY``;
- a follower's (or the cross-process relay's) read of a run's new events;
- a run's last seq.

And every request makes one or two point reads before anything else (the access check's lookup
of a thread, run or message with its owner; in ``keys`` mode the key's row), which cost it as
much again. Those are :class:`Prebuilt` selects: SQLAlchemy Core statements built once at
import, compiled once for asyncpg, with SQLAlchemy's own result processing per column.

Each is one statement, atomic on its own, so each runs in autocommit (one round trip, no
``BEGIN``/``COMMIT``) on a small asyncpg pool of this process's, prepared once per connection
(asyncpg's statement cache). Everything else, and every write inside a larger transaction,
stays on SQLAlchemy.

The pool opens connections as they are needed and keeps them; one that the server closed is
replaced when it is next acquired (asyncpg sees the closed socket first). A pool that stays
exhausted past its timeout is :class:`~tether.errors.Overloaded`, as SQLAlchemy's is.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import namedtuple
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from ..errors import Overloaded
from ..events import StoredEvent
from . import _notify as channels
from ._tables import events

if TYPE_CHECKING:
    import asyncpg

__all__ = ["DirectPool", "Prebuilt", "DIRECT_CONNECTIONS", "INSERT_AND_NOTIFY", "insert_and_notify_args"]

#: Connections of the direct pool (counted in the process's budget: ``_engine.POOL_CONNECTIONS``
#: for SQLAlchemy plus these plus the bus's ``LISTEN`` connection).
DIRECT_CONNECTIONS = 3

#: How long an acquire waits for a free connection before the process is overloaded (as
#: SQLAlchemy's pool timeout).
_ACQUIRE_TIMEOUT_S = 30.0

#: Insert events given as column arrays and send a ``tether_events`` notification per payload
#: (one per commit, see ``_notify``), in one statement: a data-modifying ``WITH`` runs exactly
#: once whether or not the outer query reads it; the notifications are delivered on commit.
INSERT_AND_NOTIFY = (
    f"WITH inserted AS (INSERT INTO {events.name} (run_id, seq, type, envelope)"
    " SELECT * FROM unnest($1::varchar[], $2::int[], $3::varchar[], $4::text[]))"
    " SELECT pg_notify($5, p) FROM unnest($6::text[]) AS p"
)


def insert_and_notify_args(origin: str, batches: Sequence[tuple[str, Sequence[StoredEvent]]]) -> tuple[object, ...]:
    """The parameters of :data:`INSERT_AND_NOTIFY` for ``batches`` (each non-empty) committed by
    the process ``origin``: the rows as column arrays (one prepared statement whatever their
    number), then the channel and the notifications' payloads."""
    rows = [(run_id, e) for run_id, batch in batches for e in batch]
    return (
        [run_id for run_id, _e in rows],
        [e.seq for _run_id, e in rows],
        [e.type for _run_id, e in rows],
        [e.envelope for _run_id, e in rows],
        channels.EVENTS_CHANNEL,
        channels.events_payloads(origin, [(run_id, batch[-1].seq) for run_id, batch in batches if batch]),
    )


_READ_EVENTS = f"SELECT seq, type, envelope FROM {events.name} WHERE run_id = $1 AND seq > $2 ORDER BY seq LIMIT $3"
_LAST_SEQ = f"SELECT max(seq) FROM {events.name} WHERE run_id = $1"


class Prebuilt:
    """A select built once (a module constant) for :meth:`DirectPool.first`: compiled for
    asyncpg when first run (a SQLite server never loads PostgreSQL's dialect), with
    SQLAlchemy's result processing of each column (e.g. timestamps as aware UTC datetimes)."""

    def __init__(self, statement: sa.Select[Any]) -> None:
        self.statement = statement
        self._compiled: _Compiled | None = None

    def compiled(self) -> _Compiled:
        """The statement compiled for asyncpg (once)."""
        if self._compiled is None:
            self._compiled = _Compiled(self.statement)
        return self._compiled


class _Compiled:
    """A select's SQL with ``$n`` parameters, their order, and its row type."""

    def __init__(self, statement: sa.Select[Any]) -> None:
        from sqlalchemy.dialects.postgresql.asyncpg import dialect

        pg = dialect()  # type: ignore[no-untyped-call]  # SQLAlchemy leaves this constructor untyped
        compiled = statement.compile(dialect=pg)
        if compiled.post_compile_params or compiled.literal_execute_params:
            # Their SQL depends on the values (an IN list): SQLAlchemy's execution handles those.
            raise ValueError("a Prebuilt query cannot have expanding or literal-execute parameters")
        self.sql = compiled.string
        self._compiled = compiled
        self._order = tuple(compiled.positiontup or ())
        columns = list(statement.selected_columns)
        self._processors: list[Callable[[Any], Any] | None] = [column.type.result_processor(pg, None) for column in columns]
        self._row = namedtuple("Row", [column.key for column in columns], rename=True)  # type: ignore[misc]  # fields known at run time

    def args(self, params: dict[str, Any]) -> list[Any]:
        """The positional parameters: ``params`` and the statement's own literals, in order."""
        values = self._compiled.construct_params(params)
        return [values[name] for name in self._order]

    def row(self, record: Sequence[Any]) -> Any:
        """A row with attribute access, each value processed as SQLAlchemy would."""
        return self._row(*(value if process is None else process(value) for process, value in zip(self._processors, record, strict=True)))


async def _json_codec(conn: asyncpg.Connection) -> None:
    """Decode ``json`` columns as SQLAlchemy's asyncpg dialect does (it decodes them in a codec
    of the connection, not in its result processing)."""
    await conn.set_type_codec("json", encoder=str.encode, decoder=lambda raw: json.loads(raw.decode()), schema="pg_catalog", format="binary")


async def _keep_session(_conn: asyncpg.Connection) -> None:
    """Nothing to reset at release (see :meth:`DirectPool._opened`)."""


class DirectPool:
    """A small asyncpg pool for the event log's hot statements (see the module docstring)."""

    def __init__(self, dsn: str, *, size: int = DIRECT_CONNECTIONS) -> None:
        self._dsn = dsn
        self._size = size
        self._pool: asyncpg.Pool | None = None
        self._opening = asyncio.Lock()

    async def _opened(self) -> asyncpg.Pool:
        if self._pool is None:
            async with self._opening:
                if self._pool is None:
                    import asyncpg

                    # min_size=0: nothing is opened before the first statement; no idle
                    # lifetime: a connection opened for a burst stays for the next one; and no
                    # reset query at each release (asyncpg's default sends ``RESET ALL`` and
                    # more, a round trip): these statements leave no session state behind (an
                    # open transaction would still be rolled back).
                    self._pool = await asyncpg.create_pool(
                        self._dsn, min_size=0, max_size=self._size, max_inactive_connection_lifetime=0, reset=_keep_session, init=_json_codec
                    )
        return self._pool

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[asyncpg.Connection]:
        import asyncpg  # loaded by _opened: only a lookup here

        pool = await self._opened()
        try:
            conn = await pool.acquire(timeout=_ACQUIRE_TIMEOUT_S)
        except TimeoutError as exc:
            raise Overloaded("every database connection of this process is busy; try again shortly", code="database_busy", retry_after_s=1.0) from exc
        try:
            yield conn
        except asyncpg.IntegrityConstraintViolationError as exc:
            # The store's one vocabulary for a refused write, whichever path wrote (a seq that
            # another process took first is a duplicate key).
            raise sa.exc.IntegrityError(None, None, exc) from exc
        finally:
            await pool.release(conn)

    async def append_event_batches(self, origin: str, batches: Sequence[tuple[str, Sequence[StoredEvent]]]) -> None:
        """Insert the batches (each non-empty) and announce each run's newest seq, atomically."""
        async with self._connection() as conn:
            await conn.fetch(INSERT_AND_NOTIFY, *insert_and_notify_args(origin, batches))

    async def read_events(self, run_id: str, after_seq: int, limit: int) -> list[StoredEvent]:
        """Events of ``run_id`` with ``seq > after_seq``, in order, at most ``limit``."""
        async with self._connection() as conn:
            rows = await conn.fetch(_READ_EVENTS, run_id, after_seq, limit)
        return [StoredEvent(seq, type_, envelope) for seq, type_, envelope in rows]

    async def last_seq(self, run_id: str) -> int:
        """The highest seq of ``run_id`` (0 if none)."""
        async with self._connection() as conn:
            value = await conn.fetchval(_LAST_SEQ, run_id)
        return int(value or 0)

    async def first(self, query: Prebuilt, params: dict[str, Any]) -> Any:
        """The first row of ``query`` with ``params`` (attribute access, as SQLAlchemy's), or None."""
        compiled = query.compiled()
        async with self._connection() as conn:
            record = await conn.fetchrow(compiled.sql, *compiled.args(params))
        return None if record is None else compiled.row(record)

    async def aclose(self) -> None:
        """Close every connection (waiting for statements under way)."""
        if self._pool is not None:
            await self._pool.close()
