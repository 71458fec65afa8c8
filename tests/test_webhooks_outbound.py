"""Where deliveries may go: every form of a metadata or private address (IPv4, IPv4-mapped,
NAT64, 6to4, Teredo, compatible) answered by a stub resolver is refused before any connection;
private targets are refused by default in ``keys`` mode; and a delivery connects to the address
that was checked (never a second lookup), keeping its host for the ``Host`` header and TLS."""

from __future__ import annotations

import asyncio
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from tether.client import AsyncClient
from tether.demo import build_demo_agent
from tether.models.scripted import ScriptedModel
from tether.store import Store
from tether.webhooks._client import Refused, SafeClient

from .conftest import LiveServer, script
from .test_webhooks import Receiver, settings

pytestmark = pytest.mark.anyio

#: Every one is 169.254.169.254 (or another metadata / link-local address) in some form.
METADATA_FORMS = [
    "169.254.169.254",
    "::ffff:169.254.169.254",
    "::ffff:a9fe:a9fe",
    "64:ff9b::a9fe:a9fe",  # NAT64, the well-known prefix
    "64:ff9b::169.254.169.254",
    "64:ff9b:1:a9fe:a9:fe00::",  # local-use NAT64 with a /48 prefix (RFC 6052: bits 64-71 skipped)
    "2002:a9fe:a9fe::",  # 6to4
    "2002:a9fe:a9fe:1234::1",
    "2001:0:4136:e378:8000:63bf:5601:5601",  # Teredo whose client is 169.254.169.254 (obfuscated)
    "::169.254.169.254",  # IPv4-compatible (deprecated)
    "fe80::1",
    "fe80::1%eth0",
    "100.100.100.200",
    "::ffff:100.100.100.200",
    "fd00:ec2::254",
    "0.0.0.0",
    "::",
]
#: Loopback and private addresses, in the same forms.
PRIVATE_FORMS = [
    "127.0.0.1",
    "127.8.9.10",
    "::1",
    "::ffff:127.0.0.1",
    "64:ff9b::7f00:1",
    "2002:7f00:1::",
    "10.1.2.3",
    "::ffff:10.1.2.3",
    "2002:0a01:0203::",
    "172.16.5.4",
    "192.168.1.1",
    "100.64.0.1",
    "fd12:3456::1",
    "64:ff9b::a00:1",
]
PUBLIC_FORMS = ["93.184.216.34", "2606:2800:220:1:248:1893:25c8:1946", "64:ff9b::5db8:d822", "::ffff:93.184.216.34", "2002:5db8:d822::1"]


class StubResolver:
    """Answers every host with the given addresses, and counts the questions."""

    def __init__(self, *answers: Sequence[str]) -> None:
        self.answers = list(answers)
        self.asked: list[str] = []

    async def __call__(self, host: str) -> Sequence[str]:
        self.asked.append(host)
        return self.answers[min(len(self.asked), len(self.answers)) - 1]


def client(resolver: StubResolver, *, allow_private: bool, **overrides: Any) -> SafeClient:
    return SafeClient(settings("https://hook.example.com/in", resolver=resolver, **overrides), allow_private=allow_private)


@pytest.mark.parametrize("address", METADATA_FORMS)
async def test_a_metadata_address_in_any_form_is_refused_even_with_private_targets_allowed(address: str) -> None:
    for allow_private in (False, True):
        safe = client(StubResolver([address]), allow_private=allow_private)
        try:
            with pytest.raises(Refused, match="link-local, metadata or non-unicast"):
                await safe.check_target("https://hook.example.com/in")
            with pytest.raises(Refused):  # nothing is sent
                await safe.post("https://hook.example.com/in", "{}", {})
        finally:
            await safe.aclose()


@pytest.mark.parametrize("address", PRIVATE_FORMS)
async def test_a_private_address_in_any_form_is_refused_unless_allowed(address: str) -> None:
    refusing = client(StubResolver([address]), allow_private=False)
    allowing = client(StubResolver([address]), allow_private=True)
    try:
        with pytest.raises(Refused, match="loopback or private"):
            await refusing.check_target("https://hook.example.com/in")
        assert await allowing.check_target("https://hook.example.com/in") == address
    finally:
        await refusing.aclose()
        await allowing.aclose()


async def test_public_addresses_pass_and_one_bad_address_among_good_ones_refuses_the_host() -> None:
    for address in PUBLIC_FORMS:
        safe = client(StubResolver([address]), allow_private=False)
        assert await safe.check_target("https://hook.example.com/in") == address
        await safe.aclose()
    mixed = client(StubResolver(["93.184.216.34", "::ffff:169.254.169.254"]), allow_private=True)
    with pytest.raises(Refused):
        await mixed.check_target("https://hook.example.com/in")
    await mixed.aclose()
    # A literal address in the URL is judged without asking the resolver.
    resolver = StubResolver(["93.184.216.34"])
    literal = client(resolver, allow_private=False)
    with pytest.raises(Refused):
        await literal.check_target("http://[::ffff:169.254.169.254]:80/in")
    assert resolver.asked == []
    await literal.aclose()


async def test_keys_mode_refuses_a_loopback_receiver_by_default_and_delivers_when_allowed(tmp_path: Path) -> None:
    for allowed in (None, True):
        db = f"sqlite:///{tmp_path / f'keys-{allowed}.db'}"
        store = await Store.open(db)
        _, key = await store.create_key(name="ops", roles=["admin", "user"], actor="test")
        await store.aclose()
        receiver = Receiver().start()
        hooks = settings(receiver.url, allow_private_targets=allowed)
        server = LiveServer(build_demo_agent(ScriptedModel()), db, auth="keys", webhooks=hooks).start()
        try:
            async with (
                AsyncClient(server.url, api_key=key) as tether,
                httpx.AsyncClient(base_url=server.url, headers={"Authorization": f"Bearer {key}"}) as http,
            ):
                thread = await tether.create_thread()
                run = await tether.start_run(thread["id"], script({"text": "hello"}))
                await tether.wait_for_run(run["id"])

                async def finished() -> list[dict[str, Any]]:
                    deliveries = (await http.get("/v1/webhooks/deliveries")).json()["deliveries"]
                    return [d for d in deliveries if d["status"] in ("delivered", "failed")]

                deadline = time.monotonic() + 20
                while not (done := await finished()):
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.05)
            if allowed is None:
                assert [d["status"] for d in done] == ["failed"] and "loopback or private" in done[0]["last_error"]
                assert done[0]["attempts"] == 1  # refused at once, not retried
                assert receiver.delivered() == []
            else:
                assert [d["status"] for d in done] == ["delivered"]
                assert [r["payload"]["type"] for r in receiver.delivered()] == ["run.completed"]
        finally:
            server.stop()
            receiver.stop()


class HostReceiver:
    """A plain-HTTP or TLS receiver on 127.0.0.1 that records each request's ``Host`` header."""

    def __init__(self, **ssl_options: Any) -> None:
        self.hosts: list[str] = []
        config = uvicorn.Config(self.app, host="127.0.0.1", port=0, log_level="warning", log_config=None, interface="asgi3", lifespan="off", **ssl_options)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self.port = 0

    async def app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        while (await receive()).get("more_body"):
            pass
        self.hosts.append(dict(scope["headers"])[b"host"].decode())
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    def __enter__(self) -> HostReceiver:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        return self

    def __exit__(self, *_: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)


async def test_a_delivery_connects_to_the_checked_address_and_keeps_its_host() -> None:
    # receiver.invalid can never resolve (RFC 6761): the request reaches the receiver only
    # through the address the check was given. A second lookup would rebind it to metadata.
    resolver = StubResolver(["127.0.0.1"], ["169.254.169.254"])
    with HostReceiver() as receiver:
        url = f"http://receiver.invalid:{receiver.port}/in"
        safe = client(resolver, allow_private=True)
        try:
            answer = await safe.post(url, "{}", {})
            assert answer.status == 204
            assert receiver.hosts == [f"receiver.invalid:{receiver.port}"]
            assert resolver.asked == ["receiver.invalid"]  # one lookup, the checked one
            # The next attempt asks again and gets the rebound answer: refused, nothing sent.
            with pytest.raises(Refused):
                await safe.post(url, "{}", {})
            assert len(receiver.hosts) == 1
        finally:
            await safe.aclose()


@pytest.fixture
def certificate(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """A self-signed certificate for ``receiver.invalid`` only (no IP address in it)."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=receiver.invalid"]
        + ["-addext", "subjectAltName=DNS:receiver.invalid", "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )
    yield cert, key


async def test_tls_to_a_pinned_address_verifies_the_certificate_for_the_host(certificate: tuple[Path, Path]) -> None:
    cert, key = certificate
    trust = ssl.create_default_context(cafile=str(cert))
    with HostReceiver(ssl_certfile=str(cert), ssl_keyfile=str(key)) as receiver:
        safe = SafeClient(settings("https://receiver.invalid/in", resolver=StubResolver(["127.0.0.1"])), allow_private=True, verify=trust)
        try:
            # SNI and the certificate check use the host: the certificate names no address.
            answer = await safe.post(f"https://receiver.invalid:{receiver.port}/in", "{}", {})
            assert answer.status == 204 and receiver.hosts == [f"receiver.invalid:{receiver.port}"]
            with pytest.raises(httpx.ConnectError, match="certificate"):  # what an IP-named connection would get
                async with httpx.AsyncClient(verify=trust) as plain:
                    await plain.post(f"https://127.0.0.1:{receiver.port}/in")
        finally:
            await safe.aclose()
