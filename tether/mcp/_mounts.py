"""The MCP servers an agent mounts: their connections, and their tools under the names the model sees.

:class:`MCPMounts` is the agent's one object for all of it. A tool keeps its server's name unless
that name is taken (by one of the agent's Python tools, or by another mounted server): then it is
``<server>__<tool>``, on every server that offers it. Whatever the model was shown, a tool is
also found by its qualified name, so a call parked before a rename is still found. Names are
made safe for every model provider (``[A-Za-z0-9_-]``, at most 64 characters).

The connections' tasks are started by the runtime (:meth:`MCPMounts.start`, when a server
starts) and stopped by it (:meth:`MCPMounts.aclose`), so nothing outlives a server's lifespan.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import anyio

from ._config import MCPServer, server_names
from ._connection import ServerConnection
from ._tool import MCPTool

__all__ = ["MCPMounts"]

log = logging.getLogger("tether.mcp")


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", name)[:64] or "tool"


class MCPMounts:
    """The MCP servers of one agent: their connections and their tools."""

    def __init__(self, servers: Sequence[MCPServer]) -> None:
        server_names(servers)
        self.connections = [ServerConnection(server, self._rebuild) for server in servers]
        self._reserved: frozenset[str] = frozenset()
        #: The tools by the name the model sees.
        self._visible: dict[str, MCPTool] = {}
        #: The tools by ``<server>__<tool>``, whatever the model sees.
        self._qualified: dict[str, MCPTool] = {}
        #: Bumped whenever the tools changed (the agent rebuilds its specs on a change).
        self.version = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._users = 0

    @property
    def started(self) -> bool:
        """Whether the connections are up (or being kept up)."""
        return self._users > 0

    def reserve(self, names: Iterable[str]) -> None:
        """Names the agent's own tools hold: a server's tool of the same name is qualified."""
        self._reserved = frozenset(names)
        self._rebuild()

    def _rebuild(self) -> None:
        offered = Counter(_safe(t.name) for c in self.connections for t in c.listed)
        visible: dict[str, MCPTool] = {}
        qualified: dict[str, MCPTool] = {}
        for connection in self.connections:
            for listed in connection.listed:
                bare = _safe(listed.name)
                full = _safe(f"{connection.server.name}__{listed.name}")
                name = bare if offered[bare] == 1 and bare not in self._reserved else full
                if name in visible:
                    log.warning("MCP server %r: tool %r clashes with %r; it is left out", connection.server.name, listed.name, name)
                    continue
                tool = MCPTool(connection, listed, name=name)
                visible[name] = qualified[full] = tool
        self._visible, self._qualified = visible, qualified
        self.version += 1

    @property
    def tools(self) -> Mapping[str, MCPTool]:
        """Every mounted tool by the name the model sees."""
        return self._visible

    def get(self, name: str) -> MCPTool | None:
        """A tool by the name the model sees, or by its qualified name."""
        return self._visible.get(name) or self._qualified.get(name)

    async def start(self, *, wait_s: float = 15.0) -> None:
        """Connect to every server (each in a task of its own, kept up until :meth:`aclose`), and
        wait up to ``wait_s`` for each first attempt, so the runs recovered at start find their
        tools; a server still starting after that comes up in the background."""
        self._users += 1
        if self._users > 1:
            return
        self._tasks = [asyncio.create_task(c.run(), name=f"mcp:{c.server.name}") for c in self.connections]
        with anyio.move_on_after(wait_s):
            for connection in self.connections:
                await connection.wait_for_first_attempt()

    async def aclose(self) -> None:
        """Stop every connection (a stdio server's process ends with it)."""
        if self._users <= 0:
            return
        self._users -= 1
        if self._users > 0:
            return
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    def describe(self) -> list[dict[str, Any]]:
        """Every server: where it is, whether it is up (or why not), and its tools' names."""
        servers = []
        for connection in self.connections:
            described = connection.describe()
            described["tools"] = sorted(t.name for t in self._visible.values() if t.connection is connection)
            servers.append(described)
        return servers
