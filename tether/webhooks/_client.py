"""The outbound HTTP client of deliveries: timeouts, a capped read, no redirects, and a check of
where the request goes (an allow-list; never link-local or cloud metadata addresses, in any of
their IPv6 forms; loopback and private addresses only when allowed), connecting to the very
address that was checked."""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from ._address import refusal
from ._config import WebhookSettings
from ._transport import PinnedTransport, pinned

__all__ = ["Answer", "SafeClient", "Refused", "Resolver", "retry_after_seconds"]

#: Resolves a host to its addresses (the default asks the system's resolver).
Resolver = Callable[[str], Awaitable[Sequence[str]]]


class Refused(Exception):
    """The target is not allowed: no request was sent."""


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    retry_after: float | None
    text: str


_SECONDS = re.compile(r"^\s*[0-9]+\s*$")


def retry_after_seconds(value: str | None, *, cap: float) -> float | None:
    """A ``Retry-After`` value in seconds, at most ``cap``: integer seconds or an HTTP date
    (RFC 9110 §10.2.3); anything else (``inf``, ``1e12``, ``-5``) is ignored (None)."""
    if not value:
        return None
    if _SECONDS.match(value):
        return min(float(min(int(value), 2**53)), cap)
    from email.utils import parsedate_to_datetime

    from .._ids import utcnow

    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:  # an HTTP date is always GMT
        return None
    return min(max(0.0, (when - utcnow()).total_seconds()), cap)


async def _system_resolver(host: str) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


class SafeClient:
    """One ``httpx.AsyncClient`` for every delivery of this process."""

    def __init__(self, settings: WebhookSettings, *, allow_private: bool, verify: Any = True) -> None:
        self.settings = settings
        self.allow_private = allow_private
        self._resolve: Resolver = settings.resolver or _system_resolver
        self._client = httpx.AsyncClient(
            transport=PinnedTransport(verify=verify), follow_redirects=False, timeout=httpx.Timeout(settings.timeout_s), trust_env=False
        )

    async def check_target(self, url: str) -> str:
        """The address to connect to for ``url``; :class:`Refused` unless its host is allowed
        and every address it resolves to is."""
        host = httpx.URL(url).host
        allow = self.settings.allow_hosts
        if allow and host.lower() not in {h.lower() for h in allow}:
            raise Refused(f"host {host!r} is not in the webhook allow-list")
        try:
            addresses = [host] if _is_literal(host) else list(await self._resolve(host))
        except OSError as exc:
            raise ConnectionError(f"cannot resolve {host!r}: {exc}") from None
        if not addresses:
            raise ConnectionError(f"cannot resolve {host!r}: no address")
        for text in addresses:
            address = ipaddress.ip_address(text.split("%")[0])
            why = refusal(address, allow_private=self.allow_private) if self.settings.refuse_link_local else None
            if why is not None:
                raise Refused(f"host {host!r} resolves to {why}")
        return addresses[0].split("%")[0]

    async def post(self, url: str, body: str, headers: dict[str, str]) -> Answer:
        """POST ``body`` to the checked address; the answer's status and at most
        ``max_response_bytes`` of its text."""
        address = await self.check_target(url)
        cap = self.settings.max_response_bytes
        async with asyncio.timeout(self.settings.timeout_s):
            with pinned(httpx.URL(url).raw_host.decode("ascii"), address):
                async with self._client.stream("POST", url, content=body.encode(), headers={"content-type": "application/json", **headers}) as response:
                    read = bytearray()
                    async for chunk in response.aiter_bytes():
                        read += chunk[: cap - len(read)]
                        if len(read) >= cap:
                            break
                    retry_after = retry_after_seconds(response.headers.get("retry-after"), cap=self.settings.retry_period_s)
                    return Answer(response.status_code, retry_after, read.decode("utf-8", "replace"))

    async def aclose(self) -> None:
        await self._client.aclose()


def _is_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return False
    return True
