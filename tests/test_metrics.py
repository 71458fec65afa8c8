"""``GET /metrics`` reports what the server and its database are doing, in Prometheus format."""

from __future__ import annotations

import anyio
import httpx
import pytest

from .conftest import LiveServer, script

pytestmark = pytest.mark.anyio


def _values(text: str) -> dict[str, float]:
    values = {}
    for line in text.splitlines():
        if line.startswith("tether_"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


async def test_metrics_count_runs_by_status_pending_interrupts_and_live_streams(server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
        before = _values((await http.get("/metrics")).text)
        assert before['tether_runs{status="waiting_human"}'] == 0
        thread = (await http.post("/v1/threads")).json()["id"]
        waiting = (await http.post(f"/v1/threads/{thread}/runs", json={"input": {"content": "refund 3 on order Z1"}})).json()
        other = (await http.post("/v1/threads")).json()["id"]
        # 4000 tokens 5 ms apart: still streaming when the checks below are made on a loaded
        # machine (the 2 s of 400 tokens were once over before the poll saw both counts); the
        # hard cancel at the end stops it.
        slow = (await http.post(f"/v1/threads/{other}/runs", json={"input": {"content": script({"tokens": 4000, "delay_ms": 5})}})).json()
        followed = anyio.Event()

        async def follow() -> None:  # a client reading the slow run's stream
            async with http.stream("GET", f"/v1/runs/{slow['id']}/events", headers={"Accept": "text/event-stream"}) as stream:
                async for _ in stream.aiter_lines():
                    followed.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(follow)
            await followed.wait()
            with anyio.fail_after(10):
                while True:
                    response = await http.get("/metrics")
                    now = _values(response.text)
                    # The waiting run's task ends just after its status is stored: wait for both.
                    if now['tether_runs{status="waiting_human"}'] == 1 and now["tether_event_streams"] == 1 and now["tether_executing_runs"] == 1:
                        break
                    await anyio.sleep(0.05)
            assert response.headers["content-type"].startswith("text/plain")
            assert now["tether_pending_interrupts"] == 1
            assert now["tether_event_streams"] == 1
            assert now["tether_executing_runs"] == 1  # the slow run; the waiting one holds no task
            assert now["tether_events_published_total"] > before["tether_events_published_total"]
            assert 0 < now["tether_event_commits_total"] - before["tether_event_commits_total"]
            assert now["tether_event_commits_total"] - before["tether_event_commits_total"] <= (
                now["tether_events_published_total"] - before["tether_events_published_total"]
            )
            tg.cancel_scope.cancel()
        await http.post(f"/v1/runs/{waiting['id']}/cancel")
        await http.post(f"/v1/runs/{slow['id']}/cancel", json={"mode": "hard"})
        with anyio.fail_after(10):
            while True:
                after = _values((await http.get("/metrics")).text)
                if after['tether_runs{status="cancelled"}'] == 2:
                    break
                await anyio.sleep(0.05)
        assert after["tether_pending_interrupts"] == 0 and after["tether_event_streams"] == 0
