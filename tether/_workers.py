"""Several serving processes on one port (``tether serve --workers N``) and their supervisor.

The supervisor (the process the CLI started) binds the port once, then forks the workers; each
listens on it (``SO_REUSEPORT``: the kernel spreads new connections over them; :data:`REUSE_PORT`)
with the same app, store and guarantees as a single process: on PostgreSQL the workers are
the separate processes of one deployment already (leases, takeover, ``NOTIFY`` fan-out), now
started by one command. The supervisor serves nothing itself:

- a worker that dies (a crash, ``kill -9``, the OOM killer) is replaced by a new one on the same
  socket: at once, unless its slot is in a crash loop (below); the runs it executed are taken
  over by the others once their leases lapse (``--lease-seconds``), as when any process of a
  deployment dies;
- ``SIGTERM`` or ``SIGINT`` (Ctrl-C) is passed to every worker, which drains as a single
  server does (ends its streams, lets its runs finish for ``--drain-seconds``, hands the rest
  over); a second one is passed on too and cuts the drain short
  (:mod:`tether.server._serving`). The supervisor exits once every worker has;
- a worker that could not start (exit status 3: the port, the database, the agent) during the
  first boot, before every first worker served, stops the others and the supervisor (exit status
  3): the configuration is wrong, and restarting would not fix it. Later, a worker that fails to
  start or dies soon after starting does not stop the healthy ones: its slot is restarted with
  exponential backoff (:data:`RESTART_BACKOFF_S` doubling up to :data:`MAX_RESTART_BACKOFF_S`,
  said in the log each time), so a crash loop (the database down for a while, a model file
  gone) never forks continuously; a worker that served :data:`STABLE_S`, or that served a
  second and was then killed by a signal from outside (the OOM killer, ``kill -9``), resets its
  slot's backoff and is replaced at once;
- on Linux a worker is killed with its supervisor (``PR_SET_PDEATHSIG``): ``kill -9`` of the
  supervisor leaves no worker serving behind it.

A worker tells the supervisor when it serves through a pipe (the ``ready`` callback its
``serve`` gets); the supervisor waits for that pipe, the workers' ends (``SIGCHLD``) and the
signals with one ``select`` (the signals reach it through :func:`signal.set_wakeup_fd`), so it
sleeps until something happens or a restart is due.

SQLite keeps one process (:data:`SQLITE_REFUSAL`): its store writes on the event loop with a
write lock that only its own process sees, and its fan-out (a follower's live events, a
cancel reaching the executing run) happens inside that process, with no ``NOTIFY`` to tell
another one.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType

import click

__all__ = ["REUSE_PORT", "SQLITE_REFUSAL", "Serve", "bind", "supervise"]

#: Why ``--workers`` above 1 is refused on SQLite.
SQLITE_REFUSAL = (
    "several worker processes need PostgreSQL: a SQLite store serves one process (its write lock, and the live "
    "events and cancels it passes to its streams, stay inside that process); use --workers 1 or a postgresql:// database"
)

#: A worker's exit status when its server could not start (as ``uvicorn.run``'s).
STARTUP_FAILED = 3

#: The wait before a slot's second restart in a row; it doubles at each further one.
RESTART_BACKOFF_S = 0.5
#: The longest wait between two restarts of a slot.
MAX_RESTART_BACKOFF_S = 30.0
#: A worker that served this long ended for a reason of its own: its replacement starts at once.
STABLE_S = 10.0
#: A worker killed by a signal after serving this long is replaced at once (not a crash loop).
KILLED_AFTER_S = 1.0

#: What a worker runs: serve on these sockets, calling ``ready()`` once it serves.
Serve = Callable[[list[socket.socket], Callable[[], None]], None]


#: Each worker listens on a socket of its own bound with ``SO_REUSEPORT``, where there is one
#: (Linux, the BSDs): the kernel then spreads new connections evenly over the workers, where
#: one shared socket gives most of them to whichever worker is awake first.
REUSE_PORT = hasattr(socket, "SO_REUSEPORT") and sys.platform.startswith("linux")


def _socket(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if REUSE_PORT:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


def bind(host: str, port: int) -> socket.socket:
    """The supervisor's socket on ``host:port``: it holds the port (and names it, for port 0);
    with :data:`REUSE_PORT` it never listens (each worker listens on its own), otherwise it
    is the listening socket every worker serves."""
    try:
        sock = _socket(host, port)
    except OSError as exc:
        raise click.ClickException(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    if not REUSE_PORT:
        sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _listening(held: socket.socket) -> socket.socket:
    """A worker's socket: its own on the supervisor's address, or the shared one.

    Its own is bound but not listening yet: uvicorn listens on it once the application has
    started. The kernel hands new connections only to listening sockets, so a worker that
    fails to start (a restart in a crash loop) never takes connections it would then reset.
    """
    if not REUSE_PORT:
        return held
    host, port = held.getsockname()[:2]
    sock = _socket(host, port)
    held.close()  # the worker's copy of the supervisor's socket
    return sock


def supervise(count: int, sock: socket.socket, serve: Serve, *, ended: Callable[[int], None] | None = None) -> int:
    """Run ``count`` workers, each ``serve([sock], ready)`` in a forked process, until told to
    stop (see the module's docstring); ``ended(pid)`` is called for each worker that ended.
    Returns the supervisor's exit status."""
    return _Supervisor(count, sock, serve, ended).run()


def backoff(failures: int) -> float:
    """Seconds to wait before restarting a slot whose workers ended early ``failures`` times in
    a row: none after the first, then :data:`RESTART_BACKOFF_S` doubling, capped."""
    if failures <= 1:
        return 0.0
    return float(min(RESTART_BACKOFF_S * 2 ** (failures - 2), MAX_RESTART_BACKOFF_S))


@dataclass
class _Slot:
    """One of the ``count`` places a worker serves in, across its replacements."""

    pid: int | None = None
    #: When (monotonic) its worker said it serves; None until then.
    ready_at: float | None = None
    #: Its workers that ended without serving :data:`STABLE_S`, in a row.
    failures: int = 0
    #: When (monotonic) its next worker is due, while it has none.
    restart_at: float | None = None


class _Supervisor:
    """The loop of :func:`supervise`: fork, wait for ends, readiness and signals, restart."""

    def __init__(self, count: int, sock: socket.socket, serve: Serve, ended: Callable[[int], None] | None) -> None:
        self._sock = sock
        self._serve = serve
        self._ended = ended
        self._slots = [_Slot() for _ in range(count)]
        #: Stops asked for (signals, or a failed first boot), and those passed on to the workers.
        self._stops = 0
        self._stops_sent = 0
        self._failed = False
        #: Every first worker has served: from then on a failed start is restarted, not fatal.
        self._booted = False
        self._ready_r, self._ready_w = os.pipe()
        self._wake_r, self._wake_w = os.pipe()
        for fd in (self._ready_r, self._wake_r, self._wake_w):
            os.set_blocking(fd, False)

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)
        signal.signal(signal.SIGCHLD, _wake)  # a handler, so that a worker's end wakes the select
        signal.set_wakeup_fd(self._wake_w)
        try:
            for slot in self._slots:
                self._start(slot)
            click.echo(f"Tether: worker processes {', '.join(str(s.pid) for s in self._slots)}", err=True)
            while True:
                self._reap()
                self._pass_stops_on()
                if self._stops and not self._live():
                    break
                self._restart_due()
                self._wait()
        finally:
            signal.set_wakeup_fd(-1)
            self._sock.close()
        return STARTUP_FAILED if self._failed else 0

    def _live(self) -> list[_Slot]:
        return [s for s in self._slots if s.pid is not None]

    def _stop(self, _sig: int, _frame: FrameType | None) -> None:
        """``SIGTERM``'s and ``SIGINT``'s handler: counted here, passed on by the loop (which
        the signal wakes), so that a worker forked at that instant is told too."""
        self._stops += 1

    def _pass_stops_on(self) -> None:
        while self._stops_sent < self._stops:
            self._stops_sent += 1
            for slot in self._slots:
                slot.restart_at = None
                if slot.pid is not None:
                    try:
                        os.kill(slot.pid, signal.SIGTERM)  # a second one cuts a worker's drain short
                    except ProcessLookupError:
                        pass

    def _start(self, slot: _Slot) -> None:
        pid = os.fork()
        if pid == 0:
            os.close(self._ready_r)
            os.close(self._wake_r)
            os.close(self._wake_w)
            _become_worker(self._sock, self._serve, self._ready_w)  # never returns
        slot.pid, slot.ready_at, slot.restart_at = pid, None, None

    def _wait(self) -> None:
        """Sleep until a worker ends or serves, a signal comes, or a restart is due."""
        due = [s.restart_at for s in self._slots if s.restart_at is not None]
        timeout = max(min(due) - time.monotonic(), 0.0) if due else None
        readable, _, _ = select.select([self._ready_r, self._wake_r], [], [], timeout)
        if self._wake_r in readable:
            _drain(self._wake_r)
        self._read_ready()

    def _read_ready(self) -> None:
        for line in _drain(self._ready_r).split():
            self._serving(int(line))

    def _serving(self, pid: int) -> None:
        slot = next((s for s in self._slots if s.pid == pid), None)
        if slot is None:
            return
        slot.ready_at = time.monotonic()
        if slot.failures:
            click.echo(f"Tether: worker {pid} serves (after {slot.failures} worker(s) of its slot ended early)", err=True)
        if not self._booted and all(s.ready_at is not None for s in self._slots):
            self._booted = True

    def _reap(self) -> None:
        ended: list[tuple[int, int]] = []
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            ended.append((pid, os.waitstatus_to_exitcode(status)))
        if not ended:
            return
        self._read_ready()  # after the ends: a worker that said it serves, then ended, did serve
        for pid, code in ended:
            slot = next((s for s in self._slots if s.pid == pid), None)
            if slot is None:
                continue
            if self._ended is not None:
                self._ended(pid)
            self._end(slot, pid, code)

    def _end(self, slot: _Slot, pid: int, code: int) -> None:
        served = slot.ready_at
        slot.pid = slot.ready_at = None
        if self._stops:
            return
        if not self._booted and served is None:
            click.echo(f"Tether: worker {pid} could not start ({_how(code)}); stopping the others", err=True)
            self._failed = True
            self._stops += 1
            return
        now = time.monotonic()
        slot.failures = 0 if _did_its_job(served, now, code) else slot.failures + 1
        delay = backoff(slot.failures)
        how = "could not start" if code == STARTUP_FAILED else f"ended ({_how(code)})"
        if delay == 0:
            self._start(slot)
            click.echo(f"Tether: worker {pid} {how}; worker {slot.pid} replaces it", err=True)
            return
        slot.restart_at = now + delay
        click.echo(f"Tether: worker {pid} {how}, {slot.failures} in a row in its slot; restarting it in {delay:g} s", err=True)

    def _restart_due(self) -> None:
        if self._stops:
            return
        now = time.monotonic()
        for slot in self._slots:
            if slot.restart_at is not None and slot.restart_at <= now:
                self._start(slot)
                click.echo(f"Tether: worker {slot.pid} started (restart {slot.failures} in a row of its slot)", err=True)


def _did_its_job(served: float | None, now: float, code: int) -> bool:
    """Whether a worker's end says nothing of a crash loop: it served :data:`STABLE_S`, or it
    served a while (:data:`KILLED_AFTER_S`) and was then killed from outside (a signal: the OOM
    killer, an operator, a chaos test), which a new worker cannot be blamed for in advance. A
    worker that never served, or that exited by itself soon after serving, counts as a failure."""
    if served is None:
        return False
    lived = now - served
    return lived >= STABLE_S or (code < 0 and lived >= KILLED_AFTER_S)


def _wake(_sig: int, _frame: FrameType | None) -> None:
    """``SIGCHLD``'s handler: nothing; its byte on the wakeup fd ends the supervisor's select."""


def _drain(fd: int) -> bytes:
    """Everything a non-blocking pipe holds now."""
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 4096)
        except BlockingIOError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def _how(code: int) -> str:
    return f"signal {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"


def _become_worker(sock: socket.socket, serve: Serve, ready_fd: int) -> None:
    """In a forked child: serve, then exit without running the supervisor's clean-up."""
    code = 0
    try:
        signal.set_wakeup_fd(-1)  # the supervisor's, closed in this process
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        os.setpgid(0, 0)  # Ctrl-C reaches the supervisor alone, which passes it on once
        _die_with_parent()

        def ready() -> None:
            os.write(ready_fd, f"{os.getpid()}\n".encode())  # one write under PIPE_BUF: never mixed with another's

        serve([_listening(sock)], ready)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _die_with_parent() -> None:
    """Linux: this process gets ``SIGKILL`` when its supervisor dies, even by ``kill -9``."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the supervisor died before the call
        os._exit(1)
