"""A real MCP server for the tests, written with the official SDK's ``MCPServer``.

Run as a child process: ``python tests/mcp_shop_server.py`` (stdio), or
``python tests/mcp_shop_server.py --http PORT [--token TOKEN]`` (streamable HTTP; with a token,
every request must carry ``Authorization: Bearer TOKEN``). Its effects go to files in
``$MCP_TEST_DIR``, so a test sees what really happened on the server's side: what was written,
which call started, which call saw its cancellation.

Tools (and the tier Tether should give each from its annotations):

- ``lookup_sku`` — ``readOnlyHint: true`` → ``read_only``
- ``print_label`` — ``destructiveHint: false`` → ``reversible``
- ``delete_sku`` — no annotations → ``destructive`` (the spec's defaults)
- ``write_record`` — ``destructiveHint: true`` → ``destructive``; writes ``records/<name>``
- ``slow`` — read-only; sleeps, recording ``started-<tag>`` and ``cancelled-<tag>`` (if cancelled)
- ``rendezvous`` — read-only; waits until ``n`` calls of it are in flight at once
- ``slow_write`` — destructive; records ``started-<tag>``, sleeps, then ``done-<tag>``
- ``crash`` — read-only; the process exits mid-call
- ``picture`` — read-only; returns a PNG image
- ``huge`` — read-only; returns ``kib`` KiB of text
- ``garbage`` — read-only; answers its own request with a result that is not a tool result
- ``shelf_empty`` — read-only; answers ``isError: true``
- ``confirm`` — read-only; asks the user (elicitation) and returns the answer's action
- ``add_tool`` — read-only; adds ``extra_tool`` and says the tool list changed
- ``stock`` — read-only; returns structured content
- ``manual`` — read-only; returns an embedded resource and a resource link
- ``secret_env`` — read-only; whether ``$MCP_TEST_SECRET`` is set in the server's environment
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import struct
import zlib
from pathlib import Path
from typing import Annotated

from mcp.server.mcpserver import Context, Elicit, ElicitationResult, Image, MCPServer, Resolve
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import EmbeddedResource, ResourceLink, TextContent, TextResourceContents, ToolAnnotations
from pydantic import BaseModel


def _png(width: int, height: int) -> bytes:
    """A small product picture as a PNG (a box on a shelf), made with zlib alone."""

    def pixel(x: int, y: int) -> bytes:
        if height * 3 // 4 <= y < height * 3 // 4 + 4:
            return b"\x6b\x4f\x2a"  # the shelf
        if width // 4 <= x < width * 3 // 4 and height // 4 <= y < height * 3 // 4:
            return b"\x2f\x6f\xd0" if (x + y) % 16 else b"\x1d\x4f\xa0"  # the box
        return b"\xf2\xf4\xf7"

    raw = b"".join(b"\x00" + b"".join(pixel(x, y) for x in range(width)) for y in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


PNG = _png(96, 64)

DIR = Path(os.environ.get("MCP_TEST_DIR", "."))
READ_ONLY = ToolAnnotations(read_only_hint=True)


async def record_requests(ctx, call_next):  # type: ignore[no-untyped-def]
    """Log every request and notification the server receives: ``tools/call <name>`` per call
    (in ``requests.log``), so a test sees exactly what reached the server and when."""
    params = ctx.params or {}
    name = params.get("name") if isinstance(params, dict) else None
    with open(DIR / "requests.log", "a") as log:
        log.write(f"{ctx.method} {name or ''}".rstrip() + "\n")
    return await call_next(ctx)


server = MCPServer("shop-mcp", middleware=[record_requests])


def mark(name: str, text: str = "") -> None:
    (DIR / name).write_text(text)


@server.tool(annotations=ToolAnnotations(read_only_hint=True, title="Look up a SKU"))
async def lookup_sku(sku: str) -> str:
    """Look up a product by SKU."""
    return f"SKU {sku}: 3 in stock"


@server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False))
async def print_label(text: str) -> str:
    """Print a shelf label (can be thrown away)."""
    mark(f"label-{text}", text)
    return f"printed {text!r}"


@server.tool()
async def delete_sku(sku: str) -> str:
    """Delete a product."""
    mark(f"deleted-{sku}")
    return f"deleted {sku}"


@server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True, title="Write a record"))
async def write_record(name: str, content: str, count: int = 1) -> str:
    """Write a record file (overwrites it)."""
    records = DIR / "records"
    records.mkdir(exist_ok=True)
    (records / name).write_text(content * count)
    return f"wrote {name}"


async def _slowly(seconds: float, tag: str) -> None:
    """Sleep, recording ``started-<tag>``, then ``done-<tag>`` or ``cancelled-<tag>``."""
    mark(f"started-{tag}")
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        mark(f"cancelled-{tag}")
        raise
    mark(f"done-{tag}")


@server.tool(annotations=READ_ONLY)
async def slow(seconds: float, tag: str) -> str:
    """Wait a while, then answer."""
    await _slowly(seconds, tag)
    return f"waited {seconds:g} s"


_arrived: dict[int, int] = {}
_together: dict[int, asyncio.Event] = {}


@server.tool(annotations=READ_ONLY)
async def rendezvous(n: int, tag: str) -> str:
    """Wait (up to 10 s) until ``n`` calls of this tool are in flight at once."""
    _arrived[n] = _arrived.get(n, 0) + 1
    met = _together.setdefault(n, asyncio.Event())
    if _arrived[n] >= n:
        met.set()
    try:
        await asyncio.wait_for(met.wait(), 10)
    except TimeoutError:
        return "alone"
    return f"met {n}"


@server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True))
async def slow_write(seconds: float, tag: str) -> str:
    """Write something slowly."""
    await _slowly(seconds, tag)
    return f"wrote {tag}"


@server.tool(annotations=READ_ONLY)
async def crash() -> str:
    """Exit the server process in the middle of the call."""
    mark(f"crashed-{os.getpid()}")
    os._exit(3)


@server.tool(annotations=READ_ONLY)
async def picture() -> Image:
    """A picture of the product."""
    return Image(data=PNG, format="png")


@server.tool(annotations=READ_ONLY)
async def huge(kib: int) -> str:
    """A very long answer."""
    return "x" * (kib * 1024)


@server.tool(annotations=READ_ONLY)
async def garbage(ctx: Context) -> str:
    """Answer with something that is not a tool result."""
    request_id: int | str = ctx.request_id
    if isinstance(request_id, str) and request_id.isdigit():
        request_id = int(request_id)
    line = json.dumps({"jsonrpc": "2.0", "id": request_id, "result": {"content": "not a list of blocks", "isError": "maybe"}})
    # The SDK moves the pipe to the client off fd 1 (so stray prints cannot corrupt it): write
    # under it, on the descriptor it claimed.
    from mcp.server import stdio

    claim = stdio._claims.get(1)
    wire = claim.private_fd if claim is not None and claim.private_fd is not None else 1
    os.write(wire, (line + "\n").encode())
    await asyncio.sleep(0.5)
    return "the real answer, too late"


@server.tool(annotations=READ_ONLY)
async def shelf_empty() -> str:
    """Fails: the shelf is empty."""
    raise ToolError("the shelf is empty")


class Confirmation(BaseModel):
    sure: bool


def ask_sure(question: str) -> Elicit[Confirmation]:
    return Elicit(question, Confirmation)


@server.tool(annotations=READ_ONLY)
async def confirm(question: str, answer: Annotated[ElicitationResult[Confirmation], Resolve(ask_sure)]) -> str:
    """Ask the user to confirm something."""
    mark("elicited", answer.action)
    return f"the user's answer: {answer.action}"


@server.tool(annotations=READ_ONLY)
async def add_tool(ctx: Context) -> str:
    """Add a tool to this server."""

    async def extra_tool(word: str) -> str:
        """A tool added while the server ran."""
        return word.upper()

    server.add_tool(extra_tool, annotations=READ_ONLY)
    try:
        await ctx.session.send_tool_list_changed()  # an initialize-era session
    except Exception:
        pass
    await ctx.notify_tools_changed()  # a 2026-07-28 session's subscriptions/listen
    return "added extra_tool"


class Stock(BaseModel):
    sku: str
    count: int


@server.tool(annotations=READ_ONLY)
async def stock(sku: str) -> Stock:
    """Stock of a product, as data."""
    return Stock(sku=sku, count=3)


@server.tool(annotations=READ_ONLY)
async def manual(sku: str) -> list[TextContent | EmbeddedResource | ResourceLink]:
    """The product's manual."""
    return [
        TextContent(type="text", text=f"Manual of {sku}"),
        EmbeddedResource(type="resource", resource=TextResourceContents(uri=f"file:///manuals/{sku}.txt", mime_type="text/plain", text="Step 1: unpack.")),
        ResourceLink(type="resource_link", uri=f"https://example.com/manuals/{sku}", name=f"{sku} manual online"),
    ]


@server.tool(annotations=READ_ONLY)
async def secret_env() -> str:
    """Whether the server was given its secret."""
    return "secret set" if os.environ.get("MCP_TEST_SECRET") else "secret missing"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", type=int, default=None)
    parser.add_argument("--token", default=None)
    options = parser.parse_args()
    mark(f"pid-{os.getpid()}")
    if options.http is None:
        server.run()
        return
    import uvicorn
    from starlette.responses import JSONResponse

    app = server.streamable_http_app(host="127.0.0.1")
    token = options.token

    async def guarded(scope, receive, send):  # type: ignore[no-untyped-def]
        if scope["type"] == "http" and token is not None:
            headers = dict(scope["headers"])
            if headers.get(b"authorization") != f"Bearer {token}".encode():
                await JSONResponse({"error": "unauthorized"}, status_code=401)(scope, receive, send)
                return
        await app(scope, receive, send)

    uvicorn.run(guarded, host="127.0.0.1", port=options.http, log_level="warning")


if __name__ == "__main__":
    main()
