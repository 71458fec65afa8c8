"""The store's engine: database URLs, connections, SQLite settings, and migrations at open.

One code path for SQLite (the embedded default) and PostgreSQL: SQLAlchemy Core. PostgreSQL goes
through its async driver (asyncpg). SQLite has one writer at a time; the store serialises its own
write transactions with a lock (as Datasette does) instead of letting them collide on
``SQLITE_BUSY``, runs them on the event loop's thread and its reads in a few threads (``_sqlite``
says why). Readers never wait.

The store's own operations never touch SQLAlchemy's asyncio engine (``_sqlite``, ``_pgdirect``):
it serves migrations, agents' own tables and an in-memory SQLite database, and is made the first
time one of them needs it. A process that starts on a database already at the newest schema
does not import SQLAlchemy's asyncio layer, its ORM (which that layer imports), greenlet or
aiosqlite until then: about 7 MiB of memory.

Several stores may open one database at once (server processes starting together): the schema
is migrated under a lock, in the database and in the process, so exactly one of them creates it.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self, TypeAlias

import sqlalchemy as sa
from sqlalchemy import event as sa_event

from .._ids import new_id, utcnow
from ._pgdirect import DIRECT_CONNECTIONS, EVENT_WRITER_CONNECTIONS, DirectConnection, DirectPool
from ._refused import database_busy, patiently
from ._sqlite import InlineReader, InlineWriter, SQLiteConnections, ThreadedReader, sqlite_pragmas
from ._writelock import WriteLock

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

    from ..webhooks._outbox import Outbox

__all__ = ["StoreBase", "normalize_db_url", "Writing", "Reading"]

#: What a store operation writes through: the inline SQLite writer, a PostgreSQL connection of
#: the direct pool, or (an in-memory SQLite database) the async driver's connection.
Writing: TypeAlias = "InlineWriter | DirectConnection | AsyncConnection"
#: What a store operation reads through.
Reading: TypeAlias = "ThreadedReader | InlineReader | InlineWriter | DirectConnection | AsyncConnection"


#: PostgreSQL connections one process's SQLAlchemy pool uses at most (migrations and agents' own
#: tables); with the direct pool's (``_pgdirect``: the store's own operations), the event
#: writer's and the bus's ``LISTEN`` connection, a process holds at most 16.
POOL_CONNECTIONS = 15 - DIRECT_CONNECTIONS - EVENT_WRITER_CONNECTIONS
#: How long a checkout waits for a free connection of that pool (or for the server to have room
#: for a new one) before the process is overloaded.
_POOL_TIMEOUT_S = 30.0


def normalize_db_url(url: str) -> str:
    """Accept ``sqlite:///path`` and ``postgresql://…`` and pick the async drivers."""
    if url.startswith("sqlite:///") or url == "sqlite://":
        return "sqlite+aiosqlite" + url[len("sqlite") :]
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+asyncpg://" + url.split("://", 1)[1]
    return url


def _refuse_closed_connection(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
    """A pooled PostgreSQL connection that the server closed (a restart, an idle timeout, an
    administrator) is replaced at checkout, before anything runs on it.

    asyncpg notices the closed socket as soon as the event loop reads it, so this check costs
    nothing. SQLAlchemy's ``pool_pre_ping`` would instead send ``BEGIN; ;`` and ``ROLLBACK`` to
    the server at every checkout: three round trips per transaction.
    """
    if dbapi_connection.driver_connection.is_closed():
        raise sa.exc.DisconnectionError("the server closed this connection")


class StoreBase:
    """Connections, transactions and the schema; the store's operations build on these."""

    def __init__(self, url: str) -> None:
        """A store on ``url`` (as :func:`normalize_db_url` gives it); :meth:`open` is the way in."""
        self.url = sa.engine.make_url(url)
        self.is_sqlite = self.url.get_backend_name() == "sqlite"
        #: The libpq-style URL of a PostgreSQL database, for connecting with asyncpg itself.
        self.pg_dsn = "" if self.is_sqlite else self.url.set(drivername="postgresql").render_as_string(hide_password=False)
        #: SQLAlchemy's async engine, made at first use (:attr:`engine`).
        self._engine: AsyncEngine | None = None
        #: SQLite: the store's own synchronous connections (``_sqlite``), opened once the schema
        #: is there; the async engine then only serves migrations and agents' own tables.
        self._sqlite: SQLiteConnections | None = None
        #: PostgreSQL: the store's own operations, on asyncpg directly (``_pgdirect``).
        self._direct: DirectPool | None = None if self.is_sqlite else DirectPool(self.pg_dsn)
        #: PostgreSQL: the group commit's own connection, never queued behind the operations
        #: on ``_direct`` (a crowd of starts or ends) for one.
        self._event_writer: DirectPool | None = None if self.is_sqlite else DirectPool(self.pg_dsn, size=EVENT_WRITER_CONNECTIONS)
        #: This process's identity: it owns the runs it executes (``runs.executor_id``) and
        #: tags its notifications so it can ignore its own.
        self.instance_id = new_id("proc")
        #: How long a run's claim lasts without renewal (another process may then take it over).
        self.lease_s = 10.0
        # SQLite allows one writer; serialise ours rather than collide on SQLITE_BUSY.
        self._write_lock: WriteLock | None = WriteLock() if self.is_sqlite else None
        #: Webhooks' outbox writer (``tether.webhooks``), when configured: the transactions of
        #: notable changes call it to insert their notifications on the same connection.
        self.outbox: Outbox | None = None

    # -- lifecycle -------------------------------------------------------------------------

    @classmethod
    async def open(cls, url: str) -> Self:
        """Connect to ``url`` and bring the schema up to date (creating a SQLite file if needed)."""
        store = cls(normalize_db_url(url))
        if store._file_path is not None:
            Path(store._file_path).expanduser().parent.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240  # once, at start-up
        await store.migrate()
        if store._file_path is not None:
            store._sqlite = SQLiteConnections(str(store.url))
        return store

    @classmethod
    async def needs_migrations(cls, url: str) -> bool:
        """Whether opening a store on ``url`` would apply migrations, read without Alembic.

        False when the schema is at the newest revision, and for an in-memory database (new in
        every process, so migrated where it is opened). Lets a caller migrate in another
        process first (``tether migrate``): Alembic and what it loads, about 18 MiB, then
        never enter a long-running one.
        """
        store = cls(normalize_db_url(url))
        try:
            if store.is_sqlite and store._file_path is None:
                return False
            return await store._schema_revision() != HEAD_REVISION
        finally:
            await store.aclose()

    @property
    def _file_path(self) -> str | None:
        """A SQLite database's file; None for PostgreSQL and for an in-memory database."""
        if not self.is_sqlite or self.url.database in (None, "", ":memory:"):
            return None
        return self.url.database

    @property
    def engine(self) -> AsyncEngine:
        """SQLAlchemy's async engine on this database, made the first time it is asked for."""
        if self._engine is None:
            self._engine = _async_engine(self.url)
        return self._engine

    async def migrate(self) -> None:
        """Apply pending Alembic migrations (Alembic is only imported when there are some)."""
        if await self._schema_revision() == HEAD_REVISION:
            return
        from alembic import command
        from alembic.config import Config

        cfg = Config()
        cfg.set_main_option("script_location", str(Path(__file__).parent / "migrations"))

        def upgrade(sync_conn: sa.Connection) -> None:
            cfg.attributes["connection"] = sync_conn
            command.upgrade(cfg, "head")

        # Stores opening one database at once (server processes starting together) must not
        # both create the tables: the first migrates under a database lock, the others then
        # find the schema at head. Alembic's ``context`` is process-global, so two upgrades
        # interleaving on one event loop (or in two threads) also clobber each other.
        await self._under_schema_lock(upgrade)

    async def _schema_revision(self) -> str | None:
        """The revision Alembic recorded in the database; None before the first migration, or
        when it cannot be told yet (another store is creating the database this moment: then
        the migration path, under the schema lock, finds out). Read without the async engine."""
        try:
            if self._direct is not None:
                async with self._direct.connection() as direct:
                    revision = (await direct.exec_driver_sql(_REVISION_SQL)).scalar()
                    return None if revision is None else str(revision)
            if (path := self._file_path) is not None:
                return await asyncio.to_thread(_sqlite_revision, path)
            async with self._async_reading() as conn:  # an in-memory SQLite database
                return (await conn.exec_driver_sql(_REVISION_SQL)).scalar()
        except Exception:  # no such table yet, the new database locked by its creator, or a driver's error the migration path reports
            return None

    async def create_tables(self, metadata: sa.MetaData) -> None:
        """Create an agent's own tables if missing (safe when several processes start at once).

        When every table is there already (a restart), that is found out without the async
        engine, and nothing else happens."""
        if await self._tables_exist(metadata):
            return
        await self._under_schema_lock(metadata.create_all)

    async def _tables_exist(self, metadata: sa.MetaData) -> bool:
        """Whether every table of ``metadata`` exists (False when that cannot be told cheaply:
        ``create_all`` then checks table by table)."""
        tables = list(metadata.tables.values())
        if any(table.schema is not None for table in tables):
            return False
        names = [table.name for table in tables]
        if self._direct is not None:
            async with self._direct.connection() as direct:
                found = await direct.exec_driver_sql(
                    "SELECT count(*) FROM unnest($1::text[]) AS t(name) WHERE to_regclass(quote_ident(name)) IS NOT NULL", (names,)
                )
        elif self._sqlite is not None:
            found = await self._sqlite.point_reader.exec_driver_sql(
                f"SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name IN ({', '.join('?' * len(names))})", names
            )
        else:
            return False
        return bool(found.scalar() == len(names))

    async def _under_schema_lock(self, fn: Callable[[sa.Connection], Any]) -> None:
        async with _process_migration_lock():
            async with self._async_writing() as conn:
                if self.is_sqlite:
                    # The write lock now, before anything reads the schema (pysqlite would
                    # only BEGIN at the first DML, leaving DDL in autocommit).
                    await conn.exec_driver_sql("BEGIN IMMEDIATE")
                else:
                    await conn.execute(sa.select(sa.func.pg_advisory_xact_lock(_MIGRATION_LOCK_KEY)))
                await conn.run_sync(fn)

    async def aclose(self) -> None:
        """Close the connections."""
        if self._sqlite is not None:
            await asyncio.to_thread(self._sqlite.close)
        if self._direct is not None:
            await self._direct.aclose()
        if self._event_writer is not None:
            await self._event_writer.aclose()
        if self._engine is not None:
            await self._engine.dispose()

    # -- connections -----------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _writing(self) -> AsyncIterator[Writing]:
        """A write transaction for the store's own operations."""
        if self._direct is not None:
            async with self._direct.transaction() as direct:
                yield direct
            return
        if self._sqlite is None:
            async with self._async_writing() as conn:
                yield conn
            return
        assert self._write_lock is not None
        async with self._write_lock:
            with self._sqlite.writing() as writer:
                yield writer

    @contextlib.asynccontextmanager
    async def _reading(self) -> AsyncIterator[Reading]:
        """Reads for the store's own operations (each statement sees the newest commit)."""
        if self._sqlite is not None:
            yield self._sqlite.reader
            return
        if self._direct is not None:
            async with self._direct.connection() as direct:
                yield direct
            return
        async with self._async_reading() as conn:  # an in-memory SQLite database
            yield conn

    @contextlib.asynccontextmanager
    async def _point_reading(self) -> AsyncIterator[Reading]:
        """Reads of a row by its key or a count over an index: on SQLite inline on the loop's
        thread (cheaper than the hop to a reader thread), else like :meth:`_reading`."""
        if self._sqlite is not None:
            yield self._sqlite.point_reader
            return
        async with self._reading() as conn:
            yield conn

    @contextlib.asynccontextmanager
    async def _async_writing(self) -> AsyncIterator[AsyncConnection]:
        async with contextlib.AsyncExitStack() as stack:
            if self._write_lock is not None:
                await stack.enter_async_context(self._write_lock)
            yield await _checked_out(stack, self.engine.begin)

    @contextlib.asynccontextmanager
    async def _async_reading(self) -> AsyncIterator[AsyncConnection]:
        """A pooled connection of SQLAlchemy's engine."""
        async with contextlib.AsyncExitStack() as stack:
            yield await _checked_out(stack, self.engine.connect)

    def transaction(self) -> contextlib.AbstractAsyncContextManager[AsyncConnection]:
        """A write transaction (serialised on SQLite), for an agent's own tables."""
        return self._async_writing()

    def connection(self) -> contextlib.AbstractAsyncContextManager[AsyncConnection]:
        """A read connection, for an agent's own tables."""
        return self._async_reading()

    # -- this process's claim on a run -----------------------------------------------------

    def _lease_values(self) -> dict[str, Any]:
        """The ``runs`` columns that make this process the run's executor, for ``lease_s``."""
        return {"executor_id": self.instance_id, "lease_expires_at": utcnow() + timedelta(seconds=self.lease_s)}


def _async_engine(url: sa.engine.URL) -> AsyncEngine:
    """SQLAlchemy's async engine on ``url``, with the store's connection settings."""
    from sqlalchemy.ext.asyncio import create_async_engine

    if url.get_backend_name() == "sqlite":
        engine = create_async_engine(url, connect_args={"timeout": 30})
        sa_event.listen(engine.sync_engine, "connect", sqlite_pragmas(busy_timeout_s=30.0))
    else:
        # Up to POOL_CONNECTIONS at once, all kept open once opened: an overflow connection,
        # closed as soon as it is returned, would be opened again under the next burst, and
        # each new connection pays a TCP and SSL handshake, asyncpg's type introspection and
        # the preparing of every statement anew.
        engine = create_async_engine(url, pool_size=POOL_CONNECTIONS, max_overflow=0, pool_timeout=_POOL_TIMEOUT_S)
        sa_event.listen(engine.sync_engine, "checkout", _refuse_closed_connection)
    return engine


_REVISION_SQL = "SELECT version_num FROM alembic_version"


def _sqlite_revision(path: str) -> str | None:
    """The revision recorded in a SQLite file, read on a connection of its own (in a thread)."""
    with contextlib.closing(sqlite3.connect(path, timeout=30)) as raw:
        row = raw.execute(_REVISION_SQL).fetchone()
    return None if row is None else str(row[0])


#: PostgreSQL advisory lock key held while migrating (any constant; "tether" in ASCII).
_MIGRATION_LOCK_KEY = 0x746574686572
_MIGRATION_LOCK = threading.Lock()


def _head_revision() -> str:
    """The newest migration: revisions are numbered like their files (``0008_usage.py`` is ``0008``)."""
    return max(path.name.split("_", 1)[0] for path in (Path(__file__).parent / "migrations" / "versions").glob("[0-9]*_*.py"))


#: The revision a database at the newest schema records.
HEAD_REVISION = _head_revision()


@contextlib.asynccontextmanager
async def _process_migration_lock() -> AsyncIterator[None]:
    """One migration at a time in this process, across event loops and threads.

    Polled rather than acquired in a worker thread, so a cancelled open never leaves the lock
    taken by a thread nobody waits for.
    """
    while not _MIGRATION_LOCK.acquire(blocking=False):  # noqa: ASYNC110  # a thread lock: no asyncio.Event to wait on
        await asyncio.sleep(0.005)
    try:
        yield
    finally:
        _MIGRATION_LOCK.release()


async def _checked_out(stack: contextlib.AsyncExitStack, connecting: Callable[[], contextlib.AbstractAsyncContextManager[AsyncConnection]]) -> AsyncConnection:
    """A connection from the pool; a pool that stays exhausted past its timeout (the process
    is overloaded), or a server that refuses a new connection for want of room for as long
    (``_refused``), is :class:`~tether.errors.Overloaded`, not an internal error."""

    async def enter(_left: float) -> AsyncConnection:  # the pool keeps its own timeout
        return await stack.enter_async_context(connecting())

    try:
        return await patiently(enter, timeout_s=_POOL_TIMEOUT_S)
    except sa.exc.TimeoutError as exc:
        raise database_busy() from exc
