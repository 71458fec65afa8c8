"""MCP servers over streamable HTTP: untrusted by default, trusted on the author's word, their
secrets read from the environment and never shown, and reconnected when they come back.

The server is the real ``tests/mcp_shop_server.py --http PORT --token TOKEN`` (the SDK's
streamable-HTTP app behind a bearer-token check) in a child process; a scripted model (a test
double for the LLM) picks the tools.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tether.client import AsyncClient
from tether.mcp import MCP, Secret

from .conftest import LiveServer, ServerProcess, free_port
from .test_mcp import SHOP_SERVER, agent_with, call, calls_of, describe, events, of_type, start, wait_for

pytestmark = pytest.mark.anyio

TOKEN = "tk-mcp-test-7f3a9c"
TOKEN_VARIABLE = "TETHER_TEST_MCP_TOKEN"


class HttpShop:
    """The test MCP server on streamable HTTP, in a child process that can be killed and started again."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> HttpShop:
        log = open(self.directory / "http-server.log", "ab")
        self.proc = subprocess.Popen(
            [sys.executable, str(SHOP_SERVER), "--http", str(self.port), "--token", TOKEN],
            stdout=log,
            stderr=log,
            env={**os.environ, "MCP_TEST_DIR": str(self.directory)},
        )
        log.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, (self.directory / "http-server.log").read_text()
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", self.port)) == 0:
                    return self
            time.sleep(0.05)
        raise RuntimeError("the HTTP MCP server did not start")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


@pytest.fixture
def web(mcp_dir: Path) -> Iterator[HttpShop]:
    server = HttpShop(mcp_dir).start()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
def token_in_env(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(TOKEN_VARIABLE, TOKEN)
    return TOKEN_VARIABLE


def bearer() -> dict[str, str | Secret]:
    return {"Authorization": Secret(env=TOKEN_VARIABLE, prefix="Bearer ")}


async def test_an_http_server_is_untrusted_by_default_so_even_its_read_only_tools_wait_for_a_person(
    db_url: str, web: HttpShop, mcp_dir: Path, token_in_env: str
) -> None:
    live = LiveServer(agent_with(MCP.http(web.url, name="web", headers=bearer())), db_url).start()
    try:
        agent = await describe(live.url)
        [server] = agent["mcp_servers"]
        assert (server["state"], server["transport"], server["trusted"], server["target"]) == ("up", "http", False, web.url)
        mounted = [t for t in agent["tools"] if t["source"] == "mcp:web"]
        assert len(mounted) >= 10
        assert {(t["risk"], t["risk_source"]) for t in mounted} == {("destructive", "untrusted server")}
        async with AsyncClient(live.url) as client:
            run = await start(client, call("lookup_sku", sku="U1"), {"text": "Found."})
            interrupt = await client.wait_for_interrupt(run["id"])
            assert interrupt is not None
            assert (interrupt["action_requests"][0]["risk"], interrupt["action_requests"][0]["risk_source"]) == ("destructive", "untrusted server")
            assert calls_of(mcp_dir) == []  # held until a person decides
            await client.approve(interrupt)
            await client.wait_for_run(run["id"])
            [result] = of_type(await events(live.url, run["id"]), "tool_result")
            assert result["result"] == "SKU U1: 3 in stock"
    finally:
        live.stop()
    assert calls_of(mcp_dir) == ["lookup_sku"]


async def test_a_trusted_http_server_gets_its_annotation_tiers_and_its_token_never_shows(db_url: str, web: HttpShop, mcp_dir: Path, token_in_env: str) -> None:
    live = LiveServer(agent_with(MCP.http(web.url, name="web", headers=bearer(), trust_annotations=True)), db_url).start()
    try:
        agent = await describe(live.url)
        tools = {t["name"]: t for t in agent["tools"]}
        assert (tools["lookup_sku"]["risk"], tools["lookup_sku"]["risk_source"]) == ("read_only", "annotation")
        assert (tools["write_record"]["risk"], tools["write_record"]["risk_source"]) == ("destructive", "annotation")
        async with AsyncClient(live.url) as client:
            read = await start(client, call("lookup_sku", sku="T1"), {"text": "Found."})
            assert (await client.wait_for_run(read["id"]))["status"] == "completed"  # at once, no review
            write = await start(client, call("write_record", name="web.txt", content="over http"), {"text": "Written."})
            interrupt = await client.wait_for_interrupt(write["id"])
            assert interrupt is not None
            assert not (mcp_dir / "records" / "web.txt").exists()
            await client.approve(interrupt)
            await client.wait_for_run(write["id"])
            shown = json.dumps([agent, await events(live.url, read["id"]), await events(live.url, write["id"]), await client.audit(run_id=write["id"])])
    finally:
        live.stop()
    assert (mcp_dir / "records" / "web.txt").read_text() == "over http"
    assert TOKEN not in shown and TOKEN not in repr(MCP.http(web.url, headers=bearer()))


async def test_a_refused_token_leaves_the_server_unavailable_with_the_reason_and_the_agent_serves(
    tmp_path: Path, web: HttpShop, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_VARIABLE, "not-the-token")
    servers = [
        MCP.http(web.url, name="refused", headers=bearer(), connect_timeout_s=5),
        MCP.http(web.url, name="unset", headers={"Authorization": Secret(env="TETHER_TEST_NO_SUCH_VARIABLE", prefix="Bearer ")}),
    ]
    live = LiveServer(agent_with(*servers), f"sqlite:///{tmp_path / 't.db'}").start()
    try:

        async def reasons() -> dict[str, str] | None:
            found = {s["name"]: s["reason"] for s in (await describe(live.url))["mcp_servers"] if s["state"] == "unavailable" and s["reason"]}
            return found if len(found) == 2 else None

        found = await wait_for(reasons, "both servers to be unavailable")
        assert "HTTP 401" in found["refused"], found
        assert found["unset"] == "LookupError: environment variable TETHER_TEST_NO_SUCH_VARIABLE is not set"
        assert "not-the-token" not in json.dumps(await describe(live.url))
        async with AsyncClient(live.url) as client:
            run = await start(client, call("get_order", order_id="A1"), {"text": "Fine."})
            assert (await client.wait_for_run(run["id"]))["status"] == "completed"
    finally:
        live.stop()


async def test_an_http_server_that_went_away_is_an_error_result_then_reconnected_when_it_is_back(
    db_url: str, web: HttpShop, mcp_dir: Path, token_in_env: str
) -> None:
    live = LiveServer(agent_with(MCP.http(web.url, name="web", headers=bearer(), trust_annotations=True)), db_url).start()
    try:
        async with AsyncClient(live.url) as client:
            run = await start(client, call("slow", seconds=30, tag="gone"), {"text": "It went away."})
            await wait_for(lambda: (mcp_dir / "started-gone").exists(), "the call to reach the server")
            web.kill()
            assert (await client.wait_for_run(run["id"]))["status"] == "completed"
            [result] = of_type(await events(live.url, run["id"]), "tool_result")
            assert result["status"] == "error" and result["error"].startswith("ServerExited: MCP server 'web' went away during the call"), result

            down = await start(client, call("lookup_sku", sku="D1"), {"text": "Down."})
            await client.wait_for_run(down["id"])
            [result] = of_type(await events(live.url, down["id"]), "tool_result")
            assert result["status"] == "error" and result["error"].startswith("ServerUnavailable: MCP server 'web' is unavailable"), result

            web.start()

            async def up() -> bool:
                return bool((await describe(live.url))["mcp_servers"][0]["state"] == "up")

            await wait_for(up, "the server to be reconnected", timeout=30)
            back = await start(client, call("lookup_sku", sku="B1"), {"text": "Back."})
            await client.wait_for_run(back["id"])
            [result] = of_type(await events(live.url, back["id"]), "tool_result")
            assert result["result"] == "SKU B1: 3 in stock"
    finally:
        live.stop()


async def test_tether_demo_mounts_an_http_server_with_its_token_from_the_environment(
    tmp_path: Path, web: HttpShop, mcp_dir: Path, processes: list[ServerProcess]
) -> None:
    args = ("--mcp", f"web={web.url}", "--mcp-trust", "web", "--mcp-header", f"web:Authorization=Bearer ${{{TOKEN_VARIABLE}}}")
    process = ServerProcess(f"sqlite:///{tmp_path / 'cli.db'}", tmp_path / "cli.log", extra_args=args, env={TOKEN_VARIABLE: TOKEN})
    processes.append(process)
    process.start()
    assert process.proc is not None
    assert TOKEN not in Path(f"/proc/{process.proc.pid}/cmdline").read_text()  # never visible in ps
    agent = await describe(process.url)
    [server] = agent["mcp_servers"]
    assert (server["state"], server["trusted"]) == ("up", True)
    tools = {t["name"]: t for t in agent["tools"]}
    assert (tools["lookup_sku"]["risk"], tools["lookup_sku"]["risk_source"]) == ("read_only", "annotation")
    async with httpx.AsyncClient(base_url=process.url, timeout=10) as http:
        assert TOKEN not in (await http.get("/v1/agent")).text


@pytest.mark.parametrize(
    ("header", "message"),
    [
        ("web:Authorization=Bearer tk-literal", "holds a secret"),
        ("web:X-Api-Key=abc", "holds a secret"),
        ("web:Authorization=${NOT A NAME}", "not an environment variable name"),
        ("nobody:X-Org=acme", "no --mcp server is named nobody"),
    ],
)
def test_a_secret_given_literally_on_the_command_line_is_refused(tmp_path: Path, header: str, message: str) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tether.cli",
            "demo",
            "--db",
            f"sqlite:///{tmp_path / 'x.db'}",
            "--mcp",
            "web=https://mcp.example.com/mcp",
            "--mcp-header",
            header,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert message in done.stderr, done.stderr
