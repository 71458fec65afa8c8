"""Identity and authority, through real servers: keys, ownership on every route, roles,
four-eyes, the approvals inbox, revocation across processes, and the CLI's auth modes.

The authorization matrix walks the application's own route table, so a route added later
without an entry here fails the test instead of going unchecked.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from tether._ids import utcnow
from tether.demo import build_demo_agent
from tether.store import Store

from .conftest import LiveServer, ServerProcess, script
from .test_docs import routes_of

pytestmark = pytest.mark.anyio

REFUND = script({"tool_calls": [{"name": "refund", "args": {"order_id": "A1", "amount": 5}}]}, {"text": "refund handled"})

# -- set-up ----------------------------------------------------------------------------------


@dataclass
class Keys:
    """The raw keys of the test's principals (and of keys that must not work)."""

    alice: str  # user: owns thread A
    bob: str  # user: owns thread B
    carol: str  # approver
    root: str  # admin
    dave: str  # user and approver
    revoked: str
    expired: str

    def all(self) -> list[str]:
        return [self.alice, self.bob, self.carol, self.root, self.dave, self.revoked, self.expired]


async def create_keys(db_url: str) -> Keys:
    store = await Store.open(db_url)
    try:

        async def key(name: str, *roles: str, **options: Any) -> str:
            return (await store.create_key(name=name, roles=roles, actor="test", **options))[1]

        keys = Keys(
            alice=await key("alice", "user"),
            bob=await key("bob", "user"),
            carol=await key("carol", "approver"),
            root=await key("root", "admin"),
            dave=await key("dave", "user", "approver"),
            revoked=await key("mallory", "admin"),
            expired=await key("eve", "admin", expires_at=utcnow() - timedelta(seconds=1)),
        )
        await store.revoke_keys("mallory", actor="test")
        return keys
    finally:
        await store.aclose()


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
async def keyed(db_url: str) -> AsyncIterator[tuple[LiveServer, Keys]]:
    """The demo agent served in ``keys`` mode, and keys for it."""
    server = LiveServer(build_demo_agent(), db_url, auth="keys").start()
    try:
        yield server, await create_keys(db_url)
    finally:
        server.stop()


async def wait_for_status(http: httpx.AsyncClient, run_id: str, key: str, *statuses: str) -> dict[str, Any]:
    while True:
        run = (await http.get(f"/v1/runs/{run_id}", headers=bearer(key))).json()
        if run["status"] in statuses:
            return run
        await anyio.sleep(0.02)


async def start(http: httpx.AsyncClient, key: str, content: str, thread_id: str | None = None) -> tuple[str, dict[str, Any]]:
    if thread_id is None:
        thread_id = (await http.post("/v1/threads", headers=bearer(key))).json()["id"]
    response = await http.post(f"/v1/threads/{thread_id}/runs", json={"input": {"content": content}}, headers=bearer(key))
    assert response.status_code == 202, response.text
    return thread_id, response.json()


async def effects(http: httpx.AsyncClient, key: str, run_id: str) -> list[dict[str, Any]]:
    response = await http.get("/v1/demo/effects", params={"run_id": run_id}, headers=bearer(key))
    assert response.status_code == 200, response.text
    items: list[dict[str, Any]] = response.json()["items"]
    return items


# -- the authorization matrix ----------------------------------------------------------------


@dataclass
class World:
    """Alice's and Bob's resources, and the strings that identify each side."""

    thread_a: str
    run_a: str  # completed
    answer_a: str  # the assistant message of run_a
    interrupt_a: str  # pending, on a third run of thread A
    allowance_a: str  # a standing approval given on a second run of thread A
    thread_b: str
    run_b: str
    markers_a: set[str] = field(default_factory=set)
    markers_b: set[str] = field(default_factory=set)


async def build_world(http: httpx.AsyncClient, keys: Keys) -> World:
    thread_a, run_a = await start(http, keys.alice, script({"text": "alice-secret-answer"}))
    await wait_for_status(http, run_a["id"], keys.alice, "completed")
    answer_a = (await http.get(f"/v1/threads/{thread_a}", headers=bearer(keys.alice))).json()["active_leaf_id"]
    _, allowing = await start(http, keys.alice, REFUND.replace("A1", "alice-secret-allowed"), thread_a)
    asked = (await wait_for_status(http, allowing["id"], keys.alice, "waiting_human"))["pending_interrupt"]
    allow = {"scope": "thread", "args": "same", "ttl_s": 3600}
    decided = await http.post(
        f"/v1/threads/{thread_a}/resume", json={"interrupt_id": asked["id"], "decisions": [{"decision": "approve", "allow": allow}]}, headers=bearer(keys.alice)
    )
    assert decided.status_code == 200, decided.text
    await wait_for_status(http, allowing["id"], keys.alice, "completed")
    [allowance] = (await http.get(f"/v1/threads/{thread_a}/allowances", headers=bearer(keys.alice))).json()["items"]
    _, waiting = await start(http, keys.alice, REFUND.replace("A1", "alice-secret-order"), thread_a)
    interrupt = (await wait_for_status(http, waiting["id"], keys.alice, "waiting_human"))["pending_interrupt"]
    thread_b, run_b = await start(http, keys.bob, script({"text": "bob-secret-answer"}))
    await wait_for_status(http, run_b["id"], keys.bob, "completed")
    world = World(thread_a, run_a["id"], answer_a, interrupt["id"], allowance["id"], thread_b, run_b["id"])
    world.markers_a = {thread_a, run_a["id"], answer_a, allowing["id"], asked["id"], allowance["id"], waiting["id"], interrupt["id"], "alice-secret"}
    b_messages = (await http.get(f"/v1/threads/{thread_b}/messages", headers=bearer(keys.bob))).json()["items"]
    world.markers_b = {thread_b, run_b["id"], "bob-secret", *(m["id"] for m in b_messages)}
    return world


#: What each principal may do: ``ok`` (anything but 401/403/404 and 5xx: the business outcome,
#: e.g. 409 for a finished run, depends on what ran before), or the exact (status, code).
OK = "ok"
Expect = str | tuple[int, str]


@dataclass(frozen=True)
class Case:
    """One route of the matrix: how to call it on Alice's resources, and who may."""

    owner: Expect
    other: Expect
    approver: Expect
    admin: Expect = OK
    params: dict[str, str] | None = None
    body: Callable[[World], Any] | None = None
    public: bool = False


def everyone(expect: Expect = OK, **options: Any) -> Case:
    return Case(expect, expect, expect, expect, **options)


NOT_THREAD, NOT_RUN, NOT_MESSAGE = (404, "thread_not_found"), (404, "run_not_found"), (404, "message_not_found")
NOT_DELIVERY = (404, "delivery_not_found")
NOT_ALLOWANCE = (404, "allowance_not_found")
NOT_ENDPOINT = (404, "endpoint_not_found")
READ_ONLY = (403, "not_the_owner")
ADMIN_ONLY = (403, "role_required")

CASES: dict[tuple[str, str], Case] = {
    ("GET", "/"): everyone(public=True),
    ("GET", "/healthz"): everyone(public=True),
    ("GET", "/docs"): everyone(public=True),
    ("GET", "/docs/oauth2-redirect"): everyone(public=True),
    ("GET", "/redoc"): everyone(public=True),
    ("GET", "/openapi.json"): everyone(public=True),
    ("GET", "/static/app.js"): everyone(public=True),
    ("GET", "/v1/me"): everyone(),
    ("GET", "/v1/agent"): everyone(),
    ("GET", "/v1/threads"): everyone(),
    ("POST", "/v1/threads"): everyone(body=lambda w: {"metadata": {}}),
    ("GET", "/v1/threads/{thread_id}"): Case(OK, NOT_THREAD, OK),
    ("PATCH", "/v1/threads/{thread_id}"): Case(OK, NOT_THREAD, READ_ONLY, body=lambda w: {"title": "renamed"}),
    ("GET", "/v1/threads/{thread_id}/messages"): Case(OK, NOT_THREAD, OK, params={"view": "tree"}),
    ("PUT", "/v1/threads/{thread_id}/active_leaf"): Case(OK, NOT_THREAD, READ_ONLY, body=lambda w: {"message_id": w.answer_a}),
    ("GET", "/v1/runs/{run_id}"): Case(OK, NOT_RUN, OK),
    ("GET", "/v1/runs/{run_id}/events"): Case(OK, NOT_RUN, OK),
    ("GET", "/v1/runs/{run_id}/timeline"): Case(OK, NOT_RUN, OK),
    ("POST", "/v1/runs/{run_id}/messages"): Case(OK, NOT_RUN, READ_ONLY, body=lambda w: {"content": "steer"}),
    ("POST", "/v1/runs/{run_id}/cancel"): Case(OK, NOT_RUN, READ_ONLY, body=lambda w: {"mode": "soft"}),
    ("PATCH", "/v1/messages/{message_id}"): Case(OK, NOT_MESSAGE, READ_ONLY, body=lambda w: {"content": "edited"}),
    ("GET", "/v1/audit"): Case(OK, NOT_THREAD, OK, params={"thread_id": "{thread_id}"}),
    ("GET", "/v1/threads/{thread_id}/allowances"): Case(OK, NOT_THREAD, OK),
    # Whoever may decide the thread's interrupts may revoke (a second revoke is 204 too).
    ("DELETE", "/v1/allowances/{allowance_id}"): Case(OK, NOT_ALLOWANCE, OK),
    ("GET", "/v1/interrupts"): everyone(),
    ("GET", "/v1/demo/effects"): Case(ADMIN_ONLY, ADMIN_ONLY, ADMIN_ONLY),
    ("GET", "/metrics"): Case(ADMIN_ONLY, ADMIN_ONLY, ADMIN_ONLY),
    # The world has no webhook deliveries: the admin gets past the check to the 404.
    ("GET", "/v1/webhooks/deliveries"): Case(ADMIN_ONLY, ADMIN_ONLY, ADMIN_ONLY),
    ("GET", "/v1/webhooks/deliveries/{delivery_id}"): Case(ADMIN_ONLY, ADMIN_ONLY, ADMIN_ONLY, NOT_DELIVERY),
    ("POST", "/v1/webhooks/deliveries/{delivery_id}/redeliver"): Case(ADMIN_ONLY, ADMIN_ONLY, ADMIN_ONLY, NOT_DELIVERY),
    # The world has no webhook endpoints: the admin gets an empty list, and the 404.
    ("GET", "/v1/webhooks/endpoints"): Case(ADMIN_ONLY, ADMIN_ONLY, ADMIN_ONLY),
    ("POST", "/v1/webhooks/endpoints/{endpoint_id}/enable"): Case(ADMIN_ONLY, ADMIN_ONLY, ADMIN_ONLY, NOT_ENDPOINT),
    # AG-UI answers with a 200 stream; a refusal is its RUN_ERROR (status in metadata.tether).
    ("GET", "/v1/agui/capabilities"): everyone(),
    ("POST", "/v1/agui/connect"): Case(OK, NOT_THREAD, OK, body=lambda w: agui_input(w.thread_a, [])),
    ("POST", "/v1/agui"): Case(OK, NOT_THREAD, READ_ONLY, body=lambda w: agui_input(w.thread_a, [{"id": "m-new", "role": "user", "content": "hi"}])),
    # Deciding last: the approver's reject resolves the interrupt, then the others get 409.
    ("POST", "/v1/interrupts/decide"): everyone(body=lambda w: {"interrupt_ids": [w.interrupt_a], "decision": "reject", "reason": "matrix"}),
    ("POST", "/v1/threads/{thread_id}/runs"): Case(OK, NOT_THREAD, READ_ONLY, body=lambda w: {"input": {"content": "another"}}),
    (
        "POST",
        "/v1/threads/{thread_id}/resume",
    ): Case(OK, NOT_THREAD, OK, body=lambda w: {"interrupt_id": w.interrupt_a, "decisions": [{"decision": "reject", "reason": "matrix"}]}),
}


def agui_input(thread_id: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """A minimal AG-UI ``RunAgentInput``."""
    return {"threadId": thread_id, "runId": "matrix", "state": {}, "messages": messages, "tools": [], "context": [], "forwardedProps": {}}


def outcome(response: httpx.Response) -> tuple[int, str | None]:
    """The status and error code of a response; an AG-UI stream's refusal counts as the status
    and code of its ``RUN_ERROR``."""
    if response.status_code == 200 and response.headers.get("content-type", "").startswith("text/event-stream"):
        for line in response.text.splitlines():
            if line.startswith("data: ") and '"RUN_ERROR"' in line:
                event = json.loads(line[len("data: ") :])
                if event.get("type") == "RUN_ERROR":
                    return int(event["metadata"]["tether"].get("status", 200)), event.get("code")
    return response.status_code, error_code(response)


def error_code(response: httpx.Response) -> str | None:
    """The ``code`` of an error response (None for anything else)."""
    try:
        error = response.json().get("error")
    except ValueError:
        return None
    return error.get("code") if isinstance(error, dict) and response.status_code >= 400 else None


def fill(template: str, world: World) -> str:
    ids = {
        "thread_id": world.thread_a,
        "run_id": world.run_a,
        "message_id": world.answer_a,
        "delivery_id": "msg_no_such_delivery",
        "endpoint_id": "ep_no_such_endpoint",
        "allowance_id": world.allowance_a,
    }
    return re.sub(r"\{(\w+)\}", lambda m: ids[m.group(1)], template)


async def test_every_route_answers_each_kind_of_caller_as_the_rules_say_and_leaks_nothing(keyed: tuple[LiveServer, Keys]) -> None:
    server, keys = keyed
    served = {(m, p) for m, p in routes_of(server.app)} | {("GET", "/static/app.js")}
    unlisted = sorted(served - set(CASES))
    assert not unlisted, f"routes without a row in the authorization matrix (add them to CASES): {unlisted}"
    assert set(CASES) - served == set(), "the matrix names routes the app does not have"

    with anyio.fail_after(90):
        async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
            world = await build_world(http, keys)
            everything = world.markers_a | world.markers_b
            callers: list[tuple[str, dict[str, str], str | None, set[str]]] = [
                ("no key", {}, None, everything),
                ("malformed key", {"Authorization": "Bearer tk_not-a-key"}, None, everything),
                ("wrong scheme", {"Authorization": f"Basic {keys.root}"}, None, everything),
                ("revoked key", bearer(keys.revoked), None, everything),
                ("expired key", bearer(keys.expired), None, everything),
                ("other", bearer(keys.bob), "other", world.markers_a),
                ("approver", bearer(keys.carol), "approver", world.markers_b),
                ("owner", bearer(keys.alice), "owner", world.markers_b),
                ("admin", bearer(keys.root), "admin", set()),
            ]
            for (method, template), case in CASES.items():
                path = fill(template, world)
                params = {k: fill(v, world) for k, v in (case.params or {}).items()}
                body = case.body(world) if case.body else None
                sent = path + str(params) + str(body)
                for label, headers, role, hidden in callers:
                    response = await http.request(method, path, params=params, json=body, headers=headers)
                    where = f"{method} {template} as {label}: {response.status_code} {response.text[:300]}"
                    assert response.status_code < 500, where
                    if case.public:
                        assert response.status_code == 200, where
                    elif role is None:
                        assert response.status_code == 401, where
                        assert response.json()["error"]["code"] == "unauthorized", where
                        assert response.headers["WWW-Authenticate"].startswith("Bearer"), where
                    else:
                        expect: Expect = getattr(case, role)
                        if expect == OK:
                            assert outcome(response)[0] not in (401, 403, 404), where
                        else:
                            assert outcome(response) == expect, where
                    text = response.text
                    leaked = sorted(m for m in hidden if m in text and m not in sent)
                    assert not leaked, f"{where}\nleaks {leaked}"
                    assert not any(key in text for key in keys.all()), f"{where}\nshows an API key"

            # The event stream follows the same rules, and carries only what its reader may see.
            for key, allowed in ((keys.alice, True), (keys.carol, True), (keys.root, True), (keys.bob, False)):
                sse = await http.get(f"/v1/runs/{world.run_a}/events", headers={**bearer(key), "Accept": "text/event-stream"})
                assert sse.status_code == (200 if allowed else 404), sse.text
                assert ("alice-secret-answer" in sse.text) is allowed
                assert not any(m in sse.text for m in world.markers_b)


async def test_what_you_may_not_see_answers_exactly_as_what_does_not_exist(keyed: tuple[LiveServer, Keys]) -> None:
    server, keys = keyed
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
        with anyio.fail_after(30):
            world = await build_world(http, keys)
        for template, real in (
            ("/v1/threads/{}", world.thread_a),
            ("/v1/threads/{}/messages", world.thread_a),
            ("/v1/runs/{}", world.run_a),
            ("/v1/runs/{}/events", world.run_a),
            ("/v1/runs/{}/timeline", world.run_a),
        ):
            hidden = await http.get(template.format(real), headers=bearer(keys.bob))
            fake = real[:4] + "0" * (len(real) - 4)
            missing = await http.get(template.format(fake), headers=bearer(keys.bob))
            assert hidden.status_code == missing.status_code == 404
            assert hidden.json()["error"] == {**missing.json()["error"], "message": missing.json()["error"]["message"].replace(fake, real)}
        steer = await http.patch(f"/v1/messages/{world.answer_a}", json={"content": "x"}, headers=bearer(keys.bob))
        assert steer.status_code == 404 and steer.json()["error"]["code"] == "message_not_found"


async def test_me_names_the_caller_and_their_roles(keyed: tuple[LiveServer, Keys]) -> None:
    server, keys = keyed
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
        assert (await http.get("/v1/me", headers=bearer(keys.dave))).json() == {"name": "dave", "roles": ["user", "approver"], "auth": "keys"}
        assert (await http.get("/v1/me", headers=bearer(keys.root))).json()["roles"] == ["admin"]


# -- who may decide, and four-eyes -----------------------------------------------------------


async def test_four_eyes_refuses_the_requesters_approval_and_executes_once_on_an_approvers(db_url: str) -> None:
    server = LiveServer(build_demo_agent(), db_url, auth="keys", four_eyes="destructive").start()
    try:
        keys = await create_keys(db_url)
        with anyio.fail_after(30):
            async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
                thread_id, run = await start(http, keys.alice, REFUND)
                interrupt = (await wait_for_status(http, run["id"], keys.alice, "waiting_human"))["pending_interrupt"]
                assert interrupt["requested_by"] == "alice"
                assert interrupt["action_requests"][0]["four_eyes"] is True
                approve = {"interrupt_id": interrupt["id"], "decisions": [{"decision": "approve"}]}

                own = await http.post(f"/v1/threads/{thread_id}/resume", json=approve, headers=bearer(keys.alice))
                assert own.status_code == 403 and own.json()["error"]["code"] == "four_eyes_required", own.text
                edit = {"interrupt_id": interrupt["id"], "decisions": [{"decision": "edit", "args": {"order_id": "A1", "amount": 1}}]}
                own_edit = await http.post(f"/v1/threads/{thread_id}/resume", json=edit, headers=bearer(keys.alice))
                assert own_edit.status_code == 403 and own_edit.json()["error"]["code"] == "four_eyes_required"
                # A user who is neither the requester nor an approver cannot even see it.
                assert (await http.post(f"/v1/threads/{thread_id}/resume", json=approve, headers=bearer(keys.bob))).status_code == 404
                assert (await http.get(f"/v1/runs/{run['id']}", headers=bearer(keys.alice))).json()["status"] == "waiting_human"

                second = await http.post(f"/v1/threads/{thread_id}/resume", json=approve, headers=bearer(keys.carol))
                assert second.status_code == 200, second.text
                await wait_for_status(http, run["id"], keys.alice, "completed")
                again = await http.post(f"/v1/threads/{thread_id}/resume", json=approve, headers=bearer(keys.carol))
                assert again.status_code == 409

                assert len(await effects(http, keys.root, run["id"])) == 1
                audit = (await http.get("/v1/audit", params={"run_id": run["id"]}, headers=bearer(keys.alice))).json()["items"]
                assert [(a["action"], a["actor"], a["decision"], a["outcome"]) for a in audit] == [
                    ("decision", "alice", "approve", "refused_four_eyes"),
                    ("decision", "alice", "edit", "refused_four_eyes"),
                    ("decision", "carol", "approve", "accepted"),
                    ("tool_executed", "carol", None, "ok"),
                ]
                events = (await http.get(f"/v1/runs/{run['id']}/events", params={"limit": 1000}, headers=bearer(keys.alice))).json()["items"]
                resumed = [e["data"] for e in events if e["type"] == "resumed"]
                assert [r["actor"] for r in resumed] == ["carol"]
    finally:
        server.stop()


async def test_under_four_eyes_the_requesters_reject_still_ends_the_action(db_url: str) -> None:
    server = LiveServer(build_demo_agent(), db_url, auth="keys", four_eyes="destructive").start()
    try:
        keys = await create_keys(db_url)
        with anyio.fail_after(30):
            async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
                thread_id, run = await start(http, keys.alice, REFUND)
                interrupt = (await wait_for_status(http, run["id"], keys.alice, "waiting_human"))["pending_interrupt"]
                reject = {"interrupt_id": interrupt["id"], "decisions": [{"decision": "reject", "reason": "changed my mind"}]}
                response = await http.post(f"/v1/threads/{thread_id}/resume", json=reject, headers=bearer(keys.alice))
                assert response.status_code == 200, response.text
                assert (await wait_for_status(http, run["id"], keys.alice, "completed", "failed"))["status"] == "completed"
                assert await effects(http, keys.root, run["id"]) == []
                late = await http.post(f"/v1/threads/{thread_id}/resume", json={**reject, "decisions": [{"decision": "approve"}]}, headers=bearer(keys.carol))
                assert late.status_code == 409
    finally:
        server.stop()


async def test_a_reader_who_is_not_the_requester_nor_an_approver_may_not_decide(keyed: tuple[LiveServer, Keys]) -> None:
    server, keys = keyed
    with anyio.fail_after(30):
        async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
            # The admin starts a run in Alice's thread: Alice reads it, but did not request it.
            thread_id = (await http.post("/v1/threads", headers=bearer(keys.alice))).json()["id"]
            _, run = await start(http, keys.root, REFUND, thread_id)
            interrupt = (await wait_for_status(http, run["id"], keys.alice, "waiting_human"))["pending_interrupt"]
            assert interrupt["requested_by"] == "root"
            body = {"interrupt_id": interrupt["id"], "decisions": [{"decision": "approve"}]}
            response = await http.post(f"/v1/threads/{thread_id}/resume", json=body, headers=bearer(keys.alice))
            assert response.status_code == 403 and response.json()["error"]["code"] == "not_an_approver"
            # The approver may decide, but may not start or steer runs in the thread.
            busy = await http.post(f"/v1/threads/{thread_id}/runs", json={"input": {"content": "x"}}, headers=bearer(keys.carol))
            assert busy.status_code == 403 and busy.json()["error"]["code"] == "not_the_owner"
            assert (await http.post(f"/v1/threads/{thread_id}/resume", json=body, headers=bearer(keys.carol))).status_code == 200


# -- the inbox -------------------------------------------------------------------------------


async def test_the_inbox_shows_each_user_their_own_and_an_approver_all_and_a_batch_approval_executes_each_once(
    keyed: tuple[LiveServer, Keys],
) -> None:
    server, keys = keyed
    with anyio.fail_after(40):
        async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
            # One after the other: alice's interrupt opens (and expires) first.
            _, run_a = await start(http, keys.alice, REFUND)
            await wait_for_status(http, run_a["id"], keys.alice, "waiting_human")
            _, run_b = await start(http, keys.bob, REFUND)
            await wait_for_status(http, run_b["id"], keys.bob, "waiting_human")

            async def inbox(key: str) -> list[dict[str, Any]]:
                response = await http.get("/v1/interrupts", params={"status": "pending"}, headers=bearer(key))
                assert response.status_code == 200, response.text
                items: list[dict[str, Any]] = response.json()["items"]
                return items

            assert [(i["run_id"], i["requested_by"]) for i in await inbox(keys.alice)] == [(run_a["id"], "alice")]
            assert [(i["run_id"], i["requested_by"]) for i in await inbox(keys.bob)] == [(run_b["id"], "bob")]
            everything = await inbox(keys.carol)
            assert [i["run_id"] for i in everything] == [run_a["id"], run_b["id"]]  # soonest expiry first
            for item in everything:
                assert item["thread_id"] and item["action_requests"][0]["action"] == "refund"
                assert item["expires_in_s"] > 0 and item["waited_s"] >= 0
            assert [i["id"] for i in await inbox(keys.root)] == [i["id"] for i in everything]

            # Bob cannot decide Alice's, and learns nothing about it: the same answer as a made-up id.
            ids = [i["id"] for i in everything]
            denied = (
                await http.post("/v1/interrupts/decide", json={"interrupt_ids": [ids[0], "int_nope"], "decision": "approve"}, headers=bearer(keys.bob))
            ).json()
            assert [(i["status"], i["error"]["code"]) for i in denied["items"]] == [(404, "interrupt_not_found"), (404, "interrupt_not_found")]

            batch = await http.post("/v1/interrupts/decide", json={"interrupt_ids": ids, "decision": "approve"}, headers=bearer(keys.carol))
            assert batch.status_code == 200, batch.text
            assert [(i["interrupt_id"], i["status"], i["run"]["id"]) for i in batch.json()["items"]] == [
                (ids[0], 200, run_a["id"]),
                (ids[1], 200, run_b["id"]),
            ]
            repeat = (await http.post("/v1/interrupts/decide", json={"interrupt_ids": ids, "decision": "approve"}, headers=bearer(keys.carol))).json()
            assert [(i["status"], i["error"]["code"]) for i in repeat["items"]] == [(409, "interrupt_resolved")] * 2
            for run, key in ((run_a, keys.alice), (run_b, keys.bob)):
                await wait_for_status(http, run["id"], key, "completed")
                assert len(await effects(http, keys.root, run["id"])) == 1
            assert await inbox(keys.carol) == []


# -- audit -----------------------------------------------------------------------------------


async def test_audit_names_the_principals_and_only_admins_read_it_unfiltered(keyed: tuple[LiveServer, Keys]) -> None:
    server, keys = keyed
    with anyio.fail_after(30):
        async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
            _, run = await start(http, keys.alice, script({"tool_calls": [{"name": "sleep", "args": {"seconds": 30}}]}))
            await wait_for_status(http, run["id"], keys.alice, "running")
            assert (await http.post(f"/v1/runs/{run['id']}/cancel", json={"mode": "hard"}, headers=bearer(keys.alice))).status_code == 202
            await wait_for_status(http, run["id"], keys.alice, "cancelled")
            entries = (await http.get("/v1/audit", params={"run_id": run["id"]}, headers=bearer(keys.alice))).json()["items"]
            assert [(e["action"], e["actor"]) for e in entries] == [("cancel", "alice")]

            unfiltered = await http.get("/v1/audit", headers=bearer(keys.alice))
            assert unfiltered.status_code == 422 and unfiltered.json()["error"]["code"] == "audit_filter_required"
            everything = (await http.get("/v1/audit", headers=bearer(keys.root))).json()["items"]
            actions = [(e["action"], e["actor"], (e["details"] or {}).get("name")) for e in everything]
            assert ("key_created", "test", "alice") in actions and ("key_revoked", "test", "mallory") in actions
            assert ("cancel", "alice", None) in actions
            assert not any(k in str(everything) for k in keys.all())


# -- the store's keys ------------------------------------------------------------------------


async def test_keys_are_stored_as_hashes_and_listed_without_the_key(db_url: str) -> None:
    store = await Store.open(db_url)
    try:
        record, key = await store.create_key(name="alice", roles=["approver", "user", "user"], actor="test")
        assert re.fullmatch(r"tk_[A-Za-z0-9_-]{43}", key) and key.startswith(record.prefix)
        assert record.roles == ("user", "approver")
        async with store.connection() as conn:
            dump = str([tuple(row) for row in (await conn.exec_driver_sql("SELECT * FROM api_keys")).all()])
        assert key not in dump and key[len(record.prefix) :] not in dump
        assert all(key not in str(k) for k in await store.list_keys())
        assert (await store.authenticate(key)) is not None
        assert await store.authenticate(key[:-1] + ("A" if key[-1] != "A" else "B")) is None
        assert (await store.list_keys())[0].last_used_at is not None
        for bad_name in ("", "local", "system", "a b", "x" * 65):
            with pytest.raises(Exception, match="invalid principal name"):
                await store.create_key(name=bad_name, roles=["user"], actor="test")
        with pytest.raises(Exception, match="roles"):
            await store.create_key(name="zed", roles=["root"], actor="test")
    finally:
        await store.aclose()


# -- processes and the CLI -------------------------------------------------------------------


def tether(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tether.cli", *args], capture_output=True, text=True, timeout=timeout)


async def test_a_key_revoked_with_the_cli_is_refused_at_the_next_request_by_every_process(pg_db_url: str, tmp_path: Path) -> None:
    created = await anyio.to_thread.run_sync(lambda: tether("keys", "create", "--db", pg_db_url, "--name", "alice", "--role", "user"))
    assert created.returncode == 0, created.stderr
    key = created.stdout.strip().splitlines()[-1]
    a = ServerProcess(pg_db_url, tmp_path / "a.log", extra_args=("--auth", "keys"))
    b = ServerProcess(pg_db_url, tmp_path / "b.log", extra_args=("--auth", "keys"))
    try:
        await anyio.to_thread.run_sync(a.start)
        await anyio.to_thread.run_sync(b.start)
        async with httpx.AsyncClient(timeout=10) as http:
            thread = (await http.post(a.url + "/v1/threads", headers=bearer(key))).json()
            assert (await http.get(f"{b.url}/v1/threads/{thread['id']}", headers=bearer(key))).status_code == 200

            listed = await anyio.to_thread.run_sync(lambda: tether("keys", "list", "--db", pg_db_url))
            assert "alice" in listed.stdout and key[:11] in listed.stdout and key not in listed.stdout
            revoked = await anyio.to_thread.run_sync(lambda: tether("keys", "revoke", "--db", pg_db_url, "alice"))
            assert revoked.returncode == 0, revoked.stderr

            for url in (b.url, a.url):
                refused = await http.get(f"{url}/v1/threads/{thread['id']}", headers=bearer(key))
                assert refused.status_code == 401 and refused.json()["error"]["code"] == "unauthorized"
                assert key not in refused.text
    finally:
        a.stop()
        b.stop()
    for log in (tmp_path / "a.log", tmp_path / "b.log"):
        assert key not in log.read_text(), "a key was written to a server log"


def test_serving_without_keys_on_a_public_host_is_refused_with_exit_code_2() -> None:
    for command in (("serve", "examples.shop_agent:agent"), ("demo",)):
        result = tether(*command, "--host", "0.0.0.0", "--auth", "open", "--port", "1")
        assert result.returncode == 2, result.stderr
        assert "--auth open" in result.stderr and "loopback" in result.stderr


def test_keys_create_prints_the_key_last_and_refuses_bad_input(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'keys.db'}"
    created = tether("keys", "create", "--db", db, "--name", "ops", "--role", "approver", "--role", "admin", "--expires-in", "30d")
    assert created.returncode == 0, created.stderr
    lines = created.stdout.strip().splitlines()
    assert re.fullmatch(r"tk_[A-Za-z0-9_-]{43}", lines[-1])
    assert "approver, admin" in lines[0] and "expires" in lines[0]
    assert tether("keys", "create", "--db", db, "--name", "ops", "--expires-in", "soon").returncode == 2
    assert tether("keys", "create", "--db", db, "--name", "local").returncode == 2
    assert tether("keys", "revoke", "--db", db, "nobody").returncode == 1


def test_the_demo_on_loopback_needs_no_key(tmp_path: Path) -> None:
    server = ServerProcess(f"sqlite:///{tmp_path / 'demo.db'}", tmp_path / "demo.log").start()
    try:
        assert httpx.get(server.url + "/v1/me").json() == {"name": "local", "roles": ["user", "approver", "admin"], "auth": "open"}
        assert httpx.post(server.url + "/v1/threads").status_code == 201
        assert httpx.get(server.url + "/v1/threads").status_code == 200
    finally:
        server.stop()


async def test_no_cors_by_default_and_named_origins_when_asked(tmp_path: Path) -> None:
    plain = LiveServer(build_demo_agent(), f"sqlite:///{tmp_path / 'a.db'}").start()
    allowed = LiveServer(build_demo_agent(), f"sqlite:///{tmp_path / 'b.db'}", auth="keys", cors_origins=["https://app.example"]).start()
    try:
        preflight = {"Origin": "https://app.example", "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization"}
        async with httpx.AsyncClient(timeout=10) as http:
            response = await http.options(plain.url + "/v1/threads", headers=preflight)
            assert "access-control-allow-origin" not in response.headers
            response = await http.options(allowed.url + "/v1/threads", headers=preflight)
            assert response.status_code == 200 and response.headers["access-control-allow-origin"] == "https://app.example"
            other = await http.options(allowed.url + "/v1/threads", headers={**preflight, "Origin": "https://evil.example"})
            assert "access-control-allow-origin" not in other.headers
    finally:
        plain.stop()
        allowed.stop()


async def test_the_new_routes_refuse_bad_input_with_the_error_shape(keyed: tuple[LiveServer, Keys]) -> None:
    server, keys = keyed
    async with httpx.AsyncClient(base_url=server.url, timeout=10, headers=bearer(keys.carol)) as http:
        for body in (
            {},
            {"interrupt_ids": [], "decision": "approve"},
            {"interrupt_ids": ["int_a", "int_a"], "decision": "approve"},
            {"interrupt_ids": ["int_a"], "decision": "edit"},
            {"interrupt_ids": ["x" * 65], "decision": "approve"},
            {"interrupt_ids": ["int_\u0000"], "decision": "approve"},
            {"interrupt_ids": ["int_a"], "decision": "reject", "reason": "r", "extra": 1},
        ):
            response = await http.post("/v1/interrupts/decide", json=body)
            assert response.status_code == 422, (body, response.text)
            assert set(response.json()["error"]) == {"code", "message", "details"}
        for params in ({"status": "resolved"}, {"limit": 0}, {"limit": "many"}):
            response = await http.get("/v1/interrupts", params=params)
            assert response.status_code == 422 and response.json()["error"]["code"] == "validation_error", response.text
        odd = await http.get("/v1/me", headers={"Authorization": "Bearer tk_\u00e9\u00e9".encode("latin-1")})
        assert odd.status_code == 401
