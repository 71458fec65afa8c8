"""Which small GGUF model should ``--model local`` be? The demo's 10 prompts, through ``LlamaCppModel``.

Run it from the repository root (needs the ``local`` extra)::

    python benchmarks/local_models.py                          # the default local model
    python benchmarks/local_models.py --model other.gguf ...   # and others, side by side

Each model is loaded once (its resident memory measured before and after), then asked each of
the 10 prompts below as the demo agent asks it: the demo's system prompt and its eight tools,
so sampling is constrained to "answer, or call one tool" (greedy decoding, ``max_tokens`` as
given). One model call per prompt, no Tether server around it: what is measured is the model.

Per model: file size, resident memory the model added, the time to first token (the prompt's
evaluation included: from the call to its first generated token) of the first prompt (nothing
evaluated yet) and the median over all (later prompts share the system prompt, which llama.cpp
keeps evaluated), the median time from the call to the ``ToolCallStart`` of a call (what a
person sees as the ``status`` "calling a tool: …"), the median rate of generation after the
first token, and how many prompts got a **sensible** reply, judged mechanically:

- a prompt that asks for something a tool does ("What is the status of order A100?") is
  sensible when the model calls *that* tool with arguments that validate against its schema;
- a prompt that asks for words ("Write a story…", "What is the capital of France?") is sensible
  when the model answers in words (not empty, not stopped for repeating itself).

Anything else counts as not sensible: another tool, an answer where a tool was needed, an
output that is neither (``model_output_invalid``). The judgement is coarse on purpose (it does
not read the answers for truth), and it is the same for every model.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tether.demo import build_demo_agent  # noqa: E402
from tether.errors import ModelError, ToolArgsError  # noqa: E402
from tether.models import ChatMessage, ModelRequest, TextDelta, ToolCallRequest, ToolCallStart  # noqa: E402
from tether.models._registry import smollm2_path  # noqa: E402
from tether.models.llamacpp import LlamaCppModel  # noqa: E402

#: The demo's prompts and what a sensible reply is: a tool's name, or "answer" (words).
PROMPTS: list[tuple[str, str]] = [
    ("Hello! What can you do for me?", "answer"),
    ("What is the status of order A100?", "get_order"),
    ("Write a very long story about a cat who travels around the world. Use at least 800 words.", "answer"),
    ("Please refund 25 dollars on order A100.", "refund"),
    ("Send an email to ann@example.com telling her that her order has shipped.", "send_email"),
    ("Write a note: call the supplier on Monday.", "write_note"),
    ("Wait for 2 seconds, please.", "sleep"),
    ("What is the capital of France?", "answer"),
    ("Charge 10 dollars to the card 4242424242424242.", "charge_card"),
    ("Give me three tips for writing a good product description.", "answer"),
]


def rss_mb() -> float:
    """This process's resident memory, in MB (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def ask(model: LlamaCppModel, agent: Any, prompt: str, announced: list[float]) -> tuple[str, str, Any]:
    """One model call: ("answer", text, None), ("call", name, args) or ("invalid", reason, None);
    the seconds from the call to its tool call's announcement are appended to ``announced``."""
    request = ModelRequest([ChatMessage("system", agent.system_prompt), ChatMessage("user", prompt)], agent.tool_specs())
    text: list[str] = []
    started = time.perf_counter()
    try:
        async for delta in model.stream(request):
            if isinstance(delta, TextDelta):
                text.append(delta.text)
            elif isinstance(delta, ToolCallStart):
                announced.append(time.perf_counter() - started)
            elif isinstance(delta, ToolCallRequest):
                return "call", delta.name, delta.args
    except ModelError as exc:
        return "invalid", exc.message, None
    return "answer", "".join(text), None


def sensible(agent: Any, expected: str, kind: str, value: str, args: Any, finish_reason: str) -> bool:
    if expected == "answer":
        return kind == "answer" and bool(value.strip()) and finish_reason != "repeating"
    if kind != "call" or value != expected:
        return False
    try:
        agent.tools[value].validate(args)
    except ToolArgsError:
        return False
    return True


async def measure(path: Path, *, threads: int, max_tokens: int, verbose: bool, repeat_penalty: float | None = None) -> dict[str, Any]:
    agent = build_demo_agent()
    before = rss_mb()
    model = LlamaCppModel(path, n_threads=threads, max_tokens=max_tokens)
    if repeat_penalty is not None:
        model.repeat_penalty = repeat_penalty
    await model.load()
    memory = rss_mb() - before
    firsts: list[float] = []
    rates: list[float] = []
    announced: list[float] = []
    good = 0
    for prompt, expected in PROMPTS:
        kind, value, args = await ask(model, agent, prompt, announced)
        generation = model.generations[-1]
        if generation.first_token_s is not None:
            firsts.append(generation.first_token_s)
        if generation.generated_tokens > 1 and generation.first_token_s is not None and generation.total_s > generation.first_token_s:
            rates.append((generation.generated_tokens - 1) / (generation.total_s - generation.first_token_s))
        ok = sensible(agent, expected, kind, value, args, generation.finish_reason)
        good += ok
        if verbose:
            shown = f"{value}({args})" if kind == "call" else repr(value[:70])
            print(f"  {'ok ' if ok else 'no '} {prompt[:50]!r:54} → {kind} {shown} [{generation.generated_tokens} tokens, {generation.finish_reason}]")
    return {
        "model": path.name,
        "memory_mb": memory,
        "cold_first_token_s": firsts[0] if firsts else float("nan"),
        "first_token_s": statistics.median(firsts) if firsts else float("nan"),
        "announced_s": statistics.median(announced) if announced else float("nan"),
        "tokens_per_s": statistics.median(rates) if rates else float("nan"),
        "sensible": good,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", action="append", type=Path, help="a GGUF file (repeatable; default: the local model)")
    parser.add_argument("--threads", type=int, default=2, help="llama.cpp threads (default 2)")
    parser.add_argument("--max-tokens", type=int, default=256, help="output cap per call (default 256)")
    parser.add_argument("--repeat-penalty", type=float, help="override the model's repeat_penalty")
    parser.add_argument("--quiet", action="store_true", help="only the table")
    options = parser.parse_args()
    paths = options.model or [smollm2_path()]
    print(f"# {len(PROMPTS)} prompts, {options.threads} threads, max_tokens {options.max_tokens}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    rows = []
    for path in paths:
        print(f"## {path.name}")
        started = time.perf_counter()
        row = asyncio.run(
            measure(path, threads=options.threads, max_tokens=options.max_tokens, verbose=not options.quiet, repeat_penalty=options.repeat_penalty)
        )
        rows.append({**row, "size_mb": path.stat().st_size / 1e6})
        print(f"  ({time.perf_counter() - started:.0f} s)")
    print("\n| model | file | memory added | first token: first prompt / median | a call shown after (median) | tokens/s (median) | sensible replies |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['model']} | {r['size_mb']:.0f} MB | {r['memory_mb']:.0f} MB | {r['cold_first_token_s']:.2f} s / {r['first_token_s']:.2f} s "
            f"| {r['announced_s']:.2f} s | {r['tokens_per_s']:.1f} | {r['sensible']} of {len(PROMPTS)} |"
        )


if __name__ == "__main__":
    main()
