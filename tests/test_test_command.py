"""``scripts/test``'s throwaway PostgreSQL cluster: started, used by the tests, then gone.

A machine without a PostgreSQL server gets one from the installed binaries for the length of
the command. ``TETHER_TEST_POSTGRES=throwaway`` forces that path here, beside the running
server, so it is proven without stopping anything: a real PostgreSQL test passes on the
cluster, and once the command ends (normally, or by Ctrl-C in the middle of pytest) no
process of the cluster is left, its port is closed and its directory is removed.
"""

from __future__ import annotations

import asyncio
import glob
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import asyncpg
import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "test"
#: One real PostgreSQL test, run by the inner pytest on the throwaway cluster.
PG_TEST = "tests/test_store.py::test_opening_an_empty_database_creates_the_whole_schema_at_the_latest_revision[postgresql]"
#: The inner pytest runs in one process (-n 0): these tests are about the cluster's life, and
#: two more worker processes would only slow them down.
INNER_PYTEST = ["-n", "0"]
CLUSTER_LINE = re.compile(r"^== postgresql: throwaway cluster in (\S+) on port (\d+)", re.MULTILINE)

pytestmark = [
    pytest.mark.skipif(
        shutil.which("initdb") is None and not glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        reason="no PostgreSQL binaries to start a throwaway cluster with",
    ),
    # Missing, the script would install it; a test does not install system packages.
    pytest.mark.skipif(not os.access("/usr/bin/chromium", os.X_OK), reason="/usr/bin/chromium is missing"),
]


def _env() -> dict[str, str]:
    env = {**os.environ, "TETHER_TEST_POSTGRES": "throwaway", "TETHER_TEST_SKIP_INSTALL": "1", "PYTHON": sys.executable}
    env.pop("TETHER_TEST_POSTGRES_URL", None)
    # A pytest-xdist worker's variables: the inner pytest is a run of its own, not a worker.
    for name in [n for n in env if n.startswith("PYTEST_XDIST_")]:
        del env[name]
    return env


def _assert_gone(directory: str, port: int) -> None:
    assert not os.path.exists(directory), f"{directory} was left behind"
    with socket.socket() as sock:
        sock.settimeout(2)
        assert sock.connect_ex(("127.0.0.1", port)) != 0, f"something still listens on port {port}"
    left = []
    for cmdline in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            if directory.encode() in Path(cmdline).read_bytes():
                left.append(cmdline)
        except OSError:  # the process ended meanwhile
            pass
    assert not left, f"processes of the cluster still run: {left}"


def _wait_until_a_test_made_its_database(proc: subprocess.Popen[str], port: int) -> None:
    """Wait until a test of the inner pytest created its database (``tether_t_…``) on the
    throwaway cluster at ``port``: pytest is then in the middle of the tests."""
    url = f"postgresql://postgres@127.0.0.1:{port}/postgres"

    async def test_databases() -> int:
        conn = await asyncpg.connect(url, timeout=10)
        try:
            return int(await conn.fetchval("SELECT count(*) FROM pg_database WHERE datname LIKE 'tether\\_t\\_%'"))
        finally:
            await conn.close()

    deadline = time.monotonic() + 120
    while asyncio.run(test_databases()) == 0:
        assert proc.poll() is None, "the inner scripts/test ended before a test created its database"
        assert time.monotonic() < deadline, "no test created its database on the throwaway cluster within 120 s"
        time.sleep(0.05)


def test_a_throwaway_cluster_serves_the_tests_and_is_gone_afterwards() -> None:
    done = subprocess.run(
        [str(SCRIPT), "-q", "-p", "no:cacheprovider", *INNER_PYTEST, PG_TEST],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    match = CLUSTER_LINE.search(done.stdout)
    assert match is not None, output
    assert "1 passed" in done.stdout, output
    assert "== postgresql: throwaway cluster stopped and removed" in done.stdout, output
    _assert_gone(match.group(1), int(match.group(2)))


def _sigint_as_in_a_terminal() -> None:
    """In the child, before it runs the script: SIGINT handled by default and not blocked."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def test_ctrl_c_in_the_middle_of_pytest_still_removes_the_cluster() -> None:
    # Its own process group, which gets the SIGINT as a terminal's Ctrl-C would send it; and
    # SIGINT's disposition as a terminal gives it (handled by default, not blocked): a process
    # started with SIGINT ignored keeps ignoring it (bash cannot trap it, Python installs no
    # handler), and this test's own process may have inherited or been left with that.
    proc = subprocess.Popen(
        [str(SCRIPT), "-q", "-p", "no:cacheprovider", *INNER_PYTEST, "tests/test_store.py", "-k", "postgresql"],
        cwd=ROOT,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=_sigint_as_in_a_terminal,
    )
    try:
        assert proc.stdout is not None
        lines: list[str] = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("== pytest"):
                break
        match = CLUSTER_LINE.search("".join(lines))
        assert match is not None, "".join(lines)
        _wait_until_a_test_made_its_database(proc, int(match.group(2)))  # in the middle of the tests
        os.killpg(proc.pid, signal.SIGINT)
        rest, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    output = "".join(lines) + rest
    assert proc.returncode != 0, output  # interrupted, not finished
    assert "== postgresql: throwaway cluster stopped and removed" in output, output
    _assert_gone(match.group(1), int(match.group(2)))
