"""The ``tether`` command: a thin click CLI over the application.

``tether serve module:attr`` serves an :class:`~tether.Agent`; ``tether demo`` serves the
built-in demo agent. Both default to a SQLite file in the data directory
(``$TETHER_DATA_DIR``, else the platform's application directory), created on first start.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from . import __version__
from .agent import Agent

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


def _run_server(agent: Agent, host: str, port: int, db: str, log_level: str, lease_seconds: float = 10.0) -> None:
    import uvicorn

    from .server import create_app

    click.echo(f"Tether {__version__}: serving agent {agent.name!r} on http://{host}:{port} (db: {db})", err=True)
    uvicorn.run(create_app(agent, db, lease_s=lease_seconds), host=host, port=port, log_level=log_level, timeout_graceful_shutdown=3)


def _server_options(fn: Callable[..., None]) -> Callable[..., None]:
    fn = click.option(
        "--lease-seconds",
        default=10.0,
        show_default=True,
        type=click.FloatRange(min=0.5),
        help="With PostgreSQL and several processes: how long after its executor dies a run is taken over.",
    )(fn)
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
def serve(app: str, host: str, port: int, db: str | None, log_level: str, lease_seconds: float) -> None:
    """Serve the agent APP (module:attr)."""
    _run_server(load_agent(app), host, port, db or default_db_url("tether"), log_level, lease_seconds)


@main.command()
@_server_options
@click.option("--openai-model", default=None, envvar="TETHER_OPENAI_MODEL", help="Use an OpenAI-compatible model instead of the scripted one.")
@click.option("--openai-base-url", default=None, envvar="TETHER_OPENAI_BASE_URL", help="Base URL of the OpenAI-compatible API.")
def demo(host: str, port: int, db: str | None, log_level: str, lease_seconds: float, openai_model: str | None, openai_base_url: str | None) -> None:
    """Serve the built-in demo shop agent (scripted model, no keys needed)."""
    from .demo import build_demo_agent

    model = None
    if openai_model:
        from .models.openai import OpenAIModel

        model = OpenAIModel(openai_model, base_url=openai_base_url)
    _run_server(build_demo_agent(model), host, port, db or default_db_url("demo"), log_level, lease_seconds)


@main.command()
@click.option("--url", default="http://127.0.0.1:8000", show_default=True, envvar="TETHER_URL", help="Server to talk to.")
@click.option("--thread", "thread_id", default=None, help="Continue this thread (default: a new one).")
def chat(url: str, thread_id: str | None) -> None:
    """Chat with a served agent in the terminal; review tool calls as they come."""
    import asyncio

    from ._chat import run_chat
    from .client import APIError

    try:
        asyncio.run(run_chat(url, thread_id))
    except APIError as exc:
        raise click.ClickException(f"{exc.status} {exc.code}: {exc.message}") from None
    except OSError as exc:
        raise click.ClickException(f"cannot reach {url}: {exc}") from None


@main.command()
@click.option("--url", default="http://127.0.0.1:8000", show_default=True, envvar="TETHER_URL", help="Server to ask.")
@click.option("--thread", "thread_id", default=None, help="Entries of this thread.")
@click.option("--run", "run_id", default=None, help="Entries of this run.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines instead of a table.")
def audit(url: str, thread_id: str | None, run_id: str | None, as_json: bool) -> None:
    """Print the audit log (decisions, expiries, cancels, gated executions)."""
    import asyncio
    import json

    from .client import APIError, AsyncClient

    if not thread_id and not run_id:
        raise click.UsageError("give --thread or --run")

    async def fetch() -> list[dict[str, Any]]:
        async with AsyncClient(url) as client:
            return await client.audit(thread_id=thread_id, run_id=run_id)

    try:
        entries = asyncio.run(fetch())
    except APIError as exc:
        raise click.ClickException(f"{exc.status} {exc.code}: {exc.message}") from None
    except OSError as exc:
        raise click.ClickException(f"cannot reach {url}: {exc}") from None
    for e in entries:
        if as_json:
            click.echo(json.dumps(e, ensure_ascii=False))
            continue
        what = " ".join(str(x) for x in (e["tool"], e["decision"], e["outcome"]) if x)
        reason = f" — {e['reason']}" if e["reason"] else ""
        click.echo(f"{e['ts']}  {e['action']:<13} {e['actor']:<12} {e['run_id'] or '':<30} {e['call_id'] or '':<24} {what}{reason}")


if __name__ == "__main__":  # pragma: no cover
    main()
