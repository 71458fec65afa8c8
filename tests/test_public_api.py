"""The public API is deliberate: ``tether.__all__`` is pinned, and every name in it resolves."""

from __future__ import annotations

import subprocess
import sys

import tether

PUBLIC = [
    "__version__",
    "Agent",
    "tool",
    "Tool",
    "ToolContext",
    "Sensitive",
    "RunConfig",
    "HistoryPolicy",
    "Model",
    "ModelRequest",
    "ChatMessage",
    "TextDelta",
    "ThinkingDelta",
    "ToolCallRequest",
    "Usage",
    "RetryPolicy",
    "ScriptedModel",
    "load_model",
    "create_app",
    "AsyncClient",
    "Client",
    "Envelope",
    "Event",
    "TetherError",
    "FieldError",
    "NotFound",
    "InvalidRequest",
    "ToolArgsError",
    "Conflict",
    "ThreadBusy",
    "RunNotActive",
    "InterruptResolved",
    "Gone",
    "InterruptExpired",
    "Unauthorized",
    "Forbidden",
    "PayloadTooLarge",
    "LimitExceeded",
    "Overloaded",
    "ModelError",
    "ModelConfigError",
    "EventLogFailed",
    "APIError",
    "ServerUnreachable",
]


def test_the_public_names_are_exactly_the_pinned_list() -> None:
    assert tether.__all__ == PUBLIC


def test_every_public_name_resolves() -> None:
    for name in tether.__all__:
        assert getattr(tether, name) is not None, name


def test_every_error_of_the_tree_is_public_and_a_tether_error() -> None:
    import tether.errors

    errors = [name for name in tether.errors.__all__ if name != "FieldError"]
    assert set(errors) <= set(tether.__all__)
    assert all(issubclass(getattr(tether, name), tether.TetherError) for name in errors)


def test_importing_tether_for_an_agent_loads_neither_the_server_nor_the_database() -> None:
    code = "import sys, tether; print(sorted(m for m in ('fastapi', 'sqlalchemy', 'uvicorn', 'httpx') if m in sys.modules))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    assert loaded == "[]"


def test_the_version_is_written_once() -> None:
    from importlib.metadata import version

    assert version("tether") == tether.__version__


def test_no_module_of_the_package_is_over_500_lines() -> None:
    """The line holds for the web UI's JavaScript modules (``server/static/*.js``) as for Python."""
    from pathlib import Path

    root = Path(tether.__file__).parent
    modules = [*root.rglob("*.py"), *root.rglob("*.js")]
    assert any(p.suffix == ".js" for p in modules)  # the UI's modules are counted
    sizes = {str(p.relative_to(root)): len(p.read_text().splitlines()) for p in modules}
    assert {name: n for name, n in sizes.items() if n > 500} == {}
