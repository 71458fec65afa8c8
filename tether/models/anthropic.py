"""``AnthropicModel``: Anthropic's Messages API, streamed, on the official ``anthropic`` SDK.

Configuration comes from the constructor or, when an argument is left out, the environment:

- ``TETHER_ANTHROPIC_MODEL`` (default ``claude-sonnet-4-5``);
- ``TETHER_ANTHROPIC_BASE_URL``, then ``ANTHROPIC_BASE_URL`` (default: Anthropic's own URL);
- ``TETHER_ANTHROPIC_API_KEY``, then ``ANTHROPIC_API_KEY``.

**How Tether's history maps to the Messages API.** System messages become the top-level
``system`` parameter (Anthropic has no system role). An assistant turn that called tools is one
``assistant`` message whose content is its text block, then one ``tool_use`` block per call
(``input`` is the arguments object). Tool results go back as ``tool_result`` blocks
(``tool_use_id``, ``content``) in a ``user`` message; consecutive messages of one role are merged
into one message, tool results first, since the API wants the roles to alternate and the results
right after the calls.

**The stream.** ``text_delta`` → :class:`~tether.models.TextDelta`; ``thinking_delta`` →
:class:`~tether.models.ThinkingDelta` (extended thinking, on when ``thinking_budget`` is set); a
``tool_use`` block is announced (:class:`~tether.models.ToolCallStart`) at its
``content_block_start``, its ``input_json_delta`` fragments are joined, and the calls are
yielded as :class:`~tether.models.ToolCallRequest` when the message ends: a message that stops
with ``stop_reason: "max_tokens"`` inside a ``tool_use`` block was cut off in the middle of a
call, so its calls are not yielded (they would run on arguments the model did not finish) and
the call raises ``model_output_invalid`` (:mod:`tether.models._output`); an answer in words that
stops with ``max_tokens`` is kept and marked (:class:`~tether.models.AnswerCut` ``length``). Usage comes from
``message_start`` (input tokens) and ``message_delta`` (output tokens, sent at the end); until
that arrives, and when a cancel cuts the stream before it, each content delta received counts as
one output token (Anthropic streams a token or a few per delta: an estimate from below).

**Thinking and tools.** With extended thinking on, the API wants the previous assistant turn's
signed thinking blocks sent back with its ``tool_use`` blocks. Tether's history keeps text and
calls, not signatures, so this adapter remembers the signed blocks of recent turns by tool call
id (in memory, bounded). When it does not have them (another process, a restart), it sends
that request without thinking rather than have the API refuse it.

**Cancellation** works as in :mod:`tether.models.openai`: the generator's ``finally`` closes
the HTTP response (shielded), which closes the connection, which is how Anthropic learns to stop
generating. **Errors** are translated once, here, into :class:`~tether.errors.ModelError`: 429 →
``model_rate_limited``, 529 or an ``overloaded_error`` event mid-stream → ``model_overloaded``,
connection problems → ``model_unavailable``, all retryable, with ``Retry-After`` passed on; the
client itself never retries (``max_retries=0``): :mod:`tether.models._retry` decides.
"""

from __future__ import annotations

import json
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Any, Self

import anthropic
import anyio
import httpx2

from ..errors import ModelError
from ..telemetry._context import outbound_headers
from . import AnswerCut, ChatMessage, ModelDelta, ModelRequest, TextDelta, ThinkingDelta, ToolCallRequest, ToolCallStart, ToolSpec
from ._output import output_invalid
from ._registry import env_setting
from ._retry import retry_after_seconds

__all__ = ["AnthropicModel"]

DEFAULT_MODEL = "claude-sonnet-4-5"
DEFAULT_MAX_TOKENS = 4096
#: How many assistant turns' signed thinking blocks are remembered (see the module docs).
_THINKING_MEMORY = 256


class AnthropicModel:
    """A streaming model backed by Anthropic's Messages API."""

    def __init__(
        self,
        model: str | None = None,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        thinking_budget: int | None = None,
        temperature: float | None = None,
        timeout: float = 60.0,
    ) -> None:
        #: The model name sent with every request.
        self.model = model or env_setting("TETHER_ANTHROPIC_MODEL") or DEFAULT_MODEL
        #: The API's base URL (``None`` means Anthropic's own).
        self.base_url = base_url or env_setting("TETHER_ANTHROPIC_BASE_URL", "ANTHROPIC_BASE_URL")
        #: The most tokens one call may generate (the API requires a bound).
        self.max_tokens = max_tokens
        #: Extended thinking's token budget; ``None`` turns thinking off.
        self.thinking_budget = thinking_budget
        #: Sampling temperature; ``None`` leaves it to the provider.
        self.temperature = temperature
        self._client = anthropic.AsyncAnthropic(
            api_key=api_key or env_setting("TETHER_ANTHROPIC_API_KEY", "ANTHROPIC_API_KEY"),
            base_url=self.base_url,
            timeout=timeout,
            max_retries=0,
        )
        # tool call id → the signed thinking blocks of the turn that made the call.
        self._thinking: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()

    def __repr__(self) -> str:
        return f"AnthropicModel(model={self.model!r}, base_url={self.base_url!r})"

    async def aclose(self) -> None:
        """Close the HTTP connection pool."""
        await self._client.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelDelta]:
        """Yield the deltas of one model call; closing or cancelling it closes the upstream request."""
        system, messages, complete = self._messages(request.messages)
        params: dict[str, Any] = {"model": self.model, "max_tokens": self.max_tokens, "messages": messages, "stream": True}
        if system:
            params["system"] = system
        if request.tools:
            params["tools"] = [_tool_to_anthropic(t) for t in request.tools]
        if self.thinking_budget is not None and complete:
            params["thinking"] = {"type": "enabled", "budget_tokens": self.thinking_budget}
        if self.temperature is not None and "thinking" not in params:  # thinking requires the default
            params["temperature"] = self.temperature

        try:
            upstream = await self._client.messages.create(**params, extra_headers=outbound_headers() or None)
        except anthropic.AnthropicError as exc:
            raise _model_error(exc) from exc

        blocks: dict[int, dict[str, Any]] = {}  # content blocks by index, as they are built
        calls: list[ToolCallRequest] = []
        signed: list[dict[str, Any]] = []
        reported = False
        stop_reason: str | None = None
        last_block: str | None = None  # the type of the last content block started
        try:
            try:
                async for event in upstream:
                    kind = event.type
                    if kind == "message_start":
                        usage = event.message.usage
                        request.usage.input_tokens = _input_tokens(usage)
                        request.usage.output_tokens = 0  # the 1 it reports is counted with the first delta
                    elif kind == "message_delta":
                        stop_reason = event.delta.stop_reason or stop_reason
                        if event.usage.input_tokens is not None:
                            request.usage.input_tokens = _input_tokens(event.usage)
                        request.usage.output_tokens = event.usage.output_tokens
                        reported = True
                    elif kind == "content_block_start":
                        block = event.content_block.to_dict()
                        last_block = block["type"]
                        blocks[event.index] = block
                        if block["type"] == "tool_use":
                            block["partial_json"] = []
                            yield ToolCallStart(str(block.get("name") or "") or None)
                    elif kind == "content_block_delta":
                        if not reported:  # until message_delta, one delta counts as one token
                            request.usage.output_tokens += 1
                        delta = event.delta
                        block = blocks.setdefault(event.index, {"type": "text"})
                        if delta.type == "text_delta":
                            if delta.text:
                                yield TextDelta(delta.text)
                        elif delta.type == "thinking_delta":
                            block["thinking"] = block.get("thinking", "") + delta.thinking
                            if delta.thinking:
                                yield ThinkingDelta(delta.thinking)
                        elif delta.type == "signature_delta":
                            block["signature"] = block.get("signature", "") + delta.signature
                        elif delta.type == "input_json_delta":
                            block.setdefault("partial_json", []).append(delta.partial_json)
                    elif kind == "content_block_stop":
                        block = blocks.get(event.index, {})
                        if block.get("type") == "tool_use":
                            calls.append(_finish_call(block))
                        elif block.get("type") in ("thinking", "redacted_thinking"):
                            signed.append({k: v for k, v in block.items() if k in ("type", "thinking", "signature", "data")})
            except anthropic.AnthropicError as exc:
                raise _model_error(exc) from exc
            except httpx2.TransportError as exc:
                raise ModelError(f"model provider connection broke: {exc!r}", retryable=True, code="model_unavailable") from exc
            except (json.JSONDecodeError, ValueError) as exc:
                raise ModelError(f"model provider sent a malformed stream: {exc}", retryable=True) from exc
            if calls and stop_reason == "max_tokens" and last_block == "tool_use":
                calls = []  # none of them is run: the model did not finish what it asked for
                raise output_invalid(f"cut off by the output limit ({self.max_tokens} tokens) in the middle of a tool call")
            for call in calls:
                yield call
            if not calls and stop_reason == "max_tokens":
                yield AnswerCut("length")  # an answer in words, cut by max_tokens: marked, kept
        finally:
            # Runs on normal end, on error, on cancellation and on aclose(): closing the response
            # closes the connection, which is how the provider learns to stop generating.
            with anyio.CancelScope(shield=True):
                await upstream.close()
            if signed:
                for call in calls:
                    self._remember_thinking(call.id, signed)

    # -- history -------------------------------------------------------------------------

    def _messages(self, history: list[ChatMessage]) -> tuple[str, list[dict[str, Any]], bool]:
        """The system text, the messages, and whether every tool-calling turn has its thinking."""
        system = "\n\n".join(m.content for m in history if m.role == "system" and m.content)
        messages: list[dict[str, Any]] = []
        complete = True
        for message in history:
            if message.role == "system":
                continue
            if message.role == "tool":
                role, content = "user", [{"type": "tool_result", "tool_use_id": message.tool_call_id or "", "content": message.content}]
            elif message.role == "assistant":
                role, content = "assistant", []
                if message.tool_calls and self.thinking_budget is not None:
                    thinking = self._thinking.get(message.tool_calls[0].id)
                    if thinking is None:
                        complete = False
                    else:
                        content.extend(thinking)
                if message.content:
                    content.append({"type": "text", "text": message.content})
                content.extend(_call_to_anthropic(call) for call in message.tool_calls)
                if not content:
                    continue  # e.g. a cancelled turn that said nothing: the API refuses empty turns
            else:
                role, content = "user", [{"type": "text", "text": message.content}]
            if messages and messages[-1]["role"] == role:
                merged = messages[-1]["content"] + content
                # Tool results first: they must answer the calls of the turn right before.
                merged.sort(key=lambda block: block["type"] != "tool_result")
                messages[-1]["content"] = merged
            else:
                messages.append({"role": role, "content": content})
        return system, messages, complete

    def _remember_thinking(self, call_id: str, blocks: list[dict[str, Any]]) -> None:
        self._thinking[call_id] = blocks
        while len(self._thinking) > _THINKING_MEMORY:
            self._thinking.popitem(last=False)


def _input_tokens(usage: Any) -> int:
    """Input tokens including those read from or written to the prompt cache."""
    return sum(getattr(usage, name, None) or 0 for name in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"))


def _finish_call(block: dict[str, Any]) -> ToolCallRequest:
    raw = "".join(block.get("partial_json") or [])
    args: dict[str, Any] | str
    if raw.strip():
        try:
            parsed = json.loads(raw)
        except ValueError:
            parsed = None
        args = parsed if isinstance(parsed, dict) else raw
    else:
        start = block.get("input")
        args = start if isinstance(start, dict) else {}
    return ToolCallRequest(id=str(block.get("id") or "toolu_" + uuid.uuid4().hex[:16]), name=str(block.get("name", "")), args=args)


def _call_to_anthropic(call: ToolCallRequest) -> dict[str, Any]:
    args: Any = call.args
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError:
            args = {"_raw": args}
        if not isinstance(args, dict):
            args = {"_raw": call.args}
    return {"type": "tool_use", "id": call.id, "name": call.name, "input": args}


def _tool_to_anthropic(tool: ToolSpec) -> dict[str, Any]:
    return {"name": tool.name, "description": tool.description, "input_schema": tool.parameters}


def _model_error(exc: anthropic.AnthropicError) -> ModelError:
    """Translate an ``anthropic`` exception into Tether's ``ModelError``."""
    if isinstance(exc, anthropic.APIConnectionError):  # APITimeoutError is a subclass
        kind = "timed out" if isinstance(exc, anthropic.APITimeoutError) else "could not be reached"
        return ModelError(f"model provider {kind}: {exc}", retryable=True, code="model_unavailable")
    if isinstance(exc, anthropic.APIStatusError):
        # An error event in the middle of a stream arrives on a 200 response: its type says what it is.
        message = exc.api_message or exc.message
        retry_after = retry_after_seconds(exc.response.headers)
        if exc.type == "overloaded_error" or exc.status_code == 529:
            return ModelError(f"model provider overloaded: {message}", retryable=True, code="model_overloaded", retry_after=retry_after)
        if exc.type == "rate_limit_error" or exc.status_code == 429:
            return ModelError(f"model provider rate limit: {message}", retryable=True, code="model_rate_limited", retry_after=retry_after)
        retryable = exc.status_code >= 500 or (exc.status_code == 200 and exc.type == "api_error")
        status = f"HTTP {exc.status_code}" if exc.status_code != 200 else "an error event"
        return ModelError(f"model provider returned {status}: {message}", retryable=retryable, code="model_error", retry_after=retry_after)
    return ModelError(f"model provider failed: {exc}", retryable=False, code="model_error")
