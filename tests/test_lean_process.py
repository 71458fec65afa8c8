"""What a serving process holds: the migrations run in a child, and the libraries only some
requests need (the Prometheus exposition, another database's dialect) are imported when used.

Each check runs in a fresh interpreter (``subprocess``), where ``sys.modules`` shows exactly
what the code under test imported."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import anyio
import pytest
import sqlalchemy as sa

from tether.store import Store

#: Imported by the serving path only when used; in a serving process on ``argv[1]`` none of them
#: may be loaded once it is started and has served a run.
_NOT_WHEN_SERVING = ("alembic", "mako", "pygments", "sqlalchemy.orm", "prometheus_client", "watchfiles", "openai", "anthropic")

#: The CLI's start of a server, up to its first run on the store it opens: the migrations
#: first (in a forked child, if the schema needs them), the server's modules, then the store.
#: Prints what was loaded of the above, whether a child migrated, and the revision.
_START_AS_THE_CLI_DOES = """
import asyncio, json, sys
from tether._launch import start_migrations
url = sys.argv[1]
child = start_migrations(url)
if child is not None:
    child.join()
returncode = None if child is None else child.exitcode
import tether.server, tether.server._serving
from tether.demo import build_demo_agent
from tether.store import AtLeaf, Store
from tether.store._engine import HEAD_REVISION
NOT_WHEN_SERVING = json.loads(sys.argv[2])
async def main():
    build_demo_agent()
    store = await Store.open(url)
    thread = await store.create_thread(owner="local")
    created = await store.create_run(thread_id=thread.id, attach=AtLeaf(content="hi"), config={}, owner="local")
    assert [e.type for e in await store.read_events(created.run.id)][0] == "run_started"
    current = not await Store.needs_migrations(url)
    await store.aclose()
    loaded = [m for m in NOT_WHEN_SERVING if m in sys.modules]
    dialects = sorted(m.split(".")[2] for m in sys.modules if m.count(".") == 2 and m.startswith("sqlalchemy.dialects.") and not m.split(".")[2].startswith("_"))
    print(json.dumps({"child": returncode, "loaded": loaded, "dialects": dialects, "current": current, "head": HEAD_REVISION}))
asyncio.run(main())
"""


def _start(url: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-c", _START_AS_THE_CLI_DOES, url, json.dumps(_NOT_WHEN_SERVING)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


def test_a_server_starting_on_a_new_database_migrates_it_in_a_child_and_never_loads_alembic(db_url: str) -> None:
    first = _start(db_url)  # a new database: a child brings it to head
    assert first["child"] == 0 and first["current"] is True
    assert first["loaded"] == []
    again = _start(db_url)  # a restart: the schema is read once, no child
    assert again["child"] is None and again["current"] is True
    assert again["loaded"] == []
    # Only the database's own dialect: the partial index's PostgreSQL option is defined for
    # the migrations alone.
    assert again["dialects"] == (["sqlite"] if db_url.startswith("sqlite") else ["postgresql"])


def test_a_failed_migration_stops_the_server_before_it_serves(tmp_path: Any) -> None:
    """A database the migrations cannot open (a directory where the file should be): the CLI
    exits with the child's error and an error of its own, and never serves."""
    (tmp_path / "db").mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "tether.cli", "demo", "--port", "1", "--db", f"sqlite:///{tmp_path / 'db'}"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0
    assert "the database's migrations failed" in done.stderr
    assert "serving agent" not in done.stderr


@pytest.mark.anyio
async def test_tether_migrate_brings_a_schema_up_to_date_and_never_prints_the_password(pg_db_url: str) -> None:
    # PostgreSQL's trust authentication ignores the password, which the output must still hide.
    url = sa.engine.make_url(pg_db_url).set(password="s3cret-pw").render_as_string(hide_password=False)
    outputs = []
    for _ in range(2):  # a new database, then one already up to date
        with anyio.fail_after(120):
            done = await anyio.run_process([sys.executable, "-m", "tether.cli", "migrate", "--db", url], check=False)
        assert done.returncode == 0, done.stderr.decode()
        outputs.append((done.stdout + done.stderr).decode())
    from tether.store._engine import HEAD_REVISION

    for output in outputs:
        assert f"is up to date (revision {HEAD_REVISION})" in output
        assert "s3cret-pw" not in output and "***" in output
    assert await Store.needs_migrations(url) is False
