"""Thread titles through the real server, on SQLite and PostgreSQL (``db_url`` runs both).

A thread takes its title from its first message (on one line, trimmed, card-like numbers
masked, capped at 80 characters), keeps it after later messages and forks, and can be given one
at creation or renamed (``PATCH /v1/threads/{id}``, validated, owner only). Migration 0012 gives
existing threads the title of their first user message.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

from tether.client import AsyncClient
from tether.demo import build_demo_agent
from tether.store import normalize_db_url

from .conftest import LiveServer, script

pytestmark = pytest.mark.anyio


@pytest.fixture
async def http(server: LiveServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:
        yield client


async def run_to_end(http: httpx.AsyncClient, thread_id: str, content: str, *, headers: dict[str, str] | None = None, **body: Any) -> dict[str, Any]:
    """Start a run with ``content`` and wait until it is no longer active."""
    response = await http.post(f"/v1/threads/{thread_id}/runs", json={"input": {"content": content}, **body}, headers=headers or {})
    assert response.status_code == 202, response.text
    run_id = response.json()["id"]
    with anyio.fail_after(20):
        while (run := (await http.get(f"/v1/runs/{run_id}", headers=headers or {})).json())["status"] not in (
            "completed",
            "failed",
            "cancelled",
            "waiting_human",
        ):
            await anyio.sleep(0.02)
    return run


async def new_thread(http: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    response = await http.post("/v1/threads", json=body)
    assert response.status_code == 201, response.text
    thread: dict[str, Any] = response.json()
    return thread


async def title_of(http: httpx.AsyncClient, thread_id: str) -> str | None:
    """The title as the thread, and the thread list, say it (they must agree)."""
    one = (await http.get(f"/v1/threads/{thread_id}")).json()["title"]
    listed = {t["id"]: t["title"] for t in (await http.get("/v1/threads")).json()["items"]}
    assert listed[thread_id] == one
    return one  # type: ignore[no-any-return]


async def test_a_thread_takes_its_title_from_its_first_message_and_keeps_it(http: httpx.AsyncClient) -> None:
    thread = await new_thread(http)
    assert thread["title"] is None  # nothing to take it from yet
    first = script({"text": "ok"})
    await run_to_end(http, thread["id"], "  order   A100\n\tplease  " + " " * 5)
    assert await title_of(http, thread["id"]) == "order A100 please"

    await run_to_end(http, thread["id"], first)  # a later message changes nothing
    assert await title_of(http, thread["id"]) == "order A100 please"

    # Editing the first message (a new root) forks the thread; the title stays.
    response = await http.post(f"/v1/threads/{thread['id']}/runs", json={"input": {"content": "something else entirely"}, "parent_id": None})
    assert response.status_code == 202, response.text
    assert await title_of(http, thread["id"]) == "order A100 please"


async def test_a_long_first_message_is_cut_at_a_word_and_card_numbers_are_masked(http: httpx.AsyncClient) -> None:
    thread = await new_thread(http)
    words = "please refund the blue teapot on order A100 because the lid arrived cracked and the spout leaks everywhere"
    await run_to_end(http, thread["id"], words)
    title = await title_of(http, thread["id"])
    assert title is not None and len(title) <= 80 and title.endswith("…")
    assert words.startswith(title[:-1]) and words[len(title) - 1] == " "  # cut where a word ends

    masked = await new_thread(http)
    await run_to_end(http, masked["id"], "charge 4242424242424242 10")
    assert await title_of(http, masked["id"]) == "charge ****4242 10"


async def test_the_title_is_also_taken_on_the_transactional_start_under_an_idempotency_key(http: httpx.AsyncClient) -> None:
    thread = await new_thread(http)
    await run_to_end(http, thread["id"], "order A100", headers={"Idempotency-Key": '"title-1"'})
    assert await title_of(http, thread["id"]) == "order A100"


async def test_a_title_given_at_creation_is_kept_over_the_first_message(http: httpx.AsyncClient) -> None:
    thread = await new_thread(http, title="  Support\nticket 7 ", metadata={"k": 1})
    assert thread["title"] == "Support ticket 7"
    await run_to_end(http, thread["id"], "order A100")
    assert await title_of(http, thread["id"]) == "Support ticket 7"


async def test_renaming_a_thread_cleans_the_title_and_every_read_shows_it(http: httpx.AsyncClient, server: LiveServer) -> None:
    thread = await new_thread(http)
    await run_to_end(http, thread["id"], "order A100")
    response = await http.patch(f"/v1/threads/{thread['id']}", json={"title": "  Refund\tfor   Ada \u0007 "})
    assert response.status_code == 200, response.text
    renamed = response.json()
    assert renamed["title"] == "Refund for Ada"
    assert renamed["id"] == thread["id"] and renamed["active_leaf_id"] is not None  # the whole thread resource
    assert await title_of(http, thread["id"]) == "Refund for Ada"
    await run_to_end(http, thread["id"], "order A200")
    assert await title_of(http, thread["id"]) == "Refund for Ada"
    # The longest allowed title, exactly.
    assert (await http.patch(f"/v1/threads/{thread['id']}", json={"title": "x" * 200})).json()["title"] == "x" * 200

    async with AsyncClient(server.url) as client:  # the Python client
        assert (await client.rename_thread(thread["id"], "From Python"))["title"] == "From Python"
        assert (await client.create_thread(title="Given"))["title"] == "Given"


@pytest.mark.parametrize(
    "body",
    [
        {"title": ""},
        {"title": " \n\t "},
        {"title": "x" * 201},
        {"title": "nul \u0000 inside"},
        {"title": 7},
        {"title": None},
        {},
        {"title": "ok", "extra": 1},
    ],
    ids=["empty", "blank", "201 chars", "NUL", "not a string", "null", "missing", "unknown field"],
)
async def test_a_bad_title_is_422_and_changes_nothing(http: httpx.AsyncClient, body: dict[str, Any]) -> None:
    thread = await new_thread(http, title="Kept")
    response = await http.patch(f"/v1/threads/{thread['id']}", json=body)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["code"] == "validation_error"
    assert await title_of(http, thread["id"]) == "Kept"
    # Creation checks a title the same way (where a title may be left out, or null).
    created = await http.post("/v1/threads", json=body)
    assert created.status_code == (201 if body.get("title") is None and len(body) <= 1 else 422), created.text


async def test_renaming_a_thread_that_does_not_exist_is_404(http: httpx.AsyncClient) -> None:
    response = await http.patch("/v1/threads/thr_missing", json={"title": "x"})
    assert response.status_code == 404 and response.json()["error"]["code"] == "thread_not_found"


async def test_only_the_owner_renames_a_thread(db_url: str) -> None:
    from .test_auth import bearer, create_keys

    server = LiveServer(build_demo_agent(), db_url, auth="keys").start()
    try:
        keys = await create_keys(db_url)
        async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
            thread = (await http.post("/v1/threads", json={"title": "alice's"}, headers=bearer(keys.alice))).json()
            # An approver may read the thread once it has an interrupt, but not rename it.
            refund = script({"tool_calls": [{"name": "refund", "args": {"order_id": "A1", "amount": 5}}]})
            await run_to_end(http, thread["id"], refund, headers=bearer(keys.alice))
            answers = {
                "bob": await http.patch(f"/v1/threads/{thread['id']}", json={"title": "bob's now"}, headers=bearer(keys.bob)),
                "carol": await http.patch(f"/v1/threads/{thread['id']}", json={"title": "carol's now"}, headers=bearer(keys.carol)),
            }
            assert (answers["bob"].status_code, answers["bob"].json()["error"]["code"]) == (404, "thread_not_found")
            assert (answers["carol"].status_code, answers["carol"].json()["error"]["code"]) == (403, "not_the_owner")
            read = (await http.get(f"/v1/threads/{thread['id']}", headers=bearer(keys.alice))).json()
            assert read["title"] == "alice's"
            mine = await http.patch(f"/v1/threads/{thread['id']}", json={"title": "still alice's"}, headers=bearer(keys.alice))
            assert mine.status_code == 200 and mine.json()["title"] == "still alice's"
    finally:
        server.stop()


async def test_migration_0012_gives_existing_threads_the_title_of_their_first_user_message(db_url: str) -> None:
    from alembic import command
    from alembic.config import Config

    from tether.store import _engine
    from tether.store._tables import messages, threads

    config = Config()
    config.set_main_option("script_location", str(Path(_engine.__file__).parent / "migrations"))

    def migrate(step: Callable[[Config, str], None], to: str) -> Callable[[sa.Connection], None]:
        def run(conn: sa.Connection) -> None:
            config.attributes["connection"] = conn
            step(config, to)

        return run

    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    engine = create_async_engine(normalize_db_url(db_url))
    try:
        async with engine.begin() as conn:
            await conn.run_sync(migrate(command.upgrade, "0011"))
            for thread_id, owner in (("thr_a", "alice"), ("thr_b", "bob"), ("thr_c", "carol")):
                await conn.execute(threads.insert().values(id=thread_id, owner=owner, metadata={}, created_at=t0, updated_at=t0))
            rows = [
                # thr_a: an assistant message first (an edited answer), then two user messages: the older one is the first.
                ("msg_1", "thr_a", "assistant", "hello", 0),
                ("msg_2", "thr_a", "user", "  refund\n25 on   order A100 ", 1),
                ("msg_3", "thr_a", "user", "later", 2),
                ("msg_4", "thr_b", "user", "abc " * 100, 0),
            ]  # thr_c: no message, so no title
            for message_id, thread_id, role, content, second in rows:
                at = t0 + timedelta(seconds=second)
                await conn.execute(messages.insert().values(id=message_id, thread_id=thread_id, role=role, content=content, status="complete", created_at=at))
            await conn.run_sync(migrate(command.upgrade, "head"))
            titles = {row.id: row.title for row in await conn.execute(sa.select(threads.c.id, threads.c.title))}
        assert titles["thr_a"] == "refund 25 on order A100"
        assert titles["thr_b"] == ("abc " * 20).rstrip() + "…"  # cut at a word, within 80 characters
        assert titles["thr_c"] is None
        async with engine.begin() as conn:  # and back down
            await conn.run_sync(migrate(command.downgrade, "0011"))
            columns = await conn.run_sync(lambda c: [col["name"] for col in sa.inspect(c).get_columns("threads")])
        assert "title" not in columns
    finally:
        await engine.dispose()
