"""A PostgreSQL server with no room for another connection (``max_connections``, a role's
``CONNECTION LIMIT``): the store's operations wait for room, as for a busy pool, and only after
the pool's timeout are ``Overloaded`` (503 ``database_busy``), never a raw driver error.

The room is made scarce for real: the store connects as a role with a connection limit, and the
test holds the rest of the role's connections itself.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import AsyncIterator

import anyio
import asyncpg
import pytest
import sqlalchemy as sa

from tether.errors import Overloaded
from tether.store import Store, _engine, _pgdirect, _refused

from .conftest import POSTGRES_ADMIN_URL

pytestmark = pytest.mark.anyio

#: Connections the role may hold at once.
LIMIT = 4


@pytest.fixture
async def limited_url() -> AsyncIterator[str]:
    """A fresh database owned by a fresh role that may hold ``LIMIT`` connections."""
    name = f"tether_room_{os.urandom(5).hex()}"
    admin = await asyncpg.connect(POSTGRES_ADMIN_URL, timeout=10)
    try:
        await admin.execute(f'CREATE ROLE "{name}" LOGIN CONNECTION LIMIT {LIMIT}')
        await admin.execute(f'CREATE DATABASE "{name}" OWNER "{name}"')
        try:
            yield sa.engine.make_url(POSTGRES_ADMIN_URL).set(username=name, database=name).render_as_string(hide_password=False)
        finally:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            await admin.execute(f'DROP ROLE IF EXISTS "{name}"')
    finally:
        await admin.close()


@contextlib.asynccontextmanager
async def every_other_connection(url: str) -> AsyncIterator[list[asyncpg.Connection]]:
    """Hold every connection the role still has room for (closed at the end, unless the
    caller closed them first)."""
    held: list[asyncpg.Connection] = []
    try:
        while True:
            try:
                held.append(await asyncpg.connect(url, timeout=10))
            except asyncpg.TooManyConnectionsError:
                break
        yield held
    finally:
        for conn in held:
            await conn.close()


async def take_the_open_direct_connections(store: Store, stack: contextlib.AsyncExitStack) -> None:
    """Hold every connection the store's direct pool has open and idle, so that its next
    operation must open one (test plumbing: the pool is the store's private part)."""
    direct = store._direct
    assert direct is not None
    pool, _plans = await direct._opened()
    for _ in range(pool.get_idle_size()):
        await stack.enter_async_context(direct.connection())
    assert pool.get_idle_size() == 0


async def refusal_logged(caplog: pytest.LogCaptureFixture) -> None:
    with anyio.fail_after(20):
        while not any("refused a new connection" in r.getMessage() for r in caplog.records):
            await anyio.sleep(0.01)


async def test_an_operation_waits_for_room_and_completes_once_a_connection_closes(
    limited_url: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_refused, "_last_warning", -1e9)  # another test's warning must not hide this one's
    caplog.set_level(logging.WARNING, logger="tether.store")
    store = await Store.open(limited_url)
    try:
        async with contextlib.AsyncExitStack() as stack:
            await take_the_open_direct_connections(store, stack)
            held = await stack.enter_async_context(every_other_connection(limited_url))
            assert held, "the store left the role no room to fill"
            results: list[str] = []

            async def create() -> None:
                results.append((await store.create_thread(owner="alice")).id)

            async with anyio.create_task_group() as tg:
                tg.start_soon(create)
                await refusal_logged(caplog)
                assert results == []  # refused, and waiting: not failed
                await held.pop().close()  # room for one
            (thread_id,) = results
            assert (await store.get_thread(thread_id)).owner == "alice"
    finally:
        await store.aclose()


async def test_an_agents_own_transaction_waits_for_room_too(limited_url: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """SQLAlchemy's pool (an agent's own tables, migrations) opens its connections under the
    same rule."""
    monkeypatch.setattr(_refused, "_last_warning", -1e9)
    caplog.set_level(logging.WARNING, logger="tether.store")
    store = await Store.open(limited_url)
    try:
        async with store.transaction() as first, every_other_connection(limited_url) as held:
            await first.execute(sa.text("SELECT 1"))  # the engine's one open connection is taken
            answers: list[int] = []

            async def second() -> None:
                async with store.connection() as conn:
                    answers.append((await conn.execute(sa.text("SELECT 2"))).scalar_one())

            async with anyio.create_task_group() as tg:
                tg.start_soon(second)
                await refusal_logged(caplog)
                assert answers == []
                if not held:  # the store's transaction took the last room: free it instead
                    await first.rollback()
                else:
                    await held.pop().close()
            assert answers == [2]
    finally:
        await store.aclose()


@pytest.mark.parametrize("pool", ["direct", "sqlalchemy"])
async def test_no_room_for_longer_than_the_pools_timeout_is_overloaded_not_a_driver_error(limited_url: str, monkeypatch: pytest.MonkeyPatch, pool: str) -> None:
    monkeypatch.setattr(_pgdirect, "_ACQUIRE_TIMEOUT_S", 0.5)
    monkeypatch.setattr(_engine, "_POOL_TIMEOUT_S", 0.5)
    store = await Store.open(limited_url)
    try:
        async with contextlib.AsyncExitStack() as stack:
            if pool == "sqlalchemy":  # take the engine's open connection, so the next must be opened
                await stack.enter_async_context(store.transaction())
            else:
                await take_the_open_direct_connections(store, stack)
            await stack.enter_async_context(every_other_connection(limited_url))
            with pytest.raises(Overloaded) as raised:
                if pool == "direct":
                    await store.create_thread(owner="alice")
                else:
                    async with store.connection() as conn:
                        await conn.execute(sa.text("SELECT 1"))
            assert raised.value.code == "database_busy" and raised.value.retry_after_s == 1.0
            assert isinstance(raised.value.__cause__, Exception) and _refused.refused_for_room(raised.value.__cause__)
        # Room again: the same store works (the refused slots were not kept broken).
        assert (await store.create_thread(owner="bob")).owner == "bob"
    finally:
        await store.aclose()
