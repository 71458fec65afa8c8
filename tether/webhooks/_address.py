"""Where a delivery may connect: an address is judged by itself and by every IPv4 address it
embeds, so that ``::ffff:169.254.169.254``, a NAT64 (``64:ff9b::a9fe:a9fe``) or 6to4
(``2002:a9fe:a9fe::``) form of a metadata address is refused like the address itself."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator

__all__ = ["IPAddress", "refusal", "embedded_ipv4"]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def _nets(*names: str) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    return tuple(ipaddress.ip_network(n) for n in names)


#: Never a receiver: link-local ranges (``169.254.169.254`` is the metadata service of most
#: clouds), the metadata addresses outside them (Alibaba's ``100.100.100.200``, AWS's IPv6
#: ``fd00:ec2::254``), "this host", broadcast and multicast.
_ALWAYS_REFUSED = _nets(
    "169.254.0.0/16",
    "100.100.100.200/32",
    "0.0.0.0/8",
    "255.255.255.255/32",
    "224.0.0.0/4",
    "fe80::/10",
    "fd00:ec2::254/128",
    "::/128",
    "ff00::/8",
)

#: Not on the internet: loopback, private (RFC 1918, unique local), shared (CGNAT), the IETF's
#: and benchmarking blocks, the reserved block, site-local and local-use NAT64. Refused unless
#: the operator allows private targets (in ``keys`` mode a user-facing server must not become a
#: way into its own network).
_PRIVATE = _nets(
    "127.0.0.0/8",
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "100.64.0.0/10",
    "192.0.0.0/24",
    "198.18.0.0/15",
    "240.0.0.0/4",
    "::1/128",
    "fc00::/7",
    "fec0::/10",
    "64:ff9b:1::/48",
)

_NAT64_WELL_KNOWN = ipaddress.ip_network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")

#: RFC 6052 §2.2: where a NAT64 prefix of each length puts the IPv4 address's bits (bit ranges
#: counted from the most significant bit; bits 64-71 are always zero, so the address skips them).
_RFC6052 = {
    32: ((32, 64),),
    40: ((40, 64), (72, 80)),
    48: ((48, 64), (72, 88)),
    56: ((56, 64), (72, 96)),
    64: ((72, 104),),
    96: ((96, 128),),
}


def _bits(value: int, start: int, end: int) -> int:
    return (value >> (128 - end)) & ((1 << (end - start)) - 1)


def _rfc6052(address: ipaddress.IPv6Address, prefix_len: int) -> ipaddress.IPv4Address:
    value = int(address)
    v4 = 0
    for start, end in _RFC6052[prefix_len]:
        v4 = (v4 << (end - start)) | _bits(value, start, end)
    return ipaddress.IPv4Address(v4)


def embedded_ipv4(address: ipaddress.IPv6Address) -> Iterator[ipaddress.IPv4Address]:
    """Every IPv4 address an IPv6 one may stand for: mapped, NAT64, 6to4, Teredo, compatible."""
    if address.ipv4_mapped is not None:
        yield address.ipv4_mapped
    if address in _NAT64_WELL_KNOWN:
        yield _rfc6052(address, 96)
    if address in _NAT64_LOCAL:  # local-use NAT64: the operator picks the prefix length
        for prefix_len in (48, 56, 64, 96):
            yield _rfc6052(address, prefix_len)
    if address.sixtofour is not None:
        yield address.sixtofour
    if address.teredo is not None:
        yield from address.teredo  # the Teredo server, and the client (de-obfuscated)
    if address in _IPV4_COMPATIBLE and int(address) > 1:  # deprecated ::a.b.c.d
        yield ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)


def refusal(address: IPAddress, *, allow_private: bool) -> str | None:
    """Why a delivery must not connect to ``address`` (None: it may)."""
    candidates: list[IPAddress] = [address]
    if isinstance(address, ipaddress.IPv6Address):
        candidates += embedded_ipv4(address)
    for refused, why in (
        (_ALWAYS_REFUSED, "a link-local, metadata or non-unicast address"),
        (_PRIVATE, "a loopback or private address (--webhook-allow-private allows it)"),
    ):
        if refused is _PRIVATE and allow_private:
            break
        for candidate in candidates:
            if any(candidate in net for net in refused):
                shown = f"{address} (embedding {candidate})" if candidate is not address else str(address)
                return f"{shown}, {why}"
    return None
