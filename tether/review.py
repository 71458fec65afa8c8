"""Review records: what a person is asked, what they answer, and the turn that waits meanwhile.

These are the shapes that decide Tether's review guarantees, named and frozen, below both the
store and the runtime. They are built once where the data enters (the runtime parking a turn,
the HTTP edge reading a decision, the store reading a row) and read as attributes everywhere
after; their JSON is the documented wire shape, byte for byte (optional flags such as
``four_eyes`` appear only when set, as they always have).

- :class:`ActionRequest` and :class:`ReviewConfig`: one gated call as a reviewer sees it, and the
  decisions they may take on it.
- :data:`Decision`: a sum of :class:`Approve`, :class:`Reject` (a reason), :class:`Edit` (new
  arguments) and :class:`Respond` (a message instead of running the tool), told apart by their
  ``decision`` literal; :class:`Expired` stands in for a decision when the window closed first.
  An approval may carry :class:`Allow`: a standing approval of the same kind of call, for a
  while (``docs/review.md``).
- :class:`ParkedTurn` and :class:`ParkedCall`: a model turn waiting for a human, as the interrupt
  row keeps it (the runtime's :class:`~tether.runtime._turn.CallItem` is made from and into a
  :class:`ParkedCall`).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, TypeAdapter, model_serializer

from .tools import AllowArgs, Risk, RiskSource

__all__ = [
    "ActionRequest",
    "ReviewConfig",
    "DecisionKind",
    "AllowScope",
    "AllowArgs",
    "Allow",
    "Approve",
    "Reject",
    "Edit",
    "Respond",
    "Expired",
    "Decision",
    "DECISIONS",
    "ParkedCall",
    "ParkedTurn",
    "ToolStatus",
]

#: The four answers a reviewer may give.
DecisionKind = Literal["approve", "reject", "edit", "respond"]
#: What a standing approval covers: the rest of this ``run``, or any run of this ``thread``.
AllowScope = Literal["run", "thread"]


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class _Flags(_Record):
    """A record whose optional fields appear in its JSON only when set (None and False left out)."""

    #: The fields left out of the JSON while they hold their default.
    _optional: ClassVar[frozenset[str]] = frozenset()

    @model_serializer(mode="wrap")
    def _shown(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        for name in self._optional:
            if data.get(name) in (None, False):
                data.pop(name, None)
        return data


class ActionRequest(_Flags):
    """One gated call as a reviewer is shown it (sensitive arguments masked)."""

    _optional: ClassVar[frozenset[str]] = frozenset({"source", "risk_source", "four_eyes", "outcome_unknown"})

    call_id: str
    #: The tool's name.
    action: str
    #: The call's arguments, masked.
    args: dict[str, Any]
    description: str
    risk: Risk
    #: ``mcp:<server>`` for a tool of an MCP server (where it and its tier come from).
    source: str | None = None
    risk_source: RiskSource | None = None
    #: Approving it needs someone other than the run's requester.
    four_eyes: bool = False
    #: A crash cut off an earlier execution: whether it had its effect is unknown.
    outcome_unknown: bool = False


class ReviewConfig(_Flags):
    """The decisions a reviewer may take on one action."""

    _optional: ClassVar[frozenset[str]] = frozenset({"allow_args"})

    allowed_decisions: list[DecisionKind]
    #: What an approval's :class:`Allow` may cover (``args``): none when left out.
    allow_args: list[AllowArgs] | None = None


class Allow(_Record):
    """A standing approval asked for with an approval: calls of the same tool that it covers run
    without asking, until it expires or is revoked (an *allowance*)."""

    scope: AllowScope = "run"
    args: AllowArgs = "same"
    #: How long it holds, in seconds (at most the server's maximum).
    ttl_s: int = Field(gt=0)


class Approve(_Flags):
    """Run the call as proposed; with :attr:`allow`, also allow calls like it for a while."""

    _optional: ClassVar[frozenset[str]] = frozenset({"allow"})

    #: The call decided (empty until the decision is paired with its call).
    call_id: str = ""
    decision: Literal["approve"] = "approve"
    allow: Allow | None = None


class Reject(_Record):
    """Do not run the call; the reason goes back to the model."""

    call_id: str = ""
    decision: Literal["reject"] = "reject"
    reason: str | None = None


class Edit(_Record):
    """Run the call with these arguments (the real, validated ones once checked; masked where shown)."""

    call_id: str = ""
    decision: Literal["edit"] = "edit"
    args: dict[str, Any]


class Respond(_Record):
    """Do not run the call; this message is its result."""

    call_id: str = ""
    decision: Literal["respond"] = "respond"
    message: str


class Expired(_Record):
    """Nobody decided in time: the call is not run (what an expiry records in a decision's place)."""

    call_id: str = ""
    decision: Literal["expired"] = "expired"


#: A reviewer's answer to one action (or, where the window closed first, :class:`Expired`).
Decision = Annotated[Approve | Reject | Edit | Respond | Expired, Field(discriminator="decision")]
#: Parses (and dumps) a list of decisions.
DECISIONS: TypeAdapter[list[Decision]] = TypeAdapter(list[Decision])

#: A tool call's one outcome (a ``tool_result``'s ``status``).
ToolStatus = Literal["ok", "error", "rejected", "expired", "responded", "cancelled", "unknown"]


class ParkedCall(_Flags):
    """One call of a parked turn: its real arguments and, once settled, its one result."""

    _optional: ClassVar[frozenset[str]] = frozenset({"risk", "result", "error", "reason", "decision", "outcome_unknown"})

    id: str
    name: str
    #: The validated arguments (the model's raw arguments when they did not validate).
    args: Any = Field(default_factory=dict)
    #: The call's tier, computed from its arguments (none for a call that did not validate).
    risk: Risk | None = None
    gated: bool = False
    status: ToolStatus | None = None
    result: Any = None
    error: str | None = None
    reason: str | None = None
    decision: Decision | None = None
    outcome_unknown: bool = False


class ParkedTurn(_Record):
    """A model turn waiting for a human: every call in the model's order, and the steering
    messages queued when it parked (they join the history after the results)."""

    #: The assistant message that asked for the calls (the tool messages follow it).
    assistant_message_id: str | None = None
    calls: tuple[ParkedCall, ...] = ()
    #: ``(message_id, content)`` of announced steering messages not yet in the tree.
    steering: tuple[tuple[str, str], ...] = ()
