"""An agent whose model waits, then streams large deltas as fast as it can (for ``slow_readers.py``).

Served with ``tether serve _firehose_agent:agent`` from ``benchmarks/``; set by the environment:
``FIREHOSE_WAIT_S`` (seconds before the first delta), ``FIREHOSE_DELTAS`` and
``FIREHOSE_CHARS`` (how many deltas, of how many characters).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator

from tether import Agent
from tether.models import ModelDelta, ModelRequest, TextDelta


class Firehose:
    """Waits, then streams ``FIREHOSE_DELTAS`` deltas of ``FIREHOSE_CHARS`` characters."""

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelDelta]:
        await asyncio.sleep(float(os.environ.get("FIREHOSE_WAIT_S", "5")))
        size = int(os.environ.get("FIREHOSE_CHARS", "20000"))
        for n in range(int(os.environ.get("FIREHOSE_DELTAS", "200"))):
            yield TextDelta(f"{n:06d}" + "x" * (size - 6))
            await asyncio.sleep(0)  # as a network stream would, let the loop run between deltas


agent = Agent(Firehose(), name="firehose")
