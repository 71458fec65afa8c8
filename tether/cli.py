"""The ``tether`` command: a thin click CLI over the application.

``tether serve module:attr`` serves an :class:`~tether.Agent`; ``tether demo`` serves the
built-in demo agent. Both default to a SQLite file in the data directory
(``$TETHER_DATA_DIR``, else the platform's application directory), created on first start, and
both take ``--model`` with a model string (``docs/models.md``) that replaces the agent's model.
``tether keys`` manages API keys in a database, also while a server runs on it. ``tether
migrate`` brings a database's schema up to date; a server starting on an older schema does the
same in a child process first, so the migrations' libraries never stay in the serving process.

Authentication defaults to ``open`` (no key) on a loopback host and to ``keys`` anywhere else;
``--auth open`` on another host is refused (exit code 2): an unauthenticated server must never
be reachable from the network by a typo.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

import click

from . import __version__
from ._launch import migrate as migrate_schema
from ._launch import serve_agent, with_store
from .agent import Agent
from .mcp._cli import mcp_options, mount_from_options
from .models import Model
from .webhooks._cli import settings_from_options, webhook_options

__all__ = ["main"]


def data_dir() -> Path:
    """Where Tether keeps its default SQLite files."""
    return Path(os.environ.get("TETHER_DATA_DIR") or click.get_app_dir("tether"))


def default_db_url(name: str) -> str:
    """``sqlite:///…/<name>.db`` in the data directory."""
    return f"sqlite:///{data_dir() / (name + '.db')}"


def load_agent(spec: str) -> Agent:
    """Import ``module:attr`` (an Agent, or a callable returning one)."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise click.BadParameter("expected module:attr, e.g. myagent:agent", param_hint="APP")
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise click.BadParameter(f"cannot import {module_name!r}: {exc}", param_hint="APP") from exc
    try:
        obj = getattr(module, attr)
    except AttributeError:
        raise click.BadParameter(f"{module_name!r} has no attribute {attr!r}", param_hint="APP") from None
    if not isinstance(obj, Agent) and callable(obj):
        obj = obj()
    if not isinstance(obj, Agent):
        raise click.BadParameter(f"{spec} is not a tether.Agent", param_hint="APP")
    return obj


#: The ``tether serve`` / ``tether demo`` options that set :class:`~tether.server.Limits` fields.
_LIMIT_OPTIONS = {
    "max_body_bytes": ("--max-body-bytes", "Largest request body in bytes, refused (413) before parsing."),
    "requests_per_minute": ("--requests-per-minute", "Requests to /v1 per caller per minute (429 beyond)."),
    "run_starts_per_minute": ("--run-starts-per-minute", "Run starts per caller per minute (429 beyond)."),
    "max_active_runs_per_caller": ("--max-active-runs", "Runs of one caller queued or running at once (429 beyond)."),
    "max_streams_per_caller": ("--max-streams-per-caller", "Open event streams per caller in this process (429 beyond)."),
    "max_streams": ("--max-streams", "Open event streams in this process (503 beyond)."),
    "max_queued_messages": ("--max-queued-messages", "Steering messages a run holds for its next model call (429 beyond)."),
    "stream_buffer_bytes": ("--stream-buffer-bytes", "Bytes of events a slow stream may have waiting before it is cut (it resumes)."),
    "max_allowance_ttl_s": ("--max-allowance-ttl", "Longest standing approval (an approve's allow) in seconds (422 beyond)."),
}

#: Connections uvicorn serves at once before answering 503 (event streams are connections too).
MAX_CONNECTIONS = 12_000
#: When told to stop, how long the server lets the runs under way finish before handing them
#: over (``--drain-seconds``): under the usual grace of a process manager before it kills
#: (10 s for ``docker stop``, 30 s on Kubernetes).
DRAIN_S = 5.0


def _is_loopback_host(host: str) -> bool:
    from .server._auth import is_loopback

    return is_loopback(host)


def _auth_mode(host: str, auth: str | None) -> Literal["open", "keys"]:
    """The auth mode to serve with: ``open`` by default only on a loopback host."""
    if auth is None:
        return "open" if _is_loopback_host(host) else "keys"
    if auth == "open" and not _is_loopback_host(host):
        click.echo(
            f"Error: --auth open (no API keys) is only allowed on a loopback host, not {host!r}: anyone who can reach the port "
            "could read every thread and approve every action. Use --auth keys (create keys with 'tether keys create'), "
            "or serve on 127.0.0.1.",
            err=True,
        )
        sys.exit(2)
    return "open" if auth == "open" else "keys"


def _run_server(agent: Agent, host: str, port: int, db: str, log_level: str, lease_seconds: float, max_connections: int, options: dict[str, Any]) -> None:
    serve_agent(
        agent,
        host=host,
        port=port,
        db=db,
        log_level=log_level,
        lease_seconds=lease_seconds,
        max_connections=max_connections,
        auth=_auth_mode(host, options["auth"]),
        four_eyes="destructive" if options["four_eyes"] == "destructive" else "off",
        drain_s=options["drain_seconds"],
        cors_origins=options["cors_origin"],
        limits={name: options[name] for name in _LIMIT_OPTIONS},
        workers=options["workers"],
        webhooks=settings_from_options(options),
    )


def _model_from_option(spec: str | None, base_url: str | None) -> Model | None:
    """The model ``--model`` names, or None when it was not given."""
    if not spec:
        return None
    from .errors import ModelConfigError
    from .models import load_model

    try:
        return load_model(spec, base_url=base_url)
    except ModelConfigError as exc:
        raise click.BadParameter(exc.message, param_hint="--model") from None


def _server_options(fn: Callable[..., None]) -> Callable[..., None]:
    from .server._limits import Limits

    defaults = Limits()
    for field, (flag, text) in reversed(_LIMIT_OPTIONS.items()):
        fn = click.option(flag, field, default=getattr(defaults, field), show_default=True, type=click.IntRange(min=1), help=text)(fn)
    fn = click.option(
        "--max-connections",
        default=MAX_CONNECTIONS,
        show_default=True,
        type=click.IntRange(min=1),
        help="Connections served at once, event streams included (503 beyond).",
    )(fn)
    fn = click.option(
        "--cors-origin",
        multiple=True,
        help="A browser origin (https://app.example.com) allowed to call the API from another site; repeatable. None by default.",
    )(fn)
    fn = click.option(
        "--four-eyes",
        type=click.Choice(["off", "destructive"]),
        default="off",
        show_default=True,
        envvar="TETHER_FOUR_EYES",
        help="destructive: every destructive call needs an approver other than the run's requester.",
    )(fn)
    fn = click.option(
        "--auth",
        type=click.Choice(["open", "keys"]),
        default=None,
        envvar="TETHER_AUTH",
        help="open: no key, everyone is 'local' (loopback hosts only; the default there). keys: a bearer API key on every request (the default elsewhere).",
    )(fn)
    fn = click.option(
        "--openai-base-url",
        default=None,
        envvar="TETHER_OPENAI_BASE_URL",
        help="Base URL of an OpenAI-compatible API, for --model openai:<model>.",
    )(fn)
    fn = click.option(
        "--model",
        "model_spec",
        default=None,
        envvar="TETHER_MODEL",
        help="The model: scripted, openai:<model>, anthropic:<model>, llamacpp:<path.gguf> or local (see docs/models.md).",
    )(fn)
    fn = click.option(
        "--lease-seconds",
        default=10.0,
        show_default=True,
        type=click.FloatRange(min=0.5),
        help="With PostgreSQL and several processes: how long after its executor dies a run is taken over.",
    )(fn)
    fn = click.option(
        "--drain-seconds",
        default=DRAIN_S,
        show_default=True,
        type=click.FloatRange(min=0),
        help="When told to stop: how long to let the runs under way finish before handing them over (PostgreSQL: to another process at once; SQLite: to the next start).",
    )(fn)
    fn = click.option(
        "--workers",
        default=None,
        type=click.IntRange(min=1),
        envvar="TETHER_WORKERS",
        help="Processes serving the port, under a supervisor that replaces a dead one (default: the number of cores with PostgreSQL, 1 with SQLite and for tether demo; above 1 needs PostgreSQL).",
    )(fn)
    fn = webhook_options(fn)
    fn = mcp_options(fn)
    fn = click.option("--log-level", default="info", show_default=True, type=click.Choice(["critical", "error", "warning", "info", "debug"]))(fn)
    fn = click.option("--db", "db", default=None, help="Database URL (sqlite:///path or postgresql://…).")(fn)
    fn = click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535))(fn)
    fn = click.option("--host", default="127.0.0.1", show_default=True)(fn)
    return fn


@click.group()
@click.version_option(__version__, prog_name="tether")
def main() -> None:
    """Tether: durable, stoppable, reviewable tool-using agents."""


@main.command()
@click.argument("app")
@_server_options
def serve(
    app: str,
    host: str,
    port: int,
    db: str | None,
    log_level: str,
    lease_seconds: float,
    max_connections: int,
    model_spec: str | None,
    openai_base_url: str | None,
    **options: Any,
) -> None:
    """Serve the agent APP (module:attr); --model replaces its model."""
    _auth_mode(host, options["auth"])  # refuse a bad combination before importing anything
    agent = load_agent(app)
    model = _model_from_option(model_spec, openai_base_url)
    if model is not None:
        agent.model = model
    mount_from_options(agent, options)
    _run_server(agent, host, port, db or default_db_url("tether"), log_level, lease_seconds, max_connections, options)


@main.command()
@_server_options
def demo(
    host: str,
    port: int,
    db: str | None,
    log_level: str,
    lease_seconds: float,
    max_connections: int,
    model_spec: str | None,
    openai_base_url: str | None,
    **options: Any,
) -> None:
    """Serve the built-in demo shop agent (scripted model unless --model says otherwise; no keys needed)."""
    from .demo import build_demo_agent

    _auth_mode(host, options["auth"])
    options["workers"] = options["workers"] or 1  # a demo is one process unless asked
    agent = build_demo_agent(_model_from_option(model_spec, openai_base_url))
    mount_from_options(agent, options)
    _run_server(
        agent,
        host,
        port,
        db or default_db_url("demo"),
        log_level,
        lease_seconds,
        max_connections,
        options,
    )


@main.command()
@click.option("--url", default="http://127.0.0.1:8000", show_default=True, envvar="TETHER_URL", help="Server to talk to.")
@click.option("--thread", "thread_id", default=None, help="Continue this thread (default: a new one).")
def chat(url: str, thread_id: str | None) -> None:
    """Chat with a served agent in the terminal; review tool calls as they come.

    In keys mode, give the API key in $TETHER_API_KEY (never on the command line, where other
    users of the machine could read it)."""
    import asyncio

    from ._chat import run_chat
    from .client import APIError, ServerUnreachable

    try:
        asyncio.run(run_chat(url, thread_id))
    except APIError as exc:
        raise click.ClickException(f"{exc.status} {exc.code}: {exc.message}") from None
    except ServerUnreachable as exc:
        raise click.ClickException(exc.message) from None
    except OSError as exc:
        raise click.ClickException(f"cannot reach {url}: {exc}") from None


@main.command()
@click.option("--url", default="http://127.0.0.1:8000", show_default=True, envvar="TETHER_URL", help="Server to ask.")
@click.option("--thread", "thread_id", default=None, help="Entries of this thread.")
@click.option("--run", "run_id", default=None, help="Entries of this run.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines instead of a table.")
def audit(url: str, thread_id: str | None, run_id: str | None, as_json: bool) -> None:
    """Print the audit log (decisions, expiries, cancels, gated executions); key in $TETHER_API_KEY."""
    import asyncio
    import json

    from .client import APIError, AsyncClient, ServerUnreachable

    if not thread_id and not run_id:
        raise click.UsageError("give --thread or --run")

    async def fetch() -> list[dict[str, Any]]:
        async with AsyncClient(url) as client:
            return await client.audit(thread_id=thread_id, run_id=run_id)

    try:
        entries = asyncio.run(fetch())
    except APIError as exc:
        raise click.ClickException(f"{exc.status} {exc.code}: {exc.message}") from None
    except ServerUnreachable as exc:
        raise click.ClickException(exc.message) from None
    except OSError as exc:
        raise click.ClickException(f"cannot reach {url}: {exc}") from None
    for e in entries:
        if as_json:
            click.echo(json.dumps(e, ensure_ascii=False))
            continue
        what = " ".join(str(x) for x in (e["tool"], e["decision"], e["outcome"]) if x)
        reason = f" — {e['reason']}" if e["reason"] else ""
        click.echo(f"{e['ts']}  {e['action']:<13} {e['actor']:<12} {e['run_id'] or '':<30} {e['call_id'] or '':<24} {what}{reason}")


# -- keys --------------------------------------------------------------------------------------

_DURATION = re.compile(r"(\d+)([smhdw])")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def _parse_duration(_ctx: Any, _param: Any, value: str | None) -> timedelta | None:
    if value is None:
        return None
    match = _DURATION.fullmatch(value.strip())
    if not match or int(match.group(1)) == 0:
        raise click.BadParameter("expected a positive number and a unit, like 90m, 12h, 30d or 4w")
    try:
        return timedelta(**{_UNITS[match.group(2)]: int(match.group(1))})
    except OverflowError:
        raise click.BadParameter("too long") from None


def _cli_actor() -> str:
    """The audit ``actor`` of key management: the operating-system user who ran the command."""
    import getpass

    try:
        return f"cli:{getpass.getuser()}"
    except Exception:  # no user name in this environment (some containers)
        return "cli"


_db_option = click.option("--db", "db", required=True, help="Database URL of the server (sqlite:///path or postgresql://…).")


@main.command()
@_db_option
def migrate(db: str) -> None:
    """Bring the database's schema up to date, as a server does at start-up (run it ahead of
    a deploy; servers starting on a migrated database never load the migrations)."""
    migrate_schema(db)


@main.group()
def keys() -> None:
    """Manage API keys (usable while a server runs on the same database)."""


@keys.command("create")
@_db_option
@click.option("--name", required=True, help="The principal the key stands for (e.g. alice).")
@click.option("--role", "roles", multiple=True, type=click.Choice(["user", "approver", "admin"]), default=("user",), show_default=True, help="Repeatable.")
@click.option("--expires-in", callback=_parse_duration, default=None, help="Lifetime, like 12h, 30d or 4w (default: no expiry).")
def keys_create(db: str, name: str, roles: tuple[str, ...], expires_in: timedelta | None) -> None:
    """Create a key; it is printed once, as the last line of stdout, and never stored in clear."""
    from ._ids import utcnow
    from .errors import InvalidRequest

    expires_at = utcnow() + expires_in if expires_in is not None else None
    try:
        record, key = with_store(db, lambda store: store.create_key(name=name, roles=roles, expires_at=expires_at, actor=_cli_actor()))
    except InvalidRequest as exc:
        raise click.BadParameter(exc.message) from None
    until = f", expires {record.expires_at:%Y-%m-%d %H:%M} UTC" if record.expires_at else ""
    click.echo(f"created key {record.prefix}… for {record.name} (roles: {', '.join(record.roles)}{until}); it is shown only now:")
    click.echo(key)


@keys.command("list")
@_db_option
def keys_list(db: str) -> None:
    """List keys: names, roles, prefixes, dates (never the keys)."""
    from ._ids import utcnow

    records = with_store(db, lambda store: store.list_keys())
    now = utcnow()

    def when(moment: Any) -> str:
        return f"{moment:%Y-%m-%d %H:%M}" if moment is not None else "-"

    click.echo(f"{'NAME':<20} {'ROLES':<22} {'PREFIX':<14} {'CREATED':<17} {'LAST USED':<17} {'EXPIRES':<17} STATUS")
    for r in records:
        status = "revoked" if r.revoked_at else ("expired" if not r.usable(now) else "active")
        click.echo(
            f"{r.name:<20} {','.join(r.roles):<22} {r.prefix + '…':<14} {when(r.created_at):<17} {when(r.last_used_at):<17} {when(r.expires_at):<17} {status}"
        )


@keys.command("revoke")
@_db_option
@click.argument("name")
def keys_revoke(db: str, name: str) -> None:
    """Revoke every key of the principal NAME (or the one key with that tk_… prefix); the next
    request with it gets 401, in every server process."""
    revoked = with_store(db, lambda store: store.revoke_keys(name, actor=_cli_actor()))
    if not revoked:
        raise click.ClickException(f"no active key for {name!r}")
    for r in revoked:
        click.echo(f"revoked {r.prefix}… ({r.name})")


if __name__ == "__main__":  # pragma: no cover
    main()
