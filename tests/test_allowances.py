"""Standing approvals ("approve, and allow this for a while"), through real servers.

Every rule of the contract, checked from the outside on SQLite and PostgreSQL: an ``approve``
with ``allow`` creates one allowance (listed, audited ``allowance_created``, announced by an
``allowance.created`` webhook); a later call it covers is announced ``gated: false`` with
``allowed_by``, audited ``allowed`` then ``tool_executed`` (actor: the allowance's creator), and
runs at once; scope ``run`` ends with the run, scope ``thread`` covers later runs of that thread
only; ``args: same`` covers the same validated arguments only, ``any`` any; a call of a higher
tier than the approved one is never covered; what a tool permits (destructive ``same``,
reversible ``any``, a tool's own narrowing, four-eyes none) and the ttl cap are enforced with
422s that change nothing; an expired or revoked allowance covers nothing from that moment on,
in every process (two PostgreSQL server processes); never another thread or another
principal's runs; several actions of one interrupt, the inbox's batch decide, AG-UI resumes and
``tether chat`` give allowances too; of racing approvals only the winner's allowance exists.
Executions are counted in the demo shop's effects table, never inferred from responses.
"""

from __future__ import annotations

import asyncio
import queue
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from tether._chat import run_chat
from tether.agent import Agent
from tether.client import APIError, AsyncClient
from tether.demo import build_demo_agent
from tether.models.scripted import ScriptedModel
from tether.server import Limits
from tether.tools import tool

from .conftest import LiveServer, ServerProcess, script
from .test_agui import post_agui, run_input, user
from .test_auth import Keys, bearer, create_keys
from .test_webhooks import Receiver, settings, wait_for

pytestmark = pytest.mark.anyio

DOCS = Path(__file__).resolve().parent.parent / "docs" / "webhooks.md"
REVERSIBLE = {"approval_threshold": "reversible"}


def allow(scope: str = "run", args: str = "same", ttl_s: int = 600) -> dict[str, Any]:
    return {"scope": scope, "args": args, "ttl_s": ttl_s}


def call(call_id: str, name: str, **args: Any) -> dict[str, Any]:
    return {"id": call_id, "name": name, "args": args}


def refund(call_id: str, amount: float, order: str = "A1") -> dict[str, Any]:
    return call(call_id, "refund", order_id=order, amount=amount)


def turn(*calls: dict[str, Any]) -> dict[str, Any]:
    """One model turn asking for ``calls``."""
    return {"tool_calls": list(calls)}


DONE = {"text": "Done."}


@pytest.fixture
async def client(server: LiveServer) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(server.url) as tether_client:
        yield tether_client


async def effects(url: str, run_id: str, key: str | None = None) -> list[dict[str, Any]]:
    """What the demo shop really did in ``run_id``: one row per execution."""
    async with httpx.AsyncClient(base_url=url, headers=bearer(key) if key else {}) as http:
        response = await http.get("/v1/demo/effects", params={"run_id": run_id})
        assert response.status_code == 200, response.text
        items: list[dict[str, Any]] = response.json()["items"]
        return items


async def announced(client: AsyncClient, run_id: str) -> dict[str, dict[str, Any]]:
    """The run's ``tool_call`` events by call id."""
    return {e.data["call_id"]: e.data for e in await client.events(run_id) if e.type == "tool_call"}


async def next_interrupt(client: AsyncClient, run_id: str, after: dict[str, Any] | None = None) -> dict[str, Any]:
    """The run's next pending interrupt (after ``after``, if given)."""
    while True:
        interrupt = await client.wait_for_interrupt(run_id)
        assert interrupt is not None, "the run ended without asking for review"
        if after is None or interrupt["id"] != after["id"]:
            return interrupt
        await anyio.sleep(0.02)


async def run_to_end(client: AsyncClient, thread_id: str, *steps: dict[str, Any], config: dict[str, Any] | None = None) -> dict[str, Any]:
    """A run of ``steps`` on ``thread_id`` that must end without asking anyone."""
    run = await client.start_run(thread_id, script(*steps, DONE), config=config)
    assert await client.wait_for_interrupt(run["id"]) is None, "the run asked for review"
    assert (await client.get_run(run["id"]))["status"] == "completed"
    return run


async def waits(client: AsyncClient, thread_id: str, *steps: dict[str, Any], config: dict[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """A run of ``steps`` on ``thread_id`` that must stop for review: the run and its interrupt."""
    run = await client.start_run(thread_id, script(*steps, DONE), config=config)
    interrupt = await client.wait_for_interrupt(run["id"])
    assert interrupt is not None, "the run did not ask for review"
    return run, interrupt


async def decline(client: AsyncClient, interrupt: dict[str, Any]) -> None:
    """Reject every action of ``interrupt`` and let its run wrap up."""
    await client.reject(interrupt)
    await client.wait_for_run(interrupt["run_id"])


def actions(audit: list[dict[str, Any]], *kinds: str) -> list[tuple[str, str, str | None]]:
    """(action, actor, call_id) of the audit entries of these kinds, in order."""
    return [(e["action"], e["actor"], e["call_id"]) for e in audit if e["action"] in kinds]


# -- scope and arguments ---------------------------------------------------------------------


async def test_scope_run_with_the_same_args_covers_the_rest_of_that_run_only(server: LiveServer, client: AsyncClient) -> None:
    with anyio.fail_after(60):
        thread = await client.create_thread()
        run = await client.start_run(thread["id"], script(turn(refund("c1", 5)), turn(refund("c2", 5)), turn(refund("c3", 6)), DONE))
        first = await next_interrupt(client, run["id"])
        assert first["review_configs"] == [{"allowed_decisions": ["approve", "reject", "edit"], "allow_args": ["same"]}]
        await client.approve(first, allow=allow("run", "same"))
        # c2 has the same arguments: it runs without asking; c3 does not: it asks.
        second = await next_interrupt(client, run["id"], after=first)
        assert [a["call_id"] for a in second["action_requests"]] == ["c3"]
        [allowance] = await client.allowances(thread["id"])
        calls = await announced(client, run["id"])
        assert (calls["c2"]["gated"], calls["c2"]["allowed_by"]) == (False, allowance["id"])
        assert calls["c3"]["gated"] is True and "allowed_by" not in calls["c3"]
        assert [e["call_id"] for e in await effects(server.url, run["id"])] == ["c1", "c2"]
        await client.approve(second)
        assert (await client.wait_for_run(run["id"]))["status"] == "completed"
        # The run's timeline says which call ran under the standing approval.
        async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
            timeline = (await http.get(f"/v1/runs/{run['id']}/timeline")).json()
        tools = {s["call_id"]: s for s in timeline["segments"] if s["kind"] == "tool"}
        assert [tools[c]["allowed_by"] for c in ("c1", "c2", "c3")] == [None, allowance["id"], None]

        assert allowance["run_id"] == run["id"] and allowance["thread_id"] == thread["id"]
        assert (allowance["tool"], allowance["scope"], allowance["args"], allowance["status"], allowance["risk"]) == (
            "refund",
            "run",
            "same",
            "active",
            "destructive",
        )
        assert (allowance["created_by"], allowance["interrupt_id"], allowance["call_id"], allowance["revoked_at"]) == ("local", first["id"], "c1", None)
        audit = await client.audit(thread_id=thread["id"])
        assert actions(audit, "allowance_created", "allowed", "tool_executed") == [
            ("allowance_created", "local", "c1"),
            ("tool_executed", "local", "c1"),
            ("allowed", "local", "c2"),
            ("tool_executed", "local", "c2"),
            ("tool_executed", "local", "c3"),
        ]
        created = next(e for e in audit if e["action"] == "allowance_created")
        assert created["details"]["allowance_id"] == allowance["id"] and created["args_digest"] == allowance["args_digest"]
        allowed = next(e for e in audit if e["action"] == "allowed")
        assert allowed["details"]["allowance_id"] == allowance["id"] and allowed["args_digest"] == allowance["args_digest"]
        executed = [e for e in audit if e["action"] == "tool_executed" and e["call_id"] == "c2"]
        assert executed[0]["details"] == {"risk": "destructive", "allowance_id": allowance["id"]}

        # The next run of the thread is not covered: scope run.
        later, interrupt = await waits(client, thread["id"], turn(refund("c4", 5)))
        assert (await announced(client, later["id"]))["c4"]["gated"] is True
        await decline(client, interrupt)


async def test_scope_thread_with_any_args_covers_later_runs_of_that_thread_and_no_other(server: LiveServer, client: AsyncClient) -> None:
    with anyio.fail_after(60):
        thread = await client.create_thread()
        run, interrupt = await waits(client, thread["id"], turn(call("n1", "write_note", text="milk")), config=REVERSIBLE)
        assert interrupt["review_configs"][0]["allow_args"] == ["same", "any"]
        await client.approve(interrupt, allow=allow("thread", "any"))
        await client.wait_for_run(run["id"])
        [allowance] = await client.allowances(thread["id"])
        assert (allowance["scope"], allowance["args"], allowance["run_id"], allowance["args_digest"]) == ("thread", "any", None, None)

        later = await run_to_end(client, thread["id"], turn(call("n2", "write_note", text="eggs"), call("n3", "write_note", text="bread")), config=REVERSIBLE)
        calls = await announced(client, later["id"])
        assert [(calls[c]["gated"], calls[c]["allowed_by"]) for c in ("n2", "n3")] == [(False, allowance["id"])] * 2
        assert [e["args"]["text"] for e in await effects(server.url, later["id"])] == ["eggs", "bread"]

        # Another thread of the same principal is not covered.
        other = await client.create_thread()
        _, elsewhere = await waits(client, other["id"], turn(call("n4", "write_note", text="eggs")), config=REVERSIBLE)
        assert [a["call_id"] for a in elsewhere["action_requests"]] == ["n4"]
        await decline(client, elsewhere)
        assert await client.allowances(other["id"]) == []


async def test_an_allowance_never_covers_a_call_of_a_higher_tier_than_the_approved_one(server: LiveServer, client: AsyncClient) -> None:
    with anyio.fail_after(60):
        thread = await client.create_thread()
        run, interrupt = await waits(client, thread["id"], turn(call("t1", "transfer", to_account="alice", amount=15)), config=REVERSIBLE)
        await client.approve(interrupt, allow=allow("thread", "any"))
        await client.wait_for_run(run["id"])
        small = await run_to_end(client, thread["id"], turn(call("t2", "transfer", to_account="bob", amount=10)), config=REVERSIBLE)
        assert (await announced(client, small["id"]))["t2"]["allowed_by"]
        large, asked = await waits(client, thread["id"], turn(call("t3", "transfer", to_account="bob", amount=50)), config=REVERSIBLE)
        assert [(a["call_id"], a["risk"]) for a in asked["action_requests"]] == [("t3", "destructive")]
        await decline(client, asked)
        await client.wait_for_run(large["id"])
        assert await effects(server.url, large["id"]) == []


# -- what may be allowed ---------------------------------------------------------------------


async def test_what_a_tool_permits_and_the_ttl_cap_are_enforced_and_a_refusal_changes_nothing(db_url: str) -> None:
    ran: list[str] = []

    @tool(risk="destructive", allow_args=())
    async def wipe(disk: str) -> str:
        """Wipe a disk: no standing approval for this, ever."""
        ran.append(disk)
        return disk

    @tool(risk="reversible", allow_args=("same",))
    async def tag(label: str) -> str:
        """Tag something: standing approvals for the same label only."""
        ran.append(label)
        return label

    demo = build_demo_agent()
    agent = Agent(ScriptedModel(), [*demo.tools.values(), wipe, tag], system_prompt="test", on_startup=demo.on_startup, routes=demo.routes)
    live = LiveServer(agent, db_url, limits=Limits(max_allowance_ttl_s=60)).start()
    try:
        async with AsyncClient(live.url) as client, httpx.AsyncClient(base_url=live.url) as http:
            with anyio.fail_after(60):
                thread = await client.create_thread()
                run, interrupt = await waits(
                    client, thread["id"], turn(refund("r1", 5), call("w1", "wipe", disk="sda"), call("g1", "tag", label="x")), config=REVERSIBLE
                )
                assert [c.get("allow_args") for c in interrupt["review_configs"]] == [["same"], None, ["same"]]
                approve = {"decision": "approve"}

                async def refused(decisions: list[dict[str, Any]]) -> dict[str, Any]:
                    response = await http.post(f"/v1/threads/{thread['id']}/resume", json={"interrupt_id": interrupt["id"], "decisions": decisions})
                    assert response.status_code == 422, response.text
                    error: dict[str, Any] = response.json()["error"]
                    return error

                error = await refused([{**approve, "allow": allow(args="any")}, approve, approve])  # destructive: same only
                assert error["code"] == "allow_not_permitted" and error["details"][0]["loc"] == ["body", "decisions", 0, "allow", "args"]
                error = await refused([approve, {**approve, "allow": allow()}, approve])  # the tool permits none
                assert error["code"] == "allow_not_permitted" and error["details"][0]["loc"] == ["body", "decisions", 1, "allow", "args"]
                error = await refused([approve, approve, {**approve, "allow": allow(args="any")}])  # the tool narrowed it
                assert error["code"] == "allow_not_permitted"
                error = await refused([{**approve, "allow": allow(ttl_s=61)}, approve, approve])  # above the server's maximum
                assert error["code"] == "allow_ttl_too_long" and error["details"][0]["loc"] == ["body", "decisions", 0, "allow", "ttl_s"]
                for bad in ({"scope": "run", "args": "same"}, {"ttl_s": 0}, {"ttl_s": 10, "scope": "forever"}, {"ttl_s": 10, "extra": 1}):
                    error = await refused([{**approve, "allow": bad}, approve, approve])
                    assert error["code"] == "validation_error", bad
                # A refusal changes nothing: still pending, nothing ran, no allowance.
                assert (await client.get_run(run["id"]))["status"] == "waiting_human"
                assert ran == [] and await effects(live.url, run["id"]) == [] and await client.allowances(thread["id"]) == []
                assert [e for e in await client.audit(thread_id=thread["id"]) if e["action"] != "cancel"] == []

                await client.resume(thread["id"], interrupt["id"], [{**approve, "allow": allow(ttl_s=60)}, approve, {**approve, "allow": allow(ttl_s=60)}])
                await client.wait_for_run(run["id"])
                assert sorted(a["tool"] for a in await client.allowances(thread["id"])) == ["refund", "tag"]
    finally:
        live.stop()


@pytest.fixture
async def keyed_four_eyes(db_url: str) -> AsyncIterator[tuple[LiveServer, Keys]]:
    """The demo agent in keys mode with every destructive call needing four eyes, plus a tool
    marked four-eyes itself."""

    @tool(risk="reversible", four_eyes=True)
    async def grant_access(user: str) -> str:
        """Grant access (needs a second person, whatever the server's policy)."""
        return user

    demo = build_demo_agent()
    agent = Agent(ScriptedModel(), [*demo.tools.values(), grant_access], system_prompt="test", on_startup=demo.on_startup, routes=demo.routes)
    server = LiveServer(agent, db_url, auth="keys", four_eyes="destructive").start()
    try:
        yield server, await create_keys(db_url)
    finally:
        server.stop()


async def test_a_call_that_needs_four_eyes_permits_no_standing_approval(keyed_four_eyes: tuple[LiveServer, Keys]) -> None:
    server, keys = keyed_four_eyes
    async with AsyncClient(server.url, api_key=keys.alice) as alice, AsyncClient(server.url, api_key=keys.carol) as carol:
        with anyio.fail_after(60):
            thread = await alice.create_thread()
            steps = (turn(refund("r1", 5), call("g1", "grant_access", user="bob"), call("t1", "transfer", to_account="x", amount=5)),)
            run, interrupt = await waits(alice, thread["id"], *steps, config=REVERSIBLE)
            assert [c.get("allow_args") for c in interrupt["review_configs"]] == [None, None, ["same", "any"]]
            approve: dict[str, Any] = {"decision": "approve"}
            for index in (0, 1):
                decisions = [approve, approve, approve]
                decisions[index] = {**approve, "allow": allow()}
                with pytest.raises(APIError) as refused:
                    await carol.resume(thread["id"], interrupt["id"], decisions)
                assert (refused.value.status, refused.value.code) == (422, "allow_not_permitted")
            # The reversible transfer needs no second person: it may be allowed.
            await carol.resume(thread["id"], interrupt["id"], [approve, approve, {**approve, "allow": allow("thread", "any")}])
            await alice.wait_for_run(run["id"])
            [allowance] = await alice.allowances(thread["id"])
            assert (allowance["tool"], allowance["created_by"]) == ("transfer", "carol")
            # Its calls run on carol's word: she is the actor of what it lets through.
            later = await run_to_end(alice, thread["id"], turn(call("t2", "transfer", to_account="y", amount=3)), config=REVERSIBLE)
            audit = await alice.audit(run_id=later["id"])
            assert actions(audit, "allowed", "tool_executed") == [("allowed", "carol", "t2"), ("tool_executed", "carol", "t2")]


# -- time and revocation ---------------------------------------------------------------------


async def test_an_expired_allowance_covers_nothing(server: LiveServer, client: AsyncClient) -> None:
    with anyio.fail_after(60):
        thread = await client.create_thread()
        run, interrupt = await waits(client, thread["id"], turn(refund("c1", 5)))
        await client.approve(interrupt, allow=allow("thread", "same", ttl_s=1))
        await client.wait_for_run(run["id"])
        while (await client.allowances(thread["id"]))[0]["status"] != "expired":
            await anyio.sleep(0.05)
        later, asked = await waits(client, thread["id"], turn(refund("c2", 5)))
        assert (await announced(client, later["id"]))["c2"]["gated"] is True
        await decline(client, asked)


async def test_a_revoked_allowance_covers_nothing_from_then_on_and_is_listed_as_past(server: LiveServer, client: AsyncClient) -> None:
    with anyio.fail_after(60):
        thread = await client.create_thread()
        run, interrupt = await waits(client, thread["id"], turn(refund("c1", 5)))
        await client.approve(interrupt, allow=allow("thread", "same"))
        await client.wait_for_run(run["id"])
        [allowance] = await client.allowances(thread["id"])
        covered = await run_to_end(client, thread["id"], turn(refund("c2", 5)))
        assert (await announced(client, covered["id"]))["c2"]["allowed_by"] == allowance["id"]

        await client.revoke_allowance(allowance["id"])
        await client.revoke_allowance(allowance["id"])  # again: 204, nothing more happens
        later, asked = await waits(client, thread["id"], turn(refund("c3", 5)))
        assert (await announced(client, later["id"]))["c3"]["gated"] is True
        await decline(client, asked)

        # A newer allowance is listed first while active; the revoked one is past.
        run, interrupt = await waits(client, thread["id"], turn(refund("c4", 9)))
        await client.approve(interrupt, allow=allow("thread", "same"))
        await client.wait_for_run(run["id"])
        listed = await client.allowances(thread["id"])
        assert [(a["status"], a["id"] == allowance["id"]) for a in listed] == [("active", False), ("revoked", True)]
        assert listed[1]["revoked_by"] == "local" and listed[1]["revoked_at"] is not None
        audit = await client.audit(thread_id=thread["id"])
        assert [(e["actor"], e["details"]["allowance_id"]) for e in audit if e["action"] == "allowance_revoked"] == [("local", allowance["id"])]
        with pytest.raises(APIError) as missing:
            await client.revoke_allowance("alw_nope")
        assert (missing.value.status, missing.value.code) == (404, "allowance_not_found")


async def test_a_revocation_on_one_process_holds_at_once_on_another(pg_db_url: str, tmp_path: Path) -> None:
    a, b = (ServerProcess(pg_db_url, tmp_path / f"server-{name}.log") for name in "ab")
    try:
        await asyncio.gather(asyncio.to_thread(a.start), asyncio.to_thread(b.start))
        async with AsyncClient(a.url) as on_a, AsyncClient(b.url) as on_b:
            with anyio.fail_after(60):
                thread = await on_a.create_thread()
                run, interrupt = await waits(on_a, thread["id"], turn(refund("c1", 5)))
                await on_a.approve(interrupt, allow=allow("thread", "same"))
                await on_a.wait_for_run(run["id"])
                [allowance] = await on_b.allowances(thread["id"])
                # Process b, which never saw the decision, lets the same call through...
                covered = await run_to_end(on_b, thread["id"], turn(refund("c2", 5)))
                assert (await announced(on_b, covered["id"]))["c2"]["allowed_by"] == allowance["id"]
                # ...until it is revoked on process a: b's very next call asks.
                await on_a.revoke_allowance(allowance["id"])
                later, asked = await waits(on_b, thread["id"], turn(refund("c3", 5)))
                assert (await announced(on_b, later["id"]))["c3"]["gated"] is True
                await decline(on_b, asked)
                assert [e["call_id"] for e in await effects(b.url, covered["id"])] == ["c2"]
                assert await effects(a.url, later["id"]) == []
    finally:
        await asyncio.gather(asyncio.to_thread(a.stop), asyncio.to_thread(b.stop))


# -- whose, and where ------------------------------------------------------------------------


@pytest.fixture
async def keyed(db_url: str) -> AsyncIterator[tuple[LiveServer, Keys]]:
    server = LiveServer(build_demo_agent(), db_url, auth="keys").start()
    try:
        yield server, await create_keys(db_url)
    finally:
        server.stop()


async def test_never_another_principals_runs_and_only_those_who_may_decide_revoke(keyed: tuple[LiveServer, Keys]) -> None:
    server, keys = keyed
    async with (
        AsyncClient(server.url, api_key=keys.alice) as alice,
        AsyncClient(server.url, api_key=keys.root) as root,
        httpx.AsyncClient(base_url=server.url) as http,
    ):
        with anyio.fail_after(60):
            thread = await alice.create_thread()
            run, interrupt = await waits(alice, thread["id"], turn(refund("c1", 5)))
            await alice.approve(interrupt, allow=allow("thread", "same"))
            await alice.wait_for_run(run["id"])
            [allowance] = await alice.allowances(thread["id"])
            assert allowance["created_by"] == "alice"
            # Alice's next run is covered; an admin's run in her thread is not (another principal).
            await run_to_end(alice, thread["id"], turn(refund("c2", 5)))
            theirs, asked = await waits(root, thread["id"], turn(refund("c3", 5)))
            assert (await announced(root, theirs["id"]))["c3"]["gated"] is True
            await decline(root, asked)
            await alice.wait_for_run(theirs["id"])

            listing, revoking = f"/v1/threads/{thread['id']}/allowances", f"/v1/allowances/{allowance['id']}"
            # Bob may not see the thread: its allowances do not exist for him.
            for response in (await http.get(listing, headers=bearer(keys.bob)), await http.delete(revoking, headers=bearer(keys.bob))):
                assert response.status_code == 404, response.text
            assert (await http.delete(revoking, headers=bearer(keys.bob))).json()["error"]["code"] == "allowance_not_found"
            # Carol, an approver, may read and revoke it.
            assert [a["id"] for a in (await http.get(listing, headers=bearer(keys.carol))).json()["items"]] == [allowance["id"]]
            assert (await http.delete(revoking, headers=bearer(keys.carol))).status_code == 204
            [revoked] = await alice.allowances(thread["id"])
            assert (revoked["status"], revoked["revoked_by"]) == ("revoked", "carol")
            later, asked = await waits(alice, thread["id"], turn(refund("c4", 5)))
            await decline(alice, asked)
            assert await effects(server.url, later["id"], keys.root) == []


async def test_several_actions_of_one_interrupt_each_give_their_own_allowance(server: LiveServer, client: AsyncClient) -> None:
    with anyio.fail_after(60):
        thread = await client.create_thread()
        both = turn(refund("a1", 5, "A"), refund("b1", 7, "B"))
        run = await client.start_run(thread["id"], script(both, turn(refund("a2", 5, "A"), refund("b2", 7, "B")), DONE))
        first = await next_interrupt(client, run["id"])
        await client.resume(thread["id"], first["id"], [{"decision": "approve", "allow": allow()}, {"decision": "approve"}])
        second = await next_interrupt(client, run["id"], after=first)
        assert [a["call_id"] for a in second["action_requests"]] == ["b2"]  # a2 was allowed
        [allowance] = await client.allowances(thread["id"])
        assert allowance["call_id"] == "a1"
        calls = await announced(client, run["id"])
        assert (calls["a2"]["allowed_by"], calls["b2"]["gated"]) == (allowance["id"], True)
        await client.approve(second)
        await client.wait_for_run(run["id"])
        assert [e["call_id"] for e in await effects(server.url, run["id"])] == ["a1", "b1", "a2", "b2"]


async def test_a_batch_approval_with_allow_gives_one_allowance_per_action_and_refuses_per_interrupt(server: LiveServer, client: AsyncClient) -> None:
    with anyio.fail_after(60):
        note_thread, refund_thread = await client.create_thread(), await client.create_thread()
        note_run, note_interrupt = await waits(client, note_thread["id"], turn(call("n1", "write_note", text="x")), config=REVERSIBLE)
        refund_run, refund_interrupt = await waits(client, refund_thread["id"], turn(refund("r1", 5)))
        items = await client.decide_many([note_interrupt["id"], refund_interrupt["id"]], "approve", allow=allow("thread", "any"))
        assert [(i["status"], (i["error"] or {}).get("code")) for i in items] == [(200, None), (422, "allow_not_permitted")]
        await client.wait_for_run(note_run["id"])
        assert [(a["tool"], a["args"]) for a in await client.allowances(note_thread["id"])] == [("write_note", "any")]
        assert await client.allowances(refund_thread["id"]) == []
        assert (await client.get_run(refund_run["id"]))["status"] == "waiting_human"  # refused: still pending
        items = await client.decide_many([refund_interrupt["id"]], "approve", allow=allow("thread", "same"))
        assert [i["status"] for i in items] == [200]
        await client.wait_for_run(refund_run["id"])
        await run_to_end(client, note_thread["id"], turn(call("n2", "write_note", text="y")), config=REVERSIBLE)
        await run_to_end(client, refund_thread["id"], turn(refund("r2", 5)))
        async with httpx.AsyncClient(base_url=server.url) as http:
            response = await http.post("/v1/interrupts/decide", json={"interrupt_ids": ["int_x"], "decision": "reject", "allow": allow()})
            assert response.status_code == 422 and response.json()["error"]["code"] == "validation_error"


async def test_of_racing_approvals_with_allow_one_wins_and_one_allowance_exists(server: LiveServer, client: AsyncClient) -> None:
    with anyio.fail_after(60):
        thread = await client.create_thread()
        run, interrupt = await waits(client, thread["id"], turn(refund("c1", 5)))
        body = {"interrupt_id": interrupt["id"], "decisions": [{"decision": "approve", "allow": allow("thread", "same")}]}
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            responses = await asyncio.gather(*(http.post(f"/v1/threads/{thread['id']}/resume", json=body) for _ in range(20)))
        codes = sorted(r.status_code for r in responses)
        assert codes.count(200) == 1 and codes.count(409) == 19, codes
        await client.wait_for_run(run["id"])
        assert len(await client.allowances(thread["id"])) == 1
        audit = await client.audit(thread_id=thread["id"])
        assert len([e for e in audit if e["action"] == "allowance_created"]) == 1
        assert len(await effects(server.url, run["id"])) == 1


# -- other ways to decide --------------------------------------------------------------------


async def test_an_ag_ui_resume_may_carry_allow(server: LiveServer, client: AsyncClient) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        with anyio.fail_after(60):
            events = await post_agui(http, run_input("agui-allow", "r1", [user("refund 25 on order A100")]))
            (interrupt,) = events[-1]["outcome"]["interrupts"]
            schema = interrupt["responseSchema"]["properties"]["allow"]
            assert schema["properties"]["args"]["enum"] == ["same"] and schema["required"] == ["ttl_s"]
            assert interrupt["metadata"]["tether"]["allow_args"] == ["same"]
            wrong = [{"interruptId": interrupt["id"], "status": "resolved", "payload": {"approved": False, "allow": allow()}}]
            events = await post_agui(http, run_input("agui-allow", "rx", resume=wrong))
            assert (events[-1]["type"], events[-1]["code"]) == ("RUN_ERROR", "invalid_resume_payload")
            answer = [{"interruptId": interrupt["id"], "status": "resolved", "payload": {"approved": True, "allow": allow("thread", "same")}}]
            events = await post_agui(http, run_input("agui-allow", "r2", resume=answer))
            assert events[-1]["type"] == "RUN_FINISHED" and events[-1]["outcome"] == {"type": "success"}
            [allowance] = await client.allowances("agui-allow")
            assert (allowance["tool"], allowance["scope"]) == ("refund", "thread")
            synced = await post_agui(http, run_input("agui-allow", "c1"), path="/v1/agui/connect")
            history = next(e for e in synced if e["type"] == "MESSAGES_SNAPSHOT")["messages"]
            events = await post_agui(http, run_input("agui-allow", "r3", [*history, user("refund 25 on order A100", "u-2")]))
            assert events[-1]["type"] == "RUN_FINISHED" and events[-1]["outcome"] == {"type": "success"}
            calls = [e for e in events if e["type"] == "TOOL_CALL_RESULT"]
            assert len(calls) == 1


async def test_tether_chat_approves_and_allows_lists_and_revokes(server: LiveServer, client: AsyncClient, capsys: pytest.CaptureFixture[str]) -> None:
    answers: queue.Queue[str] = queue.Queue()
    # Approve and allow (refund permits the same arguments only: no question about them), for this
    # thread, 15 minutes; the same refund again runs at once; list; revoke; list.
    for line in ("refund 25 on order A100", "l", "thread", "15m", "refund 25 on order A100", "/allowances", "/revoke 1", "/allowances"):
        answers.put(line)

    def ask(prompt: str) -> str:
        try:
            return answers.get_nowait()
        except queue.Empty:
            raise EOFError from None

    thread = await client.create_thread()
    with anyio.fail_after(60):
        await run_chat(server.url, thread["id"], ask)
    out = capsys.readouterr().out
    [allowance] = await client.allowances(thread["id"])
    assert (allowance["scope"], allowance["args"], allowance["status"], allowance["revoked_by"]) == ("thread", "same", "revoked", "local")
    assert "allowed by your approval" in out
    assert re.search(r"\[1\] refund, same arguments, this thread, until \d\d:\d\d", out), out
    assert "revoked" in out
    refunds = [e for e in (await client.audit(thread_id=thread["id"])) if e["action"] in ("allowed", "tool_executed")]
    assert [e["action"] for e in refunds] == ["tool_executed", "allowed", "tool_executed"]


# -- webhooks ---------------------------------------------------------------------------------


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    live = Receiver().start()
    yield live
    live.stop()


async def test_an_allowance_created_webhook_carries_the_allowance_with_every_documented_field(db_url: str, receiver: Receiver) -> None:
    from .test_webhook_payloads import documented_fields

    live = LiveServer(build_demo_agent(ScriptedModel(word_delay_s=0)), db_url, webhooks=settings(receiver.url)).start()
    try:
        async with AsyncClient(live.url) as client:
            with anyio.fail_after(60):
                thread = await client.create_thread()
                run, interrupt = await waits(client, thread["id"], turn(refund("c1", 5)))
                await client.approve(interrupt, allow=allow("run", "same"))
                await client.wait_for_run(run["id"])
                [allowance] = await client.allowances(thread["id"])

                def created() -> list[dict[str, Any]]:
                    return [r["payload"] for r in receiver.delivered() if r["payload"]["type"] == "allowance.created"]

                await wait_for(lambda: len(created()) == 1)
        [payload] = created()
        data = payload["data"]
        assert {k: v for k, v in data.items() if k != "url"} == allowance
        assert data["url"] == f"https://tether.example.com/?thread={thread['id']}"
        assert set(data) == documented_fields()["allowance.created"]
        # After the decision it came with, in the thread's order.
        kinds = [r["payload"]["type"] for r in receiver.delivered()]
        assert kinds.index("interrupt.decided") < kinds.index("allowance.created")
    finally:
        live.stop()
