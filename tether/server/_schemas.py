"""Request bodies of the HTTP API (validated by pydantic; unknown fields are refused)."""

from __future__ import annotations

import json
import math
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from .. import review
from ..errors import FieldError, InvalidRequest
from ..runtime import RunConfig
from ..store import MAX_TITLE_CHARS, AtLeaf, Attach, Fork, Regenerate, clean_title

__all__ = [
    "CreateThread",
    "RenameThread",
    "RunInput",
    "CreateRun",
    "CancelRun",
    "SetActiveLeaf",
    "MessageContent",
    "SteeringMessage",
    "ResumeThread",
    "DecisionBody",
    "decision_of",
    "DecideMany",
    "AguiMessage",
    "AguiResumeEntry",
    "AguiTetherProps",
    "AguiRunInput",
    "MAX_CONTENT_CHARS",
    "MAX_STEERING_CHARS",
    "MAX_METADATA_BYTES",
    "MAX_EDIT_ARGS_BYTES",
]

_STRICT = ConfigDict(extra="forbid")


#: How deeply free-form JSON (``metadata``) may nest; response encoding gives up far earlier
#: than the JSON parser does.
MAX_JSON_DEPTH = 32

# Field caps (each documented in docs/api.md, "Limits"); the request body as a whole is capped
# before parsing (``Limits.max_body_bytes``).

#: A message's content: a run's input, a user's edit of an assistant message (characters).
MAX_CONTENT_CHARS = 1_000_000
#: A steering message sent into a running run (characters).
MAX_STEERING_CHARS = 100_000
#: A thread's ``metadata``, as compact JSON in UTF-8 (bytes): it is sent back with every thread.
MAX_METADATA_BYTES = 16 * 1024
#: The ``args`` of an ``edit`` decision, as compact JSON in UTF-8 (bytes).
MAX_EDIT_ARGS_BYTES = 64 * 1024


def _check_json_size(value: Any, limit: int) -> None:
    size = len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass"))
    if size > limit:
        raise ValueError(f"at most {limit} bytes of JSON (this is {size})")


def _check_json_value(value: Any, depth: int = 0) -> None:
    """Refuse what parses as JSON but cannot be stored and sent back as JSON.

    Python's JSON parser accepts lone surrogates (``"\\ud800"``), overflowing numbers
    (``1e400`` → ``inf``) and nesting hundreds of levels deep; none of these can be encoded in a
    response again, so one such value in free-form ``metadata`` would make every later read of
    the thread fail.
    """
    if depth > MAX_JSON_DEPTH:
        raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels")
    if isinstance(value, str):
        _check_text(value)
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("numbers must be finite")
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_json_value(key, depth + 1)
            _check_json_value(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            _check_json_value(item, depth + 1)


def _check_text(value: str) -> str:
    """Text that every backend can store and every response can send back: valid Unicode
    (no lone surrogates) and no NUL character (PostgreSQL refuses it in text and JSON)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("strings must be valid Unicode (no lone surrogates)") from None
    if "\x00" in value:
        raise ValueError("strings must not contain the NUL character")
    return value


#: A string the store can keep on any backend.
Text = Annotated[str, AfterValidator(_check_text)]


def _check_title(value: str) -> str:
    """A thread's title on one line (runs of whitespace and control characters become one
    space, ends trimmed): 1 to ``MAX_TITLE_CHARS`` characters."""
    title = clean_title(value)
    if not title:
        raise ValueError("a title needs at least one visible character")
    if len(title) > MAX_TITLE_CHARS:
        raise ValueError(f"at most {MAX_TITLE_CHARS} characters (this is {len(title)})")
    return title


#: A thread's title, cleaned (``clean_title``) and checked.
Title = Annotated[str, AfterValidator(_check_text), AfterValidator(_check_title)]


class CreateThread(BaseModel):
    """``POST /v1/threads``."""

    model_config = _STRICT
    metadata: dict[str, Any] = Field(default_factory=dict)
    #: The thread's title; left out, the thread takes one from its first message.
    title: Title | None = None

    @field_validator("metadata")
    @classmethod
    def _storable(cls, value: dict[str, Any]) -> dict[str, Any]:
        _check_json_value(value)
        _check_json_size(value, MAX_METADATA_BYTES)
        return value


class RunInput(BaseModel):
    """The user's message that starts a run."""

    model_config = _STRICT
    content: Text = Field(min_length=1, max_length=MAX_CONTENT_CHARS)


class CreateRun(BaseModel):
    """``POST /v1/threads/{id}/runs``."""

    model_config = _STRICT
    input: RunInput | None = None
    #: Where the new user message attaches. Absent: the thread's active leaf. ``null``: a new
    #: root (editing the first message). A user message and no ``input``: regenerate its answer.
    parent_id: Text | None = Field(default=None, max_length=64)
    config: RunConfig = Field(default_factory=RunConfig)

    def attach(self) -> Attach:
        """Where the run's input goes, as the core takes it (chosen here, once)."""
        given_parent = "parent_id" in self.model_fields_set
        if self.input is not None:
            return Fork(content=self.input.content, parent_id=self.parent_id) if given_parent else AtLeaf(content=self.input.content)
        if given_parent and self.parent_id is None:
            raise InvalidRequest(
                "a run without input regenerates an answer: parent_id must be a user message of this thread",
                code="input_required",
                fields=[FieldError(("input",), "input.content is required unless parent_id is a user message", "missing")],
            )
        return Regenerate(message_id=self.parent_id)  # no parent_id: the active leaf's answer


class RenameThread(BaseModel):
    """``PATCH /v1/threads/{id}``."""

    model_config = _STRICT
    title: Title


class SetActiveLeaf(BaseModel):
    """``PUT /v1/threads/{id}/active_leaf``."""

    model_config = _STRICT
    message_id: Text = Field(min_length=1, max_length=64)


class MessageContent(BaseModel):
    """``PATCH /v1/messages/{id}``."""

    model_config = _STRICT
    content: Text = Field(min_length=1, max_length=MAX_CONTENT_CHARS)


class SteeringMessage(BaseModel):
    """``POST /v1/runs/{id}/messages``."""

    model_config = _STRICT
    content: Text = Field(min_length=1, max_length=MAX_STEERING_CHARS)


class CancelRun(BaseModel):
    """``POST /v1/runs/{id}/cancel``."""

    model_config = _STRICT
    mode: Literal["soft", "hard"] = "soft"
    reason: Text | None = Field(default=None, max_length=2000)


class Approve(BaseModel):
    """Run the action as proposed; with ``allow``, also allow calls like it for a while (a
    standing approval: ``docs/review.md``)."""

    model_config = _STRICT
    decision: Literal["approve"]
    allow: review.Allow | None = None


class Reject(BaseModel):
    """Do not run the action; the reason goes back to the model."""

    model_config = _STRICT
    decision: Literal["reject"]
    reason: Text | None = Field(default=None, max_length=4000)


class Edit(BaseModel):
    """Run the action with these arguments (validated against the tool's schema)."""

    model_config = _STRICT
    decision: Literal["edit"]
    args: dict[str, Any]

    @field_validator("args")
    @classmethod
    def _storable(cls, value: dict[str, Any]) -> dict[str, Any]:
        _check_json_value(value)
        _check_json_size(value, MAX_EDIT_ARGS_BYTES)
        return value


class Respond(BaseModel):
    """Do not run the action; this message is its result."""

    model_config = _STRICT
    decision: Literal["respond"]
    message: Text = Field(min_length=1, max_length=100_000)


DecisionBody = Annotated[Approve | Reject | Edit | Respond, Field(discriminator="decision")]


def decision_of(body: Approve | Reject | Edit | Respond) -> review.Decision:
    """A decision as the API received it (validated), as the review record the core works with."""
    if isinstance(body, Reject):
        return review.Reject(reason=body.reason)
    if isinstance(body, Edit):
        return review.Edit(args=body.args)
    if isinstance(body, Respond):
        return review.Respond(message=body.message)
    return review.Approve(allow=body.allow)


class ResumeThread(BaseModel):
    """``POST /v1/threads/{id}/resume``: one decision per action of the interrupt, in order."""

    model_config = _STRICT
    interrupt_id: Text = Field(min_length=1, max_length=64)
    decisions: list[DecisionBody] = Field(min_length=1, max_length=100)


# -- AG-UI (``/v1/agui``) -----------------------------------------------------------------------
# AG-UI's own shapes, in its camelCase. Unlike Tether's bodies they ignore fields they do not
# know: AG-UI lets clients send material a server does not read (and newer clients send more).

_AGUI = ConfigDict(extra="ignore", populate_by_name=True, alias_generator=to_camel)


class AguiMessage(BaseModel):
    """One message of ``RunAgentInput.messages`` (only what matching the tree reads)."""

    model_config = _AGUI
    id: Text = Field(min_length=1, max_length=200)
    role: Literal["developer", "system", "assistant", "user", "tool", "activity", "reasoning"]
    content: Any = None
    tool_call_id: Text | None = Field(default=None, max_length=200)

    @field_validator("content")
    @classmethod
    def _storable(cls, value: Any) -> Any:
        _check_json_value(value)
        return value


class AguiResumeEntry(BaseModel):
    """One answer of ``RunAgentInput.resume``."""

    model_config = _AGUI
    interrupt_id: Text = Field(min_length=1, max_length=300)
    status: Literal["resolved", "cancelled"]
    payload: Any = None

    @field_validator("payload")
    @classmethod
    def _storable(cls, value: Any) -> Any:
        _check_json_value(value)
        return value


class AguiTetherProps(BaseModel):
    """``forwardedProps.tether``: what a client may tell Tether beyond AG-UI."""

    model_config = _STRICT
    #: Options of a new run (as ``config`` of ``POST /v1/threads/{id}/runs``).
    config: RunConfig = Field(default_factory=RunConfig)
    #: ``/v1/agui/connect``: the run to reattach to (default: the thread's latest).
    run_id: Text | None = Field(default=None, min_length=1, max_length=64)


class AguiRunInput(BaseModel):
    """AG-UI's ``RunAgentInput`` (``POST /v1/agui`` and ``/v1/agui/connect``)."""

    model_config = _AGUI
    #: Becomes a Tether thread id when new, so it must work in a URL path as one segment.
    thread_id: Text = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._:~-]+$")
    run_id: Text = Field(min_length=1, max_length=200)
    protocol_version: Text | None = Field(default=None, max_length=20)
    messages: list[AguiMessage] = Field(default_factory=list, max_length=10_000)
    resume: list[AguiResumeEntry] | None = Field(default=None, max_length=100)
    forwarded_props: Any = None

    def tether_props(self) -> AguiTetherProps:
        """``forwardedProps.tether``, validated (``ValidationError`` when it is wrong)."""
        props = self.forwarded_props.get("tether") if isinstance(self.forwarded_props, dict) else None
        return AguiTetherProps.model_validate(props or {})


class DecideMany(BaseModel):
    """``POST /v1/interrupts/decide``: the same decision for every action of several interrupts."""

    model_config = _STRICT
    interrupt_ids: list[Annotated[Text, Field(min_length=1, max_length=64)]] = Field(min_length=1, max_length=100)
    decision: Literal["approve", "reject"]
    reason: Text | None = Field(default=None, max_length=4000)
    #: With ``approve``: the standing approval every approved action also gives.
    allow: review.Allow | None = None

    @model_validator(mode="after")
    def _allow_with_approve(self) -> DecideMany:
        if self.allow is not None and self.decision != "approve":
            raise ValueError("allow goes with decision approve only")
        return self

    @field_validator("interrupt_ids")
    @classmethod
    def _distinct(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("interrupt ids must be distinct")
        return value
