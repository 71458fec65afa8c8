"""The values a run's rows hold or start from, below the records that carry them.

- How a run attaches (:data:`Attach`): :class:`AtLeaf`, :class:`Fork` or :class:`Regenerate`,
  chosen once where a start enters (the HTTP edge, AG-UI) and matched on once by
  ``Store.create_run``.
- A model turn's tool calls as an assistant message keeps them (:class:`StoredCall`).
- What a run consumed (:class:`RunUsage`, one :class:`CallUsage` per model call) and why it
  failed (:class:`RunFailure`): the ``runs.usage`` and ``runs.error`` columns, parsed once.

Each is frozen and keyword-only; those kept as JSON have ``from_json`` / ``to_json`` (their JSON
is what the API shows).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["AtLeaf", "Fork", "Regenerate", "Attach", "StoredCall", "calls_of", "calls_json", "CallUsage", "RunUsage", "RunFailure"]


@dataclass(frozen=True, slots=True, kw_only=True)
class AtLeaf:
    """How a run attaches: a new user message after the thread's active leaf (the usual turn)."""

    content: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Fork:
    """How a run attaches: a new user message as a child of ``parent_id`` (``None``: a new root,
    an edit of the first message); a sibling branch when that is not the active leaf."""

    content: str
    parent_id: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Regenerate:
    """How a run attaches: an answer to the existing user message ``message_id`` again (``None``:
    the active leaf), a sibling of its earlier answers."""

    message_id: str | None = None


#: How a run's input attaches to its thread's message tree, chosen once at the edge.
Attach = AtLeaf | Fork | Regenerate


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredCall:
    """A tool call as an assistant message keeps it: its id, tool and arguments (masked)."""

    id: str
    name: str
    #: The arguments as the model gave them, sensitive values masked (text when they were not JSON).
    args: Any = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Any) -> StoredCall:
        """One entry of the ``messages.tool_calls`` column."""
        return cls(id=str(data["id"]), name=str(data["name"]), args=data.get("args", {}))

    def to_json(self) -> dict[str, Any]:
        """``{"id", "name", "args"}``."""
        return {"id": self.id, "name": self.name, "args": self.args}


def calls_of(data: Any) -> tuple[StoredCall, ...] | None:
    """The ``messages.tool_calls`` column's JSON as records (None when there is none)."""
    return None if data is None else tuple(StoredCall.from_json(c) for c in data)


def calls_json(calls: tuple[StoredCall, ...] | None) -> list[dict[str, Any]] | None:
    """Tool calls as the ``messages.tool_calls`` column keeps them."""
    return None if calls is None else [c.to_json() for c in calls]


@dataclass(frozen=True, slots=True, kw_only=True)
class CallUsage:
    """The tokens one model call of a run consumed."""

    message_id: str
    input_tokens: int
    output_tokens: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RunUsage:
    """The tokens a run's model calls consumed: totals, and one entry per call."""

    input_tokens: int = 0
    output_tokens: int = 0
    calls: tuple[CallUsage, ...] = ()

    @classmethod
    def from_json(cls, data: Any) -> RunUsage | None:
        """The ``runs.usage`` column's JSON as a record (None when there is none)."""
        if not isinstance(data, dict):
            return None
        calls = tuple(
            CallUsage(message_id=str(c["message_id"]), input_tokens=int(c.get("input_tokens", 0)), output_tokens=int(c.get("output_tokens", 0)))
            for c in data.get("calls", [])
        )
        return cls(input_tokens=int(data.get("input_tokens", 0)), output_tokens=int(data.get("output_tokens", 0)), calls=calls)

    def add(self, call: CallUsage) -> RunUsage:
        """These totals with one more call."""
        return RunUsage(input_tokens=self.input_tokens + call.input_tokens, output_tokens=self.output_tokens + call.output_tokens, calls=(*self.calls, call))

    def to_json(self) -> dict[str, Any]:
        """``{"input_tokens", "output_tokens", "calls": [{"message_id", "input_tokens", "output_tokens"}, …]}``."""
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "calls": [{"message_id": c.message_id, "input_tokens": c.input_tokens, "output_tokens": c.output_tokens} for c in self.calls],
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class RunFailure:
    """Why a run failed: its ``error`` event's ``code`` and ``message``."""

    code: str
    message: str

    @classmethod
    def from_json(cls, data: Any) -> RunFailure | None:
        """The ``runs.error`` column's JSON as a record (None when there is none)."""
        if not isinstance(data, dict):
            return None
        return cls(code=str(data.get("code") or ""), message=str(data.get("message") or ""))

    def to_json(self) -> dict[str, str]:
        """``{"code", "message"}``."""
        return {"code": self.code, "message": self.message}
