"""Webhooks on against off: does a configured webhook slow a run's start, and how long do 1,000
interrupts created at once take to reach the receiver?

Run it from the repository root::

    python benchmarks/webhooks.py                       # SQLite, 5 rounds
    python benchmarks/webhooks.py --db postgresql --rounds 5 --interrupts 1000

It starts a receiver (``benchmarks/_webhook_receiver.py``: uvicorn, verifies each signature with
the ``standardwebhooks`` package, answers 204) and two ``tether demo`` servers on fresh
databases, limits lifted: **on** with ``--webhook http://127.0.0.1:<receiver>/hook`` and **off**
without. Both get the same requests.

1. **POST → first token**, ``--runs`` streamed runs one after the other (a new thread each; the
   scripted model answers 5 tokens), on **on** and **off** in interleaved rounds, the order
   alternating per round. Every run of **on** writes a ``run.completed`` notification in its
   final transaction and the sender delivers it while the next run starts. The table shows the
   per-round p50 as median (min–max) over the rounds.
2. **1,000 interrupts at once**, on **on** only: ``--interrupts`` streamed runs started
   together (64 connections at a time), each parking on a gated ``refund`` call, so each writes
   an ``interrupt.created`` notification. Measured from the first request sent: the last run
   parked (its ``interrupt`` event received) and the last ``interrupt.created`` delivered at
   the receiver (its arrival time; all processes share this machine's clock), and deliveries
   repeated or with a bad signature (both must be 0). The parked runs are then cancelled.

Progress goes to stderr, the markdown tables to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from _bench import (
    HERE,
    PgDatabase,
    Server,
    StreamClient,
    free_port,
    http_json,
    machine,
    median,
    open_stream,
    percentile,
    request_bytes,
    tether_argv,
    tether_revision,
)

SECRET = "whsec_" + base64.b64encode(os.urandom(32)).decode()
ANSWER = json.dumps({"script": [{"tokens": 5}]})
PARK = json.dumps({"script": [{"tool_calls": [{"name": "refund", "args": {"order_id": "A1", "amount": 1}}]}, {"tokens": 1}]})


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


async def new_thread(port: int) -> str:
    status, body = await http_json(port, "POST", "/v1/threads", {})
    if status != 201:
        raise SystemExit(f"POST /v1/threads answered {status}: {body}")
    return str(body["id"])


async def first_token_p50(port: int, runs: int) -> float:
    """``runs`` streamed runs one after the other: the median of request sent → first token, ms."""
    first = []
    for _ in range(runs):
        thread = await new_thread(port)
        stream = await open_stream(port, request_bytes("POST", f"/v1/threads/{thread}/runs", port, {"input": {"content": ANSWER}}, sse=True))
        await stream.wait_closed(60)
        stream.check(tokens=5, terminal="done")
        if stream.error:
            raise SystemExit(f"a run went wrong: {stream.error}")
        first.append((stream.first_token_at - stream.sent_at) * 1000)
    return median(first)


async def receiver_stats(port: int) -> dict[str, object]:
    status, body = await http_json(port, "GET", "/stats")
    if status != 200:
        raise SystemExit(f"the receiver answered {status}")
    return dict(body)


async def interrupts_at_once(port: int, receiver: int, count: int, at_once: int) -> dict[str, float]:
    await http_json(receiver, "POST", "/reset")
    threads = [await new_thread(port) for _ in range(count)]
    gate = asyncio.Semaphore(at_once)
    parked: list[StreamClient] = []
    started_wall, started = time.time(), time.perf_counter()

    async def park(thread: str) -> None:
        async with gate:
            stream = await open_stream(port, request_bytes("POST", f"/v1/threads/{thread}/runs", port, {"input": {"content": PARK}}, sse=True))
            await stream.wait_until(lambda: stream.buf.find(b"\nevent: interrupt\n") >= 0, 120)
            parked.append(stream)

    await asyncio.gather(*(park(t) for t in threads))
    last_parked = max(s.time_of_event(s.events) for s in parked) - started
    deadline = time.monotonic() + 600
    while True:
        stats = await receiver_stats(receiver)
        deliveries = dict(stats["deliveries"])  # type: ignore[call-overload]
        created = [arrived for kind, arrived in deliveries.values() if kind == "interrupt.created"]
        if len(created) >= count or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.05)
    for stream in parked:
        run_id = bytes(stream.buf).partition(b"X-Run-Id: ")[2].partition(b"\r\n")[0].decode()
        await http_json(port, "POST", f"/v1/runs/{run_id}/cancel", {"mode": "hard"})
        stream.abort()
    arrivals = sorted(a - started_wall for a in created)
    return {
        "delivered": float(len(created)),
        "last_parked_s": last_parked,
        "p50_delivered_s": percentile(arrivals, 50),
        "last_delivered_s": arrivals[-1] if arrivals else float("nan"),
        "repeats": float(stats["repeats"]),  # type: ignore[arg-type]
        "bad": float(stats["bad"]),  # type: ignore[arg-type]
    }


def spread(values: list[float]) -> str:
    return f"{median(values):.2f} ({min(values):.2f}–{max(values):.2f})"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", choices=("sqlite", "postgresql"), default="sqlite")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=40, help="runs per round for POST → first token")
    parser.add_argument("--interrupts", type=int, default=1000)
    parser.add_argument("--at-once", type=int, default=64)
    args = parser.parse_args()
    os.environ["TETHER_WEBHOOK_SECRET"] = SECRET
    workdir = Path(tempfile.mkdtemp(prefix="tether_webhooks_bench_"))
    databases: list[PgDatabase] = []

    async def db_url(name: str) -> str:
        if args.db == "sqlite":
            return f"sqlite:///{workdir / name}.db"
        databases.append(await PgDatabase().acreate())
        return databases[-1].url

    receiver_port = free_port()
    receiver = Server("receiver", [sys.executable, str(HERE / "_webhook_receiver.py"), "--port", str(receiver_port)], receiver_port, workdir / "receiver.log")
    servers: dict[str, Server] = {}
    try:
        receiver.wait_until_ready()
        for name, extra in (("on", ("--webhook", f"http://127.0.0.1:{receiver_port}/hook")), ("off", ())):
            port = free_port()
            servers[name] = Server(name, tether_argv(port, await db_url(name), *extra), port, workdir / f"{name}.log")
        for server in servers.values():
            server.wait_until_ready()
        for server in servers.values():  # warm both
            await first_token_p50(server.port, 10)
        p50: dict[str, list[float]] = {"on": [], "off": []}
        for r in range(args.rounds):
            for name in ("on", "off") if r % 2 == 0 else ("off", "on"):
                p50[name].append(await first_token_p50(servers[name].port, args.runs))
            say(f"round {r + 1}: on {p50['on'][-1]:.2f} ms, off {p50['off'][-1]:.2f} ms")
        say(f"{args.interrupts} interrupts at once…")
        burst = await interrupts_at_once(servers["on"].port, receiver_port, args.interrupts, args.at_once)
    finally:
        for server in (*servers.values(), receiver):
            server.stop()
        for database in databases:
            await database.adrop()
    print(f"Machine: {machine()}; revision {tether_revision()}; database {args.db}.\n")
    print(f"POST → first token p50, ms, median (min–max) of {args.rounds} interleaved rounds of {args.runs} runs:\n")
    print("| webhooks | POST → first token p50 (ms) |\n|---|---|")
    print(f"| off | {spread(p50['off'])} |\n| on | {spread(p50['on'])} |\n")
    print(f"{args.interrupts} runs parked at once ({args.at_once} connections at a time), seconds from the first request:\n")
    print("| delivered | last run parked | p50 delivery | last delivery | repeats | bad signatures |\n|---|---|---|---|---|---|")
    b = burst
    print(
        f"| {b['delivered']:.0f} | {b['last_parked_s']:.2f} | {b['p50_delivered_s']:.2f} | {b['last_delivered_s']:.2f} | {b['repeats']:.0f} | {b['bad']:.0f} |"
    )


if __name__ == "__main__":
    asyncio.run(main())
