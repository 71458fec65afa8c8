"""The conversation in AG-UI's words, and an AG-UI client's message list matched to the tree.

An AG-UI client sends its whole message list with every run; Tether keeps the thread's message
tree and never lets a client overwrite it. :func:`plan_run` reads the client's list against the
tree, following parent links from the root, and decides what the list *asks for*:

- it is a path of the tree plus one new user message → a run on that path: the normal case
  when the path ends at the active leaf, a fork (the user edited an earlier message, or
  continues another branch) when it ends elsewhere;
- a user message whose id is known but whose text differs, as the last message → an edit of it:
  a fork at its parent with the new text;
- a path of the tree ending at a user message, and nothing new → regenerate that message's
  answer;
- anything else (unknown messages before the end, more than one new message, a new message
  that is not the user's) → :class:`~tether.errors.InvalidRequest` ``history_mismatch``; the
  server's history is never silently replaced.

User and assistant messages are matched by id (Tether's ids, which the stream and every
``MESSAGES_SNAPSHOT`` give the client), tool messages by their ``toolCallId`` under the assistant
message that made the call. System, developer, activity and reasoning messages are the
client's own and are not matched.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ..errors import FieldError, InvalidRequest
from ..runtime import tool_message_content
from ..store import AtLeaf, Attach, Fork, InterruptRecord, MessageRecord, Regenerate, RunRecord
from ._mapping import tool_message_id

__all__ = ["agui_messages", "parked_messages", "path_before_run", "plan_run", "message_text"]

#: The roles matched against the tree (the rest are the client's own).
_MATCHED_ROLES = ("user", "assistant", "tool")


def agui_messages(path: Sequence[MessageRecord]) -> list[dict[str, Any]]:
    """A path of the tree as AG-UI messages (``MESSAGES_SNAPSHOT.messages``)."""
    out: list[dict[str, Any]] = []
    for m in path:
        if m.role == "user":
            message: dict[str, Any] = {"id": m.id, "role": "user", "content": m.content}
        elif m.role == "assistant":
            message = {"id": m.id, "role": "assistant", "content": m.content}
            if m.tool_calls:
                message["toolCalls"] = [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": json.dumps(c.args, ensure_ascii=False, separators=(",", ":"))},
                    }
                    for c in m.tool_calls
                ]
        elif m.role == "tool" and m.tool_call_id is not None:
            message = {"id": tool_message_id(m.run_id, m.tool_call_id), "role": "tool", "toolCallId": m.tool_call_id, "content": m.content}
        else:
            continue
        if m.status != "complete":
            message["metadata"] = {"tether": {"status": m.status}}
        out.append(message)
    return out


def parked_messages(path: Sequence[MessageRecord], interrupt: InterruptRecord) -> list[dict[str, Any]]:
    """The conversation as a client has it when ``interrupt`` paused the run: ``path`` (the
    store's, up to the turn that asked) and the results the turn's calls already had, which join
    the tree only once every call of the turn is settled."""
    results = [
        {
            "id": tool_message_id(interrupt.run_id, call.id),
            "role": "tool",
            "toolCallId": call.id,
            "content": tool_message_content(call.status, call.result, call.error, call.reason),
        }
        for call in interrupt.turn.calls
        if call.status is not None
    ]
    return agui_messages(path) + results


def path_before_run(path: Sequence[MessageRecord], run: RunRecord) -> list[MessageRecord]:
    """The part of ``path`` that was there when ``run`` started: up to its input message (the
    messages the run produced are streamed, not snapshotted)."""
    before: list[MessageRecord] = []
    for m in path:
        if m.run_id == run.id and m.id != run.input_message_id:
            break
        before.append(m)
    return before


def message_text(message: dict[str, Any], index: int) -> str:
    """The text of a client message (a string, or text parts; other parts are refused)."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise InvalidRequest(
                    "only text content is supported",
                    code="unsupported_content",
                    fields=[FieldError(("messages", index, "content"), "only text parts are supported", "unsupported")],
                )
            texts.append(part["text"])
        return "".join(texts)
    return ""


def _mismatch(message: str, index: int, client_id: Any, **details: Any) -> InvalidRequest:
    return InvalidRequest(
        message,
        code="history_mismatch",
        details={"index": index, "message_id": client_id, **details},
    )


def plan_run(client: Sequence[dict[str, Any]], tree: Sequence[MessageRecord], active_leaf_id: str | None) -> Attach:
    """Match the client's message list (``RunAgentInput.messages``, as JSON) against the tree:
    where the run it asks for attaches (see the module docstring)."""
    by_id = {m.id: m for m in tree}
    children: dict[str | None, list[MessageRecord]] = {}
    for m in tree:
        children.setdefault(m.parent_id, []).append(m)
    listed = [(i, m) for i, m in enumerate(client) if m.get("role") in _MATCHED_ROLES]

    node: MessageRecord | None = None
    matched = 0
    for index, message in listed:
        parent_id = node.id if node is not None else None
        record: MessageRecord | None
        if message["role"] == "tool":
            record = next((c for c in children.get(parent_id, []) if c.role == "tool" and c.tool_call_id == message.get("toolCallId")), None)
        else:
            record = by_id.get(str(message.get("id")))
            if record is not None and (record.parent_id != parent_id or record.role != message["role"]):
                raise _mismatch(
                    f"message {message.get('id')!r} is not where the client has it: the history does not match the server's",
                    index,
                    message.get("id"),
                )
        if record is None or (record.role == "user" and message_text(message, index) != record.content):
            break
        node = record
        matched += 1

    rest = listed[matched:]
    if not rest:
        if node is not None and node.role == "user":
            return Regenerate(message_id=node.id)  # regenerate its answer
        raise InvalidRequest(
            "the message list holds no new user message to answer",
            code="nothing_to_run",
            details={"last_message_id": node.id if node is not None else None},
        )
    index, new = rest[0]
    if len(rest) > 1:
        raise _mismatch(
            f"message {new.get('id')!r} is not in the server's history, and it is not the last message: only one new user message, at the end, can be added",
            index,
            new.get("id"),
            matched=matched,
        )
    if new["role"] != "user":
        raise _mismatch(f"the new message {new.get('id')!r} is a {new['role']} message; only a user message can start a run", index, new.get("id"))
    content = message_text(new, index)
    if not content:
        raise InvalidRequest("the new user message is empty", code="empty_message", fields=[FieldError(("messages", index, "content"), "empty", "empty")])
    parent_id = node.id if node is not None else None
    if parent_id == active_leaf_id:
        return AtLeaf(content=content)
    return Fork(content=content, parent_id=parent_id)
