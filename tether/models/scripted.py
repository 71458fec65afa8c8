"""``ScriptedModel``: a deterministic model for tests and the demo (a test double, not an LLM).

It decides what to say from the history alone, so it keeps no state between calls and behaves
the same after a restart.

**Scripts.** When a user message on the history is a JSON object with a ``"script"`` list, the
latest such message drives the model: model call *k* after it (counting assistant turns since
that message) plays ``script[k]``. Each element is an object with any of:

- ``"text": str`` — streamed word by word (each word with its trailing space);
- ``"tokens": N`` — streams the deltas ``"t1 "``, ``"t2 "``, …, ``"tN "``;
- ``"thinking": str`` — streamed word by word as reasoning, before the text;
- ``"delay_ms": number`` — the deltas come this far apart (default 0), on the model's own
  clock: delta *n* is due *n* × ``delay_ms`` after the call starts, as a provider streams at its
  own pace whoever reads it; a delta already due (a busy event loop) follows at once;
- ``"pace": "gap"`` — instead, wait ``delay_ms`` after each delta is taken before the next one
  (a busy server then slows the model down too);
- ``"tool_calls": [{"name": …, "args": {…}}, …]`` — asked for after the text of that turn;
- ``"echo": true`` — answers with the JSON list ``[{"role": …, "content": …}, …]`` of exactly
  the messages it was given (system prompt excluded): how tests see the history the model got;
- ``"fail": str`` — the model call fails with that message (a provider error);
- ``"cut": "length"`` or ``"repetition"`` — the answer ends cut short for that reason (an
  :class:`~tether.models.AnswerCut` after its text), as a model stopped by its output limit or
  a repetition stop does.

When the script is used up, it answers ``"Done."`` — unless a plain user message came after
the script, in which case the keyword rules below answer it (so a thread can go on after a
scripted run).

**Keyword rules** (no script; what the demo's chat box understands). After tool results it
summarises them. Otherwise, on the last user message, case-insensitive:

- ``refund 25 on order A100`` → ``refund(order_id="A100", amount=25)``
- ``transfer 15 to alice`` → ``transfer(to_account="alice", amount=15)``
- ``charge 4242424242424242 10`` → ``charge_card(card_number=…, amount=10)``
- ``email bob@example.com <text>`` → ``send_email(to=…, subject="Message from Tether", body=<text>)``
- ``note <text>`` → ``write_note(text=<text>)``
- ``sleep 3`` (or ``wait 3``) → ``sleep(seconds=3)``
- ``order A100`` → ``get_order(order_id="A100")``
- ``ask <question>`` → ``ask_user(question=<question>)``
- ``call <tool> {"arg": …}`` → that tool with those arguments (any tool the agent has, e.g. one of
  a mounted MCP server's: ``call write_file {"path": "/srv/notes/a.txt", "content": "hi"}``)
- ``long`` → a long streamed answer (good for trying Stop)
- anything else → a short help text listing these rules.

A rule only fires when the agent has that tool.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import AsyncIterator
from typing import Any

from ..errors import ModelError
from . import AnswerCut, ChatMessage, ModelDelta, ModelRequest, TextDelta, ThinkingDelta, ToolCallRequest

__all__ = ["ScriptedModel", "parse_script"]

HELP_TEXT = (
    "I am the scripted demo model. Try: 'order A100', 'refund 25 on order A100', "
    "'transfer 15 to alice', 'note remember the milk', 'email bob@example.com hello', 'charge 4242424242424242 10', "
    "'sleep 3', 'ask what colour', 'call <tool> {\"arg\": 1}' for any tool, or 'long' for a long answer you can stop."
)


def parse_script(content: str) -> list[dict[str, Any]] | None:
    """The script list of a user message, or None if the message is not a script."""
    text = content.strip()
    if not text.startswith("{"):
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if isinstance(value, dict) and isinstance(value.get("script"), list):
        return [step if isinstance(step, dict) else {"text": str(step)} for step in value["script"]]
    return None


def _words(text: str) -> list[str]:
    return re.findall(r"\S+\s*|\s+", text)


class Pace:
    """When a model call's next delta is due: ``delay_s`` apart on the model's own clock (delta
    *n* is due *n* × ``delay_s`` after the first :meth:`wait_s`), or with ``clock=False``
    ``delay_s`` after the previous delta was taken, however late that was."""

    def __init__(self, delay_s: float, *, clock: bool = True) -> None:
        self.delay_s = delay_s
        self.clock = clock
        self._start: float | None = None
        self._count = 0

    def wait_s(self, now: float) -> float:
        """Seconds from ``now`` until the next delta is due (0 when it is due already)."""
        if not self.clock:
            return self.delay_s
        if self._start is None:
            self._start = now
        self._count += 1
        return max(0.0, self._start + self._count * self.delay_s - now)


def _new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:16]


class ScriptedModel:
    """A model that plays scripts embedded in user messages, or follows keyword rules."""

    def __init__(self, *, word_delay_s: float = 0.02) -> None:
        #: Pause between words of keyword-rule answers, so the demo streams visibly.
        self.word_delay_s = word_delay_s

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelDelta]:
        """The deltas of one model call (an async generator: the step's, with no layer between)."""
        step = self._script_step(request.messages)
        if step is None:
            step = self._keyword_step(request)
        return self._play(step, request)

    # -- choosing the step -------------------------------------------------------------

    @staticmethod
    def _script_step(messages: list[ChatMessage]) -> dict[str, Any] | None:
        for index in range(len(messages) - 1, -1, -1):
            message = messages[index]
            if message.role != "user":
                continue
            script = parse_script(message.content)
            if script is None:
                continue
            turn = sum(1 for m in messages[index + 1 :] if m.role == "assistant")
            if turn < len(script):
                return script[turn]
            if any(m.role == "user" for m in messages[index + 1 :]):
                return None  # the script is used up and the user said more: keyword rules
            return {"text": "Done."}
        return None

    def _keyword_step(self, request: ModelRequest) -> dict[str, Any]:
        delay = self.word_delay_s * 1000
        messages = request.messages
        if messages and messages[-1].role == "tool":
            results = []
            for m in reversed(messages):
                if m.role != "tool":
                    break
                results.append(f"{m.name or 'tool'} → {m.content}")
            return {"text": "Here is what happened: " + "; ".join(reversed(results)), "delay_ms": delay}
        last_user = next((m.content for m in reversed(messages) if m.role == "user"), "")
        call = self._keyword_call(last_user, {t.name for t in request.tools})
        if call is not None:
            return {"text": f"Calling {call['name']}.", "tool_calls": [call], "delay_ms": delay}
        if re.search(r"\blong\b", last_user, re.I):
            return {"tokens": 400, "delay_ms": 30}
        return {"text": HELP_TEXT, "delay_ms": delay}

    @staticmethod
    def _keyword_call(text: str, tools: set[str]) -> dict[str, Any] | None:
        named = re.match(r"\s*call\s+([A-Za-z0-9_-]+)\s*(\{.*\})?\s*$", text, re.I | re.S)
        if named and named.group(1) in tools:
            try:
                args = json.loads(named.group(2) or "{}")
            except ValueError:
                args = named.group(2)  # the tool's validation tells the model what is wrong
            return {"name": named.group(1), "args": args}
        lower = text.lower()
        number = re.search(r"(?<![\w.])(\d+(?:\.\d+)?)(?![\w.])", text)
        order = re.search(r"order\s*#?\s*([A-Za-z0-9-]+)", text, re.I)
        payee = re.search(r"\bto\s+([A-Za-z0-9_.@-]+)", text, re.I)
        if re.search(r"\btransfer\b", lower) and "transfer" in tools:
            amount = re.search(r"(?<![\w.])(\d+(?:\.\d+)?)(?![\w.])", text)
            return {"name": "transfer", "args": {"to_account": payee.group(1) if payee else "savings", "amount": float(amount.group(1)) if amount else 10.0}}
        if "refund" in lower and "refund" in tools and order:
            rest = text.replace(order.group(0), " ")
            amount = re.search(r"(?<![\w.])(-?\d+(?:\.\d+)?)(?![\w.])", rest)
            return {"name": "refund", "args": {"order_id": order.group(1), "amount": float(amount.group(1)) if amount else 10.0}}
        card = re.search(r"\b(\d{12,19})\b", text)
        if "charge" in lower and "charge_card" in tools and card:
            rest = text.replace(card.group(0), " ")
            amount = re.search(r"(?<![\w.])(\d+(?:\.\d+)?)(?![\w.])", rest)
            return {"name": "charge_card", "args": {"card_number": card.group(1), "amount": float(amount.group(1)) if amount else 1.0}}
        email = re.search(r"[\w.+-]+@[\w-]+\.[\w.-]+", text)
        if "email" in lower and "send_email" in tools:
            body = re.sub(r"(?i)\bemail\b", "", text.replace(email.group(0), "") if email else text).strip() or "Hello!"
            return {"name": "send_email", "args": {"to": email.group(0) if email else "customer@example.com", "subject": "Message from Tether", "body": body}}
        note = re.search(r"\bnote\b[:\s]*(.*)", text, re.I | re.S)
        if note and "write_note" in tools:
            return {"name": "write_note", "args": {"text": note.group(1).strip() or "(empty note)"}}
        if re.search(r"\b(sleep|wait)\b", lower) and "sleep" in tools:
            return {"name": "sleep", "args": {"seconds": float(number.group(1)) if number else 2.0}}
        if order and "get_order" in tools:
            return {"name": "get_order", "args": {"order_id": order.group(1)}}
        ask = re.search(r"\bask\b[:\s]*(.*)", text, re.I | re.S)
        if ask and "ask_user" in tools:
            return {"name": "ask_user", "args": {"question": ask.group(1).strip() or "What should I do next?"}}
        return None

    # -- playing a step ----------------------------------------------------------------

    async def _play(self, step: dict[str, Any], request: ModelRequest) -> AsyncIterator[ModelDelta]:
        # Before each delta it always yields to the loop (``sleep``, of zero seconds when the
        # delta is already due), so a zero-delay script can still be cancelled mid-stream.
        pace = Pace(float(step.get("delay_ms", 0) or 0) / 1000, clock=step.get("pace") != "gap")
        # Looked up once: one of each before every delta.
        sleep, wait_s, now = asyncio.sleep, pace.wait_s, asyncio.get_running_loop().time

        if "fail" in step:
            raise ModelError(str(step["fail"]), retryable=False)
        if step.get("thinking"):
            for word in _words(str(step["thinking"])):
                await sleep(wait_s(now()))
                yield ThinkingDelta(word)
        if step.get("echo"):
            history = [{"role": m.role, "content": m.content} for m in request.messages if m.role != "system"]
            await sleep(wait_s(now()))
            yield TextDelta(json.dumps(history, ensure_ascii=False))
        if "tokens" in step:
            for n in range(1, int(step["tokens"]) + 1):
                await sleep(wait_s(now()))
                yield TextDelta(f"t{n} ")
        if step.get("text"):
            for word in _words(str(step["text"])):
                await sleep(wait_s(now()))
                yield TextDelta(word)
        for call in step.get("tool_calls") or []:
            args = call.get("args", {})
            yield ToolCallRequest(id=str(call.get("id") or _new_call_id()), name=str(call.get("name", "")), args=args if isinstance(args, dict) else str(args))
        if step.get("cut") in ("length", "repetition"):
            yield AnswerCut(step["cut"])
