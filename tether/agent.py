"""``Agent``: what an agent author writes — a model, tools and a system prompt."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, Mapping, MutableMapping, Sequence
from typing import TYPE_CHECKING, Any

from .history import HistoryPolicy
from .models import Model, RetryPolicy, ToolSpec
from .tools import Tool

if TYPE_CHECKING:  # for the annotations only: the agent itself needs no web framework
    from starlette.routing import BaseRoute

    from .mcp import MCPMounts, MCPServer

__all__ = ["Agent", "ToolSet"]


class ToolSet(MutableMapping[str, Tool]):
    """An agent's tools by name: the author's Python tools, then the tools of its mounted MCP
    servers as they are listed now (:mod:`tether.mcp`). The author's tools may be added and
    removed; a mounted tool is also found by its qualified name (``<server>__<tool>``)."""

    def __init__(self, own: dict[str, Tool], mounts: MCPMounts | None) -> None:
        self._own = own
        self._mounts = mounts

    def _mounted(self) -> Mapping[str, Tool]:
        return self._mounts.tools if self._mounts is not None else {}

    def __getitem__(self, name: str) -> Tool:
        tool: Tool | None = self.get(name)
        if tool is None:
            raise KeyError(name)
        return tool

    def get(self, name: str, default: Any = None) -> Any:
        """The tool called ``name`` (a mounted tool also by its qualified name), else ``default``."""
        tool = self._own.get(name)
        if tool is None and self._mounts is not None:
            tool = self._mounts.get(name)
        return tool if tool is not None else default

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.get(name) is not None

    def __setitem__(self, name: str, tool: Tool) -> None:
        self._own[name] = tool
        self._reserve()

    def __delitem__(self, name: str) -> None:
        del self._own[name]
        self._reserve()

    def mount(self, mounts: MCPMounts) -> None:
        """Offer the tools of ``mounts`` after the author's (replacing any mounted before)."""
        self._mounts = mounts
        self._reserve()

    def _reserve(self) -> None:
        if self._mounts is not None:
            self._mounts.reserve(self._own)

    def __iter__(self) -> Iterator[str]:
        yield from self._own
        yield from self._mounted()

    def __len__(self) -> int:
        return len(self._own) + len(self._mounted())

    @property
    def version(self) -> tuple[int, ...]:
        """Changes whenever a tool is added, removed or relisted (the model's specs follow it)."""
        return (*map(id, self._own.values()), self._mounts.version if self._mounts is not None else 0)


class Agent:
    """A tool-using agent served by Tether.

    ``on_startup`` is awaited once when a server starts, with the server's store, so an agent can
    set up what its tools need (the demo shop creates its effects table there). ``routes`` are
    extra Starlette routes mounted next to the API (the demo's ``/v1/demo/effects``).
    ``history`` bounds what of a thread the model is given (default: ``HistoryPolicy()``).
    ``retry`` says how failed model calls are retried and how long a silent provider is waited for.
    """

    def __init__(
        self,
        model: Model,
        tools: Sequence[Tool] = (),
        *,
        system_prompt: str = "You are a helpful assistant.",
        name: str = "agent",
        max_steps: int = 25,
        on_startup: Callable[[Any], Awaitable[None]] | None = None,
        routes: Sequence[BaseRoute] = (),
        history: HistoryPolicy | None = None,
        retry: RetryPolicy | None = None,
        mcp: Sequence[MCPServer] = (),
    ) -> None:
        names = [t.name for t in tools]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate tool names in {names}")
        for t in tools:
            if not isinstance(t, Tool):
                raise TypeError(f"{t!r} is not a Tool; decorate it with @tool")
        self.model = model
        #: The MCP servers whose tools this agent offers too (:mod:`tether.mcp`), or None.
        self.mcp: MCPMounts | None = None
        if mcp:
            from .mcp import MCPMounts

            self.mcp = MCPMounts(mcp)
        #: Every tool by name: the author's, then the mounted servers' (:class:`ToolSet`).
        self.tools = ToolSet({t.name: t for t in tools}, None)
        if self.mcp is not None:
            self.tools.mount(self.mcp)
        self.system_prompt = system_prompt
        self.name = name
        self.max_steps = max_steps
        self.on_startup = on_startup
        self.routes = list(routes)
        #: What of a thread's active path the model is given; ``None``: the default policy.
        self.history = history
        self.retry = retry or RetryPolicy()
        self._specs: tuple[tuple[int, ...], list[ToolSpec]] | None = None

    def mount_mcp(self, servers: Sequence[MCPServer]) -> None:
        """Mount more MCP servers (before the agent is served): ``tether serve --mcp`` does."""
        from .mcp import MCPMounts

        if self.mcp is not None and self.mcp.started:
            raise RuntimeError("MCP servers are mounted before the agent is served")
        mounted = [c.server for c in self.mcp.connections] if self.mcp is not None else []
        self.mcp = MCPMounts([*mounted, *servers])
        self.tools.mount(self.mcp)

    async def open_tools(self) -> None:
        """Connect the mounted MCP servers (a server starting calls it; paired with :meth:`close_tools`)."""
        if self.mcp is not None:
            await self.mcp.start()

    async def close_tools(self) -> None:
        """Disconnect the mounted MCP servers (a stdio server's process ends)."""
        if self.mcp is not None:
            await self.mcp.aclose()

    def describe(self) -> dict[str, Any]:
        """The agent as ``GET /v1/agent`` shows it: every tool with its tier and where the tier
        came from, and every mounted MCP server with its state."""
        return {
            "name": self.name,
            "tools": [tool.describe_tool() for tool in self.tools.values()],
            "mcp_servers": self.mcp.describe() if self.mcp is not None else [],
        }

    def tool_specs(self) -> list[ToolSpec]:
        """The tools as the model sees them: built once per set of tools, not per model call
        (a schema takes pydantic a while to generate). Treat the specs as read-only."""
        key = self.tools.version
        if self._specs is None or self._specs[0] != key:
            self._specs = (key, [ToolSpec(t.name, t.description, t.json_schema()) for t in self.tools.values()])
        return list(self._specs[1])
