"""Bounded under abuse and load (issue 11): size caps before parsing, rate limits and caps with
their codes, long threads read in pages and by a recursive query, the agent's history policy,
slow readers cut and resumed, model output that cannot be stored, clients that give up.

Each limit is exercised on a real server configured with a small value of it; each check looks
at the status, the code, ``Retry-After`` where there is one, that nothing was stored, and that
the server still answers afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import httpx
import pytest

from tether import Agent, HistoryPolicy
from tether.client import AsyncClient, ServerUnreachable
from tether.demo import build_demo_agent
from tether.events import StoredEvent
from tether.models import ChatMessage, ModelDelta, ModelRequest, TextDelta, ToolCallRequest
from tether.runtime import LocalBus
from tether.server import Limits
from tether.store import MessageRecord, Store

from .conftest import LiveServer, refusing_port, script, sqlite_url

pytestmark = pytest.mark.anyio


@contextlib.contextmanager
def served(db_url: str, agent: Agent | None = None, **limits: int) -> Iterator[LiveServer]:
    """The demo agent (or ``agent``) served with these limits (the others at their defaults)."""
    live = LiveServer(agent or build_demo_agent(), db_url, limits=Limits(**limits)).start()
    try:
        yield live
    finally:
        live.stop()


def assert_error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, f"{response.status_code}: {response.text}"
    body = response.json()
    assert list(body) == ["error"] and set(body["error"]) == {"code", "message", "details"}, body
    assert body["error"]["code"] == code, body
    return body["error"]  # type: ignore[no-any-return]


def assert_retry_after(response: httpx.Response) -> None:
    assert int(response.headers["Retry-After"]) >= 1, response.headers


async def healthy_and_empty(http: httpx.AsyncClient) -> None:
    """The server answers, and no thread was stored."""
    assert (await http.get("/healthz")).status_code == 200
    assert (await http.get("/v1/threads")).json()["items"] == []


def locs(error: dict[str, Any]) -> list[list[Any]]:
    return [d["loc"] for d in error["details"]]


# -- size caps -------------------------------------------------------------------------------


async def test_a_body_over_the_cap_is_refused_before_parsing_and_nothing_is_stored(db_url: str) -> None:
    with served(db_url, max_body_bytes=10_000) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
            big = json.dumps({"metadata": {"blob": "x" * 12_000}}).encode()
            declared = await http.post("/v1/threads", content=big, headers={"content-type": "application/json"})
            error = assert_error(declared, 413, "payload_too_large")
            assert error["details"] == {"max_body_bytes": 10_000}

            async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: counted as it arrives
                for start in range(0, len(big), 4000):
                    yield big[start : start + 4000]

            chunked = await http.post("/v1/threads", content=chunks(), headers={"content-type": "application/json"})
            assert_error(chunked, 413, "payload_too_large")
            await healthy_and_empty(http)
            small = await http.post("/v1/threads", json={"metadata": {"blob": "x" * 9000}})
            assert small.status_code == 201, small.text


async def test_a_client_still_sending_a_refused_body_reads_the_413(db_url: str) -> None:
    # The body passes the cap on its third chunk, and the client goes on sending 40 more. A
    # server that answered and closed with those bytes unread would have its kernel reset the
    # connection, and the client would see the reset, not the 413.
    with served(db_url, max_body_bytes=10_000) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:

            async def chunks() -> AsyncIterator[bytes]:
                yield b'{"metadata": {"blob": "'
                for _ in range(43):
                    yield b"x" * 4000
                yield b'"}}'

            for _ in range(5):
                refused = await http.post("/v1/threads", content=chunks(), headers={"content-type": "application/json"})
                assert_error(refused, 413, "payload_too_large")
                declared = await http.post("/v1/threads", content=b"".join([c async for c in chunks()]), headers={"content-type": "application/json"})
                assert_error(declared, 413, "payload_too_large")
            await healthy_and_empty(http)


async def test_each_field_cap_is_a_422_naming_the_field_and_stores_nothing(db_url: str) -> None:
    with served(db_url) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            metadata = await http.post("/v1/threads", json={"metadata": {"blob": "x" * (16 * 1024)}})
            assert ["body", "metadata"] in locs(assert_error(metadata, 422, "validation_error"))
            await healthy_and_empty(http)

            thread = (await http.post("/v1/threads")).json()
            content = await http.post(f"/v1/threads/{thread['id']}/runs", json={"input": {"content": "x" * 1_000_001}})
            assert ["body", "input", "content"] in locs(assert_error(content, 422, "validation_error"))
            steering = await http.post("/v1/runs/run_any/messages", json={"content": "x" * 100_001})
            assert ["body", "content"] in locs(assert_error(steering, 422, "validation_error"))
            edit = {"decision": "edit", "args": {"order_id": "x" * (64 * 1024)}}
            resume = await http.post(f"/v1/threads/{thread['id']}/resume", json={"interrupt_id": "int_any", "decisions": [edit]})
            assert any("args" in loc for loc in locs(assert_error(resume, 422, "validation_error")))
            after = (await http.get(f"/v1/threads/{thread['id']}")).json()
            assert after["active_leaf_id"] is None and after["active_run_id"] is None


# -- rate limits and caps --------------------------------------------------------------------


async def test_requests_past_the_rate_get_429_with_retry_after(tmp_path: Any) -> None:
    with served(sqlite_url(tmp_path), requests_per_minute=3) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
            for _ in range(3):
                assert (await http.get("/v1/threads")).status_code == 200
            refused = await http.get("/v1/threads")
            assert_error(refused, 429, "rate_limited")
            assert_retry_after(refused)
            assert (await http.post("/v1/threads")).status_code == 429  # nothing is created
            assert (await http.get("/healthz")).status_code == 200  # liveness is not counted


async def test_run_starts_past_the_rate_get_429_and_store_nothing(tmp_path: Any) -> None:
    with served(sqlite_url(tmp_path), run_starts_per_minute=2) as server:
        async with AsyncClient(server.url) as client, httpx.AsyncClient(base_url=server.url, timeout=10) as http:
            for _ in range(2):
                thread = await client.create_thread()
                await client.wait_for_run((await client.start_run(thread["id"], script({"text": "hi"})))["id"])
            thread = await client.create_thread()
            refused = await http.post(f"/v1/threads/{thread['id']}/runs", json={"input": {"content": "one more"}})
            assert_error(refused, 429, "rate_limited")
            assert_retry_after(refused)
            after = await client.get_thread(thread["id"])
            assert after["active_leaf_id"] is None and after["active_run_id"] is None


async def test_a_caller_at_its_cap_of_active_runs_gets_429_until_one_ends(db_url: str) -> None:
    with served(db_url, max_active_runs_per_caller=1) as server:
        async with AsyncClient(server.url) as client, httpx.AsyncClient(base_url=server.url, timeout=10) as http:
            busy = await client.create_thread()
            long_run = await client.start_run(busy["id"], script({"text": "a moment", "tool_calls": [{"name": "sleep", "args": {"seconds": 60}}]}))
            other = await client.create_thread()
            refused = await http.post(f"/v1/threads/{other['id']}/runs", json={"input": {"content": "hello"}})
            error = assert_error(refused, 429, "too_many_active_runs")
            assert error["details"] == {"limit": 1}
            assert_retry_after(refused)
            assert (await client.get_thread(other["id"]))["active_leaf_id"] is None

            await client.cancel(long_run["id"], mode="hard")
            assert (await client.wait_for_run(long_run["id"]))["status"] == "cancelled"
            accepted = await http.post(f"/v1/threads/{other['id']}/runs", json={"input": {"content": script({"text": "now"})}})
            assert accepted.status_code == 202, accepted.text
            await client.wait_for_run(accepted.json()["id"])


async def open_stream(http: httpx.AsyncClient, run_id: str) -> tuple[httpx.Response, contextlib.AsyncExitStack]:
    stack = contextlib.AsyncExitStack()
    response = await stack.enter_async_context(http.stream("GET", f"/v1/runs/{run_id}/events", headers={"Accept": "text/event-stream"}))
    return response, stack


async def test_event_streams_are_capped_per_caller_and_per_process(tmp_path: Any) -> None:
    with served(sqlite_url(tmp_path), max_streams_per_caller=1, max_streams=2) as server:
        async with AsyncClient(server.url) as client, httpx.AsyncClient(base_url=server.url, timeout=10) as http:
            thread = await client.create_thread()
            run = await client.start_run(thread["id"], script({"text": "wait", "tool_calls": [{"name": "sleep", "args": {"seconds": 60}}]}))
            first, stack = await open_stream(http, run["id"])
            assert first.status_code == 200
            second, second_stack = await open_stream(http, run["id"])
            async with second_stack:
                await second.aread()
                assert_error(second, 429, "too_many_streams")
                assert_retry_after(second)
            await stack.aclose()  # the slot comes back once the server sees the stream end
            with anyio.fail_after(20):
                while True:
                    again, again_stack = await open_stream(http, run["id"])
                    async with again_stack:
                        if again.status_code == 200:
                            break
                        await again.aread()
                        assert_error(again, 429, "too_many_streams")
                    await anyio.sleep(0.05)  # polling interval while the server closes the first stream
            await client.cancel(run["id"], mode="hard")
            await client.wait_for_run(run["id"])

    with served(sqlite_url(tmp_path), max_streams_per_caller=5, max_streams=1) as server:
        async with AsyncClient(server.url) as client, httpx.AsyncClient(base_url=server.url, timeout=10) as http:
            thread = await client.create_thread()
            run = await client.start_run(thread["id"], script({"text": "wait", "tool_calls": [{"name": "sleep", "args": {"seconds": 60}}]}))
            first, stack = await open_stream(http, run["id"])
            async with stack:
                assert first.status_code == 200
                full, full_stack = await open_stream(http, run["id"])
                async with full_stack:
                    await full.aread()
                    assert_error(full, 503, "stream_capacity")
                    assert_retry_after(full)
            await client.cancel(run["id"], mode="hard")
            assert (await http.get(f"/v1/runs/{run['id']}/events")).status_code == 200  # the JSON page takes no slot


async def test_steering_messages_past_the_queue_cap_get_429(tmp_path: Any) -> None:
    with served(sqlite_url(tmp_path), max_queued_messages=2) as server:
        async with AsyncClient(server.url) as client, httpx.AsyncClient(base_url=server.url, timeout=10) as http:
            thread = await client.create_thread()
            run = await client.start_run(thread["id"], script({"tokens": 5000, "delay_ms": 5}))
            async with contextlib.aclosing(client.follow(run["id"])) as events:
                async for event in events:
                    if event.type == "token":  # the model turn is streaming: steering queues up
                        break
            for n in range(2):
                assert (await http.post(f"/v1/runs/{run['id']}/messages", json={"content": f"steer {n}"})).status_code == 202
            refused = await http.post(f"/v1/runs/{run['id']}/messages", json={"content": "one too many"})
            error = assert_error(refused, 429, "too_many_queued_messages")
            assert error["details"] == {"limit": 2}
            assert_retry_after(refused)
            await client.cancel(run["id"], mode="hard")
            events_seen = [e async for e in client.follow(run["id"])]
            steered = [e.data["content"] for e in events_seen if e.type == "user_message"]
            assert steered == ["steer 0", "steer 1"]  # the refused one was never announced or stored
            path = await client.messages(thread["id"])
            assert "one too many" not in [m["content"] for m in path]


# -- model output that cannot be stored ----------------------------------------------------


async def test_a_model_that_emits_nul_and_lone_surrogates_completes_on_both_backends(server: LiveServer) -> None:
    steps = script(
        {"thinking": "hm\u0000m", "text": "a\u0000b c\ud800d", "tool_calls": [{"name": "get_order", "args": {"order_id": "A1\u0000"}}]},
        {"text": "done\u0000"},
    )
    async with AsyncClient(server.url) as client:
        thread = await client.create_thread()
        run = await client.start_run(thread["id"], steps)
        events = [e async for e in client.follow(run["id"])]
        assert events[-1].type == "done", events[-1]
        assert (await client.get_run(run["id"]))["status"] == "completed"
        tokens = "".join(e.data["text"] for e in events if e.type == "token")
        assert tokens == "a\ufffdb c\ufffdddone\ufffd"
        assert "".join(e.data["text"] for e in events if e.type == "thinking") == "hm\ufffdm"
        assert [e.data["args"] for e in events if e.type == "tool_call"] == [{"order_id": "A1\ufffd"}]
        path = await client.messages(thread["id"])
        assert [m["content"] for m in path if m["role"] == "assistant"] == ["a\ufffdb c\ufffdd", "done\ufffd"]
        assert path[1]["tool_calls"][0]["args"] == {"order_id": "A1\ufffd"}
        replayed = await client.events(run["id"])  # the stored envelopes read back
        assert [e.seq for e in replayed] == [e.seq for e in events]


# -- long threads ----------------------------------------------------------------------------


class EchoCount:
    """A model that answers with how many messages it was given and the first one's content."""

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelDelta]:
        given = [m for m in request.messages if m.role != "system"]
        yield TextDelta(json.dumps({"count": len(given), "first": given[0].content}))


async def test_a_long_thread_pages_both_views_and_the_model_gets_the_newest_turns(db_url: str) -> None:
    agent = Agent(EchoCount(), history=HistoryPolicy(max_messages=20))
    with served(db_url, agent) as server:
        async with AsyncClient(server.url) as client, httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            thread = await client.create_thread()
            store = await Store.open(db_url)
            try:
                parent = None
                for n in range(250):
                    record = MessageRecord(
                        id=f"msg_{n:05d}", thread_id=thread["id"], parent_id=parent, run_id=None, role="user" if n % 2 == 0 else "assistant", content=f"m{n}"
                    )
                    await store.add_message(record)
                    parent = record.id
                fork = await store.add_message(
                    MessageRecord(id="msg_fork", thread_id=thread["id"], parent_id="msg_00247", run_id=None, role="assistant", content="fork")
                )
                await store.move_active_leaf(thread["id"], "msg_00249")
                whole_tree = [m.id for m in await store.thread_messages(thread["id"])]
            finally:
                await store.aclose()

            pages: list[list[dict[str, Any]]] = []
            cursor = None
            while True:
                params: dict[str, Any] = {"view": "path", "limit": 100, **({"cursor": cursor} if cursor else {})}
                body = (await http.get(f"/v1/threads/{thread['id']}/messages", params=params)).json()
                pages.append(body["items"])
                cursor = body["next_cursor"]
                if cursor is None:
                    break
            assert [len(p) for p in pages] == [100, 100, 50]
            path = [m for page in reversed(pages) for m in page]  # pages go back from the leaf
            assert [m["id"] for m in path] == [f"msg_{n:05d}" for n in range(250)]
            assert path[-2]["sibling_ids"] == ["msg_00248", fork.id]

            tree: list[str] = []
            cursor = None
            while True:
                params = {"view": "tree", "limit": 100, **({"cursor": cursor} if cursor else {})}
                body = (await http.get(f"/v1/threads/{thread['id']}/messages", params=params)).json()
                tree += [m["id"] for m in body["items"]]
                cursor = body["next_cursor"]
                if cursor is None:
                    break
            assert tree == whole_tree

            elsewhere = await http.get(f"/v1/threads/{thread['id']}/messages", params={"cursor": "msg_nope"})
            assert ["query", "cursor"] in locs(assert_error(elsewhere, 422, "invalid_cursor"))
            assert (await client.messages(thread["id"]))[-1]["id"] == "msg_00249"  # the client follows the cursors

            run = await client.start_run(thread["id"], "and now?")
            assert (await client.wait_for_run(run["id"]))["status"] == "completed"
            answer = (await client.messages(thread["id"]))[-1]
            assert json.loads(answer["content"]) == {"count": 20, "first": "m231"}


def test_the_history_policy_keeps_the_newest_turns_and_never_splits_a_tool_call() -> None:
    call = ToolCallRequest("c1", "get_order", {"order_id": "A1"})
    history = [
        ChatMessage("user", "u1"),
        ChatMessage("assistant", "", (call, ToolCallRequest("c2", "get_order", {})), None),
        ChatMessage("tool", "r1", (), "c1", "get_order"),
        ChatMessage("tool", "r2", (), "c2", "get_order"),
        ChatMessage("user", "u2"),
        ChatMessage("assistant", "a2"),
    ]
    assert HistoryPolicy(max_messages=10).apply(history) == history
    assert HistoryPolicy(max_messages=4).apply(history) == history[4:]  # the results go with their call
    assert HistoryPolicy(max_messages=2).apply(history) == history[4:]
    assert HistoryPolicy(max_chars=4).apply(history) == history[4:]
    assert HistoryPolicy(max_chars=1).apply(history) == history[5:]  # the newest message always stays
    only_results = history[:4]
    assert HistoryPolicy(max_messages=1).apply(only_results) == history[1:4]  # the call comes back rather than nothing
    with pytest.raises(ValueError):
        HistoryPolicy(max_messages=0)


# -- slow readers ----------------------------------------------------------------------------


def envelopes(first_seq: int, count: int, size: int) -> list[StoredEvent]:
    return [StoredEvent(seq, "token", "x" * size) for seq in range(first_seq, first_seq + count)]


def test_a_subscription_measures_how_far_its_reader_is_behind_in_bytes() -> None:
    bus = LocalBus(max_pending_bytes=1000)
    with bus.subscribe("run_a") as keeps_up, bus.subscribe("run_a") as stalled:
        # One commit larger than the bound, to readers that had delivered everything: only stale.
        bus.publish("run_a", envelopes(1, 3, 500))
        assert keeps_up.stale and not keeps_up.overflowed and not stalled.overflowed
        keeps_up.delivered(3)
        # A reader that delivers each batch is never behind, however much goes by.
        for n in range(100):
            bus.publish("run_a", envelopes(4 + 2 * n, 2, 400))
            keeps_up.delivered(5 + 2 * n)
            assert not keeps_up.overflowed
        assert stalled.overflowed  # 800 more bytes after 1500 it never delivered


class Firehose:
    """A model that waits for ``gate``, then streams ``count`` deltas of ``size`` characters as
    fast as it can."""

    def __init__(self, count: int, size: int) -> None:
        self.count, self.size = count, size
        self.gate = threading.Event()

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelDelta]:
        await anyio.to_thread.run_sync(self.gate.wait)
        for n in range(self.count):
            yield TextDelta(f"{n:06d}" + "x" * (self.size - 6))
            await anyio.sleep(0)  # as a network stream would, let the loop run between deltas


async def read_chunk(reader: asyncio.StreamReader) -> str | None:
    """The next chunk of a chunked HTTP body; None after the last one."""
    size = int((await reader.readline()).strip(), 16)
    data = (await reader.readexactly(size + 2))[:-2].decode()
    return data if size else None


async def test_a_reader_that_stops_reading_is_cut_with_a_comment_and_resumes_gaplessly(tmp_path: Any) -> None:
    model = Firehose(count=2000, size=4000)  # 8 MB of events, far more than the socket buffers hold
    with served(sqlite_url(tmp_path), Agent(model), stream_buffer_bytes=64 * 1024) as server:
        async with AsyncClient(server.url) as client:
            thread = await client.create_thread()
            run = await client.start_run(thread["id"], "go")
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window: the server's sends block soon
            sock.connect(("127.0.0.1", int(server.url.rsplit(":", 1)[1])))
            sock.setblocking(False)
            reader, writer = await asyncio.open_connection(sock=sock)
            writer.write(f"GET /v1/runs/{run['id']}/events HTTP/1.1\r\nHost: t\r\nAccept: text/event-stream\r\n\r\n".encode())
            body = ""
            with anyio.fail_after(30):
                while (await reader.readline()) != b"\r\n":
                    pass  # status line and headers
                while "event: status" not in body:  # the stream is following live, the model waits
                    body += await read_chunk(reader) or ""
                # From here this reader reads nothing until the run is over; another follows it.
                model.gate.set()
                assert (await client.wait_for_run(run["id"]))["status"] == "completed"
                while (chunk := await read_chunk(reader)) is not None:
                    body += chunk
            writer.close()
            seqs = [int(line[4:]) for line in body.splitlines() if line.startswith("id: ")]
            comment = body.rstrip("\n").splitlines()[-1]
            assert comment == f": disconnected: this reader fell too far behind; reconnect with Last-Event-ID: {seqs[-1]}"
            assert seqs == list(range(1, seqs[-1] + 1))
            rest = [e async for e in client.follow(run["id"], after_seq=seqs[-1])]
            assert rest and rest[-1].type == "done"
            assert [e.seq for e in rest] == list(range(seqs[-1] + 1, rest[-1].seq + 1))
            assert httpx.get(server.url + "/healthz", timeout=10).status_code == 200


# -- clients give up cleanly -----------------------------------------------------------------


async def test_the_client_gives_up_with_a_clear_error_when_the_server_is_gone() -> None:
    with refusing_port() as port:  # nothing listens there, nor can start to
        await _client_gives_up(f"http://127.0.0.1:{port}")


async def _client_gives_up(url: str) -> None:
    async with AsyncClient(url, max_retries=3, retry_deadline_s=30) as client:
        with anyio.fail_after(30):
            with pytest.raises(ServerUnreachable) as gave_up:
                async for _ in client.follow("run_gone"):
                    pass
        assert gave_up.value.code == "server_unreachable"
        assert "after 4 attempts" in gave_up.value.message and "the run is not affected" in gave_up.value.message
        assert client.reconnects == 3
        with pytest.raises(ServerUnreachable):
            await client.get_run("run_gone")


# Stopping a server with a stream open: uvicorn cancels the stream after its graceful timeout.
@pytest.mark.server_errors("timeout graceful shutdown exceeded")
async def test_the_client_stops_at_its_deadline_while_the_server_stays_down(server: LiveServer) -> None:
    async with AsyncClient(server.url, max_retries=1000, retry_deadline_s=1.5, max_backoff=0.2) as client:
        thread = await client.create_thread()
        run = await client.start_run(thread["id"], script({"text": "wait", "tool_calls": [{"name": "sleep", "args": {"seconds": 60}}]}))
        seen = []
        with anyio.fail_after(60):
            with pytest.raises(ServerUnreachable):
                async for event in client.follow(run["id"]):
                    seen.append(event)
                    if event.type == "tool_call":
                        server.stop()  # the server goes away for good mid-stream
        assert [e.seq for e in seen] == list(range(1, len(seen) + 1))


# -- the OpenAPI document ----------------------------------------------------------------------


def test_the_openapi_document_describes_every_error_and_the_event_streams(tmp_path: Any) -> None:
    from tether.server import create_app

    document = create_app(build_demo_agent(), sqlite_url(tmp_path)).openapi()
    error_ref = "#/components/schemas/ErrorBody"
    for path, operations in document["paths"].items():
        if not path.startswith("/v1/") or path.startswith("/v1/demo/"):
            continue
        for method, operation in operations.items():
            for status in ("404", "413", "422", "429", "500", "503"):
                schema = operation["responses"][status]["content"]["application/json"]["schema"]
                assert schema == {"$ref": error_ref}, (method, path, status)
    for path, method in (("/v1/runs/{run_id}/events", "get"), ("/v1/threads/{thread_id}/runs", "post")):
        assert "text/event-stream" in document["paths"][path][method]["responses"]["200"]["content"]
    assert "HTTPValidationError" not in document["components"]["schemas"]
