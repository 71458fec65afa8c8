"""Shared fixtures: a real Tether server on an ephemeral port, and clients for it.

Anything about live streams, disconnects and cancellation goes through a real uvicorn socket:
in-process ASGI test clients buffer whole bodies and hide exactly those bugs. The server runs
in its own thread with its own event loop, as it would in its own process.

Every test is checked for server errors (:func:`no_unexpected_server_errors`): a test fails if a
server it ran logged an ``ERROR`` or a traceback — in this process (a :class:`LiveServer`) or in
a child process (a :class:`ServerProcess`'s log) — unless the test declares it expects one with
``@pytest.mark.server_errors(pattern, …)``. A crashed run or an unhandled exception can then
never hide behind a test that only looked at the HTTP answers.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
import sqlalchemy as sa
import uvicorn

from tether.agent import Agent
from tether.demo import build_demo_agent
from tether.server import create_app


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class _ErrorRecords(logging.Handler):
    """Collects every record at ``ERROR`` or above, and every record carrying a traceback."""

    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.ERROR or record.exc_info:
            self.records.append(record)


_ERROR_RECORDS = _ErrorRecords()
logging.getLogger().addHandler(_ERROR_RECORDS)

#: The log files of the child server processes started by the current test.
_CHILD_LOGS: list[Path] = []

#: What marks an error in a child server's log: a level (uvicorn's ``ERROR:``, Tether's
#: ``ERROR name:``) or the first line of a traceback.
_CHILD_ERROR = re.compile(r"(^|\s)ERROR[:\s]|Traceback \(most recent call last\)")


#: Errors that are not the server's: SQLAlchemy's aiosqlite adapter closes a connection whose
#: checkout was cancelled (a stream closed mid-read) in a task of its own; when the server's loop
#: ends right then, asyncio reports that task at garbage collection, whoever runs then.
_ALWAYS_ALLOWED = [re.compile(r"Task was destroyed but it is pending!.*_terminate_graceful_close", re.S)]


@pytest.fixture(autouse=True)
def no_unexpected_server_errors(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail the test if a server of it logged an error or a traceback it did not expect."""
    _ERROR_RECORDS.records.clear()
    _CHILD_LOGS.clear()
    yield
    marker = request.node.get_closest_marker("server_errors")
    allowed = [re.compile(p) for p in (marker.args if marker else ())]
    problems: list[str] = []
    for record in list(_ERROR_RECORDS.records):
        text = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            text += f" [{type(record.exc_info[1]).__name__}: {record.exc_info[1]}]"
        problems.append(f"{record.levelname} {record.name}: {text}")
    for path in _CHILD_LOGS:
        if path.exists():
            lines = path.read_text(errors="replace").splitlines()
            problems += [f"{path.name}: {line}" for line in lines if _CHILD_ERROR.search(line)]
    unexpected = [p for p in problems if not any(a.search(p) for a in [*allowed, *_ALWAYS_ALLOWED])]
    _ERROR_RECORDS.records.clear()
    if unexpected:
        pytest.fail("a server logged unexpected errors:\n  " + "\n  ".join(unexpected[:20]), pytrace=False)


class LiveServer:
    """A uvicorn server running ``create_app(agent, db_url, **app_options)`` in a background thread."""

    def __init__(self, agent: Agent, db_url: str, **app_options: Any) -> None:
        self.agent = agent
        self.db_url = db_url
        self.app = create_app(agent, db_url, **app_options)
        # log_config=None: uvicorn's loggers propagate to the root, where the error check sees them.
        config = uvicorn.Config(self.app, host="127.0.0.1", port=0, log_level="warning", log_config=None, lifespan="on", timeout_graceful_shutdown=2)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="tether-test-server", daemon=True)
        self.url = ""

    def start(self) -> LiveServer:
        self._thread.start()
        deadline = time.monotonic() + 20
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("test server did not start")
            time.sleep(0.01)
        port = self._server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=20)


def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'tether.db'}"


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh database on each backend: every test using it (and ``server``) runs twice."""
    if request.param == "sqlite":
        yield sqlite_url(tmp_path)
        return
    with _sync_postgres_url() as url:
        yield url


@contextlib.contextmanager
def _sync_postgres_url() -> Iterator[str]:
    """A fresh PostgreSQL database for synchronous fixtures (like :func:`postgres_url_for_test`)."""
    import asyncio

    name = _new_database_name()

    def run(sql: str) -> None:  # in a thread: the caller may be inside a running event loop
        errors: list[BaseException] = []

        def target() -> None:
            try:
                asyncio.run(_pg_admin(sql))
            except BaseException as exc:  # re-raised in the caller's thread
                errors.append(exc)

        worker = threading.Thread(target=target)
        worker.start()
        worker.join()
        if errors:
            raise errors[0]

    run(f'CREATE DATABASE "{name}"')
    try:
        yield _database_url(name)
    finally:
        run(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


#: The PostgreSQL server tests create their databases on (trust auth; ``scripts/test`` makes sure one answers).
POSTGRES_ADMIN_URL = os.environ.get("TETHER_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


@contextlib.asynccontextmanager
async def postgres_url_for_test() -> AsyncIterator[str]:
    """A fresh, empty PostgreSQL database for one test (``tether_t_<hex>``), dropped afterwards.

    An unreachable server is an error, never a skip: the PostgreSQL half of a suite must not
    pass by not running.
    """
    name = _new_database_name()
    await _pg_admin(f'CREATE DATABASE "{name}"')
    try:
        yield _database_url(name)
    finally:
        await _pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _new_database_name() -> str:
    return f"tether_t_{os.urandom(6).hex()}"


def _database_url(name: str) -> str:
    return sa.engine.make_url(POSTGRES_ADMIN_URL).set(database=name).render_as_string(hide_password=False)


async def _pg_admin(sql: str) -> None:
    """Run one statement on the admin database (CREATE/DROP DATABASE)."""
    conn = await asyncpg.connect(POSTGRES_ADMIN_URL, timeout=10)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


@pytest.fixture
async def pg_db_url() -> AsyncIterator[str]:
    """The URL of a fresh PostgreSQL database (for ``anyio`` tests; see :func:`postgres_url_for_test`)."""
    async with postgres_url_for_test() as url:
        yield url


@pytest.fixture
def server(db_url: str) -> Iterator[LiveServer]:
    """The demo agent (scripted model) served on a fresh SQLite database."""
    live = LiveServer(build_demo_agent(), db_url).start()
    try:
        yield live
    finally:
        live.stop()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def refusing_port() -> Iterator[int]:
    """A port where every connection is refused for as long as the block runs: bound, never
    listened on. (A port from :func:`free_port` is free only for a moment: a server another
    test starts meanwhile may take it and answer.)"""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield int(sock.getsockname()[1])


class ServerProcess:
    """``tether demo`` in a child process (for tests that kill the server). ``python_args`` run
    the CLI (``-c`` code that patches something first, then calls ``tether.cli.main()``)."""

    def __init__(
        self,
        db_url: str,
        log_path: Path,
        *,
        extra_args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        python_args: tuple[str, ...] = ("-m", "tether.cli"),
    ) -> None:
        self.db_url = db_url
        self.log_path = log_path
        self.extra_args = extra_args
        self.python_args = python_args
        #: Extra environment of the server process.
        self.env = env or {}
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        _CHILD_LOGS.append(log_path)  # checked for errors when the test ends

    def start(self) -> ServerProcess:
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, *self.python_args, "demo", "--port", str(self.port), "--db", self.db_url, "--log-level", "warning", *self.extra_args],
            stdout=log,
            stderr=log,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env},
        )
        log.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.log_path.read_text()}")
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise RuntimeError("server process did not become healthy")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()


@contextlib.contextmanager
def install_lock(directory: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``directory`` (created if missing) while checking for and
    installing what the tests need there: test processes running in parallel (``pytest -n``)
    then install it once, never into each other."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield  # closing the file releases the lock


def script(*steps: dict[str, Any]) -> str:
    """A user message that makes ScriptedModel play ``steps`` (one per model call)."""
    return json.dumps({"script": list(steps)})


@pytest.fixture
def processes() -> Iterator[list[ServerProcess]]:
    """Started server processes, all stopped at the end (a killed one is already gone)."""
    started: list[ServerProcess] = []
    yield started
    for process in started:
        process.stop()


def start_server(processes: list[ServerProcess], tmp_path: Path, *extra_args: str) -> ServerProcess:
    """Start ``tether demo`` on the SQLite file of ``tmp_path`` (restarts reuse the database)."""
    process = ServerProcess(sqlite_url(tmp_path), tmp_path / f"server-{len(processes)}.log", extra_args=extra_args)
    processes.append(process)
    return process.start()


async def whole_log(server: Any, run_id: str) -> list[dict[str, Any]]:
    """Every event of a run, page after page (a run taken over several times replays its
    model stream each time, so its log can pass one page)."""
    log: list[dict[str, Any]] = []
    while True:
        page = (await server.request("GET", f"/v1/runs/{run_id}/events", params={"after_seq": len(log), "limit": 1000})).json()["items"]
        log += page
        if len(page) < 1000:
            return log


@pytest.fixture
def mcp_dir(tmp_path: Path) -> Path:
    """Where the test MCP server (``tests/mcp_shop_server.py``) writes its effects and its log of
    the requests it received (the MCP tests read what reached it there)."""
    directory = tmp_path / "mcp"
    directory.mkdir()
    return directory
