"""The history a model is given for a run: the thread's active path as the model reads it.

The path is cut by the agent's :class:`~tether.history.HistoryPolicy` (defined below the agent,
in :mod:`tether.history`, and re-exported here); the path is read from the store only as far
back as the policy can keep (``Store.path_to(limit=…)``).
"""

from __future__ import annotations

from ..history import HistoryPolicy
from ..models import ChatMessage, ToolCallRequest
from ..store import MessageRecord
from ._turn import model_view

__all__ = ["HistoryPolicy", "to_chat_messages"]


def to_chat_messages(path: list[MessageRecord]) -> list[ChatMessage]:
    """The history a model sees for a message path.

    Assistant turns that were cancelled or failed before producing anything are left out: they
    carry no content and would only confuse the model.
    """
    history: list[ChatMessage] = []
    for m in path:
        if m.role == "assistant" and m.status in ("cancelled", "failed", "partial") and not m.content and not m.tool_calls:
            continue
        calls = tuple(ToolCallRequest(c.id, c.name, c.args) for c in (m.tool_calls or ()))
        content = model_view(m.content) if m.role == "tool" else m.content
        history.append(ChatMessage(m.role, content, calls, m.tool_call_id, m.name))  # type: ignore[arg-type]  # roles are checked by the store
    return history
