"""Several serving processes on one port (``tether serve --workers N``) and their supervisor.

The supervisor (the process the CLI started) binds the port once, then forks the workers; each
listens on it (``SO_REUSEPORT``: the kernel spreads new connections over them; :data:`REUSE_PORT`)
with the same app, store and guarantees as a single process: on PostgreSQL the workers are
the separate processes of one deployment already (leases, takeover, ``NOTIFY`` fan-out), now
started by one command. The supervisor serves nothing itself:

- a worker that dies (a crash, ``kill -9``, the OOM killer) is replaced at once by a new one
  on the same socket; the runs it executed are taken over by the others once their leases
  lapse (``--lease-seconds``), as when any process of a deployment dies;
- ``SIGTERM`` or ``SIGINT`` (Ctrl-C) is passed to every worker, which drains as a single
  server does (ends its streams, lets its runs finish for ``--drain-seconds``, hands the rest
  over); a second one stops the wait. The supervisor exits once every worker has;
- a worker that could not start (exit status 3: the port, the database, the agent) stops the
  others and the supervisor, instead of being restarted in a loop;
- on Linux a worker is killed with its supervisor (``PR_SET_PDEATHSIG``): ``kill -9`` of the
  supervisor leaves no worker serving behind it.

SQLite keeps one process (:data:`SQLITE_REFUSAL`): its store writes on the event loop with a
write lock that only its own process sees, and its fan-out (a follower's live events, a
cancel reaching the executing run) happens inside that process, with no ``NOTIFY`` to tell
another one.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
from collections.abc import Callable
from types import FrameType

import click

__all__ = ["REUSE_PORT", "SQLITE_REFUSAL", "bind", "supervise"]

#: Why ``--workers`` above 1 is refused on SQLite.
SQLITE_REFUSAL = (
    "several worker processes need PostgreSQL: a SQLite store serves one process (its write lock, and the live "
    "events and cancels it passes to its streams, stay inside that process); use --workers 1 or a postgresql:// database"
)

#: A worker's exit status when its server could not start (as ``uvicorn.run``'s).
STARTUP_FAILED = 3


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
    """A worker's listening socket: its own on the supervisor's address, or the shared one."""
    if not REUSE_PORT:
        return held
    host, port = held.getsockname()[:2]
    sock = _socket(host, port)
    sock.listen(2048)
    held.close()  # the worker's copy of the supervisor's socket
    return sock


def supervise(count: int, sock: socket.socket, serve: Callable[[list[socket.socket]], None]) -> int:
    """Run ``count`` workers, each ``serve([sock])`` in a forked process, until told to stop
    (see the module's docstring); returns the supervisor's exit status."""
    workers: dict[int, int] = {}  # pid → slot
    stops = 0
    failed = False

    def stop(_sig: int = signal.SIGTERM, _frame: FrameType | None = None) -> None:
        nonlocal stops
        stops += 1
        for pid in list(workers):
            try:
                os.kill(pid, signal.SIGTERM)  # a second one stops a worker's wait for its runs
            except ProcessLookupError:
                pass

    def start(slot: int) -> None:
        pid = os.fork()
        if pid == 0:
            _become_worker(sock, serve)  # never returns
        workers[pid] = slot

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for slot in range(count):
        start(slot)
    click.echo(f"Tether: worker processes {', '.join(map(str, workers))}", err=True)
    while workers:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            break
        if pid not in workers:
            continue
        slot = workers.pop(pid)
        code = os.waitstatus_to_exitcode(status)
        if stops:
            continue
        if code == STARTUP_FAILED:
            click.echo(f"Tether: worker {pid} could not start; stopping the others", err=True)
            failed = True
            stop()
            continue
        start(slot)
        click.echo(f"Tether: worker {pid} ended ({_how(code)}); worker {next(p for p, s in workers.items() if s == slot)} replaces it", err=True)
    sock.close()
    return STARTUP_FAILED if failed else 0


def _how(code: int) -> str:
    return f"signal {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"


def _become_worker(sock: socket.socket, serve: Callable[[list[socket.socket]], None]) -> None:
    """In a forked child: serve, then exit without running the supervisor's clean-up."""
    code = 0
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.setpgid(0, 0)  # Ctrl-C reaches the supervisor alone, which passes it on once
        _die_with_parent()
        serve([_listening(sock)])
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
