"""The documentation matches the code: a test fails when they drift.

- every event type, with each of its data fields, is in ``docs/api.md``'s event table, and the
  table names no event that does not exist;
- every HTTP route under ``/v1`` (and ``/healthz``) is in ``docs/api.md``, and every route the
  endpoint table names exists;
- every ``tether`` command is in the README;
- the README's "Write your own agent" code is ``examples/shop_agent.py``, byte for byte, and that
  agent really works: served for real, it looks an order up, parks a refund for review, and
  completes once the refund is approved through the API.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio
import httpx
import pytest

from tether.cli import main as cli_main
from tether.client import AsyncClient
from tether.demo import build_demo_agent
from tether.events import EVENT_TYPES
from tether.server import create_app

from .conftest import LiveServer, script

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parent.parent
API_MD = ROOT / "docs" / "api.md"
README = ROOT / "README.md"
EXAMPLE = ROOT / "examples" / "shop_agent.py"


# -- helpers ---------------------------------------------------------------------------------


def section(text: str, heading: str) -> str:
    """The body of the markdown section ``heading``: up to the next heading of its level or
    higher, not counting ``#`` lines inside code fences (comments in a code block)."""
    level = len(heading) - len(heading.lstrip("#"))
    lines = text.splitlines(keepends=True)
    start = lines.index(heading + "\n") + 1
    body: list[str] = []
    fenced = False
    for line in lines[start:]:
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(rf"#{{1,{level}}} ", line):
            break
        body.append(line)
    return "".join(body)


def table_rows(text: str) -> list[list[str]]:
    """The cells of every markdown table row in ``text`` (separator rows left out)."""
    rows = []
    for line in text.splitlines():
        if line.startswith("|") and not re.fullmatch(r"[|\s:-]+", line):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def routes_of(app: Any) -> set[tuple[str, str]]:
    """Every (method, path) the application serves (HEAD left out)."""
    found: set[tuple[str, str]] = set()

    def add(path: str, methods: Iterable[str] | None) -> None:
        found.update((m, path) for m in methods or () if m != "HEAD")

    def walk(routes: Iterable[Any]) -> None:
        for route in routes:
            contexts = getattr(route, "effective_route_contexts", None)
            if callable(contexts):  # newer FastAPI keeps an included router as one entry
                for context in contexts():
                    add(context.path_format, getattr(context.original_route, "methods", None))
            elif isinstance(getattr(route, "path", None), str) and getattr(route, "methods", None):
                add(route.path, route.methods)
            elif hasattr(route, "routes"):
                walk(route.routes)

    walk(app.routes)
    # The OpenAPI document is public API: whatever the routing internals look like, it lists
    # every documented route.
    for path, operations in app.openapi()["paths"].items():
        add(path, [m.upper() for m in operations])
    return found


@pytest.fixture(scope="module")
def api_md() -> str:
    return API_MD.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def served_routes(tmp_path_factory: pytest.TempPathFactory) -> set[tuple[str, str]]:
    db = tmp_path_factory.mktemp("routes") / "tether.db"
    return routes_of(create_app(build_demo_agent(), f"sqlite:///{db}"))


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("tether_docs_shop_agent", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- events ----------------------------------------------------------------------------------


def test_every_event_type_is_documented_with_each_of_its_data_fields(api_md: str) -> None:
    rows = {row[0]: row for row in table_rows(section(api_md, "### Event types"))}
    for name, cls in EVENT_TYPES.items():
        row = rows.get(f"`{name}`")
        assert row is not None, f"event type `{name}` has no row in the event table of docs/api.md"
        fields_cell = row[1]
        missing = [field for field in cls.model_fields if f"`{field}`" not in fields_cell]
        assert not missing, f"docs/api.md: event `{name}` does not list its data fields {missing}"


def test_the_event_table_names_no_event_that_does_not_exist(api_md: str) -> None:
    documented = {row[0].strip("`") for row in table_rows(section(api_md, "### Event types")) if row[0].startswith("`")}
    assert documented <= set(EVENT_TYPES), f"docs/api.md documents unknown events {documented - set(EVENT_TYPES)}"


# -- routes ----------------------------------------------------------------------------------


def test_every_v1_route_and_healthz_is_documented(api_md: str, served_routes: set[tuple[str, str]]) -> None:
    api_routes = {(m, p) for m, p in served_routes if p.startswith("/v1/") or p == "/healthz"}
    assert ("POST", "/v1/threads") in api_routes and ("GET", "/healthz") in api_routes  # the walk works
    missing = sorted(f"{m} {p}" for m, p in api_routes if f"{m} {p}" not in api_md)
    assert not missing, f"routes missing from docs/api.md: {missing}"


def test_every_route_in_the_endpoint_table_exists(api_md: str, served_routes: set[tuple[str, str]]) -> None:
    named = []
    for row in table_rows(section(api_md, "## Endpoints")):
        named += re.findall(r"`([A-Z]+) (/[^`\s]*)`", row[0])
    assert named, "the endpoint table of docs/api.md names no routes"
    unknown = sorted(f"{m} {p}" for m, p in named if (m, p) not in served_routes)
    assert not unknown, f"docs/api.md names routes the server does not have: {unknown}"


# -- README ----------------------------------------------------------------------------------


def test_every_cli_command_is_in_the_readme() -> None:
    readme = README.read_text(encoding="utf-8")
    missing = [name for name in cli_main.commands if f"tether {name}" not in readme]
    assert not missing, f"tether commands missing from README.md: {missing}"


def test_the_readme_agent_code_is_examples_shop_agent_py_byte_for_byte() -> None:
    readme = README.read_text(encoding="utf-8")
    match = re.search(r"```python\n(.*?)^```", section(readme, "## Write your own agent"), re.S | re.M)
    assert match is not None, 'README.md: no python code block under "Write your own agent"'
    assert match.group(1) == EXAMPLE.read_text(encoding="utf-8"), "README.md's agent code differs from examples/shop_agent.py"


async def test_the_example_agent_looks_up_an_order_and_refunds_after_approval(db_url: str) -> None:
    example = load_example()
    server = LiveServer(example.agent, db_url).start()
    try:
        with anyio.fail_after(30):
            async with AsyncClient(server.url) as client, httpx.AsyncClient(base_url=server.url, timeout=10) as http:
                thread = await client.create_thread()
                steps = script(
                    {"text": "Let me look.", "tool_calls": [{"name": "lookup_order", "args": {"order_id": "A100"}}]},
                    {"tool_calls": [{"name": "refund", "args": {"order_id": "A100", "amount": 5}}]},
                    {"text": "Refunded."},
                )
                run = await client.start_run(thread["id"], steps)

                interrupt = await client.wait_for_interrupt(run["id"])
                assert interrupt is not None, "the refund was not parked for review"
                assert [a["action"] for a in interrupt["action_requests"]] == ["refund"]
                assert interrupt["action_requests"][0]["description"] == "Refund 5 on order A100"

                response = await http.post(
                    f"/v1/threads/{thread['id']}/resume",
                    json={"interrupt_id": interrupt["id"], "decisions": [{"decision": "approve"}]},
                )
                assert response.status_code == 200, response.text

                events = [e async for e in client.follow(run["id"])]
                results = {e.data["name"]: e.data for e in events if e.type == "tool_result"}
                assert results["lookup_order"]["status"] == "ok"
                assert results["lookup_order"]["result"] == {"order_id": "A100", "status": "delivered", "total": 42.0}
                assert results["refund"]["status"] == "ok"
                assert results["refund"]["result"] == {"order_id": "A100", "refunded": 5.0}
                assert events[-1].type == "done"
                assert (await client.get_run(run["id"]))["status"] == "completed"
    finally:
        server.stop()


def test_every_module_of_the_package_is_in_the_architecture_module_map() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    table = text[text.index("| module | owns |") :]
    table = table[: table.index("\n\n")]
    mapped = set(re.findall(r"^\| `(tether/[^`]+)`", table, flags=re.M))
    modules = {str(p.relative_to(ROOT)) for p in (ROOT / "tether").rglob("*.py") if "migrations" not in p.parts}
    assert modules - mapped == set(), "modules missing from docs/architecture.md's module map"
    assert {m for m in mapped if m.endswith(".py")} - modules == set(), "the module map names modules that do not exist"


def test_every_module_of_the_web_ui_is_in_the_architecture_module_map() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    table = text[text.index("| module | owns |") :]
    table = table[: table.index("\n\n")]
    mapped = set(re.findall(r"^\| `(tether/server/static/[^`]+)`", table, flags=re.M))
    modules = {str(p.relative_to(ROOT)) for p in (ROOT / "tether" / "server" / "static").glob("*.js")}
    assert modules, "the web UI has no modules?"
    assert modules - mapped == set(), "web UI modules missing from docs/architecture.md's module map"
    assert mapped - modules == set(), "the module map names web UI modules that do not exist"
