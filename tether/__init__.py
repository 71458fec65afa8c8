"""Tether: run tool-using LLM agents with durable runs, gapless streams and real cancellation."""

from __future__ import annotations

__version__ = "0.1.0"

from .agent import Agent
from .errors import TetherError
from .events import Envelope, Event
from .models import ChatMessage, Model, ModelRequest, TextDelta, ThinkingDelta, ToolCallRequest
from .models.scripted import ScriptedModel
from .tools import Sensitive, Tool, ToolContext, tool

__all__ = [
    "__version__",
    "Agent",
    "tool",
    "Tool",
    "ToolContext",
    "Sensitive",
    "Model",
    "ModelRequest",
    "ChatMessage",
    "TextDelta",
    "ThinkingDelta",
    "ToolCallRequest",
    "ScriptedModel",
    "Envelope",
    "Event",
    "TetherError",
]
