"""The event loop Tether serves on (tether/server/_loop.py): uvloop, accepting a burst at once.

Real sockets throughout. The property is counted in turns of the loop, not in time: while
something keeps every turn busy, a burst of connections must be accepted within a few turns
(uvloop's own server, libuv, takes one turn per connection, which the first test shows, so the
test can tell the two apart).
"""

from __future__ import annotations

import asyncio
import errno
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import uvloop

from tether.server._loop import BulkAcceptLoop, BulkAcceptServer

BURST = 200


def run_on(loop_factory: Callable[[], asyncio.AbstractEventLoop], main: Callable[[], Any]) -> Any:
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(asyncio.wait_for(main(), 60))


def connect_burst(port: int, n: int) -> subprocess.Popen[bytes]:
    """``n`` connections opened at once by another process; they stay open until it is killed."""
    code = f"""
import socket, sys
socks = []
for _ in range({n}):
    c = socket.socket(); c.setblocking(False)
    try: c.connect(("127.0.0.1", {port}))
    except BlockingIOError: pass
    socks.append(c)
print("connected", flush=True)
sys.stdin.read()
"""
    return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)


async def turns_to_accept(n: int) -> int:
    """How many turns of a busy loop it takes to accept a burst of ``n`` connections."""
    accepted: list[int] = []
    turn = 0

    class Counting(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            accepted.append(turn)
            self.transport = transport

    server = await asyncio.get_running_loop().create_server(Counting, "127.0.0.1", 0, backlog=2048)
    port = server.sockets[0].getsockname()[1]
    client = connect_burst(port, n)
    try:
        assert client.stdout is not None
        # Blocking the loop on purpose: no turn runs until every connection is in the kernel's queue.
        assert client.stdout.readline() == b"connected\n"
        first = turn
        while len(accepted) < n:
            turn += 1
            await asyncio.sleep(0)  # one turn of the loop: the server's callbacks run in it
        return turn - first
    finally:
        client.kill()
        client.communicate()  # and close its pipes
        server.close()
        await server.wait_closed()


def test_uvloop_alone_accepts_one_connection_per_turn_of_the_loop() -> None:
    # The behaviour the bulk-accepting loop exists for; if a uvloop release changes it, this
    # test says so (and the loop could go).
    assert run_on(uvloop.new_event_loop, lambda: turns_to_accept(BURST)) >= BURST // 2


def test_the_serving_loop_accepts_a_whole_burst_within_a_few_turns() -> None:
    assert run_on(BulkAcceptLoop, lambda: turns_to_accept(BURST)) <= 3


def test_the_serving_loop_serves_http_through_uvicorn_and_stops_accepting_once_closed() -> None:
    import uvicorn
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    async def hello(request: Any) -> PlainTextResponse:
        return PlainTextResponse("hello")

    app = Starlette(routes=[Route("/", hello)])
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", log_config=None, loop="tether.server._loop:new_event_loop")
    server = uvicorn.Server(config)
    done = threading.Event()

    def serve() -> None:
        try:
            server.run()
        finally:
            done.set()

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        for _ in range(600):
            if server.started or done.is_set():
                break
            done.wait(0.05)  # polling for the server thread to start: no event to wait on across threads
        assert server.started
        listener: Any = server.servers[0]
        assert isinstance(listener, BulkAcceptServer)
        port = listener.sockets[0].getsockname()[1]

        async def many() -> list[str]:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", limits=httpx.Limits(max_connections=100)) as http:
                responses = await asyncio.gather(*(http.get("/") for _ in range(100)))
            return [r.text for r in responses]

        assert asyncio.run(many()) == ["hello"] * 100
    finally:
        server.should_exit = True
        thread.join(30)
    assert not thread.is_alive()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()


@pytest.mark.server_errors(r"cannot accept connections \(\[Errno 24\]")
def test_a_listener_out_of_descriptors_pauses_instead_of_spinning_and_goes_on_afterwards() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, BulkAcceptLoop)
        listener = socket.create_server(("127.0.0.1", 0))
        listener.setblocking(False)
        made: list[asyncio.BaseTransport] = []

        class Made(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                made.append(transport)

        server = BulkAcceptServer(loop, [listener], Made, backlog=16)
        resumed: list[Callable[..., Any]] = []
        later = loop.call_later

        def record_later(delay: float, callback: Callable[..., Any], *args: Any) -> asyncio.TimerHandle:
            resumed.append(callback)
            return later(0, callback, *args)  # resume at once: the test waits on the connection, not the pause

        class FullListener:
            """The listening socket, but out of descriptors the first time it accepts."""

            calls = 0

            def accept(self) -> tuple[socket.socket, Any]:
                FullListener.calls += 1
                if FullListener.calls == 1:
                    raise OSError(errno.EMFILE, "Too many open files")
                return listener.accept()

            def fileno(self) -> int:
                return listener.fileno()

        loop.call_later = record_later  # type: ignore[method-assign]
        try:
            server._serving = True
            server._accept_all(FullListener())  # type: ignore[arg-type]
            assert resumed == [server._resume]  # paused, with a resume scheduled
            client = socket.create_connection(listener.getsockname())
            try:
                while not made:
                    await asyncio.sleep(0.01)  # polling: the resumed reader accepts on its own turn
            finally:
                client.close()
        finally:
            loop.call_later = later  # type: ignore[method-assign]
            server.close()
            await server.wait_closed()
            for transport in made:
                transport.close()

    run_on(BulkAcceptLoop, main)
