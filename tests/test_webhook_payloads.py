"""What each webhook notification says, against what was decided and against docs/webhooks.md.

A real receiver (``tests/test_webhooks.py``'s, verifying every signature) gets the notifications
of runs in which a person approves, rejects with a reason, edits and responds, of an interrupt
nobody decides, and of runs that fail and are cancelled. Each decision must arrive as it was
made (its call, its kind, a rejection's reason; never an edit's arguments), and every field of
every notification type must be one docs/webhooks.md names for that type.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tether.client import AsyncClient
from tether.demo import build_demo_agent
from tether.models.scripted import ScriptedModel

from .conftest import LiveServer, script
from .test_webhooks import Receiver, settings, wait_for

pytestmark = pytest.mark.anyio

DOCS = Path(__file__).resolve().parent.parent / "docs" / "webhooks.md"


def documented_fields() -> dict[str, set[str]]:
    """The ``data`` fields the events table of docs/webhooks.md names for each type ("as above"
    adds the row above's, "as ``x``" another row's)."""
    rows = re.findall(r"^\| (`[a-z.]+`(?: · `[a-z.]+`)*) \| [^|]+ \| ([^|]+) \|$", DOCS.read_text(), flags=re.M)
    fields: dict[str, set[str]] = {}
    previous: set[str] = set()
    for types, text in rows:
        top_level = re.sub(r"\([^()]*\)", "", text)  # what a field holds is said in parentheses
        names = set(re.findall(r"`([a-z_]+)`", top_level))
        if text.startswith("as above"):
            names |= previous
        match = re.match(r"as `([a-z.]+)`", text)
        if match:
            names |= fields[match.group(1)]
        for event_type in re.findall(r"`([a-z.]+)`", types):
            fields[event_type] = names
        previous = names
    return fields


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    live = Receiver().start()
    yield live
    live.stop()


@pytest.fixture
def server(db_url: str, receiver: Receiver) -> Iterator[LiveServer]:
    live = LiveServer(build_demo_agent(ScriptedModel(word_delay_s=0)), db_url, webhooks=settings(receiver.url)).start()
    yield live
    live.stop()


def refund(amount: float) -> dict[str, Any]:
    return {"text": "Refunding.", "tool_calls": [{"name": "refund", "args": {"order_id": "A1", "amount": amount}}]}


async def test_every_decision_arrives_as_it_was_made_and_every_field_is_documented(server: LiveServer, receiver: Receiver) -> None:
    made: dict[str, list[dict[str, Any]]] = {}
    async with AsyncClient(server.url) as client:

        async def decide(steps: tuple[dict[str, Any], ...], decisions: list[dict[str, Any]], **config: Any) -> str:
            thread = await client.create_thread()
            run = await client.start_run(thread["id"], script(*steps, {"text": "Done."}), config=config or None)
            interrupt = await client.wait_for_interrupt(run["id"])
            assert interrupt is not None
            await client.resume(thread["id"], interrupt["id"], decisions)
            await client.wait_for_run(run["id"])
            made[interrupt["id"]] = [{"call_id": r["call_id"], **d} for r, d in zip(interrupt["action_requests"], decisions, strict=True)]
            return str(interrupt["id"])

        await decide((refund(5),), [{"decision": "approve"}])
        await decide((refund(6),), [{"decision": "reject", "reason": "not this customer"}])
        await decide((refund(7),), [{"decision": "edit", "args": {"order_id": "A1", "amount": 3}}])
        ask = {"text": "Asking.", "tool_calls": [{"name": "ask_user", "args": {"question": "Which order?"}}]}
        await decide((ask,), [{"decision": "respond", "message": "A1, the blue one"}])
        two = {
            "text": "Two.",
            "tool_calls": [{"name": "refund", "args": {"order_id": "B", "amount": 1}}, {"name": "refund", "args": {"order_id": "C", "amount": 2}}],
        }
        await decide((two,), [{"decision": "reject", "reason": None}, {"decision": "approve"}])

        thread = await client.create_thread()
        expiring = await client.start_run(thread["id"], script(refund(8), {"text": "Done."}), config={"approval_ttl_s": 0.5})
        await client.wait_for_run(expiring["id"])
        thread = await client.create_thread()
        failing = await client.start_run(thread["id"], script({"fail": "the provider is down"}))
        await client.wait_for_run(failing["id"])
        thread = await client.create_thread()
        cancelled = await client.start_run(thread["id"], script({"tokens": 400, "delay_ms": 20}))
        await client.cancel(cancelled["id"], "hard")
        await client.wait_for_run(cancelled["id"])

    def arrived() -> dict[str, list[dict[str, Any]]]:
        by_type: dict[str, list[dict[str, Any]]] = {}
        for request in receiver.delivered():
            by_type.setdefault(request["payload"]["type"], []).append(request["payload"])
        return by_type

    await wait_for(lambda: len(arrived().get("interrupt.decided", [])) == 5 and "run.cancelled" in arrived() and "interrupt.expired" in arrived())
    assert receiver.bad_signatures == 0
    payloads = arrived()

    decided = {p["data"]["interrupt_id"]: p["data"] for p in payloads["interrupt.decided"]}
    assert set(decided) == set(made)
    for interrupt_id, decisions in made.items():
        expected = [{"call_id": d["call_id"], "type": d["decision"], **({"reason": d.get("reason")} if d["decision"] == "reject" else {})} for d in decisions]
        assert decided[interrupt_id]["decisions"] == expected, interrupt_id
        assert decided[interrupt_id]["decided_by"] == "local"
    edited = next(d for d in decided.values() if d["decisions"][0]["type"] == "edit")
    assert "args" not in edited["decisions"][0] and '"amount": 3' not in str(edited)

    [expired] = payloads["interrupt.expired"]
    assert expired["data"]["status"] == "expired" and "decisions" not in expired["data"]
    [failed] = payloads["run.failed"]
    assert failed["data"]["run_id"] == failing["id"] and failed["data"]["error"]["message"] == "the provider is down"
    assert [p["data"]["run_id"] for p in payloads["run.cancelled"]] == [cancelled["id"]]

    documented = documented_fields()
    for event_type, sent in payloads.items():
        for payload in sent:
            assert set(payload) == {"type", "timestamp", "data"}
            undocumented = set(payload["data"]) - documented[event_type]
            assert not undocumented, f"{event_type} sends fields docs/webhooks.md does not name: {undocumented}"
            missing = documented[event_type] - set(payload["data"]) - {"error"}  # error: run.failed only
            assert not missing, f"{event_type} lacks documented fields: {missing}"
