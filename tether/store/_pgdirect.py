"""The store's PostgreSQL connections: its SQLAlchemy Core statements executed on asyncpg.

SQLAlchemy's asyncio layer costs the event loop 0.3–0.6 ms of CPU per statement on PostgreSQL
(the greenlet hop into its synchronous core, the pool's checkout and checkin with their events,
the execution context, result processing), several times what asyncpg takes for the statement
itself (``docs/benchmarks.md``, "Eighth stage: PostgreSQL on asyncpg directly"). A run's start makes about
ten statements, every commit of events and every request's access check one or two: on
PostgreSQL that layer was most of the server's work.

So the store's own operations run their statements here: still built with SQLAlchemy Core
(one schema and one query language for SQLite and PostgreSQL), compiled by SQLAlchemy's
PostgreSQL dialect for asyncpg once per statement shape (SQLAlchemy's own cache key, as its
compiled cache does), with SQLAlchemy's processing of each bound value and result column
(timestamps as aware UTC, JSON as SQLAlchemy reads and writes it), executed by asyncpg on a
pool of this process's. :class:`DirectConnection` has the part of ``AsyncConnection`` the store
uses (``execute``, ``exec_driver_sql``; a result's ``first``, ``scalar``, ``all``, ``rowcount``
…), so an operation reads the same on every backend. Migrations and agents' own tables
(``Store.transaction()``) keep SQLAlchemy's engine.

This leans on a few of SQLAlchemy's compiler internals (the post-compile expansion of ``IN``
lists, the bind and result processors); ``pyproject.toml`` bounds SQLAlchemy's version, and the
store's contract tests run every operation through here on PostgreSQL.

The pool opens connections as they are needed and keeps them (reopening one for every burst
costs a handshake, asyncpg's type introspection and every statement prepared anew); one that
the server closed is replaced when it is next acquired (asyncpg sees the closed socket first).
Nothing is sent at a release: asyncpg's default reset (``RESET ALL`` and more) would be a round
trip per operation, and an open transaction is rolled back either way. A pool that stays
exhausted past its timeout is :class:`~tether.errors.Overloaded`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import namedtuple
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.sql.compiler import SQLCompiler

from ..errors import Overloaded

if TYPE_CHECKING:
    import asyncpg
    from sqlalchemy.engine.interfaces import Compiled
    from sqlalchemy.sql.elements import ClauseElement

__all__ = ["DirectPool", "DirectConnection", "DirectResult", "DIRECT_CONNECTIONS"]

#: Connections of the direct pool (within the process's budget: with SQLAlchemy's pool,
#: ``_engine.POOL_CONNECTIONS``, and the bus's ``LISTEN`` connection, 16).
DIRECT_CONNECTIONS = 10

#: How long an acquire waits for a free connection before the process is overloaded.
_ACQUIRE_TIMEOUT_S = 30.0

#: How long closing waits for connections still in use before it closes them at once.
_CLOSE_WAIT_S = 2.0

#: Statement shapes whose compiled form is kept (the store has a few hundred at most).
_MAX_PLANS = 2000


class DirectResult:
    """The rows of one statement (with attribute access) and its row count, with the methods
    of SQLAlchemy's result that the store uses."""

    __slots__ = ("_rows", "rowcount")

    def __init__(self, rows: list[Any], rowcount: int) -> None:
        self._rows = rows
        #: Rows an UPDATE or DELETE matched, or the rows returned; -1 for a batch.
        self.rowcount = rowcount

    def __iter__(self) -> Iterator[Any]:
        return iter(self._rows)

    def all(self) -> list[Any]:
        """Every row."""
        return list(self._rows)

    def first(self) -> Any:
        """The first row, or None."""
        return self._rows[0] if self._rows else None

    def scalar(self) -> Any:
        """The first column of the first row, or None."""
        return self._rows[0][0] if self._rows else None

    def scalar_one(self) -> Any:
        """The first column of the only row (``NoResultFound``/``MultipleResultsFound`` else)."""
        if not self._rows:
            raise sa.exc.NoResultFound("no row was found when one was required")
        if len(self._rows) > 1:
            raise sa.exc.MultipleResultsFound("multiple rows were found when exactly one was required")
        return self._rows[0][0]

    def scalar_one_or_none(self) -> Any:
        """The first column of the only row, or None (``MultipleResultsFound`` for more)."""
        if len(self._rows) > 1:
            raise sa.exc.MultipleResultsFound("multiple rows were found when one or none was required")
        return self._rows[0][0] if self._rows else None


class _Plan:
    """One statement shape compiled for asyncpg: its SQL, how a call's values become asyncpg's
    positional arguments, and how asyncpg's records become rows."""

    def __init__(self, compiled: Compiled, dialect: Any) -> None:
        assert isinstance(compiled, SQLCompiler)  # a Core statement's, compiled by a SQL dialect
        self._compiled = compiled
        #: IN lists and the like: the SQL depends on the values, expanded at each call.
        self._expands = bool(compiled.post_compile_params or compiled.literal_execute_params)
        self.sql = compiled.string
        self._order = tuple(compiled.positiontup or ())
        self._processors: dict[str, Any] = dict(compiled._bind_processors)
        columns = compiled._result_columns or []
        #: A SELECT or a statement with RETURNING (its result columns), or plain SQL.
        self.returns_rows = bool(columns) or compiled.isplaintext
        self._result_processors = [column[3]._cached_result_processor(dialect, None) for column in columns]
        self._row: Any = namedtuple("Row", [column[0] for column in columns], rename=True) if columns else None

    def arguments(self, values: dict[str, Any] | None, extracted: Sequence[Any] | None) -> tuple[str, list[Any]]:
        """The SQL and its positional arguments for one call's ``values`` (``extracted``: the
        literal values of this call's statement, by its cache key)."""
        params = self._compiled.construct_params(values, extracted_parameters=extracted, escape_names=False, _no_postcompile=self._expands)
        sql, order, processors = self.sql, self._order, self._processors
        if self._expands:
            expanded = self._compiled._process_parameters_for_postcompile(params)
            sql, order, params = expanded.statement, tuple(expanded.positiontup or ()), dict(expanded.parameters)
            processors = {**processors, **expanded.processors}  # the expanded values' own, beside the rest
        args = []
        for name in order:
            value = params[name]
            process = processors.get(name)
            args.append(value if process is None else process(value))
        return sql, args

    def rows(self, records: Sequence[Any]) -> list[Any]:
        """asyncpg's records as rows with attribute access, each column processed as SQLAlchemy does."""
        if self._row is None:
            return list(records)
        row, processors = self._row, self._result_processors
        return [row(*(value if process is None else process(value) for process, value in zip(processors, record, strict=True))) for record in records]


class _Plans:
    """Compiled plans by statement shape (SQLAlchemy's cache key), as SQLAlchemy's own compiled
    cache keeps them: a statement built anew at every call finds the plan of its shape."""

    def __init__(self) -> None:
        from sqlalchemy.dialects.postgresql.asyncpg import dialect

        self.dialect = dialect()  # type: ignore[no-untyped-call]  # SQLAlchemy leaves this constructor untyped
        self._plans: dict[tuple[Any, ...], _Plan] = {}

    def plan(self, statement: ClauseElement, keys: tuple[str, ...], many: bool) -> tuple[_Plan, Sequence[Any] | None]:
        """The plan for ``statement`` called with values named ``keys`` (a batch: ``many``), and
        the statement's own literal values to go with it."""
        cache_key = statement._generate_cache_key()
        if cache_key is None:  # a statement SQLAlchemy cannot cache: compiled for this call
            return _Plan(statement.compile(dialect=self.dialect, column_keys=keys, for_executemany=many), self.dialect), None
        shape = (cache_key.key, keys, many)
        plan = self._plans.get(shape)
        if plan is None:
            if len(self._plans) >= _MAX_PLANS:
                self._plans.clear()
            compiled = statement.compile(dialect=self.dialect, cache_key=cache_key, column_keys=keys, for_executemany=many)
            plan = self._plans[shape] = _Plan(compiled, self.dialect)
        return plan, cache_key.bindparams


class DirectConnection:
    """A connection of the direct pool, with the part of SQLAlchemy's ``AsyncConnection`` that
    the store's operations use. A refused write raises SQLAlchemy's ``IntegrityError``, as on
    every other path."""

    def __init__(self, conn: asyncpg.Connection, plans: _Plans) -> None:
        self._conn = conn
        self._plans = plans

    async def execute(self, statement: ClauseElement, parameters: Any = None) -> DirectResult:
        """Run a Core statement with a dict of values, or a list of dicts (a batch)."""
        batch: list[dict[str, Any]] | None = None
        if isinstance(parameters, list):
            if len(parameters) > 1:
                batch, parameters = parameters, None
            else:
                parameters = parameters[0] if parameters else None
        first = batch[0] if batch is not None else parameters
        plan, extracted = self._plans.plan(statement, tuple(sorted(first or ())), batch is not None)
        with _integrity_errors():
            if batch is not None:
                await self._conn.executemany(plan.sql, [plan.arguments(values, extracted)[1] for values in batch])
                return DirectResult([], -1)
            sql, args = plan.arguments(parameters, extracted)
            if plan.returns_rows:
                rows = plan.rows(await self._conn.fetch(sql, *args))
                return DirectResult(rows, len(rows))
            return DirectResult([], _row_count(await self._conn.execute(sql, *args)))

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
        self._plans: _Plans | None = None
        self._opening = asyncio.Lock()

    async def _opened(self) -> tuple[asyncpg.Pool, _Plans]:
        if self._pool is None or self._plans is None:
            async with self._opening:
                if self._pool is None or self._plans is None:
                    import asyncpg

                    # min_size=0: nothing is opened before the first operation; no idle lifetime:
                    # a connection opened for a burst stays for the next one.
                    self._pool = await asyncpg.create_pool(
                        self._dsn, min_size=0, max_size=self._size, max_inactive_connection_lifetime=0, reset=_keep_session, init=_json_codec
                    )
                    self._plans = _Plans()
        return self._pool, self._plans

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[DirectConnection]:
        """A connection on which each statement is its own transaction (autocommit)."""
        pool, plans = await self._opened()
        try:
            conn = await pool.acquire(timeout=_ACQUIRE_TIMEOUT_S)
        except TimeoutError as exc:
            raise Overloaded("every database connection of this process is busy; try again shortly", code="database_busy", retry_after_s=1.0) from exc
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
