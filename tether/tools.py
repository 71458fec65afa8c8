"""Tools: plain typed async functions that an agent may call.

``@tool`` turns a function into a :class:`Tool`: its name, its docstring as the description,
and a JSON schema derived with pydantic from the type hints. Arguments from the model are
validated against that schema before anything else happens; invalid arguments become a
``tool_result`` error fed back to the model, never a crash.

Each tool carries a *risk tier*: ``read_only`` tools run at once, ``reversible`` and
``destructive`` ones may be gated for human review. The tier may also be a function of a call's
validated arguments (``risk=lambda args: "reversible" if args["amount"] <= 20 else
"destructive"``, a :data:`RiskFn`), or a subclass may override :meth:`Tool.risk_for`: the gate,
the ``tool_call`` event, the approval card and the audit then use the tier of that call, and a
function that fails gates the call as ``destructive``. Arguments annotated with
:class:`Sensitive` (``Annotated[str, Sensitive]``) are masked wherever they leave the tool:
events, API responses, logs and the audit log. The tool itself receives the real value.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal, get_args, get_origin, get_type_hints, overload

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from .errors import ToolArgsError

__all__ = ["tool", "Tool", "ToolContext", "Sensitive", "Risk", "RiskFn", "RiskSource", "AllowArgs", "Decision", "mask_value", "ToolArgsError"]

log = logging.getLogger("tether.tools")

Risk = Literal["read_only", "reversible", "destructive"]
#: A tier computed per call: given the call's validated arguments (by name), it returns the tier.
RiskFn = Callable[[dict[str, Any]], Risk]
Decision = Literal["approve", "reject", "edit", "respond"]
#: Which calls of a tool a standing approval covers: with the ``same`` arguments, or ``any``.
AllowArgs = Literal["same", "any"]
#: What a standing approval may cover by default, by the tier of the approved call.
DEFAULT_ALLOW_ARGS: dict[str, tuple[AllowArgs, ...]] = {"read_only": ("same", "any"), "reversible": ("same", "any"), "destructive": ("same",)}
#: Where a tool's tier came from (see :attr:`Tool.risk_source`).
RiskSource = Literal["author", "annotation", "spec default", "untrusted server"]
RISK_ORDER: dict[str, int] = {"read_only": 0, "reversible": 1, "destructive": 2}
DEFAULT_APPROVAL_TTL_S = 600.0


class Sensitive:
    """Marker for ``Annotated[str, Sensitive]``: the argument is masked outside the tool."""


@dataclass(frozen=True, slots=True)
class ToolContext:
    """What a tool may know about the call it serves (declare a parameter of this type)."""

    run_id: str
    thread_id: str
    call_id: str


def mask_value(value: Any) -> str:
    """Mask a sensitive value, keeping at most its last four characters (``****4242``)."""
    text = str(value)
    return "****" + (text[-4:] if len(text) > 8 else "")


def _is_sensitive(annotation: Any) -> bool:
    return get_origin(annotation) is Annotated and any(meta is Sensitive or isinstance(meta, Sensitive) for meta in get_args(annotation)[1:])


class Tool:
    """A callable tool with its schema, risk tier and review settings."""

    def __init__(
        self,
        fn: Callable[..., Awaitable[Any]],
        *,
        name: str | None = None,
        description: str | None = None,
        risk: Risk | RiskFn = "read_only",
        allowed_decisions: tuple[Decision, ...] | None = None,
        approval_ttl_s: float = DEFAULT_APPROVAL_TTL_S,
        describe: str | None = None,
        allow_sensitive_edit: bool = False,
        four_eyes: bool = False,
        allow_args: Sequence[AllowArgs] | None = None,
    ) -> None:
        if not inspect.iscoroutinefunction(fn):
            raise TypeError(f"tool {fn.__name__!r} must be an async function")
        self.fn = fn
        self._init_review(
            name=name or fn.__name__,
            description=description or inspect.cleandoc(fn.__doc__ or "").split("\n\n")[0] or name or fn.__name__,
            risk=risk,
            allowed_decisions=allowed_decisions,
            approval_ttl_s=approval_ttl_s,
            describe=describe,
            allow_sensitive_edit=allow_sensitive_edit,
            four_eyes=four_eyes,
            allow_args=allow_args,
        )

        hints = get_type_hints(fn, include_extras=True)
        fields: dict[str, Any] = {}
        sensitive: set[str] = set()
        self._context_param: str | None = None
        for param in inspect.signature(fn).parameters.values():
            annotation = hints.get(param.name, Any)
            if annotation is ToolContext:
                self._context_param = param.name
                continue
            if _is_sensitive(annotation):
                sensitive.add(param.name)
            default = ... if param.default is inspect.Parameter.empty else param.default
            fields[param.name] = (annotation, default)
        #: The arguments masked wherever a call is shown (``Annotated[str, Sensitive]``).
        self.sensitive_args: frozenset[str] = frozenset(sensitive)
        self.args_model: type[BaseModel] = create_model(f"{self.name}_args", __config__=ConfigDict(extra="forbid"), **fields)

    def _init_review(
        self,
        *,
        name: str,
        description: str,
        risk: Risk | RiskFn,
        allowed_decisions: tuple[Decision, ...] | None,
        approval_ttl_s: float,
        describe: str | None,
        allow_sensitive_edit: bool,
        four_eyes: bool,
        risk_source: RiskSource = "author",
        allow_args: Sequence[AllowArgs] | None = None,
    ) -> None:
        """Set what every kind of tool has: its name, description, tier and review settings."""
        #: The function that computes a call's tier, when the tier is per call (:meth:`risk_for`).
        self.risk_fn: RiskFn | None = None
        if callable(risk):
            self.risk_fn, risk = risk, "destructive"
        if risk not in RISK_ORDER:
            raise ValueError(f"unknown risk tier {risk!r}")
        self.name = name
        self.description = description
        #: The tool's tier; for a tool whose tier is per call, the tier of a call whose own tier
        #: is not known (``destructive``).
        self.risk: Risk = risk
        #: Where the tier came from: the author's code (``author``), or for a tool of an MCP
        #: server its annotations (``annotation``), the spec's defaults for a tool without them
        #: (``spec default``) or the server not being trusted (``untrusted server``).
        self.risk_source: RiskSource = risk_source
        self.approval_ttl_s = approval_ttl_s
        self.describe_template = describe
        #: Whether a reviewer's ``edit`` may change a sensitive argument (never reveal it).
        self.allow_sensitive_edit = allow_sensitive_edit
        #: Whether an approve (or edit) must come from a principal other than the run's requester.
        self.four_eyes = four_eyes
        self.allowed_decisions: tuple[Decision, ...] = tuple(allowed_decisions) if allowed_decisions is not None else ("approve", "reject", "edit")
        unknown = [a for a in allow_args or () if a not in ("same", "any")]
        if unknown:
            raise ValueError(f"allow_args may hold 'same' and 'any', not {unknown}")
        #: What a standing approval of a call may cover, at most (it can only narrow the default
        #: of the call's tier); None: the default.
        self.allow_args_limit: tuple[AllowArgs, ...] | None = tuple(allow_args) if allow_args is not None else None

    @property
    def risk_per_call(self) -> bool:
        """Whether the tier is computed for each call (:meth:`risk_for`) rather than fixed."""
        return self.risk_fn is not None or type(self).risk_for is not Tool.risk_for

    def risk_for(self, args: Mapping[str, Any]) -> Risk:
        """The tier of one call with these validated arguments: the tool's :attr:`risk`, or what
        its :data:`RiskFn` computes. A function that raises, or answers something that is no
        tier, is logged and the call is ``destructive``: always gated. Subclasses may override
        this (a method instead of a function)."""
        if self.risk_fn is None:
            return self.risk
        try:
            tier = self.risk_fn(dict(args))
        except Exception:
            log.exception("the risk function of tool %r failed; the call is treated as destructive", self.name)
            return "destructive"
        if tier not in RISK_ORDER:
            log.error("the risk function of tool %r answered %r, which is no tier; the call is treated as destructive", self.name, tier)
            return "destructive"
        return tier

    def allow_args(self, risk: Risk) -> tuple[AllowArgs, ...]:
        """What a standing approval given with the approval of a call of tier ``risk`` may cover:
        by default ``same`` for a destructive call, ``same`` or ``any`` for a reversible one,
        nothing for a four-eyes tool or one that cannot be approved; the tool's ``allow_args``
        can only narrow that. (The server's four-eyes policy narrows it too, in the gate.)"""
        if self.four_eyes or "approve" not in self.allowed_decisions:
            return ()
        default = DEFAULT_ALLOW_ARGS[risk]
        if self.allow_args_limit is None:
            return default
        return tuple(a for a in default if a in self.allow_args_limit)

    @property
    def origin(self) -> str | None:
        """Where the tool comes from when it is not the author's Python code (``mcp:<server>``)."""
        return None

    def describe_tool(self) -> dict[str, Any]:
        """The tool as an agent's description lists it (``GET /v1/agent``)."""
        return {
            "name": self.name,
            "description": self.description,
            "risk": self.risk,
            "risk_per_call": self.risk_per_call,
            "risk_source": self.risk_source,
            "source": self.origin or "python",
            "allowed_decisions": list(self.allowed_decisions),
            "four_eyes": self.four_eyes,
            "allow_args": list(self.allow_args(self.risk)),
            "sensitive_args": sorted(self.sensitive_args),
            "parameters": self.json_schema(),
        }

    def __repr__(self) -> str:
        return f"<Tool {self.name} risk={self.risk}>"

    def json_schema(self) -> dict[str, Any]:
        """The JSON schema of the arguments (what the model is shown)."""
        schema = self.args_model.model_json_schema()
        schema.pop("title", None)
        for prop in schema.get("properties", {}).values():
            prop.pop("title", None)
        return schema

    def validate(self, args: Any) -> dict[str, Any]:
        """Validate model-given arguments; raises :class:`ToolArgsError` naming the fields."""
        if not isinstance(args, dict):
            raise ToolArgsError(self.name, [{"loc": (), "msg": "arguments must be a JSON object", "type": "type"}])
        try:
            model = self.args_model.model_validate(args)
        except ValidationError as exc:
            errors = [{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]} for e in exc.errors(include_url=False, include_input=False)]
            raise ToolArgsError(self.name, errors) from None
        return {field: getattr(model, field) for field in type(model).model_fields}

    def mask(self, args: dict[str, Any]) -> dict[str, Any]:
        """A copy of ``args`` with sensitive values masked."""
        if not self.sensitive_args:
            return dict(args)
        return {k: (mask_value(v) if k in self.sensitive_args else v) for k, v in args.items()}

    def description_for(self, args: dict[str, Any]) -> str:
        """The human description of one call (the approval card's title)."""
        if self.describe_template:
            try:
                return self.describe_template.format(**{k: _as_json_shows(v) for k, v in self.mask(args).items()})
            except (KeyError, IndexError, ValueError):
                pass
        return self.description

    async def call(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        """Run the tool with validated ``args``."""
        if self._context_param is not None:
            return await self.fn(**args, **{self._context_param: ctx})
        return await self.fn(**args)


def _as_json_shows(value: Any) -> Any:
    """A whole float as JSON (and so every client) shows it: ``25``, not Python's ``25.0``; a
    description must not say another number than the arguments under it."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


@overload
def tool(fn: Callable[..., Awaitable[Any]], /) -> Tool: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    risk: Risk | RiskFn = "read_only",
    allowed_decisions: tuple[Decision, ...] | list[Decision] | None = None,
    approval_ttl_s: float = DEFAULT_APPROVAL_TTL_S,
    describe: str | None = None,
    allow_sensitive_edit: bool = False,
    four_eyes: bool = False,
    allow_args: Sequence[AllowArgs] | None = None,
) -> Callable[[Callable[..., Awaitable[Any]]], Tool]: ...


def tool(
    fn: Callable[..., Awaitable[Any]] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    risk: Risk | RiskFn = "read_only",
    allowed_decisions: tuple[Decision, ...] | list[Decision] | None = None,
    approval_ttl_s: float = DEFAULT_APPROVAL_TTL_S,
    describe: str | None = None,
    allow_sensitive_edit: bool = False,
    four_eyes: bool = False,
    allow_args: Sequence[AllowArgs] | None = None,
) -> Tool | Callable[[Callable[..., Awaitable[Any]]], Tool]:
    """Make a :class:`Tool` of an async function; usable bare (``@tool``) or with options.

    ``risk`` is a tier, or a :data:`RiskFn` of the call's validated arguments that computes
    each call's tier (``risk=lambda args: "reversible" if args["amount"] <= 20 else
    "destructive"``). ``four_eyes=True``: approving a call (or running it with edited args)
    needs a principal other than the run's requester; the requester may still reject it (and
    no standing approval can be given for it). ``allow_args`` narrows what a standing approval
    of a call may cover (``("same",)``, or ``()`` for none; ``docs/review.md``).
    """

    def wrap(f: Callable[..., Awaitable[Any]]) -> Tool:
        return Tool(
            f,
            name=name,
            description=description,
            risk=risk,
            allowed_decisions=tuple(allowed_decisions) if allowed_decisions is not None else None,
            approval_ttl_s=approval_ttl_s,
            describe=describe,
            allow_sensitive_edit=allow_sensitive_edit,
            four_eyes=four_eyes,
            allow_args=allow_args,
        )

    return wrap(fn) if fn is not None else wrap
