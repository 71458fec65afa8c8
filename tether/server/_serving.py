"""Serving the application with uvicorn so that stopping it keeps no one waiting.

uvicorn's own shutdown stops accepting connections, then waits (up to its graceful timeout) for
the requests under way to finish, then cuts them, logging an error, and only then runs the
application's shutdown. An event stream never finishes on its own, so every open stream would
hold the shutdown for the whole timeout. :class:`StreamEndingServer` ends them first
(:func:`~tether.server.end_event_streams`): the clients resume elsewhere at once, and the
application's shutdown (``drain_s``, then the hand-over) starts without delay.

**A second signal cuts the drain short.** The first ``SIGTERM`` or ``SIGINT`` starts the
shutdown above; a second one of either kind (a second Ctrl-C, a process manager's or the
``--workers`` supervisor's second ``SIGTERM``) stops the wait for the runs under way
(:func:`~tether.server.stop_draining`), whenever it comes: during the drain, or before it began
(the drain then returns at once). The application's shutdown still runs in full after it: the
runs still executing are stopped, their logged events committed and their claims released, so
another process takes them over at once (PostgreSQL) or the next start does (SQLite). uvicorn's
own reaction to a second Ctrl-C, its ``force_exit``, is not used: it skips the application's
shutdown when it comes early, leaving the runs claimed until their leases lapse. What is left to
wait for is uvicorn's graceful timeout for ordinary requests (3 s in ``tether serve``) and the
release's few statements. A third signal changes nothing more; ``SIGKILL`` is the way to stop
without any of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
from collections.abc import Callable
from types import FrameType

import uvicorn
from fastapi import FastAPI

from . import end_event_streams, stop_draining

__all__ = ["StreamEndingServer", "serve"]


class StreamEndingServer(uvicorn.Server):
    """uvicorn's server, ending ``app``'s open event streams as soon as it is told to stop and
    cutting its drain short when told twice; ``on_started`` is called once it serves."""

    def __init__(self, config: uvicorn.Config, app: FastAPI, *, on_started: Callable[[], None] | None = None) -> None:
        super().__init__(config)
        self._app = app
        self._on_started = on_started
        self._loop: asyncio.AbstractEventLoop | None = None
        #: A second signal came: the drain is cut short.
        self.drain_cut = False

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)
        if self.started and not self.should_exit and self._on_started is not None:
            self._on_started()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        end_event_streams(self._app)
        await super().shutdown(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if not self.should_exit:
            super().handle_exit(sig, frame)  # the first: uvicorn's shutdown begins
            return
        # A second one, SIGTERM or SIGINT alike. uvicorn's own handler would set ``force_exit``
        # on a second SIGINT only, which skips the application's shutdown (no release of the
        # runs) when it comes early; the drain's own cut keeps that shutdown.
        self._captured_signals.append(sig)  # raised again once stopped, as uvicorn does
        if self.drain_cut:
            return
        self.drain_cut = True
        if self._loop is not None:
            self._loop.call_soon_threadsafe(stop_draining, self._app)


def serve(app: FastAPI, config: uvicorn.Config) -> None:
    """Serve ``app`` with ``config`` (whose app it is) until told to stop; exit with status 3,
    as ``uvicorn.run`` does, if the server could not start."""
    server = StreamEndingServer(config, app)
    with contextlib.suppress(KeyboardInterrupt):  # uvicorn raises the Ctrl-C again once stopped
        server.run()
    if not server.started:
        sys.exit(3)
