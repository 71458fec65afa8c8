"""``tether demo --workers N``: several real worker processes on one port under a supervisor.

Which worker holds a connection is read from ``/proc`` (the socket inodes of each worker's file
descriptors against the kernel's TCP table), so the tests run on Linux only.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from tether.client import AsyncClient

from .conftest import ServerProcess, free_port, script, sqlite_url

pytestmark = [pytest.mark.anyio, pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")]

LEASE_S = 1.0


def _workers(supervisor: int) -> set[int]:
    children = Path(f"/proc/{supervisor}/task/{supervisor}/children").read_text().split()
    return {int(pid) for pid in children}


def _tcp_inodes(port: int) -> dict[int, int]:
    """Server-side sockets of established connections to ``port``: inode → the client's port."""
    found: dict[int, int] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(table):
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, remote, state, inode = fields[1], fields[2], fields[3], int(fields[9])
            if state == "01" and int(local.rsplit(":", 1)[1], 16) == port:
                found[inode] = int(remote.rsplit(":", 1)[1], 16)
    return found


def _holders(supervisor: int, port: int) -> dict[int, int]:
    """The client port of each established connection to ``port`` → the worker that holds it."""
    inodes = _tcp_inodes(port)
    held: dict[int, int] = {}
    for pid in _workers(supervisor):
        fds = Path(f"/proc/{pid}/fd")
        for fd in fds.iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:[") and (inode := int(target[8:-1])) in inodes:
                held[inodes[inode]] = pid
    return held


@pytest.fixture
async def two_workers(pg_db_url: str, tmp_path: Path) -> AsyncIterator[ServerProcess]:
    server = ServerProcess(pg_db_url, tmp_path / "server.log", extra_args=("--workers", "2", "--lease-seconds", str(LEASE_S), "--drain-seconds", "10"))
    await asyncio.to_thread(server.start)
    try:
        async with asyncio.timeout(30):
            while len(_workers(_pid(server))) < 2:
                await asyncio.sleep(0.05)
        yield server
    finally:
        await asyncio.to_thread(server.stop)


def _pid(server: ServerProcess) -> int:
    assert server.proc is not None
    return server.proc.pid


async def test_two_workers_serve_one_port_and_share_its_connections(two_workers: ServerProcess) -> None:
    supervisor = _pid(two_workers)
    clients = [httpx.AsyncClient(base_url=two_workers.url, timeout=10) for _ in range(24)]
    try:
        for client in clients:  # each client keeps its connection open
            assert (await client.get("/healthz")).status_code == 200
        holders = _holders(supervisor, two_workers.port)
        assert len(holders) >= 24
        assert set(holders.values()) == _workers(supervisor)  # both workers hold some
    finally:
        for client in clients:
            await client.aclose()


async def test_a_killed_worker_is_replaced_and_its_run_is_taken_over(two_workers: ServerProcess) -> None:
    supervisor = _pid(two_workers)
    before = _workers(supervisor)
    async with AsyncClient(two_workers.url) as client, httpx.AsyncClient(base_url=two_workers.url, timeout=30) as http:
        thread = await client.create_thread()
        body = {"input": {"content": script({"tokens": 40, "delay_ms": 50})}}
        async with http.stream("POST", f"/v1/threads/{thread['id']}/runs", json=body, headers={"Accept": "text/event-stream"}) as stream:
            run_id = stream.headers["X-Run-Id"]
            async for line in stream.aiter_lines():
                if line == "event: token":
                    break
            # The run executes where it was started: the worker holding this stream.
            holders = _holders(supervisor, two_workers.port)
            executor = {pid for pid in holders.values()}
            assert len(executor) == 1
            victim = executor.pop()
            os.kill(victim, signal.SIGKILL)
        async with asyncio.timeout(30):
            while not (len(now := _workers(supervisor)) == 2 and victim not in now):
                await asyncio.sleep(0.05)
        assert len(now - before) == 1  # one new worker in the dead one's place
        async with asyncio.timeout(30):
            while (run := await client.get_run(run_id))["status"] not in ("completed", "failed", "cancelled"):
                await asyncio.sleep(0.1)
        assert run["status"] == "completed"
        log = [e.model_dump() for e in await client.events(run_id, after_seq=0, limit=1000)]
        assert [e["seq"] for e in log] == list(range(1, len(log) + 1))
        assert sum(1 for e in log if e["type"] == "done") == 1
    two_workers.log_path.write_text("")  # the killed worker's end is expected, not an error


async def test_sigterm_drains_every_worker_and_the_runs_finish(two_workers: ServerProcess) -> None:
    supervisor = _pid(two_workers)
    workers = _workers(supervisor)
    async with AsyncClient(two_workers.url) as client:
        thread = await client.create_thread()
        run = await client.start_run(thread["id"], script({"tokens": 10, "delay_ms": 100}))
        async with asyncio.timeout(20):
            while not [e for e in await client.events(run["id"], after_seq=0, limit=100) if e.type == "token"]:
                await asyncio.sleep(0.05)
    assert two_workers.proc is not None
    two_workers.proc.send_signal(signal.SIGTERM)
    code = await asyncio.to_thread(two_workers.proc.wait, 30)
    assert code == 0
    assert not any(Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text() for pid in workers)
    # Drained: the run finished in its worker before that worker exited.
    from tether.store import Store

    store = await Store.open(two_workers.db_url)
    try:
        assert (await store.get_run(run["id"])).status == "completed"
    finally:
        await store.aclose()


def test_several_workers_on_sqlite_are_refused_with_the_reason(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "tether.cli", "demo", "--workers", "2", "--port", str(free_port()), "--db", sqlite_url(tmp_path)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--workers" in done.stderr and "PostgreSQL" in done.stderr
