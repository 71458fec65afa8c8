"""What an author says about an MCP server: how to reach it, and what Tether may believe of it.

Pure data (no SDK import): an agent module that mounts servers stays light until it is served.
:class:`MCP` makes the configurations (``MCP.stdio(...)``, ``MCP.http(...)``);
:func:`parse_mcp_option` reads the command line's ``--mcp`` values into the same objects.

Secrets (a bearer token for a streamable-HTTP server, an API key in a stdio server's
environment) never sit in a configuration as text: a :class:`Secret` names where to read them
(an environment variable or a file) when the connection is made, and it shows itself as
``****`` in every ``repr``, log line and description.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import Any, ClassVar, Literal, TypedDict, Unpack
from urllib.parse import urlsplit

from ..tools import DEFAULT_APPROVAL_TTL_S, RISK_ORDER, Risk

__all__ = ["MCP", "MCPServer", "StdioServer", "HttpServer", "Secret", "ServerOptions", "parse_mcp_option", "parse_secret_value", "server_names"]

#: What a server's name may hold: it prefixes its tools' names when two servers offer the same one.
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,32}$")


@dataclass(frozen=True, slots=True)
class Secret:
    """A secret read when a connection is made: from the environment variable ``env`` or the
    file ``file`` (its content, trailing newline stripped), with ``prefix`` before it
    (``Secret(env="GH_TOKEN", prefix="Bearer ")``)."""

    env: str | None = None
    file: str | None = None
    prefix: str = ""

    def __post_init__(self) -> None:
        if (self.env is None) == (self.file is None):
            raise ValueError("a Secret reads from exactly one of env= or file=")

    def __repr__(self) -> str:
        source = f"env={self.env!r}" if self.env is not None else f"file={self.file!r}"
        return f"Secret({source}, ****)"

    def read(self) -> str:
        """The secret's value now; :class:`LookupError` naming the source when it is missing."""
        if self.env is not None:
            value = os.environ.get(self.env)
            if not value:
                raise LookupError(f"environment variable {self.env} is not set")
            return self.prefix + value
        assert self.file is not None
        try:
            return self.prefix + Path(self.file).read_text().rstrip("\r\n")
        except OSError as exc:
            raise LookupError(f"cannot read the secret file {self.file}: {exc.strerror}") from None


@dataclass(frozen=True, kw_only=True)
class MCPServer:
    """What every mounted MCP server has: a name, its trust, and the author's review settings."""

    #: Prefixes its tools' names when two servers (or a Python tool) offer the same name.
    name: str
    #: Believe the server's tool annotations (``readOnlyHint``, ``destructiveHint``)? ``None``:
    #: the transport's default (stdio: yes, the author runs that code; HTTP: no).
    trust_annotations: bool | None = None
    #: The author's tier per tool name (``"*"``: every tool of this server); always wins.
    risk: Mapping[str, Risk] = field(default_factory=dict)
    #: Argument names masked wherever a call of this server's tools is shown or logged.
    sensitive: Collection[str] = ()
    #: Tools whose approval needs someone other than the run's requester (``True``: all).
    four_eyes: bool | Collection[str] = False
    #: How long a review of one of these tools waits for a human by default.
    approval_ttl_s: float = DEFAULT_APPROVAL_TTL_S
    #: How long one ``tools/call`` may take before it is abandoned (and cancelled on the server).
    call_timeout_s: float = 60.0
    #: How long connecting (spawn or HTTP, and the handshake) may take.
    connect_timeout_s: float = 30.0
    #: The largest result kept, in bytes of JSON; more is cut, and the cut is shown.
    max_result_bytes: int = 256 * 1024

    #: How the server is reached.
    transport: ClassVar[Literal["stdio", "http"]]

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"MCP server name {self.name!r} must be 1-32 letters, digits, '_' or '-'")
        for tool, tier in self.risk.items():
            if tier not in RISK_ORDER:
                raise ValueError(f"risk for {tool!r} of MCP server {self.name!r}: unknown tier {tier!r}")
        for value, what in ((self.approval_ttl_s, "approval_ttl_s"), (self.call_timeout_s, "call_timeout_s"), (self.connect_timeout_s, "connect_timeout_s")):
            if not value > 0:
                raise ValueError(f"{what} of MCP server {self.name!r} must be positive")
        if self.max_result_bytes < 1024:
            raise ValueError(f"max_result_bytes of MCP server {self.name!r} must be at least 1024")

    @property
    def trusted(self) -> bool:
        """Whether its annotations are believed."""
        return self.trust_annotations if self.trust_annotations is not None else self.transport == "stdio"

    def needs_four_eyes(self, tool: str) -> bool:
        """Whether approving a call of ``tool`` needs a second person."""
        return self.four_eyes if isinstance(self.four_eyes, bool) else tool in self.four_eyes

    def target(self) -> str:
        """Where the server is, as an agent's description shows it (no secret)."""
        raise NotImplementedError


@dataclass(frozen=True, kw_only=True)
class StdioServer(MCPServer):
    """A server Tether starts as a child process and talks to over its stdin and stdout."""

    command: str
    args: tuple[str, ...] = ()
    #: Extra environment of the child (values may be :class:`Secret`); the child gets only a
    #: minimal environment besides (``PATH``, ``HOME``, …), never the server's own secrets.
    env: Mapping[str, str | Secret] = field(default_factory=dict, repr=False)
    cwd: str | None = None

    transport: ClassVar[Literal["stdio", "http"]] = "stdio"

    def target(self) -> str:
        return shlex.join([self.command, *self.args])


@dataclass(frozen=True, kw_only=True)
class HttpServer(MCPServer):
    """A server reached over streamable HTTP at ``url``; untrusted unless the author says so."""

    url: str
    #: Request headers (values may be :class:`Secret`, e.g. an ``Authorization`` bearer token).
    headers: Mapping[str, str | Secret] = field(default_factory=dict, repr=False)

    transport: ClassVar[Literal["stdio", "http"]] = "http"

    def __post_init__(self) -> None:
        super().__post_init__()
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"MCP server URL {self.url!r} must be an http:// or https:// URL")
        if parts.username or parts.password:
            raise ValueError("put credentials for an MCP server in headers=, read from a Secret, not in its URL")

    def target(self) -> str:
        parts = urlsplit(self.url)
        return f"{parts.scheme}://{parts.netloc}{parts.path}"


class ServerOptions(TypedDict, total=False):
    """What :meth:`MCP.stdio` and :meth:`MCP.http` take besides where the server is (see
    :class:`MCPServer` for each)."""

    trust_annotations: bool | None
    risk: Mapping[str, Risk]
    sensitive: Collection[str]
    four_eyes: bool | Collection[str]
    approval_ttl_s: float
    call_timeout_s: float
    connect_timeout_s: float
    max_result_bytes: int


def _frozen(options: ServerOptions) -> dict[str, Any]:
    """The options as the frozen configuration keeps them."""
    kept: dict[str, Any] = dict(options)
    if "risk" in kept:
        kept["risk"] = dict(kept["risk"])
    if "sensitive" in kept:
        kept["sensitive"] = frozenset(kept["sensitive"])
    if not isinstance(kept.get("four_eyes", False), bool):
        kept["four_eyes"] = frozenset(kept["four_eyes"])
    return kept


class MCP:
    """Make MCP server configurations for ``Agent(..., mcp=[...])``."""

    @staticmethod
    def stdio(
        command: str,
        *args: str,
        name: str | None = None,
        env: Mapping[str, str | Secret] | None = None,
        cwd: str | None = None,
        **options: Unpack[ServerOptions],
    ) -> StdioServer:
        """A server started as ``command args…`` (``MCP.stdio("npx", "-y", "@modelcontextprotocol/server-filesystem", "/srv")``);
        trusted by default (its annotations set the tiers)."""
        name = name or _name_of_command(command, args)
        return StdioServer(name=name, command=command, args=tuple(args), env=dict(env or {}), cwd=cwd, **_frozen(options))

    @staticmethod
    def http(url: str, *, name: str | None = None, headers: Mapping[str, str | Secret] | None = None, **options: Unpack[ServerOptions]) -> HttpServer:
        """A streamable-HTTP server at ``url``; untrusted by default (every tool ``destructive``
        until ``trust_annotations=True`` or a tier in ``risk``)."""
        return HttpServer(name=name or _name_of_url(url), url=url, headers=dict(headers or {}), **_frozen(options))


#: Launchers whose first argument that is not an option names the server.
_LAUNCHERS = {"npx", "uvx", "python", "python3", "node", "bunx", "pipx", "deno", "docker"}


def _slug(text: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9_-]+", "-", text).strip("-")[:32]
    return slug or "mcp"


def _name_of_command(command: str, args: Sequence[str]) -> str:
    """``npx -y @modelcontextprotocol/server-filesystem /srv`` → ``server-filesystem``."""
    base = PurePath(command).name
    if base in _LAUNCHERS or re.fullmatch(r"python3(\.\d+)?", base):
        for arg in args:
            if not arg.startswith("-"):
                base = arg
                break
    base = base.rsplit("/", 1)[-1]
    base = re.sub(r"@[^@/]*$", "", base) if not base.startswith("@") else base  # a version pin
    base = re.sub(r"\.(py|js|mjs|ts)$", "", PurePath(base).name)
    return _slug(base)


def _name_of_url(url: str) -> str:
    host = urlsplit(url).hostname or "mcp"
    return _slug(host.split(".")[0] if not host.replace(".", "").isdigit() else host.replace(".", "-"))


def server_names(servers: Sequence[MCPServer]) -> None:
    """Refuse two servers of one agent with the same name."""
    seen: set[str] = set()
    for server in servers:
        if server.name in seen:
            raise ValueError(f"two MCP servers are named {server.name!r}: give one a name= of its own")
        seen.add(server.name)


#: Header names whose values are secrets: never taken literally from a command line.
_SECRET_HEADER = re.compile(r"authorization|cookie|token|secret|key|password", re.I)
_PLACEHOLDER = re.compile(r"^(?P<prefix>[^$]*)\$\{(?P<file>file:)?(?P<source>[^}]+)\}$")


def parse_secret_value(name: str, value: str) -> str | Secret:
    """A header or environment value from a command line: ``Bearer ${MCP_TOKEN}`` (the variable
    read when connecting) or ``${file:/run/secrets/token}`` (the file's content); a literal value
    only for a name that does not look like a secret (``X-Org: acme``, not ``Authorization``)."""
    match = _PLACEHOLDER.match(value)
    if match:
        if match["file"]:
            return Secret(file=match["source"], prefix=match["prefix"])
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", match["source"]):
            raise ValueError(f"{name}: {match['source']!r} is not an environment variable name")
        return Secret(env=match["source"], prefix=match["prefix"])
    if "${" in value:
        raise ValueError(f"{name}: a placeholder (${{VAR}} or ${{file:PATH}}) must end the value")
    if _SECRET_HEADER.search(name):
        raise ValueError(f"{name} holds a secret: give it as ${{VAR}} or ${{file:PATH}}, never on the command line (where ps shows it)")
    return value


def parse_mcp_option(
    value: str,
    *,
    env: Mapping[str, Mapping[str, str | Secret]] | None = None,
    headers: Mapping[str, Mapping[str, str | Secret]] | None = None,
    trusted: Collection[str] = (),
) -> MCPServer:
    """One ``--mcp`` value: ``stdio:COMMAND ARGS…`` (split as a shell would) or an ``http(s)://``
    URL, optionally prefixed by ``NAME=`` (``--mcp "fs=stdio:npx -y @modelcontextprotocol/server-filesystem /srv"``).

    By server name: ``env`` is a stdio server's extra environment (``--mcp-env``), ``headers`` an
    HTTP server's request headers (``--mcp-header``); ``trusted`` names servers whose annotations
    are believed (``--mcp-trust``).
    """
    name: str | None = None
    head, sep, rest = value.partition("=")
    if sep and _NAME.match(head) and (rest.startswith("stdio:") or rest.startswith(("http://", "https://"))):
        name, value = head, rest
    if value.startswith("stdio:"):
        argv = shlex.split(value[len("stdio:") :])
        if not argv:
            raise ValueError("--mcp stdio: needs a command, e.g. 'stdio:npx -y @modelcontextprotocol/server-filesystem /srv'")
        name = name or _name_of_command(argv[0], argv[1:])
        return MCP.stdio(argv[0], *argv[1:], name=name, env=(env or {}).get(name), trust_annotations=True if name in trusted else None)
    if value.startswith(("http://", "https://")):
        name = name or _name_of_url(value)
        return MCP.http(value, name=name, headers=(headers or {}).get(name), trust_annotations=True if name in trusted else None)
    raise ValueError(f"--mcp {value!r}: expected 'stdio:COMMAND ARGS…' or an http(s):// URL")
