"""How much of a thread a model is given: :class:`HistoryPolicy` (``Agent(history=…)``).

A thread can grow without bound; what a model can take cannot. The :class:`HistoryPolicy` of the
agent bounds it: the system prompt (the agent's, never part of the thread) always goes first,
then the newest messages of the active path that fit both a message budget and a character
budget. The path is read from the store only that far back (``Store.path_to(limit=…)``), so a
run on a 100,000-message thread costs what a run on a short one does.

The cut never separates a tool call from its results: a model refuses a history that starts
with a tool result whose call it cannot see, so tool results at the cut go with their call.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from .models import ChatMessage

__all__ = ["HistoryPolicy"]


@dataclass(frozen=True, slots=True)
class HistoryPolicy:
    """How much of a thread's active path an agent's model is given (``Agent(history=…)``).

    The newest messages are kept while both budgets hold; the newest message is always kept,
    whatever its size (its size is capped at the API).
    """

    #: The most messages of the path given to the model (the system prompt not counted).
    max_messages: int = 500
    #: The most characters of content and tool-call arguments given to the model.
    max_chars: int = 400_000

    def __post_init__(self) -> None:
        if self.max_messages < 1 or self.max_chars < 1:
            raise ValueError("HistoryPolicy budgets must be positive")

    def apply(self, history: list[ChatMessage]) -> list[ChatMessage]:
        """The newest part of ``history`` within the budgets, starting at a message that is
        not a tool result (results whose call is cut off are cut with it)."""
        start = len(history)
        chars = 0
        while start > 0 and len(history) - start < self.max_messages:
            size = _size(history[start - 1])
            if start < len(history) and chars + size > self.max_chars:
                break
            chars += size
            start -= 1
        cut = start
        while cut < len(history) and history[cut].role == "tool":
            cut += 1
        if cut == len(history):
            # Only tool results fit: keep the call they answer instead of nothing.
            cut = start
            while cut > 0 and history[cut].role == "tool":
                cut -= 1
        return history[cut:] if cut else list(history)


def _size(message: ChatMessage) -> int:
    return len(message.content) + sum(len(call.name) + len(json.dumps(call.args, default=str)) for call in message.tool_calls)
