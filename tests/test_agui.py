"""AG-UI: Tether served to the official AG-UI client, and every stream checked by AG-UI's tools.

The client is ``@ag-ui/client``'s ``HttpAgent`` 1.0 (from the npm registry, installed on first use
into ``tests/.node/agui/``, git-ignored), driven in Node by ``tests/agui_client.cjs`` with its
event verification on, against a real server socket. Every stream it receives is also checked
with ``ag-ui-validate`` and parsed with the ``ag-ui-protocol`` models (PyPI). Tests that need no
browser-side client (expiry, history matching, bad input, every possible cut point) speak HTTP
directly.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from ag_ui.core import AgentCapabilities, Event, RunAgentInput
from pydantic import TypeAdapter

from tether.agui import Cursor

from .conftest import LiveServer, install_lock, script

pytestmark = pytest.mark.anyio

HERE = Path(__file__).parent
DRIVER = HERE / "agui_client.cjs"
NODE_DIR = HERE / ".node" / "agui"
#: The official AG-UI client release the tests drive (npm).
AGUI_CLIENT = "@ag-ui/client@1.0.0"

EVENT = TypeAdapter(Event)


# -- helpers ---------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def node_modules() -> Path:
    """``@ag-ui/client`` from the npm registry, installed once into tests/.node/agui/."""
    modules = NODE_DIR / "node_modules"
    with install_lock(NODE_DIR):
        if not (modules / "@ag-ui" / "client" / "package.json").exists():
            subprocess.run(
                ["npm", "install", "--prefix", str(NODE_DIR), "--no-save", "--no-audit", "--no-fund", "--loglevel=error", AGUI_CLIENT],
                check=True,
                timeout=300,
            )
    version = json.loads((modules / "@ag-ui" / "client" / "package.json").read_text())["version"]
    assert version == AGUI_CLIENT.rsplit("@", 1)[1], f"tests/.node/agui has @ag-ui/client {version}; remove the folder to reinstall"
    return modules


async def drive(node_modules: Path, server: LiveServer, steps: list[dict[str, Any]], *, thread_id: str = "agui-thread", legacy: bool = False) -> dict[str, Any]:
    """Run the official client through ``steps`` (see agui_client.cjs); its report, after
    checking every stream it received with ag-ui-validate and the ag-ui-protocol models."""
    scenario = {"url": server.url, "threadId": thread_id, "legacy": legacy, "steps": steps}
    with anyio.fail_after(60):
        done = await anyio.run_process(["node", str(DRIVER), str(node_modules)], input=json.dumps(scenario).encode(), check=False)
    stderr = done.stderr.decode()
    assert done.returncode == 0, stderr
    # The client strips and warns about anything the protocol does not describe: nothing may be.
    assert "[ag-ui]" not in stderr, stderr
    report: dict[str, Any] = json.loads(done.stdout)
    for capture in report["captures"]:
        assert capture["status"] == 200, capture
        await check_stream(capture["text"], complete=not capture["cut"])
    return report


def frames_of(text: str) -> list[tuple[str | None, dict[str, Any]]]:
    """(id, event) of every SSE frame with data in ``text``."""
    frames = []
    for block in text.split("\n\n"):
        lines = block.split("\n")
        data = [line[5:].removeprefix(" ") for line in lines if line.startswith("data:")]
        if data:
            ids = [line[3:].strip() for line in lines if line.startswith("id:")]
            frames.append((ids[-1] if ids else None, json.loads("\n".join(data))))
    return frames


def ag_ui_validate() -> str:
    found = Path(sys.executable).parent / "ag-ui-validate"
    return str(found) if found.exists() else (shutil.which("ag-ui-validate") or "ag-ui-validate")


async def check_stream(text: str, *, complete: bool = True) -> None:
    """``text`` (one response's SSE) passes ag-ui-validate and every event parses with the
    ag-ui-protocol models; every frame carries an id, the ``event_id`` of its metadata."""
    frames = frames_of(text)
    assert frames, "an empty stream"
    for frame_id, event in frames:
        EVENT.validate_python(event)
        assert frame_id is not None, event
        Cursor.parse(frame_id)
        tether = event.get("metadata", {}).get("tether")
        assert tether is not None, event
        assert tether.get("event_id", frame_id) == frame_id, (frame_id, event)
    if not complete:
        return  # a stream the test cut on purpose ends without its terminal event
    with anyio.fail_after(60):
        done = await anyio.run_process([ag_ui_validate(), "-", "--json", "--fail-on", "warning"], input=text.encode(), check=False)
    assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()


async def post_agui(http: httpx.AsyncClient, body: dict[str, Any], path: str = "/v1/agui", **headers: str) -> list[dict[str, Any]]:
    """POST a RunAgentInput; the AG-UI events of the (validated) stream."""
    with anyio.fail_after(30):
        response = await http.post(path, json=body, headers=headers)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    await check_stream(response.text)
    return [event for _, event in frames_of(response.text)]


def run_input(thread_id: str, run_id: str, messages: list[dict[str, Any]] | None = None, **extra: Any) -> dict[str, Any]:
    body = {"threadId": thread_id, "runId": run_id, "protocolVersion": "1.0", "messages": messages or [], **extra}
    RunAgentInput.model_validate(body)  # what we send is a RunAgentInput as AG-UI defines it
    return body


def user(content: str, message_id: str = "u-1") -> dict[str, Any]:
    return {"id": message_id, "role": "user", "content": content}


async def path_messages(http: httpx.AsyncClient, thread_id: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = (await http.get(f"/v1/threads/{thread_id}/messages")).json()["items"]
    return items


async def effects(http: httpx.AsyncClient, tool: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = (await http.get("/v1/demo/effects", params={"tool": tool})).json()["items"]
    return items


def texts(messages: list[dict[str, Any]], role: str = "assistant") -> list[str]:
    return [m.get("content") or "" for m in messages if m["role"] == role]


# -- the official client ---------------------------------------------------------------------


async def test_the_official_client_gets_a_streamed_answer(server: LiveServer, node_modules: Path) -> None:
    report = await drive(node_modules, server, [{"op": "run", "message": script({"thinking": "let me see", "text": "Hello from Tether, word by word."})}])
    step = report["steps"][0]
    assert step["threw"] is None and step["errors"] == []
    assert [f["outcome"] for f in step["finished"]] == ["success"]
    types = [e["type"] for e in step["events"]]
    assert types[0] == "RUN_STARTED" and types[-1] == "RUN_FINISHED"
    assert {"REASONING_START", "REASONING_MESSAGE_CONTENT", "REASONING_END", "TEXT_MESSAGE_START", "TEXT_MESSAGE_END"} <= set(types)
    async with httpx.AsyncClient(base_url=server.url) as http:
        stored = await path_messages(http, "agui-thread")
    # The client's conversation is the server's: same ids (the snapshot replaced the client's
    # own id for the user message), same text, byte for byte.
    client = [m for m in report["messages"] if m["role"] in ("user", "assistant")]
    assert [(m["id"], m["content"]) for m in client] == [(m["id"], m["content"]) for m in stored]
    assert texts(client) == ["Hello from Tether, word by word."]


async def test_the_official_client_sees_a_tool_call_and_its_result(server: LiveServer, node_modules: Path) -> None:
    steps = [{"op": "run", "message": script({"text": "Looking.", "tool_calls": [{"name": "get_order", "args": {"order_id": "A7"}}]}, {"text": "It shipped."})}]
    report = await drive(node_modules, server, steps)
    step = report["steps"][0]
    assert [f["outcome"] for f in step["finished"]] == ["success"]
    starts = [e for e in step["events"] if e["type"] == "TOOL_CALL_START"]
    results = [e for e in step["events"] if e["type"] == "TOOL_CALL_RESULT"]
    assert [s["toolCallName"] for s in starts] == ["get_order"] and len(results) == 1
    assert results[0]["toolCallId"] == starts[0]["toolCallId"]
    assert results[0]["metadata"]["tether"]["status"] == "ok"
    messages = report["messages"]
    call = next(m for m in messages if m["role"] == "assistant" and m.get("toolCalls"))
    assert json.loads(call["toolCalls"][0]["function"]["arguments"]) == {"order_id": "A7"}
    tool = next(m for m in messages if m["role"] == "tool")
    assert tool["toolCallId"] == starts[0]["toolCallId"] and json.loads(tool["content"])["order_id"] == "A7"
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
    assert texts(messages) == ["Looking.", "It shipped."]


async def test_an_interrupt_resumed_with_edited_args_runs_the_tool_once_and_a_second_resume_is_refused(server: LiveServer, node_modules: Path) -> None:
    edited = {"status": "resolved", "payload": {"approved": True, "editedArgs": {"order_id": "A100", "amount": 7}}}
    steps = [{"op": "run", "message": "refund 25 on order A100"}, {"op": "run", "answer": edited}, {"op": "run", "repeatResume": True}]
    report = await drive(node_modules, server, steps)
    interrupted, resumed, again = report["steps"]

    (finished,) = interrupted["finished"]
    assert finished["outcome"] == "interrupt"
    (interrupt,) = interrupted["pendingInterrupts"]
    call = next(e for e in interrupted["events"] if e["type"] == "TOOL_CALL_START")
    assert interrupt["reason"] == "tool_call" and interrupt["toolCallId"] == call["toolCallId"]
    assert interrupt["metadata"]["tether"]["args"] == {"order_id": "A100", "amount": 25.0}
    assert "editedArgs" in interrupt["responseSchema"]["properties"] and interrupt["expiresAt"]

    assert [r["interruptId"] for r in resumed["resume"]] == [interrupt["id"]]
    assert [f["outcome"] for f in resumed["finished"]] == ["success"] and resumed["errors"] == []
    assert resumed["pendingInterrupts"] == []
    result = next(e for e in resumed["events"] if e["type"] == "TOOL_CALL_RESULT")
    assert result["toolCallId"] == call["toolCallId"] and json.loads(result["content"])["amount"] == 7.0

    assert again["resume"] == resumed["resume"]
    assert again["finished"] == [] and [e["code"] for e in again["errors"]] == ["interrupt_resolved"]
    assert again["errors"][0]["metadata"]["tether"]["status"] == 409
    async with httpx.AsyncClient(base_url=server.url) as http:
        refunds = await effects(http, "refund")
    assert [r["args"] for r in refunds] == [{"order_id": "A100", "amount": 7.0}]  # once, with the edited value


@pytest.mark.parametrize("legacy", [False, True], ids=["client-1.0", "client-before-1.0"])
async def test_a_tether_cancel_mid_stream_is_never_a_success_for_the_official_client(server: LiveServer, node_modules: Path, legacy: bool) -> None:
    steps = [{"op": "run", "message": script({"tokens": 300, "delay_ms": 10}), "cancelAfter": {"type": "TEXT_MESSAGE_CONTENT", "count": 3}}]
    report = await drive(node_modules, server, steps, legacy=legacy)
    step = report["steps"][0]
    assert step["cancelStatus"] == 202
    assert "success" not in [f["outcome"] for f in step["finished"]]
    if legacy:  # no protocolVersion declared: it would read an unknown outcome as success
        assert step["finished"] == [] and [e["code"] for e in step["errors"]] == ["cancelled"]
    else:
        assert [f["outcome"] for f in step["finished"]] == ["cancelled"] and step["errors"] == []
    last = step["events"][-1]
    assert last["metadata"]["tether"]["type"] == "cancelled" and last["metadata"]["tether"]["mode"] == "soft"
    async with httpx.AsyncClient(base_url=server.url) as http:
        run = (await http.get(f"/v1/runs/{last['metadata']['tether']['run_id']}")).json()
    assert run["status"] == "cancelled"


@pytest.mark.parametrize(
    "cut",
    [{"type": "TEXT_MESSAGE_CONTENT", "count": 40}, {"type": "TEXT_MESSAGE_START", "dotted": True}],
    ids=["mid-message", "between-two-frames-of-one-event"],
)
async def test_a_dropped_connection_resumes_with_last_event_id_and_the_text_is_exact(server: LiveServer, node_modules: Path, cut: dict[str, Any]) -> None:
    steps = [
        {"op": "run", "message": script({"tokens": 120, "delay_ms": 5}, {"text": "and a second answer"}), "cutAfter": cut},
        {"op": "connect"},
    ]
    report = await drive(node_modules, server, steps)
    dropped, reconnected = report["steps"]
    # The cut stream ended without a terminal event (AG-UI's client alone would call that a
    # success); the reconnect picked up after the last event id the client saw.
    assert dropped["finished"] == [] and dropped["errors"] == [] and report["captures"][0]["cut"]
    assert reconnected["threw"] is None and [f["outcome"] for f in reconnected["finished"]] == ["success"]
    connect_frames = frames_of(report["captures"][1]["text"])
    assert connect_frames[0][0] == dropped["lastEventId"]  # the reopened RUN_STARTED, at the cursor
    async with httpx.AsyncClient(base_url=server.url) as http:
        stored = await path_messages(http, "agui-thread")
    expected = [m["content"] for m in stored if m["role"] == "assistant"]
    assert expected[0] == "".join(f"t{i} " for i in range(1, 121))
    assert texts(report["messages"]) == expected


# -- resume, expiry, history (HTTP) ----------------------------------------------------------


async def test_a_resume_after_expiry_is_a_run_error_and_nothing_runs(server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        props = {"tether": {"config": {"approval_ttl_s": 0.3}}}
        events = await post_agui(http, run_input("exp", "r1", [user("refund 25 on order A100")], forwardedProps=props))
        (interrupt,) = events[-1]["outcome"]["interrupts"]
        run_id = events[-1]["metadata"]["tether"]["run_id"]
        with anyio.fail_after(15):  # the server expires it on its own, no client needed
            while (await http.get(f"/v1/runs/{run_id}")).json()["status"] != "completed":
                await anyio.sleep(0.05)
        answer = [{"interruptId": interrupt["id"], "status": "resolved", "payload": {"approved": True}}]
        events = await post_agui(http, run_input("exp", "r2", resume=answer))
        assert [e["type"] for e in events] == ["RUN_STARTED", "RUN_ERROR"]
        assert events[-1]["code"] == "interrupt_expired" and events[-1]["metadata"]["tether"]["status"] == 410
        assert await effects(http, "refund") == []


async def test_resume_payloads_are_checked_like_tethers_own_decisions(server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        events = await post_agui(http, run_input("pay", "r1", [user("refund 25 on order A100")]))
        (interrupt,) = events[-1]["outcome"]["interrupts"]
        bad = [
            ({"approved": True, "editedArgs": {"order_id": "A100", "amount": -3}}, "invalid_edited_args"),
            ({"approved": "yes"}, "invalid_resume_payload"),
            ({"message": "no tool for you"}, "decision_not_allowed"),
        ]
        for payload, code in bad:
            answer = [{"interruptId": interrupt["id"], "status": "resolved", "payload": payload}]
            events = await post_agui(http, run_input("pay", "rx", resume=answer))
            assert (events[-1]["type"], events[-1]["code"]) == ("RUN_ERROR", code), payload
        missing = await post_agui(http, run_input("pay", "ry", resume=[{"interruptId": "int_nope:call_x", "status": "cancelled"}]))
        assert missing[-1]["code"] == "interrupt_not_found"
        # Still pending after all that; a plain new message is refused until it is answered.
        blocked = await post_agui(http, run_input("pay", "rz", [user("hello", "u-9")]))
        assert blocked[-1]["code"] == "interrupt_pending" and blocked[-1]["metadata"]["tether"]["details"]["interrupts"] == [interrupt["id"]]
        # Cancelled in the client: rejected, the tool never runs, the model goes on.
        events = await post_agui(http, run_input("pay", "r2", resume=[{"interruptId": interrupt["id"], "status": "cancelled"}]))
        result = next(e for e in events if e["type"] == "TOOL_CALL_RESULT")
        assert result["metadata"]["tether"]["status"] == "rejected" and events[-1]["outcome"] == {"type": "success"}
        assert await effects(http, "refund") == []


async def test_a_message_list_that_extends_the_path_continues_one_that_diverges_forks(server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        first = await post_agui(http, run_input("hist", "r1", [user("hello")]))
        snapshot = next(e for e in first if e["type"] == "MESSAGES_SNAPSHOT")["messages"]
        (question,) = snapshot
        path = await path_messages(http, "hist")
        answer = path[-1]
        client = [question, {"id": answer["id"], "role": "assistant", "content": answer["content"]}]
        # Extends the server's path: a run under the active leaf.
        await post_agui(http, run_input("hist", "r2", [*client, user("order A1", "u-2")]))
        path = await path_messages(http, "hist")
        assert [m["role"] for m in path] == ["user", "assistant", "user", "assistant", "tool", "assistant"]
        assert path[2]["parent_id"] == answer["id"] and path[2]["content"] == "order A1"
        # The user edited the first message (same id, new text): a fork at its parent (the root).
        await post_agui(http, run_input("hist", "r3", [{**question, "content": "hello again"}]))
        tree = (await http.get("/v1/threads/hist/messages", params={"view": "tree"})).json()["items"]
        roots = [m for m in tree if m["parent_id"] is None]
        assert [r["content"] for r in roots] == ["hello", "hello again"]
        path = await path_messages(http, "hist")
        assert path[0]["content"] == "hello again" and len(path) == 2
        # Nothing new after a user message: its answer is regenerated.
        events = await post_agui(http, run_input("hist", "r4", [{"id": path[0]["id"], "role": "user", "content": "hello again"}]))
        assert events[-1]["outcome"] == {"type": "success"}
        assert [
            m["content"] for m in (await http.get("/v1/threads/hist/messages", params={"view": "tree"})).json()["items"] if m["parent_id"] == path[0]["id"]
        ][-1]
        # A list the server cannot place is refused; the history is untouched.
        before = (await http.get("/v1/threads/hist/messages", params={"view": "tree"})).json()["items"]
        for messages, code in [
            ([user("from elsewhere", "x-1"), {"id": "x-2", "role": "assistant", "content": "made up"}, user("next", "x-3")], "history_mismatch"),
            ([{"id": path[1]["id"], "role": "assistant", "content": path[1]["content"]}, user("skip", "x-4")], "history_mismatch"),
            ([{"id": path[0]["id"], "role": "user", "content": "hello again"}, {"id": path[1]["id"], "role": "assistant", "content": "x"}], "nothing_to_run"),
        ]:
            events = await post_agui(http, run_input("hist", "r5", messages))
            assert (events[-1]["type"], events[-1]["code"]) == ("RUN_ERROR", code), messages
        assert (await http.get("/v1/threads/hist/messages", params={"view": "tree"})).json()["items"] == before


async def test_connect_without_a_cursor_sends_the_conversation_and_follows_the_live_run(server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        await post_agui(http, run_input("conn", "r1", [user("hello")]))
        synced = await post_agui(http, run_input("conn", "c1"), path="/v1/agui/connect")
        assert [e["type"] for e in synced] == ["RUN_STARTED", "MESSAGES_SNAPSHOT", "RUN_FINISHED"]
        assert [m["id"] for m in synced[1]["messages"]] == [m["id"] for m in await path_messages(http, "conn")]
        # A run waiting for a human: the messages before it, then its events up to the pause.
        messages = synced[1]["messages"]
        await post_agui(http, run_input("conn", "r2", [*messages, user("refund 3 on order A9", "u-2")]))
        attached = await post_agui(http, run_input("conn", "c2"), path="/v1/agui/connect")
        assert attached[1]["type"] == "MESSAGES_SNAPSHOT" and attached[1]["messages"][-1]["content"] == "refund 3 on order A9"
        assert attached[-1]["outcome"]["type"] == "interrupt"
        # Resuming at the pause: nothing more to send until someone answers.
        cursor = attached[-1]["metadata"]["tether"]["event_id"]
        response = await http.post("/v1/agui/connect", json=run_input("conn", "c3"), headers={"Last-Event-ID": cursor})
        assert response.status_code == 200 and frames_of(response.text) == []


async def test_every_cut_point_of_a_stream_resumes_without_a_gap_or_a_repeat(server: LiveServer) -> None:
    body = script({"thinking": "hm", "text": "a b c", "tool_calls": [{"name": "get_order", "args": {"order_id": "A1"}}]}, {"text": "d e"})
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        full = [(i, e) for i, e in frames_of((await http.post("/v1/agui", json=run_input("cuts", "r1", [user(body)]))).text)]
        run_id = full[0][1]["metadata"]["tether"]["run_id"]
        plain = [(i, e) for i, e in full if e["type"] != "MESSAGES_SNAPSHOT"]

        def key(event: dict[str, Any]) -> str:
            return json.dumps({k: v for k, v in event.items() if k not in ("metadata", "runId")}, sort_keys=True)

        for index, (frame_id, _) in enumerate(plain):
            assert frame_id is not None
            headers = {"Last-Event-ID": frame_id}
            props = {"tether": {"run_id": run_id}}
            response = await http.post("/v1/agui/connect", json=run_input("cuts", f"c{index}", forwardedProps=props), headers=headers)
            rest = frames_of(response.text)
            if index + 1 == len(plain):
                assert rest == []  # after the terminal event: nothing
                continue
            await check_stream(response.text)
            preamble = [e for _, e in rest if e["metadata"]["tether"]["type"] in ("reopen", "snapshot")]
            after = rest[len(preamble) :]
            assert [e["type"] for e in preamble[:2]] == ["RUN_STARTED", "MESSAGES_SNAPSHOT"]
            assert [key(e) for _, e in after] == [key(e) for _, e in plain[index + 1 :]], frame_id
            assert [i for i, _ in after] == [i for i, _ in plain[index + 1 :]]
            # The snapshot holds what the client had at the cut: the text streamed so far.
            seen = [e for _, e in plain[: index + 1]]
            for message in preamble[1]["messages"]:
                if message["role"] == "assistant":
                    deltas = [e["delta"] for e in seen if e["type"] == "TEXT_MESSAGE_CONTENT" and e["messageId"] == message["id"]]
                    assert message["content"] == "".join(deltas), frame_id


# -- the endpoints themselves ----------------------------------------------------------------


async def test_capabilities_are_agui_agent_capabilities(server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=server.url) as http:
        response = await http.get("/v1/agui/capabilities")
    assert response.status_code == 200
    caps = AgentCapabilities.model_validate(response.json())
    assert caps.human_in_the_loop is not None and caps.human_in_the_loop.interrupts and caps.human_in_the_loop.approve_with_edits
    assert caps.transport is not None and caps.transport.streaming and caps.transport.resumable
    assert caps.tools is not None and "refund" in {t.name for t in caps.tools.items or []}


async def test_ag_ui_validate_passes_against_the_live_endpoint(server: LiveServer) -> None:
    with anyio.fail_after(60):
        done = await anyio.run_process([ag_ui_validate(), f"{server.url}/v1/agui", "--json", "--fail-on", "warning", "--timeout", "30"], check=False)
    report = json.loads(done.stdout)
    assert done.returncode == 0, report
    assert report["summary"]["errors"] == 0 and report["summary"]["warnings"] == 0


async def test_bad_input_gets_the_documented_error_shape(server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        cases = [
            ("/v1/agui", {"content": b"{not json", "headers": {"Content-Type": "application/json"}}, 400, "invalid_json"),
            ("/v1/agui", {"json": {"runId": "r", "messages": []}}, 422, "validation_error"),
            ("/v1/agui", {"json": {"threadId": "t" * 65, "runId": "r", "messages": []}}, 422, "validation_error"),
            ("/v1/agui", {"json": {"threadId": "a/b", "runId": "r", "messages": []}}, 422, "validation_error"),
            ("/v1/agui", {"json": {**run_input("t", "r", [user("hi")]), "forwardedProps": {"tether": {"config": {"max_steps": 0}}}}}, 422, "validation_error"),
            ("/v1/agui", {"json": {**run_input("t", "r"), "resume": [{"interruptId": "i", "status": "maybe"}]}}, 422, "validation_error"),
            ("/v1/agui/connect", {"json": run_input("t", "r"), "headers": {"Last-Event-ID": "12.x"}}, 422, "invalid_last_event_id"),
            ("/v1/agui/connect", {"json": run_input("t", "r"), "headers": {"Last-Event-ID": "99999999999"}}, 422, "invalid_last_event_id"),
        ]
        for path, request, status, code in cases:
            response = await http.post(path, **request)
            assert response.status_code == status, (request, response.text)
            assert response.json()["error"]["code"] == code, response.text
        # A thread that is not the caller's (or does not exist) is a RUN_ERROR, not a 500.
        events = await post_agui(http, run_input("nobody-here", "r"), path="/v1/agui/connect")
        assert events[-1]["code"] == "thread_not_found"
        # Content the server cannot take (an image) is refused as a run error.
        image = {"id": "u", "role": "user", "content": [{"type": "image", "source": {"type": "url", "value": "https://x/y.png"}}]}
        events = await post_agui(http, run_input("img", "r", [image]))
        assert events[-1]["code"] == "unsupported_content"
