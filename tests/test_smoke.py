from __future__ import annotations

import pytest

from tether.client import AsyncClient

from .conftest import LiveServer, script

pytestmark = pytest.mark.anyio


async def test_a_scripted_run_streams_to_done(server: LiveServer) -> None:
    async with AsyncClient(server.url) as client:
        thread = await client.create_thread()
        run = await client.start_run(thread["id"], script({"text": "hello there world"}))
        events = [e async for e in client.follow(run["id"])]
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        assert events[-1].type == "done"
        text = "".join(e.data["text"] for e in events if e.type == "token")
        assert text == "hello there world"
        assert (await client.get_run(run["id"]))["status"] == "completed"
