"""MCP tools under human review: mount MCP servers on an agent, and their tools are Tether tools.

A mounted server's tools go through the same gate as the author's Python tools: the same
interrupt and four decisions, edits validated against the tool's ``inputSchema``, expiry,
four-eyes, masking, audit, cancellation and the crash rule. What MCP adds is decided here:

- **Tiers** (:func:`tier_of`): from the tool's annotations with the spec's defaults
  (``readOnlyHint: true`` → ``read_only``; else ``destructiveHint: false`` → ``reversible``;
  else ``destructive``, so an unannotated tool is gated). Annotations are hints: a stdio server
  (code the author runs) is trusted by default, a streamable-HTTP server is not (all its tools
  ``destructive`` until ``trust_annotations=True``). The author's tier per tool always wins.
- **Hold before sending**: a gated call is sent to the server only after its approval (the
  runtime calls a tool only then), so no MCP request waits open while a person decides.
- **One session per server per process**, shared by every run (:class:`ServerConnection`), kept
  up with backoff; a server that fails is shown as unavailable and never stops serving.

Usage::

    from tether import Agent
    from tether.mcp import MCP, Secret

    agent = Agent(model, tools=[...], mcp=[
        MCP.stdio("npx", "-y", "@modelcontextprotocol/server-filesystem", "/srv/notes"),
        MCP.http("https://mcp.example.com/mcp", headers={"Authorization": Secret(env="MCP_TOKEN", prefix="Bearer ")}),
    ])

This module imports no MCP SDK: the official ``mcp`` package is imported when a server starts.
"""

from __future__ import annotations

from ._config import MCP, HttpServer, MCPServer, Secret, ServerOptions, StdioServer, parse_mcp_option, parse_secret_value
from ._connection import CallRefused, CallTimedOut, InvalidAnswer, MCPCallError, ServerConnection, ServerExited, ServerUnavailable
from ._mounts import MCPMounts
from ._results import ToolReportedError
from ._tool import MCPTool, tier_of

__all__ = [
    "MCP",
    "MCPServer",
    "StdioServer",
    "HttpServer",
    "Secret",
    "ServerOptions",
    "parse_mcp_option",
    "parse_secret_value",
    "MCPMounts",
    "MCPTool",
    "tier_of",
    "ServerConnection",
    "MCPCallError",
    "ServerUnavailable",
    "ServerExited",
    "CallTimedOut",
    "InvalidAnswer",
    "CallRefused",
    "ToolReportedError",
]
