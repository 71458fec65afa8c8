"""What does Tether add to an MCP tool call? A read-only call through Tether against the same call
made directly with the MCP SDK.

Run it from the repository root (needs the ``mcp`` extra)::

    python benchmarks/mcp_calls.py                      # --calls 200 --rounds 5

The MCP server is ``benchmarks/_mcp_server.py`` (the official SDK's ``MCPServer`` over stdio,
one read-only tool ``lookup_sku`` that answers at once). Each mode makes the same call,
``lookup_sku(sku=…)``, one after another, ``--calls`` in all, split over ``--rounds`` rounds
whose mode order alternates (rounds interleaved):

- **direct SDK**: ``mcp.Client.call_tool`` on a stdio session of its own: the floor.
- **Tether tool**: ``MCPTool.call`` on the session Tether keeps (``tether.mcp.MCPMounts``):
  Tether's MCP layer alone — arguments checked against the ``inputSchema``, the call on the shared
  session, the result made readable.
- **Tether run, MCP**: a run of a ``tether demo --mcp`` server (SQLite, a subprocess) whose scripted
  model asks for the call: the time from its ``tool_call`` event to its ``tool_result`` event, by
  the server's own timestamps (the call inside a run, with its events written to the log), and the
  client's time from ``POST …/runs`` (streamed) to the ``done`` event.
- **Tether run, Python tool**: the same run shape calling the demo's Python ``get_order``: what a run
  costs without the MCP hop.

Each figure is the p50 and p99 of one round's calls; the table gives the median over the rounds
and the min–max. Progress goes to stderr, the markdown table to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from _bench import Server, free_port, machine, median, percentile, tether_argv, tether_revision  # noqa: E402

SERVER = HERE / "_mcp_server.py"


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


async def direct(calls: int) -> list[float]:
    from mcp import Client, StdioServerParameters

    async with Client(StdioServerParameters(command=sys.executable, args=[str(SERVER)]), cache=None) as client:
        await client.call_tool("lookup_sku", {"sku": "warm"})
        times = []
        for i in range(calls):
            began = time.perf_counter()
            await client.call_tool("lookup_sku", {"sku": f"D{i}"})
            times.append(time.perf_counter() - began)
        return times


async def through_tool(calls: int) -> list[float]:
    from tether.mcp import MCP, MCPMounts
    from tether.tools import ToolContext

    mounts = MCPMounts([MCP.stdio(sys.executable, str(SERVER), name="bench")])
    await mounts.start()
    try:
        tool = mounts.get("lookup_sku")
        assert tool is not None, mounts.describe()
        ctx = ToolContext(run_id="run_bench", thread_id="thr_bench", call_id="call_bench")
        await tool.call(tool.validate({"sku": "warm"}), ctx)
        times = []
        for i in range(calls):
            began = time.perf_counter()
            await tool.call(tool.validate({"sku": f"T{i}"}), ctx)
            times.append(time.perf_counter() - began)
        return times
    finally:
        await mounts.aclose()


def _ts(value: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


async def through_runs(url: str, calls: int, tool: str, args: dict[str, Any]) -> tuple[list[float], list[float]]:
    """(tool_call → tool_result by the server's stamps, POST → done by the client's clock) per run."""
    script = json.dumps({"script": [{"tool_calls": [{"name": tool, "args": args}]}, {"text": "Done."}]})
    inside: list[float] = []
    whole: list[float] = []
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        thread = (await http.post("/v1/threads")).json()["id"]
        for _ in range(calls + 1):
            began = time.perf_counter()
            events: list[dict[str, Any]] = []
            async with http.stream(
                "POST", f"/v1/threads/{thread}/runs", json={"input": {"content": script}}, headers={"Accept": "text/event-stream"}
            ) as response:
                assert response.status_code == 200, await response.aread()
                async for line in response.aiter_lines():
                    if line.startswith("data: "):
                        events.append(json.loads(line[6:]))
                        if events[-1]["type"] in ("done", "error", "cancelled"):
                            break
            ended = time.perf_counter()
            assert events[-1]["type"] == "done", events[-1]
            called = next(e for e in events if e["type"] == "tool_call")
            result = next(e for e in events if e["type"] == "tool_result")
            assert result["data"]["status"] == "ok", result
            inside.append(_ts(result["ts"]) - _ts(called["ts"]))
            whole.append(ended - began)
    return inside[1:], whole[1:]  # the first run of a round warms up


def row(name: str, rounds: list[list[float]]) -> str:
    def cell(p: float) -> str:
        values = [percentile(r, p) * 1000 for r in rounds]
        return f"{median(values):.2f} ({min(values):.2f}–{max(values):.2f})"

    return f"| {name} | {sum(len(r) for r in rounds)} | {cell(50)} | {cell(99)} |"


async def main_async(options: argparse.Namespace) -> None:
    per_round = max(1, options.calls // options.rounds)
    results: dict[str, list[list[float]]] = {k: [] for k in ("direct", "tool", "run_mcp", "run_python", "post_mcp", "post_python")}
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        argv = tether_argv(port, f"sqlite:///{tmp}/bench.db", "--mcp", f"bench=stdio:{sys.executable} {SERVER}")
        server = Server("tether", argv, port, Path(tmp) / "tether.log")
        server.wait_until_ready()
        try:
            for n in range(options.rounds):
                order = ["direct", "tool", "runs"] if n % 2 == 0 else ["runs", "tool", "direct"]
                for mode in order:
                    if mode == "direct":
                        results["direct"].append(await direct(per_round))
                    elif mode == "tool":
                        results["tool"].append(await through_tool(per_round))
                    else:
                        inside, whole = await through_runs(server.url, per_round, "lookup_sku", {"sku": "R1"})
                        results["run_mcp"].append(inside)
                        results["post_mcp"].append(whole)
                        inside, whole = await through_runs(server.url, per_round, "get_order", {"order_id": "A1"})
                        results["run_python"].append(inside)
                        results["post_python"].append(whole)
                say(f"round {n + 1}/{options.rounds} done")
        finally:
            server.stop()
    print(f"MCP calls, {options.calls} per mode in {options.rounds} interleaved rounds; {machine()}; tether {tether_revision()}\n")
    print("| mode | calls | p50 ms, median (min–max) | p99 ms, median (min–max) |")
    print("|---|---|---|---|")
    print(row("direct SDK call (`Client.call_tool`)", results["direct"]))
    print(row("Tether's MCP tool (`MCPTool.call`)", results["tool"]))
    print(row("in a run: `tool_call` → `tool_result`, MCP tool", results["run_mcp"]))
    print(row("in a run: `tool_call` → `tool_result`, Python tool", results["run_python"]))
    print(row("a whole run: POST → `done`, MCP tool", results["post_mcp"]))
    print(row("a whole run: POST → `done`, Python tool", results["post_python"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=200, help="calls per mode (default 200)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
