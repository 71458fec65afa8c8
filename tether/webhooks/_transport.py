"""An httpx transport that connects to the address the delivery's check approved, not to
whatever a second DNS lookup answers (DNS rebinding): the URL keeps its host, so TLS verifies the
certificate for it (SNI) and the ``Host`` header names it."""

from __future__ import annotations

import contextlib
import contextvars
import typing
from collections.abc import Iterator
from dataclasses import dataclass

import httpcore
import httpx

__all__ = ["PinnedTransport", "pinned"]


@dataclass(frozen=True, slots=True)
class _Pin:
    host: str
    address: str


#: The host the current task's request goes to and the address it was checked at.
_PIN: contextvars.ContextVar[_Pin | None] = contextvars.ContextVar("tether_webhook_pin", default=None)


@contextlib.contextmanager
def pinned(host: str, address: str) -> Iterator[None]:
    """Within this block, a new connection to ``host`` goes to ``address``."""
    token = _PIN.set(_Pin(host, address))
    try:
        yield
    finally:
        _PIN.reset(token)


class _PinnedBackend(httpcore.AsyncNetworkBackend):
    """Opens TCP connections only to pinned addresses (httpcore connects in the request's task)."""

    def __init__(self) -> None:
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109  # httpcore's interface
        local_address: str | None = None,
        socket_options: typing.Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        pin = _PIN.get()
        if pin is None or pin.host != host:
            # Never a connection to an address nobody checked.
            raise httpcore.ConnectError(f"no checked address for {host!r}")
        return await self._inner.connect_tcp(pin.address, port, timeout=timeout, local_address=local_address, socket_options=socket_options)

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109  # httpcore's interface
        socket_options: typing.Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("webhooks never use unix sockets")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class PinnedTransport(httpx.AsyncHTTPTransport):
    """httpx's own transport, whose connection pool dials only pinned addresses.

    A kept-alive connection is reused for its host (the pool keys connections by scheme, host
    and port): it goes to the address checked when it was opened.
    """

    def __init__(self, *, verify: typing.Any = True, max_connections: int = 64) -> None:
        super().__init__(verify=verify, trust_env=False, limits=httpx.Limits(max_connections=max_connections))
        # The only seam httpx offers for the dialling is its pool's network backend.
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=httpx.create_ssl_context(verify=verify, trust_env=False),
            max_connections=max_connections,
            network_backend=_PinnedBackend(),
        )
