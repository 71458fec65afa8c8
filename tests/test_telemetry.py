"""Traces and latency histograms of runs: the span tree of a run (model call, read-only tool,
human wait, resume, cancel) checked with the SDK's in-memory exporter, and ``/metrics``'
histograms counted per bucket after known runs."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from tether.demo import build_demo_agent

from .conftest import LiveServer, script, sqlite_url

CALLER_TRACE = "0af7651916cd43dd8448eb211c80319c"
CALLER_SPAN = "b7ad6b7169203331"


@pytest.fixture
def traced(tmp_path: Path) -> Iterator[tuple[LiveServer, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    server = LiveServer(build_demo_agent(), sqlite_url(tmp_path), tracer_provider=provider).start()
    try:
        yield server, exporter
    finally:
        server.stop()


def _wait_for(check: Any, timeout: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def _run_through_review_and_cancel(http: httpx.Client) -> tuple[str, str]:
    """A run that looks an order up (read-only), asks for a refund (gated), is approved, and is
    cancelled while its next model call streams. Returns (thread id, run id)."""
    thread = http.post("/v1/threads").json()["id"]
    steps = script(
        {"text": "Looking it up.", "tool_calls": [{"name": "get_order", "args": {"order_id": "A1"}}]},
        {"text": "Refunding.", "tool_calls": [{"name": "refund", "args": {"order_id": "A1", "amount": 3}}]},
        {"tokens": 2000, "delay_ms": 5},
    )
    headers = {"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"}
    run = http.post(f"/v1/threads/{thread}/runs", json={"input": {"content": steps}}, headers=headers).json()["id"]
    interrupt = _wait_for(lambda: http.get(f"/v1/runs/{run}").json()["pending_interrupt"])
    http.post(f"/v1/threads/{thread}/resume", json={"interrupt_id": interrupt["id"], "decisions": [{"decision": "approve"}]}).raise_for_status()

    def streaming() -> bool:
        items = http.get(f"/v1/runs/{run}/events", params={"after_seq": 0, "limit": 1000}).json()["items"]
        return sum(1 for e in items if e["type"] == "token") > 10

    _wait_for(streaming)
    http.post(f"/v1/runs/{run}/cancel", json={"mode": "hard"}).raise_for_status()
    _wait_for(lambda: http.get(f"/v1/runs/{run}").json()["status"] == "cancelled")
    return thread, run


def _hex(value: int, width: int) -> str:
    return f"{value:0{width}x}"


def test_a_run_is_one_trace_under_its_caller_with_a_span_per_stretch_model_call_tool_and_human_wait(
    traced: tuple[LiveServer, InMemorySpanExporter],
) -> None:
    server, exporter = traced
    with httpx.Client(base_url=server.url, timeout=10) as http:
        thread, run = _run_through_review_and_cancel(http)
    spans: list[ReadableSpan] = _wait_for(lambda: [s for s in exporter.get_finished_spans()] if len(exporter.get_finished_spans()) >= 8 else None)
    spans.sort(key=lambda s: s.start_time or 0)
    assert {_hex(s.context.trace_id, 32) for s in spans} == {CALLER_TRACE}  # one trace: the caller's
    names = [s.name for s in spans]
    assert names.count("invoke_agent demo") == 2  # before the wait, and after the resume
    assert names.count("chat ScriptedModel") == 3
    assert names.count("execute_tool get_order") == 1 and names.count("execute_tool refund") == 1
    assert names.count("human_review") == 1
    by_id = {s.context.span_id: s for s in spans}
    first, second = [s for s in spans if s.name == "invoke_agent demo"]
    review = next(s for s in spans if s.name == "human_review")
    # The stretches and the wait hang off the caller's span; no span is open across the wait.
    for span in (first, second, review):
        assert span.parent is not None and _hex(span.parent.span_id, 16) == CALLER_SPAN
    assert first.end_time is not None and review.start_time is not None and first.end_time <= review.end_time  # type: ignore[operator]
    assert review.end_time is not None and second.start_time is not None and review.end_time <= second.start_time
    assert first.attributes["tether.run.outcome"] == "waiting_human" and second.attributes["tether.run.outcome"] == "cancelled"
    assert [e.name for e in second.events] == ["tether.cancelled"] and second.events[0].attributes["tether.cancel.mode"] == "hard"  # type: ignore[index]
    for span in (first, second):
        assert span.kind is SpanKind.INTERNAL
        assert span.attributes["gen_ai.operation.name"] == "invoke_agent"
        assert span.attributes["gen_ai.agent.name"] == "demo"
        assert span.attributes["gen_ai.conversation.id"] == thread
        assert span.attributes["gen_ai.provider.name"] == "tether.scripted"
        assert span.attributes["tether.run.id"] == run
    assert review.attributes["tether.review.decisions"] == ("approve",)
    assert review.attributes["tether.review.actor"] == "local" and review.attributes["tether.review.outcome"] == "decided"
    assert review.attributes["tether.review.tools"] == ("refund",)
    chats = [s for s in spans if s.name.startswith("chat ")]
    for chat in chats:
        assert chat.kind is SpanKind.CLIENT
        assert chat.attributes["gen_ai.operation.name"] == "chat" and chat.attributes["gen_ai.request.model"] == "ScriptedModel"
        assert "gen_ai.usage.input_tokens" in chat.attributes and "gen_ai.usage.output_tokens" in chat.attributes
        assert float(chat.attributes["gen_ai.response.time_to_first_chunk"]) >= 0  # type: ignore[arg-type]
        assert "gen_ai.output.messages" not in chat.attributes  # contents are off by default
    assert by_id[chats[0].parent.span_id] is first and by_id[chats[1].parent.span_id] is first  # type: ignore[union-attr]
    assert by_id[chats[2].parent.span_id] is second and chats[2].attributes["error.type"] == "cancelled"  # type: ignore[union-attr]
    lookup = next(s for s in spans if s.name == "execute_tool get_order")
    refund = next(s for s in spans if s.name == "execute_tool refund")
    assert by_id[lookup.parent.span_id] is first and by_id[refund.parent.span_id] is second  # type: ignore[union-attr]
    assert lookup.attributes["tether.tool.risk"] == "read_only" and refund.attributes["tether.tool.risk"] == "destructive"
    for tool in (lookup, refund):
        assert tool.attributes["gen_ai.operation.name"] == "execute_tool"
        assert str(tool.attributes["gen_ai.tool.call.id"]).startswith("call_")
        assert "gen_ai.tool.call.arguments" not in tool.attributes


def _buckets(text: str, name: str) -> dict[str, float]:
    """``{'<labels>': count}`` of the ``_bucket`` lines of one histogram."""
    out = {}
    for line in text.splitlines():
        if line.startswith(name + "_bucket{"):
            labels, value = line[len(name) + 8 :].rsplit(" ", 1)
            out[labels.rstrip("}")] = float(value)
    return out


def test_metrics_histograms_count_model_calls_tools_waits_cancels_and_runs(traced: tuple[LiveServer, InMemorySpanExporter]) -> None:
    server, _ = traced
    with httpx.Client(base_url=server.url, timeout=10) as http:
        _run_through_review_and_cancel(http)
        thread = http.post("/v1/threads").json()["id"]
        done = http.post(f"/v1/threads/{thread}/runs", json={"input": {"content": script({"text": "Hello there."})}}).json()["id"]
        _wait_for(lambda: http.get(f"/v1/runs/{done}").json()["status"] == "completed")

        def scraped() -> str | None:  # the cancel's latency is read back from its audit entry
            text = http.get("/metrics").text
            return text if 'tether_cancel_latency_seconds_count{mode="hard"} 1.0' in text else None

        text = _wait_for(scraped)
    model = 'gen_ai_operation_name="chat",gen_ai_provider_name="tether.scripted",gen_ai_request_model="ScriptedModel"'
    ops = _buckets(text, "gen_ai_client_operation_duration_seconds")
    assert ops[f'error_type="",{model},le="+Inf"'] == 3  # two answered calls and the greeting
    assert ops[f'error_type="cancelled",{model},le="+Inf"'] == 1
    assert _buckets(text, "gen_ai_client_token_usage")[f'{model},gen_ai_token_type="output",le="+Inf"'] == 4
    assert _buckets(text, "tether_model_time_to_first_token_seconds")['le="+Inf"'] == 4
    tools = _buckets(text, "tether_tool_duration_seconds")
    assert tools['le="+Inf",tier="read_only",tool="get_order"'] == 1 and tools['le="+Inf",tier="destructive",tool="refund"'] == 1
    review = _buckets(text, "tether_review_wait_seconds")
    assert review['le="+Inf",outcome="decided"'] == 1
    assert review['le="86400.0",outcome="decided"'] == 1  # bounded: a test's approval takes less than a day
    runs = _buckets(text, "tether_run_duration_seconds")
    assert runs['le="+Inf",outcome="cancelled"'] == 1 and runs['le="+Inf",outcome="completed"'] == 1
    commits = _buckets(text, "tether_event_commit_seconds")
    assert commits['le="+Inf"'] >= 8
    # Cumulative: each bucket holds at least what the one below does.
    counts = list(commits.values())
    assert counts == sorted(counts)
