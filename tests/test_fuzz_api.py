"""Whole-API fuzzing: schemathesis over ``/openapi.json`` against a real server, on both backends.

A ``tether demo`` process serves a fresh database; schemathesis generates requests for every
operation from the OpenAPI document (valid and invalid ones, then stateful sequences that
follow the ids it gets back) and checks every answer: never a 5xx, and every response —
errors included — in the status codes, content types and schemas the document declares. The
run is bounded in examples per operation and in time, so it fits the test command. The
server's own log must stay free of errors (the autouse check of ``conftest.py``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ServerProcess

#: The suite's busiest tests (many processes, SIGKILLs, whole-API fuzzing) run one after another
#: in one pytest-xdist worker, so they never compete with each other for the machine's cores.
pytestmark = pytest.mark.xdist_group("heavy")

#: Test cases per operation and the time budget of one run (per backend).
MAX_EXAMPLES = 8
MAX_TIME_S = 45

CHECKS = "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance"


def test_schemathesis_finds_no_5xx_and_only_documented_responses(db_url: str, tmp_path: Path) -> None:
    server = ServerProcess(db_url, tmp_path / "server.log").start()
    try:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "schemathesis.cli",
                "run",
                f"{server.url}/openapi.json",
                "--checks",
                CHECKS,
                "--max-examples",
                str(MAX_EXAMPLES),
                "--max-time",
                str(MAX_TIME_S),
                "--seed",
                "20261130",
                "--generation-database",
                "none",
                "--request-timeout",
                "20",
                "--workers",
                "1",
                "--no-color",
            ],
            capture_output=True,
            text=True,
            timeout=MAX_TIME_S * 4,
            cwd=tmp_path,
        )
    finally:
        server.stop()
    summary = result.stdout[-6000:]
    assert result.returncode == 0, f"schemathesis found problems:\n{summary}\n{result.stderr[-2000:]}"
    assert " passed" in summary, summary
