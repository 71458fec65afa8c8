"""The history a model is given for a run: the thread's active path as chat messages."""

from __future__ import annotations

from ..models import ChatMessage, ToolCallRequest
from ..store import MessageRecord

__all__ = ["to_chat_messages"]


def to_chat_messages(path: list[MessageRecord]) -> list[ChatMessage]:
    """The history a model sees for a message path.

    Assistant turns that were cancelled or failed before producing anything are left out: they
    carry no content and would only confuse the model.
    """
    history: list[ChatMessage] = []
    for m in path:
        if m.role == "assistant" and m.status in ("cancelled", "failed", "partial") and not m.content and not m.tool_calls:
            continue
        calls = tuple(ToolCallRequest(c["id"], c["name"], c.get("args", {})) for c in (m.tool_calls or ()))
        history.append(ChatMessage(m.role, m.content, calls, m.tool_call_id, m.name))  # type: ignore[arg-type]  # roles are checked by the store
    return history
