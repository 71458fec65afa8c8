"""The outbound HTTP client of deliveries: timeouts, a capped read, no redirects, and a check of
where the request goes (an allow-list, and never link-local or cloud metadata addresses)."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from ._config import WebhookSettings

if TYPE_CHECKING:
    import httpx

__all__ = ["Answer", "SafeClient", "Refused"]

#: Link-local ranges (169.254.169.254 is the metadata service of most clouds) and the metadata
#: addresses outside them (Alibaba's 100.100.100.200, AWS's IPv6 fd00:ec2::254).
_REFUSED = tuple(ipaddress.ip_network(n) for n in ("169.254.0.0/16", "fe80::/10", "100.100.100.200/32", "fd00:ec2::254/128", "0.0.0.0/32", "::/128"))


class Refused(Exception):
    """The target is not allowed: no request was sent."""


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    retry_after: float | None
    text: str


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        from email.utils import parsedate_to_datetime

        from .._ids import utcnow

        try:
            return max(0.0, (parsedate_to_datetime(value) - utcnow()).total_seconds())
        except (TypeError, ValueError):
            return None


class SafeClient:
    """One ``httpx.AsyncClient`` for every delivery of this process."""

    def __init__(self, settings: WebhookSettings) -> None:
        import httpx

        self.settings = settings
        self._client: httpx.AsyncClient = httpx.AsyncClient(
            follow_redirects=False, timeout=httpx.Timeout(settings.timeout_s), limits=httpx.Limits(max_connections=64), trust_env=False
        )

    async def check_target(self, url: str) -> None:
        """Raise :class:`Refused` unless ``url``'s host is allowed and resolves to allowed addresses."""
        host = urlsplit(url).hostname or ""
        allow = self.settings.allow_hosts
        if allow and host.lower() not in {h.lower() for h in allow}:
            raise Refused(f"host {host!r} is not in the webhook allow-list")
        if not self.settings.refuse_link_local:
            return
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise ConnectionError(f"cannot resolve {host!r}: {exc}") from None
        for info in infos:
            address = ipaddress.ip_address(str(info[4][0]).split("%")[0])
            if any(address in net for net in _REFUSED):
                raise Refused(f"host {host!r} resolves to {address}, a link-local or metadata address")

    async def post(self, url: str, body: str, headers: dict[str, str]) -> Answer:
        """POST ``body``; the answer's status and at most ``max_response_bytes`` of its text."""
        await self.check_target(url)
        cap = self.settings.max_response_bytes
        async with asyncio.timeout(self.settings.timeout_s):
            async with self._client.stream("POST", url, content=body.encode(), headers={"content-type": "application/json", **headers}) as response:
                read = bytearray()
                async for chunk in response.aiter_bytes():
                    read += chunk[: cap - len(read)]
                    if len(read) >= cap:
                        break
                return Answer(response.status_code, _retry_after(response.headers.get("retry-after")), read.decode("utf-8", "replace"))

    async def aclose(self) -> None:
        await self._client.aclose()
