"""Many open event streams, some never reading: does the server's memory stay bounded, and do the
readers that were cut resume without a gap?

Run it from the repository root::

    python benchmarks/slow_readers.py                          # 400 streams, 40 never reading
    python benchmarks/slow_readers.py --streams 2000 --stalled 200

It serves ``benchmarks/_firehose_agent.py`` with ``tether serve`` (SQLite in a temporary
directory) as a subprocess, with the per-caller stream cap raised (every stream comes from this
one address), then:

1. reads the server's resident memory (``VmRSS`` of ``/proc/<pid>/status``) as the baseline;
2. starts one run whose model first waits (so every stream is attached before the output
   starts), then streams ``--deltas`` deltas of ``--delta-chars`` characters as fast as it can;
3. opens ``--streams`` raw-socket event streams on it: ``--stalled`` of them with a 4 KiB
   receive buffer that read nothing until the run is over, the others reading everything as it
   comes; RSS is read once all are open (idle), then every 0.2 s while the run streams;
4. once the run is over, the stalled readers read what the server had sent them: each ends with
   the terminal event (it was never cut) or with the ``disconnected`` comment naming its
   ``Last-Event-ID``; a cut reader then reads the rest from the JSON events page, and its seqs
   must be exactly 1..last.

Figures: RSS baseline, with the streams open and idle (→ bytes per open stream), peak while the
run streams, after. Progress goes to stderr, the markdown table to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

DISCONNECTED = ": disconnected:"
REFUSED = "refused"


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def open_stream(port: int, run_id: str, *, stalled: bool) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    sock = socket.socket()
    if stalled:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    reader, writer = await asyncio.open_connection(sock=sock, limit=2**20)
    writer.write(f"GET /v1/runs/{run_id}/events HTTP/1.1\r\nHost: b\r\nAccept: text/event-stream\r\n\r\n".encode())
    await writer.drain()
    return reader, writer


async def read_body(reader: asyncio.StreamReader) -> str:
    """A chunked SSE response: headers, then chunks up to the last one (or EOF); ``REFUSED``
    when the server answered with an error (a 503 when it is at capacity)."""
    status = await reader.readline()
    while (await reader.readline()) not in (b"\r\n", b""):
        pass
    if b" 200 " not in status:
        return REFUSED
    body = []
    while True:
        size_line = await reader.readline()
        if not size_line:
            break
        size = int(size_line.strip(), 16)
        if size == 0:
            break
        body.append((await reader.readexactly(size + 2))[:-2].decode())
    return "".join(body)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=400)
    parser.add_argument("--stalled", type=int, default=40)
    parser.add_argument("--deltas", type=int, default=400)
    parser.add_argument("--stream-buffer-bytes", type=int, default=1024 * 1024, help="the server's --stream-buffer-bytes")
    parser.add_argument("--delta-chars", type=int, default=20_000)
    parser.add_argument("--head-start", type=float, default=None, help="seconds the run waits before streaming (default: enough to attach)")
    args = parser.parse_args()

    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        log = open(Path(tmp) / "server.log", "wb")  # noqa: ASYNC230  # once, before anything runs
        server = subprocess.Popen(  # noqa: ASYNC220  # once, before anything runs
            [
                sys.executable,
                "-m",
                "tether.cli",
                "serve",
                "_firehose_agent:agent",
                "--port",
                str(port),
                "--db",
                f"sqlite:///{tmp}/t.db",
                "--log-level",
                "warning",
            ]
            + ["--max-streams-per-caller", str(args.streams + 10), "--max-streams", str(args.streams + 10)]
            + ["--stream-buffer-bytes", str(args.stream_buffer_bytes)],
            stdout=log,
            stderr=log,
            env={
                **os.environ,
                "PYTHONUNBUFFERED": "1",
                "FIREHOSE_WAIT_S": str(args.head_start or max(5.0, args.streams / 100)),
                "FIREHOSE_DELTAS": str(args.deltas),
                "FIREHOSE_CHARS": str(args.delta_chars),
            },
            cwd=Path(__file__).parent,
        )
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
                for _ in range(300):
                    try:
                        if (await http.get("/healthz")).status_code == 200:
                            break
                    except httpx.HTTPError:
                        await asyncio.sleep(0.1)
                await asyncio.sleep(1.0)
                baseline = rss_bytes(server.pid)
                thread = (await http.post("/v1/threads")).json()
                run = (await http.post(f"/v1/threads/{thread['id']}/runs", json={"input": {"content": "go"}})).json()
                print(f"run {run['id']}: opening {args.streams} streams", file=sys.stderr)
                opened = time.perf_counter()
                streams = [await open_stream(port, run["id"], stalled=n < args.stalled) for n in range(args.streams)]
                print(f"  opened in {time.perf_counter() - opened:.1f} s", file=sys.stderr)
                readers = [asyncio.create_task(read_body(r)) for r, _ in streams[args.stalled :]]
                await asyncio.sleep(1.0)
                idle = rss_bytes(server.pid)
                peak = idle
                while (await http.get(f"/v1/runs/{run['id']}")).json().get("status") not in ("completed", "failed", "cancelled"):
                    peak = max(peak, rss_bytes(server.pid))  # (a 503 while the server is busy: ask again)
                    await asyncio.sleep(0.2)
                refused = sum(body == REFUSED for body in await asyncio.gather(*readers))
                peak = max(peak, rss_bytes(server.pid))
                cut = whole = gapless = 0
                for reader, writer in streams[: args.stalled]:
                    body = await asyncio.wait_for(read_body(reader), 120)
                    writer.close()
                    if body == REFUSED:
                        refused += 1
                        continue
                    seqs = [int(line[4:]) for line in body.splitlines() if line.startswith("id: ")]
                    if DISCONNECTED in body:
                        cut += 1
                        last = seqs[-1] if seqs else 0
                        while True:
                            answer = await http.get(f"/v1/runs/{run['id']}/events", params={"after_seq": last, "limit": 1000})
                            if answer.status_code != 200:
                                await asyncio.sleep(0.2)
                                continue
                            page = answer.json()["items"]
                            if not page:
                                break
                            seqs += [e["seq"] for e in page]
                            last = page[-1]["seq"]
                    else:
                        whole += 1
                    gapless += seqs == list(range(1, len(seqs) + 1)) and bool(seqs)
                for _, writer in streams[args.stalled :]:
                    writer.close()
                await asyncio.sleep(1.0)
                after = rss_bytes(server.pid)
        finally:
            server.terminate()
            server.wait(timeout=30)
            log.close()

    mib = 1024 * 1024
    print(
        "| streams (stalled) | RSS baseline | RSS, streams open and idle | per open stream | RSS peak while streaming | RSS after | stalled: cut / whole | gapless after resume | refused (503) |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    print(
        f"| {args.streams} ({args.stalled}) | {baseline / mib:.0f} MiB | {idle / mib:.0f} MiB | {(idle - baseline) / args.streams / 1024:.1f} KiB "
        f"| {peak / mib:.0f} MiB | {after / mib:.0f} MiB | {cut} / {whole} | {gapless} / {cut + whole} | {refused} |"
    )
    print(f"output per stream: {args.deltas} deltas of {args.delta_chars} characters ({args.deltas * args.delta_chars / mib:.2f} MiB)", file=sys.stderr)


if __name__ == "__main__":
    asyncio.run(main())
