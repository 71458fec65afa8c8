"""A tool of an MCP server as a Tether :class:`~tether.tools.Tool`: the same gate, decisions,
edit validation, masking and audit as a Python tool.

Its tier comes from :func:`tier_of` (annotations with the spec's defaults, the server's trust,
the author's overrides); its arguments are validated against the tool's ``inputSchema`` with
``jsonschema`` before anything is sent (an ``edit`` gets field errors, as for a Python tool); a
call goes through the server's one shared session (:class:`~._connection.ServerConnection`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..tools import Risk, RiskSource, Tool, ToolArgsError, ToolContext
from ._config import MCPServer
from ._results import to_result

if TYPE_CHECKING:
    from jsonschema.protocols import Validator

    from ._connection import ServerConnection

__all__ = ["MCPTool", "tier_of"]


def tier_of(server: MCPServer, name: str, annotations: Any) -> tuple[Risk, RiskSource]:
    """The tier of the tool ``name`` of ``server`` and where it came from.

    The author's tier (per tool, else ``"*"``) always wins. An untrusted server's tools are
    ``destructive``. Otherwise the annotations, with the MCP spec's defaults (``readOnlyHint``
    false, ``destructiveHint`` true): read-only → ``read_only``; else not destructive →
    ``reversible``; else ``destructive`` — so a tool without annotations is gated.
    """
    authored = server.risk.get(name) or server.risk.get("*")
    if authored is not None:
        return authored, "author"
    if not server.trusted:
        return "destructive", "untrusted server"
    read_only = getattr(annotations, "read_only_hint", None)
    destructive = getattr(annotations, "destructive_hint", None)
    if read_only is True:
        return "read_only", "annotation"
    if destructive is False:
        return "reversible", "annotation"
    if destructive is True:
        return "destructive", "annotation"
    return "destructive", "spec default"


class MCPTool(Tool):
    """One tool of a mounted MCP server."""

    def __init__(self, connection: ServerConnection, listed: Any, *, name: str | None = None) -> None:
        server = connection.server
        #: The tool's name on its server (``name`` is what the model sees).
        self.remote_name: str = listed.name
        self.connection = connection
        annotations = listed.annotations
        title = getattr(annotations, "title", None) or getattr(listed, "title", None)
        risk, source = tier_of(server, listed.name, annotations)
        description = (listed.description or title or listed.name).strip()
        self._init_review(
            name=name or listed.name,
            description=description,
            risk=risk,
            allowed_decisions=None,
            approval_ttl_s=server.approval_ttl_s,
            describe=None,
            allow_sensitive_edit=False,
            four_eyes=server.needs_four_eyes(listed.name),
            risk_source=source,
        )
        #: A short title for the approval card (the annotation's, else the tool's name).
        self.title: str = title or listed.name
        #: The annotations as the server gave them (hints: shown, believed only if trusted).
        self.annotations: dict[str, Any] = annotations.model_dump(exclude_none=True, by_alias=True) if annotations is not None else {}
        schema = dict(listed.input_schema or {})
        schema.pop("$schema", None)
        schema.pop("title", None)
        if schema.get("type") != "object":
            schema = {"type": "object", **schema}
        self._schema: dict[str, Any] = schema
        self.sensitive_args: frozenset[str] = frozenset(server.sensitive)
        self._validator: Validator | None = None

    def __repr__(self) -> str:
        return f"<MCPTool {self.name} ({self.connection.server.name}:{self.remote_name}) risk={self.risk}>"

    def json_schema(self) -> dict[str, Any]:
        """The tool's ``inputSchema`` (what the model is shown and arguments are checked against)."""
        return self._schema

    def validate(self, args: Any) -> dict[str, Any]:
        """Check ``args`` against the ``inputSchema``; :class:`ToolArgsError` naming the fields."""
        if not isinstance(args, dict):
            raise ToolArgsError(self.name, [{"loc": (), "msg": "arguments must be a JSON object", "type": "type"}])
        errors = [
            {"loc": list(error.absolute_path), "msg": error.message, "type": str(error.validator)}
            for error in sorted(self._checker().iter_errors(args), key=lambda e: list(map(str, e.absolute_path)))
        ]
        if errors:
            raise ToolArgsError(self.name, errors)
        return dict(args)

    def _checker(self) -> Validator:
        if self._validator is None:
            from jsonschema import validators
            from jsonschema.exceptions import SchemaError

            cls = validators.validator_for(self._schema)
            try:
                cls.check_schema(self._schema)
                self._validator = cls(self._schema)
            except SchemaError:
                # A server's broken schema checks only that the arguments are an object.
                self._validator = cls({"type": "object"})
        return self._validator

    def description_for(self, args: dict[str, Any]) -> str:
        """The approval card's title: the tool's title on its server."""
        return f"{self.title} ({self.connection.server.name})"

    async def call(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        """Send the call to the server (only ever after its review, if gated) and return its
        result as Tether shows it; the server's errors raise (the run records them)."""
        result = await self.connection.call_tool(self.remote_name, args)
        return to_result(result, self.connection.server.max_result_bytes)

    @property
    def origin(self) -> str:
        """``mcp:<server>``."""
        return f"mcp:{self.connection.server.name}"

    def describe_tool(self) -> dict[str, Any]:
        described = super().describe_tool()
        described.update(source=self.origin, remote_name=self.remote_name, annotations=self.annotations)
        return described
