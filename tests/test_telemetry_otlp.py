"""Spans from real server processes through the real OTLP/HTTP exporter to a real receiver (a
tiny HTTP server here, decoding the protobuf): a run started on one PostgreSQL process, approved
on another, and cancelled from the first is one trace, continued by the second process from the
run's stored trace context."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from .conftest import ServerProcess, script

pytestmark = pytest.mark.anyio

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"


class Receiver:
    """An OTLP/HTTP trace receiver: every span it was sent, with its process's service name."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, Any]] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = ExportTraceServiceRequest.FromString(body)
                with receiver.lock:
                    for resource_spans in request.resource_spans:
                        service = next(a.value.string_value for a in resource_spans.resource.attributes if a.key == "service.name")
                        for scope_spans in resource_spans.scope_spans:
                            receiver.spans += [(service, span) for span in scope_spans.spans]
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def named(self, name: str) -> list[tuple[str, Any]]:
        with self.lock:
            return [(service, span) for service, span in self.spans if span.name == name]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    received = Receiver()
    yield received
    received.server.shutdown()
    received.server.server_close()


def _wait_for(check: Any, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


async def test_a_run_approved_on_another_process_is_one_trace_from_both_exporters(
    pg_db_url: str, tmp_path: Path, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    started: list[ServerProcess] = []
    clients: list[httpx.Client] = []
    try:
        for name in ("a", "b"):
            monkeypatch.setenv("OTEL_SERVICE_NAME", f"tether-{name}")
            started.append(ServerProcess(pg_db_url, tmp_path / f"server-{name}.log").start())
        clients += [httpx.Client(base_url=s.url, timeout=10) for s in started]
        a, b = clients
        thread = a.post("/v1/threads").json()["id"]
        steps = script(
            {"text": "Refunding.", "tool_calls": [{"name": "refund", "args": {"order_id": "A1", "amount": 3}}]},
            {"tokens": 3000, "delay_ms": 5},
        )
        headers = {"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"}
        run = a.post(f"/v1/threads/{thread}/runs", json={"input": {"content": steps}}, headers=headers).json()["id"]
        interrupt = _wait_for(lambda: a.get(f"/v1/runs/{run}").json()["pending_interrupt"])
        b.post(f"/v1/threads/{thread}/resume", json={"interrupt_id": interrupt["id"], "decisions": [{"decision": "approve"}]}).raise_for_status()

        def streaming() -> bool:
            items = a.get(f"/v1/runs/{run}/events", params={"after_seq": 0, "limit": 1000}).json()["items"]
            return sum(1 for e in items if e["type"] == "token") > 10

        _wait_for(streaming)
        a.post(f"/v1/runs/{run}/cancel", json={"mode": "hard"}).raise_for_status()  # B executes it: told through the database
        _wait_for(lambda: a.get(f"/v1/runs/{run}").json()["status"] == "cancelled")
        _wait_for(lambda: len(receiver.named("invoke_agent demo")) >= 2)
        stretches = receiver.named("invoke_agent demo")
        _wait_for(lambda: receiver.named("human_review") and len(receiver.named("chat ScriptedModel")) >= 2 and receiver.named("execute_tool refund"))
    finally:
        for client in clients:
            client.close()
        for server in started:
            server.stop()
    with receiver.lock:
        spans = list(receiver.spans)
    assert {span.trace_id.hex() for _, span in spans} == {CALLER_TRACE}
    by_service = {service: [s.name for _, s in spans if _ == service] for service, _ in spans}
    assert sorted(by_service["tether-a"]) == ["chat ScriptedModel", "invoke_agent demo"]  # the first stretch, until it parks
    # The process that took the decision records the wait and continues the run.
    assert sorted(by_service["tether-b"]) == ["chat ScriptedModel", "execute_tool refund", "human_review", "invoke_agent demo"]
    for service, span in [*stretches, *receiver.named("human_review")]:
        assert span.parent_span_id.hex() == CALLER_SPAN, service  # every stretch and the wait: children of the stored context
    second = next(span for service, span in stretches if service == "tether-b")
    attributes = {a.key: a.value for a in second.attributes}
    assert attributes["tether.run.stretch"].string_value == "resume"
    assert attributes["tether.run.outcome"].string_value == "cancelled"
    refund = receiver.named("execute_tool refund")[0][1]
    assert refund.parent_span_id == second.span_id
