"""Where a paced token's CPU goes: Tether's runtime in one process, beside bare asyncio doing the same wake-ups.

Run it from the repository root (Linux or macOS; no server, no network)::

    python benchmarks/token_cost.py                     # 5 rounds of every scenario
    python benchmarks/token_cost.py --rounds 3 --runs 300

``scale.py`` measures the server's CPU per token through HTTP, where the client, the sockets and
the model's pacing all move the figure. This script takes HTTP away and asks what is left, on
the event loop's own thread (``time.thread_time``) and in the whole process (the SQLite
writer's thread too):

- ``asyncio, paced sleeps``: ``--runs`` tasks, each sleeping until its next token is due
  (``--tokens`` tokens ``--delay-ms`` apart, on its own clock), doing nothing else: what any
  asyncio program pays to be woken once per token (the floor of ``scale.py`` pays this).
- ``asyncio, + a follower``: the same, and each task wakes a second task per token through an
  ``asyncio.Event``: two wake-ups per token, as a model's task and its stream's are.
- ``Tether, paced``: the runtime on a fresh SQLite file (durability on), ``--runs`` runs of the
  scripted model (``{"script": [{"tokens": T, "delay_ms": D}]}``) started at once, each
  followed through the bus (``follow_run``, the path an event stream takes, without its
  socket): CPU per token from the first start to the last run's end.
- ``Tether, zero delay``: 4 runs of 20,000 tokens due at once, followed the same way: the work
  on a token, with batches as large as the group commit makes them.
- ``Tether, runs of one token``: ``--runs`` runs of one token each, started at once and
  followed: what a run's start and end cost, per run. The paced figure includes this once per
  ``--tokens`` tokens.

``--telemetry`` measures the paced runs three ways instead: bare, with the server's telemetry
attached (its latency histograms; tracing off, as ``create_app`` does when no ``OTEL_*``
variable asks for spans), and traced (spans exported with OTLP/HTTP to a receiver in the
measuring process, so the receiver's CPU is not counted).

Each figure is measured in a fresh subprocess, the scenarios taking turns within a round (the
order rotating); the table shows median (min–max) over the rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SCENARIOS = ("asyncio-sleeps", "asyncio-follower", "tether-paced", "tether-zero-delay", "tether-one-token")
#: With --telemetry: the paced runs with the server's telemetry, histograms only and then traced.
TELEMETRY_SCENARIOS = ("tether-paced-metrics", "tether-paced-traced")
#: The CPU times of the figure being measured (filled in by the scenario itself, so that its
#: set-up and tear-down are left out).
_measured: dict[str, float] = {}
LABELS = {
    "asyncio-sleeps": "asyncio, paced sleeps",
    "asyncio-follower": "asyncio, + a follower woken per token",
    "tether-paced": "Tether, paced, each run followed",
    "tether-paced-metrics": "Tether, paced, with telemetry's histograms (tracing off)",
    "tether-paced-traced": "Tether, paced, traced (OTLP/HTTP to a local receiver)",
    "tether-zero-delay": "Tether, zero delay (4 × 20,000 tokens)",
    "tether-one-token": "Tether, runs of one token (per run, not per token)",
}


async def _asyncio_paced(runs: int, tokens: int, delay_s: float, follower: bool) -> int:
    async def one() -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        wake = asyncio.Event()
        done = False

        async def follow() -> None:
            while not done:
                await wake.wait()
                wake.clear()

        task = asyncio.create_task(follow()) if follower else None
        for n in range(1, tokens + 1):
            await asyncio.sleep(max(0.0, start + n * delay_s - loop.time()))
            wake.set()
        done = True
        wake.set()
        if task is not None:
            await task

    await asyncio.gather(*(one() for _ in range(runs)))
    return runs * tokens


async def _tether(runs: int, tokens: int, delay_ms: float, *, telemetry: str = "none") -> int:
    """``telemetry``: ``none`` (the bare runtime), ``metrics`` (the server's telemetry, histograms
    only: what ``create_app`` attaches when no traces are asked for), ``traced`` (and spans,
    exported with OTLP/HTTP to the receiver at ``TOKEN_COST_OTLP``, as a traced server does)."""
    # Imported here: the asyncio scenarios run without Tether's modules in the process.
    from tether.demo import build_demo_agent
    from tether.runtime import Runtime
    from tether.store import AtLeaf

    with tempfile.TemporaryDirectory() as tmp:
        agent = build_demo_agent()
        runtime = await Runtime.open(f"sqlite:///{tmp}/token-cost.db", agent)
        provider: Any = None
        if telemetry != "none":
            from tether.telemetry import Telemetry

            if telemetry == "traced":
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
                from opentelemetry.sdk.trace import TracerProvider
                from opentelemetry.sdk.trace.export import BatchSpanProcessor

                provider = TracerProvider()
                provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=os.environ["TOKEN_COST_OTLP"] + "/v1/traces")))
            runtime.observer = Telemetry(agent, runtime.store, tracer_provider=provider)
        try:
            await runtime.start()
            step: dict[str, float] = {"tokens": tokens}
            if delay_ms:
                step["delay_ms"] = delay_ms
            script = json.dumps({"script": [step]})
            threads = [(await runtime.store.create_thread(owner="local")).id for _ in range(runs)]
            began = time.thread_time(), time.process_time()
            received = 0

            async def one(thread_id: str) -> None:
                nonlocal received
                # Subscribed before the start: the follower gets every event.
                _run, feed = await runtime.start_followed_run(thread_id, attach=AtLeaf(content=script), requester="local")
                async for batch in feed.follow():
                    received += sum(1 for event in batch if event.type == "token")

            await asyncio.gather(*(one(t) for t in threads))
            await runtime.drain(60)  # the runs' ends, after their terminal events
            if provider is not None:
                provider.force_flush()  # the export of the last spans is part of the cost
            _measured.update(loop_s=time.thread_time() - began[0], process_s=time.process_time() - began[1])
        finally:
            await runtime.aclose()
            if provider is not None:
                provider.shutdown()
    if received != runs * tokens:
        raise SystemExit(f"followed {received} tokens of {runs * tokens}")
    return received


def measure_one(scenario: str, runs: int, tokens: int, delay_ms: float) -> dict[str, float]:
    """One figure, in this process (a fresh subprocess of :func:`main`)."""
    import uvloop

    if scenario.startswith("asyncio"):

        async def bare() -> int:
            began = time.thread_time(), time.process_time()
            count = await _asyncio_paced(runs, tokens, delay_ms / 1000, follower=scenario == "asyncio-follower")
            _measured.update(loop_s=time.thread_time() - began[0], process_s=time.process_time() - began[1])
            return count

        count = uvloop.run(bare())
    elif scenario == "tether-paced":
        count = uvloop.run(_tether(runs, tokens, delay_ms))
    elif scenario in ("tether-paced-metrics", "tether-paced-traced"):
        count = uvloop.run(_tether(runs, tokens, delay_ms, telemetry=scenario.rsplit("-", 1)[1]))
    elif scenario == "tether-zero-delay":
        count = uvloop.run(_tether(4, 20_000, 0.0))
    else:
        count = uvloop.run(_tether(runs, 1, 0.0))  # one token a run: the figure is per run
    return {"loop_us": 1e6 * _measured["loop_s"] / count, "process_us": 1e6 * _measured["process_s"] / count}


def _cell(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} ({min(values):.1f}–{max(values):.1f})"


def _otlp_receiver() -> str:
    """A local OTLP/HTTP receiver in this (the measuring) process, answering 200 to every export."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=500, help="paced runs (tasks) at once (default 500)")
    parser.add_argument("--tokens", type=int, default=200, help="tokens per paced run (default 200)")
    parser.add_argument("--delay-ms", type=float, default=20.0, help="between a paced run's tokens (default 20)")
    parser.add_argument(
        "--telemetry", action="store_true", help="the paced runs bare, with the telemetry's histograms, and traced (spans to a local OTLP receiver)"
    )
    parser.add_argument("--one", choices=SCENARIOS + TELEMETRY_SCENARIOS, help=argparse.SUPPRESS)  # a subprocess's single figure
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure_one(args.one, args.runs, args.tokens, args.delay_ms)))
        return
    scenarios = ("tether-paced", *TELEMETRY_SCENARIOS) if args.telemetry else SCENARIOS
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if args.telemetry:
        env["TOKEN_COST_OTLP"] = _otlp_receiver()
    results: dict[str, list[dict[str, float]]] = {s: [] for s in scenarios}
    for r in range(args.rounds):
        for scenario in scenarios[r % len(scenarios) :] + scenarios[: r % len(scenarios)]:
            argv = [sys.executable, __file__, "--one", scenario, "--runs", str(args.runs), "--tokens", str(args.tokens), "--delay-ms", str(args.delay_ms)]
            out = subprocess.run(argv, check=True, capture_output=True, text=True, cwd=REPO, env=env)
            figure = json.loads(out.stdout.strip().splitlines()[-1])
            results[scenario].append(figure)
            print(f"round {r + 1}/{args.rounds} {scenario}: loop {figure['loop_us']:.1f} µs, process {figure['process_us']:.1f} µs per token", file=sys.stderr)
    print(f"\n## CPU per token, and per run (benchmarks/token_cost.py: {args.runs} × {args.tokens} tokens {args.delay_ms:g} ms apart; {args.rounds} rounds)\n")
    print(f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs; median (min–max) over the rounds.\n")
    print("| scenario | event loop's thread (µs per token) | whole process (µs per token) |")
    print("|---|---:|---:|")
    for scenario in scenarios:
        rows = results[scenario]
        print(f"| {LABELS[scenario]} | {_cell([x['loop_us'] for x in rows])} | {_cell([x['process_us'] for x in rows])} |")


if __name__ == "__main__":
    main()
