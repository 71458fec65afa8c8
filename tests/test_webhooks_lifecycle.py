"""An endpoint's and a delivery's life beyond one attempt: a 410 disables the endpoint for every
process (and the next start) until an admin enables it; after an outage longer than the retry
period nothing is sent late; finished deliveries are purged after the retention; and each
delivery carries its run's ``traceparent``, under a span of its own."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from tether.client import AsyncClient
from tether.demo import build_demo_agent
from tether.models.scripted import ScriptedModel
from tether.store import Store
from tether.webhooks._maintenance import STALE_ERROR
from tether.webhooks._tables import webhook_attempts

from .conftest import LiveServer, free_port, script, sqlite_url
from .test_webhooks import REFUND_THEN_WRAP_UP, Receiver, finished_delivery, run_once, settings, wait_for

pytestmark = pytest.mark.anyio

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
CALLER = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"


async def deliveries(http: httpx.AsyncClient) -> list[dict[str, Any]]:
    return (await http.get("/v1/webhooks/deliveries")).json()["deliveries"]  # type: ignore[no-any-return]


async def until(check: Any, timeout: float = 20) -> Any:
    """Poll the async ``check`` until it gives something true."""
    deadline = time.monotonic() + timeout
    while not (value := await check()):
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.05)
    return value


async def test_a_410_disables_the_endpoint_for_every_process_until_an_admin_enables_it(db_url: str) -> None:
    answered: list[str] = []

    def answer(webhook_id: str, _attempt: int) -> tuple[int, dict[str, str], float]:
        answered.append(webhook_id)
        return (410 if len(answered) == 1 else 200), {}, 0.0

    live = Receiver(answer).start()
    hooks = settings(live.url)
    first = LiveServer(build_demo_agent(ScriptedModel()), db_url, webhooks=hooks).start()
    # PostgreSQL: another process on the same database. SQLite (one process per database): the next start.
    other: LiveServer | None = LiveServer(build_demo_agent(ScriptedModel()), db_url, webhooks=hooks).start() if "postgresql" in db_url else None
    try:
        async with AsyncClient(first.url) as client, httpx.AsyncClient(base_url=first.url, timeout=30) as http:
            await run_once(client)
            await wait_for(lambda: len(answered) == 1)
            (disabled,) = await until(lambda: _with_status(http, "disabled"))
            assert [a["status_code"] for a in (await http.get(f"/v1/webhooks/deliveries/{disabled['id']}")).json()["attempt_log"]] == [410]
            (endpoint,) = (await http.get("/v1/webhooks/endpoints")).json()["endpoints"]
            assert endpoint["status"] == "disabled" and "410" in endpoint["disabled_reason"] and endpoint["url"] == live.url
        if other is None:
            first.stop()
            other = LiveServer(build_demo_agent(ScriptedModel()), db_url, webhooks=hooks).start()
        async with AsyncClient(other.url) as client, httpx.AsyncClient(base_url=other.url, timeout=30) as http:
            (endpoint,) = (await http.get("/v1/webhooks/endpoints")).json()["endpoints"]
            assert endpoint["status"] == "disabled"
            await run_once(client, "while disabled")
            # Made while disabled: parked as disabled by this process too, never sent.
            await until(lambda: _count(http, "disabled", 2))
            assert len(answered) == 1
            enabled = await http.post(f"/v1/webhooks/endpoints/{endpoint['id']}/enable")
            assert enabled.status_code == 200 and enabled.json()["status"] == "enabled" and enabled.json()["updated_by"] == "local"
            missing = await http.post("/v1/webhooks/endpoints/ep_nope/enable")
            assert missing.status_code == 404 and missing.json()["error"]["code"] == "endpoint_not_found"
        # Enabled for every process: the first one (PostgreSQL) sends again as well.
        sender = first if "postgresql" in db_url else other
        async with AsyncClient(sender.url) as client, httpx.AsyncClient(base_url=sender.url, timeout=30) as http:
            await run_once(client, "enabled again")
            (delivered,) = await until(lambda: _with_status(http, "delivered"))
            assert answered[-1] == delivered["id"] and len(answered) == 2
    finally:
        first.stop()
        if other is not None:
            other.stop()
        live.stop()


async def _with_status(http: httpx.AsyncClient, status: str) -> list[dict[str, Any]]:
    return [d for d in await deliveries(http) if d["status"] == status]


async def _count(http: httpx.AsyncClient, status: str, count: int) -> bool:
    return len(await _with_status(http, status)) == count


async def test_after_an_outage_longer_than_the_retry_period_a_delivery_fails_instead_of_being_sent(db_url: str) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/hook"  # nothing listens yet: the first attempt fails
    retrying = settings(url, schedule=(0.0,) + (1.0,) * 20, retry_period_s=3600.0)
    first = LiveServer(build_demo_agent(ScriptedModel()), db_url, webhooks=retrying).start()
    try:
        async with AsyncClient(first.url) as client, httpx.AsyncClient(base_url=first.url, timeout=30) as http:
            await run_once(client)
            (pending,) = await until(lambda: _tried_and_pending(http))
    finally:
        first.stop()
    # The outage: longer than the retry period the next start has (2 s), counted from the
    # delivery's own timestamp.
    created = datetime.fromisoformat(pending["created_at"].replace("Z", "+00:00"))
    while datetime.now(UTC) < created + timedelta(seconds=2.5):  # a stored stamp, not an event
        await asyncio.sleep(0.05)
    live = Receiver(port=port).start()  # the receiver is back, and would accept it
    second = LiveServer(build_demo_agent(ScriptedModel()), db_url, webhooks=settings(url, retry_period_s=2.0)).start()
    try:
        async with httpx.AsyncClient(base_url=second.url, timeout=30) as http:
            failed = await finished_delivery(http, pending["id"])
            assert failed["status"] == "failed" and failed["last_error"] == STALE_ERROR
            assert live.delivered() == []
    finally:
        second.stop()
        live.stop()


async def _tried_and_pending(http: httpx.AsyncClient) -> list[dict[str, Any]]:
    return [d for d in await deliveries(http) if d["status"] == "pending" and d["attempts"] >= 1]


async def test_finished_deliveries_and_their_attempts_are_purged_after_the_retention(db_url: str) -> None:
    live = Receiver().start()
    hooks = settings(live.url, retention_s=0.5, maintenance_s=0.1)
    server = LiveServer(build_demo_agent(ScriptedModel()), db_url, webhooks=hooks).start()
    try:
        async with AsyncClient(server.url) as client, httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            thread = await client.create_thread()
            run = await client.start_run(thread["id"], script(*REFUND_THEN_WRAP_UP))
            assert await client.wait_for_interrupt(run["id"]) is not None
            await wait_for(lambda: len(live.delivered()) == 1)  # interrupt.created
            created_id = live.delivered()[0]["id"]
            assert (await finished_delivery(http, created_id))["status"] == "delivered"
            # Purged with its attempts; interrupt.expiring, not yet due, is kept.
            await until(lambda: _gone(http, created_id))
            assert [(d["type"], d["status"]) for d in await deliveries(http)] == [("interrupt.expiring", "pending")]
        store = await Store.open(db_url)
        try:
            async with store.connection() as conn:
                left = (await conn.execute(sa.select(sa.func.count()).where(webhook_attempts.c.outbox_id == created_id))).scalar()
            assert left == 0
        finally:
            await store.aclose()
    finally:
        server.stop()
        live.stop()


async def _gone(http: httpx.AsyncClient, delivery_id: str) -> bool:
    answer = await http.get(f"/v1/webhooks/deliveries/{delivery_id}")
    return answer.status_code == 404 and answer.json()["error"]["code"] == "delivery_not_found"


async def test_a_delivery_carries_its_runs_stored_traceparent(db_url: str) -> None:
    live = Receiver().start()
    server = LiveServer(build_demo_agent(ScriptedModel()), db_url, webhooks=settings(live.url)).start()
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            thread = (await http.post("/v1/threads")).json()["id"]
            run = (await http.post(f"/v1/threads/{thread}/runs", json={"input": {"content": script({"text": "hi"})}}, headers={"traceparent": CALLER})).json()
            untraced = (await http.post(f"/v1/threads/{(await http.post('/v1/threads')).json()['id']}/runs", json={"input": {"content": "hi"}})).json()
            await wait_for(lambda: len(live.delivered()) == 2)
        by_run = {r["payload"]["data"]["run_id"]: r for r in live.delivered()}
        # Not tracing: the run's stored context (the caller's) as it is; a run without one, none.
        assert by_run[run["id"]]["traceparent"] == CALLER
        assert by_run[untraced["id"]]["traceparent"] is None
    finally:
        server.stop()
        live.stop()


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    yield InMemorySpanExporter()


async def test_a_traced_delivery_has_a_span_in_its_runs_trace_and_sends_that_spans_context(tmp_path: Path, exporter: InMemorySpanExporter) -> None:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    live = Receiver(lambda _id, n: (503, {}, 0.0) if n == 1 else (200, {}, 0.0)).start()
    server = LiveServer(build_demo_agent(ScriptedModel()), sqlite_url(tmp_path), webhooks=settings(live.url), tracer_provider=provider).start()
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            thread = (await http.post("/v1/threads")).json()["id"]
            run = (await http.post(f"/v1/threads/{thread}/runs", json={"input": {"content": script({"text": "hi"})}}, headers={"traceparent": CALLER})).json()
            await wait_for(lambda: len(live.delivered()) == 2)  # a 503, then a 200

            def webhook_spans() -> list[Any]:
                return [s for s in exporter.get_finished_spans() if s.name == "webhook run.completed"]

            await wait_for(lambda: len(webhook_spans()) == 2)
        spans = sorted(webhook_spans(), key=lambda s: s.start_time)
        for span, received in zip(spans, live.delivered(), strict=True):
            assert span.kind == SpanKind.CLIENT
            assert f"{span.context.trace_id:032x}" == CALLER_TRACE  # the run's trace
            assert span.parent is not None and f"{span.parent.span_id:016x}" == CALLER_SPAN  # under its stored context
            # The receiver's own spans can continue from this attempt's span.
            assert received["traceparent"] == f"00-{CALLER_TRACE}-{span.context.span_id:016x}-01"
            assert span.attributes["tether.webhook.id"] == received["id"] and span.attributes["tether.run.id"] == run["id"]
        assert [s.attributes["http.response.status_code"] for s in spans] == [503, 200]
        assert [s.attributes.get("error.type") for s in spans] == ["503", None]
        assert [s.attributes["tether.webhook.attempt"] for s in spans] == [1, 2]
    finally:
        server.stop()
        live.stop()
