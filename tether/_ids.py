"""Identifiers and clocks."""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime
from typing import overload


def new_id(prefix: str) -> str:
    """A new id like ``run_0193a1b2c3d4e5f6a7b8c9d0``: time-ordered, then random."""
    return f"{prefix}_{time.time_ns() // 1000:014x}{os.urandom(6).hex()}"


def utcnow() -> datetime:
    """The current time in UTC."""
    return datetime.now(UTC)


@overload
def as_utc(moment: datetime) -> datetime: ...


@overload
def as_utc(moment: None) -> None: ...


def as_utc(moment: datetime | None) -> datetime | None:
    """Attach UTC to a naive timestamp read back from the database."""
    if moment is None:
        return None
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
