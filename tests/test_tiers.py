"""Per-call tiers, through the real server: a tool whose tier is a function of its arguments.

The demo's ``transfer`` is ``reversible`` up to 20 and ``destructive`` above. What the tier of one
call decides is checked where it shows: whether the call waits for a human (the ``tool_call``
event's ``gated``, an ``interrupt`` or not, executions counted in the demo shop's effects), the
``risk`` on the ``tool_call`` event and on the action request a reviewer sees, four-eyes under the
``destructive`` policy, and the audit's ``tool_executed`` entry. A tier function that fails gates
its call as ``destructive`` and says so in the log; a subclass may compute the tier in a method.
The demo's other tools keep their fixed tiers.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

import anyio
import httpx
import pytest

from tether.agent import Agent
from tether.client import APIError, AsyncClient
from tether.demo import build_demo_agent
from tether.models.scripted import ScriptedModel
from tether.tools import Risk, Tool, tool

from .conftest import LiveServer, script

pytestmark = pytest.mark.anyio

REVERSIBLE_GATED = {"approval_threshold": "reversible"}


@pytest.fixture
async def client(server: LiveServer) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(server.url) as tether_client:
        yield tether_client


async def transfer_run(client: AsyncClient, amount: float, *, config: dict[str, Any] | None = None) -> dict[str, Any]:
    """A run whose model asks for one transfer of ``amount``, then wraps up."""
    thread = await client.create_thread()
    steps = script({"tool_calls": [{"id": "call_t", "name": "transfer", "args": {"to_account": "alice", "amount": amount}}]}, {"text": "Sent."})
    return await client.start_run(thread["id"], steps, config=config)


async def effects(url: str, run_id: str) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(base_url=url) as http:
        items: list[dict[str, Any]] = (await http.get("/v1/demo/effects", params={"run_id": run_id})).json()["items"]
        return items


def tool_call_of(log: list[Any]) -> dict[str, Any]:
    [call] = [e.data for e in log if e.type == "tool_call"]
    return call


async def test_a_small_transfer_is_reversible_and_runs_at_once_a_large_one_is_destructive_and_waits(server: LiveServer, client: AsyncClient) -> None:
    with anyio.fail_after(30):
        small = await transfer_run(client, 15)
        assert (await client.wait_for_run(small["id"]))["status"] == "completed"
        small_call = tool_call_of(await client.events(small["id"]))
        assert (small_call["risk"], small_call["gated"]) == ("reversible", False)
        assert [e["args"]["amount"] for e in await effects(server.url, small["id"])] == [15]

        large = await transfer_run(client, 50)
        interrupt = await client.wait_for_interrupt(large["id"])
        assert interrupt is not None
        large_call = tool_call_of(await client.events(large["id"]))
        assert (large_call["risk"], large_call["gated"]) == ("destructive", True)
        [action] = interrupt["action_requests"]
        assert (action["action"], action["risk"], action["description"]) == ("transfer", "destructive", "Transfer 50 to alice")
        assert await effects(server.url, large["id"]) == []  # nothing ran before the decision
        await client.approve(interrupt)
        assert (await client.wait_for_run(large["id"]))["status"] == "completed"
        assert [e["args"]["amount"] for e in await effects(server.url, large["id"])] == [50]
        [executed] = [e for e in await client.audit(run_id=large["id"]) if e["action"] == "tool_executed"]
        assert (executed["tool"], executed["outcome"], executed["details"]) == ("transfer", "ok", {"risk": "destructive"})


async def test_under_a_reversible_threshold_a_small_transfer_waits_with_its_own_tier(server: LiveServer, client: AsyncClient) -> None:
    with anyio.fail_after(30):
        run = await transfer_run(client, 20, config=REVERSIBLE_GATED)  # the edge: 20 is still reversible
        interrupt = await client.wait_for_interrupt(run["id"])
        assert interrupt is not None
        assert [a["risk"] for a in interrupt["action_requests"]] == ["reversible"]
        assert (tool_call_of(await client.events(run["id"]))["risk"]) == "reversible"
        await client.approve(interrupt)
        await client.wait_for_run(run["id"])
        [executed] = [e for e in await client.audit(run_id=run["id"]) if e["action"] == "tool_executed"]
        assert executed["details"] == {"risk": "reversible"}


async def test_an_edit_runs_with_the_tier_of_the_edited_arguments_in_the_audit(server: LiveServer, client: AsyncClient) -> None:
    with anyio.fail_after(30):
        run = await transfer_run(client, 500)
        interrupt = await client.wait_for_interrupt(run["id"])
        assert interrupt is not None
        await client.edit(interrupt, {"to_account": "alice", "amount": 5})
        await client.wait_for_run(run["id"])
        assert [e["args"]["amount"] for e in await effects(server.url, run["id"])] == [5]
        [executed] = [e for e in await client.audit(run_id=run["id"]) if e["action"] == "tool_executed"]
        assert executed["details"] == {"risk": "reversible"}


async def test_the_agent_lists_which_tiers_are_per_call_and_the_demo_tools_keep_theirs(server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=server.url) as http:
        tools = {t["name"]: t for t in (await http.get("/v1/agent")).json()["tools"]}
    assert (tools["transfer"]["risk"], tools["transfer"]["risk_per_call"]) == ("destructive", True)
    fixed = {name: t["risk"] for name, t in tools.items() if not t["risk_per_call"]}
    assert fixed == {
        "get_order": "read_only",
        "sleep": "read_only",
        "write_note": "reversible",
        "refund": "destructive",
        "send_email": "destructive",
        "charge_card": "destructive",
        "purge_cache": "destructive",
        "ask_user": "read_only",
    }


async def test_four_eyes_for_destructive_calls_follows_each_calls_tier(db_url: str) -> None:
    live = LiveServer(build_demo_agent(), db_url, four_eyes="destructive").start()
    try:
        async with AsyncClient(live.url) as client:
            with anyio.fail_after(30):
                small = await transfer_run(client, 10, config=REVERSIBLE_GATED)
                small_interrupt = await client.wait_for_interrupt(small["id"])
                assert small_interrupt is not None and not small_interrupt["action_requests"][0].get("four_eyes")
                await client.approve(small_interrupt)  # the requester may approve a reversible call alone
                assert (await client.wait_for_run(small["id"]))["status"] == "completed"

                large = await transfer_run(client, 30)
                large_interrupt = await client.wait_for_interrupt(large["id"])
                assert large_interrupt is not None and large_interrupt["action_requests"][0]["four_eyes"] is True
                with pytest.raises(APIError) as refused:
                    await client.approve(large_interrupt)
                assert (refused.value.status, refused.value.code) == (403, "four_eyes_required")

                # An edit that makes a small call large needs four eyes too.
                other = await transfer_run(client, 10, config=REVERSIBLE_GATED)
                other_interrupt = await client.wait_for_interrupt(other["id"])
                assert other_interrupt is not None
                with pytest.raises(APIError) as edited:
                    await client.edit(other_interrupt, {"to_account": "alice", "amount": 900})
                assert (edited.value.status, edited.value.code) == (403, "four_eyes_required")
                assert await effects(live.url, other["id"]) == []
    finally:
        live.stop()


class Shipping(Tool):
    """A tool whose tier is a method: shipping abroad is destructive, at home reversible."""

    def risk_for(self, args: Mapping[str, Any]) -> Risk:
        return "destructive" if args["country"] != "NL" else "reversible"


@pytest.mark.server_errors(r"the risk function of tool 'flaky' failed")
async def test_a_failing_tier_function_gates_as_destructive_and_a_method_may_compute_the_tier(db_url: str) -> None:
    ran: list[str] = []

    def broken(args: dict[str, Any]) -> Risk:
        raise KeyError("no such field")

    @tool(risk=broken)
    async def flaky(note: str) -> str:
        """A tool whose tier function is broken."""
        ran.append(note)
        return note

    async def ship(country: str) -> str:
        """Ship a parcel."""
        ran.append(country)
        return country

    agent = Agent(ScriptedModel(), [flaky, Shipping(ship)], system_prompt="test")
    live = LiveServer(agent, db_url).start()
    try:
        async with AsyncClient(live.url) as client:
            with anyio.fail_after(30):
                thread = await client.create_thread()
                calls = [
                    {"id": "call_f", "name": "flaky", "args": {"note": "x"}},
                    {"id": "call_home", "name": "ship", "args": {"country": "NL"}},
                    {"id": "call_abroad", "name": "ship", "args": {"country": "US"}},
                ]
                run = await client.start_run(thread["id"], script({"tool_calls": calls}, {"text": "ok"}))
                interrupt = await client.wait_for_interrupt(run["id"])
                assert interrupt is not None
                announced = {e.data["call_id"]: (e.data["risk"], e.data["gated"]) for e in await client.events(run["id"]) if e.type == "tool_call"}
                assert announced == {"call_f": ("destructive", True), "call_home": ("reversible", False), "call_abroad": ("destructive", True)}
                assert [(a["call_id"], a["risk"]) for a in interrupt["action_requests"]] == [("call_f", "destructive"), ("call_abroad", "destructive")]
                assert ran == ["NL"]  # the reversible call ran at once; the gated ones wait
                async with httpx.AsyncClient(base_url=live.url) as http:
                    tools = {t["name"]: t for t in (await http.get("/v1/agent")).json()["tools"]}
                assert tools["ship"]["risk_per_call"] is True and tools["flaky"]["risk_per_call"] is True
    finally:
        live.stop()
