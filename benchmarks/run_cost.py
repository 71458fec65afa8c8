"""Server CPU per run: what one short run costs the server, from its start to its ``done``.

Run it from the repository root::

    python benchmarks/run_cost.py                          # SQLite and PostgreSQL, 4 rounds
    python benchmarks/run_cost.py --db sqlite --baseline /path/to/a/worktree --rounds 6
    python benchmarks/run_cost.py --runs 1000 --tokens 1 --at-once 64   # a crowd of starts

It starts ``tether demo`` (limits lifted, log level ``warning``) on a fresh database, warms it
with ``--warm`` runs, then starts ``--runs`` runs one after another, each a new thread and a
streamed ``POST …/runs`` (``Accept: text/event-stream``) whose scripted model answers ``--tokens`` tokens at once, read to its
``done`` event. The figure is the server process's CPU time (user + system, from ``/proc``)
over those runs, divided by the runs; the wall time per run is printed beside it. One run at a
time keeps the client, not a queue, in charge of the pace, so the CPU time is the start, the
few tokens, and the end of a run: the commits and statements each run costs. ``--at-once N``
keeps N runs under way instead (a crowd of starts: what the first tokens of many simultaneous
starts wait for).

``--baseline DIR`` runs the same rounds on the code in ``DIR`` (a git worktree of another
commit), interleaved with this checkout's, the order alternating per round; the table shows
median (min–max) over the rounds for each. The machine should be otherwise idle.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

from _bench import DEFAULT_POSTGRES_URL, REPO, PgDatabase, Server, cpu_seconds, free_port, http_json, median, open_stream, request_bytes, tether_argv


async def one_run(port: int, content: str, tokens: int) -> None:
    """A new thread and a streamed run on it, read to its terminal event (checked)."""
    status, thread = await http_json(port, "POST", "/v1/threads", {})
    if status != 201:
        raise SystemExit(f"POST /v1/threads answered {status}: {thread}")
    request = request_bytes("POST", f"/v1/threads/{thread['id']}/runs", port, {"input": {"content": content}}, sse=True)
    stream = await open_stream(port, request)
    await stream.wait_closed(60)
    stream.check(tokens=tokens, terminal="done")
    if stream.error:
        raise SystemExit(f"a run went wrong: {stream.error}")


async def measure(server: Server, port: int, runs: int, warm: int, tokens: int, at_once: int = 1) -> tuple[float, float]:
    content = json.dumps({"script": [{"tokens": tokens}]})
    for _ in range(warm):
        await one_run(port, content, tokens)
    gate = asyncio.Semaphore(at_once)

    async def gated() -> None:
        async with gate:
            await one_run(port, content, tokens)

    cpu, wall = cpu_seconds(server.pid), time.perf_counter()
    await asyncio.gather(*(gated() for _ in range(runs)))
    return (cpu_seconds(server.pid) - cpu) / runs * 1000, (time.perf_counter() - wall) / runs * 1000


async def one_round(code: Path, db: str, args: argparse.Namespace, tmp: Path, label: str) -> tuple[float, float]:
    pg = PgDatabase(args.postgres_url) if db == "postgres" else None
    url = (await pg.acreate()).url if pg else f"sqlite:///{tmp / f'{label}-{time.monotonic_ns()}.db'}"
    port = free_port()
    server = Server(label, tether_argv(port, url), port, tmp / f"{label}-{port}.log", code=code)
    try:
        server.wait_until_ready()
        return await measure(server, port, args.runs, args.warm, args.tokens, args.at_once)
    finally:
        server.stop()
        if pg:
            await pg.adrop()


def cell(values: list[float]) -> str:
    return f"{median(values):.2f} ({min(values):.2f}–{max(values):.2f})"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--runs", type=int, default=300, help="measured runs per round")
    parser.add_argument("--warm", type=int, default=30, help="runs before the measured ones")
    parser.add_argument("--tokens", type=int, default=5, help="tokens each run's answer has")
    parser.add_argument("--at-once", type=int, default=1, help="runs under way at once (default 1: one after another)")
    parser.add_argument("--baseline", type=Path, help="a worktree of another commit, measured in the same rounds")
    parser.add_argument("--postgres-url", default=DEFAULT_POSTGRES_URL)
    args = parser.parse_args()
    codes = {"this checkout": REPO, **({"baseline": args.baseline.resolve()} if args.baseline else {})}
    dbs = ["sqlite", "postgres"] if args.db == "both" else [args.db]
    results: dict[tuple[str, str], list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="tether-run-cost-") as tmp:
        for n in range(args.rounds):
            order = list(codes) if n % 2 == 0 else list(reversed(codes))
            for db in dbs:
                for name in order:
                    figures = await one_round(codes[name], db, args, Path(tmp), f"{db}-{n}")
                    results.setdefault((db, name), []).append(figures)
                    print(f"round {n + 1}/{args.rounds} {db:8} {name:13} CPU {figures[0]:.2f} ms/run, wall {figures[1]:.2f} ms/run", flush=True)
    pace = "one after another" if args.at_once == 1 else f"{args.at_once} at once"
    print(f"\n{args.runs} runs of {args.tokens} tokens {pace}, {args.rounds} interleaved rounds: median (min–max)\n")
    print("| database | code | server CPU per run (ms) | wall per run (ms) |\n|---|---|---:|---:|")
    for (db, name), figures in results.items():
        print(f"| {db} | {name} | {cell([c for c, _ in figures])} | {cell([w for _, w in figures])} |")


if __name__ == "__main__":
    asyncio.run(main())
