"""``Agent``: what an agent author writes — a model, tools and a system prompt."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from .history import HistoryPolicy
from .models import Model, RetryPolicy, ToolSpec
from .tools import Tool

if TYPE_CHECKING:  # for the annotations only: the agent itself needs no web framework
    from starlette.routing import BaseRoute

__all__ = ["Agent"]


class Agent:
    """A tool-using agent served by Tether.

    ``on_startup`` is awaited once when a server starts, with the server's store, so an agent can
    set up what its tools need (the demo shop creates its effects table there). ``routes`` are
    extra Starlette routes mounted next to the API (the demo's ``/v1/demo/effects``).
    ``history`` bounds what of a thread the model is given (default: ``HistoryPolicy()``).
    ``retry`` says how failed model calls are retried and how long a silent provider is waited for.
    """

    def __init__(
        self,
        model: Model,
        tools: Sequence[Tool] = (),
        *,
        system_prompt: str = "You are a helpful assistant.",
        name: str = "agent",
        max_steps: int = 25,
        on_startup: Callable[[Any], Awaitable[None]] | None = None,
        routes: Sequence[BaseRoute] = (),
        history: HistoryPolicy | None = None,
        retry: RetryPolicy | None = None,
    ) -> None:
        names = [t.name for t in tools]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate tool names in {names}")
        for t in tools:
            if not isinstance(t, Tool):
                raise TypeError(f"{t!r} is not a Tool; decorate it with @tool")
        self.model = model
        self.tools: dict[str, Tool] = {t.name: t for t in tools}
        self.system_prompt = system_prompt
        self.name = name
        self.max_steps = max_steps
        self.on_startup = on_startup
        self.routes = list(routes)
        #: What of a thread's active path the model is given; ``None``: the default policy.
        self.history = history
        self.retry = retry or RetryPolicy()
        self._specs: tuple[tuple[int, ...], list[ToolSpec]] | None = None

    def tool_specs(self) -> list[ToolSpec]:
        """The tools as the model sees them: built once per set of tools, not per model call
        (a schema takes pydantic a while to generate). Treat the specs as read-only."""
        key = tuple(map(id, self.tools.values()))
        if self._specs is None or self._specs[0] != key:
            self._specs = (key, [ToolSpec(t.name, t.description, t.json_schema()) for t in self.tools.values()])
        return list(self._specs[1])
