"""``OpenAIModel``: any OpenAI-compatible Chat Completions endpoint, streamed.

Works with OpenAI itself and with servers that speak its Chat Completions API (vLLM, Ollama,
llama.cpp, LM Studio, DeepSeek, OpenRouter, …). Configuration comes from the constructor or,
when an argument is left out, from the environment:

- ``TETHER_OPENAI_MODEL`` (default ``gpt-4o-mini``);
- ``TETHER_OPENAI_BASE_URL``, then ``OPENAI_BASE_URL`` (default: OpenAI's own URL);
- ``TETHER_OPENAI_API_KEY``, then ``OPENAI_API_KEY`` (default: a placeholder, since local
  servers usually want none).

**Why the upstream stream is closed in ``finally``.** Stopping a run must stop the provider
generating (and billing) tokens, not just stop Tether reading them. A provider only learns that
nobody is listening when the HTTP connection closes. :meth:`OpenAIModel.stream` is an async
generator; when its consumer is cancelled, the cancellation is raised at the ``await`` inside the
generator, and when its consumer calls ``aclose()``, ``GeneratorExit`` is raised at the ``yield``.
Either way the ``finally`` block runs and closes the response, which closes the connection (an
HTTP/1.1 response that was not read to the end cannot go back to the pool). The close is
shielded: under a cancelled anyio scope every unshielded ``await`` would be cancelled again, and
the close could be skipped. Cancellation is then re-raised, never swallowed.

**Errors** from the ``openai`` package are translated once, here, into
:class:`~tether.errors.ModelError` (``raise … from exc``), with ``retryable`` set for failures
that a later attempt may not hit (connection problems, timeouts, rate limits, 5xx). The client is
built with ``max_retries=0`` by default: whether and when to retry is the caller's decision.

**Tool calls** arrive in fragments keyed by ``index``: the first fragment of a call carries its
``id`` and name, later ones append to its JSON arguments. A call is announced
(:class:`~tether.models.ToolCallStart`) at its first fragment with a name; the calls are
assembled while streaming and yielded, one :class:`~tether.models.ToolCallRequest` per call,
when the stream ends. A stream that ends with ``finish_reason: "length"`` while calls were being
assembled was cut off by the token limit in the middle of a call: its calls are not yielded
(they would run on arguments the model did not finish) and the call raises
``model_output_invalid`` (:mod:`tether.models._output`). An answer in words that ends with
``finish_reason: "length"`` is kept and marked: :class:`~tether.models.AnswerCut` ``length``.

**Usage** comes from the provider's trailing usage chunk (asked for with
``stream_options.include_usage``; ``stream_usage=False`` for servers that refuse it). Until it
arrives, and when the stream is cut before it (a cancel), output tokens are counted as content
chunks received, which is what servers send one token at a time; input tokens are then unknown (0).

**Reasoning**: providers that stream reasoning (DeepSeek, vLLM, OpenRouter, …) put it in a
non-standard ``reasoning_content`` or ``reasoning`` field of the delta; it becomes
:class:`~tether.models.ThinkingDelta`.

The underlying HTTP client keeps a connection pool bound to the event loop that first used it:
use one ``OpenAIModel`` per event loop, and :meth:`OpenAIModel.aclose` it when done.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Self

import anyio
import httpx2
import openai

from ..errors import ModelError
from ..telemetry._context import outbound_headers
from . import AnswerCut, ChatMessage, ModelDelta, ModelRequest, TextDelta, ThinkingDelta, ToolCallRequest, ToolCallStart, ToolSpec
from ._output import output_invalid
from ._registry import env_setting
from ._retry import retry_after_seconds

__all__ = ["OpenAIModel"]

DEFAULT_MODEL = "gpt-4o-mini"
# Sent when no key is configured: local OpenAI-compatible servers ignore it, and the openai
# client refuses to start without one.
PLACEHOLDER_API_KEY = "not-needed"
# Non-standard delta fields that carry reasoning, in order of preference.
_REASONING_FIELDS = ("reasoning_content", "reasoning")


class OpenAIModel:
    """A streaming model backed by an OpenAI-compatible Chat Completions endpoint."""

    def __init__(
        self,
        model: str | None = None,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        temperature: float | None = None,
        timeout: float = 60.0,
        max_retries: int = 0,
        stream_usage: bool = True,
        tool_choice: str | dict[str, Any] | None = "auto",
        max_tokens: int | None = None,
    ) -> None:
        #: The model name sent with every request.
        self.model = model or env_setting("TETHER_OPENAI_MODEL") or DEFAULT_MODEL
        #: The endpoint's base URL (``None`` means OpenAI's own).
        self.base_url = base_url or env_setting("TETHER_OPENAI_BASE_URL", "OPENAI_BASE_URL")
        #: Sampling temperature; ``None`` leaves it to the provider.
        self.temperature = temperature
        #: Ask for the usage chunk at the end of the stream (``stream_options.include_usage``).
        self.stream_usage = stream_usage
        #: Sent with the tools. ``"auto"`` is OpenAI's default, but some compatible servers
        #: (llama.cpp's Python server) ignore the tools unless it is said; ``None`` sends nothing;
        #: ``{"type": "function", "function": {"name": …}}`` makes the model call that tool.
        self.tool_choice = tool_choice
        #: The most tokens one call may generate (sent as ``max_tokens``); ``None`` leaves it to the provider.
        self.max_tokens = max_tokens
        self._client = openai.AsyncOpenAI(
            api_key=api_key or env_setting("TETHER_OPENAI_API_KEY", "OPENAI_API_KEY") or PLACEHOLDER_API_KEY,
            base_url=self.base_url,
            timeout=timeout,
            max_retries=max_retries,
        )

    @classmethod
    def from_env(cls) -> OpenAIModel:
        """A model configured entirely from the environment variables listed in the module docs."""
        return cls()

    def __repr__(self) -> str:
        return f"OpenAIModel(model={self.model!r}, base_url={self.base_url!r})"

    async def aclose(self) -> None:
        """Close the HTTP connection pool."""
        await self._client.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelDelta]:
        """Yield the deltas of one model call; closing or cancelling it closes the upstream request."""
        params: dict[str, Any] = {
            "model": self.model,
            "messages": [_message_to_openai(m) for m in request.messages],
            "stream": True,
        }
        if request.tools:
            params["tools"] = [_tool_to_openai(t) for t in request.tools]
            if self.tool_choice is not None:
                params["tool_choice"] = self.tool_choice
        if self.temperature is not None:
            params["temperature"] = self.temperature
        if self.max_tokens is not None:
            params["max_tokens"] = self.max_tokens
        if self.stream_usage:
            params["stream_options"] = {"include_usage": True}

        try:
            upstream = await self._client.chat.completions.create(**params, extra_headers=outbound_headers() or None)
        except openai.OpenAIError as exc:
            raise _model_error(exc) from exc

        calls: dict[int, _PartialCall] = {}
        reported = False
        finish_reason: str | None = None
        try:
            try:
                async for chunk in upstream:
                    if chunk.usage is not None:  # the provider's own count replaces the estimate
                        request.usage.input_tokens = chunk.usage.prompt_tokens
                        request.usage.output_tokens = chunk.usage.completion_tokens
                        reported = True
                    if not chunk.choices:  # e.g. the trailing usage-only chunk
                        continue
                    finish_reason = chunk.choices[0].finish_reason or finish_reason
                    delta = chunk.choices[0].delta
                    if delta is None:
                        continue
                    if not reported and (delta.content or delta.tool_calls or _reasoning_text(delta)):
                        # Until the usage chunk comes (it never does when the stream is cut), one
                        # chunk with content counts as one output token: what servers send.
                        request.usage.output_tokens += 1
                    reasoning = _reasoning_text(delta)
                    if reasoning:
                        yield ThinkingDelta(reasoning)
                    if delta.content:
                        yield TextDelta(delta.content)
                    for position, fragment in enumerate(delta.tool_calls or ()):
                        index = fragment.index if isinstance(fragment.index, int) else position
                        call = calls.setdefault(index, _PartialCall())
                        named = bool(call.name)
                        call.add(fragment)
                        if call.name and not named:
                            yield ToolCallStart(call.name)
            except openai.OpenAIError as exc:
                raise _model_error(exc) from exc
            except httpx2.TransportError as exc:  # the connection broke mid-body
                raise ModelError(f"model provider connection broke: {exc!r}", retryable=True, code="model_unavailable") from exc
            except json.JSONDecodeError as exc:
                raise ModelError(f"model provider sent a malformed stream: {exc}", retryable=True) from exc
            if calls and finish_reason == "length":
                limit = f" ({self.max_tokens} tokens)" if self.max_tokens is not None else ""
                raise output_invalid(f"cut off by the output limit{limit} in the middle of a tool call")
            for index in sorted(calls):
                yield calls[index].finish()
            if not calls and finish_reason == "length":
                yield AnswerCut("length")  # an answer in words, cut by max_tokens: marked, kept
        finally:
            # Runs on normal end, on error, on cancellation and on aclose(): closing the response
            # closes the connection, which is how the provider learns to stop generating.
            with anyio.CancelScope(shield=True):
                await upstream.close()


@dataclass
class _PartialCall:
    """A tool call being assembled from streamed fragments."""

    id: str | None = None
    name: str = ""
    arguments: list[str] = field(default_factory=list)

    def add(self, fragment: Any) -> None:
        if fragment.id and not self.id:
            self.id = fragment.id
        function = fragment.function
        if function is None:
            return
        # Some servers repeat the name on every fragment; it is never split.
        if function.name and not self.name:
            self.name = function.name
        if function.arguments:
            self.arguments.append(function.arguments)

    def finish(self) -> ToolCallRequest:
        raw = "".join(self.arguments)
        args: dict[str, Any] | str
        try:
            parsed = json.loads(raw) if raw.strip() else {}
        except ValueError:
            parsed = None
        args = parsed if isinstance(parsed, dict) else raw
        return ToolCallRequest(id=self.id or "call_" + uuid.uuid4().hex[:16], name=self.name, args=args)


def _reasoning_text(delta: Any) -> str | None:
    extra = getattr(delta, "model_extra", None) or {}
    for name in _REASONING_FIELDS:
        value = getattr(delta, name, None)
        if value is None:
            value = extra.get(name)
        if isinstance(value, str) and value:
            return value
    return None


def _message_to_openai(message: ChatMessage) -> dict[str, Any]:
    if message.role == "tool":
        return {"role": "tool", "tool_call_id": message.tool_call_id or "", "content": message.content}
    if message.role == "assistant" and message.tool_calls:
        turn: dict[str, Any] = {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {
                        "name": call.name,
                        "arguments": call.args if isinstance(call.args, str) else json.dumps(call.args, ensure_ascii=False),
                    },
                }
                for call in message.tool_calls
            ],
        }
        # A turn that only calls tools has no content: OpenAI takes it left out (or null, which
        # llama.cpp's server refuses), not "".
        if message.content:
            turn["content"] = message.content
        return turn
    return {"role": message.role, "content": message.content}


def _tool_to_openai(tool: ToolSpec) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {"name": tool.name, "description": tool.description, "parameters": tool.parameters},
    }


def _model_error(exc: openai.OpenAIError) -> ModelError:
    """Translate an ``openai`` exception into Tether's ``ModelError``."""
    # APITimeoutError is a subclass of APIConnectionError.
    if isinstance(exc, openai.APIConnectionError):
        kind = "timed out" if isinstance(exc, openai.APITimeoutError) else "could not be reached"
        return ModelError(f"model provider {kind}: {exc}", retryable=True, code="model_unavailable")
    if isinstance(exc, openai.APIStatusError):
        retry_after = retry_after_seconds(exc.response.headers)
        if isinstance(exc, openai.RateLimitError):
            return ModelError(
                f"model provider rate limit (HTTP {exc.status_code}): {exc.message}", retryable=True, code="model_rate_limited", retry_after=retry_after
            )
        if exc.status_code in (503, 529):
            return ModelError(
                f"model provider overloaded (HTTP {exc.status_code}): {exc.message}", retryable=True, code="model_overloaded", retry_after=retry_after
            )
        return ModelError(
            f"model provider returned HTTP {exc.status_code}: {exc.message}",
            retryable=exc.status_code >= 500,
            code="model_error",
            retry_after=retry_after,
        )
    return ModelError(f"model provider failed: {exc}", retryable=False, code="model_error")
