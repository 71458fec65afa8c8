"""MCP tools under human review, through real MCP servers in child processes.

The servers are real: ``tests/mcp_shop_server.py`` (written with the official SDK's
``MCPServer``, its effects and every request it receives recorded in files of the test's
directory) and the reference filesystem server from npm
(``@modelcontextprotocol/server-filesystem``, installed once into ``tests/.node/mcp/``). A
scripted model (a test double for the LLM) picks the tools. What is checked is what reached the
server and what it did — its request log and the files on disk — never inferred from Tether's
own answers.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tether.agent import Agent
from tether.client import AsyncClient
from tether.demo import build_demo_agent
from tether.mcp import MCP, MCPServer, StdioServer
from tether.models.scripted import ScriptedModel

from .conftest import LiveServer, ServerProcess, install_lock, script

pytestmark = pytest.mark.anyio

HERE = Path(__file__).parent
SHOP_SERVER = HERE / "mcp_shop_server.py"
NODE_DIR = HERE / ".node" / "mcp"
#: The reference filesystem server release the tests mount (npm).
FILESYSTEM_SERVER = "@modelcontextprotocol/server-filesystem@2026.8.31"


# -- helpers ---------------------------------------------------------------------------------


def shop_mcp(directory: Path, **options: Any) -> StdioServer:
    """The test MCP server, its effects in ``directory``."""
    return MCP.stdio(sys.executable, str(SHOP_SERVER), name="shop", env={"MCP_TEST_DIR": str(directory)}, **options)


def agent_with(*servers: MCPServer) -> Agent:
    """The demo agent (its Python tools) with the MCP ``servers`` mounted; a scripted model."""
    agent = build_demo_agent(ScriptedModel(word_delay_s=0))
    agent.mount_mcp(servers)
    return agent


def requests_of(directory: Path) -> list[str]:
    """Every request the test server received, in order (``tools/call write_record``, …)."""
    path = directory / "requests.log"
    return path.read_text().splitlines() if path.exists() else []


def calls_of(directory: Path) -> list[str]:
    """The tools the test server was asked to run, in order."""
    return [line.split(" ", 1)[1] for line in requests_of(directory) if line.startswith("tools/call ")]


@pytest.fixture
def shop(db_url: str, mcp_dir: Path) -> Iterator[LiveServer]:
    """The demo agent with the test MCP server mounted (stdio), on both backends."""
    live = LiveServer(agent_with(shop_mcp(mcp_dir)), db_url).start()
    try:
        yield live
    finally:
        live.stop()


@pytest.fixture
async def client(shop: LiveServer) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(shop.url) as tether_client:
        yield tether_client


async def start(client: AsyncClient, *steps: dict[str, Any], config: dict[str, Any] | None = None) -> dict[str, Any]:
    thread = await client.create_thread()
    return await client.start_run(thread["id"], script(*steps), config=config)


def call(tool: str, /, **args: Any) -> dict[str, Any]:
    """A model turn asking for one tool call."""
    return {"text": f"Calling {tool}.", "tool_calls": [{"name": tool, "args": args}]}


async def events(url: str, run_id: str) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        response = await http.get(f"/v1/runs/{run_id}/events", params={"limit": 1000})
        assert response.status_code == 200, response.text
        return response.json()["items"]  # type: ignore[no-any-return]


def of_type(log: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e["data"] for e in log if e["type"] == kind]


async def describe(url: str) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        response = await http.get("/v1/agent")
        assert response.status_code == 200, response.text
        return response.json()  # type: ignore[no-any-return]


async def wait_for(condition: Any, what: str, timeout: float = 20) -> Any:
    """Poll ``condition()`` (sync or async) until it returns something truthy."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


# -- mounting and tiers ------------------------------------------------------------------------


async def test_every_tool_of_a_mounted_server_is_listed_with_its_tier_and_where_it_came_from(shop: LiveServer) -> None:
    agent = await describe(shop.url)
    tools = {t["name"]: t for t in agent["tools"]}
    expected = {
        "lookup_sku": ("read_only", "annotation"),  # readOnlyHint: true
        "print_label": ("reversible", "annotation"),  # destructiveHint: false
        "write_record": ("destructive", "annotation"),  # destructiveHint: true
        "delete_sku": ("destructive", "spec default"),  # no annotations: gated
    }
    for name, (risk, source) in expected.items():
        assert (tools[name]["risk"], tools[name]["risk_source"], tools[name]["source"]) == (risk, source, "mcp:shop"), tools[name]
    assert tools["write_record"]["parameters"]["required"] == ["name", "content"]
    assert tools["write_record"]["annotations"]["destructiveHint"] is True
    # The author's Python tools are listed the same way.
    assert (tools["refund"]["risk"], tools["refund"]["risk_source"], tools["refund"]["source"]) == ("destructive", "author", "python")
    [server] = agent["mcp_servers"]
    assert server["name"] == "shop" and server["transport"] == "stdio" and server["trusted"] is True
    assert server["state"] == "up" and server["reason"] is None
    assert "write_record" in server["tools"] and "refund" not in server["tools"]


async def test_the_authors_tier_wins_over_annotations_and_an_untrusted_server_gates_everything(tmp_path: Path, mcp_dir: Path) -> None:
    servers = [
        shop_mcp(mcp_dir, risk={"lookup_sku": "destructive", "delete_sku": "reversible"}),
        MCP.stdio(sys.executable, str(SHOP_SERVER), name="doubted", env={"MCP_TEST_DIR": str(mcp_dir)}, trust_annotations=False),
    ]
    live = LiveServer(agent_with(*servers), f"sqlite:///{tmp_path / 't.db'}").start()
    try:
        tools = {t["name"]: t for t in (await describe(live.url))["tools"]}
    finally:
        live.stop()
    # Two servers offer the same tools: each is named after its server.
    assert "lookup_sku" not in tools
    assert (tools["shop__lookup_sku"]["risk"], tools["shop__lookup_sku"]["risk_source"]) == ("destructive", "author")
    assert (tools["shop__delete_sku"]["risk"], tools["shop__delete_sku"]["risk_source"]) == ("reversible", "author")
    assert (tools["shop__print_label"]["risk"], tools["shop__print_label"]["risk_source"]) == ("reversible", "annotation")
    doubted = [t for t in tools.values() if t["source"] == "mcp:doubted"]
    assert len(doubted) >= 10
    assert {(t["risk"], t["risk_source"]) for t in doubted} == {("destructive", "untrusted server")}


async def test_a_server_that_fails_to_start_is_shown_unavailable_and_the_agent_still_serves(tmp_path: Path) -> None:
    broken = MCP.stdio(str(tmp_path / "no-such-server"), name="broken")
    live = LiveServer(agent_with(broken), f"sqlite:///{tmp_path / 't.db'}").start()
    try:
        [server] = (await describe(live.url))["mcp_servers"]
        assert server["state"] in ("unavailable", "connecting") and server["tools"] == []
        server = await wait_for(lambda: _unavailable(live.url), "the reason")
        assert "no-such-server" in server["reason"] or "No such file" in server["reason"], server
        async with AsyncClient(live.url) as client:
            run = await start(client, call("get_order", order_id="A1"))
            done = await client.wait_for_run(run["id"])
        assert done["status"] == "completed"
    finally:
        live.stop()


async def _unavailable(url: str) -> dict[str, Any] | None:
    [server] = (await describe(url))["mcp_servers"]
    return server if server["state"] == "unavailable" and server["reason"] else None


# -- review, as for Python tools ----------------------------------------------------------------


async def test_a_read_only_mcp_tool_runs_at_once_and_its_text_is_the_result(client: AsyncClient, shop: LiveServer, mcp_dir: Path) -> None:
    run = await start(client, call("lookup_sku", sku="A1"), {"text": "Done."})
    assert (await client.wait_for_run(run["id"]))["status"] == "completed"
    log = await events(shop.url, run["id"])
    [announced] = of_type(log, "tool_call")
    assert (announced["risk"], announced["gated"]) == ("read_only", False)
    [result] = of_type(log, "tool_result")
    assert result["status"] == "ok" and result["result"] == "SKU A1: 3 in stock"
    assert calls_of(mcp_dir) == ["lookup_sku"]


async def test_a_destructive_call_is_sent_to_the_server_only_after_its_approval(client: AsyncClient, shop: LiveServer, mcp_dir: Path) -> None:
    run = await start(client, call("write_record", name="r1.txt", content="hello"), {"text": "Written."})
    interrupt = await client.wait_for_interrupt(run["id"])
    assert interrupt is not None
    [request] = interrupt["action_requests"]
    assert request["action"] == "write_record" and request["args"] == {"name": "r1.txt", "content": "hello"}
    assert (request["risk"], request["risk_source"], request["source"]) == ("destructive", "annotation", "mcp:shop")
    assert request["description"] == "Write a record (shop)"
    await asyncio.sleep(0.3)
    # Hold before sending: nothing was asked of the server while a person decides.
    assert calls_of(mcp_dir) == []
    assert not (mcp_dir / "records" / "r1.txt").exists()

    await client.approve(interrupt)
    assert (await client.wait_for_run(run["id"]))["status"] == "completed"
    assert (mcp_dir / "records" / "r1.txt").read_text() == "hello"
    assert calls_of(mcp_dir) == ["write_record"]
    [result] = of_type(await events(shop.url, run["id"]), "tool_result")
    assert result["status"] == "ok" and result["result"] == "wrote r1.txt"
    audit = await client.audit(run_id=run["id"])
    assert [(a["action"], a["actor"], a["tool"], a["decision"], a["outcome"]) for a in audit] == [
        ("decision", "local", "write_record", "approve", "accepted"),
        ("tool_executed", "local", "write_record", None, "ok"),
    ]


async def test_a_rejected_or_expired_mcp_call_never_reaches_the_server(client: AsyncClient, shop: LiveServer, mcp_dir: Path) -> None:
    run = await start(client, call("delete_sku", sku="B2"), {"text": "Not deleted."})
    interrupt = await client.wait_for_interrupt(run["id"])
    assert interrupt is not None and interrupt["action_requests"][0]["risk_source"] == "spec default"
    await client.reject(interrupt, "keep it")
    assert (await client.wait_for_run(run["id"]))["status"] == "completed"
    [result] = of_type(await events(shop.url, run["id"]), "tool_result")
    assert result["status"] == "rejected" and result["reason"] == "keep it"

    expiring = await start(client, call("write_record", name="late.txt", content="x"), {"text": "Too late."}, config={"approval_ttl_s": 0.5})
    assert (await client.wait_for_run(expiring["id"]))["status"] == "completed"
    [expired] = of_type(await events(shop.url, expiring["id"]), "tool_result")
    assert expired["status"] == "expired"
    assert calls_of(mcp_dir) == []
    assert not (mcp_dir / "deleted-B2").exists() and not (mcp_dir / "records").exists()


async def test_an_edit_is_checked_against_the_input_schema_before_anything_is_sent(client: AsyncClient, shop: LiveServer, mcp_dir: Path) -> None:
    run = await start(client, call("write_record", name="e.txt", content="ab"), {"text": "Written."})
    interrupt = await client.wait_for_interrupt(run["id"])
    assert interrupt is not None
    async with httpx.AsyncClient(base_url=shop.url, timeout=10) as http:
        bad = {"interrupt_id": interrupt["id"], "decisions": [{"decision": "edit", "args": {"name": "e.txt", "content": "ab", "count": "many"}}]}
        refused = await http.post(f"/v1/threads/{interrupt['thread_id']}/resume", json=bad)
        assert refused.status_code == 422, refused.text
        error = refused.json()["error"]
        assert error["code"] == "invalid_edited_args"
        assert [f["loc"] for f in error["details"]] == [["body", "decisions", 0, "args", "count"]], error
        missing = {"interrupt_id": interrupt["id"], "decisions": [{"decision": "edit", "args": {"name": "e.txt"}}]}
        assert (await http.post(f"/v1/threads/{interrupt['thread_id']}/resume", json=missing)).status_code == 422
    assert (await client.get_run(run["id"]))["status"] == "waiting_human"
    assert calls_of(mcp_dir) == []

    await client.edit(interrupt, {"name": "e.txt", "content": "ab", "count": 3})
    assert (await client.wait_for_run(run["id"]))["status"] == "completed"
    assert (mcp_dir / "records" / "e.txt").read_text() == "ababab"


async def test_sensitive_arguments_of_an_mcp_tool_are_masked_and_the_server_gets_the_real_value(db_url: str, mcp_dir: Path) -> None:
    live = LiveServer(agent_with(shop_mcp(mcp_dir, sensitive=["content"])), db_url).start()
    try:
        async with AsyncClient(live.url) as client:
            run = await start(client, call("write_record", name="s.txt", content="hunter2-secret"), {"text": "Written."})
            interrupt = await client.wait_for_interrupt(run["id"])
            assert interrupt is not None
            assert interrupt["action_requests"][0]["args"] == {"name": "s.txt", "content": "****cret"}
            await client.approve(interrupt)
            await client.wait_for_run(run["id"])
            log = json.dumps(await events(live.url, run["id"]))
            audit = json.dumps(await client.audit(run_id=run["id"]))
    finally:
        live.stop()
    assert "hunter2" not in log and "hunter2" not in audit
    assert (mcp_dir / "records" / "s.txt").read_text() == "hunter2-secret"


async def test_four_eyes_holds_for_an_mcp_tool(db_url: str, mcp_dir: Path) -> None:
    from .test_auth import bearer, create_keys

    live = LiveServer(agent_with(shop_mcp(mcp_dir, four_eyes=["write_record"])), db_url, auth="keys").start()
    try:
        keys = await create_keys(db_url)
        async with httpx.AsyncClient(base_url=live.url, timeout=10) as http:
            thread = (await http.post("/v1/threads", headers=bearer(keys.alice))).json()
            body = {"input": {"content": script(call("write_record", name="4.txt", content="x"), {"text": "Written."})}}
            run = (await http.post(f"/v1/threads/{thread['id']}/runs", json=body, headers=bearer(keys.alice))).json()
            interrupt = await wait_for(lambda: _pending(http, run["id"], keys.alice), "the interrupt")
            assert interrupt["action_requests"][0]["four_eyes"] is True
            approve = {"interrupt_id": interrupt["id"], "decisions": [{"decision": "approve"}]}
            own = await http.post(f"/v1/threads/{thread['id']}/resume", json=approve, headers=bearer(keys.alice))
            assert own.status_code == 403 and own.json()["error"]["code"] == "four_eyes_required"
            assert calls_of(mcp_dir) == []
            other = await http.post(f"/v1/threads/{thread['id']}/resume", json=approve, headers=bearer(keys.carol))
            assert other.status_code == 200, other.text

            async def finished() -> bool:
                return (await http.get(f"/v1/runs/{run['id']}", headers=bearer(keys.alice))).json()["status"] == "completed"

            await wait_for(finished, "the run's end")
            assert (mcp_dir / "records" / "4.txt").read_text() == "x"
            audit = (await http.get("/v1/audit", params={"run_id": run["id"]}, headers=bearer(keys.alice))).json()["items"]
            assert [(a["action"], a["actor"], a["decision"], a["outcome"]) for a in audit] == [
                ("decision", "alice", "approve", "refused_four_eyes"),
                ("decision", "carol", "approve", "accepted"),
                ("tool_executed", "carol", None, "ok"),
            ]
    finally:
        live.stop()


async def _pending(http: httpx.AsyncClient, run_id: str, key: str) -> dict[str, Any] | None:
    from .test_auth import bearer

    run = (await http.get(f"/v1/runs/{run_id}", headers=bearer(key))).json()
    return run.get("pending_interrupt")  # type: ignore[no-any-return]


# -- the tool list follows the server ------------------------------------------------------------


async def test_a_tool_the_server_adds_while_serving_appears_and_can_be_called(client: AsyncClient, shop: LiveServer, mcp_dir: Path) -> None:
    assert "extra_tool" not in {t["name"] for t in (await describe(shop.url))["tools"]}
    run = await start(client, call("add_tool"), {"text": "Added."})
    await client.wait_for_run(run["id"])

    async def listed() -> bool:
        return "extra_tool" in {t["name"] for t in (await describe(shop.url))["tools"]}

    await wait_for(listed, "extra_tool to be listed")
    second = await start(client, call("extra_tool", word="hello"), {"text": "Shouted."})
    await client.wait_for_run(second["id"])
    [result] = of_type(await events(shop.url, second["id"]), "tool_result")
    assert result["status"] == "ok" and result["result"] == "HELLO"


async def test_runs_share_one_session_per_server_and_their_calls_run_at_the_same_time(client: AsyncClient, shop: LiveServer, mcp_dir: Path) -> None:
    # Each call waits on the server until all six are in flight at once: serialised calls
    # (a session per run, or one call at a time) would each answer "alone" after its timeout.
    runs = [await start(client, call("rendezvous", n=6, tag=f"r{i}"), {"text": "Done."}) for i in range(6)]
    for run in runs:
        assert (await client.wait_for_run(run["id"]))["status"] == "completed"
        [result] = of_type(await events(shop.url, run["id"]), "tool_result")
        assert result["result"] == "met 6", result
    assert len(list(mcp_dir.glob("pid-*"))) == 1  # one server process for every run
    assert requests_of(mcp_dir).count("initialize") + requests_of(mcp_dir).count("server/discover") == 1


# -- the reference filesystem server (npm) ---------------------------------------------------------


@pytest.fixture(scope="session")
def filesystem_server() -> Path:
    """``@modelcontextprotocol/server-filesystem`` from the npm registry, installed once into tests/.node/mcp/."""
    entry = NODE_DIR / "node_modules" / "@modelcontextprotocol" / "server-filesystem" / "dist" / "index.js"
    with install_lock(NODE_DIR):
        if not entry.exists():
            subprocess.run(
                ["npm", "install", "--prefix", str(NODE_DIR), "--no-save", "--no-audit", "--no-fund", "--loglevel=error", FILESYSTEM_SERVER],
                check=True,
                timeout=300,
            )
    package = json.loads((entry.parent.parent / "package.json").read_text())
    assert package["version"] == FILESYSTEM_SERVER.rsplit("@", 1)[1], "tests/.node/mcp has another release; remove the folder to reinstall"
    return entry


async def test_the_reference_filesystem_server_writes_only_what_a_person_approved(db_url: str, tmp_path: Path, filesystem_server: Path) -> None:
    root = tmp_path / "files"
    root.mkdir()
    (root / "readme.txt").write_text("read me")
    fs = MCP.stdio("node", str(filesystem_server), str(root), name="fs")
    live = LiveServer(agent_with(fs), db_url).start()
    try:
        tools = {t["name"]: t for t in (await describe(live.url))["tools"]}
        assert (tools["write_file"]["risk"], tools["write_file"]["risk_source"]) == ("destructive", "annotation")
        assert (tools["create_directory"]["risk"], tools["create_directory"]["risk_source"]) == ("reversible", "annotation")
        assert (tools["read_text_file"]["risk"], tools["read_text_file"]["risk_source"]) == ("read_only", "annotation")
        async with AsyncClient(live.url) as client:
            read = await start(client, call("read_text_file", path=str(root / "readme.txt")), {"text": "Read."})
            await client.wait_for_run(read["id"])
            [result] = of_type(await events(live.url, read["id"]), "tool_result")
            assert result["status"] == "ok" and "read me" in json.dumps(result["result"])

            approved = await start(client, call("write_file", path=str(root / "yes.txt"), content="approved"), {"text": "Written."})
            interrupt = await client.wait_for_interrupt(approved["id"])
            assert interrupt is not None and interrupt["action_requests"][0]["source"] == "mcp:fs"
            assert not (root / "yes.txt").exists()
            await client.approve(interrupt)
            await client.wait_for_run(approved["id"])
            assert (root / "yes.txt").read_text() == "approved"

            rejected = await start(client, call("write_file", path=str(root / "no.txt"), content="rejected"), {"text": "Not written."})
            interrupt = await client.wait_for_interrupt(rejected["id"])
            assert interrupt is not None
            await client.reject(interrupt, "no")
            await client.wait_for_run(rejected["id"])
            assert not (root / "no.txt").exists()

            # An edit is validated against the server's own inputSchema.
            edited = await start(client, call("write_file", path=str(root / "e.txt"), content="x"), {"text": "Written."})
            interrupt = await client.wait_for_interrupt(edited["id"])
            assert interrupt is not None
            async with httpx.AsyncClient(base_url=live.url, timeout=10) as http:
                bad = {"interrupt_id": interrupt["id"], "decisions": [{"decision": "edit", "args": {"path": str(root / "e.txt")}}]}
                assert (await http.post(f"/v1/threads/{interrupt['thread_id']}/resume", json=bad)).status_code == 422
            await client.edit(interrupt, {"path": str(root / "e.txt"), "content": "edited"})
            await client.wait_for_run(edited["id"])
            assert (root / "e.txt").read_text() == "edited"
    finally:
        live.stop()


# -- the command line ------------------------------------------------------------------------------


async def test_tether_demo_mounts_a_server_given_with_mcp(tmp_path: Path, mcp_dir: Path, processes: list[ServerProcess]) -> None:
    spec = f"shop=stdio:{sys.executable} {SHOP_SERVER}"
    process = ServerProcess(
        f"sqlite:///{tmp_path / 'cli.db'}",
        tmp_path / "cli.log",
        extra_args=("--mcp", spec, "--mcp-env", "shop:MCP_TEST_DIR"),
        env={"MCP_TEST_DIR": str(mcp_dir)},
    )
    processes.append(process)
    process.start()
    agent = await describe(process.url)
    [server] = agent["mcp_servers"]
    assert (server["name"], server["state"], server["transport"]) == ("shop", "up", "stdio")
    tools = {t["name"]: t for t in agent["tools"]}
    assert (tools["write_record"]["risk"], tools["write_record"]["source"]) == ("destructive", "mcp:shop")
    async with AsyncClient(process.url) as client:
        thread = await client.create_thread()
        run = await client.start_run(thread["id"], 'call write_record {"name": "cli.txt", "content": "from the chat"}')
        interrupt = await client.wait_for_interrupt(run["id"])
        assert interrupt is not None and interrupt["action_requests"][0]["risk_source"] == "annotation"
        await client.approve(interrupt)
        await client.wait_for_run(run["id"])
    assert (mcp_dir / "records" / "cli.txt").read_text() == "from the chat"


def test_a_malformed_mcp_option_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tether.cli", "demo", "--db", f"sqlite:///{tmp_path / 'x.db'}", "--mcp", "ftp://example.com"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "--mcp" in done.stderr and "stdio:COMMAND" in done.stderr
