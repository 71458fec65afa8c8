"""SIGKILL of the sending process in the middle of a delivery, on SQLite (the next start sends
it) and on PostgreSQL (the other process does): nothing lost, never two senders at once."""

from __future__ import annotations

import asyncio
import base64
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from standardwebhooks import Webhook

from tether.store import Store
from tether.webhooks._tables import webhook_outbox

from .conftest import ServerProcess, script, sqlite_url

pytestmark = pytest.mark.anyio

SECRET = "whsec_" + base64.b64encode(b"s" * 32).decode()
FAST = (
    "--webhook-schedule",
    "0,0.2,0.2,0.2,0.2,0.2,0.2,0.2",
    "--webhook-lease-seconds",
    "2",
    "--webhook-timeout-seconds",
    "1.5",
    "--webhook-allow-private",  # the receiver is on 127.0.0.1
)


class HoldingReceiver:
    """Verifies every request; while ``holding``, keeps the first request of each id open until
    its sender goes away (its socket closes when the sender is killed)."""

    def __init__(self) -> None:
        self.holding = True
        self.ok: set[str] = set()
        self.held: list[str] = []
        self.in_flight: dict[str, int] = {}
        self.max_in_flight = 0
        self.bad = 0
        self.lock = threading.Lock()
        config = uvicorn.Config(self.app, host="127.0.0.1", port=0, log_level="warning", log_config=None, interface="asgi3", lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self.url = ""

    async def app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        body = b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the sender died while sending the body: no request was made
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        webhook_id = headers.get("webhook-id", "")
        try:
            Webhook(SECRET).verify(body, headers)
        except Exception:
            self.bad += 1
        with self.lock:
            self.in_flight[webhook_id] = self.in_flight.get(webhook_id, 0) + 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight[webhook_id])
            hold = self.holding
            if hold:
                self.held.append(webhook_id)
        try:
            if hold:
                while (await receive())["type"] != "http.disconnect":
                    pass
                return
            await send({"type": "http.response.start", "status": 204, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            with self.lock:
                self.ok.add(webhook_id)
        finally:
            with self.lock:
                self.in_flight[webhook_id] -= 1

    def start(self) -> HoldingReceiver:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        self.url = f"http://127.0.0.1:{self._server.servers[0].sockets[0].getsockname()[1]}/hook"
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)


async def wait_for(condition: Any, timeout: float = 40) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.05)


async def outbox_ids(db_url: str) -> set[str]:
    store = await Store.open(db_url)
    try:
        async with store._reading() as conn:
            rows = await conn.execute(webhook_outbox.select().where(webhook_outbox.c.event_type != "interrupt.expiring"))
            return {r.id for r in rows}
    finally:
        await store.aclose()


async def all_delivered(db_url: str, receiver: HoldingReceiver, count: int, timeout: float = 40) -> set[str]:
    """Wait until the outbox holds ``count`` notifications and the receiver acknowledged each."""
    deadline = time.monotonic() + timeout
    while True:
        expected = await outbox_ids(db_url)
        if len(expected) == count and receiver.ok >= expected:
            return expected
        assert time.monotonic() < deadline, (len(expected), len(receiver.ok & expected))
        await asyncio.sleep(0.1)


async def start_runs(url: str, count: int) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        for i in range(count):
            thread = (await http.post("/v1/threads", json={})).json()
            answer = await http.post(f"/v1/threads/{thread['id']}/runs", json={"input": {"content": script({"text": f"hello {i}"})}})
            assert answer.status_code == 202, answer.text


@pytest.fixture
def receiver() -> Any:
    live = HoldingReceiver().start()
    yield live
    live.stop()


async def test_sigkill_mid_delivery_on_sqlite_loses_nothing(tmp_path: Path, receiver: HoldingReceiver, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TETHER_WEBHOOK_SECRET", SECRET)
    db = sqlite_url(tmp_path)
    args = ("--webhook", receiver.url, *FAST)
    first = ServerProcess(db, tmp_path / "first.log", extra_args=args).start()
    try:
        await start_runs(first.url, 5)
        await wait_for(lambda: len(receiver.held) >= 1)
        first.kill()  # in the middle of a delivery: the request is open at the receiver
    finally:
        first.stop()
    receiver.holding = False
    second = ServerProcess(db, tmp_path / "second.log", extra_args=args).start()
    try:
        expected = await all_delivered(db, receiver, 5)  # the runs cut short end at the restart
        assert set(receiver.held) <= expected
    finally:
        second.stop()
    assert receiver.bad == 0 and receiver.max_in_flight == 1


async def test_sigkill_of_one_postgres_sender_the_other_delivers(
    pg_db_url: str, tmp_path: Path, receiver: HoldingReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TETHER_WEBHOOK_SECRET", SECRET)
    args = ("--webhook", receiver.url, *FAST)
    servers = [ServerProcess(pg_db_url, tmp_path / f"server-{i}.log", extra_args=args).start() for i in range(2)]
    try:
        await start_runs(servers[0].url, 6)
        await wait_for(lambda: len(receiver.held) >= 2)
        servers[0].kill()
        receiver.holding = False
        expected = await all_delivered(pg_db_url, receiver, 6)
        assert set(receiver.held) <= expected
    finally:
        for s in servers:
            s.stop()
    # Each delivery had one sender at a time: the held ones were sent again only after their
    # sender's lease lapsed (or its process died and the socket closed).
    assert receiver.bad == 0 and receiver.max_in_flight == 1
