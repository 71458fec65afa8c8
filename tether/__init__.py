"""Tether: run tool-using LLM agents with durable runs, gapless streams and real cancellation.

This module is the public API: what an agent author, a server operator and a client need. The
server and the clients are imported on first use (``tether.create_app``, ``tether.AsyncClient``),
so an agent module that only imports ``Agent`` and ``tool`` stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .agent import Agent
from .errors import (
    APIError,
    Conflict,
    EventLogFailed,
    FieldError,
    Forbidden,
    Gone,
    InterruptExpired,
    InterruptResolved,
    InvalidRequest,
    LimitExceeded,
    ModelConfigError,
    ModelError,
    NotFound,
    Overloaded,
    PayloadTooLarge,
    RunNotActive,
    ServerUnreachable,
    TetherError,
    ThreadBusy,
    ToolArgsError,
    Unauthorized,
)
from .events import Envelope, Event
from .history import HistoryPolicy
from .models import ChatMessage, Model, ModelRequest, RetryPolicy, TextDelta, ThinkingDelta, ToolCallRequest, Usage, load_model
from .models.scripted import ScriptedModel
from .tools import Sensitive, Tool, ToolContext, tool

if TYPE_CHECKING:
    from .client import AsyncClient, Client
    from .runtime import RunConfig
    from .server import create_app

__version__ = "0.1.0"

__all__ = [
    "__version__",
    # agents
    "Agent",
    "tool",
    "Tool",
    "ToolContext",
    "Sensitive",
    "RunConfig",
    "HistoryPolicy",
    # models
    "Model",
    "ModelRequest",
    "ChatMessage",
    "TextDelta",
    "ThinkingDelta",
    "ToolCallRequest",
    "Usage",
    "RetryPolicy",
    "ScriptedModel",
    "load_model",
    # serving and clients
    "create_app",
    "AsyncClient",
    "Client",
    # events
    "Envelope",
    "Event",
    # errors
    "TetherError",
    "FieldError",
    "NotFound",
    "InvalidRequest",
    "ToolArgsError",
    "Conflict",
    "ThreadBusy",
    "RunNotActive",
    "InterruptResolved",
    "Gone",
    "InterruptExpired",
    "Unauthorized",
    "Forbidden",
    "PayloadTooLarge",
    "LimitExceeded",
    "Overloaded",
    "ModelError",
    "ModelConfigError",
    "EventLogFailed",
    "APIError",
    "ServerUnreachable",
]

_LAZY = {"create_app": "server", "AsyncClient": "client", "Client": "client", "RunConfig": "runtime"}


def __getattr__(name: str) -> Any:
    """Import the server, the runtime and the clients on first use."""
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
