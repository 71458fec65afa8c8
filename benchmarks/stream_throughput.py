"""How fast does a Tether run stream, next to the fastest SSE stream Starlette + uvicorn can send?

Run it from the repository root::

    python benchmarks/stream_throughput.py              # --tokens 20000 --repeat 3
    python benchmarks/stream_throughput.py --tokens 5000 --repeat 5

It starts two servers as subprocesses on free localhost ports, with the uvicorn settings
``tether demo`` uses:

- **Tether**: ``tether demo`` on a fresh temporary SQLite database (durability on, the
  default: every event is committed before it is sent). Each measured stream is
  ``POST /v1/threads/{id}/runs`` with ``Accept: text/event-stream`` and the scripted-model
  content ``{"script": [{"tokens": N}]}``: N zero-delay token deltas.
- **The floor** (``benchmarks/_floor_app.py``): a bare Starlette endpoint that writes the same
  events (same count, same envelope shape and size), encoded ahead of time, one chunk per
  event, with no store. Tether joins the events that are ready into sends of about 64 KiB,
  which this floor does not: ``--batched-floor`` makes it write that way too (the honest
  floor; ``benchmarks/scale.py`` reports both), and ``--durable-floor`` makes it also write
  every event to SQLite before sending it (``benchmarks/_durable.py``).

The client is a raw socket (no HTTP library in the timed path): it sends the request, then
only appends what ``recv`` returns and looks for three markers with ``bytearray.find``
(seq 1, the first ``token`` event, the terminal event). Counting and checking the events
(seq contiguity, the number of tokens) happens after the clock stops. Its own CPU time is
reported, to show it is not the bottleneck.

Figures are medians over ``--repeat`` streams per server (after ``--warmup`` unmeasured
ones), with Tether and the floor interleaved. Server CPU is the child's utime + stime from
``/proc/<pid>/stat`` (all its threads, including SQLite's), read before the request and after
the response ends.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _bench import Server, cpu_seconds, floor_argv, free_port, machine, tether_argv  # noqa: E402  # after the sys.path entry

TERMINAL_MARKERS = (b"\nevent: done\n", b"\nevent: error\n", b"\nevent: cancelled\n")

#: The speed this stage of Tether aims for, as a fraction of the floor's events/s.
TARGET_RATIO = 0.3


@dataclass
class Stream:
    """One measured stream."""

    seconds: float  # request sent → terminal event received
    first_event_s: float  # request sent → seq 1 received
    first_token_s: float  # request sent → first token event received
    events: int
    tokens: int
    bytes: int
    server_cpu_s: float
    client_cpu_s: float

    @property
    def events_per_s(self) -> float:
        return self.events / self.seconds


def _dechunk(raw: bytes) -> bytes:
    """The body of a ``Transfer-Encoding: chunked`` response."""
    out = bytearray()
    pos = 0
    while True:
        eol = raw.index(b"\r\n", pos)
        size = int(raw[pos:eol].split(b";")[0], 16)
        if size == 0:
            return bytes(out)
        out += raw[eol + 2 : eol + 2 + size]
        pos = eol + 2 + size + 2


def check_events(body: bytes, tokens: int) -> tuple[int, int]:
    """Count the SSE events of ``body`` and check them: seqs 1..n without a gap, the right
    number of tokens, a terminal event last. Returns (events, token events)."""
    seqs: list[int] = []
    types: list[str] = []
    for block in body.split(b"\n\n"):
        seq = kind = None
        for line in block.split(b"\n"):
            if line.startswith(b"id: "):
                seq = int(line[4:])
            elif line.startswith(b"event: "):
                kind = line[7:].decode()
        if seq is not None:
            seqs.append(seq)
            types.append(kind or "message")
    if seqs != list(range(1, len(seqs) + 1)):
        raise AssertionError("the seqs are not 1..n without a gap")
    token_events = types.count("token")
    if token_events != tokens:
        raise AssertionError(f"expected {tokens} token events, got {token_events}")
    if types[-1] not in ("done", "error", "cancelled"):
        raise AssertionError(f"the last event is {types[-1]!r}, not a terminal event")
    return len(seqs), token_events


def measure_stream(server: Server, path: str, body: bytes, tokens: int) -> Stream:
    """Send one POST over a raw socket and read its SSE response to the terminal event."""
    request = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nAccept: text/event-stream\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body
    buf = bytearray()
    first_event = first_token = terminal = 0.0
    with socket.create_connection(("127.0.0.1", server.port), timeout=120) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        cpu_before = cpu_seconds(server.pid)
        client_before = time.process_time()
        start = time.perf_counter()
        sock.sendall(request)
        while True:
            data = sock.recv(1 << 18)
            if not data:
                break
            scan = max(0, len(buf) - 32)  # a marker may straddle two reads
            buf += data
            if not first_event and buf.find(b"\nid: 1\n", scan) >= 0:
                first_event = time.perf_counter() - start
            if not first_token and buf.find(b"\nevent: token\n", scan) >= 0:
                first_token = time.perf_counter() - start
            if any(buf.find(marker, scan) >= 0 for marker in TERMINAL_MARKERS):
                terminal = time.perf_counter() - start
                break
        client_cpu = time.process_time() - client_before
        # Read the end of the response (the last chunk, then the close), then count its CPU.
        while data:
            data = sock.recv(1 << 18)
            buf += data
        server_cpu = cpu_seconds(server.pid) - cpu_before
    if not terminal:
        raise RuntimeError(f"{server.name}: the stream ended without a terminal event:\n{bytes(buf[-2000:])!r}")
    head, _, raw_body = bytes(buf).partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0]
    if b" 200 " not in status_line:
        raise RuntimeError(f"{server.name}: {status_line.decode()}")
    sse = _dechunk(raw_body) if b"transfer-encoding: chunked" in head.lower() else raw_body
    events, token_events = check_events(sse, tokens)
    return Stream(terminal, first_event, first_token, events, token_events, len(sse), server_cpu, client_cpu)


def tether_stream(server: Server, tokens: int) -> Stream:
    thread = httpx.post(server.url + "/v1/threads", json={}, timeout=30).json()
    content = json.dumps({"script": [{"tokens": tokens}]})
    body = json.dumps({"input": {"content": content}}).encode()
    return measure_stream(server, f"/v1/threads/{thread['id']}/runs", body, tokens)


def floor_stream(server: Server, tokens: int, batch: bool = False) -> Stream:
    httpx.post(server.url + f"/v1/prepare?tokens={tokens}", timeout=60).raise_for_status()
    return measure_stream(server, f"/v1/stream?tokens={tokens}&batch={int(batch)}", b"{}", tokens)


def versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    names = ("tether", "uvicorn", "starlette", "fastapi", "sqlalchemy", "aiosqlite", "pydantic", "uvloop", "httptools")
    found = []
    for name in names:
        try:
            found.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            pass
    return ", ".join(found)


def _fmt(value: float, digits: int) -> str:
    return f"{value:,.{digits}f}"


def table(tether: list[Stream], floor: list[Stream]) -> str:
    def med(runs: list[Stream], attr: str) -> float:
        return statistics.median(getattr(r, attr) for r in runs)

    rows: list[tuple[str, str, str, str]] = []

    def row(label: str, attr: str, scale: float, digits: int, ratio: bool = False) -> None:
        t, f = med(tether, attr) * scale, med(floor, attr) * scale
        rows.append((label, _fmt(t, digits), _fmt(f, digits), f"**{t / f:.2f}×**" if ratio else ""))

    row("events per stream", "events", 1, 0)
    row("bytes per stream (SSE body)", "bytes", 1, 0)
    row("**events/s delivered**", "events_per_s", 1, 0, ratio=True)
    row("stream time, request → terminal event (ms)", "seconds", 1000, 1)
    row("time to first event, seq 1 (ms)", "first_event_s", 1000, 2)
    row("time to first token event (ms)", "first_token_s", 1000, 2)
    row("server CPU during the stream (s)", "server_cpu_s", 1, 2)
    t_cpu = statistics.median(r.server_cpu_s / r.events * 1e6 for r in tether)
    f_cpu = statistics.median(r.server_cpu_s / r.events * 1e6 for r in floor)
    rows.append(("server CPU per event (µs)", _fmt(t_cpu, 1), _fmt(f_cpu, 1), ""))
    row("client CPU during the stream (s)", "client_cpu_s", 1, 2)
    lines = ["| median of each | Tether (SQLite, durable) | floor (bare Starlette) | Tether / floor |", "|---|---:|---:|---:|"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=20000, help="token deltas per stream (default 20000)")
    parser.add_argument("--repeat", type=int, default=3, help="measured streams per server (default 3)")
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured streams per server first (default 1)")
    parser.add_argument("--only", choices=("tether", "floor"), help="measure one server only")
    parser.add_argument(
        "--batched-floor",
        action="store_true",
        help="the floor joins its events into sends of about 64 KiB, as Tether's SSE does (default: one send per event; benchmarks/scale.py reports both)",
    )
    parser.add_argument(
        "--durable-floor",
        action="store_true",
        help="the durable floor: the batched floor writing every event to SQLite (WAL, synchronous=NORMAL, group commit) before sending it",
    )
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="tether-bench-") as tmp:
        servers: dict[str, tuple[Server, Callable[[Server, int], Stream]]] = {}
        try:
            if args.only != "floor":
                port = free_port()
                argv = tether_argv(port, f"sqlite:///{Path(tmp) / 'bench.db'}")
                servers["tether"] = (Server("tether", argv, port, Path(tmp) / "tether.log"), tether_stream)
            if args.only != "tether":
                port = free_port()
                floor = partial(floor_stream, batch=args.batched_floor or args.durable_floor)
                floor_db = f"sqlite:///{Path(tmp) / 'floor.db'}" if args.durable_floor else None
                servers["floor"] = (Server("floor", floor_argv(port, floor_db), port, Path(tmp) / "floor.log"), floor)
            for server, _ in servers.values():
                server.wait_until_ready()
                # The pid is for a profiler: py-spy record --pid <pid> while the streams run.
                print(f"{server.name}: pid {server.pid}, {server.url}", file=sys.stderr)
            for server, fn in servers.values():
                for _ in range(args.warmup):
                    fn(server, args.tokens)
            results: dict[str, list[Stream]] = {name: [] for name in servers}
            for i in range(args.repeat):
                for name, (server, fn) in servers.items():
                    s = fn(server, args.tokens)
                    results[name].append(s)
                    print(
                        f"[{i + 1}/{args.repeat}] {name:6} {s.events_per_s:>9,.0f} events/s  {s.seconds * 1000:7.1f} ms"
                        f"  first event {s.first_event_s * 1000:6.2f} ms  first token {s.first_token_s * 1000:6.2f} ms"
                        f"  server CPU {s.server_cpu_s:.2f} s  client CPU {s.client_cpu_s:.2f} s",
                        file=sys.stderr,
                    )
        finally:
            for server, _ in servers.values():
                server.stop()

    print(f"\nStream throughput: {args.tokens:,} zero-delay tokens per stream, median of {args.repeat}, over HTTP on localhost")
    print(f"Machine: {machine()}")
    print(f"Versions: {versions()}\n")
    if len(results) == 2:
        print(table(results["tether"], results["floor"]))
        ratio = statistics.median(r.events_per_s for r in results["tether"]) / statistics.median(r.events_per_s for r in results["floor"])
        verdict = "meets" if ratio >= TARGET_RATIO else "misses"
        print(f"\nTether delivers {ratio:.3f}× the floor's events/s: it {verdict} the target of ≥ {TARGET_RATIO}×.")
    else:
        ((name, runs),) = results.items()
        print(f"{name}: {statistics.median(r.events_per_s for r in runs):,.0f} events/s (median)")


if __name__ == "__main__":
    main()
