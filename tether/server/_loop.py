"""The event loop Tether serves on: uvloop, with every waiting connection accepted at once.

libuv (under uvloop) accepts one connection per turn of the event loop, and leaves the rest of
a burst in the kernel's queue until the next turn (libuv 1.45, "don't accept() connections in a
loop"). A turn is short on an idle server, but under load it is the time every ready callback
takes: with hundreds of streams under way, tens of milliseconds. A burst of new connections (a
crowd of users starting runs together, or every client of a restarted process reconnecting at
once) then waits one turn per connection: 500 of them, seconds, before the first request is
even read. Python's own loop accepts a whole burst in one turn, but is slower at everything
else.

So the server's listening sockets are read here instead: each time one is readable, every
connection waiting on it is accepted (up to the backlog), and handed to uvloop as an accepted
socket, which serves it exactly as its own server would. The rest of uvloop is unchanged.
:class:`BulkAcceptServer` has what uvicorn uses of an ``asyncio.Server``. Connections with TLS,
and servers other than TCP host/port ones, take uvloop's own path.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
from collections.abc import Callable, Iterable
from typing import Any

import uvloop

__all__ = ["BulkAcceptLoop", "BulkAcceptServer", "new_event_loop"]

log = logging.getLogger("tether.server")

#: Errors of ``accept`` that say nothing about the next connection (the client gave up first).
_TRANSIENT = {errno.ECONNABORTED, errno.EPROTO, errno.EPERM, errno.EINTR}
#: Out of descriptors: stop accepting for this long, as asyncio does, instead of spinning.
_FULL = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}
_FULL_PAUSE_S = 1.0


class BulkAcceptServer:
    """Listening sockets whose waiting connections are all accepted in one turn of the loop."""

    def __init__(self, loop: BulkAcceptLoop, sockets: list[socket.socket], protocol_factory: Callable[[], asyncio.Protocol], backlog: int) -> None:
        self._loop = loop
        self._sockets = sockets
        self._protocol_factory = protocol_factory
        self._backlog = backlog
        self._serving = False
        #: Connections being set up (each a task until its transport exists).
        self._connecting: set[asyncio.Task[Any]] = set()
        self._closed = loop.create_future()

    @property
    def sockets(self) -> tuple[socket.socket, ...]:
        return tuple(self._sockets)

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def is_serving(self) -> bool:
        return self._serving

    def start_serving(self) -> None:
        if self._serving or self._closed.done():
            return
        self._serving = True
        for sock in self._sockets:
            self._loop.add_reader(sock.fileno(), self._accept_all, sock)

    def close(self) -> None:
        """Stop accepting and close the listening sockets (connections already made go on)."""
        if self._closed.done():
            return
        for sock in self._sockets:
            if sock.fileno() != -1:
                self._loop.remove_reader(sock.fileno())
            sock.close()
        self._serving = False
        self._closed.set_result(None)

    async def wait_closed(self) -> None:
        await asyncio.shield(self._closed)

    def _accept_all(self, listener: socket.socket) -> None:
        for _ in range(self._backlog):
            try:
                conn, _address = listener.accept()
            except (BlockingIOError, InterruptedError):
                return  # nobody else is waiting
            except OSError as exc:
                if exc.errno in _TRANSIENT:
                    continue
                if exc.errno in _FULL:
                    log.error("cannot accept connections (%s); trying again in %.0f s", exc, _FULL_PAUSE_S)
                    self._loop.remove_reader(listener.fileno())
                    self._loop.call_later(_FULL_PAUSE_S, self._resume, listener)
                    return
                raise
            conn.setblocking(False)
            with contextlib.suppress(OSError):
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            task = self._loop.create_task(self._serve(conn))
            self._connecting.add(task)
            task.add_done_callback(self._connecting.discard)

    def _resume(self, listener: socket.socket) -> None:
        if self._serving and listener.fileno() != -1:
            self._loop.add_reader(listener.fileno(), self._accept_all, listener)

    async def _serve(self, conn: socket.socket) -> None:
        try:
            await self._loop.connect_accepted_socket(self._protocol_factory, conn)
        except OSError as exc:  # the client went away before its transport existed
            log.debug("an accepted connection failed before it was served: %r", exc)
            conn.close()

    async def __aenter__(self) -> BulkAcceptServer:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.close()
        await self.wait_closed()


class BulkAcceptLoop(uvloop.Loop):
    """uvloop's loop whose TCP servers accept every waiting connection in one turn."""

    async def create_server(  # type: ignore[override]
        self,
        protocol_factory: Callable[[], asyncio.Protocol],
        host: str | Iterable[str] | None = None,
        port: int | None = None,
        *,
        sock: socket.socket | None = None,
        backlog: int = 100,
        ssl: Any = None,
        reuse_address: bool | None = None,
        start_serving: bool = True,
        **kwargs: Any,
    ) -> Any:
        if ssl is not None or kwargs:
            uvloop_server: Any = super().create_server  # its own path, with its own (overloaded) signature
            return await uvloop_server(
                protocol_factory, host, port, sock=sock, backlog=backlog, ssl=ssl, reuse_address=reuse_address, start_serving=start_serving, **kwargs
            )
        if sock is not None:
            sock.setblocking(False)
            sock.listen(backlog)
            sockets = [sock]
        else:
            sockets = await self._listening_sockets(host, port, backlog, reuse_address)
        server = BulkAcceptServer(self, sockets, protocol_factory, backlog)
        if start_serving:
            server.start_serving()
        return server

    async def _listening_sockets(self, host: str | Iterable[str] | None, port: int | None, backlog: int, reuse_address: bool | None) -> list[socket.socket]:
        """Bound, listening sockets for ``host`` (a name, an address, several, or all) and ``port``."""
        hosts: list[str | None] = [host] if host is None or isinstance(host, str) else list(host)
        infos: list[tuple[Any, ...]] = []
        for name in hosts:
            infos += await self.getaddrinfo(name or None, port, family=socket.AF_UNSPEC, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        sockets: list[socket.socket] = []
        try:
            for family, kind, proto, _canonical, address in dict.fromkeys(infos):
                sock = socket.socket(family, kind, proto)
                sockets.append(sock)
                if reuse_address is not False:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6 and hasattr(socket, "IPPROTO_IPV6"):
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)  # as asyncio: one socket per family
                sock.bind(address)
                sock.listen(backlog)
                sock.setblocking(False)
        except BaseException:
            for sock in sockets:
                sock.close()
            raise
        return sockets


def new_event_loop() -> asyncio.AbstractEventLoop:
    """The loop uvicorn runs Tether on (``uvicorn.Config(loop="tether.server._loop:new_event_loop")``)."""
    return BulkAcceptLoop()
