"""Making what a model or a tool produced storable: the one place it is cleaned.

Input over HTTP is refused when it holds what cannot be stored (``server/_schemas.py``). Output
cannot be refused after the fact: a model may emit a NUL character (PostgreSQL refuses it in
text) or a lone surrogate (no backend can encode it as UTF-8), and a tool may return either.
Everything the runner takes from a model (text and reasoning deltas, tool call ids, names and
arguments) or from a tool (results, error text) goes through :func:`storable_text` or
:func:`storable_json` before it reaches an event, the store or the next model call, so both
backends store the same cleaned text. Each offending code point becomes U+FFFD (the Unicode
replacement character), as a lenient UTF-8 decoder would show it.
"""

from __future__ import annotations

import re
from typing import Any

from ..models import ToolCallRequest

__all__ = ["storable_text", "storable_json", "REPLACEMENT", "describe_exception", "storable_request"]

#: What an unstorable code point becomes.
REPLACEMENT = "\ufffd"

_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def storable_text(text: str) -> str:
    """``text`` with every NUL and lone surrogate replaced by U+FFFD (the same object when clean)."""
    if _UNSTORABLE.search(text) is None:
        return text
    return _UNSTORABLE.sub(REPLACEMENT, text)


def storable_json(value: Any) -> Any:
    """A JSON-like value with :func:`storable_text` applied to every string in it, keys included."""
    if isinstance(value, str):
        return storable_text(value)
    if isinstance(value, dict):
        return {storable_json(k) if isinstance(k, str) else k: storable_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [storable_json(item) for item in value]
    return value


def describe_exception(exc: BaseException) -> str:
    """``"ExceptionType: message"``, storable."""
    return storable_text(f"{type(exc).__name__}: {exc}")


def storable_request(request: ToolCallRequest) -> ToolCallRequest:
    """A tool call as the model sent it, with its id, name and arguments made storable."""
    args = storable_text(request.args) if isinstance(request.args, str) else storable_json(request.args)
    return ToolCallRequest(storable_text(request.id), storable_text(request.name), args)
