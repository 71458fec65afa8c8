"""SQLite's connections: writes inline on the event loop, reads one hop away in a thread.

Why not the async driver for everything: through aiosqlite every statement is several round
trips to a thread (cursor, execute, fetch, close), each a wake-up of that thread and then of the
event loop, and a write transaction holds SQLite's single write lock across all of them. The
statements themselves take microseconds, and in WAL mode with ``synchronous=NORMAL`` a commit
does not wait for the disk (only a checkpoint does). So the store's own work goes like this:

- **Writes** run on the event loop's thread over one connection, one transaction at a time
  (the store's write lock), with no await inside: a run start holds the write lock for the
  microseconds its statements take. A group commit of many runs' events is the exception: its
  inserts land on scattered index pages (one per run) and take milliseconds, so it runs on the
  same connection in a writer thread (SQLite releases the GIL meanwhile), one hop per
  transaction. That connection never checkpoints the WAL
  itself (``wal_autocheckpoint=0``): once the WAL passes :data:`CHECKPOINT_BYTES`, a
  checkpointer thread of its own, on a connection of its own, copies it into the database while
  the writers go on (``_checkpoint_if_due``), so that neither the loop nor the group commit
  waits for a checkpoint's ``fsync``.
- **Reads** may be long (a 100,000-message path), so they run in a small pool of threads, each
  with its own connection: one hop per statement, rows fetched in the thread. Point reads (a row
  by its key, a count over an index: every request's access check, a run's status) take less
  than the hop would, and run on the loop's thread over a read connection of their own.
- **Every statement runs on ``sqlite3`` itself**: the store's Core statements are compiled once
  per shape by SQLAlchemy's SQLite dialect (``_plans``, as on PostgreSQL), which costs a third
  of SQLAlchemy's ``Connection.execute`` per statement; transactions begin and end on
  SQLAlchemy's connection around them.
- A ``:memory:`` database exists only inside its one connection: the store keeps it on the
  async driver's connection (it is for experiments, not for serving).

Agents' own tables (``Store.transaction()`` / ``Store.connection()``) and migrations keep the
async driver (their callers hold an ``AsyncConnection``), under the same write lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from ._plans import DirectResult, Plans
from ._tables import Hot

if TYPE_CHECKING:
    from sqlalchemy.sql.elements import ClauseElement

__all__ = ["SQLiteConnections", "InlineWriter", "InlineReader", "ThreadedReader", "sqlite_pragmas", "CHECKPOINT_BYTES", "BLOCKING_CHECKPOINT_BYTES"]

log = logging.getLogger("tether.store")

#: The WAL size past which the checkpointer's thread copies it into the database, while the
#: writers go on (SQLite's own automatic checkpoint is at about 4 MiB as well: 1,000 pages).
CHECKPOINT_BYTES = 4 * 1024 * 1024
#: The WAL size past which the writer's thread checkpoints it itself, holding the write lock, and
#: truncates it: the bound on the WAL when the checkpoints that let writers go on never find a
#: moment without a write to finish in (a flood of commits).
BLOCKING_CHECKPOINT_BYTES = 4 * CHECKPOINT_BYTES
#: What a WAL file is cut back to when SQLite starts writing it from its beginning again
#: (``journal_size_limit``), so that its size on disk tells how much it holds.
WAL_KEPT_BYTES = 1024 * 1024
#: Threads (each with its connection) that run reads.
READ_THREADS = 4
#: How long the inline writer waits for SQLite's lock when another process holds it. It blocks
#: the event loop meanwhile, so it is short; only a second process writing the same file waits.
WRITER_BUSY_TIMEOUT_S = 5.0


class _Direct:
    """Runs the store's Core statements on one ``sqlite3`` connection (``_plans``), with the
    part of SQLAlchemy's connection the store uses (``execute``, ``exec_driver_sql``). Its
    methods are coroutines so that store code reads the same on SQLite and PostgreSQL, but they
    never suspend."""

    def __init__(self, conn: sa.Connection, plans: Plans) -> None:
        #: The ``sqlite3`` connection the statements run on.
        self.raw = _driver_connection(conn)
        self._plans = plans

    async def execute(self, statement: ClauseElement, parameters: Any = None) -> DirectResult:
        return run_statement(self.raw, self._plans, statement, parameters)

    async def exec_driver_sql(self, sql: str, parameters: Sequence[Any] = ()) -> DirectResult:
        return run_sql(self.raw, sql, parameters)


class InlineWriter(_Direct):
    """The write connection, used directly on the event loop's thread (in the transaction of
    :meth:`SQLiteConnections.writing`)."""


class InlineReader(_Direct):
    """Point reads on the event loop's thread (a row by its key, a count over an index): they
    take less than a hop to a reader thread costs. Its own connection, never in a transaction."""


class ThreadedReader:
    """Runs each read statement in a reader thread and hands back its rows."""

    def __init__(self, connections: SQLiteConnections) -> None:
        self._connections = connections

    async def execute(self, statement: ClauseElement, parameters: Any = None) -> DirectResult:
        plans = self._connections.plans
        result: DirectResult = await self._connections.read(lambda raw: run_statement(raw, plans, statement, parameters))
        return result

    async def exec_driver_sql(self, sql: str, parameters: Sequence[Any] = ()) -> DirectResult:
        result: DirectResult = await self._connections.read(lambda raw: run_sql(raw, sql, parameters))
        return result


def _driver_connection(conn: sa.Connection) -> sqlite3.Connection:
    """The ``sqlite3`` connection under a SQLAlchemy connection of the pysqlite dialect."""
    raw = conn.connection.driver_connection
    assert isinstance(raw, sqlite3.Connection)
    return raw


def run_statement(raw: sqlite3.Connection, plans: Plans, statement: ClauseElement, parameters: Any) -> DirectResult:
    """Run a Core statement (with a dict of values, or a list of dicts: a batch) on ``raw``."""
    plan, sql, args, batch = plans.prepare(statement, parameters)
    with _sqlalchemy_errors(sql, args):
        if batch is not None:
            raw.executemany(sql, batch)
            return DirectResult([], -1)
        cursor = raw.execute(sql, args or ())
        if plan.returns_rows:
            rows = plan.rows(cursor.fetchall())
            return DirectResult(rows, len(rows))
        return DirectResult([], cursor.rowcount)


def run_sql(raw: sqlite3.Connection, sql: str, parameters: Sequence[Any] = ()) -> DirectResult:
    """Run SQL with ``?`` parameters as it is; rows as ``sqlite3`` gives them."""
    with _sqlalchemy_errors(sql, parameters):
        cursor = raw.execute(sql, parameters)
        rows = cursor.fetchall()
    return DirectResult(rows, len(rows) if rows else cursor.rowcount)


@contextlib.contextmanager
def _sqlalchemy_errors(sql: str, parameters: Any) -> Iterator[None]:
    """``sqlite3``'s errors as SQLAlchemy's (``IntegrityError`` for a refused write, and so on):
    the store's one vocabulary for them, whichever path ran the statement."""
    try:
        yield
    except sqlite3.Error as exc:
        raise sa.exc.DBAPIError.instance(sql, parameters, exc, sqlite3.Error) from exc


class SQLiteConnections:
    """The store's synchronous SQLite connections: one inline writer, a few reader threads."""

    def __init__(self, url: str) -> None:
        sync_url = sa.engine.make_url(url).set(drivername="sqlite")
        self.path = sync_url.database or ""
        if self.path in ("", ":memory:"):
            raise ValueError("an in-memory database has only the async driver's connection")
        self._engine = sa.create_engine(
            sync_url,
            poolclass=sa.pool.NullPool,
            connect_args={"check_same_thread": False, "timeout": WRITER_BUSY_TIMEOUT_S},
        )
        sa.event.listen(self._engine, "connect", sqlite_pragmas(busy_timeout_s=WRITER_BUSY_TIMEOUT_S))
        self._writer_conn = self._engine.connect()
        self._writer_conn.exec_driver_sql("PRAGMA wal_autocheckpoint=0")
        self._writer_conn.commit()
        #: The store's statements compiled for SQLite, shared by every connection here.
        self.plans = Plans(self._engine.dialect, hot=Hot.statements())
        self.writer = InlineWriter(self._writer_conn, self.plans)
        #: Reads in the reader threads; point reads on the loop's thread.
        self.reader = ThreadedReader(self)
        self._point_conn = self._engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        self.point_reader = InlineReader(self._point_conn, self.plans)
        self._local = threading.local()
        self._readers: list[sa.Connection] = []
        self._readers_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=READ_THREADS, thread_name_prefix="tether-sqlite-read")
        self._writer_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tether-sqlite-write")
        self._checkpointer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tether-sqlite-checkpoint")
        self._checkpoint_conn: sa.Connection | None = None  # made and used in the checkpointer's thread
        self._checkpoint_lock = threading.Lock()
        self._checkpoint_running: Future[None] | None = None  # the checkpointer's, while it runs
        #: Checkpoints run so far, in the checkpointer's thread and by the writer itself (for
        #: tests and benchmarks).
        self.checkpoints = 0
        self.blocking_checkpoints = 0

    @contextlib.contextmanager
    def writing(self) -> Iterator[InlineWriter]:
        """A write transaction on the event loop's thread (the caller holds the write lock)."""
        with self._writer_conn.begin():
            yield self.writer

    async def write_in_thread(self, fn: Callable[[sqlite3.Connection], None]) -> None:
        """``fn(connection)`` as one write transaction in the writer's thread (the caller holds
        the write lock), for a transaction too big to run on the loop: a group commit of many
        runs' events, whose scattered index pages cost milliseconds. SQLite releases the GIL
        while it works, so the loop goes on meanwhile.

        Once started, the transaction runs to its end: a cancelled caller still waits for it, so
        the write lock is never released while the connection is in use.
        """
        done = asyncio.get_running_loop().run_in_executor(self._writer_thread, self._write, fn)
        try:
            await asyncio.shield(done)
        except asyncio.CancelledError:
            while not done.done():
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.shield(done)
            raise

    def _write(self, fn: Callable[[sqlite3.Connection], None]) -> None:
        with self._writer_conn.begin():
            fn(self.writer.raw)
        self._checkpoint_if_due()

    async def read(self, fn: Callable[[sqlite3.Connection], Any]) -> Any:
        """``fn(connection)`` in a reader thread, on that thread's own ``sqlite3`` connection."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, self._in_thread, fn)

    def _in_thread(self, fn: Callable[[sqlite3.Connection], Any]) -> Any:
        raw: sqlite3.Connection | None = getattr(self._local, "raw", None)
        if raw is None:
            conn = self._engine.connect().execution_options(isolation_level="AUTOCOMMIT")
            raw = self._local.raw = _driver_connection(conn)
            with self._readers_lock:
                self._readers.append(conn)
        return fn(raw)

    # -- checkpoints off the loop ----------------------------------------------------------

    def _checkpoint_if_due(self) -> None:
        """In the writer's thread, after a group commit: once the WAL has grown past
        :data:`CHECKPOINT_BYTES`, have the checkpointer's thread copy it into the database.

        That checkpoint (``PASSIVE``) takes no write lock, SQLite's or the store's: starts, ends
        and group commits go on while it copies pages and waits for the disk. A checkpoint
        that found nothing written meanwhile lets the next write start the WAL from its
        beginning again (and cut the file back to :data:`WAL_KEPT_BYTES`). Under a flood of
        commits none may find such a moment, and the WAL would grow without bound: past
        :data:`BLOCKING_CHECKPOINT_BYTES` this thread checkpoints it itself between two of the
        store's transactions (no writer of ours can start meanwhile; readers hold no transaction
        between statements), so that it completes and the file shrinks to nothing.
        """
        try:
            size = os.stat(self.path + "-wal").st_size
        except OSError:
            return
        if size >= BLOCKING_CHECKPOINT_BYTES:
            self._checkpoint_blocking()
        elif size >= CHECKPOINT_BYTES:
            with self._checkpoint_lock:
                if self._checkpoint_running is not None:
                    return
                self._checkpoint_running = self._checkpointer.submit(self._checkpoint)

    def _checkpoint_blocking(self) -> None:
        """Checkpoint the WAL and truncate it, in the writer's thread, holding the write lock.

        It waits for the checkpointer's thread to finish first (one checkpoint at a time), but
        never for a reader: a connection holding a snapshot (a long read, a backup, a ``sqlite3``
        shell with a transaction open) keeps any checkpoint from copying the pages written after
        it, and waiting for it would stop every commit for SQLite's busy timeout. The WAL then
        goes on growing until that reader is done, and the next commit tries again.
        """
        with self._checkpoint_lock:
            running = self._checkpoint_running
        if running is not None:
            running.result()
        raw = self.writer.raw
        try:
            raw.execute("PRAGMA busy_timeout=0")
            try:
                raw.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
            finally:
                raw.execute(f"PRAGMA busy_timeout={int(WRITER_BUSY_TIMEOUT_S * 1000)}")
        except sqlite3.Error:  # the commit before it is durable all the same
            log.warning("a checkpoint of the SQLite database %s failed; the next commit will try again", self.path, exc_info=True)
            return
        with self._checkpoint_lock:
            self.checkpoints += 1
            self.blocking_checkpoints += 1

    def _checkpoint(self) -> None:
        """In the checkpointer's thread: copy what the WAL holds into the database, writers
        going on meanwhile. A failure is logged: the writer's own checkpoint still bounds the WAL."""
        done = False
        try:
            if self._checkpoint_conn is None:
                self._checkpoint_conn = self._engine.connect().execution_options(isolation_level="AUTOCOMMIT")
            self._checkpoint_conn.exec_driver_sql("PRAGMA wal_checkpoint(PASSIVE)")
            done = True
        except Exception:
            log.warning("a checkpoint of the SQLite database %s failed; the next one will try again", self.path, exc_info=True)
        finally:
            with self._checkpoint_lock:
                self._checkpoint_running = None
                self.checkpoints += done

    def close(self) -> None:
        """Close every connection (the reader threads end first)."""
        self._writer_thread.shutdown(wait=True)
        self._checkpointer.shutdown(wait=True)
        self._pool.shutdown(wait=True, cancel_futures=True)
        if self._checkpoint_conn is not None:
            self._checkpoint_conn.close()
        with self._readers_lock:
            readers, self._readers = self._readers, []
        for conn in readers:
            conn.close()
        self._point_conn.close()
        self._writer_conn.close()
        self._engine.dispose()


def sqlite_pragmas(*, busy_timeout_s: float) -> Callable[[Any, Any], None]:
    """A ``connect`` listener giving every connection Tether's settings: WAL (readers never
    wait for the writer), ``synchronous=NORMAL`` (a commit does not wait for the disk; a power
    cut may lose the last commits but never corrupts), foreign keys, and how long to wait for
    another connection's lock; a WAL file cut back to :data:`WAL_KEPT_BYTES` when it starts again."""

    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")
        cursor.execute(f"PRAGMA journal_size_limit={WAL_KEPT_BYTES}")
        cursor.close()

    return on_connect
