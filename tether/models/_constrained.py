"""The local model's constrained output: the grammar's schema, and the decoder of what it generates.

:class:`~tether.models.llamacpp.LlamaCppModel` constrains sampling, when tools are offered, to
one JSON schema (:func:`tool_choice_schema`): *either* ``{"answer": "<text>"}`` *or* ``{"tool":
"<one of the tools>", "arguments": <that tool's parameter schema>}``, every free string argument
bounded. :class:`ConstrainedOutput` reads the output token by token: the answer's string is
decoded and streamed as it grows, a call is announced as soon as its tool's name is complete
and parsed whole at the end, an answer cut short before its string closed ends with
:class:`~tether.models.AnswerCut`, and an output that is neither (cut short, stopped for
repeating, malformed) raises ``model_output_invalid`` (:mod:`._output`) saying why. The JSON around them is
never handed on as text. :func:`repeating` is the generation's stop for degenerate output.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from . import AnswerCut, FinishReason, ModelDelta, TextDelta, ToolCallRequest, ToolCallStart, ToolSpec
from ._output import output_invalid

__all__ = ["ConstrainedOutput", "bounded", "cut_reason", "repeating", "tool_choice_schema"]


def tool_choice_schema(tools: list[ToolSpec], *, max_string_length: int | None = None) -> dict[str, Any]:
    """The JSON schema of "answer, or call one of these tools with arguments of its schema";
    with ``max_string_length``, every string argument without a ``maxLength`` gets that one."""
    answer = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"], "additionalProperties": False}
    calls = [
        {
            "type": "object",
            "properties": {"tool": {"const": tool.name}, "arguments": bounded(tool.parameters, max_string_length)},
            "required": ["tool", "arguments"],
            "additionalProperties": False,
        }
        for tool in tools
    ]
    return {"oneOf": [*calls, answer]}


def bounded(schema: Any, limit: int | None) -> Any:
    """``schema`` with ``maxLength: limit`` on every free string that has none."""
    if limit is None:
        return schema
    if isinstance(schema, list):
        return [bounded(item, limit) for item in schema]
    if not isinstance(schema, dict):
        return schema
    result = {key: bounded(value, limit) for key, value in schema.items()}
    if schema.get("type") == "string" and not any(key in schema for key in ("maxLength", "enum", "const", "pattern", "format")):
        result["maxLength"] = limit
    return result


def repeating(tokens: list[int], span: int, max_period: int = 16) -> bool:
    """True when the last ``span`` tokens (and at least three rounds) repeat one pattern of at
    most ``max_period`` tokens: ``a_t_a_s_a_r_a_n_a_s_a_r_a_n_…``."""
    n = len(tokens)
    for period in range(1, max_period + 1):
        need = max(span, 3 * period)
        if n < need:
            return False
        start = n - need
        if all(tokens[i] == tokens[i - period] for i in range(start + period, n)):
            return True
    return False


def cut_reason(finish_reason: str) -> FinishReason | None:
    """The :class:`~tether.models.AnswerCut` reason of a generation's end (``Generation.finish_reason``), if it cut."""
    if finish_reason == "length":
        return "length"
    if finish_reason == "repeating":
        return "repetition"
    return None


def _json_string(body: str) -> str:
    """The text of a JSON string's body (escapes decoded; as is if they are broken)."""
    try:
        return str(json.loads(f'"{body}"'))
    except ValueError:
        return body


class ConstrainedOutput:
    """Reads ``{"answer": "…"}`` or ``{"tool": …, "arguments": …}`` as it is generated.

    The answer's string is decoded and handed on as it grows, so the answer streams; a call is
    announced once its tool's name is complete and parsed whole at the end. None of the JSON
    around them is ever handed on as text.
    """

    _ANSWER = re.compile(r'\s*\{\s*"answer"\s*:\s*"')
    _TOOL = re.compile(r'\s*\{\s*"tool"')
    _TOOL_NAME = re.compile(r'\s*\{\s*"tool"\s*:\s*"((?:[^"\\]|\\.)*)"')

    def __init__(self) -> None:
        self.raw = ""
        self.kind: str | None = None  # "answer" or "tool", once known
        self._cursor = 0  # in "answer": where the undecoded part of the string starts
        self._closed = False  # the answer's closing quote was seen
        self._announced = False  # the call's ToolCallStart was handed on

    def feed(self, text: str) -> list[ModelDelta]:
        """Take more output; return what it adds: answer text, or the start of a call."""
        self.raw += text
        if self.kind is None:
            if match := self._ANSWER.match(self.raw):
                self.kind, self._cursor = "answer", match.end()
            elif self._TOOL.match(self.raw):
                self.kind = "tool"
        if self.kind == "tool":
            if not self._announced and (named := self._TOOL_NAME.match(self.raw)):
                self._announced = True
                return [ToolCallStart(_json_string(named.group(1)))]
            return []
        if self.kind != "answer" or self._closed:
            return []
        answer = self._decode_string()
        return [TextDelta(answer)] if answer else []

    def finish(self, finish_reason: str = "stop", max_tokens: int | None = None) -> list[ModelDelta]:
        """What the whole output adds at the end: the tool call; for an answer (which streamed)
        nothing, or :class:`~tether.models.AnswerCut` when the generation stopped inside its
        string. An output that is neither raises ``model_output_invalid``, saying why."""
        if self.kind == "answer":
            # Its text is what streamed; once its string closed, a cut of the JSON after it cut nothing.
            cut = cut_reason(finish_reason)
            return [AnswerCut(cut)] if cut is not None and not self._closed else []
        try:
            # strict=False: a small model may write a raw line break inside a string.
            value = json.loads(self.raw, strict=False)
        except ValueError:
            value = None
        if isinstance(value, dict) and isinstance(value.get("tool"), str) and isinstance(value.get("arguments"), dict):
            return [ToolCallRequest(id="call_" + uuid.uuid4().hex[:16], name=value["tool"], args=value["arguments"])]
        where = "in the middle of a tool call" if self.kind == "tool" else "before it was an answer or a tool call"
        if finish_reason == "length":
            limit = f" ({max_tokens} tokens)" if max_tokens is not None else ""
            raise output_invalid(f"cut off by the output limit{limit} {where}")
        if finish_reason == "repeating":
            raise output_invalid(f"stopped for repeating itself {where}")
        if not self.raw.strip():
            raise output_invalid("empty")
        raise output_invalid("neither an answer nor a well-formed tool call")

    def _decode_string(self) -> str:
        out: list[str] = []
        raw, i = self.raw, self._cursor
        while i < len(raw):
            char = raw[i]
            if char == '"':
                self._closed = True
                i += 1
                break
            if char != "\\":
                out.append(char)
                i += 1
                continue
            if i + 1 >= len(raw):
                break  # the escape is not complete yet
            if raw[i + 1] == "u":
                if i + 6 > len(raw):
                    break
                escape = raw[i : i + 6]
                # A surrogate pair is two escapes: wait for both.
                if 0xD800 <= int(escape[2:], 16) <= 0xDBFF:
                    if i + 12 > len(raw):
                        break
                    escape = raw[i : i + 12]
            else:
                escape = raw[i : i + 2]
            out.append(json.loads(f'"{escape}"'))
            i += len(escape)
        self._cursor = i
        return "".join(out)
