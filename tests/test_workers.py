"""``tether demo --workers N``: several real worker processes on one port under a supervisor.

Which worker holds a connection is read from ``/proc`` (the socket inodes of each worker's file
descriptors against the kernel's TCP table), so the tests run on Linux only.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
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
        # Through the one connection the stream then takes: the only one open until the kill.
        thread = (await http.post("/v1/threads", json={})).json()
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


#: An agent whose start-up fails while the file named by ``TETHER_TEST_REFUSE_START`` exists:
#: a worker started then exits with status 3, as one that cannot reach its database would.
_FLAKY_AGENT = """
import os

from tether.demo import build_demo_agent

agent = build_demo_agent()
_start = agent.on_startup


async def _refusing_while_flagged(store):
    if os.path.exists(os.environ["TETHER_TEST_REFUSE_START"]):
        raise RuntimeError("refusing to start: the test's flag file exists")
    if _start is not None:
        await _start(store)


agent.on_startup = _refusing_while_flagged
"""


class _Supervisor:
    """``tether serve flaky_agent:agent --workers 2`` on PostgreSQL, its log in a file."""

    def __init__(self, db_url: str, tmp_path: Path) -> None:
        (tmp_path / "flaky_agent.py").write_text(_FLAKY_AGENT)
        self.flag = tmp_path / "refuse-start"
        self.log_path = tmp_path / "supervisor.log"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        argv = [sys.executable, "-m", "tether.cli", "serve", "flaky_agent:agent", "--port", str(self.port), "--db", db_url]
        argv += ["--workers", "2", "--lease-seconds", str(LEASE_S), "--log-level", "warning"]
        with open(self.log_path, "ab") as log:
            env = {**os.environ, "PYTHONUNBUFFERED": "1", "TETHER_TEST_REFUSE_START": str(self.flag)}
            self.proc = subprocess.Popen(argv, cwd=tmp_path, stdout=log, stderr=log, env=env)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    async def serving(self, workers: int = 2) -> None:
        """Wait until ``workers`` workers run and the port answers."""
        async with asyncio.timeout(60):
            while True:
                assert self.proc.poll() is None, self.log()
                if len(_workers(self.proc.pid)) == workers:
                    try:
                        async with httpx.AsyncClient(base_url=self.url, timeout=5) as http:
                            if (await http.get("/healthz")).status_code == 200:
                                return
                    except httpx.TransportError:
                        pass
                await asyncio.sleep(0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


async def test_a_worker_that_cannot_start_during_the_first_boot_stops_the_supervisor(pg_db_url: str, tmp_path: Path) -> None:
    (tmp_path / "refuse-start").touch()
    supervisor = _Supervisor(pg_db_url, tmp_path)
    try:
        code = await asyncio.to_thread(supervisor.proc.wait, 60)
        assert code == 3
        assert "could not start (exit status 3); stopping the others" in supervisor.log()
        assert "restarting it in" not in supervisor.log()
    finally:
        supervisor.stop()


async def test_a_replacement_that_cannot_start_is_retried_with_backoff_while_the_other_worker_serves(pg_db_url: str, tmp_path: Path) -> None:
    supervisor = _Supervisor(pg_db_url, tmp_path)
    try:
        await supervisor.serving()
        first = _workers(supervisor.proc.pid)
        supervisor.flag.touch()  # from now on a new worker cannot start
        victim, survivor = sorted(first)
        os.kill(victim, signal.SIGKILL)
        # Its replacement fails, and so does every later one: restarted with growing waits,
        # while the survivor serves every request and the supervisor stays up.
        delays: list[float] = []
        seen: list[float] = []  # when each wait was first seen here
        async with asyncio.timeout(90), httpx.AsyncClient(base_url=supervisor.url, timeout=10) as http:
            while len(delays) < 3:
                assert supervisor.proc.poll() is None, supervisor.log()
                assert survivor in _workers(supervisor.proc.pid)
                assert (await http.get("/healthz")).status_code == 200
                found = [float(d) for d in re.findall(r"could not start, \d+ in a row in its slot; restarting it in ([\d.]+) s", supervisor.log())]
                if len(found) > len(delays):
                    seen += [time.monotonic()] * (len(found) - len(delays))
                    delays = found
                await asyncio.sleep(0.05)
        assert delays[:3] == [0.5, 1.0, 2.0]  # doubling: no continuous forking
        # Each restart waited its delay at least (seen late by at most a poll of this loop).
        assert seen[2] - seen[1] >= delays[1] - 0.1
        assert f"worker {victim} ended (signal SIGKILL)" in supervisor.log()
        assert survivor in _workers(supervisor.proc.pid)
        # The cause goes away: the next restart serves, and the slot is whole again.
        supervisor.flag.unlink()
        await supervisor.serving(2)
        async with asyncio.timeout(60):
            while not re.search(r"worker \d+ serves \(after \d+ worker\(s\) of its slot ended early\)", supervisor.log()):
                await asyncio.sleep(0.05)
        async with AsyncClient(supervisor.url) as client:
            thread = await client.create_thread()
            run = await client.start_run(thread["id"], script({"tokens": 3}))
            async with asyncio.timeout(30):
                while (await client.get_run(run["id"]))["status"] != "completed":
                    await asyncio.sleep(0.05)
        supervisor.proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(supervisor.proc.wait, 60) == 0
    finally:
        supervisor.stop()


@pytest.mark.parametrize("workers", [2, 1])
async def test_a_second_sigterm_cuts_the_drain_short_and_hands_the_run_over(workers: int, pg_db_url: str, tmp_path: Path) -> None:
    # The drain would wait 10 minutes for a run of 15 minutes: only the second signal ends it.
    args = ("--workers", str(workers), "--lease-seconds", str(LEASE_S), "--drain-seconds", "600")
    db_url = pg_db_url if workers > 1 else sqlite_url(tmp_path)
    server = ServerProcess(db_url, tmp_path / "server.log", extra_args=args)
    await asyncio.to_thread(server.start)
    try:
        assert server.proc is not None
        async with AsyncClient(server.url) as client:
            thread = await client.create_thread()
            run = await client.start_run(thread["id"], script({"tokens": 9000, "delay_ms": 100}))
            async with asyncio.timeout(30):
                while not [e for e in await client.events(run["id"], after_seq=0, limit=100) if e.type == "token"]:
                    await asyncio.sleep(0.05)
        server.proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):  # the worker executing the run has begun to drain it
            while "stopping: waiting up to 600 s for 1 run(s) to finish" not in server.log_path.read_text():
                await asyncio.sleep(0.05)
        server.proc.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(server.proc.wait, 60)
        assert code in (0, -signal.SIGTERM)  # a single server ends by the signal it caught, once stopped
        assert "released 1 run(s)" in server.log_path.read_text()
        from tether.store import Store

        store = await Store.open(db_url)
        try:
            stopped = await store.get_run(run["id"])
        finally:
            await store.aclose()
        assert stopped.status == "running"  # not finished: handed over, for another process or the next start
        assert stopped.executor_id is None
    finally:
        await asyncio.to_thread(server.stop)


def _runs_ended(metrics: str) -> int:
    """``tether_run_duration_seconds_count`` summed over its outcomes: the runs that ended."""
    return sum(int(float(line.rsplit(" ", 1)[1])) for line in metrics.splitlines() if line.startswith("tether_run_duration_seconds_count{"))


def _value(metrics: str, name: str) -> float:
    return next(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines() if line.startswith(name + " "))


async def _connection_to(server: ServerProcess, supervisor: int, worker: int) -> httpx.AsyncClient:
    """A client whose one kept-alive connection a given worker holds."""
    async with asyncio.timeout(30):
        while True:
            before = set(_holders(supervisor, server.port))
            http = httpx.AsyncClient(base_url=server.url, timeout=30)
            assert (await http.get("/healthz")).status_code == 200
            mine = set(_holders(supervisor, server.port)) - before
            if len(mine) == 1 and _holders(supervisor, server.port)[mine.pop()] == worker:
                return http
            await http.aclose()


async def test_metrics_with_two_workers_are_the_whole_server_s_and_never_go_down(two_workers: ServerProcess) -> None:
    supervisor = _pid(two_workers)
    a, b = sorted(_workers(supervisor))
    connections = [await _connection_to(two_workers, supervisor, a), await _connection_to(two_workers, supervisor, b)]
    to_a, to_b = connections
    seen: list[int] = []  # the run counter at each scrape
    started = 0

    async def run_on(http: httpx.AsyncClient) -> None:
        nonlocal started
        thread = (await http.post("/v1/threads", json={})).json()["id"]
        run = (await http.post(f"/v1/threads/{thread}/runs", json={"input": {"content": script({"tokens": 3})}})).json()
        started += 1
        async with asyncio.timeout(30):
            while (await http.get(f"/v1/runs/{run['id']}")).json()["status"] != "completed":
                await asyncio.sleep(0.02)

    async def scrape(http: httpx.AsyncClient) -> str:
        text = (await http.get("/metrics")).text
        seen.append(_runs_ended(text))
        assert seen == sorted(seen), f"the run counter went down: {seen}"
        return text

    async def all_counted(*through: httpx.AsyncClient) -> None:
        async with asyncio.timeout(30):  # the other worker's counts are at most a second old
            while [_runs_ended(await scrape(http)) for http in through] != [started] * len(through):
                await asyncio.sleep(0.05)

    try:
        # Worker a executes two runs for each of b's, and the scrapes alternate between them:
        # each serving its own counts, every scrape of b would be below the scrape of a before it.
        for i in range(10):
            await run_on(to_a)
            await run_on(to_a)
            await run_on(to_b)
            await scrape(to_a if i % 2 else to_b)
        await all_counted(to_a, to_b)
        # A worker killed after its counts were written: they stay in the sum (a counter of the
        # server never goes down when a worker is replaced), its gauges leave it.
        os.kill(b, signal.SIGKILL)
        async with asyncio.timeout(30):
            while not (len(now := _workers(supervisor)) == 2 and b not in now):
                await asyncio.sleep(0.05)
        (c,) = now - {a}
        to_c = await _connection_to(two_workers, supervisor, c)
        connections.append(to_c)
        for i in range(10):
            await run_on(to_c)
            await scrape(to_a if i % 2 else to_c)
        await all_counted(to_a, to_c)
        final = await scrape(to_c)
        assert _runs_ended(final) == started == 40
        assert _value(final, "tether_executing_runs") == 0
        assert _value(final, "tether_events_published_total") >= 40 * 5
        assert len(seen) >= 20
    finally:
        for http in connections:
            await http.aclose()
    two_workers.log_path.write_text("")  # the killed worker's end is expected, not an error
