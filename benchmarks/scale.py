"""Tether at scale, next to an honest floor: many concurrent runs, first token, cancel, memory.

Run it from the repository root (Linux: the CPU and memory figures come from ``/proc``; the
PostgreSQL figures need a server where ``CREATE DATABASE`` works, trust auth is enough)::

    python benchmarks/scale.py                          # every scenario, SQLite and PostgreSQL, 5 rounds
    python benchmarks/scale.py --quick                  # tiny sizes, 2 rounds: does it work? (≈ 1 min)
    python benchmarks/scale.py --only scaleout          # 1, 2 and 3 processes on one PostgreSQL
    python benchmarks/scale.py --db sqlite --only stream,burst --rounds 7 --json out.json
    python benchmarks/scale.py --baseline ../tether-base   # A/B: a worktree's servers beside this one's, same rounds

Three kinds of server, each a subprocess on a free localhost port with the uvicorn settings of
``tether demo``, at log level ``warning``:

- **Tether SQLite** and **Tether PostgreSQL**: ``tether demo`` on a fresh temporary database
  (durability on: every event is committed before it is sent), with the per-caller limits
  lifted (every request comes from the one caller ``local``; the limits are not what is
  measured). The work is the scripted model's: ``{"script": [{"tokens": N, "delay_ms": D}]}``
  streams N token deltas D ms apart on the model's own clock (token n due n × D ms after the
  call starts, as a provider streams whoever reads it; ``--pace gap`` instead waits D ms after
  each token was taken, so that a busy server also slows the model down).
- **The floor** (``benchmarks/_floor_app.py``): a bare Starlette endpoint with no model and no
  store that sends the same events (same count, same envelope shapes and sizes), paced the same
  way. It writes in two ways: *one send per event*, and *batched like Tether* (the events that
  are ready joined into sends of about 64 KiB, as ``tether/server/_sse.py`` does). Ratios are
  against the batched floor, the honest one; the per-event floor is shown beside it.
- **The durable floors** (``_floor_app.py --db``, ``benchmarks/_durable.py``): the batched floor
  writing every event to SQLite (WAL, ``synchronous=NORMAL``) or to PostgreSQL before it sends
  it, with Tether's group-commit policy, and nothing else (no model, auth, validation, runs
  table, leases or ``NOTIFY``). Each Tether column is also judged against the durable floor of
  its own database ("vs durable floor" in the last column).

Scenarios (``--only``, comma-separated; the default is all but ``scaleout``):

- ``structure``: once, before the rounds: a short stream from every server, its events compared
  with the batched floor's after replacing ids and timestamps by placeholders of the same length.
- ``stream``: one stream of 2,000 zero-delay tokens: events/s (request sent → terminal event),
  server CPU per event, and the number of sends (HTTP chunks) it came in.
- ``burst``: 20 runs × 500 zero-delay tokens started at once: aggregate tokens/s (first request
  → last terminal event) and the first token's p50.
- ``paced``: 500 runs × 200 tokens, 20 ms between a run's tokens (each run ideally lasts 4 s),
  all runs started at once (ideal wall time 4 s; ``--paced-interval-ms`` spaces the starts): wall time, first
  token p50/p99 (request sent → first token), p99 of the gaps between the reads that brought
  tokens (all streams pooled), errors (a refused request, a stream cut off or ending otherwise
  than ``done``, a seq gap, a token missing; streams still open 5 × the ideal + 60 s after the
  first start are cut off, and their runs cancelled), and the p50 of a stream's first → last
  token (ideal 199 × 20 ms: with ``--pace gap`` a busy server stretches it).
- ``first-token``: 50 runs one after the other: request sent → first token, p50 and p99.
- ``approve``: a run that asks for the demo's ``refund`` (always gated) and parks; once its
  ``interrupt`` event arrived, ``POST …/resume`` approves it: request sent → the next event on
  the stream (``resumed``). The floor parks a stream and wakes it with a request.
- ``cancel``: a run streaming tokens 10 ms apart is cancelled (``soft``, then ``hard``) after 20
  tokens arrived: cancel request sent → terminal event, and the token events the client received
  after it sent the cancel request. The floor ends a stream on a request: its round trip.
- ``parked``: RSS growth per run parked on an approval (``VmRSS`` before and after N runs park,
  ÷ N); the parked runs are cancelled afterwards.
- ``startup``: process spawned → ``/healthz`` answers, on a fresh database (migrations run) and
  on an existing one; idle RSS one second after the second start.
- ``scaleout``: the paced workload spread round-robin over 1, 2 and 3 ``tether demo`` processes
  on one PostgreSQL database, each client following its run on the process that started it.

Every figure is measured ``--rounds`` times; within a round the servers take turns (the order
rotates from round to round), and the table shows median (min–max) over the rounds. Targets are
judged on the medians, against the floor of the same sitting. Between two scenarios the suite
waits until no Tether server executes a run (``/metrics``). The client is this process: an
asyncio (uvloop) loop of raw-socket connections whose receive path only appends and counts
(``benchmarks/_bench.py``); its CPU is reported.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _bench import (  # noqa: E402  # after the sys.path entry
    DEFAULT_POSTGRES_URL,
    REPO,
    PgDatabase,
    Server,
    StreamClient,
    cpu_seconds,
    floor_argv,
    free_port,
    header,
    http_json,
    machine,
    median,
    normalised,
    open_stream,
    percentile,
    request_bytes,
    rss_bytes,
    tether_argv,
    tether_revision,
    versions,
)

SCENARIOS = ("structure", "stream", "burst", "paced", "first-token", "approve", "cancel", "parked", "startup", "scaleout")
DEFAULT_SCENARIOS = SCENARIOS[:-1]

#: Endpoint keys, in the order of the table's columns.
FLOOR_EVENT, FLOOR, SQLITE, POSTGRES = "floor-event", "floor", "sqlite", "postgres"
#: The durable floors (``_floor_app.py --db``): the floor writing every event to SQLite or
#: PostgreSQL before sending it.
FLOOR_SQLITE, FLOOR_PG = "floor-sqlite", "floor-pg"
DURABLE_FLOOR = {SQLITE: FLOOR_SQLITE, POSTGRES: FLOOR_PG}
#: The same Tether servers running another checkout's code (``--baseline``), for A/B comparisons.
SQLITE_BASE, POSTGRES_BASE = "sqlite-base", "postgres-base"
COLUMNS = {
    FLOOR_EVENT: "floor, one send per event",
    FLOOR: "floor, batched like Tether",
    FLOOR_SQLITE: "durable floor SQLite",
    FLOOR_PG: "durable floor PostgreSQL",
    SQLITE_BASE: "baseline SQLite",
    SQLITE: "Tether SQLite",
    POSTGRES_BASE: "baseline PostgreSQL",
    POSTGRES: "Tether PostgreSQL",
}
#: Whose code each Tether endpoint runs (this checkout unless ``--baseline`` names another).
CODE: dict[str, Path] = {}


@dataclass
class Sizes:
    """The size of every workload (``--quick`` shrinks them all)."""

    stream_tokens: int = 2000
    stream_repeat: int = 3
    burst_runs: int = 20
    burst_tokens: int = 500
    paced_runs: int = 500
    paced_tokens: int = 200
    paced_interval_ms: float = 0.0
    paced_delay_ms: float = 20.0
    #: How the model paces its tokens: ``clock`` (token n due n × the delay after the call
    #: starts, as a provider streams) or ``gap`` (the delay after each token was taken).
    pace: str = "clock"
    #: How long the paced workload may take before the streams still open are cut (0: 5 × the ideal + 60 s).
    paced_timeout_s: float = 0.0
    first_token_runs: int = 50
    approve_runs: int = 10
    cancel_runs: int = 5
    cancel_after: int = 20
    cancel_delay_ms: float = 10.0
    parked_runs: int = 200
    idle_settle_s: float = 1.0
    processes: list[int] = field(default_factory=lambda: [1, 2, 3])

    @property
    def paced_ideal_s(self) -> float:
        return (self.paced_runs - 1) * self.paced_interval_ms / 1000 + self.paced_tokens * self.paced_delay_ms / 1000

    @property
    def paced_cutoff_s(self) -> float:
        return self.paced_timeout_s or self.paced_ideal_s * 5 + 60


QUICK = Sizes(
    stream_tokens=500,
    stream_repeat=2,
    burst_runs=5,
    burst_tokens=100,
    paced_runs=40,
    paced_tokens=20,
    paced_interval_ms=20.0,
    paced_delay_ms=20.0,
    first_token_runs=10,
    approve_runs=3,
    cancel_runs=2,
    cancel_after=10,
    parked_runs=20,
    idle_settle_s=0.5,
    processes=[1, 2],
)


SIZE_HELP = {
    "stream_tokens": "stream: tokens of the one stream",
    "stream_repeat": "stream: streams per round and server (their median is the round's figure)",
    "burst_runs": "burst: runs started at once",
    "burst_tokens": "burst: zero-delay tokens per run",
    "paced_runs": "paced: runs",
    "paced_tokens": "paced: tokens per run",
    "paced_interval_ms": "paced: ms between the starts of two runs",
    "paced_delay_ms": "paced: ms between a run's tokens",
    "pace": "how the model (and the floor) pace tokens: clock (token n due n x the delay after the start, as a provider streams) or gap (the delay after each token was taken: a busy server slows the model)",
    "paced_timeout_s": "paced: seconds after the first start when streams still open are cut off (0: 5 × the ideal + 60)",
    "first_token_runs": "first-token: runs, one after the other",
    "approve_runs": "approve: runs",
    "cancel_runs": "cancel: runs per mode",
    "cancel_after": "cancel: tokens received before the cancel request",
    "cancel_delay_ms": "cancel: ms the model waits before each token",
    "parked_runs": "parked: runs parked on an approval",
    "idle_settle_s": "startup: seconds after the start before the idle RSS is read",
    "processes": "scaleout: process counts to compare",
}


# -- servers as the client sees them --------------------------------------------------------------


@dataclass
class Endpoint:
    """A server under test, as one column of the table (the floor serves two: per event and batched)."""

    key: str
    server: Server
    floor: bool
    batch: bool = True

    @property
    def port(self) -> int:
        return self.server.port

    async def new_threads(self, n: int) -> list[str]:
        """``n`` new threads (not timed); the floor needs none (empty names)."""
        if self.floor:
            return [""] * n
        gate = asyncio.Semaphore(16)

        async def one() -> str:
            async with gate:
                status, body = await http_json(self.port, "POST", "/v1/threads", {})
            if status != 201:
                raise RuntimeError(f"{self.key}: POST /v1/threads answered {status}: {body}")
            return str(body["id"])

        return list(await asyncio.gather(*(one() for _ in range(n))))

    def stream_request(self, thread_id: str, tokens: int, delay_ms: float = 0.0, *, pace: str = "clock", park: bool = False, name: str = "") -> bytes:
        """The request that starts one streamed run of ``tokens`` tokens ``delay_ms`` apart,
        paced by ``pace`` (after a gated call with ``park``)."""
        if self.floor:
            query = f"tokens={tokens}&delay_ms={delay_ms:g}&pace={pace}&batch={int(self.batch)}&park={int(park)}&id={name}"
            return request_bytes("POST", f"/v1/stream?{query}", self.port, {}, sse=True)
        step: dict[str, Any] = {"tokens": tokens}
        if delay_ms:
            step["delay_ms"] = delay_ms
            if pace != "clock":
                step["pace"] = pace
        script = [{"tool_calls": [{"name": "refund", "args": {"order_id": "A1", "amount": 1}}]}, step] if park else [step]
        return request_bytes("POST", f"/v1/threads/{thread_id}/runs", self.port, {"input": {"content": json.dumps({"script": script})}}, sse=True)

    async def cancel(self, stream: StreamClient, name: str, mode: str) -> int:
        if self.floor:
            status, _ = await http_json(self.port, "POST", f"/v1/signal?id={name}&kind=cancel")
        else:
            status, _ = await http_json(self.port, "POST", f"/v1/runs/{_run_id(stream)}/cancel", {"mode": mode})
        return status

    async def approve(self, stream: StreamClient, name: str, thread_id: str) -> int:
        if self.floor:
            status, _ = await http_json(self.port, "POST", f"/v1/signal?id={name}&kind=resume")
            return status
        found = re.search(rb'"interrupt_id":"(int_[0-9a-f]+)"', stream.buf)
        if found is None:
            raise RuntimeError("no interrupt id on the stream")
        payload = {"interrupt_id": found.group(1).decode(), "decisions": [{"decision": "approve"}]}
        status, _ = await http_json(self.port, "POST", f"/v1/threads/{thread_id}/resume", payload)
        return status


def _run_id(stream: StreamClient) -> str:
    head = bytes(stream.buf).partition(b"\r\n\r\n")[0]
    run_id = header(head, "X-Run-Id")
    if not run_id:
        raise RuntimeError(f"no X-Run-Id in the response head: {head[:300]!r}")
    return run_id


async def wait_idle(ep: Endpoint, within: float = 120.0) -> None:
    """Wait until a Tether server executes no run (``tether_executing_runs`` of ``/metrics``), so
    that what one scenario left running does not weigh on the next one."""
    if ep.floor:
        return
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        status, body = await http_json(ep.port, "GET", "/metrics")
        found = re.search(r"^tether_executing_runs (\S+)$", body, re.M) if status == 200 and isinstance(body, str) else None
        if found is None or float(found.group(1)) == 0:
            return
        await asyncio.sleep(0.1)
    ERRORS.add(f"{ep.key} still executed runs {within:.0f} s after the scenario")


async def commit_counts(ep: Endpoint) -> tuple[float, float]:
    """Events published and the transactions that committed them so far (``/metrics``; 0 for the floor)."""
    if ep.floor:
        return 0.0, 0.0
    status, body = await http_json(ep.port, "GET", "/metrics")
    if status != 200 or not isinstance(body, str):
        return 0.0, 0.0
    values = dict(re.findall(r"^(tether_events_published_total|tether_event_commits_total) (\S+)$", body, re.M))
    return float(values.get("tether_events_published_total", 0)), float(values.get("tether_event_commits_total", 0))


def _name() -> str:
    return "s" + os.urandom(6).hex()


class Errors:
    """Problems met while measuring: counted where a figure needs them, all listed at the end."""

    def __init__(self) -> None:
        self.items: list[str] = []
        self.context = ""

    def add(self, message: str) -> None:
        self.items.append(f"{self.context}: {message}")
        print(f"  ! {self.context}: {message}", file=sys.stderr)


ERRORS = Errors()


def _checked(streams: Sequence[StreamClient], *, tokens: int | None, terminal: str | None = "done") -> list[StreamClient]:
    """The streams that are fine (each problem recorded)."""
    ok = []
    problems: dict[str, int] = {}
    for s in streams:
        s.check(tokens=tokens, terminal=terminal)
        if s.error:
            problems[s.error] = problems.get(s.error, 0) + 1
        else:
            ok.append(s)
    for problem, count in problems.items():
        ERRORS.add(f"{count} stream(s): {problem}" if count > 1 else problem)
    return ok


def _ms(seconds: float) -> float:
    return seconds * 1000


# -- scenarios: one round on one endpoint ---------------------------------------------------------


async def scenario_stream(ep: Endpoint, sz: Sizes) -> dict[str, float]:
    """One zero-delay stream at a time, ``stream_repeat`` times: events/s, CPU per event, sends."""
    rates, first, sends = [], [], []
    cpu = client_cpu = events = seconds = 0.0
    for thread in await ep.new_threads(sz.stream_repeat):
        before, client_before = cpu_seconds(ep.server.pid), time.process_time()
        s = await open_stream(ep.port, ep.stream_request(thread, sz.stream_tokens))
        await s.wait_closed(120)
        cpu += cpu_seconds(ep.server.pid) - before
        client_cpu += time.process_time() - client_before
        if _checked([s], tokens=sz.stream_tokens):
            rates.append(s.events / (s.ended_at - s.sent_at))
            first.append(_ms(s.first_token_at - s.sent_at))
            sends.append(len(s.response()[3]))
            events += s.events
            seconds += s.ended_at - s.sent_at
    return {
        "stream.events_per_s": median(rates),
        "stream.first_token_ms": median(first),
        # Summed over the streams: CPU time is counted in ticks (10 ms), too coarse for one short stream.
        "stream.cpu_us_per_event": cpu / events * 1e6 if events else float("nan"),
        "stream.sends": median(sends),
        "stream.client_cpu_pct": client_cpu / seconds * 100 if seconds else float("nan"),
    }


async def scenario_burst(ep: Endpoint, sz: Sizes) -> dict[str, float]:
    """``burst_runs`` zero-delay streams started at once: aggregate tokens/s, first token p50."""
    threads = await ep.new_threads(sz.burst_runs)
    before, client_before = cpu_seconds(ep.server.pid), time.process_time()
    streams = await asyncio.gather(*(open_stream(ep.port, ep.stream_request(t, sz.burst_tokens)) for t in threads))
    await asyncio.gather(*(s.wait_closed(300) for s in streams))
    cpu, client_cpu = cpu_seconds(ep.server.pid) - before, time.process_time() - client_before
    ok = _checked(streams, tokens=sz.burst_tokens)
    if not ok:
        return {}
    wall = max(s.ended_at for s in ok) - min(s.sent_at for s in streams)
    return {
        "burst.tokens_per_s": sum(s.tokens for s in ok) / wall,
        "burst.first_token_p50_ms": median([_ms(s.first_token_at - s.sent_at) for s in ok]),
        "burst.cpu_us_per_token": cpu / sum(s.tokens for s in ok) * 1e6,
        "burst.client_cpu_pct": client_cpu / wall * 100,
        "burst.errors": len(streams) - len(ok),
    }


async def paced_workload(eps: Sequence[Endpoint], sz: Sizes, prefix: str) -> dict[str, float]:
    """``paced_runs`` streams of ``paced_tokens`` tokens ``paced_delay_ms`` apart, started
    ``paced_interval_ms`` apart, round-robin over ``eps``: wall time, first token, gaps, errors."""
    n = sz.paced_runs
    targets = [eps[i % len(eps)] for i in range(n)]
    threads: dict[str, list[str]] = {ep.key: await ep.new_threads(targets.count(ep)) for ep in eps}
    requests = [ep.stream_request(threads[ep.key].pop(), sz.paced_tokens, sz.paced_delay_ms, pace=sz.pace) for ep in targets]
    interval = sz.paced_interval_ms / 1000
    streams: list[StreamClient | None] = [None] * n
    lags: list[float] = []
    cpu_before = {ep.key: cpu_seconds(ep.server.pid) for ep in eps}
    commits_before = {ep.key: await commit_counts(ep) for ep in eps}
    client_before = time.process_time()
    t0 = time.perf_counter() + 0.05

    async def start(i: int) -> None:
        due = t0 + i * interval
        wait = due - time.perf_counter()
        if wait > 0:
            await asyncio.sleep(wait)
        s = streams[i] = await open_stream(targets[i].port, requests[i])
        lags.append(max(0.0, s.sent_at - due))

    await asyncio.gather(*(start(i) for i in range(n)))
    deadline = t0 + sz.paced_cutoff_s
    started = [s for s in streams if s is not None]
    await asyncio.gather(*(s.wait_closed(max(0.0, deadline - time.perf_counter())) for s in started))
    cpu = sum(cpu_seconds(ep.server.pid) - cpu_before[ep.key] for ep in eps)
    client_cpu = time.process_time() - client_before
    commits_after = {ep.key: await commit_counts(ep) for ep in eps}
    published = sum(commits_after[k][0] - commits_before[k][0] for k in commits_after)
    commits = sum(commits_after[k][1] - commits_before[k][1] for k in commits_after)
    # Closing a stream does not cancel its run: cancel the runs of the streams that were cut off.
    for i, s in enumerate(streams):
        if s is not None and not s.ended_at and not targets[i].floor and b"\r\n\r\n" in s.buf:
            await http_json(targets[i].port, "POST", f"/v1/runs/{_run_id(s)}/cancel", {"mode": "hard", "reason": "cut off by the benchmark"})
    ok = _checked(started, tokens=sz.paced_tokens)
    if not started:
        return {f"{prefix}.errors": n}
    # Over every stream, failed ones included: a stream cut off at the deadline stretches it to the deadline.
    wall = max(s.ended_at or s.closed_at for s in started) - min(s.sent_at for s in started)
    tokens = sum(s.tokens for s in started)
    first = [_ms(s.first_token_at - s.sent_at) for s in ok]
    gaps = [_ms(g) for s in ok for g in s.token_gaps()]
    spans = [sum(s.token_gaps()) for s in ok]
    return {
        f"{prefix}.wall_s": wall,
        f"{prefix}.errors": n - len(ok),
        f"{prefix}.tokens_per_s": tokens / wall,
        f"{prefix}.first_token_p50_ms": median(first),
        f"{prefix}.first_token_p99_ms": percentile(first, 99),
        f"{prefix}.gap_p99_ms": percentile(gaps, 99),
        f"{prefix}.span_p50_s": median(spans),
        f"{prefix}.cpu_us_per_token": cpu / tokens * 1e6 if tokens else float("nan"),
        f"{prefix}.client_cpu_pct": client_cpu / wall * 100,
        f"{prefix}.start_lag_p99_ms": _ms(percentile(lags, 99)),
        f"{prefix}.events_per_commit": published / commits if commits else float("nan"),
    }


async def scenario_paced(ep: Endpoint, sz: Sizes) -> dict[str, float]:
    return await paced_workload([ep], sz, "paced")


async def scenario_first_token(ep: Endpoint, sz: Sizes) -> dict[str, float]:
    """Runs one after the other: request sent → first token event received."""
    first = []
    for thread in await ep.new_threads(sz.first_token_runs):
        s = await open_stream(ep.port, ep.stream_request(thread, 5))
        await s.wait_closed(60)
        if _checked([s], tokens=5):
            first.append(_ms(s.first_token_at - s.sent_at))
    return {"first_token.p50_ms": median(first), "first_token.p99_ms": percentile(first, 99)}


async def scenario_approve(ep: Endpoint, sz: Sizes) -> dict[str, float]:
    """A run parks on a gated call; approve request sent → the next event on its stream."""
    latencies = []
    for thread in await ep.new_threads(sz.approve_runs):
        name = _name()
        s = await open_stream(ep.port, ep.stream_request(thread, 5, park=True, name=name))
        try:
            # The interrupt event, whole (its data line ends the read that brought it).
            await s.wait_until(lambda s=s: (i := s.buf.find(b"\nevent: interrupt\n")) >= 0 and s.buf.find(b"\n\n", i) >= 0, 30)
        except (TimeoutError, ConnectionError) as exc:
            ERRORS.add(f"no interrupt event: {exc!r} {bytes(s.buf[-300:])!r}")
            s.abort()
            continue
        parked_events = s.events
        t0 = time.perf_counter()
        status = await ep.approve(s, name, thread)
        await s.wait_closed(60)
        if status not in (200, 202):
            ERRORS.add(f"approve answered {status}")
            continue
        if _checked([s], tokens=5):
            latencies.append(_ms(s.time_of_event(parked_events + 1) - t0))
    return {"approve.p50_ms": median(latencies), "approve.max_ms": max(latencies, default=float("nan"))}


async def scenario_cancel(ep: Endpoint, sz: Sizes) -> dict[str, float]:
    """Paced runs cancelled (soft, then hard) once ``cancel_after`` tokens arrived: cancel
    request sent → terminal event, and the tokens received after the request was sent."""
    out: dict[str, float] = {}
    for mode in ("soft", "hard"):
        latencies, after = [], []
        for thread in await ep.new_threads(sz.cancel_runs):
            name = _name()
            s = await open_stream(ep.port, ep.stream_request(thread, 100_000, sz.cancel_delay_ms, name=name))
            try:
                await s.wait_until(lambda s=s: s.tokens >= sz.cancel_after, 30)
            except (TimeoutError, ConnectionError) as exc:
                ERRORS.add(f"{sz.cancel_after} tokens did not arrive: {exc!r}")
                s.abort()
                continue
            tokens_before = s.tokens
            t0 = time.perf_counter()
            status = await ep.cancel(s, name, mode)
            await s.wait_closed(60)
            if status != 202:
                ERRORS.add(f"{mode} cancel answered {status}")
            if _checked([s], tokens=None, terminal="cancelled"):
                latencies.append(_ms(s.ended_at - t0))
                after.append(s.tokens - tokens_before)
        out[f"cancel_{mode}.p50_ms"] = median(latencies)
        out[f"cancel_{mode}.tokens_after_max"] = max(after, default=float("nan"))
    return out


async def scenario_parked(ep: Endpoint, sz: Sizes) -> dict[str, float]:
    """RSS growth per run parked on an approval: VmRSS before and after ``parked_runs`` runs park, ÷ the runs."""

    async def park(threads: list[str]) -> list[str]:
        gate = asyncio.Semaphore(16)
        content = json.dumps({"script": [{"tool_calls": [{"name": "refund", "args": {"order_id": "A1", "amount": 1}}]}]})

        async def one(thread: str) -> str:
            async with gate:
                status, body = await http_json(ep.port, "POST", f"/v1/threads/{thread}/runs", {"input": {"content": content}})
            if status != 202:
                raise RuntimeError(f"starting a run answered {status}: {body}")
            return str(body["id"])

        runs = list(await asyncio.gather(*(one(t) for t in threads)))
        waiting: set[str] = set()
        deadline = time.monotonic() + 120
        while len(waiting) < len(runs):
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {len(waiting)} of {len(runs)} runs parked within 120 s")
            await asyncio.sleep(0.1)
            for run in runs:
                if run not in waiting:
                    async with gate:
                        _, body = await http_json(ep.port, "GET", f"/v1/runs/{run}")
                    if body["status"] == "waiting_human":
                        waiting.add(run)
                    elif body["status"] not in ("queued", "running"):
                        raise RuntimeError(f"a run to park ended {body['status']}")
        return runs

    async def cancel(runs: list[str]) -> None:
        for run in runs:
            await http_json(ep.port, "POST", f"/v1/runs/{run}/cancel", {"mode": "hard"})

    warm = await park(await ep.new_threads(5))  # the code paths loaded, the pools opened
    await cancel(warm)
    threads = await ep.new_threads(sz.parked_runs)
    await asyncio.sleep(0.5)
    before = rss_bytes(ep.server.pid)
    runs = await park(threads)
    await asyncio.sleep(0.5)
    after = rss_bytes(ep.server.pid)
    await cancel(runs)
    return {"parked.kib_per_run": (after - before) / len(runs) / 1024}


@dataclass
class StartupContext:
    tmp: Path
    postgres_url: str
    round: int


STARTUP: StartupContext | None = None


async def scenario_startup(ep: Endpoint, sz: Sizes) -> dict[str, float]:
    """A new process of the endpoint's kind: spawn → ``/healthz`` answers (fresh database, then
    existing), and its RSS ``idle_settle_s`` after the second start."""
    assert STARTUP is not None
    tmp, n = STARTUP.tmp, STARTUP.round

    def start(argv_of: Callable[[int], list[str]], label: str) -> tuple[float, Server]:
        port = free_port()
        server = Server(f"startup-{label}", argv_of(port), port, tmp / f"startup-{label}-{n}-{port}.log", code=CODE.get(label, REPO))
        return server.wait_until_ready(), server

    async def idle_rss(server: Server) -> float:
        await asyncio.sleep(sz.idle_settle_s)
        return rss_bytes(server.pid) / 2**20

    if ep.floor:
        seconds, server = start(floor_argv, "floor")
        try:
            return {"startup.existing_s": seconds, "startup.idle_rss_mb": await idle_rss(server)}
        finally:
            server.stop()
    db: PgDatabase | None = None
    if ep.key in (POSTGRES, POSTGRES_BASE):
        db = PgDatabase(STARTUP.postgres_url)
        await db.acreate()
        url = db.url
    else:
        url = f"sqlite:///{tmp / f'startup-{n}-{os.urandom(4).hex()}.db'}"
    try:
        fresh, server = start(lambda port: tether_argv(port, url), ep.key)
        server.stop()
        existing, server = start(lambda port: tether_argv(port, url), ep.key)
        try:
            return {"startup.fresh_s": fresh, "startup.existing_s": existing, "startup.idle_rss_mb": await idle_rss(server)}
        finally:
            server.stop()
    finally:
        if db is not None:
            await db.adrop()


Scenario = Callable[[Endpoint, Sizes], Awaitable[dict[str, float]]]

#: Scenario → (function, endpoints it runs on).
_TETHER = (SQLITE, SQLITE_BASE, POSTGRES, POSTGRES_BASE)  # the baselines run only with --baseline
_DURABLE = (FLOOR_SQLITE, FLOOR_PG)  # with --db naming their database
PLAN: dict[str, tuple[Scenario, tuple[str, ...]]] = {
    "stream": (scenario_stream, (FLOOR_EVENT, FLOOR, *_DURABLE, *_TETHER)),
    "burst": (scenario_burst, (FLOOR_EVENT, FLOOR, *_DURABLE, *_TETHER)),
    "paced": (scenario_paced, (FLOOR, *_DURABLE, *_TETHER)),
    "first-token": (scenario_first_token, (FLOOR, *_DURABLE, *_TETHER)),
    "approve": (scenario_approve, (FLOOR, *_DURABLE, *_TETHER)),
    "cancel": (scenario_cancel, (FLOOR, *_DURABLE, *_TETHER)),
    "parked": (scenario_parked, _TETHER),
    "startup": (scenario_startup, (FLOOR, *_TETHER)),
}


async def structure_check(eps: Sequence[Endpoint], tokens: int = 50) -> list[str]:
    """A short stream from every endpoint, compared event by event with the batched floor's after
    normalising ids and timestamps; returns one line per endpoint."""
    bodies: dict[str, list[bytes]] = {}
    lines = []
    for ep in eps:
        (thread,) = await ep.new_threads(1)
        s = await open_stream(ep.port, ep.stream_request(thread, tokens, name=_name()))
        await s.wait_closed(30)
        events = s.check(tokens=tokens)
        status, _, body, sends = s.response()
        bodies[ep.key] = [f"{e.seq} {e.type} ".encode() + normalised(e.data) for e in events]
        lines.append(f"{COLUMNS[ep.key]}: {len(events)} events, {len(body):,} bytes of SSE body in {len(sends)} sends" + (f" — {s.error}" if s.error else ""))
    reference = bodies.get(FLOOR)
    if reference is None:
        return lines
    for i, ep in enumerate(eps):
        got = bodies[ep.key]
        if ep.key == FLOOR or not got or not reference:
            continue
        if got == reference:
            lines[i] += "; identical to the batched floor's events after normalising ids and timestamps"
        else:
            diff = next((k for k, (a, b) in enumerate(zip(got, reference, strict=False)) if a != b), min(len(got), len(reference)))
            mine = got[diff] if diff < len(got) else b"(none)"
            theirs = reference[diff] if diff < len(reference) else b"(none)"
            lines[i] += f"; DIFFERS from the batched floor at event {diff + 1}: {mine[:200]!r} vs {theirs[:200]!r}"
            ERRORS.add(f"structure: {ep.key} differs from the floor at event {diff + 1}")
    return lines


# -- figures and targets -------------------------------------------------------------------------


@dataclass(frozen=True)
class Goal:
    """A target: its text, and a check of a Tether median against the floor's median of the same sitting."""

    text: str
    check: Callable[[float, float, str], tuple[bool, str]]


def at_least_floor(x: float) -> Goal:
    return Goal(f"≥ {x:g}× floor", lambda t, f, db: (t / f >= x, f"{t / f:.2f}×"))


def at_most_floor(x: float) -> Goal:
    return Goal(f"≤ {x:g}× floor", lambda t, f, db: (t / f <= x, f"{t / f:.2f}×"))


def floor_plus(ms: float) -> Goal:
    return Goal(f"≤ floor + {ms:g} ms", lambda t, f, db: (t <= f + ms, f"floor + {t - f:.1f} ms"))


def at_most(limit: float | dict[str, float], unit: str = "") -> Goal:
    if isinstance(limit, dict):
        text = ", ".join(f"≤ {v:g}{unit} {'SQLite' if db == SQLITE else 'PostgreSQL'}" for db, v in limit.items())
        return Goal(text, lambda t, f, db: (t <= limit[db], ""))
    return Goal(f"≤ {limit:g}{unit}" if limit else "0", lambda t, f, db: (t <= limit, ""))


@dataclass(frozen=True)
class Figure:
    key: str
    label: str
    digits: int = 1
    goal: Goal | None = None
    #: A throughput figure PostgreSQL should reach within 1.5× of SQLite (higher or lower is better).
    pg_vs_sqlite: str | None = None


def figures(sz: Sizes) -> list[Figure]:
    paced = f"{sz.paced_runs} × {sz.paced_tokens} tokens, {sz.paced_delay_ms:g} ms apart ({sz.pace}), runs started {sz.paced_interval_ms:g} ms apart"
    return [
        Figure("stream.events_per_s", f"one stream of {sz.stream_tokens:,} tokens: **events/s**", 0, at_least_floor(0.9), "higher"),
        Figure("stream.first_token_ms", "one stream: first token (ms)", 2),
        Figure("stream.cpu_us_per_event", "one stream: server CPU per event (µs)", 1),
        Figure("stream.sends", "one stream: sends (HTTP chunks)", 0),
        Figure("stream.client_cpu_pct", "one stream: client CPU (% of the stream's time)", 0),
        Figure("burst.tokens_per_s", f"{sz.burst_runs} × {sz.burst_tokens} tokens at once: **aggregate tokens/s**", 0, at_least_floor(0.7), "higher"),
        Figure("burst.first_token_p50_ms", f"{sz.burst_runs} × {sz.burst_tokens}: first token p50 (ms)", 1),
        Figure("burst.cpu_us_per_token", f"{sz.burst_runs} × {sz.burst_tokens}: server CPU per token (µs)", 1),
        Figure("burst.client_cpu_pct", f"{sz.burst_runs} × {sz.burst_tokens}: client CPU (% of wall)", 0),
        Figure("burst.errors", f"{sz.burst_runs} × {sz.burst_tokens}: errors", 0),
        Figure("paced.wall_s", f"{paced}: **wall time** (s; ideal {sz.paced_ideal_s:.1f})", 2, at_most_floor(1.3), "lower"),
        Figure("paced.tokens_per_s", "paced: aggregate tokens/s", 0, None, "higher"),
        Figure("paced.first_token_p50_ms", "paced: **first token p50** (ms)", 1, at_most_floor(3)),
        Figure("paced.first_token_p99_ms", "paced: first token p99 (ms)", 1),
        Figure("paced.gap_p99_ms", f"paced: **p99 gap between deliveries** (ms; ideal {sz.paced_delay_ms:g})", 1, at_most_floor(4)),
        Figure("paced.span_p50_s", f"paced: a stream's first → last token, p50 (s; ideal {(sz.paced_tokens - 1) * sz.paced_delay_ms / 1000:.2f})", 2),
        Figure("paced.errors", "paced: **errors**", 0, at_most(0)),
        Figure("paced.cpu_us_per_token", "paced: server CPU per token (µs)", 0),
        Figure("paced.client_cpu_pct", "paced: client CPU (% of wall)", 0),
        Figure("paced.start_lag_p99_ms", "paced: client's start lag p99 (ms)", 2),
        Figure("paced.events_per_commit", "paced: events per transaction (group commit)", 1),
        Figure(
            "first_token.p50_ms", f"POST run → first token, {sz.first_token_runs} runs one at a time: **p50** (ms)", 2, at_most({SQLITE: 5, POSTGRES: 8}, " ms")
        ),
        Figure("first_token.p99_ms", "POST run → first token: p99 (ms)", 2),
        Figure("approve.p50_ms", f"approve → first event after the resume, {sz.approve_runs} runs: **p50** (ms)", 2),
        Figure("approve.max_ms", "approve → first event after the resume: max (ms)", 2),
        Figure("cancel_soft.p50_ms", f"soft cancel → terminal event, {sz.cancel_runs} runs: **p50** (ms)", 2, floor_plus(5)),
        Figure("cancel_soft.tokens_after_max", "soft cancel: **tokens received after the cancel call** (max)", 0, at_most(1)),
        Figure("cancel_hard.p50_ms", "hard cancel → terminal event: p50 (ms)", 2),
        Figure("cancel_hard.tokens_after_max", "hard cancel: tokens received after the cancel call (max)", 0),
        Figure("parked.kib_per_run", f"RSS per run parked on an approval ({sz.parked_runs} runs, KiB)", 1),
        Figure("startup.fresh_s", "start-up, fresh database: spawn → /healthz (s)", 2),
        Figure("startup.existing_s", "start-up, existing database: spawn → /healthz (s)", 2),
        Figure("startup.idle_rss_mb", "**idle RSS** (MiB)", 1, at_most(60, " MiB")),
    ]


Results = dict[str, dict[str, list[float]]]  # figure → endpoint → one value per round


def _cell(values: list[float], digits: int) -> str:
    values = [v for v in values if v == v]  # not NaN
    if not values:
        return "—"
    fmt = f"{{:,.{digits}f}}"
    if len(values) == 1:
        return fmt.format(values[0])
    return f"{fmt.format(median(values))} ({fmt.format(min(values))}–{fmt.format(max(values))})"


def _med(results: Results, key: str, ep: str) -> float:
    values = [v for v in results.get(key, {}).get(ep, []) if v == v]
    return median(values) if values else float("nan")


def _ratio(t: float, d: float, fig: Figure) -> str:
    """Tether's median against its durable floor's (``floor + x ms`` for the latency goals that add)."""
    if "floor +" in (fig.goal.text if fig.goal else ""):
        return f"+{t - d:.1f} ms"
    return f"{t / d:.2f}×" if d else "—"


def main_table(results: Results, sz: Sizes) -> str:
    present = [c for c in COLUMNS if any(c in per for per in results.values())]
    lines = ["| figure | " + " | ".join(COLUMNS[c] for c in present) + " | target | met? |", "|---|" + "---:|" * len(present) + "---|---|"]
    for fig in figures(sz):
        per = results.get(fig.key)
        if not per:
            continue
        cells = [_cell(per.get(c, []), fig.digits) for c in present]
        verdicts = []
        if fig.goal is not None:
            f = _med(results, fig.key, FLOOR)
            for db in (SQLITE, POSTGRES):
                t = _med(results, fig.key, db)
                if t != t:
                    continue
                name = "SQLite" if db == SQLITE else "PG"
                if f != f and "floor" in fig.goal.text:
                    verdicts.append(f"{name}: no floor")
                    continue
                met, note = fig.goal.check(t, f, db)
                verdicts.append(f"{name} {'✓' if met else '✗'}{(' ' + note) if note else ''}")
                d = _med(results, fig.key, DURABLE_FLOOR[db])
                if d == d and "floor" in fig.goal.text:
                    verdicts.append(f"{name} vs durable floor {_ratio(t, d, fig)}")
        lines.append(f"| {fig.label} | " + " | ".join(cells) + f" | {fig.goal.text if fig.goal else ''} | {' · '.join(verdicts)} |")
    return "\n".join(lines)


def pg_table(results: Results, sz: Sizes) -> str | None:
    lines = ["| throughput figure | Tether SQLite | Tether PostgreSQL | PostgreSQL vs SQLite | within 1.5×? |", "|---|---:|---:|---:|---|"]
    for fig in figures(sz):
        if fig.pg_vs_sqlite is None:
            continue
        s, p = _med(results, fig.key, SQLITE), _med(results, fig.key, POSTGRES)
        if s != s or p != p:
            continue
        slower = s / p if fig.pg_vs_sqlite == "higher" else p / s  # how many times worse PostgreSQL is
        lines.append(
            f"| {fig.label} | {s:,.{fig.digits}f} | {p:,.{fig.digits}f} | {slower:.2f}× {'slower' if slower >= 1 else 'faster'} | {'✓' if slower <= 1.5 else '✗'} |"
        )
    return "\n".join(lines) if len(lines) > 2 else None


def scaleout_table(results: Results, sz: Sizes) -> str:
    cols = [("wall_s", "wall time (s)", 2), ("tokens_per_s", "aggregate tokens/s", 0), ("first_token_p50_ms", "first token p50 (ms)", 1)]
    cols += [
        ("first_token_p99_ms", "first token p99 (ms)", 1),
        ("gap_p99_ms", "p99 gap (ms)", 1),
        ("errors", "errors", 0),
        ("cpu_us_per_token", "server CPU per token (µs)", 0),
    ]
    lines = [
        "| processes | " + " | ".join(c[1] for c in cols) + " | tokens/s vs 1 process | first token p50 vs 1 process |",
        "|---:|" + "---:|" * (len(cols) + 2),
    ]
    base_rate, base_first = _med(results, "scaleout.tokens_per_s", "k1"), _med(results, "scaleout.first_token_p50_ms", "k1")
    for k in sz.processes:
        ep = f"k{k}"
        cells = [_cell(results.get(f"scaleout.{c}", {}).get(ep, []), d) for c, _, d in cols]
        rate, first = _med(results, "scaleout.tokens_per_s", ep), _med(results, "scaleout.first_token_p50_ms", ep)
        vs_rate = f"{rate / base_rate:.2f}×" if base_rate == base_rate and rate == rate else "—"
        vs_first = f"{first / base_first:.2f}×" if base_first == base_first and first == first else "—"
        lines.append(f"| {k} | " + " | ".join(cells) + f" | {vs_rate} | {vs_first} |")
    return "\n".join(lines)


# -- running it ----------------------------------------------------------------------------------


def _no_nan(results: Results) -> dict[str, dict[str, list[float | None]]]:
    """``results`` with NaN (a figure that could not be computed) as null, for strict JSON."""
    return {key: {ep: [v if v == v else None for v in values] for ep, values in per.items()} for key, per in results.items()}


def _record(results: Results, values: dict[str, float], ep: str) -> None:
    for key, value in values.items():
        results.setdefault(key, {}).setdefault(ep, []).append(float(value))


def _progress(scenario: str, ep: str, values: dict[str, float]) -> None:
    shown = ", ".join(f"{k} {v:,.2f}" for k, v in values.items())
    print(f"    {scenario:11} {ep:11} {shown}", file=sys.stderr)


def _rotated(items: Sequence[str], n: int) -> list[str]:
    k = n % len(items) if items else 0
    return [*items[k:], *items[:k]]


def run_rounds(runner: asyncio.Runner, eps: dict[str, Endpoint], scenarios: list[str], sz: Sizes, rounds: int, tmp: Path, postgres_url: str) -> Results:
    global STARTUP
    results: Results = {}
    for r in range(rounds):
        print(f"round {r + 1}/{rounds} (load average {os.getloadavg()[0]:.2f})", file=sys.stderr)
        STARTUP = StartupContext(tmp, postgres_url, r)
        for scenario in scenarios:
            if scenario not in PLAN:
                continue
            fn, keys = PLAN[scenario]
            for key in _rotated([k for k in keys if k in eps], r):
                ERRORS.context = f"round {r + 1}, {scenario}, {key}"
                try:
                    values = runner.run(fn(eps[key], sz))
                except Exception as exc:  # one failed measurement must not lose the others
                    ERRORS.add(f"{type(exc).__name__}: {exc}")
                    continue
                _record(results, values, key)
                _progress(scenario, key, values)
                runner.run(wait_idle(eps[key]))
    return results


def run_scaleout(runner: asyncio.Runner, sz: Sizes, rounds: int, tmp: Path, postgres_url: str) -> tuple[Results, str]:
    """The paced workload over 1, 2, 3 … processes on one PostgreSQL database, interleaved per round."""
    results: Results = {}
    db = PgDatabase(postgres_url).create()
    print(f"scale-out: database {db.name} created", file=sys.stderr)
    servers: list[Server] = []
    try:
        for i in range(max(sz.processes)):
            port = free_port()
            servers.append(Server(f"pg-{i + 1}", tether_argv(port, db.url), port, tmp / f"scaleout-{i + 1}.log"))
            if i == 0:
                servers[0].wait_until_ready()  # the first one migrates the fresh database
        for s in servers:
            s.wait_until_ready()
            print(f"  {s.name}: pid {s.pid}, {s.url}", file=sys.stderr)
        eps = [Endpoint(s.name, s, floor=False) for s in servers]
        warm = Sizes(paced_runs=2 * len(eps), paced_tokens=5, paced_delay_ms=1, paced_interval_ms=1)
        runner.run(paced_workload(eps, warm, "warmup"))
        for r in range(rounds):
            print(f"scale-out round {r + 1}/{rounds} (load average {os.getloadavg()[0]:.2f})", file=sys.stderr)
            for k in _rotated([str(k) for k in sz.processes], r):
                ERRORS.context = f"round {r + 1}, scaleout, {k} process(es)"
                try:
                    values = runner.run(paced_workload(eps[: int(k)], sz, "scaleout"))
                except Exception as exc:
                    ERRORS.add(f"{type(exc).__name__}: {exc}")
                    continue
                _record(results, values, f"k{k}")
                _progress("scaleout", f"{k} proc", values)
                for ep in eps[: int(k)]:
                    runner.run(wait_idle(ep))
        if ERRORS.items:
            for s in servers:
                print(f"--- last lines of {s.name}'s log:\n{s.log_tail(1500)}", file=sys.stderr)
    finally:
        for s in servers:
            s.stop()
        describe = db.describe_server()
        db.drop()
        print(f"scale-out: database {db.name} dropped", file=sys.stderr)
    return results, describe


def parse_args() -> tuple[argparse.Namespace, Sizes, list[str]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 5; 2 with --quick)")
    parser.add_argument(
        "--db",
        choices=("sqlite", "postgres", "both", "none"),
        default="both",
        help="Tether's database(s) (default both; none: the floor alone, to check the client)",
    )
    parser.add_argument("--only", default=None, help=f"comma-separated scenarios out of {', '.join(SCENARIOS)}, or 'all' (default: all but scaleout)")
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="worker processes for Tether on PostgreSQL and for the floors (the SQLite ones stay at 1: tether serve refuses more there); default 1",
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes, for checking that it works (a smoke run, not a measurement)")
    parser.add_argument("--json", type=Path, default=None, help="also write the raw per-round figures to this file")
    parser.add_argument(
        "--baseline",
        type=Path,
        default=None,
        help="another checkout of Tether (a git worktree) whose servers run beside this one's in the same interleaved rounds, as extra columns",
    )
    parser.add_argument(
        "--postgres-url", default=DEFAULT_POSTGRES_URL, help=f"a database on the server to create the temporary ones on (default {DEFAULT_POSTGRES_URL})"
    )
    defaults = Sizes()
    for name, value in asdict(defaults).items():
        flag = "--" + name.replace("_", "-")
        what = SIZE_HELP.get(name, "")
        if isinstance(value, list):
            parser.add_argument(flag, type=int, nargs="+", default=None, help=f"{what} (default {' '.join(map(str, value))})")
        elif isinstance(value, str):
            parser.add_argument(flag, choices=("clock", "gap"), default=None, help=f"{what} (default {value})")
        else:
            parser.add_argument(flag, type=type(value), default=None, help=f"{what} (default {value:g}; --quick {getattr(QUICK, name):g})")
    args = parser.parse_args()
    base = QUICK if args.quick else defaults
    sz = Sizes(**{name: getattr(args, name) if getattr(args, name) is not None else getattr(base, name) for name in asdict(defaults)})
    if args.rounds is None:
        args.rounds = 2 if args.quick else 5
    if args.only in (None, ""):
        scenarios = list(DEFAULT_SCENARIOS)
    elif args.only == "all":
        scenarios = list(SCENARIOS)
    else:
        scenarios = [s.strip() for s in args.only.split(",") if s.strip()]
        unknown = [s for s in scenarios if s not in SCENARIOS]
        if unknown:
            parser.error(f"unknown scenario(s): {', '.join(unknown)}; known: {', '.join(SCENARIOS)}")
    return args, sz, scenarios


def main() -> None:
    args, sz, scenarios = parse_args()
    for key in (SQLITE, POSTGRES):
        CODE[key] = REPO
    for key in (SQLITE_BASE, POSTGRES_BASE):
        CODE[key] = args.baseline or REPO
    try:
        import uvloop

        loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = uvloop.new_event_loop
    except ImportError:
        loop_factory = None
    load_start = os.getloadavg()
    results: Results = {}
    scaleout: Results = {}
    structure: list[str] = []
    pg_server = ""
    round_scenarios = [s for s in scenarios if s in PLAN]
    dbs = {"both": [SQLITE, POSTGRES], "none": []}.get(args.db, [args.db])
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tether-scale-") as tmp_name, asyncio.Runner(loop_factory=loop_factory) as runner:
        tmp = Path(tmp_name)
        if round_scenarios or "structure" in scenarios:
            servers: list[Server] = []
            databases: list[PgDatabase] = []
            try:
                eps: dict[str, Endpoint] = {}
                port = free_port()
                workers = ["--workers", str(args.workers)] if args.workers > 1 else []
                floor = Server("floor", [*floor_argv(port), *workers], port, tmp / "floor.log")
                servers.append(floor)
                eps[FLOOR_EVENT] = Endpoint(FLOOR_EVENT, floor, floor=True, batch=False)
                eps[FLOOR] = Endpoint(FLOOR, floor, floor=True, batch=True)
                if SQLITE in dbs:
                    port = free_port()
                    servers.append(s := Server(FLOOR_SQLITE, floor_argv(port, f"sqlite:///{tmp / 'floor.db'}"), port, tmp / "floor-sqlite.log"))
                    eps[FLOOR_SQLITE] = Endpoint(FLOOR_SQLITE, s, floor=True, batch=True)
                if POSTGRES in dbs:
                    pg = PgDatabase(args.postgres_url).create()
                    databases.append(pg)
                    port = free_port()
                    servers.append(s := Server(FLOOR_PG, [*floor_argv(port, pg.url), *workers], port, tmp / "floor-pg.log"))
                    eps[FLOOR_PG] = Endpoint(FLOOR_PG, s, floor=True, batch=True)
                sqlite_keys = [SQLITE, SQLITE_BASE] if args.baseline else [SQLITE]
                postgres_keys = [POSTGRES, POSTGRES_BASE] if args.baseline else [POSTGRES]
                for key in sqlite_keys if SQLITE in dbs else []:
                    port = free_port()
                    servers.append(s := Server(key, tether_argv(port, f"sqlite:///{tmp / f'{key}.db'}"), port, tmp / f"{key}.log", code=CODE[key]))
                    eps[key] = Endpoint(key, s, floor=False)
                for key in postgres_keys if POSTGRES in dbs else []:
                    pg = PgDatabase(args.postgres_url).create()
                    databases.append(pg)
                    print(f"database {pg.name} created", file=sys.stderr)
                    port = free_port()
                    servers.append(s := Server(key, tether_argv(port, pg.url, *workers), port, tmp / f"{key}.log", code=CODE[key]))
                    eps[key] = Endpoint(key, s, floor=False)
                for s in servers:
                    s.wait_until_ready()
                    # The pid is for a profiler: py-spy record --pid <pid> while it runs.
                    print(f"{s.name}: pid {s.pid}, {s.url}", file=sys.stderr)
                if "structure" in scenarios:
                    ERRORS.context = "structure"
                    structure = runner.run(structure_check(list(eps.values())))
                    for line in structure:
                        print(f"  {line}", file=sys.stderr)
                # Warm-up, not measured: each server's code paths loaded, its pools opened.
                warm = Sizes(paced_runs=4, paced_tokens=5, paced_delay_ms=1, paced_interval_ms=1, stream_tokens=200, stream_repeat=1, first_token_runs=2)
                for ep in eps.values():
                    ERRORS.context = f"warm-up, {ep.key}"
                    runner.run(scenario_stream(ep, warm))
                    runner.run(paced_workload([ep], warm, "warmup"))
                    runner.run(wait_idle(ep))
                results = run_rounds(runner, eps, round_scenarios, sz, args.rounds, tmp, args.postgres_url)
                if ERRORS.items:
                    for s in servers:
                        print(f"--- last lines of {s.name}'s log:\n{s.log_tail(1500)}", file=sys.stderr)
            finally:
                for s in servers:
                    s.stop()
                for pg in databases:
                    pg_server = pg.describe_server()
                    pg.drop()
                    print(f"database {pg.name} dropped", file=sys.stderr)
        if "scaleout" in scenarios:
            scaleout, pg_server = run_scaleout(runner, sz, args.rounds, tmp, args.postgres_url)
    elapsed = time.monotonic() - started
    load_end = os.getloadavg()

    print(f"\n## Tether at scale ({'smoke run, --quick sizes: not a measurement' if args.quick else 'benchmarks/scale.py'})\n")
    print(f"Machine: {machine()}; load average {load_start[0]:.2f} at the start, {load_end[0]:.2f} at the end; took {elapsed / 60:.1f} min")
    print(f"Tether: {tether_revision()}")
    if args.baseline:
        print(f'Baseline (the "baseline" columns, same rounds, interleaved): {tether_revision(args.baseline)}')
    print(f"Versions: {versions()}")
    if args.workers > 1:
        print(f"Workers: {args.workers} processes for Tether PostgreSQL and for the floors (SQLite: 1)")
    if pg_server:
        print(f"PostgreSQL: {pg_server}")
    print(
        f"Rounds: {args.rounds}, interleaved (the servers take turns within a round, in an order that rotates); "
        "cells are median (min–max) over the rounds; targets are judged on the medians, ratios against the batched floor."
    )
    if structure:
        print("\nStructure check (a 50-token stream from every server):\n")
        for line in structure:
            print(f"- {line}")
    if results:
        print()
        print(main_table(results, sz))
        table = pg_table(results, sz)
        if table:
            print("\nPostgreSQL against SQLite on the throughput figures (target: within 1.5×):\n")
            print(table)
    if scaleout:
        print(
            f"\nScale-out on one PostgreSQL database: the paced workload ({sz.paced_runs} × {sz.paced_tokens} tokens) spread round-robin over the processes:\n"
        )
        print(scaleout_table(scaleout, sz))
    if ERRORS.items:
        print(f"\n{len(ERRORS.items)} problem(s) met:\n")
        for item in ERRORS.items[:50]:
            print(f"- {item}")
        if len(ERRORS.items) > 50:
            print(f"- … and {len(ERRORS.items) - 50} more")
    if args.json:
        payload = {
            "sizes": asdict(sz),
            "rounds": args.rounds,
            "quick": args.quick,
            "machine": machine(),
            "load_average": [load_start[0], load_end[0]],
            "tether": tether_revision(),
            "versions": versions(),
            "postgres": pg_server,
            "structure": structure,
            "results": _no_nan(results),
            "scaleout": _no_nan(scaleout),
            "errors": ERRORS.items,
        }
        args.json.write_text(json.dumps(payload, indent=1, ensure_ascii=False))
        print(f"\nraw figures written to {args.json}", file=sys.stderr)


if __name__ == "__main__":
    main()
