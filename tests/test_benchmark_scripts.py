"""The benchmark scripts that call Tether's runtime in-process still run.

They are not part of the package (mypy checks ``tether`` only), so a change of the runtime's
signatures could break them silently until someone measures again; this once happened to
``token_cost.py`` and ``long_thread.py``. Each runs here at its smallest size, in a subprocess
as a person would run it, and its printed figure is checked to be a number.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.timeout(120)


def _run(*argv: str) -> str:
    out = subprocess.run([sys.executable, *argv], cwd=REPO, capture_output=True, text=True, timeout=100)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def test_token_cost_runs_the_runtime() -> None:
    for scenario in ("tether-paced", "tether-one-token"):
        figure = json.loads(_run("benchmarks/token_cost.py", "--one", scenario, "--runs", "5", "--tokens", "3", "--delay-ms", "5").strip().splitlines()[-1])
        assert figure["loop_us"] > 0 and figure["process_us"] > 0


def test_long_thread_starts_a_run_on_a_long_thread() -> None:
    table = _run("benchmarks/long_thread.py", "--sizes", "20", "--runs", "1")
    row = next(line for line in table.splitlines() if line.startswith("| 20 |"))
    first_token_ms = float(row.split("|")[2].split()[0])
    assert first_token_ms > 0
