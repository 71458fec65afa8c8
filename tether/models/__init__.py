"""The model interface: a small async stream of deltas, cancelled by cancelling its consumer.

A model gets a :class:`ModelRequest` (the history the agent should see and the tools it may
call) and yields :class:`TextDelta`, :class:`ThinkingDelta`, :class:`ToolCallStart` as soon as it
begins a tool call (the runtime shows it as a ``status``, so nobody watches silence while the
arguments are generated) and, once a call is fully assembled, :class:`ToolCallRequest`. An
answer that the model did not end itself (cut by the output limit, stopped for repeating) ends
with :class:`AnswerCut`: its text is still the answer, marked as cut.

**Output that is no answer.** A model whose output is cut short by its token limit in the middle
of a tool call, or that is otherwise neither an answer nor a call, raises
:func:`~tether.models._output.output_invalid`'s ``ModelError`` (``model_output_invalid``) instead of
passing the fragment on: :mod:`tether.models._output` asks it once more, then the run fails with
that error. Nothing of such an output is ever shown as text or executed. The runtime consumes the stream inside ``contextlib.aclosing`` and a
cancel scope: cancelling the run cancels the ``await`` inside the generator, and the generator's
``finally`` closes the upstream request so the provider stops generating.

**Usage.** A model reports the tokens it consumed on :attr:`ModelRequest.usage`, a small mutable
:class:`Usage` it updates while it streams (the totals of this call so far), rather than as a
delta at the end: a cancelled call never reaches its end, yet the tokens it consumed up to the
cancel are real, and the caller reads them after the stream stopped, however it stopped.

Implementations: :class:`~tether.models.scripted.ScriptedModel` (a documented test double, the
demo's default), :class:`~tether.models.openai.OpenAIModel` (any OpenAI-compatible Chat
Completions endpoint), :class:`~tether.models.anthropic.AnthropicModel` (Anthropic's Messages
API) and :class:`~tether.models.llamacpp.LlamaCppModel` (a GGUF file in process, the ``local``
extra). :func:`load_model` turns a model string (``"anthropic:claude-sonnet-4-5"``) into one;
see ``docs/models.md``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from ..events import FinishReason

__all__ = [
    "load_model",
    "output_invalid",
    "ChatMessage",
    "ToolCallRequest",
    "ToolSpec",
    "ModelRequest",
    "Usage",
    "TextDelta",
    "ThinkingDelta",
    "ToolCallStart",
    "AnswerCut",
    "FinishReason",
    "ModelDelta",
    "Model",
    "RetryPolicy",
]


@dataclass(frozen=True, slots=True)
class ToolCallRequest:
    """One complete tool call asked for by the model (``args`` is the raw text if not JSON)."""

    id: str
    name: str
    args: dict[str, Any] | str


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """One message of the history shown to the model."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str
    tool_calls: tuple[ToolCallRequest, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool as the model sees it."""

    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(slots=True)
class Usage:
    """Tokens consumed by model calls: the provider's counts, or counted locally."""

    input_tokens: int = 0
    output_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        """Input and output tokens together."""
        return self.input_tokens + self.output_tokens

    def add(self, other: Usage) -> None:
        """Add ``other``'s counts to these."""
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens

    def to_json(self) -> dict[str, int]:
        """``{"input_tokens": …, "output_tokens": …}``."""
        return {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens}


@dataclass(frozen=True, slots=True)
class ModelRequest:
    """Everything one model call gets, and where it reports the tokens it consumed."""

    messages: list[ChatMessage]
    tools: list[ToolSpec] = field(default_factory=list)
    #: Set by the model while it streams: this call's token counts so far (see the module docs).
    usage: Usage = field(default_factory=Usage, compare=False)


@dataclass(frozen=True, slots=True)
class TextDelta:
    """A piece of assistant text."""

    text: str


@dataclass(frozen=True, slots=True)
class ThinkingDelta:
    """A piece of reasoning text."""

    text: str


@dataclass(frozen=True, slots=True)
class ToolCallStart:
    """The model began a tool call (``name`` once known); its arguments are being generated."""

    name: str | None = None

    @property
    def detail(self) -> str:
        """The ``status`` event's ``detail`` for it: ``"calling a tool: get_order"``."""
        return f"calling a tool: {self.name}" if self.name else "calling a tool"


@dataclass(frozen=True, slots=True)
class AnswerCut:
    """The answer in words that streamed was cut short, not ended by the model (last delta).

    Its text is what the user read, so it stays the answer (``done``), marked with ``reason``
    as its ``finish_reason``. A tool call cut short is no answer: that raises
    :func:`~tether.models._output.output_invalid` instead.
    """

    reason: FinishReason


ModelDelta = TextDelta | ThinkingDelta | ToolCallStart | ToolCallRequest | AnswerCut


@runtime_checkable
class Model(Protocol):
    """A streaming chat model."""

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelDelta]:
        """Yield deltas for one model call; must stop promptly when the consumer is cancelled."""
        ...


# They need the types above.
from ._output import output_invalid  # noqa: E402
from ._registry import load_model  # noqa: E402
from ._retry import RetryPolicy  # noqa: E402
