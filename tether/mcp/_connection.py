"""One mounted MCP server: its one client session in this process, kept up, shared by all runs.

A :class:`ServerConnection` owns one task (:meth:`ServerConnection.run`) that connects (spawns a
stdio server, or opens a streamable-HTTP session), lists the tools, follows
``notifications/tools/list_changed`` (and, on a 2026-07-28 connection, the
``subscriptions/listen`` stream that replaces it) and notices when the connection ends (the
child exited, the HTTP session dropped). Then it connects again, after a backoff that doubles up
to a minute; a server that fails to start never stops Tether from serving, it is only shown as
unavailable, with the reason, until it comes up.

Calls from any run go through :meth:`ServerConnection.call_tool` on the shared session, which
multiplexes them (no process per run). A call cancelled by its run (a hard cancel) makes the SDK
send ``notifications/cancelled`` for that request; a call past ``call_timeout_s`` is abandoned
the same way. Every fault becomes a :class:`MCPCallError` with words a model and a person can
read, which the run records as the call's ``error`` result.

A server's ``elicitation/create`` during a call (it asks the user something) is answered
``decline``: a question to a person goes through Tether's own review, never around it.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Any, Literal

import anyio

from ._config import HttpServer, MCPServer, Secret, StdioServer

if TYPE_CHECKING:
    from mcp import Client

__all__ = ["ServerConnection", "MCPCallError", "ServerUnavailable", "ServerExited", "CallTimedOut", "InvalidAnswer", "CallRefused"]

log = logging.getLogger("tether.mcp")

State = Literal["connecting", "up", "unavailable", "stopped"]

#: The longest wait between two connection attempts.
MAX_BACKOFF_S = 60.0


class MCPCallError(Exception):
    """A call of an MCP tool failed before the tool could answer (the run records it as an error)."""


class ServerUnavailable(MCPCallError):
    """The server is not connected (it failed to start, or is being restarted)."""


class ServerExited(MCPCallError):
    """The server's connection ended during the call (the process exited, the session dropped)."""


class CallTimedOut(MCPCallError):
    """No answer within the call timeout; the call was cancelled on the server."""


class InvalidAnswer(MCPCallError):
    """The server's answer was not a valid ``tools/call`` result."""


class CallRefused(MCPCallError):
    """The server answered the call with a protocol error (unknown tool, invalid params, …)."""


def describe_failure(exc: BaseException) -> str:
    """One line for a failure, the innermost cause of an exception group first."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class _WatchedRead:
    """A transport's read stream that sets ``ended`` once it ends (the server went away)."""

    def __init__(self, stream: Any, ended: anyio.Event) -> None:
        self._stream = stream
        self._ended = ended

    @property
    def last_context(self) -> Any:
        return getattr(self._stream, "last_context", None)

    async def receive(self) -> Any:
        try:
            return await self._stream.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._ended.set()
            raise

    def __aiter__(self) -> _WatchedRead:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        self._ended.set()
        await self._stream.aclose()

    async def __aenter__(self) -> _WatchedRead:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _value(value: str | Secret) -> str:
    return value.read() if isinstance(value, Secret) else value


class ServerConnection:
    """The session with one MCP server in this process, and the task that keeps it up."""

    def __init__(self, server: MCPServer, on_tools: Callable[[], None]) -> None:
        self.server = server
        #: Called (in the loop's thread) whenever the server's listed tools changed.
        self._on_tools = on_tools
        self.state: State = "connecting"
        #: Why the server is unavailable (or the last failure), shown in the agent's description.
        self.reason: str | None = None
        #: The tools as the server last listed them (``mcp.types.Tool``); kept while it is down,
        #: so a call decided meanwhile fails with the reason instead of naming an unknown tool.
        self.listed: list[Any] = []
        #: When the state last changed (Unix seconds).
        self.since = time.time()
        self.next_attempt: float | None = None
        self._client: Client | None = None
        self._up = anyio.Event()
        self._attempted = anyio.Event()
        self._changed = anyio.Event()
        #: The last HTTP error status the server answered (streamable HTTP), for the reason.
        self._http_refusal: str | None = None

    # -- the task that keeps the session up --------------------------------------------------

    async def run(self) -> None:
        """Connect, serve, and connect again when the session ends; until cancelled."""
        delay = 0.0
        try:
            while True:
                self._set("connecting", None)
                started = time.monotonic()
                self._http_refusal = None
                try:
                    await self._session()
                    reason = "the server closed the connection"
                except Exception as exc:  # any failure to connect or to stay connected: retried
                    reason = describe_failure(exc)
                if self._http_refusal is not None:
                    reason = f"{reason} ({self._http_refusal})"
                if time.monotonic() - started > 2 * MAX_BACKOFF_S:
                    delay = 0.0  # it was up a good while: try again at once
                self._set("unavailable", reason)
                self._attempted.set()
                self.next_attempt = time.time() + delay
                log.warning("MCP server %r is unavailable (%s); connecting again in %.0f s", self.server.name, reason, delay)
                await anyio.sleep(delay)
                delay = min(MAX_BACKOFF_S, max(1.0, delay * 2))
        finally:
            self._client = None
            self._set("stopped", None)

    async def wait_for_first_attempt(self) -> None:
        """Return once the first connection attempt succeeded or failed."""
        await self._attempted.wait()

    def _set(self, state: State, reason: str | None) -> None:
        self.state, self.since = state, time.time()
        if reason is not None or state == "up":
            self.reason = reason
        if state == "up":
            self.next_attempt = None
            self._up.set()
        elif self._up.is_set():
            self._up = anyio.Event()

    def _transport(self) -> AbstractAsyncContextManager[Any]:
        server = self.server
        if isinstance(server, StdioServer):
            from mcp import StdioServerParameters
            from mcp.client.stdio import stdio_client

            env = {key: _value(value) for key, value in server.env.items()}
            return stdio_client(StdioServerParameters(command=server.command, args=list(server.args), env=env or None, cwd=server.cwd))
        assert isinstance(server, HttpServer)
        from mcp.shared._httpx_utils import create_mcp_http_client

        headers = {key: _value(value) for key, value in server.headers.items()}
        http = create_mcp_http_client(headers=headers or None)

        async def note_refusal(response: Any) -> None:
            # The SDK turns an HTTP error into a generic MCP error: keep the status for the reason.
            if response.status_code >= 400:
                self._http_refusal = f"HTTP {response.status_code} from {server.target()}"

        http.event_hooks["response"].append(note_refusal)
        return _with_client(server.url, http)

    async def _session(self) -> None:
        from mcp import Client
        from mcp.types import ElicitResult, Implementation

        from .. import __version__

        ended = anyio.Event()

        @asynccontextmanager
        async def watched() -> AsyncIterator[tuple[Any, Any]]:
            async with self._transport() as (read, write):
                yield _WatchedRead(read, ended), write
            ended.set()

        async def on_message(message: Any) -> None:
            from mcp.types import ToolListChangedNotification

            if isinstance(message, ToolListChangedNotification):
                self._changed.set()
            elif isinstance(message, Exception):
                log.warning("MCP server %r sent something that is not MCP: %s", self.server.name, describe_failure(message))

        async def decline(context: Any, params: Any) -> Any:
            log.info("MCP server %r asked the user a question (elicitation) during a call: declined", self.server.name)
            return ElicitResult(action="decline")

        client = Client(
            watched(),
            mode="auto",
            cache=None,
            message_handler=on_message,
            elicitation_callback=decline,
            client_info=Implementation(name="tether", version=__version__),
        )
        with anyio.CancelScope(deadline=anyio.current_time() + self.server.connect_timeout_s) as connecting:
            async with client:
                self.listed = await self._list_tools(client)
                connecting.deadline = math.inf
                self._client = client
                self._set("up", None)
                self._attempted.set()
                self._on_tools()
                log.info("MCP server %r is up: %d tools", self.server.name, len(self.listed))
                try:
                    async with anyio.create_task_group() as tasks:
                        tasks.start_soon(self._follow_changes, client)
                        tasks.start_soon(self._listen, client)
                        await ended.wait()
                        tasks.cancel_scope.cancel()
                finally:
                    self._client = None
        if connecting.cancelled_caught:
            raise TimeoutError(f"no answer within {self.server.connect_timeout_s:g} s")

    async def _list_tools(self, client: Client) -> list[Any]:
        tools: list[Any] = []
        cursor: str | None = None
        for _ in range(100):  # a server that pages forever cannot hang the connection
            page = await client.list_tools(cursor=cursor)
            tools.extend(page.tools)
            cursor = page.next_cursor
            if cursor is None:
                break
        return tools

    async def _follow_changes(self, client: Client) -> None:
        while True:
            await self._changed.wait()
            self._changed = anyio.Event()
            try:
                self.listed = await self._list_tools(client)
            except Exception as exc:  # the next change (or the reconnect) lists them again
                log.warning("MCP server %r: listing its tools again failed: %s", self.server.name, describe_failure(exc))
                continue
            log.info("MCP server %r changed its tools: %d now", self.server.name, len(self.listed))
            self._on_tools()

    async def _listen(self, client: Client) -> None:
        """On a 2026-07-28 connection, list-changed events come on a ``subscriptions/listen`` stream."""
        from mcp.client.subscriptions import ListenNotSupportedError, SubscriptionLost
        from mcp.shared.exceptions import MCPError

        capabilities = client.server_capabilities.tools
        if capabilities is None or not getattr(capabilities, "list_changed", False):
            return
        try:
            async with client.listen(tools_list_changed=True) as subscription:
                async for _event in subscription:
                    self._changed.set()
        except ListenNotSupportedError:
            return  # an older protocol: notifications/tools/list_changed arrives as a message
        except (MCPError, SubscriptionLost, TimeoutError) as exc:
            log.info("MCP server %r: no tool-change subscription (%s)", self.server.name, describe_failure(exc))

    # -- calls ---------------------------------------------------------------------------------

    async def call_tool(self, name: str, args: dict[str, Any]) -> Any:
        """Call ``name`` on the server with ``args``; the ``CallToolResult``, or :class:`MCPCallError`."""
        from mcp.shared.exceptions import MCPError
        from mcp.types import CONNECTION_CLOSED, REQUEST_TIMEOUT
        from pydantic import ValidationError

        client = await self._ready()
        timeout = self.server.call_timeout_s
        try:
            return await client.call_tool(name, args, read_timeout_seconds=timeout)
        except MCPError as exc:
            if exc.code == CONNECTION_CLOSED:
                raise ServerExited(f"MCP server {self.server.name!r} went away during the call; it is being restarted") from None
            if exc.code == REQUEST_TIMEOUT:
                raise CallTimedOut(f"MCP server {self.server.name!r} did not answer within {timeout:g} s; the call was cancelled on the server") from None
            raise CallRefused(f"MCP server {self.server.name!r} refused the call: {exc}") from None
        except ValidationError as exc:
            raise InvalidAnswer(f"MCP server {self.server.name!r} answered with something that is not a tool result ({exc.error_count()} errors)") from None
        except (RuntimeError, ValueError) as exc:  # output schema mismatch, an unexpected result kind
            raise InvalidAnswer(f"MCP server {self.server.name!r}: {exc}") from None

    async def _ready(self) -> Client:
        """The live client; a connection under way is waited for (up to the connect timeout)."""
        if self._client is None and self.state == "connecting":
            with anyio.move_on_after(min(self.server.connect_timeout_s, self.server.call_timeout_s)):
                await self._up.wait()
        client = self._client
        if client is not None:
            return client
        retry = f"; connecting again in {max(0.0, self.next_attempt - time.time()):.0f} s" if self.next_attempt else ""
        raise ServerUnavailable(f"MCP server {self.server.name!r} is unavailable: {self.reason or 'not connected'}{retry}")

    def describe(self) -> dict[str, Any]:
        """The server as an agent's description shows it."""
        return {
            "name": self.server.name,
            "transport": self.server.transport,
            "target": self.server.target(),
            "trusted": self.server.trusted,
            "state": self.state,
            "reason": self.reason if self.state != "up" else None,
            "since": self.since,
        }


@asynccontextmanager
async def _with_client(url: str, http: Any) -> AsyncIterator[Any]:
    """The streamable-HTTP transport over ``http``, closing the client with it."""
    from mcp.client.streamable_http import streamable_http_client

    async with http, streamable_http_client(url, http_client=http) as streams:
        yield streams
