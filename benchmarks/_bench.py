"""Shared pieces of the benchmarks: server subprocesses, ``/proc`` readings, a temporary
PostgreSQL database, and a raw-socket asyncio HTTP/SSE client.

The client is built so that it is not what limits a measurement: each event stream is an
:class:`asyncio.Protocol` on its own connection whose ``data_received`` only appends the bytes,
counts three markers with ``bytearray.count``/``find`` (events, ``token`` events, terminal
events) and, when the count of events grew, notes ``(time, events, tokens)``. Everything else —
de-chunking, parsing, checking seqs and token counts — happens after the stream has ended.
Markers rely on one property of Tether's and the floor's sends: each carries whole SSE events,
so an HTTP chunk header never falls inside an event.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")
DEFAULT_POSTGRES_URL = os.environ.get("TETHER_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")

#: Limits of ``tether demo`` lifted for the benchmarks: every request comes from one caller
#: (``local``), and the suite starts hundreds of runs and streams at once on purpose. The
#: limits themselves are not what is measured.
LIFTED_LIMITS = (
    "--max-active-runs",
    "1000000",
    "--run-starts-per-minute",
    "1000000",
    "--requests-per-minute",
    "10000000",
    "--max-streams-per-caller",
    "100000",
)


# -- the machine and its processes ----------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """utime + stime of process ``pid`` (all threads) and of its live children (the workers of
    a ``--workers`` server), from /proc."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    # Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    fields = stat[stat.rindex(b")") + 2 :].split()
    total = (int(fields[11]) + int(fields[12])) / CLK_TCK
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        children = []
    for child in children:
        try:
            total += cpu_seconds(int(child))
        except OSError:  # ended meanwhile
            pass
    return total


def rss_bytes(pid: int) -> int:
    """The resident set size of process ``pid`` (``VmRSS`` of ``/proc/<pid>/status``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}, Python {platform.python_version()}"


def versions(names: Sequence[str] = ("uvicorn", "uvloop", "httptools", "starlette", "fastapi", "sqlalchemy", "aiosqlite", "asyncpg", "pydantic")) -> str:
    from importlib.metadata import PackageNotFoundError, version

    found = []
    for name in names:
        try:
            found.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            pass
    return ", ".join(found)


def tether_revision(repo: Path = REPO) -> str:
    """The commit of the Tether being measured (this checkout, or ``repo``), and whether ``tether/`` differs from it."""
    try:
        rev = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--", "tether"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown revision"
    return f"{rev}{' with uncommitted changes in tether/' if dirty else ''} ({repo})"


def subprocess_env(repo: Path = REPO) -> dict[str, str]:
    """The environment of a server subprocess: this checkout's ``tether`` (or ``repo``'s) first on
    the path, so a worktree is measured even when another checkout is installed in editable mode."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(repo), env.get("PYTHONPATH", "")) if p)
    return env


def healthz_ok(port: int) -> bool:
    """One ``GET /healthz`` over a raw socket: did it answer 200?"""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
            sock.sendall(f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n".encode())
            head = sock.recv(64)
    except OSError:
        return False
    return head.startswith(b"HTTP/1.1 200 ")


class Server:
    """A server subprocess on a free port; ``stop`` sends SIGINT (uvicorn's graceful stop).

    ``started_at`` is ``time.perf_counter()`` right before the process was spawned, so
    :meth:`wait_until_ready` can say how long the start-up took.
    """

    def __init__(self, name: str, argv: list[str], port: int, log_path: Path, *, code: Path = REPO) -> None:
        self.name = name
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = log_path
        self._log = open(log_path, "wb")
        self.started_at = time.perf_counter()
        self.process = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, cwd=code, env=subprocess_env(code))

    @property
    def pid(self) -> int:
        return self.process.pid

    def wait_until_ready(self, timeout: float = 60.0, poll_s: float = 0.005) -> float:
        """Wait for ``/healthz`` to answer 200; returns the seconds since the process was spawned."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            if healthz_ok(self.port):
                return time.perf_counter() - self.started_at
            time.sleep(poll_s)
        self.stop()
        raise RuntimeError(f"{self.name} did not start; its log:\n{self.log_tail(3000)}")

    def log_tail(self, chars: int = 2000) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")[-chars:]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()


def tether_argv(port: int, db_url: str, *extra: str) -> list[str]:
    """``tether demo`` on ``port`` and ``db_url`` at log level ``warning``, limits lifted."""
    return [sys.executable, "-m", "tether.cli", "demo", "--port", str(port), "--db", db_url, "--log-level", "warning", *LIFTED_LIMITS, *extra]


def floor_argv(port: int, db_url: str | None = None) -> list[str]:
    """The floor on ``port``; with ``db_url``, the durable floor writing every event there."""
    return [sys.executable, str(HERE / "_floor_app.py"), "--port", str(port), "--log-level", "warning", *(["--db", db_url] if db_url else [])]


# -- a temporary PostgreSQL database --------------------------------------------------------------


class PgDatabase:
    """A database ``tether_bench_<hex>`` created on ``admin_url``'s server, dropped by :meth:`drop`."""

    def __init__(self, admin_url: str = DEFAULT_POSTGRES_URL) -> None:
        import sqlalchemy as sa

        self.admin_url = admin_url
        self.name = f"tether_bench_{os.urandom(6).hex()}"
        self.url = sa.engine.make_url(admin_url).set(database=self.name).render_as_string(hide_password=False)

    @staticmethod
    async def _admin(admin_url: str, sql: str) -> list[Any]:
        import asyncpg

        conn = await asyncpg.connect(admin_url, timeout=10)
        try:
            return list(await conn.fetch(sql))
        finally:
            await conn.close()

    def _sql(self, sql: str) -> list[Any]:
        # A loop of its own: this is called between measurements, never inside one.
        return asyncio.run(self._admin(self.admin_url, sql))

    def create(self) -> PgDatabase:
        self._sql(f'CREATE DATABASE "{self.name}"')
        return self

    def drop(self) -> None:
        self._sql(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')

    async def acreate(self) -> PgDatabase:
        """:meth:`create`, from inside a running event loop."""
        await self._admin(self.admin_url, f'CREATE DATABASE "{self.name}"')
        return self

    async def adrop(self) -> None:
        await self._admin(self.admin_url, f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')

    def describe_server(self) -> str:
        rows = self._sql(
            "SELECT name, setting FROM pg_settings WHERE name IN ('server_version', 'synchronous_commit', 'fsync', 'commit_delay', 'max_connections') ORDER BY name"
        )
        return ", ".join(f"{r['name']}={r['setting']}" for r in rows)


# -- statistics ----------------------------------------------------------------------------------


def percentile(values: Sequence[float], p: float) -> float:
    """The nearest-rank ``p``-th percentile (NaN for no values)."""
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(-(-p * len(s) // 100)) - 1))]


def median(values: Sequence[float]) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


# -- parsing responses (after the clock stopped) ---------------------------------------------------


@dataclass(slots=True)
class Event:
    """One SSE event of a response body."""

    seq: int
    type: str
    data: bytes


def split_response(raw: bytes) -> tuple[int, bytes, bytes, list[int]]:
    """(status, head, body, sizes of the body's HTTP chunks) of a raw HTTP/1.1 response."""
    head, sep, rest = raw.partition(b"\r\n\r\n")
    if not sep:
        return 0, raw, b"", []
    try:
        status = int(head.split(b" ", 2)[1])
    except (IndexError, ValueError):
        status = 0
    if b"transfer-encoding: chunked" not in head.lower():
        return status, head, rest, [len(rest)] if rest else []
    body = bytearray()
    sizes: list[int] = []
    pos = 0
    while True:
        eol = rest.find(b"\r\n", pos)
        if eol < 0:
            break  # cut off
        size = int(rest[pos:eol].split(b";")[0], 16)
        if size == 0:
            break
        body += rest[eol + 2 : eol + 2 + size]
        sizes.append(size)
        pos = eol + 2 + size + 2
    return status, head, bytes(body), sizes


def header(head: bytes, name: str) -> str | None:
    prefix = name.lower().encode() + b":"
    for line in head.split(b"\r\n")[1:]:
        if line.lower().startswith(prefix):
            return line[len(prefix) :].strip().decode()
    return None


def parse_events(body: bytes) -> list[Event]:
    """The events of an SSE body (comments and ``retry:`` left out)."""
    events = []
    for block in body.split(b"\n\n"):
        seq, kind, data = None, "message", b""
        for line in block.split(b"\n"):
            if line.startswith(b"id: "):
                seq = int(line[4:])
            elif line.startswith(b"event: "):
                kind = line[7:].decode()
            elif line.startswith(b"data: "):
                data = line[6:]
        if seq is not None:
            events.append(Event(seq, kind, data))
    return events


TERMINAL_TYPES = ("done", "error", "cancelled")


def check_events(events: list[Event], *, tokens: int | None = None, terminal: str | None = None) -> str | None:
    """What is wrong with a stream's events (seqs 1..n without a gap, ``tokens`` token events, a
    terminal event last, of type ``terminal``), or None."""
    if not events:
        return "no events"
    if [e.seq for e in events] != list(range(1, len(events) + 1)):
        return "seqs are not 1..n without a gap"
    if events[-1].type not in TERMINAL_TYPES:
        return f"last event is {events[-1].type!r}, not a terminal event"
    if terminal is not None and events[-1].type != terminal:
        detail = events[-1].data[:300].decode(errors="replace")
        return f"ended with {events[-1].type!r}, not {terminal!r}: {detail}"
    if tokens is not None:
        n = sum(1 for e in events if e.type == "token")
        if n != tokens:
            return f"{n} token events, expected {tokens}"
    return None


_IDS = re.compile(rb"\b(run|thr|msg|int|call|proc)_([0-9a-f]+)")
_TS = re.compile(rb"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z")


def normalised(data: bytes) -> bytes:
    """An envelope with its ids and timestamps replaced by placeholders of the same length."""
    data = _IDS.sub(lambda m: m.group(1) + b"_" + b"x" * len(m.group(2)), data)
    return _TS.sub(b"YYYY-MM-DDTHH:MM:SS.ffffffZ", data)


# -- the client ----------------------------------------------------------------------------------

MARK_EVENT = b"\nevent: "
MARK_TOKEN = b"\nevent: token\n"
TERMINAL_MARKS = tuple(b"\nevent: " + t.encode() + b"\n" for t in TERMINAL_TYPES)


def request_bytes(method: str, path: str, port: int, payload: Any = None, *, sse: bool = False) -> bytes:
    """An HTTP/1.1 request (``Connection: close``) with an optional JSON body."""
    body = b"" if payload is None else json.dumps(payload).encode()
    lines = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Connection: close"]
    if sse:
        lines.append("Accept: text/event-stream")
    if payload is not None or method in ("POST", "PUT", "PATCH"):
        lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


class StreamClient(asyncio.Protocol):
    """One request on its own connection, its response read as an SSE stream.

    Times are ``time.perf_counter()``. ``sent_at``: the request was written (right after the
    connection was made); ``first_token_at``: the first ``token`` event arrived; ``ended_at``:
    the terminal event arrived; ``closed_at``: the connection closed (or was aborted); ``arrivals``: ``(time, events so far, tokens so far)`` after each
    read that brought events.
    """

    def __init__(self, request: bytes) -> None:
        self.request = request
        self.buf = bytearray()
        self.sent_at = 0.0
        self.first_token_at = 0.0
        self.ended_at = 0.0
        self.closed_at = 0.0
        self.events = 0
        self.tokens = 0
        self.arrivals: list[tuple[float, int, int]] = []
        self.error: str | None = None
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.transport: asyncio.WriteTransport | None = None
        self._waiters: list[tuple[Callable[[], bool], asyncio.Future[float]]] = []

    # -- the receive path: append, count, note the time ---------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are not asyncio.Transport subclasses
        self.sent_at = time.perf_counter()
        transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        buf = self.buf
        old = len(buf)
        buf += data
        # A marker may straddle two reads: start each count one byte short of a whole marker back.
        events = buf.count(MARK_EVENT, max(0, old - 7))
        if events:
            self.events += events
            tokens = buf.count(MARK_TOKEN, max(0, old - 13))
            if tokens:
                if not self.tokens:
                    self.first_token_at = now
                self.tokens += tokens
            self.arrivals.append((now, self.events, self.tokens))
            if not self.ended_at:
                start = max(0, old - 17)
                if any(buf.find(mark, start) >= 0 for mark in TERMINAL_MARKS):
                    self.ended_at = now
        if self._waiters:
            self._check_waiters(now)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed_at = time.perf_counter()
        if not self.ended_at and self.error is None:
            self.error = f"connection closed before a terminal event ({exc or 'EOF'})"
        if not self.closed.done():
            self.closed.set_result(None)
        for _, fut in self._waiters:
            if not fut.done():
                fut.set_exception(ConnectionError(self.error or "the stream ended"))
        self._waiters.clear()

    def _check_waiters(self, now: float) -> None:
        left = []
        for predicate, fut in self._waiters:
            if predicate():
                if not fut.done():
                    fut.set_result(now)
            else:
                left.append((predicate, fut))
        self._waiters = left

    # -- waiting and reading off the clock ------------------------------------------------------

    async def wait_until(self, predicate: Callable[[], bool], within: float) -> None:
        """Wait until ``predicate()`` holds after a read (or already does)."""
        if predicate():
            return
        if self.closed.done():
            raise ConnectionError(self.error or "the stream ended")
        fut: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self._waiters.append((predicate, fut))
        await asyncio.wait_for(fut, within)

    async def wait_closed(self, within: float) -> None:
        """Wait for the server to close the connection (after the response); abort it after ``within`` seconds."""
        try:
            await asyncio.wait_for(asyncio.shield(self.closed), within)
        except TimeoutError:
            self.error = self.error or "cut off: no terminal event by the deadline"
            self.abort()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def time_of_event(self, n: int) -> float:
        """When the ``n``-th event (1-based) arrived (0.0 if it did not)."""
        return next((t for t, events, _ in self.arrivals if events >= n), 0.0)

    def tokens_at(self, moment: float) -> int:
        """Token events that had arrived by ``moment``."""
        tokens = 0
        for t, _, n in self.arrivals:
            if t > moment:
                break
            tokens = n
        return tokens

    def token_gaps(self) -> list[float]:
        """Seconds between successive reads that brought token events."""
        times = []
        last = 0
        for t, _, n in self.arrivals:
            if n > last:
                times.append(t)
                last = n
        return [b - a for a, b in zip(times, times[1:], strict=False)]

    def response(self) -> tuple[int, bytes, bytes, list[int]]:
        return split_response(bytes(self.buf))

    def check(self, *, tokens: int | None = None, terminal: str | None = "done") -> list[Event]:
        """Parse and check the response once it ended; on a problem, set ``error`` (and return what parsed)."""
        status, head, body, _ = self.response()
        if self.error is None and status != 200:
            self.error = f"HTTP {status}: {body[:300].decode(errors='replace')}"
        events = parse_events(body) if status == 200 else []
        if self.error is None:
            self.error = check_events(events, tokens=tokens, terminal=terminal)
        return events


async def open_stream(port: int, request: bytes) -> StreamClient:
    """Connect and send ``request``; the response is read as it comes."""
    loop = asyncio.get_running_loop()
    client = StreamClient(request)
    try:
        await loop.create_connection(lambda: client, "127.0.0.1", port)
    except OSError as exc:
        client.error = f"connect failed: {exc}"
        client.sent_at = client.closed_at = time.perf_counter()
        client.closed.set_result(None)
    return client


async def http_json(port: int, method: str, path: str, payload: Any = None, *, within: float = 60.0) -> tuple[int, Any]:
    """One request over a raw connection; returns (status, decoded JSON body or None)."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), within)
    try:
        writer.write(request_bytes(method, path, port, payload))
        raw = await asyncio.wait_for(reader.read(), within)  # Connection: close, so to EOF
    finally:
        writer.close()
    status, _, body, _ = split_response(raw)
    try:
        return status, json.loads(body) if body else None
    except ValueError:
        return status, body.decode(errors="replace")
