"""Per-run configuration, validated when a run is created and stored with it."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["RunConfig"]


class RunConfig(BaseModel):
    """Options of one run (``config`` of ``POST /v1/threads/{id}/runs``)."""

    model_config = ConfigDict(extra="forbid")

    #: Lowest risk tier that needs a human decision: ``destructive`` (default) or ``reversible``.
    approval_threshold: Literal["reversible", "destructive"] = "destructive"
    #: Seconds an interrupt of this run stays open (overrides the tools' own TTL).
    approval_ttl_s: float | None = Field(default=None, gt=0, le=7 * 24 * 3600)
    #: Upper bound on model calls in this run (default: the agent's ``max_steps``).
    max_steps: int | None = Field(default=None, ge=1, le=1000)
