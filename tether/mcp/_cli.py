"""The ``tether serve`` / ``tether demo`` flags of MCP servers, and mounting what they name."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from ._config import Secret, parse_mcp_option, parse_secret_value

if TYPE_CHECKING:
    from ..agent import Agent

__all__ = ["mcp_options", "mount_from_options"]


def mcp_options(fn: Callable[..., None]) -> Callable[..., None]:
    """Add the ``--mcp…`` flags to a command."""
    fn = click.option(
        "--mcp",
        "mcp_specs",
        multiple=True,
        metavar="SPEC",
        help="Mount an MCP server's tools: 'stdio:COMMAND ARGS…' or an http(s):// URL, optionally NAME=SPEC; repeatable (see docs/mcp.md).",
    )(fn)
    fn = click.option(
        "--mcp-trust",
        "mcp_trust",
        multiple=True,
        metavar="SERVER",
        help="Believe the tool annotations of the MCP server SERVER (an HTTP server's tools are all destructive otherwise); repeatable.",
    )(fn)
    fn = click.option(
        "--mcp-header",
        "mcp_header",
        multiple=True,
        metavar="SERVER:NAME=VALUE",
        help="A request header of the HTTP MCP server SERVER; a secret as 'Bearer ${VAR}' or '${file:PATH}' (read when connecting); repeatable.",
    )(fn)
    fn = click.option(
        "--mcp-env",
        "mcp_env",
        multiple=True,
        metavar="SERVER:VAR",
        help="Pass the environment variable VAR of this process to the stdio MCP server SERVER (its value never on the command line); repeatable.",
    )(fn)
    return fn


def _per_server(values: tuple[str, ...], flag: str, form: str) -> dict[str, dict[str, str]]:
    """``SERVER:NAME=VALUE`` (or ``SERVER:NAME``) options by server, then by name."""
    found: dict[str, dict[str, str]] = {}
    for value in values:
        server, _, rest = value.partition(":")
        key, _, text = rest.partition("=")
        if not server or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", key) or ("=" in form and not text):
            raise click.BadParameter(f"{value!r}: expected {form}", param_hint=flag)
        found.setdefault(server, {})[key] = text
    return found


def mount_from_options(agent: Agent, options: dict[str, Any]) -> None:
    """Mount the MCP servers of the ``--mcp`` options on ``agent``."""
    specs = options.pop("mcp_specs", ())
    by_server: dict[str, dict[str, dict[str, str]]] = {
        "--mcp-env": _per_server(options.pop("mcp_env", ()), "--mcp-env", "SERVER:VARIABLE"),
        "--mcp-header": _per_server(options.pop("mcp_header", ()), "--mcp-header", "SERVER:NAME=VALUE"),
        "--mcp-trust": {str(name): {} for name in options.pop("mcp_trust", ())},
    }
    if not specs:
        given = [flag for flag, values in by_server.items() if values]
        if given:
            raise click.UsageError(f"{given[0]} names a server given with --mcp")
        return
    env = {server: {var: Secret(env=var) for var in values} for server, values in by_server["--mcp-env"].items()}
    try:
        headers = {server: {k: parse_secret_value(k, v) for k, v in values.items()} for server, values in by_server["--mcp-header"].items()}
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--mcp-header") from None
    servers = []
    for spec in specs:
        try:
            servers.append(parse_mcp_option(spec, env=env, headers=headers, trusted=set(by_server["--mcp-trust"])))
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--mcp") from None
    names = {s.name for s in servers}
    for flag, values in by_server.items():
        unknown = set(values) - names
        if unknown:
            raise click.BadParameter(f"no --mcp server is named {', '.join(sorted(unknown))}", param_hint=flag)
    try:
        import mcp  # noqa: F401  (the SDK; imported when a server connects)
    except ImportError:
        raise click.UsageError("--mcp needs the MCP SDK: pip install 'tether[mcp]'") from None
    try:
        agent.mount_mcp(servers)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--mcp") from None
