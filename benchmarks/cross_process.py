"""Several Tether processes on one PostgreSQL: how late do live events arrive through another
process, and how long does a run stall when the process executing it is killed?

Run it from the repository root (PostgreSQL must be reachable; trust auth is enough)::

    python benchmarks/cross_process.py                            # lease 2 s, 3 kills
    python benchmarks/cross_process.py --lease-seconds 2 10 --repeat 5
    python benchmarks/cross_process.py --only takeover --lease-seconds 1 2 4

It creates a fresh temporary database (``tether_bench_<hex>``) on ``--postgres-url``'s server
and drops it at the end, and starts ``tether demo --db postgresql://… --lease-seconds L`` twice,
as subprocesses on free localhost ports: processes **A** and **B**.

1. **Cross-process live latency.** A run is created on B; its script first calls the demo's
   ``sleep`` tool for ``--head-start`` seconds (so both followers are attached before the
   first token), then streams ``--tokens`` token deltas ``--delay-ms`` apart. Two raw-socket
   clients follow it at once with ``GET /v1/runs/{id}/events``: one through A (the events
   cross processes: B commits, PostgreSQL ``NOTIFY``, A reads them back from the store) and
   one through B (the same-process baseline: B's local bus). For each ``token`` event the
   latency is the client's receive time (``time.time()`` right after ``recv`` returned) minus
   the envelope's ``ts``, which B stamped when it emitted the event, before committing it.
   All processes run on this machine, so they share one clock. With ``--burst-tokens`` a
   second run streams that many zero-delay tokens: the same figures under load, and the most
   events/s each path delivers.
2. **Takeover after SIGKILL.** A run is created on A (a long, slow token stream) and followed
   through B. After ``--kill-after`` tokens reached the client, plus a random pause of up to
   one lease-keeper interval (so the kill falls anywhere between two lease renewals), A gets
   SIGKILL. B's lapse watcher takes the run over once A's lease has lapsed, and B continues it
   from its last checkpoint: a ``status`` event with ``stage == "recovering"``, then the
   interrupted model turn again from its start. Measured from the kill: the ``recovering``
   event and the first token after it arriving at the client on B, and the client's longest
   wait for a token (A's last one → the first after the takeover). The run's row in the
   database (``lease_expires_at``, read after the kill and again right after the takeover)
   splits that time into its parts. The run is then cancelled and A restarted, ``--repeat``
   times per ``--lease-seconds`` value (each value gets a fresh pair of processes).
   With ``--stop term`` A gets SIGTERM instead, as a deploy stops a process: it stops the run
   after ``--drain-seconds`` (0 by default here: the run never ends on its own) and releases
   it, and B takes it over at once instead of when the lease lapses.

Each process's CPU (utime + stime of all its threads, from ``/proc/<pid>/stat``) is read
before and after each latency stream. Progress goes to stderr, the markdown tables to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import sqlalchemy as sa

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _bench import Server, cpu_seconds, free_port, machine  # noqa: E402  # after the sys.path entry

TERMINAL_TYPES = ("done", "error", "cancelled")
TERMINAL_MARKERS = tuple(b"\nevent: " + t.encode() + b"\n" for t in TERMINAL_TYPES)
DEFAULT_ADMIN_URL = os.environ.get("TETHER_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


# -- server processes -------------------------------------------------------------------------


class TetherProcess(Server):
    """``tether demo`` on the shared database; ``kill`` sends SIGKILL."""

    def __init__(self, name: str, db_url: str, lease_s: float, log_dir: Path, drain_s: float = 0.0) -> None:
        port = free_port()
        argv = [
            sys.executable,
            "-m",
            "tether.cli",
            "demo",
            "--port",
            str(port),
            "--db",
            db_url,
            "--lease-seconds",
            str(lease_s),
            "--drain-seconds",
            str(drain_s),
            "--log-level",
            "warning",
        ]
        super().__init__(name, argv, port, log_dir / f"{name}-{port}.log")

    def kill(self, sig: int = signal.SIGKILL) -> float:
        """SIGKILL (or ``sig``), and wait for the process to end; returns the ``time.time()``
        just before the signal was sent."""
        t = time.time()
        os.kill(self.pid, sig)
        self.process.wait()
        self._log.close()
        return t


def start_together(*servers: TetherProcess) -> None:
    """Wait for servers started together (they race to migrate a fresh database, as a deployment would)."""
    errors: list[BaseException] = []

    def wait(server: TetherProcess) -> None:
        try:
            server.wait_until_ready()
        except Exception as exc:
            errors.append(exc)

    waiters = [threading.Thread(target=wait, args=(s,)) for s in servers]
    for w in waiters:
        w.start()
    for w in waiters:
        w.join()
    if errors:
        raise errors[0]
    for s in servers:
        # The pid is for a profiler: py-spy record --pid <pid> while the streams run.
        print(f"{s.name}: pid {s.pid}, {s.url}", file=sys.stderr)


# -- the client -------------------------------------------------------------------------------


@dataclass(slots=True)
class Received:
    """One SSE event as the client got it."""

    seq: int
    type: str
    ts: float  # the envelope's ts (epoch seconds)
    recv: float  # time.time() right after the recv that completed it
    data: bytes

    @property
    def latency_ms(self) -> float:
        return (self.recv - self.ts) * 1000

    def payload(self) -> dict[str, Any]:
        return json.loads(self.data)["data"]


def _ts_of(data: bytes) -> float:
    i = data.find(b'"ts":"') + 6
    return datetime.fromisoformat(data[i : data.index(b'"', i)].decode()).timestamp()


class SSEReader:
    """Incremental parser of a raw HTTP/1.1 SSE response (chunked or not)."""

    def __init__(self) -> None:
        self.raw = bytearray()
        self.pos = 0
        self.head: bytes | None = None
        self.status = 0
        self.chunked = False
        self.body = bytearray()
        self.bpos = 0

    def feed(self, data: bytes, recv_time: float) -> list[Received]:
        self.raw += data
        if self.head is None:
            end = self.raw.find(b"\r\n\r\n")
            if end < 0:
                return []
            self.head = bytes(self.raw[:end])
            self.status = int(self.head.split(b" ", 2)[1])
            self.chunked = b"transfer-encoding: chunked" in self.head.lower()
            self.pos = end + 4
        if self.chunked:
            while True:
                eol = self.raw.find(b"\r\n", self.pos)
                if eol < 0:
                    break
                size = int(bytes(self.raw[self.pos : eol]).split(b";")[0], 16)
                end = eol + 2 + size
                if len(self.raw) < end + 2:
                    break
                self.body += self.raw[eol + 2 : end]
                self.pos = end + 2
                if size == 0:
                    break
        else:
            self.body += self.raw[self.pos :]
            self.pos = len(self.raw)
        out: list[Received] = []
        while (end := self.body.find(b"\n\n", self.bpos)) >= 0:
            block = bytes(self.body[self.bpos : end])
            self.bpos = end + 2
            seq, kind, data = None, "message", b""
            for line in block.split(b"\n"):
                if line.startswith(b"id: "):
                    seq = int(line[4:])
                elif line.startswith(b"event: "):
                    kind = line[7:].decode()
                elif line.startswith(b"data: "):
                    data = line[6:]
            if seq is not None:
                out.append(Received(seq, kind, _ts_of(data), recv_time, data))
        return out


class Follower(threading.Thread):
    """``GET /v1/runs/{id}/events`` over a raw socket, in a thread, until the terminal event.

    The receive loop only timestamps and keeps what ``recv`` returns (and looks for a terminal
    marker); the events are parsed afterwards (``live=False``) or as they come (``live=True``,
    for the takeover test, which must react to them; cheap at its rate).
    """

    def __init__(self, server: Server, run_id: str, *, live: bool = False, timeout: float = 300.0) -> None:
        super().__init__(name=f"follow-{server.name}", daemon=True)
        self.server = server
        self.live = live
        self.timeout = timeout
        self.request = (
            f"GET /v1/runs/{run_id}/events HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nAccept: text/event-stream\r\nConnection: close\r\n\r\n"
        ).encode()
        self.reader = SSEReader()
        self.chunks: list[tuple[float, bytes]] = []
        self.events: list[Received] = []
        self.ready_at = 0.0  # time.time() when the response's first bytes arrived
        self.error: BaseException | None = None
        self.client_cpu_s = 0.0

    def run(self) -> None:
        try:
            self._follow()
        except Exception as exc:
            self.error = exc

    def _follow(self) -> None:
        deadline = time.monotonic() + self.timeout
        with socket.create_connection(("127.0.0.1", self.server.port), timeout=5) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(1.0)
            cpu = time.thread_time()
            sock.sendall(self.request)
            tail = b""
            while time.monotonic() < deadline:
                try:
                    data = sock.recv(1 << 18)
                except TimeoutError:
                    continue
                now = time.time()
                if not data:
                    break
                if not self.ready_at:
                    self.ready_at = now
                if self.live:
                    self.events += self.reader.feed(data, now)
                else:
                    self.chunks.append((now, data))
                seam = tail + data[:64]  # a marker may straddle two reads
                if any(m in seam or m in data for m in TERMINAL_MARKERS):
                    break
                tail = data[-64:]
            self.client_cpu_s = time.thread_time() - cpu

    def finish(self) -> list[Received]:
        """Join, parse (if not live) and check: seqs contiguous, a terminal event last."""
        self.join()
        if self.error is not None:
            raise RuntimeError(f"following through {self.server.name} failed") from self.error
        for t, data in self.chunks:
            self.events += self.reader.feed(data, t)
        self.chunks = []
        if self.reader.status != 200:
            raise RuntimeError(f"{self.server.name}: HTTP {self.reader.status}")
        if not self.events or self.events[-1].type not in TERMINAL_TYPES:
            raise AssertionError(f"{self.server.name}: the stream did not end with a terminal event")
        if [e.seq for e in self.events] != list(range(1, len(self.events) + 1)):
            raise AssertionError(f"{self.server.name}: the seqs are not 1..n without a gap")
        return self.events


# -- the database -----------------------------------------------------------------------------


class Database:
    """A temporary database, plus one connection to it for reading run rows."""

    def __init__(self, admin_url: str) -> None:
        self.admin_url = admin_url
        self.name = f"tether_bench_{os.urandom(6).hex()}"
        self.loop = asyncio.new_event_loop()
        self.conn: asyncpg.Connection | None = None
        self.url = sa.engine.make_url(admin_url).set(database=self.name).render_as_string(hide_password=False)

    def _run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    async def _admin(self, sql: str) -> Any:
        conn = await asyncpg.connect(self.admin_url, timeout=10)
        try:
            return await conn.fetch(sql)
        finally:
            await conn.close()

    def create(self) -> None:
        self._run(self._admin(f'CREATE DATABASE "{self.name}"'))

    def drop(self) -> None:
        if self.conn is not None:
            self._run(self.conn.close())
        self._run(self._admin(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)'))
        self.loop.close()

    def run_row(self, run_id: str) -> asyncpg.Record:
        if self.conn is None:
            self.conn = self._run(asyncpg.connect(self.url, timeout=10))
        return self._run(self.conn.fetchrow("SELECT status, executor_id, lease_expires_at FROM runs WHERE id = $1", run_id))

    def describe_server(self) -> str:
        rows = self._run(
            self._admin("SELECT name, setting FROM pg_settings WHERE name IN ('server_version', 'synchronous_commit', 'fsync', 'commit_delay') ORDER BY name")
        )
        return ", ".join(f"{r['name']}={r['setting']}" for r in rows)


# -- 1. live latency --------------------------------------------------------------------------


def script(*steps: dict[str, Any]) -> str:
    return json.dumps({"script": list(steps)})


def start_run(server: Server, content: str) -> str:
    with httpx.Client(base_url=server.url, timeout=30) as http:
        thread = http.post("/v1/threads", json={}).json()
        response = http.post(f"/v1/threads/{thread['id']}/runs", json={"input": {"content": content}})
        response.raise_for_status()
        return str(response.json()["id"])


@dataclass
class Via:
    """What the clients following through one process measured (over one or more streams)."""

    latencies_ms: list[float] = field(default_factory=list)
    excluded: int = 0  # token events emitted before the follower was attached (none expected)
    tokens: int = 0
    seconds: float = 0.0  # first token received → last token received, summed over clients
    server_cpu_s: float = 0.0  # the process's CPU during the streams
    client_cpu_s: float = 0.0
    streams: int = 0
    run_tokens: int = 0  # tokens the runs produced (each counted once, however many clients)

    @property
    def events_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else float("nan")


def measure_live(a: Server, b: Server, steps: dict[str, Any], head_start: float, results: dict[str, Via], *, via_a: int = 1) -> None:
    """One run created on B, followed at once through A (``via_a`` clients) and through B (one)."""
    tokens = int(steps["tokens"])
    run_id = start_run(b, script({"tool_calls": [{"name": "sleep", "args": {"seconds": head_start}}]}, steps))
    cpu = {s.name: cpu_seconds(s.pid) for s in (a, b)}
    timeout = 60 + tokens * (steps.get("delay_ms", 0) / 1000) * 4
    followers = [Follower(a, run_id, timeout=timeout) for _ in range(via_a)] + [Follower(b, run_id, timeout=timeout)]
    for f in followers:
        f.start()
    received = [f.finish() for f in followers]
    cpu = {s.name: cpu_seconds(s.pid) - cpu[s.name] for s in (a, b)}
    for events in received[:-1]:
        if [e.data for e in events] != [e.data for e in received[-1]]:
            raise AssertionError("A and B relayed different events")
    for name in ("A", "B"):
        results[name].server_cpu_s += cpu[name]
        results[name].streams += 1
        results[name].run_tokens += tokens
    for f, events in zip(followers, received, strict=True):
        name = f.server.name
        toks = [e for e in events if e.type == "token"]
        if len(toks) != tokens:
            raise AssertionError(f"{name}: {len(toks)} token events, expected {tokens}")
        live = [e for e in toks if e.ts >= f.ready_at]
        r = results[name]
        r.latencies_ms += [e.latency_ms for e in live]
        r.excluded += len(toks) - len(live)
        r.tokens += len(toks) - 1
        r.seconds += toks[-1].recv - toks[0].recv
        r.client_cpu_s += f.client_cpu_s
    for name in ("A", "B"):
        r = results[name]
        q = percentiles(r.latencies_ms)
        print(
            f"  via {name} ({via_a if name == 'A' else 1} client(s)): latency p50 {q[0]:.2f} ms, p99 {q[2]:.2f} ms, max {q[3]:.2f} ms;"
            f" {r.events_per_s:,.0f} tokens/s; server CPU {r.server_cpu_s:.2f} s; client CPU {r.client_cpu_s:.2f} s (so far)",
            file=sys.stderr,
        )


def percentiles(values: list[float]) -> tuple[float, float, float, float]:
    """p50, p90, p99 (nearest rank) and max."""
    s = sorted(values)

    def rank(p: float) -> float:
        return s[min(len(s) - 1, max(0, int(-(-p * len(s) // 100)) - 1))]

    return rank(50), rank(90), rank(99), s[-1]


def latency_table(scenarios: list[tuple[str, dict[str, Via]]]) -> str:
    def head(label: str, name: str, r: Via) -> str:
        clients = len(r.latencies_ms) // max(1, r.run_tokens) if r.run_tokens else 1
        where = "A (cross-process)" if name == "A" else "B (same process)"
        return f"{label}: via {where}" + (f", {clients} clients" if clients > 1 else "")

    cols = [(label, r, name) for label, r in scenarios for name in ("A", "B")]
    lines = ["| token events | " + " | ".join(head(label, name, r[name]) for label, r, name in cols) + " |", "|---|" + "---:|" * len(cols)]

    def row(label: str, fn: Any) -> None:
        lines.append(f"| {label} | " + " | ".join(fn(r[name]) for _, r, name in cols) + " |")

    row("events measured", lambda r: f"{len(r.latencies_ms):,}")
    for i, p in enumerate(("p50", "p90", "p99", "max")):
        bold = "**" if p in ("p50", "p99") else ""
        row(f"{bold}latency {p} (ms){bold}", lambda r, i=i: f"{percentiles(r.latencies_ms)[i]:,.2f}")
    row("events/s received (per client)", lambda r: f"{r.events_per_s:,.0f}")
    row("server CPU per token of the run (µs)", lambda r: f"{r.server_cpu_s / r.run_tokens * 1e6:,.0f}")
    return "\n".join(lines)


# -- 2. takeover ------------------------------------------------------------------------------


@dataclass
class Takeover:
    kill: float  # time.time() of the SIGKILL (or SIGTERM)
    lease_expiry: float | None  # A's lease on the run, as the database had it after the kill (None: released)
    exited: float  # time.time() once A had exited
    claimed: float | None  # when B claimed the run (from its fresh lease), if still readable
    recovering_emitted: float  # the recovering event's ts
    recovering_received: float
    token_received: float  # the first token after it
    last_token_before_kill: float  # receive time of A's last token at the client

    @property
    def to_recovering(self) -> float:
        return self.recovering_received - self.kill

    @property
    def to_token(self) -> float:
        return self.token_received - self.kill

    @property
    def stall(self) -> float:
        """The client's longest wait for a token: A's last one → the first after the takeover."""
        return self.token_received - self.last_token_before_kill


def measure_takeover(a: TetherProcess, b: TetherProcess, db: Database, lease_s: float, args: argparse.Namespace, rng: random.Random) -> Takeover:
    run_id = start_run(a, script({"tokens": 1_000_000, "delay_ms": args.delay_ms}))
    follower = Follower(b, run_id, live=True, timeout=600)
    follower.start()

    def wait_for(predicate: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if follower.error is not None or not follower.is_alive():
                follower.finish()
                raise RuntimeError(f"the follower stopped while waiting for {what}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {what} within {timeout} s")
            time.sleep(0.002)

    wait_for(lambda: sum(1 for e in follower.events if e.type == "token") >= args.kill_after, 30, f"{args.kill_after} tokens")
    time.sleep(rng.uniform(0, lease_s / 3))  # anywhere between two lease renewals
    if args.stop == "term":
        t_kill = a.kill(signal.SIGTERM)  # returns once A has exited: it released the run
        lease_expiry = None
    else:
        t_kill = a.kill()
    exited = time.time()
    if args.stop == "kill":
        row = db.run_row(run_id)
        if row["executor_id"] is None or row["status"] != "running":
            raise RuntimeError(f"unexpected run row after the kill: {dict(row)}")
        lease_expiry = row["lease_expires_at"].timestamp()

    def recovering() -> Received | None:
        return next((e for e in follower.events if e.type == "status" and e.payload().get("stage") == "recovering"), None)

    wait_for(lambda: recovering() is not None, lease_s * 3 + 30, "recovering event")
    row = db.run_row(run_id)  # before B's next renewal: its lease is still the one it claimed with
    rec = recovering()
    assert rec is not None
    claimed: float | None = row["lease_expires_at"].timestamp() - lease_s
    if not ((lease_expiry or t_kill) <= claimed <= rec.ts):  # type: ignore[operator]
        claimed = None  # already renewed: the claim time is gone
    index = follower.events.index(rec)
    wait_for(lambda: any(e.type == "token" for e in follower.events[index:]), 30, "token after the takeover")
    first = next(e for e in follower.events[index:] if e.type == "token")
    before = [e for e in follower.events[:index] if e.type == "token"]
    with httpx.Client(base_url=b.url, timeout=30) as http:
        http.post(f"/v1/runs/{run_id}/cancel", json={"mode": "hard", "reason": "benchmark done"}).raise_for_status()
    events = follower.finish()
    if events[-1].type != "cancelled":
        raise AssertionError(f"the run ended with {events[-1].type}, not cancelled")
    return Takeover(t_kill, lease_expiry, exited, claimed, rec.ts, rec.recv, first.recv, before[-1].recv)


def takeover_table(results: dict[float, list[Takeover]]) -> tuple[str, str]:
    def ms(values: list[float]) -> str:
        return f"{statistics.median(values) * 1000:,.0f} / {max(values) * 1000:,.0f}"

    lines = [
        "| lease (s) | stops | **stop → `recovering` at the client** (ms) | **stop → first token after it** (ms) | the client's longest wait for a token (ms) | expected after SIGKILL, 2L/3 … L (ms) |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for lease_s, runs in results.items():
        lines.append(
            f"| {lease_s:g} | {len(runs)} | {ms([r.to_recovering for r in runs])} | {ms([r.to_token for r in runs])} | {ms([r.stall for r in runs])} "
            f"| {lease_s * 2000 / 3:,.0f} … {lease_s * 1000:,.0f} |"
        )
    parts = [
        "| lease (s) | stop → A exited | stop → A's lease lapses | lapse (after SIGTERM: the stop) → B claims the run | claim → `recovering` emitted | emitted → received on B | `recovering` → first token received |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for lease_s, runs in results.items():
        known = [r for r in runs if r.claimed is not None]
        lapsed = [r for r in runs if r.lease_expiry is not None]
        lapse_claim = ms([r.claimed - (r.lease_expiry or r.kill) for r in known]) if known else "n/a"  # type: ignore[operator]
        claim_emit = ms([r.recovering_emitted - r.claimed for r in known]) if known else "n/a"  # type: ignore[operator]
        lapse = ms([r.lease_expiry - r.kill for r in lapsed]) if lapsed else "released"  # type: ignore[operator]
        parts.append(
            f"| {lease_s:g} | {ms([r.exited - r.kill for r in runs])} | {lapse} | {lapse_claim} | {claim_emit} "
            f"| {ms([r.recovering_received - r.recovering_emitted for r in runs])} | {ms([r.token_received - r.recovering_received for r in runs])} |"
        )
    return "\n".join(lines), "\n".join(parts)


# -- main -------------------------------------------------------------------------------------


def versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    found = []
    for name in ("tether", "uvicorn", "uvloop", "starlette", "sqlalchemy", "asyncpg"):
        try:
            found.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            pass
    return ", ".join(found)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--postgres-url",
        default=DEFAULT_ADMIN_URL,
        help=f"a database on the server to create the temporary one on (default {DEFAULT_ADMIN_URL}, or $TETHER_TEST_POSTGRES_URL)",
    )
    parser.add_argument("--only", choices=("latency", "takeover"), help="run one of the two measurements")
    parser.add_argument("--tokens", type=int, default=2000, help="tokens of the paced latency stream (default 2000)")
    parser.add_argument("--delay-ms", type=float, default=5.0, help="pause before each token, latency stream and killed run (default 5)")
    parser.add_argument("--streams", type=int, default=1, help="paced latency streams, their samples pooled (default 1)")
    parser.add_argument("--burst-tokens", type=int, default=20000, help="tokens of the zero-delay stream (default 20000; 0: skip it)")
    parser.add_argument("--fanout", type=int, default=10, help="clients following one more paced stream through A (default 10; 0: skip it)")
    parser.add_argument(
        "--head-start", type=float, default=0.5, help="seconds the run waits (a sleep tool call) before streaming, so the followers attach first (default 0.5)"
    )
    parser.add_argument(
        "--lease-seconds",
        type=float,
        nargs="+",
        default=[2.0],
        metavar="L",
        help="lease(s) to measure takeover with, a fresh pair of processes each (default 2; tether's default is 10)",
    )
    parser.add_argument("--repeat", type=int, default=3, help="kills per lease value (default 3)")
    parser.add_argument("--kill-after", type=int, default=50, help="tokens the client on B must have received before A is killed (default 50)")
    parser.add_argument(
        "--stop", choices=("kill", "term"), default="kill", help="how A is stopped: SIGKILL (a crash; default) or SIGTERM (a deploy: A releases the run)"
    )
    parser.add_argument("--drain-seconds", type=float, default=0.0, help="A's --drain-seconds with --stop term (default 0)")
    parser.add_argument("--seed", type=int, default=None, help="seed of the random pause before each kill")
    args = parser.parse_args()
    rng = random.Random(args.seed)

    db = Database(args.postgres_url)
    db.create()
    print(f"database {db.name} created", file=sys.stderr)
    paced = {n: Via() for n in "AB"}
    burst = {n: Via() for n in "AB"} if args.burst_tokens else None
    fanout = {n: Via() for n in "AB"} if args.fanout else None
    takeovers: dict[float, list[Takeover]] = {}
    load = os.getloadavg()
    try:
        with tempfile.TemporaryDirectory(prefix="tether-bench-") as tmp:
            for i, lease_s in enumerate(args.lease_seconds):
                if i > 0 and args.only == "latency":
                    break
                a = TetherProcess("A", db.url, lease_s, Path(tmp), args.drain_seconds)
                b = TetherProcess("B", db.url, lease_s, Path(tmp), args.drain_seconds)
                try:
                    start_together(a, b)
                    if i == 0 and args.only != "takeover":
                        for n in range(args.streams):
                            print(f"paced stream {n + 1}/{args.streams}: {args.tokens} tokens, {args.delay_ms:g} ms apart", file=sys.stderr)
                            measure_live(a, b, {"tokens": args.tokens, "delay_ms": args.delay_ms}, args.head_start, paced)
                        if burst is not None:
                            print(f"burst: {args.burst_tokens} zero-delay tokens", file=sys.stderr)
                            measure_live(a, b, {"tokens": args.burst_tokens}, args.head_start, burst)
                        if fanout is not None:
                            print(f"fan-out: {args.tokens} tokens, {args.delay_ms:g} ms apart, {args.fanout} clients through A", file=sys.stderr)
                            measure_live(a, b, {"tokens": args.tokens, "delay_ms": args.delay_ms}, args.head_start, fanout, via_a=args.fanout)
                    if args.only == "latency":
                        continue
                    runs = takeovers.setdefault(lease_s, [])
                    for n in range(args.repeat):
                        if a.process.poll() is not None:
                            a = TetherProcess("A", db.url, lease_s, Path(tmp), args.drain_seconds)
                            start_together(a)
                        t = measure_takeover(a, b, db, lease_s, args, rng)
                        runs.append(t)
                        print(
                            f"lease {lease_s:g} s, kill {n + 1}/{args.repeat}: recovering after {t.to_recovering * 1000:,.0f} ms, "
                            f"first token after {t.to_token * 1000:,.0f} ms, longest wait for a token {t.stall * 1000:,.0f} ms",
                            file=sys.stderr,
                        )
                finally:
                    for s in (a, b):
                        s.stop()
        server = db.describe_server()
    finally:
        db.drop()
        print(f"database {db.name} dropped", file=sys.stderr)

    print("\nSeveral Tether processes on one PostgreSQL (localhost)")
    print(f"Machine: {machine()}; load average {load[0]:.2f} at the start")
    print(f"PostgreSQL: {server}")
    print(f"Versions: {versions()}\n")
    if args.only != "takeover":
        scenarios = [("paced", paced)] + ([("burst", burst)] if burst else []) + ([("fan-out", fanout)] if fanout else [])
        print(
            f"Live latency = receive time at the client − the event's ts. One run created on B per stream, followed at once "
            f"through A and through B. paced: {args.tokens:,} tokens {args.delay_ms:g} ms apart × {args.streams} stream(s)"
            + (f"; burst: {args.burst_tokens:,} zero-delay tokens" if burst else "")
            + (f"; fan-out: the paced stream with {args.fanout} clients through A" if fanout else "")
            + ".\n"
        )
        print(latency_table(scenarios))
        excluded = sum(r.excluded for _, v in scenarios for r in v.values())
        if excluded:
            print(f"\n({excluded} token events emitted before their client was attached were left out.)")
    if takeovers:
        summary, parts = takeover_table(takeovers)
        how = "SIGKILL" if args.stop == "kill" else f"SIGTERM (--drain-seconds {args.drain_seconds:g})"
        print(f"\nTakeover after {how} of the executing process, median / max over the stops (run of {args.delay_ms:g} ms tokens, followed through B):\n")
        print(summary)
        print("\nWhere the time goes (median / max, ms):\n")
        print(parts)


if __name__ == "__main__":
    main()
