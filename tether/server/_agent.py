"""``GET /v1/agent``: what the served agent offers — every tool with its tier and where the tier
came from, and every mounted MCP server with its state (up, or unavailable and why)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from ._deps import runtime_of

__all__ = ["router"]

router = APIRouter(prefix="/v1", tags=["agent"])


@router.get("/agent")
async def describe_agent(request: Request) -> dict[str, Any]:
    """The agent: its name, its tools (``risk``, ``risk_source``, ``source``, ``parameters``) and
    its MCP servers (``state``: ``connecting``, ``up``, ``unavailable`` with a ``reason``)."""
    return runtime_of(request).agent.describe()
