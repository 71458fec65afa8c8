"""MCP tools when things go wrong: cancels that reach the server, a crash mid-call, and servers
that exit, hang, fail or answer nonsense.

The MCP server is the real ``tests/mcp_shop_server.py`` in a child process; what reached it (its
request log: ``tools/call <tool>``, ``notifications/cancelled``) and what it did (marker files:
``started-<tag>``, ``cancelled-<tag>``, ``done-<tag>``) are read from its side. A scripted model
(a test double for the LLM) picks the tools.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tether.client import AsyncClient

from .conftest import LiveServer, ServerProcess
from .test_mcp import SHOP_SERVER, agent_with, call, calls_of, describe, events, of_type, requests_of, shop_mcp, start, wait_for

pytestmark = pytest.mark.anyio


@pytest.fixture
def shop(db_url: str, mcp_dir: Path) -> Iterator[LiveServer]:
    """The test MCP server mounted with a 2-second call timeout."""
    live = LiveServer(agent_with(shop_mcp(mcp_dir, call_timeout_s=2.0, max_result_bytes=64 * 1024)), db_url).start()
    try:
        yield live
    finally:
        live.stop()


@pytest.fixture
async def client(shop: LiveServer) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(shop.url) as tether_client:
        yield tether_client


async def result_of(url: str, run_id: str) -> dict[str, Any]:
    [result] = of_type(await events(url, run_id), "tool_result")
    return result


# -- cancellation reaches the server --------------------------------------------------------------


async def test_a_hard_cancel_during_a_call_cancels_it_on_the_server_and_ends_the_run_at_once(client: AsyncClient, shop: LiveServer, mcp_dir: Path) -> None:
    run = await start(client, call("slow", seconds=60, tag="h"), {"text": "Never."})
    await wait_for(lambda: (mcp_dir / "started-h").exists(), "the call to reach the server")
    began = time.monotonic()
    await client.cancel(run["id"], "hard", reason="stop now")
    ended = await client.wait_for_run(run["id"])
    assert ended["status"] == "cancelled"
    assert time.monotonic() - began < 10  # not the 60 s of the call
    assert (await result_of(shop.url, run["id"]))["status"] == "cancelled"
    # The server was told: notifications/cancelled for that request, and the tool saw it.
    await wait_for(lambda: (mcp_dir / "cancelled-h").exists(), "the server to see the cancel")
    log = requests_of(mcp_dir)
    assert log.index("tools/call slow") < log.index("notifications/cancelled")
    assert not (mcp_dir / "done-h").exists()


async def test_a_soft_cancel_lets_a_running_call_finish_and_records_its_result(client: AsyncClient, shop: LiveServer, mcp_dir: Path) -> None:
    run = await start(client, call("slow", seconds=1.0, tag="s"), {"text": "Never."})
    await wait_for(lambda: (mcp_dir / "started-s").exists(), "the call to reach the server")
    await client.cancel(run["id"], "soft")
    ended = await client.wait_for_run(run["id"])
    assert ended["status"] == "cancelled"
    result = await result_of(shop.url, run["id"])
    assert result["status"] == "ok" and result["result"] == "waited 1 s"
    assert (mcp_dir / "done-s").exists() and not (mcp_dir / "cancelled-s").exists()
    assert "notifications/cancelled" not in requests_of(mcp_dir)


# -- faults are tool results ---------------------------------------------------------------------


async def test_a_server_that_exits_mid_call_is_an_error_result_and_is_restarted_for_the_next_call(client: AsyncClient, shop: LiveServer, mcp_dir: Path) -> None:
    run = await start(client, call("crash"), {"text": "It went away."})
    assert (await client.wait_for_run(run["id"]))["status"] == "completed"  # the model read the error and answered
    result = await result_of(shop.url, run["id"])
    assert result["status"] == "error" and result["error"].startswith("ServerExited: MCP server 'shop' went away during the call")
    assert len(list(mcp_dir.glob("crashed-*"))) == 1

    async def up_again() -> bool:
        [server] = (await describe(shop.url))["mcp_servers"]
        return server["state"] == "up" and len(list(mcp_dir.glob("pid-*"))) == 2

    await wait_for(up_again, "the server to be started again")
    second = await start(client, call("lookup_sku", sku="Z9"), {"text": "Found."})
    await client.wait_for_run(second["id"])
    assert (await result_of(shop.url, second["id"]))["result"] == "SKU Z9: 3 in stock"


async def test_a_call_past_its_timeout_is_an_error_and_is_cancelled_on_the_server(client: AsyncClient, shop: LiveServer, mcp_dir: Path) -> None:
    run = await start(client, call("slow", seconds=30, tag="t"), {"text": "Too slow."})
    assert (await client.wait_for_run(run["id"]))["status"] == "completed"
    result = await result_of(shop.url, run["id"])
    assert result["status"] == "error"
    assert result["error"] == "CallTimedOut: MCP server 'shop' did not answer within 2 s; the call was cancelled on the server"
    await wait_for(lambda: (mcp_dir / "cancelled-t").exists(), "the server to see the cancel")


async def test_an_error_answer_a_huge_answer_and_garbage_each_become_a_result_the_model_reads(client: AsyncClient, shop: LiveServer, mcp_dir: Path) -> None:
    failing = await start(client, call("shelf_empty"), {"text": "Empty."})
    huge = await start(client, call("huge", kib=500), {"text": "Long."})
    # Other runs are untouched while these fail.
    fine = await start(client, call("lookup_sku", sku="OK"), {"text": "Fine."})
    for run in (failing, huge, fine):
        assert (await client.wait_for_run(run["id"]))["status"] == "completed"
    # The garbage is written under the SDK's own writer, on the same pipe: alone, so that it
    # cannot cut into another answer's line (the server's fault, not the client's to survive).
    garbage = await start(client, call("garbage"), {"text": "Odd."})
    assert (await client.wait_for_run(garbage["id"]))["status"] == "completed"

    error = await result_of(shop.url, failing["id"])
    assert error["status"] == "error" and error["error"].startswith("ToolReportedError: ") and "the shelf is empty" in error["error"]

    cut = await result_of(shop.url, huge["id"])
    assert cut["status"] == "ok" and isinstance(cut["result"], str)
    assert len(cut["result"].encode()) <= 64 * 1024
    assert re.search(r"^x+… \[cut: 512,000 bytes of text, the first [\d,]+ kept\]$", cut["result"]), cut["result"][-80:]

    nonsense = await result_of(shop.url, garbage["id"])
    assert nonsense["status"] == "error" and nonsense["error"].startswith("InvalidAnswer: MCP server 'shop' answered with something that is not a tool result")

    assert (await result_of(shop.url, fine["id"]))["result"] == "SKU OK: 3 in stock"


async def test_a_servers_question_to_the_user_is_declined(client: AsyncClient, shop: LiveServer, mcp_dir: Path) -> None:
    run = await start(client, call("confirm", question="Really?"), {"text": "Asked."})
    await client.wait_for_run(run["id"])
    result = await result_of(shop.url, run["id"])
    assert result["status"] == "ok" and result["result"] == "the user's answer: decline"
    assert (mcp_dir / "elicited").read_text() == "decline"


# -- the crash rule ----------------------------------------------------------------------------------


# The MCP child of the killed process finds its pipe gone and dies with a traceback on the stderr
# it shares with that process: the server's, not Tether's.
@pytest.mark.server_errors(r"server-0\.log: .*(Exception Group Traceback|\| Traceback)")
async def test_a_crash_during_an_approved_mcp_call_goes_back_to_a_human_and_never_reruns_on_its_own(
    db_url: str, tmp_path: Path, mcp_dir: Path, processes: list[ServerProcess]
) -> None:
    args = ("--mcp", f"shop=stdio:{sys.executable} {SHOP_SERVER}", "--mcp-env", "shop:MCP_TEST_DIR")
    env = {"MCP_TEST_DIR": str(mcp_dir)}

    def process(n: int) -> ServerProcess:
        started = ServerProcess(db_url, tmp_path / f"server-{n}.log", extra_args=args, env=env)
        processes.append(started)
        return started.start()

    first = process(0)
    async with AsyncClient(first.url) as client:
        run = await start(client, call("slow_write", seconds=60, tag="w"), {"text": "Done."})
        interrupt = await client.wait_for_interrupt(run["id"])
        assert interrupt is not None
        await client.approve(interrupt)
        await wait_for(lambda: (mcp_dir / "started-w").exists(), "the approved call to reach the server")
    first.kill()
    assert calls_of(mcp_dir) == ["slow_write"]

    second = process(1)
    async with AsyncClient(second.url) as client:

        async def unknown_interrupt() -> dict[str, Any] | None:
            pending: dict[str, Any] | None = (await client.get_run(run["id"]))["pending_interrupt"]
            return pending if pending and pending["id"] != interrupt["id"] else None

        again = await wait_for(unknown_interrupt, "the call to go back to a human", timeout=30)
        [request] = again["action_requests"]
        assert request["action"] == "slow_write" and request["outcome_unknown"] is True
        assert request["source"] == "mcp:shop"
        assert calls_of(mcp_dir) == ["slow_write"]  # never re-run on its own
        await client.reject(again, "it may have run")
        assert (await client.wait_for_run(run["id"]))["status"] == "completed"
        [*_, result] = of_type(await events(second.url, run["id"]), "tool_result")
        assert result["status"] == "unknown"
    assert calls_of(mcp_dir) == ["slow_write"]


async def test_each_worker_process_keeps_one_session_per_server_shared_by_its_runs(
    pg_db_url: str, tmp_path: Path, mcp_dir: Path, processes: list[ServerProcess]
) -> None:
    args = ("--workers", "2", "--mcp", f"shop=stdio:{sys.executable} {SHOP_SERVER}", "--mcp-env", "shop:MCP_TEST_DIR")
    server = ServerProcess(pg_db_url, tmp_path / "workers.log", extra_args=args, env={"MCP_TEST_DIR": str(mcp_dir)})
    processes.append(server)
    server.start()
    async with AsyncClient(server.url) as client:
        runs = [await start(client, call("lookup_sku", sku=f"W{i}"), {"text": "Found."}) for i in range(12)]
        for run in runs:
            assert (await client.wait_for_run(run["id"]))["status"] == "completed"
    assert calls_of(mcp_dir).count("lookup_sku") == 12
    await wait_for(lambda: len(list(mcp_dir.glob("pid-*"))) == 2, "both workers' sessions")
    assert len(list(mcp_dir.glob("pid-*"))) == 2  # one MCP server process per worker, not per run
