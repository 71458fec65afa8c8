"""The MCP server of ``benchmarks/mcp_calls.py``: the official SDK's ``MCPServer`` over stdio with
one read-only tool that answers at once."""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

server = MCPServer("bench-mcp")


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
async def lookup_sku(sku: str) -> str:
    """Look up a product by SKU."""
    return f"SKU {sku}: 3 in stock"


if __name__ == "__main__":
    server.run()
