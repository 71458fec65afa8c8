"""Webhooks against a real receiver: a uvicorn server on an ephemeral port that verifies every
signature with the ``standardwebhooks`` package, counts deliveries and fails on purpose."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
import uvicorn
from standardwebhooks import Webhook

from tether.client import AsyncClient
from tether.demo import build_demo_agent
from tether.models.scripted import ScriptedModel
from tether.webhooks import Endpoint, WebhookSettings, check_secret, parse_endpoint

from .conftest import LiveServer, refusing_port, script

SECRET = "whsec_" + base64.b64encode(b"k" * 32).decode()
pytestmark = pytest.mark.anyio
#: A receiver's delay meaning "until ``Receiver.release`` is set".
HOLD = -1.0

REFUND_THEN_WRAP_UP = (
    {"text": "I will refund it.", "tool_calls": [{"name": "refund", "args": {"order_id": "A1", "amount": 5}}]},
    {"text": "All settled."},
)


class Receiver:
    """Records every request (verified or not); ``answer(webhook_id, attempt)`` picks the reply."""

    def __init__(self, answer: Callable[[str, int], tuple[int, dict[str, str], float]] | None = None, *, port: int = 0) -> None:
        self.answer = answer or (lambda _id, _n: (200, {}, 0.0))
        self.received: list[dict[str, Any]] = []
        self.bad_signatures = 0
        #: An answer with the delay ``HOLD`` waits until this is set.
        self.release = threading.Event()
        self.in_flight = 0
        self.max_in_flight = 0
        self.lock = threading.Lock()
        self._server = uvicorn.Server(
            uvicorn.Config(self.app, host="127.0.0.1", port=port, log_level="warning", log_config=None, interface="asgi3", lifespan="off")
        )
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self.url = ""

    async def app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the sender died while sending the body (a killed process): no request was made
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        try:
            payload = Webhook(SECRET).verify(body, headers)
        except Exception:
            with self.lock:
                self.bad_signatures += 1
            payload = None
        with self.lock:
            attempt = sum(1 for r in self.received if r["id"] == headers.get("webhook-id")) + 1
            self.received.append({"id": headers.get("webhook-id"), "payload": payload, "attempt": attempt, "traceparent": headers.get("traceparent")})
        status, extra, delay = self.answer(headers.get("webhook-id", ""), attempt)
        with self.lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if delay == HOLD:
                while not self.release.is_set():
                    await asyncio.sleep(0.01)
            elif delay:
                await asyncio.sleep(delay)
            await send({"type": "http.response.start", "status": status, "headers": [(k.encode(), v.encode()) for k, v in extra.items()]})
            await send({"type": "http.response.body", "body": b"ok"})
        finally:
            with self.lock:
                self.in_flight -= 1

    def start(self) -> Receiver:
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

    def delivered(self) -> list[dict[str, Any]]:
        """The first verified request of each webhook-id that got a 2xx, in arrival order."""
        with self.lock:
            return list(self.received)


def settings(url: str, **overrides: Any) -> WebhookSettings:
    # The receivers listen on 127.0.0.1: allowed explicitly, whatever the server's auth mode.
    # A timeout a loaded machine does not reach by itself: a test that wants one answers slower.
    values: dict[str, Any] = {"schedule": (0.0, 0.2, 0.2, 0.2, 0.2), "poll_s": 0.05, "timeout_s": 5.0, "lease_s": 15.0, "allow_private_targets": True}
    values.update(overrides)
    return WebhookSettings(endpoints=(Endpoint(url),), secret=SECRET, public_url="https://tether.example.com", **values)


async def wait_for(condition: Callable[[], bool], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    # 500, then 429 with Retry-After, then a slow answer past the timeout, then 200, per message.
    plan = {1: (500, {}, 0.0), 2: (429, {"retry-after": "0"}, 0.0), 3: (200, {}, 5.5)}
    live = Receiver(lambda _id, n: plan.get(n, (200, {}, 0.0))).start()
    yield live
    live.stop()


@pytest.fixture
def server_with_hooks(db_url: str, receiver: Receiver) -> Iterator[LiveServer]:
    live = LiveServer(build_demo_agent(ScriptedModel()), db_url, webhooks=settings(receiver.url)).start()
    yield live
    live.stop()


async def test_every_event_is_delivered_signed_in_order_with_stable_ids_across_retries(server_with_hooks: LiveServer, receiver: Receiver) -> None:
    async with AsyncClient(server_with_hooks.url) as client:
        thread = await client.create_thread()
        run = await client.start_run(thread["id"], script(*REFUND_THEN_WRAP_UP))
        interrupt = await client.wait_for_interrupt(run["id"])
        assert interrupt is not None
        await client.approve(interrupt)
        await client.wait_for_run(run["id"])

    def ok_types() -> list[str]:
        return [r["payload"]["type"] for r in receiver.delivered() if r["attempt"] >= 4]

    await wait_for(lambda: len(ok_types()) == 3)
    assert receiver.bad_signatures == 0
    assert ok_types() == ["interrupt.created", "interrupt.decided", "run.completed"]
    received = receiver.delivered()
    for webhook_id in {r["id"] for r in received}:
        attempts = [r for r in received if r["id"] == webhook_id]
        assert [a["attempt"] for a in attempts] == [1, 2, 3, 4]  # the same webhook-id each time
        assert len({json.dumps(a["payload"], sort_keys=True) for a in attempts}) == 1
    created = next(r["payload"] for r in received if r["payload"]["type"] == "interrupt.created")
    assert created["data"]["thread_id"] == thread["id"] and created["data"]["run_id"] == run["id"]
    assert created["data"]["url"] == f"https://tether.example.com/?thread={thread['id']}"
    assert created["data"]["actions"] == interrupt["action_requests"]
    # Order per thread: no delivery of the thread started before the one before it succeeded.
    first_try = [r["payload"]["type"] for r in received if r["attempt"] == 1]
    assert first_try == ["interrupt.created", "interrupt.decided", "run.completed"]
    async with httpx.AsyncClient(base_url=server_with_hooks.url) as http:
        deadline = time.monotonic() + 10  # the receiver answers before the sender records it
        while True:
            everything = (await http.get("/v1/webhooks/deliveries")).json()["deliveries"]
            # interrupt.expiring waits for its time, and is dropped then: the interrupt was decided.
            listed = [d for d in everything if d["type"] != "interrupt.expiring"]
            if {d["status"] for d in listed} == {"delivered"}:
                break
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        assert len(listed) == 3
        assert [(d["type"], d["status"]) for d in everything if d["type"] == "interrupt.expiring"] == [("interrupt.expiring", "pending")]
        one = (await http.get(f"/v1/webhooks/deliveries/{listed[0]['id']}")).json()
        assert [a["outcome"] for a in one["attempt_log"]] == ["retry", "retry", "retry", "ok"]
        assert [a["status_code"] for a in one["attempt_log"]][:2] == [500, 429]


async def test_a_lost_race_writes_no_notification(db_url: str) -> None:
    """Twenty racing approvals: one commits, the others roll back, and only one ``interrupt.decided`` exists."""
    live = Receiver().start()
    server = LiveServer(build_demo_agent(ScriptedModel()), db_url, webhooks=settings(live.url)).start()
    try:
        async with AsyncClient(server.url) as client, httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            thread = await client.create_thread()
            run = await client.start_run(thread["id"], script(*REFUND_THEN_WRAP_UP))
            interrupt = await client.wait_for_interrupt(run["id"])
            assert interrupt is not None
            body = {"interrupt_id": interrupt["id"], "decisions": [{"decision": "approve"}]}
            answers = await asyncio.gather(*(http.post(f"/v1/threads/{thread['id']}/resume", json=body) for _ in range(20)))
            assert sorted({a.status_code for a in answers}) in ([200], [200, 409], [409, 200])
            await client.wait_for_run(run["id"])
        await wait_for(lambda: len({r["id"] for r in live.delivered()}) == 3)
        types = [r["payload"]["type"] for r in live.delivered()]
        assert types == ["interrupt.created", "interrupt.decided", "run.completed"]
    finally:
        server.stop()
        live.stop()


async def test_a_dead_receiver_ends_failed_and_can_be_redelivered(sqlite_db_url: str) -> None:
    # Refused for the whole test: a port that was merely free once went to another test's
    # server in a CI run, and an attempt got its answer.
    with refusing_port() as port:
        await _dead_receiver_ends_failed_and_can_be_redelivered(sqlite_db_url, f"http://127.0.0.1:{port}/hook")


async def _dead_receiver_ends_failed_and_can_be_redelivered(sqlite_db_url: str, dead: str) -> None:
    server = LiveServer(build_demo_agent(ScriptedModel()), sqlite_db_url, webhooks=settings(dead, schedule=(0.0, 0.05, 0.05))).start()
    try:
        async with AsyncClient(server.url) as client, httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            thread = await client.create_thread()
            run = await client.start_run(thread["id"], script({"text": "hello"}))
            await client.wait_for_run(run["id"])

            async def failed() -> list[dict[str, Any]]:
                return (await http.get("/v1/webhooks/deliveries", params={"status": "failed"})).json()["deliveries"]  # type: ignore[no-any-return]

            deadline = time.monotonic() + 20
            while not (found := await failed()):
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
            assert found[0]["type"] == "run.completed" and found[0]["attempts"] == 3
            one = (await http.get(f"/v1/webhooks/deliveries/{found[0]['id']}")).json()
            assert all(a["status_code"] is None and a["error"] for a in one["attempt_log"]), one["attempt_log"]
            again = await http.post(f"/v1/webhooks/deliveries/{found[0]['id']}/redeliver")
            assert again.status_code == 200 and again.json()["status"] == "pending"
            assert (await http.get("/v1/webhooks/deliveries/msg_nope")).json()["error"]["code"] == "delivery_not_found"
    finally:
        server.stop()


def test_settings_refuse_bad_secrets_and_filters() -> None:
    with pytest.raises(ValueError):
        check_secret("not-a-secret")
    with pytest.raises(ValueError):
        check_secret("whsec_" + base64.b64encode(b"short").decode())
    assert parse_endpoint("https://x.example/h#run.failed,interrupt.created").events == frozenset({"run.failed", "interrupt.created"})
    with pytest.raises(ValueError):
        parse_endpoint("https://x.example/h#run.exploded")
    with pytest.raises(ValueError):
        parse_endpoint("ftp://x.example/h")


@pytest.fixture
def sqlite_db_url(tmp_path: Any) -> str:
    return f"sqlite:///{tmp_path / 'tether.db'}"


IN_TWO_SECONDS = "<an HTTP date two seconds ahead>"


class Plans:
    """A receiver's answers by the order in which webhook-ids first arrive: ``plans[i][attempt]``."""

    def __init__(self, *plans: dict[int, tuple[int, dict[str, str], float]]) -> None:
        self.plans = plans
        self.order: list[str] = []
        self.lock = threading.Lock()

    def __call__(self, webhook_id: str, attempt: int) -> tuple[int, dict[str, str], float]:
        with self.lock:
            if webhook_id not in self.order:
                self.order.append(webhook_id)
            plan = self.plans[min(self.order.index(webhook_id), len(self.plans) - 1)]
        status, headers, delay = plan.get(attempt, (200, {}, 0.0))
        if headers.get("retry-after") == IN_TWO_SECONDS:  # an HTTP date, made as the answer goes out
            when = datetime.now(UTC) + timedelta(seconds=2)
            headers = {**headers, "retry-after": when.strftime("%a, %d %b %Y %H:%M:%S GMT")}
        return status, headers, delay


async def finished_delivery(http: httpx.AsyncClient, webhook_id: str, timeout: float = 20) -> dict[str, Any]:
    """The delivery once it is delivered or failed, with its attempt log."""
    deadline = time.monotonic() + timeout
    while True:
        one = (await http.get(f"/v1/webhooks/deliveries/{webhook_id}")).json()
        if one.get("status") in ("delivered", "failed"):
            return one  # type: ignore[no-any-return]
        assert time.monotonic() < deadline, one
        await asyncio.sleep(0.05)


async def run_once(client: AsyncClient, text: str = "hello") -> None:
    thread = await client.create_thread()
    run = await client.start_run(thread["id"], script({"text": text}))
    await client.wait_for_run(run["id"])


async def test_a_retry_after_of_inf_or_1e12_or_past_the_period_never_stops_the_sender(db_url: str) -> None:
    plans = Plans(
        # Not integer seconds nor an HTTP date: ignored, retried on the schedule.
        {1: (503, {"retry-after": "inf"}, 0.0), 2: (503, {"retry-after": "1e12"}, 0.0), 3: (429, {"retry-after": IN_TWO_SECONDS}, 0.0)},
        # Far beyond the retry period: clamped to it, so the delivery fails (and is recorded).
        {1: (503, {"retry-after": "99999999999999999999"}, 0.0)},
    )
    live = Receiver(plans).start()
    hooks = settings(live.url, retry_period_s=3600.0)
    server = LiveServer(build_demo_agent(ScriptedModel()), db_url, webhooks=hooks).start()
    try:
        async with AsyncClient(server.url) as client, httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            await run_once(client)
            await wait_for(lambda: len(plans.order) == 1)
            await run_once(client, "again")
            await wait_for(lambda: len(plans.order) == 2)
            first = await finished_delivery(http, plans.order[0])
            assert first["status"] == "delivered"
            assert [(a["status_code"], a["outcome"]) for a in first["attempt_log"]] == [(503, "retry"), (503, "retry"), (429, "retry"), (200, "ok")]
            # The HTTP date was honoured: the last attempt waited for it (the schedule says 0.2 s).
            third, fourth = (datetime.fromisoformat(a["started_at"].replace("Z", "+00:00")) for a in first["attempt_log"][2:])
            assert (fourth - third).total_seconds() >= 0.9
            second = await finished_delivery(http, plans.order[1])
            assert second["status"] == "failed" and [a["outcome"] for a in second["attempt_log"]] == ["failed"]
    finally:
        server.stop()
        live.stop()


async def test_every_non_2xx_but_410_is_retried_and_a_redirect_fails(db_url: str) -> None:
    plans = Plans(
        {1: (404, {}, 0.0), 2: (401, {}, 0.0), 3: (400, {}, 0.0)},  # a receiver mid-deploy
        {1: (302, {"location": "http://169.254.169.254/"}, 0.0)},
    )
    live = Receiver(plans).start()
    hooks = settings(live.url)
    server = LiveServer(build_demo_agent(ScriptedModel()), db_url, webhooks=hooks).start()
    try:
        async with AsyncClient(server.url) as client, httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            await run_once(client)
            await wait_for(lambda: len(plans.order) == 1)
            await run_once(client, "again")
            await wait_for(lambda: len(plans.order) == 2)
            first = await finished_delivery(http, plans.order[0])
            assert first["status"] == "delivered"
            assert [(a["status_code"], a["outcome"]) for a in first["attempt_log"]] == [(404, "retry"), (401, "retry"), (400, "retry"), (200, "ok")]
            second = await finished_delivery(http, plans.order[1])
            assert second["status"] == "failed" and [(a["status_code"], a["outcome"]) for a in second["attempt_log"]] == [(302, "failed")]
            assert len([r for r in live.delivered() if r["id"] == plans.order[1]]) == 1  # never followed, never retried
    finally:
        server.stop()
        live.stop()


async def test_a_redeliver_while_the_delivery_is_in_flight_is_refused(db_url: str) -> None:
    live = Receiver(lambda _id, n: (200, {}, HOLD if n == 1 else 0.0)).start()
    hooks = settings(live.url, timeout_s=30.0, lease_s=60.0)
    server = LiveServer(build_demo_agent(ScriptedModel()), db_url, webhooks=hooks).start()
    try:
        async with AsyncClient(server.url) as client, httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            await run_once(client)
            await wait_for(lambda: len(live.delivered()) == 1)  # the first attempt is held open
            webhook_id = live.delivered()[0]["id"]
            busy = await http.post(f"/v1/webhooks/deliveries/{webhook_id}/redeliver")
            assert busy.status_code == 409 and busy.json()["error"]["code"] == "delivery_in_flight", busy.text
            live.release.set()
            assert (await finished_delivery(http, webhook_id))["status"] == "delivered"
            again = await http.post(f"/v1/webhooks/deliveries/{webhook_id}/redeliver")
            assert again.status_code == 200 and again.json()["status"] == "pending"
            await wait_for(lambda: len(live.delivered()) == 2)
            assert {r["id"] for r in live.delivered()} == {webhook_id}
            assert (await finished_delivery(http, webhook_id))["status"] == "delivered"
        assert live.max_in_flight == 1  # never the same webhook-id twice at once
    finally:
        server.stop()
        live.stop()
