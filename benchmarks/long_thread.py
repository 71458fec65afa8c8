"""Long threads: does the next run's first token come as fast on a 100,000-message thread as on a
10-message one?

Run it from the repository root::

    python benchmarks/long_thread.py                       # SQLite, 10 and 100,000 messages
    python benchmarks/long_thread.py --sizes 10 10000 100000 --runs 20
    python benchmarks/long_thread.py --db postgresql://postgres@127.0.0.1:5432/postgres

For each size it builds a thread of that many messages (one chain: user and assistant turns,
inserted in bulk), then starts ``--runs`` runs on it one after the other through the
:class:`~tether.runtime.Runtime` (in process: no HTTP, so the figure is the runtime's own) with
the scripted model answering a short text, and measures the time from ``start_run`` to the
first ``token`` event reaching a follower. It also times the two ways of reading the path to the
leaf: what a run reads now (``Store.path_to(limit=…)``, one recursive query as deep as the
agent's history policy keeps) and the whole path (``Store.path_to`` without a limit, the same
recursive query to the root), against the old way (every message of the thread, then a walk in
Python). With ``--db postgresql://…`` each size gets a fresh database on that server.
Progress goes to stderr, the markdown table to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from contextlib import aclosing
from datetime import timedelta

import asyncpg
import sqlalchemy as sa

from tether import Agent, HistoryPolicy, ScriptedModel
from tether._ids import utcnow
from tether.runtime import Runtime, follow_run
from tether.store import AtLeaf, Store
from tether.store._tables import messages, threads


async def build_thread(store: Store, size: int) -> str:
    """A thread whose active path is ``size`` messages long (inserted in bulk)."""
    thread = await store.create_thread(owner="bench")
    start = utcnow()
    rows = []
    parent = None
    for n in range(size):
        message_id = f"msg_{thread.id[4:]}_{n:07d}"
        role = "user" if n % 2 == 0 else "assistant"
        rows.append(
            {
                "id": message_id,
                "thread_id": thread.id,
                "parent_id": parent,
                "run_id": None,
                "role": role,
                "content": f"message {n} " + "lorem ipsum " * 8,
                "tool_calls": None,
                "tool_call_id": None,
                "name": None,
                "status": "complete",
                "created_at": start + timedelta(microseconds=n),
                "edited_from_id": None,
            }
        )
        parent = message_id
    async with store.engine.begin() as conn:
        for chunk in range(0, len(rows), 5000):
            await conn.execute(messages.insert(), rows[chunk : chunk + 5000])
        await conn.execute(threads.update().where(threads.c.id == thread.id).values(active_leaf_id=parent))
    return thread.id


async def first_token_s(runtime: Runtime, thread_id: str) -> float:
    started = time.perf_counter()
    run = await runtime.start_run(thread_id, attach=AtLeaf(content="hello again"))
    async with aclosing(follow_run(runtime.store, runtime.bus, run.id)) as batches:
        async for batch in batches:
            if any(e.type == "token" for e in batch):
                elapsed = time.perf_counter() - started
                break
    async with aclosing(follow_run(runtime.store, runtime.bus, run.id)) as batches:
        async for _ in batches:
            pass  # to its end: the next run needs the thread free
    return elapsed


async def old_path(store: Store, thread_id: str, leaf: str) -> int:
    by_id = {m.id: m for m in await store.thread_messages(thread_id)}
    path, cursor = [], leaf
    while cursor in by_id:
        path.append(cursor)
        cursor = by_id[cursor].parent_id  # type: ignore[assignment]
    return len(path)


async def timed(coro_factory, repeat: int) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        await coro_factory()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


async def measure(db_url: str, size: int, runs: int) -> dict[str, float]:
    agent = Agent(ScriptedModel(word_delay_s=0), history=HistoryPolicy())
    runtime = await Runtime.open(db_url, agent)
    await runtime.start()
    try:
        thread_id = await build_thread(runtime.store, size)
        print(f"  {size} messages stored", file=sys.stderr)
        tokens = [await first_token_s(runtime, thread_id) for _ in range(runs)]
        leaf = (await runtime.store.get_thread(thread_id)).active_leaf_id
        limit = HistoryPolicy().max_messages + 1
        return {
            "first_token_ms": statistics.median(tokens) * 1000,
            "first_token_p90_ms": sorted(tokens)[int(0.9 * (len(tokens) - 1))] * 1000,
            "path_limited_ms": await timed(lambda: runtime.store.path_to(thread_id, leaf, limit=limit), 5) * 1000,
            "path_whole_ms": await timed(lambda: runtime.store.path_to(thread_id, leaf), 3) * 1000,
            "path_old_ms": await timed(lambda: old_path(runtime.store, thread_id, leaf), 3) * 1000,  # type: ignore[arg-type]
        }
    finally:
        await runtime.aclose()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 100_000])
    parser.add_argument("--runs", type=int, default=10, help="runs per size (the median first token is reported)")
    parser.add_argument("--db", default="sqlite", help="'sqlite' (a temporary file) or a postgresql:// admin URL")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes:
            print(f"size {size}", file=sys.stderr)
            if args.db == "sqlite":
                figures = await measure(f"sqlite:///{tmp}/bench-{size}.db", size, args.runs)
            else:
                name = f"tether_bench_{os.urandom(4).hex()}"
                admin = await asyncpg.connect(args.db)
                await admin.execute(f'CREATE DATABASE "{name}"')
                try:
                    figures = await measure(sa.engine.make_url(args.db).set(database=name).render_as_string(hide_password=False), size, args.runs)
                finally:
                    await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                    await admin.close()
            rows.append((size, figures))
    print(
        "| messages on the path | first token, median (p90) | path read by a run (≤ 501 messages) | whole path, recursive query | whole tree + walk (before) |"
    )
    print("|---:|---:|---:|---:|---:|")
    for size, f in rows:
        print(
            f"| {size:,} | {f['first_token_ms']:.1f} ms ({f['first_token_p90_ms']:.1f}) | {f['path_limited_ms']:.1f} ms "
            f"| {f['path_whole_ms']:.1f} ms | {f['path_old_ms']:.1f} ms |"
        )


if __name__ == "__main__":
    asyncio.run(main())
