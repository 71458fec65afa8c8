"""The model interface: a small async stream of deltas, cancelled by cancelling its consumer.

A model gets a :class:`ModelRequest` (the history the agent should see and the tools it may
call) and yields :class:`TextDelta`, :class:`ThinkingDelta` and, once a call is fully assembled,
:class:`ToolCallRequest`. The runtime consumes the stream inside ``contextlib.aclosing`` and a
cancel scope: cancelling the run cancels the ``await`` inside the generator, and the generator's
``finally`` closes the upstream request so the provider stops generating.

Implementations: :class:`~tether.models.scripted.ScriptedModel` (a documented test double, the
demo's default) and :class:`~tether.models.openai.OpenAIModel` (any OpenAI-compatible Chat
Completions endpoint).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

__all__ = [
    "ChatMessage",
    "ToolCallRequest",
    "ToolSpec",
    "ModelRequest",
    "TextDelta",
    "ThinkingDelta",
    "ModelDelta",
    "Model",
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


@dataclass(frozen=True, slots=True)
class ModelRequest:
    """Everything one model call gets."""

    messages: list[ChatMessage]
    tools: list[ToolSpec] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class TextDelta:
    """A piece of assistant text."""

    text: str


@dataclass(frozen=True, slots=True)
class ThinkingDelta:
    """A piece of reasoning text."""

    text: str


ModelDelta = TextDelta | ThinkingDelta | ToolCallRequest


@runtime_checkable
class Model(Protocol):
    """A streaming chat model."""

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelDelta]:
        """Yield deltas for one model call; must stop promptly when the consumer is cancelled."""
        ...
