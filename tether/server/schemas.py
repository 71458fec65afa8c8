"""Request bodies of the HTTP API (validated by pydantic; unknown fields are refused)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..runtime.config import RunConfig

__all__ = ["CreateThread", "RunInput", "CreateRun", "CancelRun"]

_STRICT = ConfigDict(extra="forbid")


class CreateThread(BaseModel):
    """``POST /v1/threads``."""

    model_config = _STRICT
    metadata: dict[str, Any] = Field(default_factory=dict)


class RunInput(BaseModel):
    """The user's message that starts a run."""

    model_config = _STRICT
    content: str = Field(min_length=1, max_length=1_000_000)


class CreateRun(BaseModel):
    """``POST /v1/threads/{id}/runs``."""

    model_config = _STRICT
    input: RunInput | None = None
    #: Where the new user message attaches; default: the thread's active leaf.
    parent_id: str | None = Field(default=None, max_length=64)
    config: RunConfig = Field(default_factory=RunConfig)


class CancelRun(BaseModel):
    """``POST /v1/runs/{id}/cancel``."""

    model_config = _STRICT
    mode: Literal["soft", "hard"] = "soft"
    reason: str | None = Field(default=None, max_length=2000)
