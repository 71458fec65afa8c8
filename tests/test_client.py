"""The synchronous client: the async client's guarantees, from plain code."""

from __future__ import annotations

import pytest

from tether.client import APIError, Client

from .conftest import LiveServer, script


def test_the_sync_client_streams_a_run_and_cancels_another(server: LiveServer) -> None:
    with Client(server.url) as client:
        thread = client.create_thread({"from": "sync"})
        run = client.start_run(thread["id"], script({"text": "hello from a plain loop"}))
        events = list(client.follow(run["id"]))
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        assert events[-1].type == "done"
        assert "".join(e.data["text"] for e in events if e.type == "token") == "hello from a plain loop"

        slow = client.start_run(thread["id"], script({"tokens": 2000, "delay_ms": 5}))
        seen = []
        cancelled = False
        for event in client.follow(slow["id"]):
            seen.append(event)
            # Once: the next event after the fifth token may be ``cancelled`` itself.
            if not cancelled and sum(e.type == "token" for e in seen) == 5:
                assert client.cancel(slow["id"], mode="hard")["status"] in ("cancelling", "cancelled")
                cancelled = True
        assert cancelled
        assert seen[-1].type == "cancelled"
        assert client.get_run(slow["id"])["status"] == "cancelled"
        with pytest.raises(APIError) as refused:
            client.cancel(slow["id"])
        assert refused.value.status == 409 and refused.value.code == "run_not_active"
